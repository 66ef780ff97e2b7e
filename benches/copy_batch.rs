//! Instruction counts of the data path (issue 19, item 8): a typed
//! `CopyBatch` enqueued on a `Stream` (every check before the driver: ranges
//! against the endpoint, the memory and this process's bindings, F9;
//! locality, F2; independence, F3) against the raw `fabric_copy_batch` call
//! with the same ops built by hand, on the pass-through `Null` driver, for
//! 1, 64 and 1,024 puts of 64 bytes (device memory → a bound unicast
//! endpoint, op `i` at offset `64 i` on both sides): one `put` call per op,
//! and the same ops as one `put_strided` call (`Strided::contiguous`).
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0
//! cargo bench -p cuda-endpoints-benches --bench copy_batch
//! ```
//!
//! Divide each count by the batch's ops for instructions per op. Only the
//! benchmark function is counted: the setup (context, endpoint, binding,
//! mapped source, stream; for the raw side nothing but the driver) and the
//! teardown (waiting the token) are not. Then the wait: `InFlight::wait` of
//! a typed batch of 1, 64 and 1,024 puts (its enqueue not counted: the
//! setup), against the raw `stream_synchronize`.

mod common;

use std::hint::black_box;
use std::sync::OnceLock;

use cuda_endpoints::driver::{CopyOp, CopyOps, Driver, Operand, Pointer};
use cuda_endpoints::{
    Allocation, Binding, CopyBatch, Endpoint, InFlight, Mapped, Private, Ready, Route, Stream,
    Strided, Unicast,
};
use gungraun::prelude::*;

use common::{Fixture, Null, OWNER, SIZE, fixture};

/// Bytes per op.
const OP: u64 = 64;

/// What both sides use, made once per process (each benchmark runs in its
/// own process) and kept until it exits, so the typed side's borrows are
/// `'static`.
struct World {
    fx: Fixture,
    ep: Endpoint<Ready, Unicast>,
    src: Mapped<Private>,
    stream: Stream,
}

fn world() -> &'static World {
    static WORLD: OnceLock<&'static World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let fx = fixture(Null);
        // The fabric copy (13.5's `cuFabricCpyBatchAsync`), whatever version
        // the pass-through driver reports.
        fx.0.set_copy_path(cuda_endpoints::CopyPath::Fabric);
        let ep = common::ready_unicast(&fx.0);
        let src = Allocation::<Private>::on_device(&fx.0, OWNER, SIZE)
            .expect("allocation")
            .map(&[OWNER])
            .expect("map");
        let stream = Stream::new(&fx.0, OWNER).expect("stream");
        let w: &'static World = Box::leak(Box::new(World {
            fx,
            ep,
            src,
            stream,
        }));
        let b: Binding<'static> = w.ep.bind(OWNER, 0, &w.fx.1).expect("bind");
        std::mem::forget(b); // bound for the whole process
        // One warm-up batch of each size: caches and allocator as in a
        // long-lived program.
        for n in [1, 64, 1024] {
            typed(w, n).expect("typed").wait().expect("wait");
            strided(w, n).expect("strided").wait().expect("wait");
            raw(&*w.fx.2, 4, w.ep.id(), w.src.device_ptr(), n);
        }
        w
    })
}

/// `n` puts through the typed API.
#[inline(never)]
fn typed(w: &'static World, n: u64) -> cuda_endpoints::Result<InFlight<'static>> {
    let mut batch = CopyBatch::new();
    for i in 0..n {
        batch = batch.put(&w.src, i * OP, &w.ep, i * OP, OP);
    }
    w.stream.enqueue(batch)
}

/// The same `n` puts as one strided call (`Strided::contiguous`).
#[inline(never)]
fn strided(w: &'static World, n: u64) -> cuda_endpoints::Result<InFlight<'static>> {
    let batch = CopyBatch::new().put_strided(&w.src, 0, &w.ep, 0, Strided::contiguous(n, OP));
    w.stream.enqueue(batch)
}

/// The same ops, built by hand, and the one driver call.
#[inline(never)]
fn raw(d: &dyn Driver, stream: u64, id: u32, src: u64, n: u64) {
    let ops: CopyOps = (0..n)
        .map(|i| CopyOp {
            src: Operand::Pointer(Pointer::device(src + i * OP)),
            dst: Operand::LogicalEndpoint { id, offset: i * OP },
            size: OP,
        })
        .collect();
    // SAFETY: `Null` does nothing with the ops; the endpoint is ready and
    // bound, the source mapped, both for the whole process.
    unsafe { d.fabric_copy_batch(stream, ops, 0) }.expect("fabric_copy_batch");
}

fn s_typed(n: u64) -> (&'static World, u64) {
    (world(), n)
}

fn s_raw(n: u64) -> (&'static dyn Driver, u32, u64, u64) {
    let w = world();
    (&*w.fx.2, w.ep.id(), w.src.device_ptr(), n)
}

fn waited(r: cuda_endpoints::Result<InFlight<'static>>) {
    r.expect("enqueue").wait().expect("wait");
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_typed, teardown = waited)]
fn copy_batch_typed((w, n): (&'static World, u64)) -> cuda_endpoints::Result<InFlight<'static>> {
    typed(black_box(w), black_box(n))
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_typed, teardown = waited)]
fn copy_batch_strided((w, n): (&'static World, u64)) -> cuda_endpoints::Result<InFlight<'static>> {
    strided(black_box(w), black_box(n))
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_raw)]
fn copy_batch_raw((d, id, src, n): (&'static dyn Driver, u32, u64, u64)) {
    raw(black_box(d), 4, black_box(id), black_box(src), black_box(n));
}

/// A route (`Stream::route`) from the source to the endpoint, made once
/// as a program would (its facts read then), for its one put.
fn s_route(_: u64) -> &'static mut Route<'static, Private, Ready, Unicast> {
    let w = world();
    Box::leak(Box::new(w.stream.route(&w.src, &w.ep)))
}

// The one put of `copy_batch_typed@1`, through a route.
#[library_benchmark]
#[benches::ops(args = [1], setup = s_route, teardown = waited)]
fn copy_batch_route(
    route: &'static mut Route<'static, Private, Ready, Unicast>,
) -> cuda_endpoints::Result<InFlight<'static>> {
    black_box(route).put(0, 0, OP)
}

/// A typed batch of `n` puts in flight, for its wait.
fn s_in_flight(n: u64) -> InFlight<'static> {
    typed(world(), n).expect("enqueue")
}

/// The stream's handle and the driver, for the raw synchronize.
fn s_sync(_: u64) -> &'static dyn Driver {
    &*world().fx.2
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_in_flight)]
fn copy_batch_wait(token: InFlight<'static>) -> cuda_endpoints::Result<cuda_endpoints::Completed> {
    black_box(token).wait()
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_sync)]
fn copy_batch_sync(d: &'static dyn Driver) {
    // SAFETY: `Null` does nothing; stream 4 is the one `Null` gives.
    unsafe { black_box(d).stream_synchronize(4) }.expect("stream_synchronize");
}

library_benchmark_group!(
    name = copy_batch,
    benchmarks = [
        copy_batch_typed,
        copy_batch_strided,
        copy_batch_raw,
        copy_batch_wait,
        copy_batch_sync,
        copy_batch_route
    ]
);

main!(library_benchmark_groups = copy_batch);

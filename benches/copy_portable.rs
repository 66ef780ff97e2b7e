//! Instruction counts of the portable data path (issue 30): a typed
//! `CopyBatch` enqueued on a `Stream` on [`CopyPath::Portable`] (every check
//! of the fabric path, then each op resolved to the endpoint's windows, the
//! copies' independence for the batch call, and one `cuMemcpyBatchAsync`)
//! against the raw `memcpy_batch_async` of the same pieces built by hand,
//! on a pass-through driver, for 1, 64 and 1,024 puts of 64 bytes (mapped
//! device memory → a unicast endpoint bound by address to other mapped
//! memory, which gives the window; op `i` at offset `64 i` on both sides).
//! A batch of one piece goes as one `cuMemcpyAsync` on both sides (the call
//! a raw program makes).
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0
//! cargo bench -p cuda-endpoints-benches --bench copy_portable
//! ```
//!
//! Divide each count by the batch's ops for instructions per op. Only the
//! benchmark function is counted: the setup (context, endpoint, binding,
//! mapped memory, stream; for the raw side nothing but the driver) and the
//! teardown (waiting the token) are not.
//!
//! [`CopyPath::Portable`]: cuda_endpoints::CopyPath::Portable

mod common;

use std::hint::black_box;
use std::sync::OnceLock;

use cuda_endpoints::driver::{Driver, MemcpyOp, MemcpyOps, Pointer};
use cuda_endpoints::{CopyBatch, CopyPath, InFlight};
use gungraun::prelude::*;

use common::{CopyWorld, Fresh, WorldRoute};

/// Bytes per op.
const OP: u64 = 64;

/// The stream handle [`Null`] gives.
const STREAM: u64 = 4;

type World = CopyWorld;

fn world() -> &'static World {
    static WORLD: OnceLock<&'static World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let w = CopyWorld::new(Fresh::new(), CopyPath::Portable);
        // One warm-up batch of each size: caches and allocator as in a
        // long-lived program.
        for n in [1, 64, 1024] {
            typed(w, n).expect("typed").wait().expect("wait");
            raw(&*w.fx.2, w.dst.device_ptr(), w.src.device_ptr(), n);
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

/// The same pieces, built by hand, and the one driver call.
#[inline(never)]
fn raw(d: &dyn Driver, dst: u64, src: u64, n: u64) {
    if n == 1 {
        // SAFETY: `Fresh` does nothing with the copy.
        unsafe { d.memcpy_async(Pointer::device(dst), Pointer::device(src), OP, STREAM) }
            .expect("memcpy_async");
        return;
    }
    let copies: MemcpyOps = (0..n)
        .map(|i| MemcpyOp {
            dst: Pointer::device(dst + i * OP),
            src: Pointer::device(src + i * OP),
            size: OP,
        })
        .collect();
    // SAFETY: `Fresh` does nothing with the copies.
    unsafe { d.memcpy_batch_async(copies, STREAM) }.expect("memcpy_batch_async");
}

fn s_typed(n: u64) -> (&'static World, u64) {
    (world(), n)
}

fn s_raw(n: u64) -> (&'static dyn Driver, u64, u64, u64) {
    let w = world();
    (&*w.fx.2, w.dst.device_ptr(), w.src.device_ptr(), n)
}

fn waited(r: cuda_endpoints::Result<InFlight<'static>>) {
    r.expect("enqueue").wait().expect("wait");
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_typed, teardown = waited)]
fn copy_portable_typed((w, n): (&'static World, u64)) -> cuda_endpoints::Result<InFlight<'static>> {
    typed(black_box(w), black_box(n))
}

#[library_benchmark]
#[benches::ops(args = [1, 64, 1024], setup = s_raw)]
fn copy_portable_raw((d, dst, src, n): (&'static dyn Driver, u64, u64, u64)) {
    raw(black_box(d), black_box(dst), black_box(src), black_box(n));
}

fn s_route(_: u64) -> &'static mut WorldRoute {
    world().route()
}

// The one put of `copy_portable_typed@1`, through a route.
#[library_benchmark]
#[benches::ops(args = [1], setup = s_route, teardown = waited)]
fn copy_portable_route(
    route: &'static mut WorldRoute,
) -> cuda_endpoints::Result<InFlight<'static>> {
    black_box(route).put(0, 0, OP)
}

library_benchmark_group!(
    name = copy_portable,
    benchmarks = [copy_portable_typed, copy_portable_raw, copy_portable_route]
);

main!(library_benchmark_groups = copy_portable);

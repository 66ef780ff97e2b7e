//! The footprint of one put (issue 30): the lines of code and data a typed
//! one-put batch reads from memory when the caches were emptied first, as
//! a real driver call leaves them, against the raw call's, on the fabric
//! path (`cuFabricCpyBatchAsync`) and on the portable path
//! (`cuMemcpyAsync`, the H200's), on a pass-through driver.
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0
//! cargo bench -p cuda-endpoints-benches --bench copy_cold
//! ```
//!
//! Each bench's setup empties Callgrind's simulated caches
//! ([`common::COLD_CACHES`]: 32 KiB L1s and a 2 MiB last level, a server
//! core's L2) by [`common::evict_caches`]; the benchmark function then reads
//! each line it touches from memory once. Printed: the lines of code
//! (`ILmr`), of data read (`DLmr`) and written (`DLmw`), and their sum
//! (`RAM Hits`). The data lines move by a few with the stack's alignment
//! (the length of the binary's path moves it): the code lines are the
//! measure to compare. On the H200 the typed layer's time over a raw
//! `cuMemcpyAsync` was thought to follow these lines more than its
//! instructions (`benches/README.md`). The setup (context, endpoint,
//! binding, mapped memory, stream) and the teardown (waiting the token)
//! are not counted. The world is not `copy_batch`'s: a driver that gives
//! each reservation a fresh address ([`common::Fresh`]), the endpoint
//! bound by address to mapped memory, one put per batch and no loop; its
//! one put is 541 instructions where `copy_batch`'s is 575.

mod common;

use std::hint::black_box;
use std::sync::OnceLock;

use cuda_endpoints::driver::{CopyOp, CopyOps, Driver, Operand, Pointer};
use cuda_endpoints::{CopyBatch, CopyPath, InFlight};
use gungraun::prelude::*;
use gungraun::{Callgrind, CallgrindMetrics, EventKind};

use common::{COLD_CACHES, CopyWorld, Fresh, WorldRoute, evict_caches};

/// Bytes of the put.
const OP: u64 = 64;

/// The stream handle [`common::Null`] gives.
const STREAM: u64 = 4;

type World = CopyWorld;

fn world(path: CopyPath) -> &'static World {
    static WORLDS: [OnceLock<&'static World>; 2] = [OnceLock::new(), OnceLock::new()];
    WORLDS[usize::from(path == CopyPath::Portable)].get_or_init(|| {
        let w = CopyWorld::new(Fresh::new(), path);
        // Warm-up: the spare, the stream's record list, the memo, as in a
        // long-lived program.
        for _ in 0..2 {
            typed(w).expect("typed").wait().expect("wait");
            raw(w, path);
        }
        w
    })
}

/// One put through the typed API.
#[inline(never)]
fn typed(w: &'static World) -> cuda_endpoints::Result<InFlight<'static>> {
    w.stream
        .enqueue(CopyBatch::new().put(&w.src, 0, &w.ep, 0, OP))
}

/// The raw call a program makes for it on `path`.
#[inline(never)]
fn raw(w: &'static World, path: CopyPath) {
    let d: &dyn Driver = &*w.fx.2;
    if path == CopyPath::Portable {
        // SAFETY: `Fresh` does nothing with the copy.
        unsafe {
            d.memcpy_async(
                Pointer::device(w.dst.device_ptr()),
                Pointer::device(w.src.device_ptr()),
                OP,
                STREAM,
            )
        }
        .expect("memcpy_async");
        return;
    }
    let ops: CopyOps = [CopyOp {
        src: Operand::Pointer(Pointer::device(w.src.device_ptr())),
        dst: Operand::LogicalEndpoint {
            id: w.ep.id(),
            offset: 0,
        },
        size: OP,
    }]
    .into();
    // SAFETY: `Fresh` does nothing with the ops; the endpoint is ready and
    // bound, the source mapped, both for the whole process.
    unsafe { d.fabric_copy_batch(STREAM, ops, 0) }.expect("fabric_copy_batch");
}

fn s_fabric() -> &'static World {
    let w = world(CopyPath::Fabric);
    evict_caches();
    w
}

fn s_portable() -> &'static World {
    let w = world(CopyPath::Portable);
    evict_caches();
    w
}

/// Callgrind on [`COLD_CACHES`], printing the instructions and the lines
/// read from memory: code (`ILmr`), data read and data written (`DLmr`,
/// `DLmw`), and all of them (`RamHits`).
fn cold() -> Callgrind {
    let mut c = Callgrind::with_args(COLD_CACHES);
    c.format([
        CallgrindMetrics::from(EventKind::Ir),
        EventKind::ILmr.into(),
        EventKind::DLmr.into(),
        EventKind::DLmw.into(),
        EventKind::RamHits.into(),
    ]);
    c
}

fn waited(r: cuda_endpoints::Result<InFlight<'static>>) {
    r.expect("enqueue").wait().expect("wait");
}

#[library_benchmark(config = LibraryBenchmarkConfig::default().tool(cold()))]
#[bench::fabric(setup = s_fabric, teardown = waited)]
#[bench::portable(setup = s_portable, teardown = waited)]
fn copy_cold_typed(w: &'static World) -> cuda_endpoints::Result<InFlight<'static>> {
    typed(black_box(w))
}

#[library_benchmark(config = LibraryBenchmarkConfig::default().tool(cold()))]
#[bench::fabric(args = (CopyPath::Fabric), setup = s_raw)]
#[bench::portable(args = (CopyPath::Portable), setup = s_raw)]
fn copy_cold_raw((w, path): (&'static World, CopyPath)) {
    raw(black_box(w), black_box(path));
}

fn s_raw(path: CopyPath) -> (&'static World, CopyPath) {
    let w = world(path);
    evict_caches();
    (w, path)
}

fn s_route(path: CopyPath) -> &'static mut WorldRoute {
    let r = world(path).route();
    evict_caches();
    r
}

// The one put of `copy_cold_typed`, through a route.
#[library_benchmark(config = LibraryBenchmarkConfig::default().tool(cold()))]
#[bench::fabric(args = (CopyPath::Fabric), setup = s_route, teardown = waited)]
#[bench::portable(args = (CopyPath::Portable), setup = s_route, teardown = waited)]
fn copy_cold_route(route: &'static mut WorldRoute) -> cuda_endpoints::Result<InFlight<'static>> {
    black_box(route).put(0, 0, OP)
}

library_benchmark_group!(
    name = copy_cold,
    benchmarks = [copy_cold_typed, copy_cold_raw, copy_cold_route]
);

main!(library_benchmark_groups = copy_cold);

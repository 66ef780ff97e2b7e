//! Readiness at scale (issue 13), instruction counts (Callgrind, through
//! gungraun) on the pass-through `Null` driver: 1, 10, 100, 1 000, 10 000 and
//! 100 000 endpoints of one range.
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench readiness
//! ```
//!
//! - `wait_all`: only the wait, on `n` pending endpoints of one range in id
//!   order (ready at the first query, as `Null` answers): one query for the
//!   whole range, so the instructions per endpoint fall with `n` to the
//!   per-endpoint pass that finds the runs.
//! - `bring_up`: the whole way from ids to ready endpoints — `reserve(n)`,
//!   `into_endpoints`, `create` on each, `wait_all` — next to `bring_up_raw`,
//!   the same driver calls by hand (`id_reserve(n)`, `n` creates, one query).
//!   Flat per endpoint: every step is linear in `n`.
//!
//! Setups (a context warmed by one small bring-up, the pending endpoints)
//! and teardowns (destroying and releasing them) are not counted. The heap
//! per endpoint is `benches/readiness_heap.rs`.

mod common;

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

use cuda_endpoints::driver::{Driver, EndpointProps, Shape};
use cuda_endpoints::{
    Context, Endpoint, Failed, Pending, PendingList, ReadyList, Spec, Unicast, wait_all,
};
use gungraun::prelude::*;

use common::{Null, OWNER, SIZE, bring_up};

/// The process's one context on `Null`, warmed by a bring-up of two
/// endpoints so that the allocator and the context's caches are warm.
fn world() -> &'static Context {
    static WORLD: OnceLock<Context> = OnceLock::new();
    WORLD.get_or_init(|| {
        let ctx = Context::new(Null);
        black_box(bring_up(&ctx, 2));
        ctx
    })
}

fn s_world(n: u32) -> (&'static Context, u32) {
    (world(), n)
}

fn s_pending(n: u32) -> Vec<Endpoint<Pending, Unicast>> {
    world()
        .reserve(n)
        .expect("reserve")
        .into_endpoints()
        .into_iter()
        .map(|ep| ep.create(Spec::unicast(OWNER, SIZE)).expect("create"))
        .collect()
}

/// The raw side's driver: the same `Null` behind the same context.
fn s_raw(n: u32) -> (&'static dyn Driver, u32) {
    static RAW: OnceLock<std::sync::Arc<dyn Driver>> = OnceLock::new();
    // SAFETY: the raw side names only ids it reserves itself.
    let d = RAW.get_or_init(|| unsafe { world().driver_arc() });
    (&**d, n)
}

/// Teardown: ready, `n` of them (then destroyed and released by the drop).
fn ready(r: Result<ReadyList<Unicast>, Failed<PendingList<Unicast>>>) {
    black_box(r.expect("the measured wait failed").len());
}

fn n_ready(eps: ReadyList<Unicast>) {
    black_box(eps.len());
}

fn raw_done((d, base, n): (&'static dyn Driver, u32, u32)) {
    // SAFETY: the ids and endpoints the measured function made.
    unsafe {
        for id in base..base + n {
            d.destroy(id).expect("destroy");
        }
        d.id_release(base, n).expect("release");
    }
}

#[library_benchmark]
#[benches::n(args = [1, 10, 100, 1_000, 10_000, 100_000], setup = s_pending, teardown = ready)]
fn wait_all_n(
    eps: Vec<Endpoint<Pending, Unicast>>,
) -> Result<ReadyList<Unicast>, Failed<PendingList<Unicast>>> {
    wait_all(black_box(eps), Duration::from_secs(1))
}

#[library_benchmark]
#[benches::n(args = [1, 10, 100, 1_000, 10_000, 100_000], setup = s_world, teardown = n_ready)]
fn bring_up_n((ctx, n): (&'static Context, u32)) -> ReadyList<Unicast> {
    bring_up(black_box(ctx), black_box(n))
}

#[library_benchmark]
#[benches::n(args = [1, 10, 100, 1_000, 10_000, 100_000], setup = s_raw, teardown = raw_done)]
fn bring_up_raw_n((d, n): (&'static dyn Driver, u32)) -> (&'static dyn Driver, u32, u32) {
    let props = EndpointProps::new(Shape::Unicast { owner: OWNER }, SIZE);
    // SAFETY: ids this bench reserves itself; `raw_done` destroys and releases them.
    unsafe {
        let base = d.id_reserve(black_box(n)).expect("reserve");
        for id in base..base + n {
            d.create(id, props).expect("create");
        }
        while !d.query(base, n).expect("query") {
            std::hint::spin_loop();
        }
        (d, base, n)
    }
}

library_benchmark_group!(
    name = readiness,
    benchmarks = [wait_all_n, bring_up_n, bring_up_raw_n]
);

main!(library_benchmark_groups = readiness);

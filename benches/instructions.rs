//! Instruction counts (Valgrind's Callgrind, through gungraun), typed vs
//! raw, on the pass-through `Null` driver (and, for the whole lifecycle, on
//! the reference model). Exact and repeatable where wall-clock times are not.
//!
//! Needs Valgrind and the runner of the same version as the `gungraun` library:
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0
//! cargo bench --bench instructions
//! ```
//!
//! Two groups:
//!
//! - `lifecycle`: one whole unicast lifecycle (reserve, create, wait, bind,
//!   unbind, destroy, release), typed vs the same seven driver calls by hand.
//! - `transitions`: one transition at a time, on `Null`, each next to the
//!   raw driver call it makes: `reserve_one` / `id_reserve`, `create` /
//!   `create` (and `get_limits` + `create`), `wait` on an endpoint ready at the
//!   first query / one `query`, `wait_all` on that one endpoint, `bind` / `bind_mem`, `Binding::unbind` /
//!   `unbind`, `destroy` / `destroy`, `release` / `id_release`; and reserve
//!   and release without the context's spare range (`reserve_one_no_spare`,
//!   `release_spare_full`).
//!
//! Only the benchmark function is counted. Its input (a context, one
//! allocation, the endpoint or id in the state the transition starts from)
//! is made by its `setup`, after one warm-up lifecycle of each kind, so that
//! the allocator and the context's caches are warm as in a long-lived
//! program; what it returns is checked and dropped by its `teardown`, also
//! not counted.

mod common;

use std::fmt::Debug;
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

use cuda_endpoints::driver::{Driver, DriverResult, EndpointProps, Shape};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Binding, Context, Endpoint, Pending, PendingList, Ready, ReadyList, Spec, Unicast,
    wait_all,
};
use gungraun::prelude::*;

use common::{Fixture, Null, OWNER, SIZE, fixture, raw, raw_with_limits, typed};

/// The fixture, warmed by one lifecycle of each kind.
fn warm(fx: Fixture) -> Fixture {
    typed(&fx.0, &fx.1);
    raw(&*fx.2, fx.1.handle());
    raw_with_limits(&*fx.2, fx.1.handle());
    fx
}

fn null() -> Fixture {
    warm(fixture(Null))
}

fn model() -> Fixture {
    warm(fixture(Model::new(ModelConfig::default())))
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_typed(fx: Fixture) -> Fixture {
    typed(black_box(&fx.0), black_box(&fx.1));
    fx
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_raw(fx: Fixture) -> Fixture {
    raw(black_box(&*fx.2), black_box(fx.1.handle()));
    fx
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_raw_with_limits(fx: Fixture) -> Fixture {
    raw_with_limits(black_box(&*fx.2), black_box(fx.1.handle()));
    fx
}

library_benchmark_group!(
    name = lifecycle,
    benchmarks = [bench_typed, bench_raw, bench_raw_with_limits]
);

// ------------------------------------------------------------ per transition
//
// Each transition next to the raw call it makes, on `Null`, so that every
// instruction the typed side counts beyond the raw side is the typed layer's.
// Both sides go through the same `&dyn Driver`. Setups and teardowns are not
// counted; each benchmark runs in its own process, so a setup may leak.

/// The process's one warmed `Null` fixture. It lives until the process
/// exits, so that what a setup prepares can borrow it (a `Binding` borrows
/// its endpoint and memory).
fn world() -> &'static Fixture {
    static WORLD: OnceLock<Fixture> = OnceLock::new();
    WORLD.get_or_init(null)
}

/// The driver of [`world`].
fn driver() -> &'static dyn Driver {
    &*world().2
}

/// What the raw side describes to `create`: the typed side's
/// `Spec::unicast(OWNER, SIZE)`.
fn props() -> EndpointProps {
    EndpointProps::new(Shape::Unicast { owner: OWNER }, SIZE)
}

// Setups, typed side.

fn s_context() -> &'static Context {
    &world().0
}

fn s_reserved() -> Endpoint {
    world().0.reserve_one().expect("reserve")
}

fn s_pending() -> Endpoint<Pending, Unicast> {
    s_reserved()
        .create(Spec::unicast(OWNER, SIZE))
        .expect("create")
}

fn s_ready() -> Endpoint<Ready, Unicast> {
    s_pending().wait(Duration::ZERO).expect("wait")
}

fn s_bind() -> (&'static Endpoint<Ready, Unicast>, &'static Allocation) {
    (Box::leak(Box::new(s_ready())), &world().1)
}

fn s_binding() -> Binding<'static> {
    let (ep, mem) = s_bind();
    ep.bind(OWNER, 0, mem).expect("bind")
}

// Setups, raw side: the same states, reached by hand.

fn s_raw_driver() -> &'static dyn Driver {
    driver()
}

fn s_raw_reserved() -> (&'static dyn Driver, u32) {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe {
        let d = driver();
        (d, d.id_reserve(1).expect("reserve"))
    }
}

fn s_raw_created() -> (&'static dyn Driver, u32) {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe {
        let (d, id) = s_raw_reserved();
        d.create(id, props()).expect("create");
        assert!(d.query(id, 1).expect("query"));
        (d, id)
    }
}

fn s_raw_bind() -> (&'static dyn Driver, u32, u64) {
    let (d, id) = s_raw_created();
    (d, id, world().1.handle())
}

fn s_raw_bound() -> (&'static dyn Driver, u32) {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe {
        let (d, id, mem) = s_raw_bind();
        d.bind_mem(id, OWNER, 0, mem, 0, SIZE, 0).expect("bind");
        (d, id)
    }
}

/// Teardown: the transition succeeded (then what it returned is dropped).
fn ok<T, E: Debug>(r: Result<T, E>) {
    r.expect("the measured transition failed");
}

/// Teardown of a raw query: the endpoint is constructed.
fn constructed(r: DriverResult<bool>) {
    assert!(r.expect("query"), "not constructed at the first query");
}

// reserve_one vs id_reserve

#[library_benchmark]
#[bench::null(setup = s_context, teardown = ok)]
fn reserve_one_typed(ctx: &'static Context) -> cuda_endpoints::Result<Endpoint> {
    ctx.reserve_one()
}

// Without a spare range: a context reuses the one-id range it released
// last (see `Context::reserve_one`); these two measure the case where it has
// none to hand (several endpoints alive at once) and where `release` finds
// the spare taken and frees the older one.

/// The context with its spare taken by an endpoint kept alive.
fn s_context_no_spare() -> &'static Context {
    let ctx = &world().0;
    std::mem::forget(ctx.reserve_one().expect("reserve"));
    ctx
}

/// A reserved endpoint, with the context's spare slot filled by another.
fn s_reserved_spare_full() -> Endpoint {
    let ctx = &world().0;
    let (a, b) = (
        ctx.reserve_one().expect("reserve"),
        ctx.reserve_one().expect("reserve"),
    );
    b.release().expect("release");
    a
}

#[library_benchmark]
#[bench::null(setup = s_context_no_spare, teardown = ok)]
fn reserve_one_no_spare_typed(ctx: &'static Context) -> cuda_endpoints::Result<Endpoint> {
    ctx.reserve_one()
}

#[library_benchmark]
#[bench::null(setup = s_reserved_spare_full, teardown = ok)]
fn release_spare_full_typed(ep: Endpoint) -> cuda_endpoints::Result<()> {
    ep.release()
}

#[library_benchmark]
#[bench::null(setup = s_raw_driver, teardown = ok)]
fn reserve_one_raw(d: &'static dyn Driver) -> DriverResult<u32> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.id_reserve(1) }
}

// create vs create (and get_limits + create)

#[library_benchmark]
#[bench::null(setup = s_reserved, teardown = ok)]
fn create_typed(
    ep: Endpoint,
) -> Result<Endpoint<Pending, Unicast>, cuda_endpoints::Failed<Endpoint>> {
    ep.create(Spec::unicast(OWNER, SIZE))
}

#[library_benchmark]
#[bench::null(setup = s_raw_reserved, teardown = ok)]
fn create_raw((d, id): (&'static dyn Driver, u32)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.create(id, props()) }
}

// `get_limits`, the size check it feeds (R2.3, R10) and `create`: what the
// typed `create` asks of the driver.
#[library_benchmark]
#[bench::null(setup = s_raw_reserved, teardown = ok)]
fn create_raw_with_limits((d, id): (&'static dyn Driver, u32)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe {
        let props = props();
        let limits = d.get_limits(props)?;
        assert!(SIZE <= limits.max_size && SIZE.is_multiple_of(limits.bind_alignment.max(1)));
        d.create(id, props)
    }
}

// wait (ready at the first query) vs one query

#[library_benchmark]
#[bench::null(setup = s_pending, teardown = ok)]
fn wait_typed(
    ep: Endpoint<Pending, Unicast>,
) -> Result<Endpoint<Ready, Unicast>, cuda_endpoints::Failed<Endpoint<Pending, Unicast>>> {
    ep.wait(Duration::from_secs(1))
}

#[library_benchmark]
#[bench::null(setup = s_raw_created, teardown = constructed)]
fn wait_raw((d, id): (&'static dyn Driver, u32)) -> DriverResult<bool> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.query(id, 1) }
}

// wait_all on one endpoint (ready at the first query) vs `wait`: the same
// one query.

fn s_pending_list() -> Vec<Endpoint<Pending, Unicast>> {
    vec![s_pending()]
}

#[library_benchmark]
#[bench::null(setup = s_pending_list, teardown = ok)]
fn wait_all_one_typed(
    eps: Vec<Endpoint<Pending, Unicast>>,
) -> Result<ReadyList<Unicast>, cuda_endpoints::Failed<PendingList<Unicast>>> {
    wait_all(eps, Duration::from_secs(1))
}

// bind vs bind_mem

#[library_benchmark]
#[bench::null(setup = s_bind, teardown = ok)]
fn bind_typed(
    (ep, mem): (&'static Endpoint<Ready, Unicast>, &'static Allocation),
) -> cuda_endpoints::Result<Binding<'static>> {
    ep.bind(OWNER, 0, mem)
}

#[library_benchmark]
#[bench::null(setup = s_raw_bind, teardown = ok)]
fn bind_raw((d, id, mem): (&'static dyn Driver, u32, u64)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.bind_mem(id, OWNER, 0, mem, 0, SIZE, 0) }
}

// Binding::unbind vs unbind

#[library_benchmark]
#[bench::null(setup = s_binding, teardown = ok)]
fn unbind_typed(b: Binding<'static>) -> cuda_endpoints::Result<()> {
    b.unbind()
}

#[library_benchmark]
#[bench::null(setup = s_raw_bound, teardown = ok)]
fn unbind_raw((d, id): (&'static dyn Driver, u32)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.unbind(id, OWNER, 0, SIZE) }
}

// destroy vs destroy

#[library_benchmark]
#[bench::null(setup = s_ready, teardown = ok)]
fn destroy_typed(
    ep: Endpoint<Ready, Unicast>,
) -> Result<Endpoint, cuda_endpoints::Failed<Endpoint<Ready, Unicast>>> {
    ep.destroy()
}

#[library_benchmark]
#[bench::null(setup = s_raw_created, teardown = ok)]
fn destroy_raw((d, id): (&'static dyn Driver, u32)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.destroy(id) }
}

// release vs id_release

#[library_benchmark]
#[bench::null(setup = s_reserved, teardown = ok)]
fn release_typed(ep: Endpoint) -> cuda_endpoints::Result<()> {
    ep.release()
}

#[library_benchmark]
#[bench::null(setup = s_raw_reserved, teardown = ok)]
fn release_raw((d, id): (&'static dyn Driver, u32)) -> DriverResult<()> {
    // SAFETY: raw calls on ids this bench reserved itself; the fixture's allocation outlives every binding.
    unsafe { d.id_release(id, 1) }
}

library_benchmark_group!(
    name = transitions,
    benchmarks = [
        reserve_one_typed,
        reserve_one_raw,
        reserve_one_no_spare_typed,
        create_typed,
        create_raw,
        create_raw_with_limits,
        wait_typed,
        wait_raw,
        wait_all_one_typed,
        bind_typed,
        bind_raw,
        unbind_typed,
        unbind_raw,
        destroy_typed,
        destroy_raw,
        release_typed,
        release_raw,
        release_spare_full_typed
    ]
);

main!(library_benchmark_groups = lifecycle, transitions);

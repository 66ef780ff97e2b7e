//! Fixtures shared by the test binaries: the end-of-test check that nothing
//! leaked and no rule was broken, and the property-test configuration.
//! Each binary uses some of them (its `main.rs` declares `mod common;`, its
//! modules `use crate::common;`), hence `dead_code`.
#![allow(dead_code)]

pub mod layer;
pub mod portable;

use std::time::Duration;

use cuda_endpoints::bootstrap::Bootstrap;
use cuda_endpoints::bounds::MemShare;
use cuda_endpoints::model::{Model, ModelConfig, Violation};
use cuda_endpoints::{Allocation, Context, Endpoint, Mapped, Ready, Spec, Unicast};
use proptest::test_runner::{Config, RngAlgorithm, RngSeed};

/// The end of every model test: no teardown error was kept on the context,
/// nothing is left anywhere on the node (ids, endpoints, bindings,
/// allocations, mappings, address ranges, multicast objects: every process's
/// leak counters are zero), and the model saw no call break a rule.
#[track_caller]
pub fn clean(ctx: &Context, model: &Model) {
    let teardown = ctx.take_teardown_errors();
    assert!(teardown.is_empty(), "teardown errors: {teardown:?}");
    let live = model.live_node();
    assert!(live.is_empty(), "leak: {live:?}");
    let violations = model.violations();
    assert!(violations.is_empty(), "rule broken: {violations:?}");
}

/// The end of a test on a model fabric that all its processes left or
/// cleaned up: nothing held, no endpoint or classic object still referenced,
/// no shareable handle open, and no call broke a rule.
#[track_caller]
pub fn fabric_idle(model: &Model) {
    no_violations(&model.violations());
    let live = model.live_fabric();
    assert!(live.is_empty(), "leak: {live:?}");
}

/// The end of a test on a model fabric: no process holds anything on the
/// fabric any more and the model saw no call break a rule.
#[track_caller]
pub fn fabric_clean(model: &Model) {
    let live = model.live_fabric();
    assert!(live.held.is_empty(), "leak: {live:?}");
    no_violations(&model.violations());
}

/// The end of a model test that may leave things behind on purpose: the
/// model saw no call break a rule (issue 11: the violation log is empty at
/// the end of every test, so a violation always means a bug in the crate).
/// Pass `model.violations()` (a `Model`, or a `Probe` of `common/backend.rs`).
#[track_caller]
pub fn no_violations(violations: &[Violation]) {
    assert!(violations.is_empty(), "rule broken: {violations:?}");
}

/// The end of a test that breaks rules on purpose with raw driver calls:
/// exactly these rules were broken, in this order, and nothing else.
#[track_caller]
pub fn broke(violations: &[Violation], rules: &[&str]) {
    let got: Vec<&str> = violations.iter().map(|v| v.rule).collect();
    assert_eq!(got, rules, "rules broken on purpose: {violations:?}");
}

/// `PROPTEST_CASES` overrides the case counts (e.g. fewer under valgrind).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A reproducible proptest configuration: fixed seed, no persistence files.
pub fn config(default_cases: u32, seed: u64, max_shrink_iters: u32) -> Config {
    Config {
        cases: cases(default_cases),
        rng_seed: RngSeed::Fixed(seed),
        // ChaCha in an unoptimised build costs more than the cases.
        rng_algorithm: RngAlgorithm::XorShift,
        max_shrink_iters,
        failure_persistence: None,
        ..Config::default()
    }
}

/// `n` processes of one node of `n` devices on a 13.5 driver (the fabric
/// copy exists), rank `r` on device `r`: each rank's context and its
/// process of the model (to read its memory), and the first process.
pub fn node_processes(n: usize) -> (Vec<(Context, Model)>, Model) {
    let mut config = ModelConfig::node(n);
    config.driver_version = 13050;
    let (ctx0, model) = Context::model(config);
    let mut ranks = vec![(ctx0, model.clone())];
    ranks.extend((1..n).map(|_| {
        let p = model.spawn_process();
        (Context::new(p.clone()), p)
    }));
    (ranks, model)
}

/// A node of `devices` devices on a 13.5 driver (the fabric copy exists):
/// the context and the model.
pub fn node_13_5(devices: usize) -> (Context, Model) {
    Context::model(ModelConfig {
        driver_version: 13050,
        ..ModelConfig::node(devices)
    })
}

/// A ready unicast endpoint of `bytes` owned by `owner`, made in one go.
pub fn ready_unicast(
    ctx: &Context,
    owner: i32,
    bytes: u64,
    timeout: Duration,
) -> Endpoint<Ready, Unicast> {
    let pending = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(owner, bytes));
    pending.unwrap().wait(timeout).unwrap()
}

/// `size` bytes of `H` memory on `dev`, mapped with access for `dev`.
pub fn mapped<H: MemShare>(ctx: &Context, dev: i32, size: u64) -> Mapped<H> {
    Allocation::<H>::on_device(ctx, dev, size)
        .unwrap()
        .map(&[dev])
        .unwrap()
}

/// Runs `f(rank, context, process, bootstrap)` on every rank of `ranks`
/// (as [`node_processes`] makes them), each on its own thread over its
/// bootstrap of `boots`, and collects the results in rank order.
pub fn on_every_rank<R: Send, B: Bootstrap + Send>(
    ranks: &[(Context, Model)],
    boots: Vec<B>,
    f: impl Fn(usize, &Context, &Model, &B) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .zip(boots)
            .enumerate()
            .map(|(r, ((ctx, model), boot))| {
                let f = &f;
                s.spawn(move || f(r, ctx, model, &boot))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

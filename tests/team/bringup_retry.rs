//! Agreed, bounded, retried bring-ups (issue 20, item 3): a retryable code
//! (`FABRIC_NOT_READY` 919) injected on one rank only
//! (`Fault::on_process`) makes every rank retry that step together — any
//! step: the hello, create and export, a unicast import and wait, a
//! multicast import, enroll and wait; a fault
//! that outlasts the retry budget fails every rank with the same failing
//! rank and step. The reachability probe, retried as any step, is off in
//! the tests that count one step's calls (it makes and imports trial
//! endpoints first); the tests of the probe itself are the last ones.
//! Attempts are counted (driver calls, `tracing` events per
//! rank), never timed. Ranks are threads, each its own process of one model.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, Threads};
use cuda_endpoints::model::{
    Model,
    faults::{Fault, FaultPlan},
};
use cuda_endpoints::team::{self, Cause, PeerSpec, Retry, Step, TeamError, TeamSpec};
use cuda_endpoints::{
    Context,
    driver::{Call, Code},
};
use tracing_subscriber::layer::SubscriberExt;

const BYTES: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);
/// A short back-off: the tests count attempts, they do not time them.
const RETRY: Duration = Duration::from_millis(1);

use common::node_processes as processes;

/// Counts this thread's bring-up attempt events (target
/// `cuda_endpoints::team`).
struct Attempts(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Attempts {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if e.metadata().target() == "cuda_endpoints::team" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `f` on every rank, each on its own thread with its own counter of
/// retry events; returns each rank's result and its count.
fn on_every_rank<R: Send>(
    contexts: &[(Context, Model)],
    f: impl Fn(usize, &Context, &dyn Bootstrap) -> R + Sync,
) -> Vec<(R, usize)> {
    common::on_every_rank(contexts, Threads::new(contexts.len()), |r, ctx, _, boot| {
        let n = Arc::new(AtomicUsize::new(0));
        let sub = tracing_subscriber::registry().with(Attempts(n.clone()));
        let out = tracing::subscriber::with_default(sub, || f(r, ctx, boot));
        (out, n.load(Ordering::Relaxed))
    })
}

fn fault_on(pid: usize, call: Call, times: u64) -> FaultPlan {
    FaultPlan::none().with(
        Fault::nth(call, 1, Code::FABRIC_NOT_READY)
            .times(times)
            .on_process(pid),
    )
}

type Outcomes = Vec<(Result<(), TeamError>, usize)>;

/// Every rank brings up a multicast team of its own device with `attempts`
/// attempts per step, the probe off.
fn multicast_on_every_rank(contexts: &[(Context, Model)], attempts: u32) -> Outcomes {
    on_every_rank(contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(attempts, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    })
}

/// Every rank brings up its unicast peers with `attempts` attempts per
/// step, the probe on or off.
fn unicast_on_every_rank(contexts: &[(Context, Model)], attempts: u32, probe: bool) -> Outcomes {
    on_every_rank(contexts, |r, ctx, boot| {
        let spec = PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(attempts, RETRY))
            .probe(probe);
        team::unicast_peers(ctx, boot, &spec).map(drop)
    })
}

/// Every rank succeeded after `events` failed attempts, the same on each.
fn assert_every_rank_ok_after(out: Outcomes, events: usize, why: &str) {
    for (r, (result, seen)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "{why}rank {r}: {result:?}");
        assert_eq!(seen, events, "{why}rank {r}: failed attempts in the trace");
    }
}

/// Every rank failed naming the same failing rank, step and code, after
/// `events` failed attempts in its trace.
fn assert_every_rank_failed_at(
    out: Outcomes,
    (rank, step, code): (usize, Step, Code),
    events: usize,
) {
    for (r, (result, seen)) in out.into_iter().enumerate() {
        let e: TeamError = result.unwrap_err();
        assert_eq!(
            (e.rank, e.step, e.code()),
            (rank, step, Some(code)),
            "rank {r}: {e}"
        );
        assert!(matches!(e.cause, Cause::Local(_) | Cause::Peer(_)), "{e}");
        assert_eq!(seen, events, "rank {r}: every attempt in the trace");
    }
}

/// Nothing left on the node and no rule broken.
fn assert_left_clean(model: &Model) {
    assert!(model.live_node().is_empty(), "undone on every rank");
    common::no_violations(&model.violations());
}

#[test]
fn a_rank_not_ready_for_its_first_two_creates_makes_every_rank_retry_and_all_succeed() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::Create, 2));
    let out = unicast_on_every_rank(&contexts, 4, false);
    assert_every_rank_ok_after(out, 2, "");
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Create),
        3 + 2,
        "only rank 1 created again"
    );
    assert_left_clean(&model);
}

#[test]
fn a_not_ready_fault_that_outlasts_the_budget_fails_every_rank_naming_that_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::Export, u64::MAX));
    let out = unicast_on_every_rank(&contexts, 3, false);
    assert_every_rank_failed_at(out, (2, Step::Export, Code::FABRIC_NOT_READY), 3);
    assert_eq!(model.calls(Call::Export), 2 + 3, "three attempts on rank 2");
    assert_left_clean(&model);
}

#[test]
fn a_non_retryable_code_fails_at_once_without_a_second_attempt() {
    let (contexts, model) = processes(2);
    model
        .set_faults(FaultPlan::none().with(
            Fault::nth(Call::Create, 1, Code::OUT_OF_MEMORY).on_process(contexts[1].1.pid()),
        ));
    let out = unicast_on_every_rank(&contexts, 4, false);
    assert_every_rank_failed_at(out, (1, Step::Create, Code::OUT_OF_MEMORY), 1);
    assert_eq!(model.calls(Call::Create), 2);
    assert!(model.live_node().is_empty());
}

#[test]
fn a_multicast_root_not_ready_for_its_first_create_is_retried_by_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[0].1.pid(), Call::Create, 1));
    let out = multicast_on_every_rank(&contexts, 3);
    assert_every_rank_ok_after(out, 1, "");
    assert_eq!(model.faults_fired(), 1);
    assert_left_clean(&model);
}

#[test]
fn a_rank_whose_imports_are_not_ready_twice_is_retried_keeping_what_it_imported() {
    let (contexts, model) = processes(3);
    // Rank 1's second import (of rank 2) fails twice: its import of rank 0
    // is kept, only rank 2's is tried again.
    model.set_faults(
        FaultPlan::none().with(
            Fault::nth(Call::Import, 2, Code::FABRIC_NOT_READY)
                .times(2)
                .on_process(contexts[1].1.pid()),
        ),
    );
    let out = unicast_on_every_rank(&contexts, 4, false);
    assert_every_rank_ok_after(out, 2, "");
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Import),
        3 * 2 + 2,
        "only the failed import again"
    );
    assert_left_clean(&model);
}

#[test]
fn a_rank_whose_hello_is_not_ready_once_makes_every_rank_retry_the_hello() {
    for multicast in [false, true] {
        let (contexts, model) = processes(3);
        model.set_faults(fault_on(contexts[1].1.pid(), Call::DeviceGetCount, 1));
        let out = if multicast {
            multicast_on_every_rank(&contexts, 3)
        } else {
            unicast_on_every_rank(&contexts, 3, false)
        };
        assert_every_rank_ok_after(out, 1, &format!("multicast {multicast}, "));
        assert_eq!(model.faults_fired(), 1);
        assert_left_clean(&model);
    }
}

#[test]
fn a_multicast_rank_whose_import_is_not_ready_twice_is_retried_by_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::Import, 2));
    let out = multicast_on_every_rank(&contexts, 4);
    assert_every_rank_ok_after(out, 2, "");
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Import),
        2 + 2,
        "only rank 2 imported again"
    );
    assert_left_clean(&model);
}

#[test]
fn a_multicast_rank_whose_enroll_is_not_ready_once_keeps_its_import_and_enrolls_again() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::AddDevice, 1));
    let out = multicast_on_every_rank(&contexts, 3);
    assert_every_rank_ok_after(out, 1, "");
    assert_eq!(model.calls(Call::Import), 2, "the import was kept");
    assert_eq!(model.calls(Call::AddDevice), 3 + 1);
    assert_left_clean(&model);
}

#[test]
fn a_multicast_rank_whose_wait_is_not_ready_once_waits_again_with_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[0].1.pid(), Call::Query, 1));
    let out = multicast_on_every_rank(&contexts, 3);
    assert_every_rank_ok_after(out, 1, "");
    assert_eq!(model.faults_fired(), 1);
    assert_left_clean(&model);
}

#[test]
fn an_enroll_fault_that_outlasts_the_budget_fails_every_rank_naming_that_rank_with_nothing_left() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::AddDevice, u64::MAX));
    let out = multicast_on_every_rank(&contexts, 3);
    assert_every_rank_failed_at(out, (2, Step::Enroll, Code::FABRIC_NOT_READY), 3);
    assert_eq!(
        model.calls(Call::AddDevice),
        2 + 3,
        "three attempts on rank 2"
    );
    assert_left_clean(&model);
}

#[test]
fn a_rank_whose_probe_import_is_not_ready_once_makes_every_rank_probe_again() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::Import, 1));
    let out = unicast_on_every_rank(&contexts, 3, true);
    assert_every_rank_ok_after(out, 1, "");
    assert_eq!(model.faults_fired(), 1);
    // Two probes of 3 x 2 trial imports each (the first cut short by one),
    // then the bring-up's 3 x 2.
    assert_eq!(model.calls(Call::Import), 6 + 6 + 6);
    assert_left_clean(&model);
}

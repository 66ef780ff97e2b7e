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

mod common;

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

#[test]
fn a_rank_not_ready_for_its_first_two_creates_makes_every_rank_retry_and_all_succeed() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::Create, 2));
    let spec = |r: usize| {
        PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(4, RETRY))
            .probe(false)
    };
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        team::unicast_peers(ctx, boot, &spec(r)).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(
            events, 2,
            "rank {r}: one event per failed attempt, on every rank"
        );
    }
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Create),
        3 + 2,
        "only rank 1 created again"
    );
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn a_not_ready_fault_that_outlasts_the_budget_fails_every_rank_naming_that_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::Export, u64::MAX));
    let spec = |r: usize| {
        PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY))
            .probe(false)
    };
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        team::unicast_peers(ctx, boot, &spec(r)).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        let e: TeamError = result.unwrap_err();
        assert_eq!((e.rank, e.step), (2, Step::Export), "rank {r}: {e}");
        assert_eq!(e.code(), Some(Code::FABRIC_NOT_READY), "rank {r}: {e}");
        assert!(matches!(e.cause, Cause::Local(_) | Cause::Peer(_)), "{e}");
        assert_eq!(events, 3, "rank {r}: every attempt in the trace");
    }
    assert_eq!(model.calls(Call::Export), 2 + 3, "three attempts on rank 2");
    assert!(model.live_node().is_empty(), "undone on every rank");
    common::no_violations(&model.violations());
}

#[test]
fn a_non_retryable_code_fails_at_once_without_a_second_attempt() {
    let (contexts, model) = processes(2);
    model
        .set_faults(FaultPlan::none().with(
            Fault::nth(Call::Create, 1, Code::OUT_OF_MEMORY).on_process(contexts[1].1.pid()),
        ));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(4, RETRY))
            .probe(false);
        team::unicast_peers(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        let e = result.unwrap_err();
        assert_eq!(
            (e.rank, e.step, e.code()),
            (1, Step::Create, Some(Code::OUT_OF_MEMORY)),
            "rank {r}: {e}"
        );
        assert_eq!(events, 1, "rank {r}");
    }
    assert_eq!(model.calls(Call::Create), 2);
    assert!(model.live_node().is_empty());
}

#[test]
fn a_multicast_root_not_ready_for_its_first_create_is_retried_by_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[0].1.pid(), Call::Create, 1));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(events, 1, "rank {r}");
    }
    assert_eq!(model.faults_fired(), 1);
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
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
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(4, RETRY))
            .probe(false);
        team::unicast_peers(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(events, 2, "rank {r}");
    }
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Import),
        3 * 2 + 2,
        "only the failed import again"
    );
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn a_rank_whose_hello_is_not_ready_once_makes_every_rank_retry_the_hello() {
    for multicast in [false, true] {
        let (contexts, model) = processes(3);
        model.set_faults(fault_on(contexts[1].1.pid(), Call::DeviceGetCount, 1));
        let out = on_every_rank(&contexts, |r, ctx, boot| {
            if multicast {
                let spec = TeamSpec::new([r as i32], BYTES)
                    .timeout(T)
                    .retry(Retry::new(3, RETRY))
                    .probe(false);
                team::multicast(ctx, boot, &spec).map(drop)
            } else {
                let spec = PeerSpec::new(r as i32, BYTES)
                    .timeout(T)
                    .retry(Retry::new(3, RETRY))
                    .probe(false);
                team::unicast_peers(ctx, boot, &spec).map(drop)
            }
        });
        for (r, (result, events)) in out.into_iter().enumerate() {
            assert!(
                result.is_ok(),
                "multicast {multicast}, rank {r}: {result:?}"
            );
            assert_eq!(
                events, 1,
                "multicast {multicast}, rank {r}: one retried hello"
            );
        }
        assert_eq!(model.faults_fired(), 1);
        assert!(model.live_node().is_empty());
        common::no_violations(&model.violations());
    }
}

#[test]
fn a_multicast_rank_whose_import_is_not_ready_twice_is_retried_by_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::Import, 2));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(4, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(events, 2, "rank {r}: every attempt in the trace");
    }
    assert_eq!(model.faults_fired(), 2);
    assert_eq!(
        model.calls(Call::Import),
        2 + 2,
        "only rank 2 imported again"
    );
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn a_multicast_rank_whose_enroll_is_not_ready_once_keeps_its_import_and_enrolls_again() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::AddDevice, 1));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(events, 1, "rank {r}");
    }
    assert_eq!(model.calls(Call::Import), 2, "the import was kept");
    assert_eq!(model.calls(Call::AddDevice), 3 + 1);
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn a_multicast_rank_whose_wait_is_not_ready_once_waits_again_with_every_rank() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[0].1.pid(), Call::Query, 1));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(events, 1, "rank {r}");
    }
    assert_eq!(model.faults_fired(), 1);
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn an_enroll_fault_that_outlasts_the_budget_fails_every_rank_naming_that_rank_with_nothing_left() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[2].1.pid(), Call::AddDevice, u64::MAX));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = TeamSpec::new([r as i32], BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        let e = result.unwrap_err();
        assert_eq!(
            (e.rank, e.step, e.code()),
            (2, Step::Enroll, Some(Code::FABRIC_NOT_READY)),
            "rank {r}: {e}"
        );
        assert_eq!(events, 3, "rank {r}: every attempt in the trace");
    }
    assert_eq!(
        model.calls(Call::AddDevice),
        2 + 3,
        "three attempts on rank 2"
    );
    assert!(model.live_node().is_empty(), "undone on every rank");
    common::no_violations(&model.violations());
}

#[test]
fn a_rank_whose_probe_import_is_not_ready_once_makes_every_rank_probe_again() {
    let (contexts, model) = processes(3);
    model.set_faults(fault_on(contexts[1].1.pid(), Call::Import, 1));
    let out = on_every_rank(&contexts, |r, ctx, boot| {
        let spec = PeerSpec::new(r as i32, BYTES)
            .timeout(T)
            .retry(Retry::new(3, RETRY));
        team::unicast_peers(ctx, boot, &spec).map(drop)
    });
    for (r, (result, events)) in out.into_iter().enumerate() {
        assert!(result.is_ok(), "rank {r}: {result:?}");
        assert_eq!(
            events, 1,
            "rank {r}: one failed probe, the same on every rank"
        );
    }
    assert_eq!(model.faults_fired(), 1);
    // Two probes of 3 x 2 trial imports each (the first cut short by one),
    // then the bring-up's 3 x 2.
    assert_eq!(model.calls(Call::Import), 6 + 6 + 6);
    assert!(model.live_node().is_empty(), "the trial endpoints are gone");
    common::no_violations(&model.violations());
}

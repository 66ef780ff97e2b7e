//! The in-process backend and the closure adapter: collectives correct for
//! 1, 2, 4 and 8 ranks; a rank that never calls gives the others a timeout
//! naming it; a dropped rank is a closed peer; different collectives at one
//! step are a mismatch; the adapter refuses bytes of another communicator,
//! another step, or in another rank order.

use crate::bootstrap_support;
use crate::watchdog;

use std::sync::Arc;
use std::time::Duration;

use bootstrap_support::suite;
use cuda_endpoints::bootstrap::{Callbacks, FrameMismatch, Malformed, ThreadRank};
use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::BootstrapError, bootstrap::Threads};

fn on_threads<R: Send>(
    ranks: &[impl Bootstrap + Sync],
    f: impl Fn(&dyn Bootstrap) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|b| s.spawn(|| f(b))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

#[test]
fn threads_collectives_are_correct_for_1_2_4_8_ranks() {
    for n in [1, 2, 4, 8] {
        for r in on_threads(&Threads::new(n), suite) {
            r.expect("suite");
        }
    }
}

/// Each waiting rank ends with its own timeout (the one it was given),
/// naming rank 2; not a hang (the watchdog fires only minutes later; no
/// wall-clock assertion).
#[test]
fn a_rank_that_never_calls_gives_the_others_a_timeout_naming_it() {
    let ranks = Threads::new(3);
    let t = Duration::from_millis(200);
    let _hang = watchdog::guard("a rank that never calls");
    let errs = on_threads(&ranks[..2], |b| {
        b.allgather(b"x", t).expect_err("rank 2 never calls")
    });
    for e in errs {
        assert!(
            matches!(&e, BootstrapError::Timeout { waiting_for, after, .. } if waiting_for == &[2] && *after == t),
            "{e}"
        );
    }
}

#[test]
fn a_dropped_rank_is_a_closed_peer() {
    let mut ranks = Threads::new(2);
    drop(ranks.pop());
    let e = ranks[0]
        .barrier(Duration::from_secs(5))
        .expect_err("rank 1 dropped");
    assert!(
        matches!(
            e,
            BootstrapError::PeerClosed {
                rank: 0,
                peer: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn different_collectives_at_one_step_are_a_mismatch() {
    let ranks = Threads::new(2);
    let errs = on_threads(&ranks, |b| {
        if b.rank() == 0 {
            b.barrier(Duration::from_millis(300)).err()
        } else {
            b.allgather(b"", Duration::from_millis(300)).err()
        }
    });
    assert!(
        errs.iter().flatten().any(|e| matches!(
            e,
            BootstrapError::Mismatch {
                what: FrameMismatch::Operation { .. },
                ..
            }
        )),
        "{errs:?}"
    );
}

/// A [`Callbacks`] over a [`ThreadRank`], as a user wraps a communicator of theirs.
fn adapter(b: Arc<ThreadRank>, job: u64) -> Callbacks {
    let (rank, size) = (b.rank(), b.size());
    let g = Arc::clone(&b);
    Callbacks::new(rank, size, job, move |mine, t| {
        g.allgather(mine, t).map_err(Into::into)
    })
    .expect("valid rank")
    .with_broadcast(move |root, bytes, t| b.broadcast(root, bytes, t).map_err(Into::into))
}

#[test]
fn callbacks_over_a_users_communicator_are_correct() {
    let ranks: Vec<Callbacks> = Threads::new(4)
        .into_iter()
        .map(|b| adapter(Arc::new(b), 7))
        .collect();
    for r in on_threads(&ranks, suite) {
        r.expect("suite over callbacks");
    }
    // Only an allgather closure: broadcast and barrier are derived.
    let ranks: Vec<Callbacks> = Threads::new(3)
        .into_iter()
        .map(|b| {
            let (rank, size) = (b.rank(), b.size());
            Callbacks::new(rank, size, 9, move |m, t| {
                b.allgather(m, t).map_err(Into::into)
            })
            .expect("valid")
        })
        .collect();
    for r in on_threads(&ranks, suite) {
        r.expect("suite over allgather only");
    }
}

#[test]
fn bytes_exchanged_over_the_wrong_communicator_are_refused() {
    // The adapter of job 1 whose closure answers with what another
    // communicator (job 2) exchanged: TensorRT-LLM's critical review finding.
    let foreign = Capture::sealed(2, 2);
    let e = answering(0, foreign)
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("job 2's bytes");
    assert!(
        matches!(
            e,
            BootstrapError::Mismatch {
                what: FrameMismatch::Job { ours: 1, theirs: 2 },
                ..
            }
        ),
        "{e}"
    );
    // Same job id, another size: a sub-communicator's bytes.
    let sub = Capture::sealed(3, 1);
    let e = answering(0, sub[..2].to_vec())
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("size 3's bytes");
    assert!(
        matches!(
            e,
            BootstrapError::Mismatch {
                what: FrameMismatch::Size { ours: 2, theirs: 3 },
                ..
            }
        ),
        "{e}"
    );
}

/// Captures the envelopes [`Callbacks`] hand their closure.
struct Capture;

impl Capture {
    /// What ranks `0..size` of job `job` seal at their first allgather.
    fn sealed(size: usize, job: u64) -> Vec<Vec<u8>> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        for i in 0..size {
            let s = Arc::clone(&seen);
            let c = Callbacks::new(i, size, job, move |m, _| {
                s.lock().expect("lock").push(m.to_vec());
                Err("captured".into())
            })
            .expect("valid");
            let _ = c.allgather(format!("from {i}").as_bytes(), Duration::from_secs(1));
        }
        seen.lock().expect("lock").clone()
    }
}

fn answering(rank: usize, answer: Vec<Vec<u8>>) -> Callbacks {
    Callbacks::new(rank, 2, 1, move |_, _| Ok(answer.clone())).expect("valid")
}

#[test]
fn the_adapter_refuses_other_steps_rank_orders_counts_and_garbage() {
    let good = Capture::sealed(2, 1);
    assert_eq!(
        answering(0, good.clone())
            .allgather(b"x", Duration::from_secs(1))
            .expect("as sealed"),
        vec![b"from 0".to_vec(), b"from 1".to_vec()]
    );
    let swapped = vec![good[1].clone(), good[0].clone()];
    let e = answering(0, swapped)
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("rank order");
    assert!(
        matches!(
            e,
            BootstrapError::Mismatch {
                peer: 0,
                what: FrameMismatch::Sender {
                    expected: 0,
                    theirs: 1
                },
                ..
            }
        ),
        "{e}"
    );
    let stale = answering(0, good.clone());
    stale
        .allgather(b"x", Duration::from_secs(1))
        .expect("step 0");
    let e = stale
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("step 0's bytes at step 1");
    assert!(
        matches!(
            e,
            BootstrapError::Mismatch {
                what: FrameMismatch::Seq { ours: 1, theirs: 0 },
                ..
            }
        ),
        "{e}"
    );
    let e = answering(0, vec![good[0].clone()])
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("count");
    assert!(
        matches!(
            e,
            BootstrapError::Mismatch {
                what: FrameMismatch::Count {
                    expected: 2,
                    got: 1
                },
                ..
            }
        ),
        "{e}"
    );
    let e = answering(0, vec![good[0].clone(), b"garbage".to_vec()])
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("garbage");
    assert!(
        matches!(
            e,
            BootstrapError::Malformed {
                peer: 1,
                what: Malformed::Magic | Malformed::Truncated,
                ..
            }
        ),
        "{e}"
    );
    let mut truncated = good[1].clone();
    truncated.pop();
    let e = answering(0, vec![good[0].clone(), truncated])
        .allgather(b"x", Duration::from_secs(1))
        .expect_err("truncated");
    assert!(
        matches!(
            e,
            BootstrapError::Malformed {
                peer: 1,
                what: Malformed::Truncated,
                ..
            }
        ),
        "{e}"
    );
    let e = Callbacks::new(0, 2, 1, |_, _| Err("the user's communicator failed".into()))
        .expect("valid")
        .barrier(Duration::from_secs(1))
        .expect_err("callback error");
    assert!(
        matches!(e, BootstrapError::Callback { .. })
            && e.to_string().contains("the user's communicator failed"),
        "{e}"
    );
    assert!(Callbacks::new(2, 2, 1, |_, _| Ok(Vec::new())).is_err());
}

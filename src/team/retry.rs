//! Agreed, bounded retries of a bring-up step.
//!
//! What this file owns:
//! - [`Retry`], the policy a bring-up's spec carries: how many attempts a
//!   step gets and the back-off between them, bounded inside the bring-up's
//!   timeout.
//! - [`agree_retrying`] and [`announce_retrying`]: a step whose failure, on
//!   any rank, carries only retryable codes (`Code::is_retryable`:
//!   `FABRIC_NOT_READY` 919, `SYSTEM_NOT_READY` 802, …) is retried by every
//!   rank together after the back-off. The decision is taken from the
//!   outcomes every rank got from the same exchange and from the attempt
//!   count, never from a clock, so every rank decides alike: all retry, or
//!   all stop (a failing rank reports its own failure, every other rank
//!   the lowest failing rank's, as the agreement steps do). A rank that succeeded keeps its
//!   result and sends it again; only the ranks that failed redo the step.
//!   Every attempt is a `tracing` event (target `cuda_endpoints::team`).

use std::time::Duration;

use crate::bootstrap::{Bootstrap, Deadline};
use crate::driver::Code;

use super::agree::{agree_all, announce};
use super::error::{Cause, Step, TeamError};

/// How a bring-up retries a step that failed with a retryable code on some
/// rank: at most `attempts` attempts per step, `backoff` before the second,
/// doubled before each next (at most 1 s). The attempts are cut, the same
/// way on every rank, to those whose back-offs fit in half the bring-up's
/// timeout, so a retried bring-up still ends within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    attempts: u32,
    backoff: Duration,
}

impl Default for Retry {
    /// 5 attempts, 50 ms back-off first.
    fn default() -> Retry {
        Retry::new(5, Duration::from_millis(50))
    }
}

impl Retry {
    /// The longest back-off between two attempts.
    pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

    /// At most `attempts` attempts per step (0 counts as 1), `backoff`
    /// before the second.
    pub fn new(attempts: u32, backoff: Duration) -> Retry {
        Retry {
            attempts: attempts.max(1),
            backoff,
        }
    }

    /// One attempt: a retryable failure fails the bring-up like any other.
    pub fn none() -> Retry {
        Retry::new(1, Duration::ZERO)
    }

    /// Attempts per step.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The back-off after attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self
            .backoff
            .checked_mul(
                1u32.checked_shl(attempt.saturating_sub(1))
                    .unwrap_or(u32::MAX),
            )
            .unwrap_or(Retry::MAX_BACKOFF);
        doubled.min(Retry::MAX_BACKOFF)
    }

    /// The attempts that fit in `timeout`: their back-offs add up to at
    /// most half of it. The same on every rank that passed the same spec.
    pub fn within(&self, timeout: Duration) -> Retry {
        let budget = timeout / 2;
        let mut spent = Duration::ZERO;
        let mut attempts = 1;
        while attempts < self.attempts {
            spent = spent.saturating_add(self.backoff(attempts));
            if spent > budget {
                break;
            }
            attempts += 1;
        }
        Retry {
            attempts,
            backoff: self.backoff,
        }
    }
}

/// Whether every failure among `outcomes` carries a retryable code.
fn all_retryable<'a>(failures: impl IntoIterator<Item = &'a TeamError>) -> bool {
    failures
        .into_iter()
        .all(|e| e.code().is_some_and(Code::is_retryable))
}

/// [`agree`](super::agree::agree) for a step that may be retried: `op`
/// runs this rank's part (again only while it has not succeeded), every
/// rank gets every outcome, and all retry together while every failure is
/// retryable and attempts remain. The verdict is this rank's own failure,
/// else the lowest failing rank's, as [`agree`](super::agree::agree) gives.
pub(crate) fn agree_retrying(
    boot: &dyn Bootstrap,
    tag: u64,
    step: Step,
    retry: Retry,
    deadline: Deadline,
    mut op: impl FnMut() -> Result<Vec<u8>, (Step, Cause)>,
) -> Result<Vec<Vec<u8>>, TeamError> {
    let mut done: Option<Vec<u8>> = None;
    let mut attempt = 1u32;
    loop {
        let mine = match &done {
            Some(p) => Ok(p.clone()),
            None => op(),
        };
        if let Ok(p) = &mine {
            done = Some(p.clone());
        }
        let outcomes = agree_all(boot, tag, step, mine, deadline)?;
        let failures: Vec<&TeamError> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        if failures.is_empty() {
            return outcomes.into_iter().collect();
        }
        let again = attempt < retry.attempts() && all_retryable(failures.iter().copied());
        let ranks: Vec<usize> = failures.iter().map(|e| e.rank).collect();
        tracing::warn!(
            target: "cuda_endpoints::team",
            step = %step,
            attempt,
            of = retry.attempts(),
            failed = ?ranks,
            code = ?failures.first().and_then(|e| e.code()),
            retry = again,
            "bring-up step failed on some rank"
        );
        if !again {
            return Err(first_failure(outcomes, step, boot.rank()));
        }
        std::thread::sleep(retry.backoff(attempt).min(deadline.remaining()));
        attempt += 1;
    }
}

/// [`announce`](super::agree::announce) for a step only `root` does, retried
/// by every rank together while the root's failure is retryable.
pub(crate) fn announce_retrying(
    boot: &dyn Bootstrap,
    tag: u64,
    root: usize,
    step: Step,
    retry: Retry,
    deadline: Deadline,
    mut op: impl FnMut() -> Option<Result<Vec<u8>, (Step, Cause)>>,
) -> Result<Vec<u8>, TeamError> {
    let mut attempt = 1u32;
    loop {
        let outcome = announce(boot, tag, root, step, op(), deadline);
        let e = match outcome {
            Ok(p) => return Ok(p),
            // A bootstrap failure is not the root's to retry.
            Err(e) if matches!(e.cause, Cause::Bootstrap(_)) => return Err(e),
            Err(e) => e,
        };
        let again = attempt < retry.attempts() && all_retryable([&e]);
        tracing::warn!(
            target: "cuda_endpoints::team",
            step = %step,
            attempt,
            of = retry.attempts(),
            failed = ?[e.rank],
            code = ?e.code(),
            retry = again,
            "bring-up step failed on the root"
        );
        if !again {
            return Err(e);
        }
        std::thread::sleep(retry.backoff(attempt).min(deadline.remaining()));
        attempt += 1;
    }
}

/// As [`agree`](super::agree::agree) decides: this rank's own failure, in
/// full, else the lowest failing rank's (the same on every rank that did
/// not fail).
fn first_failure(outcomes: Vec<Result<Vec<u8>, TeamError>>, step: Step, me: usize) -> TeamError {
    let mut outcomes = outcomes;
    if matches!(outcomes.get(me), Some(Err(_))) {
        outcomes.swap(0, me);
    }
    outcomes
        .into_iter()
        .find_map(Result::err)
        .unwrap_or_else(|| {
            TeamError::new(
                0,
                step,
                Cause::BadMessage {
                    reason: "no failure to report",
                },
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_offs_double_cap_at_a_second_and_attempts_fit_in_half_the_timeout() {
        let r = Retry::new(10, Duration::from_millis(100));
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(3), Duration::from_millis(400));
        assert_eq!(r.backoff(9), Retry::MAX_BACKOFF);
        assert_eq!(r.backoff(u32::MAX), Retry::MAX_BACKOFF);
        // 100 + 200 + 400 = 700 ms fit in 1 s; + 800 does not.
        assert_eq!(r.within(Duration::from_secs(2)).attempts(), 4);
        assert_eq!(r.within(Duration::ZERO).attempts(), 1);
        assert_eq!(Retry::new(0, Duration::ZERO).attempts(), 1);
    }
}

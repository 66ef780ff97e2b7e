//! Readiness (rule R3): non-blocking [`Endpoint::poll`], bounded
//! [`Endpoint::wait`], and [`wait_all`], which makes many endpoints ready
//! with one `cuLogicalEndpointQuery` per contiguous run of ids (R3.5).
//!
//! Waiting polls at least once, even with a zero timeout, then backs off:
//! spin (one hint per poll), then yield, then sleep a quarter of the time
//! waited so far (at least 10 µs, at most 1 ms). The clock starts when a
//! query first answers "not ready", so an endpoint ready at its first query
//! costs no clock read. When a poll is a single query (`wait`, `wait_all`
//! of one run of ids), the clock starts only at the fourth poll that
//! answers "not ready": a clock read costs more than the query, and an
//! endpoint the driver is finishing is often ready by then. The bound,
//! exactly: the wait returns at the end of the first poll that ends after
//! `timeout` has passed on that clock (a pause never sleeps past it), so it
//! overruns `timeout` by at most one poll, plus the queries of the first
//! poll that answered "ready" before the clock started, plus, for a
//! single-query wait, the three polls before it started (three queries,
//! none of which blocks, R3). A zero timeout polls exactly once. The
//! pending endpoints come back with the error, whose `waited` is the time
//! on that clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::{Call, DriverResult};
use crate::endpoint::{Endpoint, Readiness};
use crate::error::{Error, Failed, Failure, Result};
use crate::kind::{Kind, TeamIsComplete};
use crate::ledger::RangeInner;
use crate::state::{CanQuery, Pending, Ready, State};

/// The back-off between polls. Its clock starts at the first query that
/// answers "not ready" ([`Backoff::not_ready`]), so an endpoint ready at
/// its first query costs no clock read.
struct Backoff {
    start: Option<Instant>,
    polls: u64,
    /// Each poll is one query: the clock waits for the fourth poll.
    single: bool,
}

/// Polls of a single-query wait made before its clock starts.
const UNTIMED_POLLS: u64 = 3;

impl Backoff {
    /// The back-off of a wait whose polls make `queries` queries each.
    fn new(queries: usize) -> Backoff {
        Backoff {
            start: None,
            polls: 0,
            single: queries == 1,
        }
    }

    /// A query answered "not ready": the clock starts, if it has not (a
    /// single-query wait: from its fourth poll on).
    #[inline]
    fn not_ready(&mut self) {
        if self.start.is_none() && !(self.single && self.polls <= UNTIMED_POLLS) {
            self.start = Some(Instant::now());
        }
    }

    /// Time since the clock started.
    fn waited(&self) -> Duration {
        self.start.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Waits a little before the next poll; `false` once `timeout` is spent
    /// (a zero timeout: after the one poll).
    fn pause(&mut self, timeout: Duration) -> bool {
        if self.start.is_none() {
            // Not timed yet (a single-query wait's first polls): one spin
            // hint, as a hand-written poll loop; a zero timeout stops here.
            if timeout.is_zero() {
                return false;
            }
            std::hint::spin_loop();
            return true;
        }
        let waited = self.waited();
        if waited >= timeout {
            return false;
        }
        match self.polls {
            // One spin hint per poll, as a hand-written poll loop makes: more
            // (this was 2, 4, 8 … 64) only delays an endpoint that is about
            // to be ready, by about 40 ns per hint, and the phase is short.
            0..16 => std::hint::spin_loop(),
            16..32 => std::thread::yield_now(),
            _ => {
                let nap = (waited / 4).clamp(Duration::from_micros(10), Duration::from_millis(1));
                // `waited < timeout` above: no underflow.
                std::thread::sleep(nap.min(timeout - waited));
            }
        }
        true
    }
}

/// One query over `[base, base+count)` of `range`.
#[inline]
fn query(range: &RangeInner, base: u32, count: u32) -> Result<bool> {
    let ctx = &range.ctx;
    ctx.check(Call::Query, ctx.queries().query(base, count))
}

impl<S: State, K: Kind> Endpoint<S, K> {
    /// Asks once, without blocking, whether construction finished
    /// (`cuLogicalEndpointQuery`, R3) and returns the endpoint in the state it
    /// is in. For a compile-time team, only once every device is enrolled
    /// (R3.2).
    ///
    /// # Errors
    /// [`Error::Driver`] from the query (R4.5: a clique error can surface
    /// here); the endpoint comes back pending.
    #[inline]
    pub fn poll(self) -> Result<Readiness<K>, Failed<Self>>
    where
        S: CanQuery,
        K::Complete: TeamIsComplete,
    {
        match query(self.range(), self.id(), 1) {
            Ok(true) => Ok(Readiness::Ready(self.cast())),
            Ok(false) => Ok(Readiness::Pending(self.cast())),
            Err(error) => Err(Failure::new(error, self)),
        }
    }

    /// Polls until construction finished or `timeout` passed (R3). Polls at
    /// least once, even for a zero timeout; backs off instead of burning a
    /// core; returns at most one poll after `timeout`, counted from the
    /// first query that answered "not ready" (see the module doc).
    ///
    /// # Errors
    /// [`Error::Timeout`] (with the number of queries made) or [`Error::Driver`];
    /// the endpoint comes back pending either way.
    #[inline]
    pub fn wait(self, timeout: Duration) -> Result<Endpoint<Ready, K::Ready>, Failed<Self>>
    where
        S: CanQuery,
        K::Complete: TeamIsComplete,
    {
        // The first query inline: an endpoint ready at once costs the call
        // and the state change; waiting (and any error) is out of line.
        let ctx = self.context();
        match ctx.queries().query(self.id(), 1) {
            Ok(true) => Ok(self.cast()),
            first => self.wait_more(timeout, first),
        }
    }

    /// [`Endpoint::wait`] after a first query that did not report the
    /// endpoint ready.
    #[cold]
    #[inline(never)]
    fn wait_more(
        self,
        timeout: Duration,
        first: crate::driver::DriverResult<bool>,
    ) -> Result<Endpoint<Ready, K::Ready>, Failed<Self>>
    where
        S: CanQuery,
        K::Complete: TeamIsComplete,
    {
        let mut backoff = Backoff::new(1);
        backoff.polls = 1;
        let mut answer = self.context().check(Call::Query, first);
        loop {
            match answer {
                Ok(true) => return Ok(self.cast()),
                Ok(false) => backoff.not_ready(),
                Err(error) => return Err(Failure::new(error, self)),
            }
            if !backoff.pause(timeout) {
                let error = Error::Timeout {
                    id: self.id(),
                    waited: backoff.waited(),
                    polls: backoff.polls,
                    multicast: K::MULTICAST,
                };
                return Err(Failure::new(error, self));
            }
            backoff.polls += 1;
            answer = query(self.range(), self.id(), 1);
        }
    }
}

/// Pending endpoints handed back by a failed [`wait_all`].
pub type PendingList<K> = Vec<Endpoint<Pending, K>>;

/// Endpoints made ready by [`wait_all`].
pub type ReadyList<K> = Vec<Endpoint<Ready, <K as Kind>::Ready>>;

/// Waits for many pending endpoints at once with one query per contiguous run
/// of ids from the same range (R3.5): a range of `n` endpoints costs one
/// `cuLogicalEndpointQuery` per poll, not `n`. Same back-off and timeout rules
/// as [`Endpoint::wait`]. The endpoints come back in the order given.
///
/// All endpoints share one kind `K` (the result is a `Vec` of one type):
/// wait for endpoints of different kinds with one call per kind.
///
/// # Errors
/// [`Error::Timeout`] or [`Error::Driver`], with every endpoint handed back
/// pending.
#[inline]
pub fn wait_all<K: Kind>(
    endpoints: Vec<Endpoint<Pending, K>>,
    timeout: Duration,
) -> Result<ReadyList<K>, Failed<PendingList<K>>>
where
    K::Complete: TeamIsComplete,
{
    if let [ep] = endpoints.as_slice() {
        // One endpoint: its one query, without sorting or a list of runs;
        // ready at once, inline, as `Endpoint::wait`.
        let first = ep.context().queries().query(ep.id(), 1);
        if let Ok(true) = first {
            return Ok(Endpoint::cast_vec(endpoints));
        }
        return wait_all_one_more(endpoints, timeout, first);
    }
    wait_all_runs(endpoints, timeout)
}

/// [`wait_all`] of one endpoint after a first query that did not report it
/// ready.
#[cold]
#[inline(never)]
fn wait_all_one_more<K: Kind>(
    endpoints: Vec<Endpoint<Pending, K>>,
    timeout: Duration,
    first: DriverResult<bool>,
) -> Result<ReadyList<K>, Failed<PendingList<K>>> {
    let r = match endpoints.first() {
        Some(ep) => wait_ids_after(ep.range(), ep.id(), 1, timeout, first),
        None => Ok(()),
    };
    match r {
        Ok(()) => Ok(Endpoint::cast_vec(endpoints)),
        Err(error) => Err(Failure::new(error, endpoints)),
    }
}

/// [`wait_all`] of several endpoints: one query per run of ids.
fn wait_all_runs<K: Kind>(
    endpoints: Vec<Endpoint<Pending, K>>,
    timeout: Duration,
) -> Result<ReadyList<K>, Failed<PendingList<K>>> {
    // Runs of consecutive ids within one range. In the order given when it
    // is sorted already (a range split by `into_endpoints`, in id order): one
    // pass, no index of the endpoints, so waiting for a range costs a few
    // instructions and no heap per endpoint. Else through a sorted index.
    let mut runs = match runs_in_order(&endpoints) {
        Some(runs) => runs,
        None => {
            let key = |ep: &Endpoint<Pending, K>| (Arc::as_ptr(ep.range()) as usize, ep.id());
            let mut order: Vec<usize> = (0..endpoints.len()).collect();
            order.sort_by_key(|&i| key(&endpoints[i]));
            runs_of(order.iter().map(|&i| &endpoints[i]))
        }
    };
    let mut backoff = Backoff::new(runs.len());
    let outcome = loop {
        backoff.polls += 1;
        let mut all = true;
        let mut failed = None;
        for (range, base, count, done) in runs.iter_mut().filter(|r| !r.3) {
            match query(range, *base, *count) {
                Ok(true) => *done = true,
                Ok(false) => {
                    all = false;
                    backoff.not_ready();
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            break Err(e);
        }
        if all {
            break Ok(());
        }
        if !backoff.pause(timeout) {
            break Err(Error::Timeout {
                id: runs.first().map_or(0, |r| r.1),
                waited: backoff.waited(),
                polls: backoff.polls,
                multicast: K::MULTICAST,
            });
        }
    };
    drop(runs);
    match outcome {
        Ok(()) => Ok(Endpoint::cast_vec(endpoints)),
        Err(error) => Err(Failure::new(error, endpoints)),
    }
}

/// A run of consecutive ids of one range: (range, base, count, done).
type Run<'a> = (&'a RangeInner, u32, u32, bool);

/// The runs of `endpoints` in the order given, or `None` when they are not
/// sorted by range and id (a run would then be split).
fn runs_in_order<S: State, K: Kind>(endpoints: &[Endpoint<S, K>]) -> Option<Vec<Run<'_>>> {
    let mut runs = Vec::new();
    let Some((first, rest)) = endpoints.split_first() else {
        return Some(runs);
    };
    // `id + 1` cannot overflow: every id is below its range's `base +
    // count`, which fits in a `u32` (checked when the range was reserved).
    let (mut range, mut base, mut next) = (&**first.range(), first.id(), first.id() + 1);
    for ep in rest {
        let (r, id) = (&**ep.range(), ep.id());
        if std::ptr::eq(r, range) && id == next {
            next += 1;
            continue;
        }
        // A new run: only after the last one in (range, id) order.
        if (std::ptr::from_ref(r).addr(), id) < (std::ptr::from_ref(range).addr(), next) {
            return None;
        }
        runs.push((range, base, next - base, false));
        (range, base, next) = (r, id, id + 1);
    }
    runs.push((range, base, next - base, false));
    Some(runs)
}

/// The runs of consecutive ids within one range of `endpoints` (sorted by
/// range, then id).
fn runs_of<'a, S: State + 'a, K: Kind + 'a>(
    endpoints: impl Iterator<Item = &'a Endpoint<S, K>>,
) -> Vec<Run<'a>> {
    let mut runs: Vec<Run<'a>> = Vec::new();
    for ep in endpoints {
        let (r, id) = (&**ep.range(), ep.id());
        match runs.last_mut() {
            Some((rr, base, count, _)) if std::ptr::eq(*rr, r) && *base + *count == id => {
                *count += 1
            }
            _ => runs.push((r, id, 1, false)),
        }
    }
    runs
}

/// Waits until one query over `[base, base+count)` of `range` reports every
/// endpoint there constructed (R3.5), with the back-off of [`Endpoint::wait`].
#[inline]
pub(crate) fn wait_ids(range: &RangeInner, base: u32, count: u32, timeout: Duration) -> Result<()> {
    let first = range.ctx.queries().query(base, count);
    wait_ids_after(range, base, count, timeout, first)
}

/// [`wait_ids`] from the answer of its first query.
#[inline]
fn wait_ids_after(
    range: &RangeInner,
    base: u32,
    count: u32,
    timeout: Duration,
    first: DriverResult<bool>,
) -> Result<()> {
    let mut backoff = Backoff::new(1);
    let mut answer = range.ctx.check(Call::Query, first);
    loop {
        backoff.polls += 1;
        if answer? {
            return Ok(());
        }
        backoff.not_ready();
        if !backoff.pause(timeout) {
            // Only unicast peers' ranges are waited on by id.
            return Err(Error::Timeout {
                id: base,
                waited: backoff.waited(),
                polls: backoff.polls,
                multicast: false,
            });
        }
        answer = query(range, base, count);
    }
}

//! Issue 13: "readiness of 1 … 100 000 endpoints in one range with one query
//! per contiguous run per poll round" (R3.5). A backend over the model logs
//! every `cuLogicalEndpointQuery` (base, count); the model answers "not yet"
//! to the first two queries of an endpoint, so a wait takes three poll rounds.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_endpoints::driver::{Driver, DriverResult, Forward};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Context, Endpoint, Pending, Readiness, Spec, Unicast, wait_all};

const SIZE: u64 = 2 << 20;
const ROUNDS: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The model, with every query logged.
#[derive(Debug)]
struct CountQueries {
    model: Model,
    log: Arc<Mutex<Vec<(u32, u32)>>>,
}

impl Forward for CountQueries {
    type Inner = Model;
    fn inner(&self) -> &Model {
        &self.model
    }
    unsafe fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        self.log.lock().unwrap().push((base, count));
        // SAFETY: the caller's contract is the inner driver's.
        unsafe { Driver::query(&self.model, base, count) }
    }
}

struct World {
    ctx: Context,
    model: Model,
    log: Arc<Mutex<Vec<(u32, u32)>>>,
}

fn world() -> World {
    let mut config = ModelConfig::default().queries_to_ready(ROUNDS as u32 - 1);
    config.max_ids = 1 << 17;
    let model = Model::new(config);
    let log = Arc::new(Mutex::new(Vec::new()));
    let ctx = Context::new(CountQueries {
        model: model.clone(),
        log: log.clone(),
    });
    World { ctx, model, log }
}

impl World {
    /// `n` pending unicast endpoints of one range, in id order.
    fn pending(&self, n: u32) -> Vec<Endpoint<Pending, Unicast>> {
        let range = self.ctx.reserve(n).expect("reserve");
        range
            .into_endpoints()
            .into_iter()
            .map(|ep| ep.create(Spec::unicast(0, SIZE)).expect("create"))
            .collect()
    }

    /// The queries made since the last call.
    fn queries(&self) -> Vec<(u32, u32)> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// The ids of `eps`, in order.
macro_rules! ids {
    ($eps:expr) => {
        $eps.iter().map(|ep| ep.id()).collect::<Vec<u32>>()
    };
}

#[test]
fn readiness_of_1_to_100_000_endpoints_in_one_range_takes_one_query_per_contiguous_run_per_poll_round()
 {
    let w = world();
    for n in [1, 2, 10, 1_000, 100_000] {
        let eps = w.pending(n);
        let base = eps[0].id();
        let want = ids!(eps);
        w.queries();
        let ready = wait_all(eps, TIMEOUT).expect("wait_all");
        assert_eq!(ids!(ready), want, "n = {n}: in the order given");
        assert_eq!(
            w.queries(),
            vec![(base, n); ROUNDS],
            "n = {n}: one query of the whole range per poll round"
        );
        for ep in ready {
            ep.destroy().expect("destroy");
        }
    }
    common::clean(&w.ctx, &w.model);
}

#[test]
fn a_range_given_in_any_order_is_still_one_run() {
    let w = world();
    let mut eps = w.pending(1_000);
    let base = eps[0].id();
    eps.reverse();
    eps.swap(10, 500);
    let want = ids!(eps);
    w.queries();
    let ready = wait_all(eps, TIMEOUT).expect("wait_all");
    assert_eq!(ids!(ready), want, "in the order given");
    assert_eq!(w.queries(), vec![(base, 1_000); ROUNDS]);
    drop(ready);
    common::clean(&w.ctx, &w.model);
}

#[test]
fn each_contiguous_run_is_one_query_per_poll_round_gaps_and_ranges_apart() {
    let w = world();
    // One range with a gap at index 4, and a second range, interleaved.
    let mut a = w.pending(10);
    let b = w.pending(5);
    let (a0, b0) = (a[0].id(), b[0].id());
    let gap = a.remove(4);
    let mut eps = Vec::new();
    let mut b = b.into_iter();
    for ep in a {
        eps.push(ep);
        eps.extend(b.next());
    }
    w.queries();
    let ready = wait_all(eps, TIMEOUT).expect("wait_all");
    let got = w.queries();
    assert_eq!(got.len(), 3 * ROUNDS, "three runs, each once per round");
    for round in got.chunks(3) {
        let mut round = round.to_vec();
        round.sort();
        let mut want = vec![(a0, 4), (a0 + 5, 5), (b0, 5)];
        want.sort();
        assert_eq!(round, want, "every run once in each poll round");
    }
    drop(ready);
    drop(gap);
    common::clean(&w.ctx, &w.model);
}

#[test]
fn a_run_found_ready_is_not_queried_again() {
    let w = world();
    // Range `a` polled twice beforehand: ready at the next query.
    let a = w
        .pending(8)
        .into_iter()
        .map(|ep| {
            let mut ep = ep;
            for _ in 0..ROUNDS - 1 {
                ep = match ep.poll().expect("poll") {
                    Readiness::Pending(ep) => ep,
                    Readiness::Ready(_) => panic!("ready too early"),
                };
            }
            ep
        })
        .collect::<Vec<_>>();
    let b = w.pending(8);
    let (a0, b0) = (a[0].id(), b[0].id());
    w.queries();
    let ready = wait_all(a.into_iter().chain(b).collect(), TIMEOUT).expect("wait_all");
    // Runs of different ranges are queried in the order of the ranges'
    // addresses (`wait_all_runs`), which the heap picks: round 1 as a set.
    let mut got = w.queries();
    let first = got.len().min(2);
    got[..first].sort();
    let mut want = vec![(a0, 8), (b0, 8)];
    want.sort();
    want.extend([(b0, 8); ROUNDS - 1]);
    assert_eq!(got, want, "round 1: both runs; then only the pending one");
    drop(ready);
    common::clean(&w.ctx, &w.model);
}

#[test]
fn a_gap_in_one_range_in_id_order_makes_two_runs() {
    let w = world();
    let mut eps = w.pending(10);
    let base = eps[0].id();
    let gap = eps.remove(4);
    w.queries();
    let ready = wait_all(eps, TIMEOUT).expect("wait_all");
    let mut want = Vec::new();
    for _ in 0..ROUNDS {
        want.extend([(base, 4), (base + 5, 5)]);
    }
    assert_eq!(w.queries(), want, "two runs, each once per poll round");
    drop((ready, gap));
    common::clean(&w.ctx, &w.model);
}

/// The wait's bound (module doc of `ready`), in what no load can change: a
/// wait for 50 000 gapped, never-ready endpoints (25 000 queries a poll)
/// never ends before its timeout on its own clock, reports no more time
/// than passed and exactly the polls it made (each poll as many queries),
/// and a zero timeout polls once. How far it overruns in time
/// depends on the machine's load: no assertion here (issue 21, item 13).
#[test]
fn a_wait_never_ends_before_its_timeout_and_reports_its_polls_and_the_time_waited() {
    use cuda_endpoints::{Error, SpreadTeam};
    use std::time::Instant;
    let mut config = ModelConfig::node(2);
    config.max_ids = 1 << 17;
    let model = Model::new(config);
    let ctx = Context::new(model.clone());
    // Spread teams of two with one device here: never ready.
    let mut eps: Vec<Endpoint<Pending, SpreadTeam>> = ctx
        .reserve(100_000)
        .unwrap()
        .into_endpoints()
        .into_iter()
        .map(|ep| {
            ep.create(Spec::spread(2, SIZE))
                .unwrap()
                .add_device(0)
                .unwrap()
        })
        .step_by(2)
        .collect();
    use cuda_endpoints::driver::Call;
    // A zero timeout polls once.
    let before = model.calls(Call::Query);
    let f = wait_all(eps, Duration::ZERO).unwrap_err();
    let Error::Timeout { polls, .. } = f.error else {
        panic!("{}", f.error);
    };
    eps = f.value;
    assert_eq!(polls, 1);
    // What one poll queries (one query per run of ids).
    let per_poll = model.calls(Call::Query) - before;
    assert!(per_poll > 0);
    for timeout in [Duration::from_millis(1), Duration::from_millis(20)] {
        let before = model.calls(Call::Query);
        let t0 = Instant::now();
        let f = wait_all(eps, timeout).unwrap_err();
        let elapsed = t0.elapsed();
        let Error::Timeout { waited, polls, .. } = f.error else {
            panic!("{}", f.error);
        };
        eps = f.value;
        // Order facts, true at any load: never early, never more than passed.
        assert!(waited >= timeout, "{waited:?} < {timeout:?}");
        assert!(waited <= elapsed, "{waited:?} > {elapsed:?}");
        // Every poll it reports it made, each as many queries as the first.
        assert!(polls >= 1, "{polls}");
        assert_eq!(model.calls(Call::Query) - before, polls * per_poll);
    }
    drop(eps);
    common::clean(&ctx, &model);
}

/// A wait whose polls are one query each (`wait`, `wait_all` of one run)
/// starts its clock at its fourth poll, not its first (a clock read costs
/// more than the query): a zero timeout still polls exactly once, and a
/// timeout that has passed by the time the clock starts ends the wait at
/// that poll — four queries, none blocking.
#[test]
fn a_single_query_wait_starts_its_clock_at_the_fourth_poll_and_a_zero_timeout_polls_once() {
    use cuda_endpoints::{Error, SpreadTeam};
    let model = Model::new(ModelConfig::node(2));
    let ctx = Context::new(model.clone());
    // A spread team of two with one device here: never ready.
    let mut ep: Endpoint<Pending, SpreadTeam> = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, SIZE))
        .unwrap()
        .add_device(0)
        .unwrap();
    for (timeout, least, most) in [(Duration::ZERO, 1, 1), (Duration::from_nanos(1), 4, 6)] {
        let t0 = std::time::Instant::now();
        let f = ep.wait(timeout).unwrap_err();
        let elapsed = t0.elapsed();
        let Error::Timeout { polls, waited, .. } = f.error else {
            panic!("{}", f.error);
        };
        assert!(
            (least..=most).contains(&polls),
            "{timeout:?}: {polls} polls"
        );
        // An order fact, true at any load (issue 21, item 13): the clock
        // starts inside the call, so it reports no more than passed.
        assert!(waited <= elapsed, "{waited:?} > {elapsed:?}");
        ep = f.value;
    }
    drop(ep);
    common::clean(&ctx, &model);
}

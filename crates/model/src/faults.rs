//! Fault injection: make any driver call fail with a chosen code, at the n-th
//! matching call, for a run of calls, always, or at random with a seed (contract
//! R11, R5.10, R4.5).
//!
//! A plan is installed with [`crate::Model::set_faults`]; faults fire
//! before any rule is checked, so a faulted call changes nothing in the
//! model. Every fault that fires is counted per call and logged (the last
//! [`HISTORY`] of them), so a test can check that each one surfaced as an
//! error naming that call.
//!
//! ```
//! use cuda_endpoints::model::faults::{self, Fault, FaultPlan};
//! use cuda_endpoints::driver::{Call, Code};
//! // The 2nd bind fails once with OUT_OF_MEMORY; every unbind fails; and 5 %
//! // of the other non-teardown calls fail with a code the contract allows them.
//! let plan = FaultPlan::none()
//!     .with(Fault::nth(Call::BindMem, 2, Code::OUT_OF_MEMORY))
//!     .with(Fault::always(Call::Unbind, Code::NOT_PERMITTED))
//!     .random_except(7, 50, faults::TEARDOWN);
//! # let _ = plan;
//! ```

use std::collections::{BTreeMap, VecDeque};

use crate::driver::{Call, Code};

/// How many fired faults [`FaultPlan::history`] keeps (the most recent).
pub const HISTORY: usize = 256;

/// The calls that run on teardown paths (`Drop`, `unbind`, `destroy`,
/// `release`). A failure there cannot always be returned: the typed API
/// records it (`cuda_endpoints::Context::take_teardown_errors`) and keeps the
/// resource alive (leaks it) rather than free memory that may still be bound.
pub const TEARDOWN: &[Call] = &[
    Call::Unbind,
    Call::Destroy,
    Call::IdRelease,
    Call::MemRelease,
    Call::MemUnmap,
    Call::MemAddressFree,
    Call::MulticastUnbind,
];

/// Whether `call` is one of [`TEARDOWN`].
pub fn is_teardown(call: Call) -> bool {
    TEARDOWN.contains(&call)
}

/// One planned failure: matching calls number `nth .. nth + times` (1-based,
/// counted from installation) fail with `code`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Fault {
    /// The entry point it applies to; `None` for any call.
    pub call: Option<Call>,
    /// The first matching call that fails (1-based), counted from installation.
    pub nth: u64,
    /// The code returned.
    pub code: Code,
    /// How many matching calls fail, from the `nth` on (`u64::MAX`: all).
    times: u64,
    /// The one process (`Model::pid`) whose calls match; `None`: any.
    #[cfg_attr(feature = "serde", serde(default))]
    process: Option<usize>,
    /// How many matching calls have been seen.
    seen: u64,
    /// How many times this fault fired.
    fired: u64,
}

impl Fault {
    /// Fail the `nth` (1-based) call to `call` with `code`, once.
    pub fn nth(call: Call, nth: u64, code: Code) -> Fault {
        Fault {
            call: Some(call),
            nth: nth.max(1),
            code,
            times: 1,
            process: None,
            seen: 0,
            fired: 0,
        }
    }

    /// Fail the `nth` (1-based) driver call of any kind with `code`, once.
    pub fn nth_any(nth: u64, code: Code) -> Fault {
        Fault {
            call: None,
            ..Fault::nth(Call::DriverGetVersion, nth, code)
        }
    }

    /// Fail every call to `call` with `code`, until the plan is replaced.
    pub fn always(call: Call, code: Code) -> Fault {
        Fault::nth(call, 1, code).times(u64::MAX)
    }

    /// Fail `times` matching calls in a row, starting at the `nth`
    /// (`u64::MAX`: every one from the `nth` on).
    pub fn times(mut self, times: u64) -> Fault {
        self.times = times;
        self
    }

    /// Only calls from process `pid` of the model ([`crate::Model::pid`])
    /// match (and count towards `nth`): a fault on one rank of a job whose
    /// ranks are processes of one model (a transient `FABRIC_NOT_READY` on
    /// one rank, say).
    pub fn on_process(mut self, pid: usize) -> Fault {
        self.process = Some(pid);
        self
    }

    /// How many times this fault fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// Whether this fault hits this `call` from process `pid` now (and
    /// counts it).
    fn hit(&mut self, call: Call, pid: usize) -> bool {
        if self.call.is_some_and(|c| c != call)
            || self.process.is_some_and(|p| p != pid)
            || self.fired >= self.times
        {
            return false;
        }
        // Checked: a plan may come over the wire with any counts (a fabric
        // client's `SetFaults`); a count at its end stays there.
        self.seen = self.seen.saturating_add(1);
        if self.seen >= self.nth {
            self.fired = self.fired.saturating_add(1);
            true
        } else {
            false
        }
    }
}

/// The codes the contract allows for `call`, beyond its rule errors (R11, R5.10,
/// R4.5): what random faults draw from.
pub fn allowed_codes(call: Call) -> &'static [Code] {
    const ALWAYS: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
    ];
    const WITH_OOM: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::OUT_OF_MEMORY,
    ];
    const BIND: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::OUT_OF_MEMORY,
        Code::SYSTEM_NOT_READY,
        Code::ILLEGAL_STATE,
    ];
    const ADD: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::INVALID_DEVICE,
    ];
    match call {
        Call::BindMem | Call::BindAddr => BIND,
        Call::AddDevice => ADD,
        Call::Create
        | Call::IdReserve
        | Call::IdRelease
        | Call::Unbind
        | Call::Export
        | Call::Import
        | Call::Query
        | Call::GetLimits
        | Call::MemCreate
        | Call::MemMap
        | Call::MemAddressReserve
        | Call::MulticastCreate
        | Call::MulticastBindMem
        | Call::MulticastBindAddr => WITH_OOM,
        _ => ALWAYS,
    }
}

/// Which calls random faults apply to.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Filter {
    /// Only these (all, if empty).
    Only(Vec<Call>),
    /// All but these.
    Except(Vec<Call>),
}

impl Filter {
    fn matches(&self, call: Call) -> bool {
        match self {
            Filter::Only(c) => c.is_empty() || c.contains(&call),
            Filter::Except(c) => !c.contains(&call),
        }
    }
}

/// Random faults: xorshift64 state, probability in 1/65536, which calls.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Random {
    state: u64,
    p: u32,
    filter: Filter,
}

/// The faults in force for one node.
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FaultPlan {
    planned: Vec<Fault>,
    random: Option<Random>,
    fired: u64,
    per_call: BTreeMap<Call, u64>,
    history: VecDeque<(Call, Code)>,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Adds a planned fault. Planned faults are tried in the order added,
    /// before random ones; the first that hits decides the code.
    pub fn with(mut self, fault: Fault) -> FaultPlan {
        self.planned.push(fault);
        self
    }

    /// Fails each call among `calls` (all, if empty) with probability
    /// `per_mille / 1000`, with a code drawn from [`allowed_codes`],
    /// reproducibly from `seed`.
    pub fn random(self, seed: u64, per_mille: u32, calls: &[Call]) -> FaultPlan {
        self.random_with(seed, per_mille, Filter::Only(calls.to_vec()))
    }

    /// Like [`FaultPlan::random`], for every call except `excluded` (e.g.
    /// [`TEARDOWN`], to keep teardown paths fault-free).
    pub fn random_except(self, seed: u64, per_mille: u32, excluded: &[Call]) -> FaultPlan {
        self.random_with(seed, per_mille, Filter::Except(excluded.to_vec()))
    }

    fn random_with(mut self, seed: u64, per_mille: u32, filter: Filter) -> FaultPlan {
        let p = (per_mille.min(1000) as u64 * 65536 / 1000) as u32;
        // Scramble the seed (splitmix64) so that nearby seeds give unrelated
        // streams; xorshift needs a non-zero state.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        self.random = Some(Random {
            state: z | 1,
            p,
            filter,
        });
        self
    }

    /// Whether the plan can fire at all.
    pub fn is_empty(&self) -> bool {
        self.planned.is_empty() && self.random.as_ref().is_none_or(|r| r.p == 0)
    }

    /// How many faults fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// How many faults fired on `call`.
    pub fn fired_for(&self, call: Call) -> u64 {
        self.per_call.get(&call).copied().unwrap_or(0)
    }

    /// The planned faults, with how often each fired.
    pub fn planned(&self) -> &[Fault] {
        &self.planned
    }

    /// The most recent faults that fired (at most [`HISTORY`]), oldest first.
    pub fn history(&self) -> impl ExactSizeIterator<Item = (Call, Code)> + '_ {
        self.history.iter().copied()
    }

    /// The last fault that fired.
    pub fn last(&self) -> Option<(Call, Code)> {
        self.history.back().copied()
    }

    /// The plan as a fabric installs it from a peer's bytes: its history
    /// cut to [`HISTORY`] and its random probability to its range, so that
    /// nothing a peer sends can grow or overflow it later.
    pub(crate) fn bounded(mut self) -> FaultPlan {
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self.history.shrink_to(HISTORY);
        if let Some(r) = &mut self.random {
            r.p = r.p.min(65536);
            r.state |= 1;
        }
        self
    }

    /// Whether `call` fails now, and with which code.
    pub(crate) fn check(&mut self, call: Call, pid: usize) -> Option<Code> {
        let code = self.draw(call, pid)?;
        self.fired = self.fired.saturating_add(1);
        let n = self.per_call.entry(call).or_default();
        *n = n.saturating_add(1);
        // `>=`, not `==`: a plan that arrived with a longer history (over
        // the wire) shrinks to the bound here.
        while self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((call, code));
        Some(code)
    }

    fn draw(&mut self, call: Call, pid: usize) -> Option<Code> {
        // Every planned fault sees the call (so that `nth` counts stay
        // exact), the first hit decides.
        let mut code = None;
        for f in &mut self.planned {
            if f.hit(call, pid) && code.is_none() {
                code = Some(f.code);
            }
        }
        if code.is_some() {
            return code;
        }
        let r = self.random.as_mut()?;
        if !r.filter.matches(call) {
            return None;
        }
        // xorshift64: reproducible, no dependency.
        r.state ^= r.state << 13;
        r.state ^= r.state >> 7;
        r.state ^= r.state << 17;
        if ((r.state >> 16) & 0xffff) < r.p as u64 {
            let codes = allowed_codes(call);
            codes
                .get((r.state >> 40) as usize % codes.len().max(1))
                .copied()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_fires_once_at_the_nth_call() {
        let mut p = FaultPlan::none().with(Fault::nth(Call::Create, 2, Code::OUT_OF_MEMORY));
        assert_eq!(p.check(Call::Create, 0), None);
        assert_eq!(p.check(Call::Query, 0), None);
        assert_eq!(p.check(Call::Create, 0), Some(Code::OUT_OF_MEMORY));
        assert_eq!(p.check(Call::Create, 0), None);
        assert_eq!(p.fired(), 1);
        assert_eq!(p.fired_for(Call::Create), 1);
        assert_eq!(p.last(), Some((Call::Create, Code::OUT_OF_MEMORY)));
    }

    #[test]
    fn always_and_times() {
        let mut p = FaultPlan::none()
            .with(Fault::always(Call::Unbind, Code::NOT_PERMITTED))
            .with(Fault::nth(Call::Query, 2, Code::NOT_INITIALIZED).times(2));
        for _ in 0..5 {
            assert_eq!(p.check(Call::Unbind, 0), Some(Code::NOT_PERMITTED));
        }
        let q: Vec<_> = (0..5).map(|_| p.check(Call::Query, 0)).collect();
        assert_eq!(
            q,
            [
                None,
                Some(Code::NOT_INITIALIZED),
                Some(Code::NOT_INITIALIZED),
                None,
                None
            ]
        );
        assert_eq!(p.fired_for(Call::Unbind), 5);
        assert_eq!(p.planned()[1].fired(), 2);
    }

    #[test]
    fn nth_counts_stay_exact_when_an_earlier_fault_hits() {
        let mut p = FaultPlan::none()
            .with(Fault::always(Call::Create, Code::OUT_OF_MEMORY))
            .with(Fault::nth(Call::Create, 3, Code::NOT_PERMITTED));
        assert_eq!(p.check(Call::Create, 0), Some(Code::OUT_OF_MEMORY));
        assert_eq!(p.check(Call::Create, 0), Some(Code::OUT_OF_MEMORY));
        // The 3rd create is also the 2nd fault's 3rd: it counts as fired.
        assert_eq!(p.check(Call::Create, 0), Some(Code::OUT_OF_MEMORY));
        assert_eq!(p.planned()[1].fired(), 1);
    }

    #[test]
    fn random_is_reproducible_filtered_and_draws_allowed_codes() {
        let run = |seed| {
            let mut p = FaultPlan::none().random_except(seed, 300, TEARDOWN);
            let out: Vec<_> = Call::ALL
                .iter()
                .cycle()
                .take(2000)
                .map(|&c| (c, p.check(c, 0)))
                .collect();
            (out, p.fired())
        };
        let (a, fired) = run(42);
        assert_eq!(a, run(42).0);
        assert_ne!(a, run(43).0);
        assert!(fired > 300 && fired < 900, "{fired}");
        for (c, code) in a {
            if let Some(code) = code {
                assert!(!is_teardown(c));
                assert!(allowed_codes(c).contains(&code));
            }
        }
        let mut only = FaultPlan::none().random(1, 1000, &[Call::Query]);
        assert_eq!(only.check(Call::Create, 0), None);
        assert!(only.check(Call::Query, 0).is_some());
        assert!(FaultPlan::none().random(1, 0, &[]).is_empty());
    }

    #[test]
    fn counts_at_their_end_saturate_instead_of_overflowing() {
        let mut f = Fault::always(Call::Query, Code::NOT_INITIALIZED);
        f.seen = u64::MAX;
        f.fired = u64::MAX - 1;
        let mut p = FaultPlan::none().with(f);
        p.fired = u64::MAX;
        p.per_call.insert(Call::Query, u64::MAX);
        for _ in 0..3 {
            assert!(p.check(Call::Query, 0).is_some() || p.check(Call::Query, 0).is_none());
        }
        assert_eq!(p.fired(), u64::MAX);
        assert_eq!(p.fired_for(Call::Query), u64::MAX);
    }

    #[test]
    fn a_longer_history_from_a_peer_shrinks_to_the_bound() {
        let mut p = FaultPlan::none().with(Fault::always(Call::Query, Code::NOT_INITIALIZED));
        p.history =
            std::iter::repeat_n((Call::Query, Code::NOT_INITIALIZED), HISTORY * 4).collect();
        p.check(Call::Query, 0);
        assert_eq!(p.history().len(), HISTORY);
        assert_eq!(p.bounded().history().len(), HISTORY);
    }

    #[test]
    fn history_is_bounded() {
        let mut p = FaultPlan::none().with(Fault::always(Call::Query, Code::NOT_INITIALIZED));
        for _ in 0..(HISTORY + 10) {
            p.check(Call::Query, 0);
        }
        assert_eq!(p.history().len(), HISTORY);
        assert_eq!(p.fired(), (HISTORY + 10) as u64);
    }

    #[test]
    fn a_fault_on_one_process_fires_on_that_process_only_and_counts_its_calls_alone() {
        let mut p = FaultPlan::none().with(
            Fault::nth(Call::Create, 2, Code::FABRIC_NOT_READY)
                .times(2)
                .on_process(1),
        );
        assert_eq!(p.check(Call::Create, 0), None);
        assert_eq!(p.check(Call::Create, 1), None);
        assert_eq!(p.check(Call::Create, 0), None);
        assert_eq!(p.check(Call::Create, 1), Some(Code::FABRIC_NOT_READY));
        assert_eq!(p.check(Call::Create, 0), None);
        assert_eq!(p.check(Call::Create, 1), Some(Code::FABRIC_NOT_READY));
        assert_eq!(p.check(Call::Create, 1), None);
    }
}

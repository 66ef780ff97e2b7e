//! The memo of a batch's first endpoint's facts, kept by the spare batch
//! state for the next batch ([`Memo`]): what they were made of, and the
//! few of them a batch's first put reads.

use super::EpFacts;
use super::portable::LocalWindow;
use crate::endpoint::Endpoint;
use crate::kind::{ImportedMulticast, ImportedUnicast, Kind};
use crate::state::State;

/// What the facts of the last batch's first endpoint were made of (the
/// facts themselves stay where they are, `eps[0]` of the spare's state):
/// a later batch whose first endpoint has the same inputs takes them as
/// they are, without the range's lock, and without a copy.
///
/// The inputs: the endpoint's range, by its serial (unique in the process:
/// one freed and another made at its address do not match); its id and
/// whether its kind is imported, compared here; the endpoint on that id
/// (its size, bind alignment and devices), its bindings and its agreed
/// top, which every change moves the range's generation away from
/// `generation` (an endpoint made, imported or enrolled on one of its
/// ids, a bind, an unbind, an agreed top:
/// [`crate::ledger::RangeInner::bindings_gen`]).
/// A bind or unbind between the memo's read and the enqueue is caught
/// there as for facts read under the lock (the check at enqueue compares
/// the generation again, inside the copy gate). Plain values: the memo
/// keeps nothing alive.
///
/// Measured (`benches/copy_batch.rs`, `Null`, rustc 1.95): a one-op batch
/// 1,113 instructions without the memo; with it, 1,146 with the facts
/// cloned into the batch (`SmallVec`'s `clone`), 1,096 copied field by
/// field; after round 4's other cuts, 999 copied and 915 left in place.
/// Keyed on the generation for the endpoint, not on its size, alignment
/// and devices too, now that a new endpoint moves it: a one-put batch
/// 485 -> 448, 64 puts 3,003 -> 2,962 (the lifecycle 586 -> 587:
/// `benches/instructions.rs`).
pub(crate) struct Memo {
    serial: u64,
    /// `eps[0]`'s bindings generation.
    pub(super) generation: u64,
    id: u32,
    imported: bool,
    /// `eps[0]`'s first bound interval clipped to its size and agreed top,
    /// and that top: what [`Memo::first_hit`] reads, so that a batch's
    /// deferred first put (`BatchInner::defer`) reads the memo alone, not
    /// the facts in their own allocation (a one-put batch 385 -> 381
    /// instructions on `Null`, portable 523 -> 519, `benches/copy_batch.rs`
    /// and `copy_portable.rs`; after emptied caches, lines of data read and
    /// written 39 -> 37, portable 44 -> 41, `copy_cold.rs` in
    /// `benches/report.sh`'s runs at `c843b04` and `801abf2`).
    window: Option<(u64, u64)>,
    agreed: Option<u64>,
    /// `eps[0]`'s window where a put inside `window` lands on the portable
    /// path (`portable/local.rs`).
    pub(super) local: Option<LocalWindow>,
}

impl Memo {
    /// The memo of `facts`, just read of `ep`; `None` for an endpoint
    /// with nothing bound here (read again each batch).
    pub(super) fn of<S: State, K: Kind>(ep: &Endpoint<S, K>, facts: &EpFacts) -> Option<Memo> {
        // An endpoint bound here only: the one-put lane's (an imported
        // one's facts carry a generation too, for enqueue's check, but its
        // puts take the general path or a route).
        if !facts.bound_here {
            return None;
        }
        let generation = facts.bindings_gen;
        Some(Memo {
            serial: ep.range().serial,
            generation,
            id: ep.id(),
            imported: imported::<K>(),
            window: window(facts),
            agreed: facts.agreed,
            local: facts.local,
        })
    }

    /// Whether [`BatchInner::first_hit_of`](super::BatchInner::first_hit_of)
    /// of `eps[0]` finds the op of `size` bytes at `offset`: inside the
    /// window, and, of 0 bytes, below the agreed top.
    #[inline(always)]
    pub(super) fn first_hit(&self, offset: u64, size: u64) -> Option<()> {
        let (lo, hi) = self.window?;
        let end = offset.checked_add(size)?;
        let at_top = size == 0 && self.agreed.is_some_and(|a| offset >= a);
        (lo <= offset && end <= hi && !at_top).then_some(())
    }

    /// Whether the memo's facts are `ep`'s now.
    // Always: with two callers (`BatchInner::defer`, `endpoint`) it went
    // out of line (a one-put batch 675 -> 660 on
    // `Null`, `benches/copy_batch.rs`).
    #[inline(always)]
    pub(super) fn holds<S: State, K: Kind>(&self, ep: &Endpoint<S, K>) -> bool {
        self.serial == ep.range().serial
            && self.generation == ep.range().bindings_gen()
            && self.id == ep.id()
            && self.imported == imported::<K>()
    }
}

/// Whether `K` is an imported kind, whose devices bind nothing here.
#[inline(always)]
pub(super) fn imported<K: Kind>() -> bool {
    std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedUnicast>()
        || std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedMulticast>()
}

/// `facts`' first bound interval, clipped to the endpoint's size and its
/// agreed top.
fn window(facts: &EpFacts) -> Option<(u64, u64)> {
    facts.covered.first().map(|&(s, e)| {
        let top = facts.agreed.unwrap_or(u64::MAX);
        (s, e.min(facts.ep_size).min(top))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Memo, window};
    use crate::copy::{BatchInner, EpFacts};

    /// An offset or size at an edge that matters, or any.
    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            Just(1),
            0u64..=8,
            (0u64..=4).prop_map(|k| k << 21),
            (0u64..=4).prop_map(|k| (k << 21).wrapping_sub(1)),
            Just(u64::MAX),
            Just(u64::MAX - 1),
            any::<u64>(),
        ]
    }

    /// The facts' numbers: an endpoint's size, its first interval and its
    /// agreed top, each at an edge.
    fn numbers() -> impl Strategy<Value = (u64, Option<(u64, u64)>, Option<u64>)> {
        (
            edge(),
            proptest::option::of((edge(), edge())),
            proptest::option::of(edge()),
        )
    }

    /// An offset or size near one of `near` (one below, at, one above), or
    /// an edge.
    fn near(near: Vec<u64>) -> impl Strategy<Value = u64> {
        prop_oneof![
            (proptest::sample::select(near), -1i64..=1).prop_map(|(n, d)| n.wrapping_add_signed(d)),
            edge(),
        ]
    }

    /// A put of 0 bytes at the agreed top lies inside the window (its end
    /// is the top) and is refused all the same, as the facts refuse it.
    #[test]
    fn a_zero_byte_put_at_the_agreed_top_is_refused_as_by_the_facts() {
        let facts = facts(4 << 21, Some((0, 4 << 21)), Some(2 << 21));
        let memo = memo_of(&facts);
        for (offset, size) in [(2 << 21, 0), ((2 << 21) - 1, 0), ((2 << 21) - 1, 1)] {
            assert_eq!(
                memo.first_hit(offset, size).is_some(),
                BatchInner::first_hit_of(&facts, offset, size).is_some(),
                "{offset} + {size}"
            );
        }
        assert!(memo.first_hit(2 << 21, 0).is_none());
    }

    /// Facts of an endpoint of `ep_size` bytes, bound on `first`, agreed
    /// up to `agreed`.
    fn facts(ep_size: u64, first: Option<(u64, u64)>, agreed: Option<u64>) -> EpFacts {
        EpFacts {
            id: 0,
            ep_size,
            bound_here: true,
            covered: first.into_iter().collect(),
            bindings_gen: 0,
            agreed,
            by_handle: 0,
            align: 1,
            local: None,
        }
    }

    /// The memo of `facts`.
    fn memo_of(facts: &EpFacts) -> Memo {
        Memo {
            serial: 0,
            generation: 0,
            id: 0,
            imported: false,
            window: window(facts),
            agreed: facts.agreed,
            local: None,
        }
    }

    proptest! {
        // 10,000 whatever `PROPTEST_CASES` says, a fixed seed, no files:
        // the edges meet about once in a thousand cases.
        #![proptest_config(ProptestConfig {
            cases: 10_000,
            rng_seed: proptest::test_runner::RngSeed::Fixed(26),
            rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The memo's test of a first put finds what the facts' does
        /// (`BatchInner::first_hit_of`), at every edge: a put the deferred
        /// path takes is one the builder's checks pass.
        #[test]
        fn the_memos_first_hit_is_the_facts(
            ((ep_size, first, agreed), offset, size) in numbers().prop_flat_map(|n| {
                let (ep_size, first, agreed) = n;
                let mut at = vec![ep_size];
                at.extend(first.iter().flat_map(|&(s, e)| [s, e]));
                at.extend(agreed);
                (Just(n), near(at.clone()), prop_oneof![Just(0u64), near(at)])
            }),
        ) {
            let facts = facts(ep_size, first, agreed);
            let memo = memo_of(&facts);
            prop_assert_eq!(
                memo.first_hit(offset, size).is_some(),
                BatchInner::first_hit_of(&facts, offset, size).is_some()
            );
        }
    }
}

//! F3 for a [`CopyBatch`](super::CopyBatch): no op of a batch depends on
//! another (the driver runs them in no particular order).
//!
//! What this file owns: [`dependent`], the first pair of ops one of whose
//! destination overlaps the other's source or destination (a one-pass
//! proof for ops laid out in order, else one sort and one sweep) as the
//! error that names them and their bytes, and the
//! aliases it needs ([`BatchInner::aliases`]): the bytes a local endpoint's
//! bindings reach, when some memory is reached two ways (by address and
//! through an endpoint, or one allocation bound twice).

use smallvec::SmallVec;

use super::BatchInner;
use crate::driver::{CopyOp, MemHint, Operand, Pointer};
use crate::error::{CopyBytes, Error};

/// A local endpoint's bound memory, in the space of its bytes:
/// `(id, endpoint offset, size, space, start)` — space 0 for memory bound
/// by address (`start` its address), an allocation's identity
/// ([`crate::memory::AllocId`], never 0) for one bound by handle (`start`
/// the offset in it). An op through the endpoint there reads or writes
/// those bytes too (F3).
type Alias = (u32, u64, u64, u64, u64);

/// The aliases of a batch: inline for a few endpoints' bindings, so that
/// the usual batch (an endpoint bound here, a source by address) builds
/// them on the stack (issue 30: no allocation per small batch,
/// `no_allocation` in `tests/copy`).
pub(super) type Aliases = SmallVec<[Alias; 4]>;

impl BatchInner {
    /// The bindings of the batch's local endpoints, when some memory is
    /// reached two ways: one bound by address overlaps memory the batch
    /// names by address, or another binding (one allocation bound at two
    /// offsets, or to two endpoints, by address or by handle). Then an op
    /// through the endpoint there reads or writes those bytes too (F3).
    /// Usually none: one relaxed load per endpoint when its range never
    /// had a window, and nothing built unless one allocation is bound by
    /// handle twice among the batch's endpoints.
    pub(super) fn aliases(&self) -> Aliases {
        let mut out = Aliases::new();
        let mut by_handle = 0usize;
        for (f, (range, id)) in self.eps.iter().zip(&self.keep.endpoints) {
            if !f.bound_here {
                continue;
            }
            by_handle = by_handle.saturating_add(f.by_handle);
            if !range.maybe_attached() {
                continue;
            }
            let slot = range.slot(*id);
            out.extend(
                slot.windows()
                    .filter_map(crate::window::Window::local_span)
                    .map(|(off, size, addr)| (*id, off, size, 0, addr)),
            );
        }
        if by_handle >= 2 {
            self.shared_handles(&mut out);
        }
        if out.is_empty() || (out.len() == 1 && self.locations.is_empty()) {
            return Aliases::new();
        }
        // `(space, start, end)` of each bound span and each memory named by
        // address, sorted: any two that overlap make every span an alias
        // (an extra alias only maps an op to the bytes it does reach).
        let mut spans: SmallVec<[(u64, u64, u64); 8]> = out
            .iter()
            .map(|&(_, _, size, space, at)| (space, at, at.saturating_add(size)))
            .chain(
                self.locations
                    .iter()
                    .map(|&(.., (p, len))| (0, p, p.saturating_add(len))),
            )
            .filter(|&(_, s, e)| s < e)
            .collect();
        spans.sort_unstable();
        let met = spans
            .windows(2)
            .any(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
            || {
                // Past the neighbour: a long span may reach over several.
                let mut reach = (u64::MAX, 0u64);
                spans.iter().any(|&(sp, s, e)| {
                    let hit = reach.0 == sp && s < reach.1;
                    reach = if reach.0 == sp {
                        (sp, reach.1.max(e))
                    } else {
                        (sp, e)
                    };
                    hit
                })
            };
        if !met {
            out.clear();
        }
        out
    }

    /// The binds by handle of the batch's local endpoints whose allocation
    /// is bound by handle at least twice among them (compared by identity,
    /// a recorded fact), pushed to `out`: only those can meet another bind
    /// in its bytes. Called when two or more binds are by handle.
    #[cold]
    #[inline(never)]
    fn shared_handles(&self, out: &mut Aliases) {
        let mut all: Vec<Alias> = Vec::new();
        for (f, (range, id)) in self.eps.iter().zip(&self.keep.endpoints) {
            if f.by_handle == 0 {
                continue;
            }
            // Read again under the lock: the bindings are those `by_handle`
            // counted (`recheck_stale` made it current, and the copy gate
            // keeps binds and unbinds out until the batch is recorded).
            let spans = range.slot(*id).handle_spans(f.align);
            all.extend(
                spans
                    .into_iter()
                    .map(|(off, size, alloc, at)| (*id, off, size, alloc, at)),
            );
        }
        all.sort_unstable_by_key(|a| a.3);
        for (i, a) in all.iter().enumerate() {
            let before = i.checked_sub(1).and_then(|j| all.get(j));
            if before.is_some_and(|b| b.3 == a.3) || all.get(i + 1).is_some_and(|b| b.3 == a.3) {
                out.push(*a);
            }
        }
    }
}

/// The first pair of ops of `ops` that depend on each other (F3): one's
/// destination overlaps the other's source or destination, in the same
/// endpoint or address space: [`Error::CopyDependent`], naming the two and
/// the bytes each names where they meet. One sort and one sweep: O(n log
/// n).
pub(super) fn dependent(ops: &[CopyOp], aliases: &[Alias]) -> Option<Error> {
    let (op, other, other_writes) = dependent_pair(ops, aliases)?;
    // (No such op, which `dependent_pair` never names: no bytes.)
    let side = |i: usize, dst: bool| {
        ops.get(i).map_or(
            CopyBytes {
                endpoint: None,
                start: 0,
                end: 0,
            },
            |o| copy_bytes(if dst { &o.dst } else { &o.src }, o.size),
        )
    };
    Some(Error::CopyDependent {
        op,
        other,
        writes: side(op, true),
        bytes: side(other, other_writes),
        other_writes,
    })
}

/// The bytes `side` of an op of `size` bytes names (a host buffer's by
/// its address).
fn copy_bytes(side: &Operand, size: u64) -> CopyBytes {
    let (endpoint, start) = match *side {
        Operand::LogicalEndpoint { id, offset } => (Some(id), offset),
        Operand::Pointer(Pointer { ptr, .. }) => (None, ptr),
    };
    CopyBytes {
        endpoint,
        start,
        end: start.saturating_add(size),
    }
}

/// [`dependent`]'s pair: `(the op whose destination, the other, whether it
/// is the other's destination)`; of two destinations, the lower op first.
fn dependent_pair(ops: &[CopyOp], aliases: &[Alias]) -> Option<(usize, usize, bool)> {
    if aliases.is_empty() && disjoint_in_order(ops) {
        return None;
    }
    // (space: endpoint id or none for addresses, start, end, op, destination)
    type Span = (Option<u32>, u64, u64, usize, bool);
    let span = |side: &Operand, size: u64, op: usize, dst: bool| -> Option<Span> {
        let (space, start) = space_of(side)?;
        Some((space, start, start.saturating_add(size), op, dst))
    };
    // Addresses and endpoint offsets apart: each is usually in order
    // already (ops laid out one after the other), and then not sorted again.
    let (mut addrs, mut eps) = (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
    // Spans in an allocation bound by handle (aliases only), by its key.
    let mut held: Vec<(u64, Span)> = Vec::new();
    for (i, CopyOp { src, dst, size }) in ops.iter().enumerate().filter(|(_, op)| op.size > 0) {
        let size = *size;
        for s in [span(src, size, i, false), span(dst, size, i, true)]
            .into_iter()
            .flatten()
        {
            if s.0.is_none() {
                addrs.push(s)
            } else {
                eps.push(s)
            }
        }
        // Through a local endpoint, the addresses of the memory bound there
        // (an op through it and an op by address may meet in that memory).
        for (side, dst) in [(src, false), (dst, true)] {
            let Operand::LogicalEndpoint { id, offset } = *side else {
                continue;
            };
            let end = offset.saturating_add(size);
            for &(a_id, a_off, a_size, a_space, a_at) in aliases {
                let (s, e) = (offset.max(a_off), end.min(a_off.saturating_add(a_size)));
                if a_id == id && s < e {
                    let at = a_at.saturating_add(s - a_off);
                    let span = (None, at, at.saturating_add(e - s), i, dst);
                    if a_space == 0 {
                        addrs.push(span);
                    } else {
                        held.push((a_space, span));
                    }
                }
            }
        }
    }
    for spans in [&mut addrs, &mut eps] {
        if !spans.is_sorted_by_key(|&(space, start, ..)| (space, start)) {
            spans.sort_unstable_by_key(|&(space, start, ..)| (space, start));
        }
    }
    held.sort_unstable_by_key(|&(key, (_, start, ..))| (key, start));
    sweep(addrs.iter().chain(eps.iter()).copied())
        .or_else(|| sweep(held.iter().map(|&(k, (_, s, e, op, d))| (k, s, e, op, d))))
}

/// The first dependent pair of ops among `spans` (sorted by space, then
/// start; `(space, start, end, op, destination)`), if any, as [`dependent`]
/// names it.
fn sweep<K: PartialEq + Copy>(
    spans: impl Iterator<Item = (K, u64, u64, usize, bool)>,
) -> Option<(usize, usize, bool)> {
    let pair = |a: (usize, bool), b: (usize, bool)| match (a.1, b.1) {
        (true, true) => (a.0.min(b.0), a.0.max(b.0), true),
        (true, false) => (a.0, b.0, false),
        _ => (b.0, a.0, a.1),
    };
    // Per space, the two spans reaching furthest among those started so far
    // that belong to different ops (all, and destinations only): an
    // overlap with any earlier span shows against one of them.
    #[derive(Clone, Copy, Default)]
    struct Reach(Option<(u64, usize, bool)>, Option<(u64, usize, bool)>);
    impl Reach {
        /// `.0`: the furthest-reaching span; `.1`: the furthest-reaching
        /// one of another op than `.0`'s.
        fn add(&mut self, end: u64, op: usize, dst: bool) {
            let new = Some((end, op, dst));
            match self.0 {
                None => self.0 = new,
                Some((e, o, _)) if o == op => {
                    if end > e {
                        self.0 = new;
                    }
                }
                Some((e, ..)) if end > e => {
                    self.1 = self.0;
                    self.0 = new;
                }
                Some(_) => {
                    if self.1.is_none_or(|(e, ..)| end > e) {
                        self.1 = new;
                    }
                }
            }
        }
        /// An earlier span of another op than `op` that reaches past `start`.
        fn past(&self, start: u64, op: usize) -> Option<(usize, bool)> {
            [self.0, self.1]
                .into_iter()
                .flatten()
                .find(|&(e, o, _)| o != op && e > start)
                .map(|(_, o, d)| (o, d))
        }
    }
    let mut space = None;
    let (mut all, mut dsts) = (Reach::default(), Reach::default());
    for (i, (sp, start, end, op, dst)) in spans.enumerate() {
        if i == 0 || Some(sp) != space {
            space = Some(sp);
            (all, dsts) = (Reach::default(), Reach::default());
        }
        let earlier = if dst {
            all.past(start, op)
        } else {
            dsts.past(start, op)
        };
        if let Some(e) = earlier {
            return Some(pair((op, dst), e));
        }
        all.add(end, op, dst);
        if dst {
            dsts.add(end, op, dst);
        }
    }
    None
}

/// Whether the spans of `ops` (sources before destinations, in op order;
/// addresses and endpoint offsets apart, as [`dependent`] lists them) are
/// already in order of (space, start) with each starting at or after the
/// previous one's end: then no two overlap and no op depends on another
/// (F3). One pass and nothing built: ops laid out one after the other, the
/// usual batch, are proven independent here; any other batch goes to the
/// sort and sweep.
fn disjoint_in_order(ops: &[CopyOp]) -> bool {
    // The end of the last address span, and (id, end) of the last endpoint one.
    let mut addr_end = 0u64;
    let mut ep_end: Option<(u32, u64)> = None;
    for CopyOp { src, dst, size } in ops {
        if *size == 0 {
            continue;
        }
        for side in [src, dst] {
            match space_of(side) {
                Some((None, a)) => {
                    if a < addr_end {
                        return false;
                    }
                    addr_end = a.saturating_add(*size);
                }
                Some((Some(id), off)) => {
                    if ep_end.is_some_and(|(i, e)| id < i || (id == i && off < e)) {
                        return false;
                    }
                    ep_end = Some((id, off.saturating_add(*size)));
                }
                None => {}
            }
        }
    }
    true
}

/// Where an operand's bytes start, for F3: `(Some(id), offset)` in an
/// endpoint, `(None, address)` in device (or mapped) memory; `None` for an
/// owned host buffer, which no other op names.
fn space_of(side: &Operand) -> Option<(Option<u32>, u64)> {
    match *side {
        Operand::LogicalEndpoint { id, offset } => Some((Some(id), offset)),
        Operand::Pointer(Pointer {
            hint: MemHint::Host,
            ..
        }) => None,
        Operand::Pointer(Pointer { ptr, .. }) => Some((None, ptr)),
    }
}

#[cfg(test)]
mod tests {
    use super::dependent_pair;
    use crate::driver::{CopyOp, Operand, Pointer};

    /// One side of an op, as the tests lay them out.
    #[derive(Clone, Copy)]
    enum Side {
        /// `(id, offset)`.
        Ep(u32, u64),
        /// A device address.
        Addr(u64),
        /// An owned host buffer.
        Host,
    }

    /// The driver's op of `(src, dst, size)`, as the builder writes it.
    fn op(&(src, dst, size): &(Side, Side, u64)) -> CopyOp {
        let operand = |side| match side {
            Side::Ep(id, offset) => Operand::LogicalEndpoint { id, offset },
            Side::Addr(a) => Operand::Pointer(Pointer::device(a)),
            Side::Host => Operand::Pointer(Pointer::host(0)),
        };
        CopyOp {
            src: operand(src),
            dst: operand(dst),
            size,
        }
    }

    /// The definition, pair by pair (F3).
    fn dependent_pairwise(ops: &[(Side, Side, u64)]) -> Option<(usize, usize)> {
        let range = |side: Side, size: u64| match side {
            Side::Ep(id, off) => Some((Some(id), off, off.saturating_add(size))),
            Side::Addr(a) => Some((None, a, a.saturating_add(size))),
            Side::Host => None,
        };
        for (i, &(_, dst, size)) in ops.iter().enumerate() {
            let Some(w) = range(dst, size).filter(|_| size > 0) else {
                continue;
            };
            for (j, &(src2, dst2, size2)) in ops.iter().enumerate() {
                if i == j || size2 == 0 {
                    continue;
                }
                for r in [range(src2, size2), range(dst2, size2)]
                    .into_iter()
                    .flatten()
                {
                    if r.0 == w.0 && r.1 < w.2 && w.1 < r.2 {
                        return Some((i, j));
                    }
                }
            }
        }
        None
    }

    fn side(k: u8, at: u64) -> Side {
        match k % 4 {
            0 => Side::Ep(1, at),
            1 => Side::Ep(2, at),
            2 => Side::Addr(at),
            _ => Side::Host,
        }
    }

    proptest::proptest! {
        #[test]
        fn f3_the_sweep_finds_a_dependency_exactly_when_some_pair_is_dependent(
            raw in proptest::collection::vec((0u8..4, 0u64..64, 0u8..4, 0u64..64, 0u64..16), 0..24)
        ) {
            let ops: Vec<_> = raw
                .iter()
                .map(|&(sk, sa, dk, da, n)| (side(sk, sa), side(dk, da), n))
                .collect();
            let typed: Vec<CopyOp> = ops.iter().map(op).collect();
            let found = dependent_pair(&typed, &[]);
            proptest::prop_assert_eq!(found.is_some(), dependent_pairwise(&ops).is_some());
            if let Some((a, b, _)) = found {
                // The pair named is a dependent pair.
                let two = [ops[a], ops[b]];
                proptest::prop_assert!(a != b && dependent_pairwise(&two).is_some());
            }
        }

        #[test]
        fn f3_ops_laid_out_in_order_are_found_dependent_exactly_when_some_pair_is(
            raw in proptest::collection::vec((0u64..20, 0u64..20, 0u64..16, 0u8..8), 0..24)
        ) {
            // Puts at rising addresses and offsets, steps sometimes shorter
            // than the ops (overlap) and now and then to a second endpoint:
            // the one-pass proof's cases and its fall-backs to the sweep.
            let (mut a, mut o) = (0u64, 0u64);
            let ops: Vec<_> = raw
                .iter()
                .map(|&(da, dof, n, e)| {
                    a += da;
                    o += dof;
                    (Side::Addr(a), Side::Ep(if e == 0 { 2 } else { 1 }, o), n)
                })
                .collect();
            let typed: Vec<CopyOp> = ops.iter().map(op).collect();
            proptest::prop_assert_eq!(
                dependent_pair(&typed, &[]).is_some(),
                dependent_pairwise(&ops).is_some()
            );
        }
    }
}

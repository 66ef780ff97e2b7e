//! One endpoint's windows as a batch on the portable path reads them: a
//! [`View`] per endpoint per batch (its members and windows, read once
//! under the range's lock, a cursor per member), [`resolve`]: every op of
//! a checked batch to the local address pieces of its targets (pieces end
//! to end grown into one, [`Grow`]), the usual
//! one-op batch without a view ([`one_piece`]), and what the batch holds
//! of the peer mappings it goes through ([`Holds`]). A child of
//! `portable`, whose module doc says what a window is.

use std::collections::HashSet;

use crate::copy::MemoryNamed;
use crate::driver::{CopyOp, Device, MemHint, MemcpyOp, MemcpyOps, Operand, Pointer};
use crate::error::{Error, Extent, Result};
use crate::ledger::RangeInner;
use crate::ledger::holds::KeepMemory;
use crate::memory::KeepAlive;
use crate::window::Member;

use super::call::Order;

/// What the portable path needs of the endpoint on `id` of `range`, read
/// where the endpoint's facts are (no copy at build time): its devices in
/// this process and its number of targets (1 for unicast, the team size
/// for multicast).
///
/// # Safety
/// The caller holds a shared borrow of the endpoint on `id` for as long as
/// the result lives: the ids of a batch's `keep.endpoints`, whose
/// endpoints the batch borrows for its life (`CopyBatch<'a>`).
#[inline(always)]
pub(crate) unsafe fn target_of(range: &RangeInner, id: u32) -> (&[Device], u32) {
    // SAFETY: the caller's contract is `RangeInner::facts`'s.
    let f = unsafe { range.facts(id) };
    (&f.devices, f.team_size)
}

/// What a batch on the portable path holds of the memory its copies reach
/// through windows: each mapping once, however many ops and windows name
/// it (the local memory of the batch is in `keep` already, once each).
pub(crate) struct Holds<'k> {
    keep: &'k mut KeepMemory,
    /// The objects in `keep`, by [`KeepAlive::key`]; filled at the first
    /// peer window (none on a batch that reaches only local bindings).
    seen: HashSet<usize>,
}

impl<'k> Holds<'k> {
    pub(crate) fn new(keep: &'k mut KeepMemory) -> Self {
        Holds {
            keep,
            seen: HashSet::new(),
        }
    }

    /// Holds `k` for the batch, unless it holds that object already.
    fn hold(&mut self, k: KeepAlive) {
        if self.seen.is_empty() {
            self.seen.extend(self.keep.iter().map(KeepAlive::key));
        }
        if self.seen.insert(k.key()) {
            self.keep.push(k);
        }
    }
}

/// One window of a [`View`]: `offset..end` of its member at `addr` here.
pub(super) struct Win {
    /// Its member's index in [`View::members`].
    m: usize,
    offset: u64,
    end: u64,
    addr: u64,
    /// The mapping of a peer window (`None` for a local binding, whose
    /// memory the binding keeps), held by the batch if an op used it.
    pub(super) keep: Option<KeepAlive>,
    pub(super) used: bool,
}

/// One local piece of an op: `(member index, address, bytes)`.
pub(crate) type Piece = (usize, u64, u64);

/// The pieces of one op, for every target in member order: a buffer the
/// batch reuses from op to op (inline for a few targets).
pub(crate) type Pieces = smallvec::SmallVec<[Piece; 4]>;

/// The windows of one endpoint of a batch, read once under its range's lock
/// when the batch is resolved (not once per op): its members (this
/// process's devices first, then every other member a window names, in the
/// order they were added) and their windows, sorted by member and offset
/// (the windows of one member never overlap: binds on one device do not,
/// R5.9, and a peer window replaces or refuses the ones it overlaps), with
/// a cursor per member on the window that last matched (consecutive ops
/// usually fall in the same window).
pub(crate) struct View {
    id: u32,
    team_size: u32,
    members: smallvec::SmallVec<[Member; 4]>,
    /// Every member's windows; member `m`'s are `wins[starts[m]..starts[m + 1]]`.
    pub(super) wins: smallvec::SmallVec<[Win; 2]>,
    starts: smallvec::SmallVec<[usize; 5]>,
    /// Per member, the index in `wins` of the window that last matched.
    cursor: smallvec::SmallVec<[usize; 4]>,
    /// The one target's window that last matched, `(offset, end, addr)`,
    /// when the endpoint has one target and one member (a unicast
    /// endpoint: the usual op falls inside it, [`inside_hot`]); its
    /// addresses do not wrap. `(0, 0, 0)`: none.
    hot: (u64, u64, u64),
}

impl View {
    /// The windows of the endpoint on `id` of `range`, which has `devices`
    /// here and `team_size` targets ([`target_of`]), taken under the
    /// range's lock: the peer windows' mappings are held by the view from
    /// here on, so the addresses stay valid whatever replaces the windows
    /// meanwhile.
    pub(crate) fn new(range: &RangeInner, id: u32, devices: &[Device], team_size: u32) -> View {
        let mut v = View {
            id,
            team_size,
            members: devices.iter().map(|&d| Member::Local(d)).collect(),
            wins: smallvec::SmallVec::new(),
            starts: smallvec::SmallVec::new(),
            cursor: smallvec::SmallVec::new(),
            hot: (0, 0, 0),
        };
        {
            let slot = range.slot(id);
            for w in slot.windows() {
                let m = match v.members.iter().position(|m| *m == w.member) {
                    Some(m) => m,
                    None => {
                        v.members.push(w.member);
                        v.members.len() - 1
                    }
                };
                // A window of no byte matches no op (as the lookup by
                // offset it replaces): left out, so none shadows another.
                if w.size > 0 {
                    v.wins.push(Win {
                        m,
                        offset: w.offset,
                        end: w.end(),
                        addr: w.addr,
                        keep: w.keep.clone(),
                        used: false,
                    });
                }
            }
        }
        if !v.wins.is_sorted_by_key(|w| (w.m, w.offset)) {
            v.wins.sort_unstable_by_key(|w| (w.m, w.offset));
        }
        let mut at = 0;
        for m in 0..v.members.len() {
            v.starts.push(at);
            v.cursor.push(at);
            at += v
                .wins
                .get(at..)
                .map_or(0, |r| r.iter().take_while(|w| w.m == m).count());
        }
        v.starts.push(at);
        v
    }

    /// Every target's pieces for `offset..offset + size` (op `op`) into
    /// `out` (emptied first), in member order, each target's in endpoint
    /// order. The windows used are marked, for [`View::hold_used`].
    /// This process's bound memory is not held per op: the batch holds the
    /// endpoint's id range, whose binding records keep it until an unbind
    /// or destroy of the id, which settle the batch first (F4).
    ///
    /// # Errors
    /// [`Error::CopyWindowsPastTargets`] when more targets have windows
    /// than the endpoint has; [`Error::CopyNoWindow`] when a target has no
    /// window over those bytes.
    pub(crate) fn resolve(
        &mut self,
        op: usize,
        offset: u64,
        size: u64,
        out: &mut Pieces,
    ) -> Result<()> {
        out.clear();
        let targets = usize::try_from(self.team_size).unwrap_or(usize::MAX);
        if self.members.len() > targets {
            return Err(self.past_targets(op));
        }
        let end = offset.saturating_add(size);
        for m in 0..self.members.len() {
            let (lo, hi) = (self.starts[m], self.starts[m + 1]);
            let mut c = self.cursor[m];
            let mut at = offset;
            while at < end {
                let inside = |w: &Win| w.offset <= at && at < w.end;
                if !self.wins.get(c).is_some_and(|w| c < hi && inside(w)) {
                    // The next window (an op across two), else a search.
                    c = match self.wins.get(c + 1) {
                        Some(w) if c + 1 >= lo && c + 1 < hi && inside(w) => c + 1,
                        _ => {
                            let i = lo + self.wins[lo..hi].partition_point(|w| w.offset <= at);
                            match i.checked_sub(1) {
                                Some(j) if j >= lo && at < self.wins[j].end => j,
                                _ => break,
                            }
                        }
                    };
                }
                let w = &mut self.wins[c];
                let stop = end.min(w.end);
                let Some(addr) = w.addr.checked_add(at - w.offset) else {
                    // Inside a window whose address wraps (a hostile answer):
                    // no advice about where the peer bound.
                    return Err(self.no_window(op, offset, size, m, false));
                };
                w.used = true;
                out.push((m, addr, stop - at));
                at = stop;
            }
            self.cursor[m] = c;
            if at < end {
                return Err(self.no_window(op, offset, size, m, true));
            }
        }
        if u32::try_from(self.members.len()) != Ok(self.team_size) {
            return Err(self.no_window(op, offset, size, self.members.len(), true));
        }
        if self.team_size == 1 {
            // The window of this op's last piece, for the next op.
            if let Some(w) = self.wins.get(self.cursor[0])
                && w.used
                && w.addr.checked_add(w.end - w.offset).is_some()
            {
                self.hot = (w.offset, w.end, w.addr);
            }
        }
        Ok(())
    }

    /// Hands the mappings of the peer windows an op used to `holds` (each
    /// once per batch); the others are let go with the view.
    pub(crate) fn hold_used(self, holds: &mut Holds<'_>) {
        for w in self.wins {
            if let (true, Some(k)) = (w.used, w.keep) {
                holds.hold(k);
            }
        }
    }

    /// [`Error::CopyNoWindow`] for op `op`, whose target `known` (the
    /// member of that index, if any) lacks a window over its bytes; with
    /// `hint`, naming a peer's windows elsewhere.
    #[cold]
    fn no_window(&self, op: usize, offset: u64, size: u64, known: usize, hint: bool) -> Error {
        // A peer with windows elsewhere bound memory, not there: named,
        // with what its windows cover, touching ones joined (the user's fix
        // differs).
        let peer = match self.members.get(known) {
            Some(&Member::Peer { rank, device }) if hint => {
                let (lo, hi) = (self.starts[known], self.starts[known + 1]);
                let spans = self.wins[lo..hi]
                    .iter()
                    .map(|w| (w.offset, w.end - w.offset));
                let covered = crate::copy::check::merged(spans).to_vec();
                (!covered.is_empty()).then(|| {
                    Box::new(crate::error::PeerBound {
                        rank,
                        device,
                        covered,
                    })
                })
            }
            _ => None,
        };
        Error::CopyNoWindow {
            op,
            id: self.id,
            offset,
            size,
            known: u32::try_from(known).unwrap_or(u32::MAX),
            targets: self.team_size,
            peer,
        }
    }

    #[cold]
    fn past_targets(&self, op: usize) -> Error {
        Error::CopyWindowsPastTargets {
            op,
            id: self.id,
            members: u32::try_from(self.members.len()).unwrap_or(u32::MAX),
            targets: self.team_size,
        }
    }
}

/// [`Error::CopyOntoItself`] for op `op`, naming its endpoint side.
#[cold]
pub(super) fn onto_itself(op: usize, o: Option<&CopyOp>) -> Error {
    let (id, offset, size) = match o {
        Some(&CopyOp {
            src: Operand::LogicalEndpoint { id, offset },
            size,
            ..
        })
        | Some(&CopyOp {
            dst: Operand::LogicalEndpoint { id, offset },
            size,
            ..
        }) => (id, offset, size),
        // Every op of the typed API names one endpoint.
        _ => (0, 0, 0),
    };
    Error::CopyOntoItself {
        op,
        id,
        offset,
        size,
    }
}

/// The address of `offset..offset + size` when the bytes lie inside
/// `hot`, a [`View`]'s window that last matched (one piece, no error
/// possible; that window is marked used already); `None`:
/// [`View::resolve`] decides.
#[inline(always)]
pub(super) fn inside_hot(hot: (u64, u64, u64), offset: u64, size: u64) -> Option<u64> {
    let (lo, hi, addr) = hot;
    let end = offset.checked_add(size)?;
    if lo <= offset && end <= hi && offset < end {
        // Below `addr + (hi - lo)`, which does not wrap (checked when set).
        Some(addr.wrapping_add(offset - lo))
    } else {
        None
    }
}

/// `p` moved `at` bytes on.
pub(super) fn advance(p: Pointer, at: u64) -> Option<Pointer> {
    Some(Pointer {
        ptr: p.ptr.checked_add(at)?,
        hint: p.hint,
    })
}

/// `(endpoint id, endpoint offset, local side, whether it writes the
/// endpoint)` of an op; `None` for an op naming no endpoint (none of the
/// typed API's).
#[inline(always)]
pub(super) fn sides(op: &CopyOp) -> Option<(u32, u64, Pointer, bool)> {
    match (op.src, op.dst) {
        (Operand::Pointer(p), Operand::LogicalEndpoint { id, offset }) => {
            Some((id, offset, p, true))
        }
        (Operand::LogicalEndpoint { id, offset }, Operand::Pointer(p)) => {
            Some((id, offset, p, false))
        }
        _ => None,
    }
}

/// The copy of `local` to (`put`) or from `there`.
#[inline(always)]
pub(super) fn piece(put: bool, local: Pointer, there: Pointer, size: u64) -> MemcpyOp {
    if put {
        MemcpyOp {
            dst: there,
            src: local,
            size,
        }
    } else {
        MemcpyOp {
            dst: local,
            src: there,
            size,
        }
    }
}

/// Whether a copy's ranges overlap (`cuMemcpyAsync` ranges may not: an op
/// copying bytes onto themselves, its local memory what the endpoint
/// reaches): two ranges of one length overlap when their starts are less
/// than that length apart (no sum, so none to overflow).
#[inline(always)]
pub(super) fn onto(c: &MemcpyOp) -> bool {
    c.src.ptr.abs_diff(c.dst.ptr) < c.size
}

/// Whether the pieces `cs` of one op (`put` or get, its local side
/// `size` bytes at `local`) write bytes the op reads: the op copies bytes
/// onto themselves, in one piece or across two (an op across two windows,
/// a put to several members), whose order is none. Each member's pieces
/// of a put read all of the local side, and a get's pieces write all of
/// it: so the endpoint side of each piece is compared with the local side
/// once, not pair by pair (a multicast put has a piece per member).
fn touches_its_local_side(cs: &[MemcpyOp], put: bool, local: u64, size: u64) -> bool {
    let end = local.saturating_add(size);
    cs.iter().any(|c| {
        let there = if put { c.dst.ptr } else { c.src.ptr };
        there < end && local < there.saturating_add(c.size)
    })
}

/// The usual batch, without a [`View`]: one op on an endpoint of one target
/// and at most one device here, inside one window of its one member (every
/// window of the id is that member's). Its one copy, the window's mapping
/// held in `memory` when it is a peer's; `None` for anything else, which
/// [`resolve`] decides (and names, on an error): the same copy, the same
/// holds, since the windows of one member never overlap.
///
/// # Safety
/// As [`target_of`]'s, for the endpoints of `endpoints`.
#[inline]
pub(super) unsafe fn one_piece(
    list: &[CopyOp],
    endpoints: &[(std::sync::Arc<RangeInner>, u32)],
    memory: &mut KeepMemory,
) -> Option<MemcpyOp> {
    let ([op], [(range, ep)]) = (list, endpoints) else {
        return None;
    };
    let (id, offset, local, put) = sides(op)?;
    if *ep != id {
        return None;
    }
    // The record found once, for the facts and the slot.
    let rec = range.record_ref(id);
    // SAFETY: the caller's contract (the endpoint on `id` is borrowed).
    let f = unsafe { rec.facts() };
    if f.team_size != 1 || f.devices.len() > 1 {
        return None;
    }
    let end = offset.checked_add(op.size).filter(|&end| end > offset)?;
    let (addr, keep) = {
        let slot = rec.slot();
        // The member: the device here, else the first window's.
        let mut member = f.devices.first().map(|&d| Member::Local(d));
        let mut found = None;
        for w in slot.windows() {
            if *member.get_or_insert(w.member) != w.member {
                return None; // two members for one target
            }
            if w.size > 0 && w.offset <= offset && end <= w.end() {
                found = Some(w);
            }
        }
        let w = found?;
        (w.addr.checked_add(offset - w.offset)?, w.keep.clone())
    };
    let c = piece(put, local, Pointer::device(addr), op.size);
    if onto(&c) {
        return None;
    }
    if let Some(k) = keep {
        hold_one(memory, k);
    }
    Some(c)
}

/// Holds `k` in `memory` unless it holds that object already (a peer
/// window's mapping, out of the usual batch's line).
#[cold]
#[inline(never)]
fn hold_one(memory: &mut KeepMemory, k: KeepAlive) {
    if !memory.iter().any(|m| m.key() == k.key()) {
        memory.push(k);
    }
}

/// Every op of a checked batch resolved to its targets' pieces through the
/// endpoints' windows (a [`View`] per endpoint), with their [`Order`] for
/// the batch call, the mappings of the peer windows used held in `memory`,
/// each once.
///
/// # Errors
/// [`Error::CopyNoWindow`], [`Error::CopyWindowsPastTargets`],
/// [`Error::CopyOntoItself`], [`Error::CopyOutOfRange`], naming the op.
///
/// # Safety
/// As [`target_of`]'s, for the endpoints of `endpoints`.
#[inline(always)]
pub(super) unsafe fn resolve(
    list: &[CopyOp],
    spans: &[MemoryNamed],
    endpoints: &[(std::sync::Arc<RangeInner>, u32)],
    memory: &mut KeepMemory,
) -> Result<(MemcpyOps, Order)> {
    // Inline up to `MemcpyOps::INLINE` copies: a batch of a few puts
    // allocates nothing here (issue 30, `no_allocation` in `tests/copy`).
    let mut copies = MemcpyOps::with_capacity(list.len());
    let mut order = Order::NEW;
    // Each endpoint's windows, read once for the batch.
    let mut views: smallvec::SmallVec<[View; 1]> = endpoints
        .iter()
        .map(|(range, id)| {
            // SAFETY: the caller's contract (the endpoint on `id` is borrowed).
            let (devices, team_size) = unsafe { target_of(range, *id) };
            View::new(range, *id, devices, team_size)
        })
        .collect();
    // The view of the op before (consecutive ops usually name one), and
    // its id and window that last matched, kept here (no load through
    // `views` for the usual op).
    let mut last = 0usize;
    let mut hot = (u32::MAX, (0, 0, 0));
    let mut pieces = Pieces::new();
    let mut i = 0usize;
    loop {
        // The usual ops: one piece each, in the window of the op before.
        i = match hot_run(
            list.get(i..).unwrap_or(&[]),
            hot,
            spans,
            &mut copies,
            &mut order,
        ) {
            Ok(n) => i.saturating_add(n),
            Err(n) => {
                let at = i.saturating_add(n);
                return Err(onto_itself(at, list.get(at)));
            }
        };
        let Some(op) = list.get(i) else {
            break;
        };
        let op_i = i;
        i = i.saturating_add(1);
        let first = copies.len();
        let size = op.size;
        let out_of_range = |at: u64| Error::CopyOutOfRange {
            op: op_i,
            what: Extent::Allocation,
            offset: at,
            size,
            limit: size,
        };
        // The op's memory side, and whether it writes the endpoint.
        let Some((id, offset, local, put)) = sides(op) else {
            continue; // every op of the typed API names one endpoint
        };
        if views.get(last).is_none_or(|v| v.id != id) {
            let Some(v) = views.iter().rposition(|v| v.id == id) else {
                continue; // every endpoint of the batch has its facts
            };
            last = v;
        }
        let Some(view) = views.get_mut(last) else {
            continue;
        };
        view.resolve(op_i, offset, size, &mut pieces)?;
        hot = (view.id, view.hot);
        // A put writes every target; a get reads the first.
        let mut member = 0;
        let mut at = 0u64;
        for &(m, addr, n) in &pieces {
            if m != member {
                if !put {
                    break;
                }
                (member, at) = (m, 0);
            }
            let here = advance(local, at).ok_or_else(|| out_of_range(at))?;
            let c = piece(put, here, Pointer::device(addr), n);
            order.add(&c);
            copies.push(c);
            at = at.checked_add(n).ok_or_else(|| out_of_range(at))?;
        }
        if copies
            .get(first..)
            .is_some_and(|cs| touches_its_local_side(cs, put, local.ptr, size))
        {
            return Err(onto_itself(op_i, Some(op)));
        }
    }
    let mut holds = Holds::new(memory);
    for v in views {
        v.hold_used(&mut holds);
    }
    Ok((copies, order))
}

/// The first ops of `ops` that name endpoint `hot.0` inside its window
/// `hot.1` ([`inside_hot`]; the one that last matched): one piece each,
/// pushed to `copies` with their [`Order`], or grown onto the piece before
/// ([`Grow`]). A loop of its own, whose state
/// stays in registers (in [`resolve`]'s it was memory), one per direction
/// (the first op's; a run stops at an op of the other): the piece needs no
/// choice per op. `Ok`: how many; `Err(n)`: op `n` copies bytes onto
/// themselves.
#[inline(always)]
fn hot_run(
    ops: &[CopyOp],
    hot: (u32, (u64, u64, u64)),
    spans: &[MemoryNamed],
    copies: &mut MemcpyOps,
    order: &mut Order,
) -> std::result::Result<usize, usize> {
    match ops.first().and_then(sides) {
        Some((.., true)) => hot_run_dir::<true>(ops, hot, spans, copies, order),
        Some((.., false)) => hot_run_dir::<false>(ops, hot, spans, copies, order),
        None => Ok(0),
    }
}

/// [`hot_run`] of the ops that put (`PUT`) or get.
#[inline(never)]
fn hot_run_dir<const PUT: bool>(
    ops: &[CopyOp],
    hot: (u32, (u64, u64, u64)),
    spans: &[MemoryNamed],
    copies: &mut MemcpyOps,
    order: &mut Order,
) -> std::result::Result<usize, usize> {
    let mut o = *order;
    let mut n = 0usize;
    let window = Grow::window(hot.1);
    let mut g = match copies.last() {
        Some(c) => Grow::of::<PUT>(c, copies.len() - 1, window, spans),
        None => Grow::NONE,
    };
    loop {
        // The ops that grow the last piece, in a loop of their own: its
        // state in registers, nothing written per op.
        let (grown, next) = g.grow::<PUT>(ops.get(n..).unwrap_or(&[]), hot);
        n += grown;
        g = next;
        let Some(op) = ops.get(n) else {
            break;
        };
        let Some((id, offset, local, put)) = sides(op) else {
            break;
        };
        if id != hot.0 || put != PUT {
            break;
        }
        let Some(addr) = inside_hot(hot.1, offset, op.size) else {
            break;
        };
        let c = piece(PUT, local, Pointer::device(addr), op.size);
        g.flush::<PUT>(copies, &mut o);
        if onto(&c) {
            *order = o;
            return Err(n);
        }
        o.add(&c);
        copies.push(c);
        g = Grow::of::<PUT>(&c, copies.len() - 1, window, spans);
        n += 1;
    }
    g.flush::<PUT>(copies, &mut o);
    *order = o;
    Ok(n)
}

/// The last piece of a hot run, grown by the pieces that follow it end to
/// end (issue 30, item 5: a run of puts laid end to end on both sides
/// goes as one copy, not one per op), in registers, written back once
/// ([`Grow::flush`]).
///
/// A piece grows only while one copy moves the same bytes: its local side
/// device memory (never host memory, which `cuMemcpyAsync` stages) inside
/// one allocation of the batch, its endpoint side inside the hot window
/// (one mapping: one bind by address, or one peer window), and the grown
/// copy off its own bytes (`onto`: it reads no byte it writes). The copies
/// of a batch run in no order, so one copy for several is the same.
#[derive(Clone, Copy)]
struct Grow {
    /// The piece's index in the copies.
    at: usize,
    /// Its start here and there, and its size in the copies.
    l0: u64,
    t0: u64,
    base: u64,
    /// Where the next piece starts here and there to grow it.
    l_next: u64,
    t_next: u64,
    /// How far it may grow here: its allocation's end, and the distance
    /// between its two sides (off its own bytes). There, the ops that grow
    /// it lie in its window (`inside_hot`).
    local_cap: u64,
}

impl Grow {
    /// Nothing grows (no piece ends below a cap of 0).
    const NONE: Grow = Grow {
        at: 0,
        l0: 0,
        t0: 0,
        base: 0,
        l_next: 0,
        t_next: 0,
        local_cap: 0,
    };

    /// The window `(offset, end, addr)` as addresses `[addr, addr + len)`
    /// (`inside_hot`'s windows do not wrap: checked when set).
    #[inline(always)]
    fn window(hot: (u64, u64, u64)) -> (u64, u64) {
        let (lo, hi, addr) = hot;
        (addr, addr.wrapping_add(hi.wrapping_sub(lo)))
    }

    /// `c`, at index `at` of the copies, as a piece that may grow: inside
    /// the window `[lo, hi)` on its endpoint side and an allocation of
    /// `spans` on its local side; else [`Grow::NONE`].
    fn of<const PUT: bool>(
        c: &MemcpyOp,
        at: usize,
        (lo, hi): (u64, u64),
        spans: &[MemoryNamed],
    ) -> Grow {
        let (local, there) = if PUT { (c.src, c.dst) } else { (c.dst, c.src) };
        let inside =
            |(a, b): (u64, u64), p: u64| a <= p && p.checked_add(c.size).is_some_and(|e| e <= b);
        if local.hint != MemHint::None
            || there.hint != MemHint::None
            || !inside((lo, hi), there.ptr)
        {
            return Grow::NONE;
        }
        let Some(local_end) = spans
            .iter()
            .map(|&(.., (a, size))| (a, a.saturating_add(size)))
            .find(|&span| inside(span, local.ptr))
            .map(|(_, b)| b)
        else {
            return Grow::NONE;
        };
        let gap = local.ptr.abs_diff(there.ptr);
        Grow {
            at,
            l0: local.ptr,
            t0: there.ptr,
            base: c.size,
            // Inside both (checked above): no wrap.
            l_next: local.ptr.wrapping_add(c.size),
            t_next: there.ptr.wrapping_add(c.size),
            local_cap: local_end.min(local.ptr.saturating_add(gap)),
        }
    }

    /// Grows the piece by the first ops of `ops` that follow it end to end
    /// (on endpoint `hot.0`, inside its window `hot.1`, in this direction)
    /// and stay inside its caps: how many, and the piece grown.
    #[inline(always)]
    fn grow<const PUT: bool>(
        mut self,
        ops: &[CopyOp],
        hot: (u32, (u64, u64, u64)),
    ) -> (usize, Grow) {
        let mut n = 0usize;
        for op in ops {
            let Some((id, offset, local, put)) = sides(op) else {
                break;
            };
            let Some(there) = inside_hot(hot.1, offset, op.size) else {
                break;
            };
            // Inside its allocation (the builder's check) and the window:
            // its ends do not wrap.
            let (l_end, t_end) = (local.ptr.wrapping_add(op.size), there.wrapping_add(op.size));
            // No check of the window's end: `inside_hot` put the op inside
            // the window the piece started in (`Grow::of`, the run's).
            if id != hot.0
                || put != PUT
                || local.ptr != self.l_next
                || there != self.t_next
                || local.hint != MemHint::None
                || l_end > self.local_cap
            {
                break;
            }
            (self.l_next, self.t_next) = (l_end, t_end);
            n += 1;
        }
        (n, self)
    }

    /// Writes the grown size back to the piece, and adds the bytes it grew
    /// by to `o`, as one piece end to end with it (what adding each one
    /// would have made of `o`).
    fn flush<const PUT: bool>(&self, copies: &mut [MemcpyOp], o: &mut Order) {
        let size = self.l_next.wrapping_sub(self.l0);
        if size == self.base {
            return;
        }
        if let Some(c) = copies.get_mut(self.at) {
            c.size = size;
        }
        let (l, t) = (
            self.l0.wrapping_add(self.base),
            self.t0.wrapping_add(self.base),
        );
        o.add(&piece(
            PUT,
            Pointer::device(l),
            Pointer::device(t),
            size - self.base,
        ));
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;

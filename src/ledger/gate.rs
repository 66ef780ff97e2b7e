//! The gate between a copy's enqueue and a bind or an unbind on one
//! endpoint range, on different threads (F4, R13.3): [`Gate`], one per
//! range, and the guards that hold it.
//!
//! A copy (`&ep`) and an unbind (a `Binding` of the same endpoint) may run
//! at once on two threads. An enqueue checks the bindings (F9), calls the
//! driver, then records the batch in flight; an unbind settles the copies
//! in flight on the id ([`super::holds::settle`]), then calls the driver; a
//! bind records its binding, then calls the driver. One atomic word per
//! side (enqueues; binds and unbinds) keeps them apart:
//!
//! - an enqueue (or a capture, until its graph pins its ids) holds an
//!   [`EnqueueGate`] on every range of its batch from before its checks to
//!   after its record, entered only while no bind or unbind is inside (all
//!   ranges or none: it never waits holding one); [`EnqueueGate::clear`]
//!   looks again before its first driver call, since a bind that entered
//!   meanwhile may have recorded a binding the checks passed on before the
//!   driver bound it (R13.3): then it leaves, waits, and checks again;
//! - an unbind holds a [`ChangeGate`] from before its settle to after its
//!   driver call, and waits until no enqueue is inside (a copy is recorded
//!   in flight before the settle looks);
//! - a bind holds a [`ChangeGate`] from before its record to its end and
//!   waits for nothing.
//!
//! A layer inside a copy's driver call may wait for another thread's bind
//! on the range, never for another thread's unbind there, nor a layer in a
//! bind or unbind for another thread's copy: those would wait for each
//! other. A thread that would wait for a side it is itself inside (a
//! `tracing` layer or a backend calling back into the crate) would wait for
//! itself, and is refused ([`Error::CopyUnbindReentered`]). The gate knows
//! who is inside without a store or thread-local state of its own: a
//! side's word holds the count of the threads inside and the sum of their
//! names, added and taken off in one atomic operation, so with one thread
//! inside the sum is its name; a thread that entered while others were
//! inside also lists its name under the lock. A waiter is inside iff the
//! list has its name or it is the one left inside once the others (other
//! threads) have gone.
//!
//! Waiters park on a condition variable, woken by a holder that leaves
//! when the word says some wait. Uncontended, a bind is one atomic add and
//! one subtract, an unbind also one load, an enqueue two. Interleavings
//! checked by loom (`ci/loom.sh`).
//!
//! After a `fork` of a process whose other threads were inside a gate, the
//! child keeps their counts, as it keeps any lock they held: an unbind
//! there waits for them for ever. Fork only single-threaded, or exec at once.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::PoisonError;

use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Condvar, Mutex, Ordering, thread_id};

/// A side's word: the count of the threads inside (more than 32,767 inside
/// one range's side at once would carry into the next field), whether some
/// may be parked for the side to empty, and the sum of the names of those
/// inside, modulo 2^48 (a name that does not fit is listed instead).
const COUNT: u64 = 0x7FFF;
const WAITING: u64 = 1 << 15;
const NAMES: u32 = 16;
/// In an [`Entry`] (where the word has [`WAITING`]): the name is listed.
const LISTED: u64 = WAITING;

/// The side of the gate a thread is inside.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    /// A copy's enqueue or capture.
    Enqueue,
    /// A bind or an unbind.
    Change,
}

/// What a thread inside added to its side's word, and [`LISTED`] when it
/// also wrote its name in the list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry(u64);

/// The gate of one endpoint range (a field of the range's record).
pub(crate) struct Gate {
    enqueues: AtomicU64,
    changes: AtomicU64,
    /// The names of the threads that entered a side while others were
    /// inside (allocated the first time, kept), and the lock that waiters
    /// park under.
    listed: Mutex<Vec<(u64, Side)>>,
    parked: Condvar,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("enqueues", &(self.enqueues.load(Ordering::Relaxed) & COUNT))
            .field("changes", &(self.changes.load(Ordering::Relaxed) & COUNT))
            .finish_non_exhaustive()
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    /// An open gate: nobody inside.
    pub(crate) fn new() -> Gate {
        Gate {
            enqueues: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            listed: Mutex::new(Vec::new()),
            parked: Condvar::new(),
        }
    }

    #[inline]
    fn word(&self, side: Side) -> &AtomicU64 {
        match side {
            Side::Enqueue => &self.enqueues,
            Side::Change => &self.changes,
        }
    }

    /// Whether anyone is inside `side`. After this thread's add to the other
    /// side's word: each of two threads entering opposite sides sees the
    /// other (the SeqCst order; loom weakens SeqCst accesses to AcqRel and
    /// needs the fence to model it).
    #[inline]
    fn busy(&self, side: Side) -> bool {
        #[cfg(loom)]
        loom::sync::atomic::fence(Ordering::SeqCst);
        self.word(side).load(Ordering::SeqCst) & COUNT != 0
    }

    /// Enters `side`: one add of the count and this thread's name.
    // Always: a call cost bind 7 instructions (`benches/instructions.rs`).
    #[inline(always)]
    fn enter(&self, side: Side) -> Entry {
        let me = thread_id() as u64;
        // The name rotated into place: what does not fit lands in the
        // count's bits, tested there (one instruction less than a shift
        // and a separate test).
        let named = me.rotate_left(NAMES);
        if named & ((1 << NAMES) - 1) != 0 {
            return self.enter_unnamed(side);
        }
        let add = 1 | named;
        let was = self.word(side).fetch_add(add, Ordering::SeqCst);
        if was & COUNT != 0 {
            return self.list(side, add);
        }
        Entry(add)
    }

    /// A name that does not fit in the word: counted without it, and
    /// listed.
    #[cold]
    #[inline(never)]
    fn enter_unnamed(&self, side: Side) -> Entry {
        self.word(side).fetch_add(1, Ordering::SeqCst);
        self.list(side, 1)
    }

    /// Others were inside (or the name does not fit): the name goes in the
    /// list too, where a waiter that is one of several inside finds it.
    #[cold]
    #[inline(never)]
    fn list(&self, side: Side, add: u64) -> Entry {
        self.lock().push((thread_id() as u64, side));
        Entry(add | LISTED)
    }

    /// Leaves `side`, and wakes the parked if any.
    #[inline(always)]
    fn leave(&self, side: Side, entry: Entry) {
        if entry.0 & LISTED != 0 {
            return self.leave_listed(side, entry);
        }
        // Not listed: the entry is what was added (no mask to take off).
        let was = self.word(side).fetch_sub(entry.0, Ordering::SeqCst);
        if was & WAITING != 0 {
            self.wake(side);
        }
    }

    /// [`Gate::leave`] for a thread whose name is listed: off the list
    /// first.
    #[cold]
    #[inline(never)]
    fn leave_listed(&self, side: Side, entry: Entry) {
        let me = (thread_id() as u64, side);
        {
            let mut listed = self.lock();
            if let Some(i) = listed.iter().position(|&n| n == me) {
                listed.swap_remove(i);
            }
        }
        let was = self
            .word(side)
            .fetch_sub(entry.0 & !LISTED, Ordering::SeqCst);
        if was & WAITING != 0 {
            self.wake(side);
        }
    }

    /// The lock (nothing panics while it is held: poisoning is ignored).
    fn lock(&self) -> crate::sync::MutexGuard<'_, Vec<(u64, Side)>> {
        self.listed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A waiter set [`WAITING`] under the lock before it looked at the
    /// count: taking the lock here means it is parked (or gone), so the
    /// notification reaches it; it sets the flag again if it waits on.
    #[cold]
    #[inline(never)]
    fn wake(&self, side: Side) {
        let guard = self.lock();
        self.word(side).fetch_and(!WAITING, Ordering::SeqCst);
        drop(guard);
        self.parked.notify_all();
    }

    /// Parks until nobody is inside `side`, or refuses (`id` names the
    /// endpoint) when this thread is inside it: it would wait for itself.
    #[cold]
    #[inline(never)]
    fn wait(&self, side: Side, id: u32) -> Result<()> {
        let me = thread_id() as u64;
        let mut guard = self.lock();
        if guard.contains(&(me, side)) {
            return Err(Error::CopyUnbindReentered { id });
        }
        loop {
            let now = self.word(side).fetch_or(WAITING, Ordering::SeqCst);
            if now & COUNT == 0 {
                return Ok(());
            }
            // One inside, and its name is this thread's (not listed, so it
            // came in alone: the sum is its name alone).
            if now & COUNT == 1 && now >> NAMES == me {
                return Err(Error::CopyUnbindReentered { id });
            }
            guard = self
                .parked
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Enters as an enqueue, unless a bind or an unbind is inside (then
    /// leaves again at once).
    #[inline]
    fn try_enqueue(&self) -> Option<Entry> {
        let entry = self.enter(Side::Enqueue);
        if !self.busy(Side::Change) {
            return Some(entry);
        }
        self.leave(Side::Enqueue, entry);
        None
    }
}

/// What has a gate: an endpoint range ([`super::RangeInner`]), or, in the
/// loom tests, a stand-in. The gate knows nothing else of the range.
pub(crate) trait Gated {
    /// The gate.
    fn gate(&self) -> &Gate;
}

impl<R: Gated> Gated for Arc<R> {
    #[inline]
    fn gate(&self) -> &Gate {
        (**self).gate()
    }
}

/// An enqueue (or capture) inside the gates of its batch's ranges. It
/// names them by address, not by a clone of their `Arc`: the caller of
/// [`EnqueueGate::enter`] keeps them alive (the batch borrows their
/// endpoints), and the gate costs no count to take and to give back.
pub(crate) enum EnqueueGate<R: Gated> {
    /// The usual batch: its endpoints are of one range (`u32`: an id there).
    One(NonNull<R>, u32, Entry),
    Many(Vec<(NonNull<R>, u32, Entry)>),
}

/// The range at `r`.
///
/// # Safety
/// `r` is a range of an [`EnqueueGate`] whose caller keeps it alive
/// ([`EnqueueGate::enter`]'s contract).
#[inline(always)]
unsafe fn range<'r, R>(r: NonNull<R>) -> &'r R {
    // SAFETY: the caller's contract: the range is alive, and only ever
    // read through shared references. The gain of names over clones of
    // the ranges' `Arc`s: a one-op batch 762 -> 754 instructions, two
    // atomic operations fewer (`Null`, `benches/copy_batch.rs`).
    unsafe { r.as_ref() }
}

impl<R: Gated> EnqueueGate<R> {
    /// Enters the gate of every distinct range of `endpoints`, once no bind
    /// or unbind is inside any of them. Once the checks are done,
    /// [`EnqueueGate::clear`] says whether they stand.
    ///
    /// # Safety
    /// Every range of `endpoints` stays alive until the gate is ended or
    /// dropped, and when it is given to [`EnqueueGate::wait_for_changes`],
    /// until that returned (an enqueue's batch borrows the ranges'
    /// endpoints for its whole call).
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside a bind or
    /// an unbind on one of them.
    #[inline(always)]
    pub(crate) unsafe fn enter(endpoints: &[(Arc<R>, u32)]) -> Result<EnqueueGate<R>> {
        let Some(((first, id), rest)) = endpoints.split_first() else {
            return Ok(EnqueueGate::Many(Vec::new()));
        };
        if rest.iter().all(|(r, _)| Arc::ptr_eq(r, first))
            && let Some(entry) = first.gate().try_enqueue()
        {
            return Ok(EnqueueGate::One(NonNull::from(&**first), *id, entry));
        }
        Self::enter_many(endpoints)
    }

    /// [`EnqueueGate::enter`] for several ranges, or after a bind or unbind
    /// was seen: waits with none entered.
    #[cold]
    #[inline(never)]
    fn enter_many(endpoints: &[(Arc<R>, u32)]) -> Result<EnqueueGate<R>> {
        let mut ranges: Vec<(&Arc<R>, u32)> = Vec::new();
        for (range, id) in endpoints {
            if !ranges.iter().any(|(r, _)| Arc::ptr_eq(r, range)) {
                ranges.push((range, *id));
            }
        }
        loop {
            let mut inside = Vec::with_capacity(ranges.len());
            let mut busy = None;
            for &(range, id) in &ranges {
                match range.gate().try_enqueue() {
                    Some(entry) => inside.push((NonNull::from(&**range), id, entry)),
                    None => {
                        busy = Some((range, id));
                        break;
                    }
                }
            }
            let Some((range, id)) = busy else {
                return Ok(EnqueueGate::Many(inside));
            };
            // Holding none: a bind or unbind there never waits for this one.
            drop(EnqueueGate::Many(inside));
            range.gate().wait(Side::Change, id)?;
        }
    }

    /// After the enqueue's checks, before its first driver call: whether
    /// they stand, that is whether no bind or unbind entered one of the
    /// ranges since (a bind's record may be what they passed on, before
    /// the driver bound it, R13.3). When they do not,
    /// [`EnqueueGate::wait_for_changes`], then enter and check again. (Not
    /// one call returning the gate or `None`: that `Result<Option<_>>`
    /// moved the gate through memory, 16 instructions of a one-op batch.)
    #[inline(always)]
    pub(crate) fn clear(&self) -> bool {
        match self {
            // SAFETY: `enter`'s contract.
            EnqueueGate::One(r, ..) => !unsafe { range(*r) }.gate().busy(Side::Change),
            EnqueueGate::Many(ranges) => !ranges
                .iter()
                // SAFETY: `enter`'s contract.
                .any(|(r, ..)| unsafe { range(*r) }.gate().busy(Side::Change)),
        }
    }

    /// The checks do not stand ([`EnqueueGate::clear`]): the gates left
    /// and the change waited for; enter and check again.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when that change is this thread's.
    #[cold]
    #[inline(never)]
    pub(crate) fn wait_for_changes(self) -> Result<()> {
        let changing = match &self {
            EnqueueGate::One(r, id, _) => Some((*r, *id)),
            EnqueueGate::Many(ranges) => ranges
                .iter()
                // SAFETY: `enter`'s contract.
                .find(|(r, ..)| unsafe { range(*r) }.gate().busy(Side::Change))
                .map(|(r, id, _)| (*r, *id)),
        };
        drop(self);
        if let Some((r, id)) = changing {
            // SAFETY: `enter`'s contract: alive until this returned.
            unsafe { range(r) }.gate().wait(Side::Change, id)?;
        }
        Ok(())
    }
}

impl<R: Gated> EnqueueGate<R> {
    /// Leaves the gates, as a drop does. Inline where a drop is not: the
    /// enqueue may also drop the guard at an early return or while
    /// unwinding, so its drop glue is called out of line, and its usual
    /// path ends the guard by this.
    #[inline(always)]
    pub(crate) fn end(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.leave_all();
        if let EnqueueGate::Many(ranges) = &*this {
            // SAFETY: `this` is never used after, nor dropped
            // (`ManuallyDrop`): the field that owns something is moved
            // out once, here, and dropped. The gain over the drop glue:
            // a one-op batch 879 -> 859 instructions, portable
            // 1,061 -> 1,051 (`Null`, `benches/copy_batch.rs`,
            // `benches/copy_portable.rs`).
            drop(unsafe { std::ptr::read(ranges) });
        }
    }

    /// Leaves every gate entered.
    #[inline(always)]
    fn leave_all(&self) {
        match self {
            EnqueueGate::One(r, _, entry) => {
                // SAFETY: `enter`'s contract.
                unsafe { range(*r) }.gate().leave(Side::Enqueue, *entry)
            }
            EnqueueGate::Many(ranges) => {
                for (r, _, entry) in ranges {
                    // SAFETY: `enter`'s contract.
                    unsafe { range(*r) }.gate().leave(Side::Enqueue, *entry);
                }
            }
        }
    }
}

impl<R: Gated> Drop for EnqueueGate<R> {
    #[inline(always)]
    fn drop(&mut self) {
        self.leave_all();
    }
}

/// An enqueue inside the gate of one range: the one-put lane's
/// [`EnqueueGate`]. Its own type, not [`EnqueueGate::One`]: a gate that
/// may be [`EnqueueGate::Many`] keeps the code of several ranges (its
/// loops, its list) in the lane's line of code after the driver's call,
/// which a one-put batch then reads from memory (`benches/copy_cold.rs`).
/// It never waits: when a bind or an unbind is inside, its caller takes
/// the general path, which does.
pub(crate) struct OneGate<R: Gated> {
    range: NonNull<R>,
    entry: Entry,
}

impl<R: Gated> OneGate<R> {
    /// Enters the gate of `range` unless a bind or an unbind is inside it.
    ///
    /// # Safety
    /// `range` stays alive until the gate is ended or dropped (the
    /// enqueue's batch borrows its endpoint for the whole call), as
    /// [`EnqueueGate::enter`]'s.
    #[inline(always)]
    pub(crate) unsafe fn enter(range: &R) -> Option<OneGate<R>> {
        let entry = range.gate().try_enqueue()?;
        Some(OneGate {
            range: NonNull::from(range),
            entry,
        })
    }

    /// [`EnqueueGate::clear`]: whether no bind or unbind entered since.
    #[inline(always)]
    pub(crate) fn clear(&self) -> bool {
        // SAFETY: `enter`'s contract. (By address, as `EnqueueGate`: the
        // gain is the one-put lane's, `copy/one.rs`'s `usual_put`.)
        !unsafe { range(self.range) }.gate().busy(Side::Change)
    }

    /// Leaves the gate, as a drop does ([`EnqueueGate::end`]).
    #[inline(always)]
    pub(crate) fn end(self) {
        drop(self);
    }
}

impl<R: Gated> Drop for OneGate<R> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `enter`'s contract. (By address, as `EnqueueGate`: the
        // gain is the one-put lane's, `copy/one.rs`'s `usual_put`.)
        unsafe { range(self.range) }
            .gate()
            .leave(Side::Enqueue, self.entry);
    }
}

/// What ends an enqueue's gate after its record: [`EnqueueGate`] and
/// [`OneGate`], for the code they share (`copy/enqueue.rs`).
pub(crate) trait EndGate {
    /// Leaves the gate(s).
    fn end(self);
}

impl<R: Gated> EndGate for EnqueueGate<R> {
    #[inline(always)]
    fn end(self) {
        EnqueueGate::end(self);
    }
}

impl<R: Gated> EndGate for OneGate<R> {
    #[inline(always)]
    fn end(self) {
        OneGate::end(self);
    }
}

/// A bind or an unbind inside the gate of its range.
pub(crate) struct ChangeGate<'r, R: Gated> {
    range: &'r R,
    entry: Entry,
}

impl<'r, R: Gated> ChangeGate<'r, R> {
    /// Enters the gate of `range` for an unbind, once no enqueue is inside
    /// it. Inline: with no enqueue there (the usual unbind), an add and a
    /// load.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside an
    /// enqueue on `range`.
    // Always: a call returning the 88-byte `Result` cost bind 23 more
    // instructions than inline (`benches/instructions.rs`).
    #[inline(always)]
    pub(crate) fn unbind(range: &'r R, id: u32) -> Result<ChangeGate<'r, R>> {
        let gate = ChangeGate::bind(range);
        if range.gate().busy(Side::Enqueue) {
            // Their checks and driver calls; new ones wait for this unbind.
            range.gate().wait(Side::Enqueue, id)?;
        }
        Ok(gate)
    }

    /// Enters the gate of `range` for a bind, at once: enqueues inside
    /// either checked before its record or look again after their checks
    /// ([`EnqueueGate::clear`]).
    #[inline(always)]
    pub(crate) fn bind(range: &'r R) -> ChangeGate<'r, R> {
        ChangeGate {
            range,
            entry: range.gate().enter(Side::Change),
        }
    }
}

impl<R: Gated> ChangeGate<'_, R> {
    /// Leaves the gate, as a drop does. Inline where a drop is not: a
    /// function that may also drop the guard while unwinding or at an early
    /// return calls the drop glue out of line (bind 14 instructions), so its
    /// usual path ends the guard by this.
    #[inline(always)]
    pub(crate) fn end(self) {
        let this = std::mem::ManuallyDrop::new(self);
        leave_change(this.range, this.entry);
    }
}

impl<R: Gated> Drop for ChangeGate<'_, R> {
    #[inline(always)]
    fn drop(&mut self) {
        leave_change(self.range, self.entry);
    }
}

/// [`Gate::leave`] of a bind or unbind, whose out-of-line paths are given
/// the range rather than its gate: the gate's address was otherwise
/// computed and kept on the stack for them (bind 181 instructions against
/// 176, `benches/instructions.rs`).
#[inline(always)]
fn leave_change<R: Gated>(range: &R, entry: Entry) {
    if entry.0 & LISTED != 0 {
        return leave_change_listed(range, entry);
    }
    let was = range
        .gate()
        .word(Side::Change)
        .fetch_sub(entry.0, Ordering::SeqCst);
    if was & WAITING != 0 {
        wake_change(range);
    }
}

#[cold]
#[inline(never)]
fn leave_change_listed<R: Gated>(range: &R, entry: Entry) {
    range.gate().leave_listed(Side::Change, entry);
}

#[cold]
#[inline(never)]
fn wake_change<R: Gated>(range: &R) {
    range.gate().wake(Side::Change);
}

#[cfg(test)]
mod tests;

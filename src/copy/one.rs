//! The one-put lane (issue 30): a batch of one put, checked and recorded
//! at enqueue without the batch's lists.
//!
//! What this file owns: [`Deferred`], a batch's first put whose
//! keep-alive, F2 location and endpoint keep-alive are left out of the
//! batch's lists for later; [`BatchInner::defer_put`], which makes every
//! other part of that put as `put_slow` would (its checks, the cursor, the
//! op); [`BatchInner::materialize`], which pushes the three left out, as
//! `put_slow` would have, before any other builder call or check reads the
//! lists; and [`BatchInner::one_put`], the lane's checks at enqueue.
//!
//! Only a put that passes every check of the builder now is deferred:
//! inside its memory, its endpoint's facts those of the batch before
//! (`check::Memo`), the op inside the endpoint, below its agreed top and
//! inside the first interval bound on every device here (F9, R13.3). Any
//! other put is checked as it comes, as always, so that what a put gets
//! never depends on what follows it in its batch. The cursor is set as for
//! any first put, so a second put on the same memory and endpoint takes
//! the builder's fast path. The lane takes the put alone, at enqueue, when
//! its facts are still the range's (no bind or unbind since, compared
//! inside the copy gate), its memory is of the stream's context and on its
//! device (F2) and its endpoint of that context: its keep is made whole
//! (two lists of one), its op goes to the driver (on the portable path:
//! its one piece inside one window), and its state back to the spare with
//! three fields reset. One op is independent (F3). Anything else
//! materializes and takes the general path, which makes every check and
//! names any error as it always has: the state it finds is the one the
//! builder would have left without the lane.

use std::ptr::NonNull;

use smallvec::SmallVec;

use super::{BatchInner, Cursor};
use crate::context::Context;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::kind::{Kind, MemShare};
use crate::ledger::holds::Keep;
use crate::memory::{BindSource, Locality, Mapped};
use crate::state::State;

/// A batch's first put while its keep-alives and F2 location are out of
/// the batch's lists: the `Mapped` and the `Endpoint` it borrowed (by
/// address: the batch's state has no lifetime, the
/// [`CopyBatch`](super::CopyBatch) holding it does), and what reads them
/// back as their types.
#[derive(Clone, Copy)]
pub(crate) struct Deferred {
    mem: NonNull<()>,
    ep: NonNull<()>,
    /// [`push_held`] at the put's types.
    push_held: unsafe fn(&mut BatchInner, &Deferred),
    /// [`lane`] at the put's types.
    lane: unsafe fn(&mut BatchInner, &Deferred, &Context, Device) -> bool,
}

// SAFETY: a `Deferred` stands for the shared borrows `&Mapped<H>` and
// `&Endpoint<S, K>` its put took, and those types are `Sync` for every
// `H`, `S`, `K` (an `Arc` and a `PhantomData<fn() -> _>`; asserted below
// for one of each), so the borrows may go to another thread with the
// batch. Only the batch reads them ([`BatchInner::pending`]), for as long
// as it borrows them.
unsafe impl Send for Deferred {}
// SAFETY: as `Send`; `&Deferred` reads nothing through its pointers.
unsafe impl Sync for Deferred {}

const _: () = {
    const fn sync<T: Sync>() {}
    sync::<Mapped<crate::Private>>();
    sync::<Endpoint<crate::Ready, crate::Unicast>>();
};

impl Deferred {
    /// The put from `mem` into `ep`.
    #[inline(always)]
    fn put<H: MemShare, S: State, K: Kind>(mem: &Mapped<H>, ep: &Endpoint<S, K>) -> Deferred {
        Deferred {
            mem: NonNull::from(mem).cast(),
            ep: NonNull::from(ep).cast(),
            push_held: push_held::<H, S, K>,
            lane: lane::<H, S, K>,
        }
    }

    /// The put's memory and endpoint, as the types it was made at.
    ///
    /// # Safety
    /// `H`, `S` and `K` are the types of [`Deferred::put`] that made it,
    /// and the batch that holds it still borrows what it names (a
    /// `Deferred` is only read through its batch,
    /// [`BatchInner::pending`]).
    #[inline(always)]
    unsafe fn parts<'x, H: MemShare, S: State, K: Kind>(
        &self,
    ) -> (&'x Mapped<H>, &'x Endpoint<S, K>) {
        // SAFETY: the caller's contract: the pointers are of live shared
        // borrows of these types. What the erased put buys (the one-put
        // lane, `Null`, `benches/copy_batch.rs` and `copy_portable.rs`): a
        // one-put batch 751 -> 621 instructions, portable 949 -> 799; a
        // batch of more puts pays 92 once (64 puts 2,874 -> 2,966).
        unsafe { (self.mem.cast().as_ref(), self.ep.cast().as_ref()) }
    }
}

/// [`BatchInner::materialize`] at the put's types: what `mapped_slow` and
/// `endpoint` push for a batch's first put, in their order.
///
/// # Safety
/// [`Deferred::parts`]'s.
unsafe fn push_held<H: MemShare, S: State, K: Kind>(inner: &mut BatchInner, d: &Deferred) {
    // SAFETY: the caller's contract.
    let (mem, ep) = unsafe { d.parts::<H, S, K>() };
    inner.keep.memory.push(mem.keep_alive());
    let span = (mem.device_ptr(), mem.size());
    inner
        .locations
        .push((0, mem.locality(), mem.context().key(), span));
    inner.keep.endpoints.push((ep.range().clone(), ep.id()));
}

/// [`BatchInner::one_put`]'s checks at the put's types: what only the
/// stream decides (the builder checked the rest, and the caller compares
/// the bindings inside the gate, `one_put_stands`): the memory on the
/// stream's device (F2), the memory and the endpoint of its context. If
/// they pass, the memory's keep-alive and the endpoint's range are in
/// `inner.keep`, made whole rather than pushed (nothing else is written).
///
/// # Safety
/// [`Deferred::parts`]'s.
unsafe fn lane<H: MemShare, S: State, K: Kind>(
    inner: &mut BatchInner,
    d: &Deferred,
    ctx: &Context,
    dev: Device,
) -> bool {
    // SAFETY: the caller's contract.
    let (mem, ep) = unsafe { d.parts::<H, S, K>() };
    let usual = matches!(mem.locality(), Locality::Device(d) if d == dev)
        && mem.context().key() == ctx.key()
        && ep.range().ctx.same(ctx);
    if usual {
        // Whole, not pushed: a list of one made at once asks nothing of
        // where its items are.
        let empty = std::mem::replace(
            &mut inner.keep,
            Keep {
                memory: SmallVec::from_buf([mem.keep_alive()]),
                endpoints: SmallVec::from_buf([(ep.range().clone(), ep.id())]),
            },
        );
        // Empty (`usual_first_put`): inline, it holds nothing to drop, and
        // its drop's calls cost 40 instructions (a one-put batch 618 -> 586).
        debug_assert!(empty.memory.is_empty() && empty.endpoints.is_empty());
        if empty.memory.spilled() || empty.endpoints.spilled() {
            drop(empty);
        } else {
            std::mem::forget(empty);
        }
    }
    usual
}

impl BatchInner {
    /// The deferred first put's keep-alives and location pushed (if there
    /// is one): the lists as `put_slow` would have left them.
    #[inline(always)]
    pub(super) fn materialize(&mut self) {
        if self.pending.is_some() {
            self.materialize_now();
        }
    }

    /// [`BatchInner::materialize`] of a deferred put, out of line: the
    /// builder's loops keep their slow branches short.
    #[cold]
    #[inline(never)]
    fn materialize_now(&mut self) {
        if let Some(d) = self.pending.take() {
            // SAFETY: `d` was made by `Deferred::put` at the types its
            // `push_held` was made at, for this batch, whose borrows hold
            // while its state is reached (`pending`).
            unsafe { (d.push_held)(self, &d) };
        }
    }

    /// A batch's first put (op `op`) that may leave its keep-alives and
    /// location for later: nothing made yet (no keep-alive, so no cursor,
    /// no facts of this batch), and the put passes now every check
    /// `put_slow` makes: inside its memory (which does not wrap the
    /// address space), and its endpoint's facts those the batch before
    /// kept (`check::Memo`, so they are the range's now), the op inside
    /// their first interval (inside the endpoint, below its agreed top,
    /// bound on every device here: F9, R13.3). That interval, clipped as
    /// the cursor takes it; `None` for any other put, which `put_slow`
    /// checks as it comes.
    #[inline(always)]
    pub(super) fn usual_first_put<H: MemShare, S: State, K: Kind>(
        &self,
        op: usize,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Option<(u64, u64)> {
        let len = mem.size();
        let inside = op == 0
            && self.keep.memory.is_empty()
            && self.keep.endpoints.is_empty()
            // `mapped_slow`'s range check and its test of the memory's end.
            && at < len
            && at.checked_add(size).is_some_and(|end| end <= len)
            && mem.device_ptr().checked_add(len).is_some();
        // `endpoint`'s test of the facts kept, then `put_to_slow`'s.
        match &self.eps[..] {
            [f] if inside && self.memo.as_ref().is_some_and(|m| m.holds(ep)) => {
                BatchInner::first_hit_of(f, offset, size)
            }
            _ => None,
        }
    }

    /// A batch's first put that [`BatchInner::usual_first_put`] passed,
    /// with the interval it found: the cursor, F3's state and the op as
    /// `put_slow` makes them (`mapped_slow`, `put_to_slow`), its
    /// keep-alives and location left out ([`Deferred`]).
    #[inline(always)]
    pub(super) fn defer_put<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
        (start, stop): (u64, u64),
    ) {
        let (ptr, len) = (mem.device_ptr(), mem.size());
        // No wrap: `at < len` and `ptr + len` does not (`usual_first_put`);
        // nor for `end`, inside the interval.
        let (from, end) = (ptr.wrapping_add(at), offset.wrapping_add(size));
        let id = ep.id();
        self.cursor = Cursor {
            mem: std::ptr::from_ref(mem).addr(),
            mem_ptr: ptr,
            mem_size: len,
            ep: u64::from(id),
            ep_at: std::ptr::from_ref(ep).addr(),
            ep_index: 0,
            start,
            end: stop,
            // `end >= offset >= start`: the put lies in `[start, stop)`.
            put_from: end,
            putting: true,
            run: 0,
        };
        self.puts = true;
        self.put_last = Some((id, end));
        self.pending = Some(Deferred::put(mem, ep));
        let op = super::put_op(from, id, offset, size);
        match self.list.spare_capacity_mut().first_mut() {
            Some(slot) => {
                slot.write(op);
                // SAFETY: the list was empty (`usual_first_put`: op 0) and
                // its first slot is written just above. Not `push`: its
                // out-of-line growth path cost a one-put batch 660 -> 644
                // instructions (`Null`, `benches/copy_batch.rs`).
                unsafe { self.list.set_len(1) };
            }
            None => self.push(op),
        }
    }

    /// The lane at enqueue on a stream of `ctx` on `dev`, for the deferred
    /// put `d`, taken out of `pending`: `true` when the batch is that put
    /// alone and it passes what only the stream decides ([`lane`]), its
    /// keep-alive and range now in `keep`; the caller enters the gate and
    /// checks that the facts still stand ([`BatchInner::one_put_stands`]).
    /// `false` otherwise, nothing written: the caller materializes and
    /// takes the general path.
    #[inline(always)]
    pub(super) fn one_put(&mut self, d: &Deferred, ctx: &Context, dev: Device) -> bool {
        self.list.len() == 1
            && self.host.is_none()
            && self.error.is_none()
            && self.ep_error.is_none()
            && !(self.unordered || self.gets)
            // SAFETY: as in `materialize`.
            && unsafe { (d.lane)(self, d, ctx, dev) }
    }

    /// Inside the copy gate, after [`BatchInner::one_put`]: whether the
    /// facts it checked against are still the range's (no bind or unbind
    /// since: F9, as [`BatchInner::check`]'s test of a stale endpoint).
    #[inline(always)]
    pub(super) fn one_put_stands(&self) -> bool {
        match (&self.eps[..], &self.keep.endpoints[..]) {
            ([f], [(range, _)]) => f.bindings_gen == Some(range.bindings_gen()),
            _ => false,
        }
    }

    /// The deferred put `d` back, for the general path: what
    /// [`BatchInner::one_put`] wrote undone (if it passed and the facts
    /// did not stand, or the portable path found no one piece), and the
    /// lists as `put_slow` would have left them.
    #[cold]
    pub(super) fn one_put_undone(&mut self, d: Deferred) {
        // Tested first: a clear of an empty `SmallVec` still asks where its
        // items are (a batch of 64 puts, which never passes `one_put`,
        // 2,977 -> 2,966 instructions on `Null`).
        if !self.keep.memory.is_empty() || !self.keep.endpoints.is_empty() {
            self.keep.memory.clear();
            self.keep.endpoints.clear();
        }
        self.pending = Some(d);
        self.materialize();
    }

    /// After the lane recorded its put: the state as [`BatchInner::reset`]
    /// leaves it (its op list taken, its keep recorded; the builder wrote
    /// these three besides).
    #[inline(always)]
    pub(super) fn one_put_done(&mut self) {
        // Not the whole `Cursor::NONE`: its copy was two lines of constants
        // read after the driver's call (`benches/copy_cold.rs`).
        self.cursor.forget();
        self.put_last = None;
        self.puts = false;
    }
}

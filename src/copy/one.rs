//! The one-put lane (issue 30): a batch of one put, checked and recorded
//! at enqueue without the batch's lists.
//!
//! What this file owns: [`Deferred`], a batch's first put whose
//! bookkeeping (its keep-alive and F2 location, its endpoint's facts, the
//! cursor) is left for later; [`BatchInner::materialize`], which makes that
//! bookkeeping exactly as the put's own slow path would have, before any
//! other builder call or check reads the batch's state; and
//! [`BatchInner::one_put`], the lane's checks at enqueue.
//!
//! The put's op waits in the [`Deferred`] too, out of the op list (the
//! batch's length counts it: [`CopyBatch::len`](super::CopyBatch::len)).
//! Anything but an enqueue on the fabric path of that one put (a second
//! op, a capture, the portable path) materializes first: the op goes to
//! the list as op 0, its bookkeeping is made, and the batch goes on as if
//! nothing was deferred.
//! The lane takes the usual one put alone: its memory inside, of the
//! stream's context and on its device (F2), its endpoint of that context,
//! its facts those of the batch before (`check::Memo`) and unchanged
//! since, the op inside the endpoint, below its agreed top and inside the
//! first interval bound on every device here (F9, R13.3). One op is
//! independent (F3). Anything else falls back to the general path, which
//! makes every check and names any error as it always has.

use std::ptr::NonNull;

use smallvec::SmallVec;

use super::BatchInner;
use crate::context::Context;
use crate::driver::{CopyOp, Device};
use crate::endpoint::Endpoint;
use crate::kind::{Kind, MemShare};
use crate::ledger::holds::Keep;
use crate::memory::{BindSource, Locality, Mapped};
use crate::state::State;

/// A batch's first put, its bookkeeping not made yet: the `Mapped` and the
/// `Endpoint` it borrowed (by address: the batch's state has no lifetime,
/// the [`CopyBatch`](super::CopyBatch) holding it does), its operands, and
/// what reads them back as their types.
#[derive(Clone, Copy)]
pub(crate) struct Deferred {
    mem: NonNull<()>,
    ep: NonNull<()>,
    at: u64,
    offset: u64,
    size: u64,
    /// The op's source address (`mem`'s address at `at`, saturated as
    /// `mapped_slow` makes it) and endpoint id: its op, without `mem` and
    /// `ep` read again.
    from: u64,
    id: u32,
    /// [`replay`] at the put's types.
    replay: unsafe fn(&mut BatchInner, &Deferred),
    /// [`lane`] at the put's types.
    lane: unsafe fn(&mut BatchInner, &Deferred, &Context, Device) -> bool,
}

// SAFETY: a `Deferred` stands for the shared borrows `&Mapped<H>` and
// `&Endpoint<S, K>` its put took, and those types are `Sync` (asserted
// below), so the borrows may go to another thread with the batch. Only
// the batch reads them ([`BatchInner::pending`]), for as long as it
// borrows them.
unsafe impl Send for Deferred {}
// SAFETY: as `Send`; `&Deferred` reads nothing through its pointers.
unsafe impl Sync for Deferred {}

const _: () = {
    const fn sync<T: Sync>() {}
    sync::<Mapped<crate::Private>>();
    sync::<Endpoint<crate::Ready, crate::Unicast>>();
};

impl Deferred {
    /// The put of `size` bytes of `mem` from `at` into `ep` at `offset`.
    #[inline(always)]
    pub(super) fn put<H: MemShare, S: State, K: Kind>(
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Deferred {
        Deferred {
            mem: NonNull::from(mem).cast(),
            ep: NonNull::from(ep).cast(),
            at,
            offset,
            size,
            from: mem.device_ptr().saturating_add(at),
            id: ep.id(),
            replay: replay::<H, S, K>,
            lane: lane::<H, S, K>,
        }
    }

    /// The driver's op of the put.
    #[inline(always)]
    pub(super) fn op(&self) -> CopyOp {
        super::put_op(self.from, self.id, self.offset, self.size)
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
        // one-put batch 751 -> 593 instructions, portable 949 -> 780; a
        // batch of more puts pays for it once, at its second (64 puts
        // 2,874 -> 3,046, 1,024 puts 29,764 -> 29,936).
        unsafe { (self.mem.cast().as_ref(), self.ep.cast().as_ref()) }
    }
}

/// [`BatchInner::materialize`] at the put's types: what `put_slow` makes
/// for op 0 besides writing it (written by the caller).
///
/// # Safety
/// [`Deferred::parts`]'s.
unsafe fn replay<H: MemShare, S: State, K: Kind>(inner: &mut BatchInner, d: &Deferred) {
    // SAFETY: the caller's contract.
    let (mem, ep) = unsafe { d.parts::<H, S, K>() };
    let from = inner.mapped(mem, d.at, d.size, 0);
    debug_assert_eq!(from, mem.device_ptr().saturating_add(d.at));
    inner.put_to(ep, d.offset, d.size, 0);
}

/// [`BatchInner::one_put`]'s checks at the put's types, before the gate:
/// whether the put is the usual one the lane takes; if so its memory's
/// keep-alive and its endpoint's range are in `inner.keep`, made whole
/// rather than pushed (nothing else is written).
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
    let len = mem.size();
    // The local side (`mapped_slow`'s range check; F2; its context).
    let usual_mem = d.at < len
        && d.at.checked_add(d.size).is_some_and(|end| end <= len)
        && mem.device_ptr().checked_add(len).is_some()
        && matches!(mem.locality(), Locality::Device(d) if d == dev)
        && mem.context().key() == ctx.key();
    // The endpoint side: the facts the batch before read of it, unchanged
    // (`endpoint`'s test), and the op inside their first interval
    // (`put_to_slow`'s), of this context.
    let facts = match &inner.eps[..] {
        [f] if inner.memo.as_ref().is_some_and(|m| m.holds(ep)) => Some(f),
        _ => None,
    };
    let usual = usual_mem
        && facts.is_some_and(|f| BatchInner::first_hit_of(f, d.offset, d.size).is_some())
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
        // Empty (`may_defer`): inline, it holds nothing to drop, and its
        // drop's calls cost 40 instructions (a one-put batch 618 -> 586).
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
    /// The deferred first put's bookkeeping, made (if there is one).
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
            debug_assert!(self.list.is_empty());
            self.push(d.op());
            // SAFETY: `d` was made by `Deferred::put` at the types its
            // `replay` was made at, for this batch, whose borrows hold
            // while its state is reached (`pending`).
            unsafe { (d.replay)(self, &d) };
        }
    }

    /// The batch's first put: its op now, its bookkeeping when something
    /// reads it, never for a batch of it alone.
    #[inline(always)]
    pub(super) fn defer_put<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) {
        self.pending = Some(Deferred::put(mem, at, ep, offset, size));
    }

    /// Whether a batch's first put may leave its bookkeeping for later:
    /// nothing made yet (no keep-alive, so no cursor, no facts of this
    /// batch). `op` is the put's op number.
    #[inline(always)]
    pub(super) fn may_defer(&self, op: usize) -> bool {
        op == 0 && self.keep.memory.is_empty() && self.keep.endpoints.is_empty()
    }

    /// The lane at enqueue on a stream of `ctx` on `dev`, for the deferred
    /// put `d`, taken out of `pending`: `true` when it is the usual one
    /// put (see the module's doc), its keep-alive and range now in
    /// `keep`; the caller enters the gate and checks that the facts still
    /// stand ([`BatchInner::one_put_stands`]). `false` otherwise, nothing
    /// written: the caller materializes and takes the general path.
    #[inline(always)]
    pub(super) fn one_put(&mut self, d: &Deferred, ctx: &Context, dev: Device) -> bool {
        self.list.is_empty()
            && self.host.is_none()
            && self.error.is_none()
            && self.ep_error.is_none()
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

    /// Undoes [`BatchInner::one_put`]'s writes (the facts did not stand).
    #[cold]
    pub(super) fn one_put_undone(&mut self, d: Deferred) {
        self.keep.memory.clear();
        self.keep.endpoints.clear();
        self.pending = Some(d);
        self.materialize();
    }
}

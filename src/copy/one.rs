//! The one-put lane (issue 30): a put checked and recorded alone, without
//! the batch's lists, for a batch of that one put and for a
//! [`Route`](super::Route)'s put.
//!
//! What this file owns: [`Deferred`], a batch's usual first put, checked
//! as it comes and kept as its arguments while nothing follows it;
//! [`BatchInner::defer`], which checks and keeps it;
//! [`BatchInner::materialize`], which writes it into the batch's state as
//! the builder would have written it when it came (its keep-alives and
//! location, the cursor, F3's state, the op) before any other builder call
//! or check reads that state; [`Deferred::lane`], the lane of a batch of
//! that put alone at enqueue; [`usual_put`], the lane's end, which a
//! route's put shares: the copy gate, the driver's call and the record;
//! [`answer`], the token or the error made of what it did; and
//! [`fabric_copy_error`], the error of a failed fabric copy (F7), which
//! `enqueue.rs` names too.
//!
//! Only a put that passes every check of the builder when it comes is
//! deferred: inside its memory (whose range does not wrap), its endpoint's
//! facts those the batch before kept (`memo::Memo`, bound here), the op
//! inside the endpoint, below its agreed top and inside the first interval
//! bound on every device here (F9, R13.3). Any other put is checked and
//! written as it comes (`put_slow`), so a put refused when it was built is
//! refused at enqueue whatever changed between, as in a longer batch. The
//! lane takes the put at enqueue when its memory is of the stream's
//! context and on its device (F2), its endpoint of that context, and,
//! compared inside the copy gate, no bind or unbind came since its facts
//! were read; one op is independent (F3). Anything else is materialized
//! and takes the general path, which makes every check and names any error
//! as it always has. What a put gets never depends on whether it was
//! deferred (`data_path::f2_f9_a_batch_of_one_put_is_checked_as_the_same_put_followed_by_another`,
//! `data_path::issue_30_a_routes_put_is_checked_as_the_batch_of_that_put`).

use std::ptr::NonNull;

use smallvec::SmallVec;

use super::portable::LocalWindow;
use super::{BatchInner, Cursor, InFlight};
use crate::CopyPath;
use crate::context::Context;
use crate::driver::{Call, CopyOp, CopyOps, Device};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::kind::{Kind, MemShare};
use crate::ledger::gate::OneGate;
use crate::ledger::holds::Keep;
use crate::memory::{BindSource, Locality, Mapped};
use crate::state::State;
use crate::stream::Stream;
use crate::unwind::OnUnwindWith;

/// A batch's first put, kept as its arguments while nothing follows it:
/// the `Mapped` and the `Endpoint` it borrowed (by address: the batch's
/// state has no lifetime, the [`CopyBatch`](super::CopyBatch) holding it
/// does), its offsets and size, and what reads them back as their types.
#[derive(Clone, Copy)]
pub(crate) struct Deferred {
    mem: NonNull<()>,
    ep: NonNull<()>,
    at: u64,
    offset: u64,
    size: u64,
    /// The bindings generation of the endpoint's facts it passed against.
    pub(super) generation: u64,
    /// [`make`] at the put's types.
    make: unsafe fn(&mut BatchInner, &Deferred),
    /// [`lane`] at the put's types.
    lane: unsafe fn(&Deferred, &Stream, Option<&LocalWindow>) -> Lane,
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
    /// The put's memory and endpoint, as the types it was made at.
    ///
    /// # Safety
    /// `H`, `S` and `K` are the types of [`BatchInner::defer`] that made
    /// it, and the batch that holds it still borrows what it names (a
    /// `Deferred` is only read through its batch, [`BatchInner::pending`]).
    #[inline(always)]
    unsafe fn parts<'x, H: MemShare, S: State, K: Kind>(
        &self,
    ) -> (&'x Mapped<H>, &'x Endpoint<S, K>) {
        // SAFETY: the caller's contract: the pointers are of live shared
        // borrows of these types. What the erased put buys (the one-put
        // lane, `Null`, `benches/copy_batch.rs` and `copy_portable.rs`): a
        // one-put batch 751 -> 621 instructions, portable 949 -> 799; and
        // kept as its arguments rather than written into the batch's state
        // as the first op of a longer batch, 576 -> 518, portable 739 ->
        // 669, a batch of 64 puts 2,948 -> 3,004, from `c12a811`).
        unsafe { (self.mem.cast().as_ref(), self.ep.cast().as_ref()) }
    }

    /// The lane at enqueue on `stream`: the put enqueued alone where every
    /// check passes as described in this file's doc (its answer made by
    /// [`answer`]); `None` (nothing enqueued, nothing held) for anything
    /// else.
    ///
    /// # Safety
    /// `self` is the `pending` put of a batch of that put alone, which
    /// borrows what the put names for as long as the token made of the
    /// answer ([`answer`], at the borrow of `stream`) may live.
    #[inline(always)]
    pub(super) unsafe fn lane(&self, stream: &Stream, local: Option<&LocalWindow>) -> Lane {
        // SAFETY: the caller's contract.
        unsafe { (self.lane)(self, stream, local) }
    }
}

/// What [`usual_put`] did, in two words (a `Result<InFlight>` is
/// eleven, an [`Error`]'s): `None`, nothing enqueued; the record's
/// sequence number; or the call that failed and its code. Made into the
/// token or the error by [`answer`] where the enqueue returns it, not
/// made inside the lane and copied out through each caller (a one-put
/// batch 501 -> 485 instructions on `Null`, `benches/copy_batch.rs`).
pub(super) type Lane = Option<std::result::Result<u64, (Call, crate::Code)>>;

/// The token or the error of a lane's put on `stream` that was made.
#[inline(always)]
pub(super) fn answer(
    stream: &Stream,
    made: std::result::Result<u64, (Call, crate::Code)>,
) -> Result<InFlight<'_>> {
    match made {
        Ok(seq) => Ok(InFlight::new(stream, None, seq)),
        Err((call, code)) => Err(lane_error(&stream.inner.ctx, call, code)),
    }
}

/// The error of the lane's failed call: [`fabric_copy_error`] for the
/// fabric copy.
#[cold]
#[inline(never)]
fn lane_error(ctx: &Context, call: Call, code: crate::Code) -> Error {
    if call == Call::FabricCpyBatchAsync {
        return fabric_copy_error(ctx, code);
    }
    ctx.error(call, code)
}

/// What the lane's checks at the put's types found: the put's source
/// address, the bindings generation its facts were read at, and their
/// window on the portable path (`portable/local.rs`; `None`: where the put
/// lands is found under the lock at the put, `one_piece`).
#[derive(Clone, Copy)]
pub(super) struct Usual<'l> {
    pub(super) from: u64,
    pub(super) generation: u64,
    pub(super) local: Option<&'l LocalWindow>,
}

/// [`BatchInner::materialize`] at the put's types: the put made as
/// `put_slow` would have made it when it came, against the facts it was
/// checked against then (still `eps[0]`: nothing reaches the state
/// between), in `put_slow`'s order: the memory's keep-alive and location,
/// the endpoint's keep-alive, the cursor, F3's state, the op. (Not
/// `put_slow` itself, which checks it again: a batch of 64 puts 3,142 ->
/// 3,041 instructions, `Null`, `benches/copy_batch.rs`.)
///
/// # Safety
/// [`Deferred::parts`]'s.
unsafe fn make<H: MemShare, S: State, K: Kind>(inner: &mut BatchInner, d: &Deferred) {
    // SAFETY: the caller's contract.
    let (mem, ep) = unsafe { d.parts::<H, S, K>() };
    let (at, offset, size) = (d.at, d.offset, d.size);
    let Some((start, stop)) = inner
        .eps
        .first()
        .and_then(|f| BatchInner::first_hit_of(f, offset, size))
    else {
        // Not met (`defer` found this interval in these facts); checked
        // as it comes all the same.
        return inner.put_slow(mem, at, ep, offset, size);
    };
    let (ptr, len) = (mem.device_ptr(), mem.size());
    inner.keep.memory.push(mem.keep_alive());
    inner
        .locations
        .push((0, mem.locality(), mem.context().key(), (ptr, len)));
    let id = ep.id();
    inner.keep.endpoints.push((ep.range().clone(), id));
    // No wrap: `at < len` and `ptr + len` does not (`defer`); nor for
    // `end`, inside the interval.
    let (from, end) = (ptr.wrapping_add(at), offset.wrapping_add(size));
    inner.cursor = Cursor {
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
    inner.puts = true;
    inner.put_last = Some((id, end));
    inner.push(super::put_op(from, id, offset, size));
}

/// [`Deferred::lane`] at the put's types: what only the stream decides
/// (F2, the contexts; [`BatchInner::defer`] made the builder's checks),
/// then, where they pass, [`usual_put`], in this one erased call (its
/// keep made in place, not returned through memory and copied: a one-put
/// batch 518 -> 501 instructions on `Null`, `benches/copy_batch.rs`).
///
/// # Safety
/// [`Deferred::parts`]'s, for as long as `stream`.
unsafe fn lane<H: MemShare, S: State, K: Kind>(
    d: &Deferred,
    stream: &Stream,
    local: Option<&LocalWindow>,
) -> Lane {
    // SAFETY: the caller's contract.
    let (mem, ep) = unsafe { d.parts::<H, S, K>() };
    let s = &stream.inner;
    if !on_stream(mem, ep, &s.ctx, s.dev) {
        return None;
    }
    // No wrap: `at < len` and `ptr + len` does not (`defer`).
    let usual = Usual {
        from: mem.device_ptr().wrapping_add(d.at),
        generation: d.generation,
        local,
    };
    // SAFETY: `defer` made every check of the builder against the facts
    // read at `d.generation`, F2 and the contexts just above; the batch
    // borrows both for as long as `stream` (the caller's contract).
    unsafe { usual_put(stream, mem, ep, usual, d.offset, d.size) }
}

/// Whether a put from `mem` into `ep` is the lane's on a stream of `ctx`
/// on `dev` (what only the stream decides): the memory on that device
/// (F2), the memory and the endpoint of that context.
#[inline(always)]
pub(super) fn on_stream<H: MemShare, S: State, K: Kind>(
    mem: &Mapped<H>,
    ep: &Endpoint<S, K>,
    ctx: &Context,
    dev: Device,
) -> bool {
    matches!(mem.locality(), Locality::Device(x) if x == dev)
        && mem.context().key() == ctx.key()
        && ep.range().ctx.same(ctx)
}

/// What a put from `mem` into `ep` keeps alive until the stream passed it:
/// the two lists of one, made whole rather than pushed (a list of one
/// made at once asks nothing of where its items are).
#[inline(always)]
pub(super) fn keep_of<H: MemShare, S: State, K: Kind>(
    mem: &Mapped<H>,
    ep: &Endpoint<S, K>,
) -> Keep {
    Keep {
        memory: SmallVec::from_buf([mem.keep_alive()]),
        endpoints: SmallVec::from_buf([(ep.range().clone(), ep.id())]),
    }
}

/// A put of `size` bytes from `usual.from` (inside `mem`) into `ep` at
/// `offset`, past every check of the builder made against facts read at
/// the bindings generation `usual.generation`: inside the copy gate, those
/// facts compared with the range's (no bind or unbind since: F9, R13.3),
/// then one `cuFabricCpyBatchAsync` (or on the portable path one
/// `cuMemcpyAsync` inside one window), and the record, which keeps `mem`
/// and `ep`'s range until the stream passed it. `None` (nothing enqueued,
/// nothing held) where the facts are stale, a bind or unbind is in the
/// gate, or the portable path finds no one piece: the caller takes the
/// general path.
///
/// # Safety
/// `mem` and `ep` are borrowed for as long as the token made of the answer
/// ([`answer`], at the borrow of `stream`) may live; the put lies
/// inside `mem`, whose range does not wrap; `mem` is of the stream's
/// context and on its device, `ep` of that context (F2); the put lies
/// inside the first interval of `ep`'s facts read at `usual.generation`
/// (inside the endpoint, below its agreed top, bound on every device here:
/// F9, R13.3).
#[inline(always)]
pub(super) unsafe fn usual_put<H: MemShare, S: State, K: Kind>(
    stream: &Stream,
    mem: &Mapped<H>,
    ep: &Endpoint<S, K>,
    usual: Usual<'_>,
    offset: u64,
    size: u64,
) -> Lane {
    let range = ep.range();
    // SAFETY: the range is the one of the endpoint borrowed for as long as
    // `stream` (the caller's contract), past this call, where the gate
    // ends. By address, not by a clone of its `Arc`, and a gate of one
    // range, not `EnqueueGate`: a one-put batch 590 -> 578 instructions,
    // portable 754 -> 745 (`Null`, `benches/copy_batch.rs`,
    // `copy_portable.rs`, at `6389b46`).
    let gate = unsafe { OneGate::enter(&**range) }?;
    // Inside the gate: the facts are still the range's, and no bind or
    // unbind entered.
    if usual.generation != range.bindings_gen() || !gate.clear() {
        return None;
    }
    let id = ep.id();
    let op = super::put_op(usual.from, id, offset, size);
    let inner = &stream.inner;
    let ctx = &inner.ctx;
    // The one call, recorded inline (`record_one`): the fabric copy, or on
    // the portable path the copy to where the facts' window says the put
    // lands (read with them at `usual.generation`, compared above inside
    // the gate: every change to the windows moves it). Any other portable
    // put finds its window under the lock (`portable_put`).
    let made = if ctx.copy_path() == CopyPath::Fabric {
        call_recorded!(
            stream,
            mem,
            ep,
            range,
            id,
            Call::FabricCpyBatchAsync,
            // SAFETY: the id is a ready endpoint borrowed for as long as
            // `stream` (R13.1) and the op inside its bound interval (F9,
            // the facts current, compared inside the gate); one op is
            // independent (F3) and its memory local (F2); flags 0 (F5),
            // this stream (F6). Nothing is freed before the stream passed
            // the op (F4): the record made after keeps the memory and the
            // endpoint, as the guard does if the call unwinds.
            unsafe {
                ctx.driver()
                    .fabric_copy_batch(inner.handle, one_list(op), 0)
            }
        )
    } else if let Some(to) = usual.local.and_then(|w| w.to(offset, size)) {
        let c = super::portable::one_copy(usual.from, to, size)?;
        call_recorded!(
            stream,
            mem,
            ep,
            range,
            id,
            Call::MemcpyAsync,
            // SAFETY: as `Stream::memcpy_one`'s: local memory borrowed for
            // as long as `stream`, and the endpoint's bound memory mapped
            // here at the window's address (this process's bind by
            // address, kept by its binding until an unbind, which settles
            // the copy first), checked to cover the bytes (F9) and apart
            // (`one_copy`); the record made after keeps the memory and the
            // endpoint until the stream passed the copy (F4).
            unsafe {
                ctx.driver()
                    .memcpy_async(c.dst, c.src, c.size, inner.handle)
            }
        )
    } else {
        // SAFETY: the caller's contract.
        unsafe { portable_put(stream, mem, ep, op) }?
    };
    if made.is_ok() {
        // Past the record: an unbind that enters now settles the put
        // first.
        gate.end();
    }
    Some(made)
}

/// [`usual_put`]'s driver call `$call` (`$which`), a put from `$mem` into
/// `$ep` on `$stream`, and its record: what it uses in flight with the
/// stream, recorded inline, made where it is recorded (`record_one`); if
/// the call unwinds, recorded all the same (the driver may have taken the
/// op, F4). A macro: one shape for the fabric copy and the portable one,
/// pasted at each (through a function taking a closure, the closure's
/// call and the gate's drop went out of line on the portable path: a
/// one-put batch there 416 instructions against 393, `Null`,
/// `benches/copy_portable.rs`).
macro_rules! call_recorded {
    ($stream:expr, $mem:expr, $ep:expr, $range:expr, $id:expr, $which:expr, $call:expr) => {{
        // A panic inside the call (a `tracing` layer, a user backend) may
        // come after the driver took the op: what it uses stays in
        // flight, kept by the stream until it is synchronized (F4).
        let mut nothing = ();
        let guard = OnUnwindWith::new(&mut nothing, |(): &mut ()| unwound($stream, $mem, $ep));
        let r = $call;
        guard.disarm();
        match r {
            Ok(()) => {
                Ok($stream
                    .inner
                    .record_one($range, $id, SmallVec::from_buf([$mem.keep_alive()])))
            }
            Err(code) => Err(($which, code)),
        }
    }};
}
use call_recorded;

/// [`usual_put`]'s portable put that the facts' window does not hold: its
/// window found under the range's lock (`one_piece`: a peer's, holding
/// its mapping too), the copy, its record (out of line); `None` (nothing
/// enqueued, nothing held) where no one window holds it. Inside the gate
/// the caller entered.
///
/// # Safety
/// [`usual_put`]'s.
#[inline(never)]
unsafe fn portable_put<H: MemShare, S: State, K: Kind>(
    stream: &Stream,
    mem: &Mapped<H>,
    ep: &Endpoint<S, K>,
    op: CopyOp,
) -> Lane {
    let inner = &stream.inner;
    let mut keep = keep_of(mem, ep);
    // SAFETY: the endpoint on `op`'s id is borrowed for as long as `stream`.
    let c = unsafe { super::portable::one_piece_of(op, &keep.endpoints, &mut keep.memory) }?;
    let guard = OnUnwindWith::new(&mut keep, |k: &mut Keep| {
        inner.record(std::mem::take(k));
    });
    // SAFETY: as `Stream::memcpy_one`'s: local memory borrowed for as long
    // as `stream` and a window's memory mapped here, checked to cover the
    // bytes (F9) and apart (`one_piece`); the record made below keeps both
    // until the stream passed the copy (F4).
    let r = unsafe {
        inner
            .ctx
            .driver()
            .memcpy_async(c.dst, c.src, c.size, inner.handle)
    };
    guard.disarm();
    Some(match r {
        Ok(()) => Ok(inner.record_on(ep.range(), keep)),
        Err(code) => Err((Call::MemcpyAsync, code)),
    })
}

/// The record of a put from `mem` into `ep` on `stream` whose driver call
/// unwound: what it uses stays in flight until the stream is synchronized
/// (F4). Out of line, the unwinding path: the lane's one record inline is
/// its usual one.
#[cold]
#[inline(never)]
fn unwound<H: MemShare, S: State, K: Kind>(stream: &Stream, mem: &Mapped<H>, ep: &Endpoint<S, K>) {
    stream.inner.record(keep_of(mem, ep));
}

/// The driver's list of the one op `op`, made where the call takes it.
/// Inline, at the call: made aside in a function of its own, it was
/// copied into the call's argument (a one-put batch 416 -> 401
/// instructions on `Null`, `benches/copy_batch.rs`; the route's put made
/// it inline already). (Before the lane was one erased call, the reverse
/// held: 605 -> 555 out of line.)
#[inline(always)]
fn one_list(op: CopyOp) -> CopyOps {
    let mut ops = CopyOps::new();
    ops.push(op);
    ops
}

impl BatchInner {
    /// Keeps a batch's first put (op 0 of a batch that holds nothing yet)
    /// as its arguments where it passes now every check `put_slow` makes:
    /// inside its memory (which does not wrap the address space), and its
    /// endpoint's facts those the batch before kept (`memo::Memo`, so they
    /// are the range's now, bound here), the op inside their first
    /// interval (inside the endpoint, below its agreed top, bound on every
    /// device here: F9, R13.3): `true`. `false` (nothing written) for any
    /// other put, which the caller makes as it comes: so a put refused when
    /// it was built is refused at enqueue, as in a longer batch, whatever
    /// changed between.
    #[inline(always)]
    pub(super) fn defer<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Option<()> {
        // Every builder call that keeps something (a keep-alive, a host
        // buffer) appends its op, or defers it: with neither, the batch
        // holds nothing yet. Not asked of the keep lists and the host
        // buffers themselves (a one-put batch 448 -> 436 instructions on
        // `Null`, `benches/copy_batch.rs`); the errors are, as what would
        // refuse the batch.
        let fresh = self.list.is_empty()
            && self.pending.is_none()
            && self.error.is_none()
            && self.ep_error.is_none();
        debug_assert!(
            !fresh
                || (self.keep.memory.is_empty()
                    && self.keep.endpoints.is_empty()
                    && self.host.is_none())
        );
        // `mapped_slow`'s range check and its test of the memory's end.
        let len = mem.size();
        let inside = at < len
            && at.checked_add(size).is_some_and(|end| end <= len)
            && mem.device_ptr().checked_add(len).is_some();
        // `endpoint`'s test of the facts kept, then `put_to_slow`'s, on
        // what the memo says of them (`eps[0]`, not read).
        let memo = self.memo.as_ref()?;
        if !(fresh && inside && self.eps.len() == 1 && memo.holds(ep)) {
            return None;
        }
        let generation = memo.generation;
        memo.first_hit(offset, size)?;
        self.pending = Some(Deferred {
            mem: NonNull::from(mem).cast(),
            ep: NonNull::from(ep).cast(),
            at,
            offset,
            size,
            generation,
            make: make::<H, S, K>,
            lane: lane::<H, S, K>,
        });
        Some(())
    }

    /// The deferred first put made (if there is one): the state as the
    /// builder would have left it had it made the put as it came.
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
            // SAFETY: `d` was made by `defer` at the types its `make` was
            // made at, for this batch, whose borrows hold while its state
            // is reached (`pending`).
            unsafe { (d.make)(self, &d) };
        }
    }
}

/// The error of a failed `cuFabricCpyBatchAsync`: `NOT_SUPPORTED` (F7) is
/// [`Error::Unsupported`] naming the driver version and the portable path.
#[cold]
#[inline(never)]
pub(crate) fn fabric_copy_error(ctx: &crate::Context, code: crate::Code) -> Error {
    if code != crate::Code::NOT_SUPPORTED {
        return ctx.error(Call::FabricCpyBatchAsync, code);
    }
    let version = ctx.driver_version();
    let detail = match version {
        Some(v) if v < crate::driver::FABRIC_COPY_MIN_VERSION => {
            "the driver has no cuFabricCpyBatchAsync: it exists from CUDA 13.5 on"
        }
        _ => "the driver answered NOT_SUPPORTED: no logical endpoints here",
    };
    Error::unsupported(crate::error::Feature::FabricCopy, version, detail)
}

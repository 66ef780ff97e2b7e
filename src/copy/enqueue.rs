//! A checked [`CopyBatch`] on the driver: [`Stream::enqueue`].
//!
//! What this file owns: the enqueue of a batch (the copy gate, the checks,
//! the choice of path: `cuFabricCpyBatchAsync` here, `portable/`
//! otherwise), the op list as the driver takes it ([`FabricList`], which
//! `graph.rs` captures too), and the record of what the batch keeps alive.

use super::{BatchInner, CopyBatch, HostBufs, InFlight};
use crate::driver::CopyOps;
use crate::error::Result;
use crate::ledger::holds::Keep;
use crate::stream::Stream;
use crate::unwind::OnUnwindWith;

impl Stream {
    /// Enqueues `batch` (one `cuFabricCpyBatchAsync`, flags 0) after every
    /// check of [`CopyBatch`]; the copies run when the stream reaches them.
    /// On the portable path ([`Context::copy_path`](crate::Context::copy_path))
    /// the same batch runs through the endpoints' windows (a bring-up's
    /// `agree_bound` registers peers';
    /// [`Endpoint::add_peer_window`](crate::Endpoint::add_peer_window) by
    /// hand): pieces laid end to end on both sides (in one allocation here
    /// and one bound memory there) grown into one copy, then a batch of one
    /// piece as one `cuMemcpyAsync`, of
    /// several as one `cuMemcpyBatchAsync` where the driver has it (CUDA
    /// 12.8 on), else one `cuMemcpyAsync` per piece.
    ///
    /// # Errors
    /// [`Error::CopyOutOfRange`](crate::Error::CopyOutOfRange), [`Error::CopyNotBound`](crate::Error::CopyNotBound),
    /// [`Error::CopyPeerNotBound`](crate::Error::CopyPeerNotBound),
    /// [`Error::CopyNotLocal`](crate::Error::CopyNotLocal), [`Error::CopyNotAccessible`](crate::Error::CopyNotAccessible),
    /// [`Error::CopyDependent`](crate::Error::CopyDependent), [`Error::WrongContext`](crate::Error::WrongContext), and on the
    /// portable path [`Error::CopyNoWindow`](crate::Error::CopyNoWindow) and [`Error::CopyOntoItself`](crate::Error::CopyOntoItself),
    /// before the driver; [`Error::Driver`](crate::Error::Driver) from
    /// the call; [`Error::Unsupported`](crate::Error::Unsupported) ([`Feature::FabricCopy`](crate::error::Feature::FabricCopy),
    /// naming the driver version) on the fabric path where the driver has
    /// no fabric copy (before 13.5, F7: a context that chose its path from
    /// the driver, as [`Context::auto`](crate::Context::auto) does, takes
    /// the portable path there and never meets it). Nothing was
    /// enqueued then (the portable path synchronizes what it had enqueued
    /// before a failed `cuMemcpyAsync`), and the host buffers are dropped
    /// with the batch.
    // Always, and only the state passed on (its hot part parked in it): a
    // batch whose address reaches a call lives in memory, and its
    // builder's loop with it.
    #[inline(always)]
    pub fn enqueue<'a>(&'a self, batch: CopyBatch<'a>) -> Result<InFlight<'a>> {
        let CopyBatch { hot, mut inner, .. } = batch;
        // One call, not two: a one-put batch 656 -> 639 instructions
        // (`Null`, `benches/copy_batch.rs`). Nothing to park: every
        // builder call after a deferred put makes it first, so the hot part
        // is still the one `CopyBatch::cold` took after it (526 -> 518).
        // The put read where it is, not taken out and passed (436 -> 427).
        if inner.pending.is_some() {
            return self.enqueue_one(inner);
        }
        hot.park(&mut inner);
        self.enqueue_state(inner)
    }

    /// [`Stream::enqueue`] of a batch's state, its hot part parked.
    #[inline(never)]
    fn enqueue_state<'a>(&'a self, mut inner: Box<BatchInner>) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        // No unbind on these ranges from another thread between the checks
        // below and the record of the batch as in flight (F4), nor a bind's
        // record passing them before the driver bound it (R13.3). (The
        // portable path's windows of a bind in progress never cover bytes
        // the checks passed: binds on one device never overlap, R5.9.)
        let gate = loop {
            // SAFETY: the ranges are those of the endpoints the batch
            // borrowed for 'a, past this call, where the gate ends (their
            // `Arc`s in the batch move to the stream's record, which another
            // thread's synchronize may let go before the gate ends). By
            // address, not by a clone of each `Arc`: a one-op batch 762 ->
            // 754 instructions, two atomic operations fewer (`Null`,
            // `benches/copy_batch.rs`).
            let gate = unsafe { crate::ledger::gate::EnqueueGate::enter(&inner.keep.endpoints) }?;
            inner.check_on(self)?;
            // In two steps, not `checked`: its `Result<Option<_>>` moved
            // the gate through memory three times (a one-op batch 917 ->
            // 901 instructions, portable 1,092 -> 1,078, on `Null`:
            // `benches/copy_batch.rs`, `benches/copy_portable.rs`).
            if gate.clear() {
                break gate;
            }
            gate.wait_for_changes()?;
        };
        if ctx.copy_path() == crate::CopyPath::Portable {
            let r = self.enqueue_portable(CopyBatch::of(inner));
            gate.end();
            return r;
        }
        self.enqueue_fabric(inner, gate)
    }

    /// [`Stream::enqueue`] of a batch whose first put is deferred: that put
    /// alone, where the one-put lane (`one.rs`) takes it, else made and
    /// [`Stream::enqueue_state`].
    // Always, into `enqueue`: one call fewer on the usual small message (a
    // one-put batch 386 -> 360 instructions on `Null`, portable 444 -> 418,
    // `benches/copy_batch.rs`, `copy_portable.rs`).
    #[inline(always)]
    fn enqueue_one<'a>(&'a self, mut inner: Box<BatchInner>) -> Result<InFlight<'a>> {
        // A batch whose first put is deferred is that put alone: any other
        // builder call made it first (`CopyBatch::cold`).
        debug_assert!(inner.list.is_empty());
        let lane = match &inner.pending {
            Some(d) => {
                // The memo is the one it was checked against (`defer`): no
                // builder call came between.
                debug_assert!(
                    inner
                        .memo
                        .as_ref()
                        .is_some_and(|m| m.generation == d.generation)
                );
                let local = inner.memo.as_ref().and_then(|m| m.local.as_ref());
                // SAFETY: the deferred put of a batch of that put alone,
                // which borrows what it names for 'a.
                unsafe { d.lane(self, local) }
            }
            None => None,
        };
        if let Some(made) = lane {
            inner.pending = None;
            super::spare::give_back_empty(inner);
            return super::one::answer(self, made);
        }
        inner.materialize();
        self.enqueue_state(inner)
    }

    /// The fabric call of a checked batch, inside its gate, and its record:
    /// the end of [`Stream::enqueue_state`].
    #[inline(always)]
    fn enqueue_fabric<'a>(
        &'a self,
        mut inner: Box<BatchInner>,
        gate: impl crate::ledger::gate::EndGate,
    ) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        // A panic inside the call (a `tracing` layer, a user backend) may
        // come after the driver took the batch: what the copies use stays
        // in flight then, kept by the stream until it is synchronized, and
        // the host buffers are leaked, never freed under a copy (F4). Armed
        // before the op list is taken, so that the list is made where the
        // call takes it (taken first and moved in, it was one more copy of
        // its inline ops: a one-op batch 1,159 -> 1,129 instructions on `Null`,
        // `benches/copy_batch.rs`).
        let stream = &self.inner;
        let mut guard = OnUnwindWith::new(&mut *inner, |b: &mut BatchInner| {
            b.leave_in_flight(stream);
        });
        // SAFETY: every id is a ready endpoint borrowed for 'a (R13.1) whose
        // ranges were checked against the bindings this process knows (F9);
        // the ops are independent (F3, checked) and local (F2, checked);
        // the flags are 0 (F5) and the stream is this one (never NULL, F6).
        // Nothing is freed before the stream passed the ops (F4): the
        // memory and endpoints are kept by the record made just below (and
        // borrowed by the token), and the host buffers are owned by the
        // token, freed only after a synchronize or leaked when it is forgotten.
        // The op list goes to the driver, made in the call's argument; the
        // rest stays in the batch's state until it is recorded.
        let r = unsafe {
            ctx.driver()
                .fabric_copy_batch(self.inner.handle, guard.value().take_list(), 0)
        };
        guard.disarm();
        if let Err(code) = r {
            // Nothing enqueued: what the batch holds is dropped with it.
            drop(inner);
            return Err(super::one::fabric_copy_error(ctx, code));
        }
        let seq = self.inner.record(std::mem::take(&mut inner.keep));
        gate.end();
        let token = InFlight::new(self, inner.host.take(), seq);
        super::spare::give_back(inner);
        Ok(token)
    }
}

impl BatchInner {
    /// Every check before the driver for a copy on `stream`, its hot part
    /// parked: the builder's last word ([`BatchInner::finish`]), then
    /// [`BatchInner::check`].
    // Always: out of line, a one-op batch cost 23 instructions more (829
    // -> 806 on `Null`, `benches/copy_batch.rs`; portable 1,020 -> 1,003).
    #[inline(always)]
    pub(crate) fn check_on(&mut self, stream: &Stream) -> Result<()> {
        self.finish();
        self.check(&stream.inner.ctx, stream.inner.dev)
    }
}

/// A checked batch as the driver takes it, with what it keeps and owns.
pub(crate) struct FabricList {
    pub(crate) list: CopyOps,
    pub(crate) keep: Keep,
    pub(crate) host: Option<Box<HostBufs>>,
}

impl<'a> CopyBatch<'a> {
    /// Every check before the driver for a copy on `stream`
    /// ([`BatchInner::check_on`]).
    pub(crate) fn check_for(&mut self, stream: &Stream) -> Result<()> {
        self.cold(|inner| inner.check_on(stream))
    }

    /// The driver's op list of a checked batch (the builder wrote it): its
    /// host buffers by address (owned by what takes the list, which keeps
    /// them where they are).
    pub(crate) fn into_list(self) -> FabricList {
        let mut inner = self.parked();
        let list = FabricList {
            list: inner.take_list(),
            keep: std::mem::take(&mut inner.keep),
            host: inner.host.take(),
        };
        super::spare::give_back(inner);
        list
    }
}

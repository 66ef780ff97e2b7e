//! The portable data path (issue 19, item 4; a child of `copy`, issue 27,
//! item 3): on drivers without `cuFabricCpyBatchAsync` (before 13.5, and
//! the classic fallback) the same [`crate::CopyBatch`] runs as copies
//! through memory this process has mapped for every target of the
//! endpoint: one `cuMemcpyBatchAsync` for a batch of several pieces where
//! the driver has it (12.8+, issue 30 item 5), else one `cuMemcpyAsync`
//! per piece.
//!
//! What this file owns (the choice of path, [`crate::CopyPath`], is the context's:
//! [`crate::Context::copy_path`]):
//! - the *windows* of an endpoint: where this process reaches the memory
//!   bound at an endpoint offset on each target (the owner of a unicast
//!   endpoint, every member of a multicast team). A window is
//!   `(member, endpoint offset, size, local address)`, kept in the id's range
//!   beside its bindings (`range::Attachments`), and made
//!   (a) by a bind of `Mapped` memory in this process (or a raw address),
//!   removed with its unbind, and
//!   (b) for a member in another process, by a bring-up's `agree_bound`
//!   ([`crate::team::SharedTeam::agree_bound`]; `team::windows` imports
//!   and registers every peer's shareable memory) and by a heap's
//!   [`crate::team::OwnedPeers::grow`] for each new chunk (removed by its
//!   `shrink`), or by hand with
//!   [`Endpoint::add_peer_window`] with the peer's memory imported
//!   (POSIX descriptor within a node, fabric handle across, R12.4) and
//!   mapped here; such a window keeps that mapping alive until the endpoint
//!   is destroyed;
//! - [`View`]: the windows of one endpoint of a checked batch, read once
//!   per batch under the range's lock, and [`View::resolve`]: one endpoint
//!   operand → the local address pieces of every target (no allocation per
//!   op; a cursor per target on the window that last matched), with the
//!   mapping of each peer window an op used held once per batch; an error
//!   before the driver ([`Error::CopyNoWindow`]) when a target's bytes have
//!   no window; and the usual batch without a view (`one_piece`: one op
//!   inside one window of an endpoint's one target, found under the lock);
//! - pieces laid end to end on both sides, inside one allocation here and
//!   one window there, grown into one copy (`view::Grow`: a run of small
//!   puts or gets of contiguous bytes is one `cuMemcpyAsync`, not one per
//!   op; `benches/gpu_copy.rs`, "small puts end to end");
//! - which call carries the pieces: `cuMemcpyBatchAsync` (one call, one
//!   attribute for all: source in stream order, no hints) when the driver
//!   reports 12.8+ and the pieces are several, none host memory of the
//!   process and none dependent on another (`batchable_in`); else, and for
//!   good on a context whose driver refused the batch call once
//!   (`NOT_SUPPORTED`: a driver without `cuMemcpyBatchAsync_v2`;
//!   `NOT_PERMITTED`: `CUDA_ENDPOINTS_DENY=cuMemcpyBatchAsync`), one
//!   `cuMemcpyAsync` per piece. A failed batch call is synchronized as a
//!   failed loop is: cuda.h does not say it enqueued nothing.
//!
//! A window names memory, not a binding: if a peer rebinds other memory at
//! those offsets, the window still reaches the old memory (kept alive, never
//! freed under a copy) until it is registered again on a new endpoint.
//!
//! What a batch in flight holds (F4), each memory once, whatever the number
//! of ops and bindings: the id range of each endpoint it names (as on the
//! fabric path), whose binding records keep this process's bound memory
//! until unbind or destroy, which settle the copies in flight on the id
//! first; and the mapping of each peer window a copy goes through, once
//! (a window can be replaced or removed without a settle).
//!
//! The files: this one (an endpoint's windows, the enqueue), `local.rs`
//! (the usual put's window, read with an endpoint's facts), `view.rs`
//! ([`View`], resolving the ops, `one_piece`, [`Holds`]) and `call.rs`
//! (which call carries the pieces).

use std::sync::atomic::Ordering;

use crate::copy::{CopyBatch, InFlight};
use crate::driver::{Call, Device};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent, Result, Rule};
use crate::kind::Kind;
use crate::kind::MemShare;
use crate::memory::{BindSource, KeepAlive, Mapped};
use crate::state::{IsReady, State};
use crate::stream::Stream;
use crate::unwind::OnUnwind;
use crate::window::{Member, Window};

impl<S: State + IsReady, K: Kind> Endpoint<S, K> {
    /// Registers, for the portable path ([`CopyPath::Portable`](crate::CopyPath::Portable)), where this
    /// process reaches the memory that `device` of the process `rank` bound
    /// at `offset` of this endpoint: `mem`, that memory imported here
    /// (`Allocation::<PosixFd>::import_fd` within a node,
    /// `Allocation::<FabricShareable>::import_fabric` across, R12.4) and mapped with
    /// access for the devices this process copies on. It covers
    /// `offset..offset + mem.size()`.
    ///
    /// `rank` tells the processes of the team apart (any number the ranks
    /// agree on); the owner of a unicast endpoint is one member, a
    /// multicast team has one per team device. Memory this process binds by
    /// address needs no window: the bind makes one.
    ///
    /// The endpoint keeps `mem`'s mapping alive until it is destroyed, and
    /// a copy in flight keeps it until the stream passed the copy.
    ///
    /// # Errors
    /// [`Error::WrongContext`]; [`Error::OutOfRange`] when the window
    /// reaches past the endpoint; [`Error::Overlap`] when it overlaps a
    /// window of the same member; [`Error::PeerWindowNoTarget`] when
    /// `(rank, device)` would be one target more than the endpoint has:
    /// every target is a device of this process (a unicast endpoint it
    /// created), or every other one is named already.
    pub fn add_peer_window<H: MemShare>(
        &self,
        rank: u32,
        device: impl Into<Device>,
        offset: u64,
        mem: &Mapped<H>,
    ) -> Result<()> {
        if !mem.context().same(self.context()) {
            return Err(Error::WrongContext {
                pair: crate::error::ContextPair::MemoryForEndpoint,
            });
        }
        let device = device.into();
        let size = mem.size();
        let ep_size = self.size();
        let Some(end) = offset.checked_add(size).filter(|&e| e <= ep_size) else {
            return Err(Error::OutOfRange {
                what: Extent::EndpointRange,
                offset,
                size,
                limit: ep_size,
                rule: Rule::R5_4,
            });
        };
        let member = Member::Peer { rank, device };
        let mut slot = self.slot();
        // One target more than the endpoint has would make every portable
        // copy through it fail: refused here, where the cause is.
        let here = self.devices().len();
        let mut peers: Vec<Member> = Vec::new();
        for w in slot.windows() {
            if matches!(w.member, Member::Peer { .. }) && !peers.contains(&w.member) {
                peers.push(w.member);
            }
        }
        let targets = self.facts().team_size;
        let named = here.saturating_add(peers.len());
        if !peers.contains(&member) && u32::try_from(named).map_or(true, |n| n >= targets) {
            return Err(Error::PeerWindowNoTarget {
                id: self.id(),
                rank,
                device,
                targets,
                here: u32::try_from(here).unwrap_or(u32::MAX),
                peers: u32::try_from(peers.len()).unwrap_or(u32::MAX),
            });
        }
        if let Some(w) = slot
            .windows()
            .find(|w| w.member == member && w.offset < end && offset < w.end())
        {
            return Err(Error::Overlap {
                device,
                offset,
                size,
                other_offset: w.offset,
                other_size: w.size,
            });
        }
        slot.push_window(Window {
            member,
            offset,
            size,
            addr: mem.device_ptr(),
            keep: Some(mem.keep_alive()),
        });
        Ok(())
    }
}

/// One binding of this process as the bring-ups' agreement exports it for
/// peers (`team::windows`): where it is in the endpoint, its address here
/// (`None` for a bind by handle), and the memory it keeps alive.
pub(crate) struct LocalBind {
    pub device: Device,
    pub offset: u64,
    pub size: u64,
    pub addr: Option<u64>,
    pub keep: Option<KeepAlive>,
}

/// Every binding of `ep` in this process, taken under the lock (the memory
/// is exported after it is let go: an export is a driver call).
pub(crate) fn local_binds<S: State, K: Kind>(ep: &Endpoint<S, K>) -> Vec<LocalBind> {
    let slot = ep.slot();
    slot.bindings
        .iter()
        // Not a record whose bind or unbind unwound: it covers no byte.
        .filter(|b| b.covers())
        .map(|b| LocalBind {
            device: b.dev,
            offset: b.offset,
            size: b.size,
            addr: slot
                .windows()
                .find(|w| w.is_local(b.dev, b.offset))
                .map(|w| w.addr),
            keep: b._keep.clone(),
        })
        .collect()
}

impl<S: State + IsReady, K: Kind> Endpoint<S, K> {
    /// Registers the window of `device` of process `rank` at
    /// `offset..offset + size`, reached here at `addr` in memory `keep`
    /// keeps mapped, replacing that member's windows it overlaps (an
    /// agreement run again after peers rebound, or one added by hand).
    /// Returns the replaced windows, for the caller to drop outside any
    /// lock (a copy in flight keeps their memory itself). The caller
    /// checked the range against the endpoint.
    pub(crate) fn set_peer_window(
        &self,
        rank: u32,
        device: Device,
        offset: u64,
        size: u64,
        addr: u64,
        keep: KeepAlive,
    ) -> Vec<Window> {
        let member = Member::Peer { rank, device };
        let end = offset.saturating_add(size);
        let mut slot = self.slot();
        let replaced =
            slot.take_windows(|w| w.member == member && w.offset < end && offset < w.end());
        slot.push_window(Window {
            member,
            offset,
            size,
            addr,
            keep: Some(keep),
        });
        replaced
    }
}

impl<S: State + IsReady, K: Kind> Endpoint<S, K> {
    /// Removes the windows of process `rank` that overlap
    /// `offset..offset + size` (a heap's top chunk, unbound by its owner
    /// after an agreement, R13.7). Returns them, for the caller to drop
    /// outside any lock (a copy in flight keeps their memory itself).
    pub(crate) fn remove_peer_windows(&self, rank: u32, offset: u64, size: u64) -> Vec<Window> {
        let end = offset.saturating_add(size);
        self.slot().take_windows(|w| {
            matches!(w.member, Member::Peer { rank: r, .. } if r == rank)
                && w.offset < end
                && offset < w.end()
        })
    }
}

mod call;
mod local;
mod view;
use call::*;
pub(crate) use local::{LocalWindow, one_copy};
use view::*;

/// [`view::one_piece`] of the batch of `op` alone on `endpoints`: the
/// route's put (`copy/route.rs`).
///
/// # Safety
/// As `one_piece`'s: the endpoints of `endpoints` are borrowed while the
/// result is used.
#[inline(always)]
pub(crate) unsafe fn one_piece_of(
    op: crate::driver::CopyOp,
    endpoints: &[(std::sync::Arc<crate::ledger::RangeInner>, u32)],
    memory: &mut crate::ledger::holds::KeepMemory,
) -> Option<crate::driver::MemcpyOp> {
    // SAFETY: the caller's contract.
    unsafe { one_piece(std::slice::from_ref(&op), endpoints, memory) }
}

impl Stream {
    /// [`Stream::enqueue`] on the portable path, for a batch that passed
    /// every check of the fabric path: each endpoint operand resolved to its
    /// targets' windows (before the driver; the one-op batch inside one
    /// window without a [`View`]: [`one_piece`]), then the target pieces as one
    /// `cuMemcpyBatchAsync` where the driver has it (12.8+) and the pieces
    /// allow it ([`batchable_in`]: several, no host memory, none dependent on
    /// another), else one `cuMemcpyAsync` per piece (a batch of one piece
    /// always: the call a raw program makes). The batch's state stays in
    /// its box, which goes back to the process's spare with its op list's
    /// room (the next batch's list allocates nothing).
    pub(crate) fn enqueue_portable<'a>(&'a self, batch: CopyBatch<'a>) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        let mut inner = batch.parked();
        let b = &mut *inner;
        let (list, memory, endpoints) = (&b.list, &mut b.keep.memory, &b.keep.endpoints);
        let spans = &b.locations[..];
        // The one-piece batch's copy, else every piece.
        // SAFETY: the batch borrows its endpoints for 'a, past this call.
        if let Some(c) = unsafe { one_piece(list, endpoints, memory) } {
            return self.memcpy_one(inner, c);
        }
        // SAFETY: as for `one_piece`.
        let (mut copies, order) = match unsafe { resolve(list, spans, endpoints, memory) } {
            Ok(copies) => copies,
            Err(e) => {
                // Nothing enqueued: what the batch holds is dropped with it.
                super::spare::give_back(inner);
                return Err(e);
            }
        };
        // A piece is never empty (an op of 0 bytes has none, validated
        // above): nothing to move, no call.
        let handle = self.inner.handle;
        let mut enqueued = 0usize;
        let mut failed = None;
        let mut looped = true;
        let b = &mut *inner;
        // A panic inside a call (a `tracing` layer, a user backend) may come
        // after the driver took copies: what they use stays in flight,
        // kept by the stream until it is synchronized, and the host buffers
        // are leaked, never freed under a copy (F4).
        let guard = OnUnwind::new(|| b.leave_in_flight(&self.inner));
        if let Some(learned) = batch_call(ctx).filter(|_| batchable_in(&copies, &order)) {
            let n = copies.len();
            // Until the driver took one batch call, the pieces stay for the
            // loop in case it refuses it; after, they go to it.
            let list = if learned == BATCH_WORKS {
                std::mem::take(&mut copies)
            } else {
                copies.clone()
            };
            // SAFETY: as for each `cuMemcpyAsync` below, for every copy;
            // and no copy writes bytes another reads or writes (checked by
            // `batchable_in`), so the batch's lack of order among its copies
            // changes nothing.
            match unsafe { ctx.driver().memcpy_batch_async(list, handle) } {
                Ok(()) => {
                    looped = false;
                    enqueued = n;
                    if learned != BATCH_WORKS {
                        ctx.memcpy_batch().store(BATCH_WORKS, Ordering::Relaxed);
                    }
                }
                Err(code) if refused(code) => {
                    tracing::info!(target: "cuda_endpoints::portable", %code, "cuMemcpyBatchAsync refused: one cuMemcpyAsync per piece from now on");
                    ctx.memcpy_batch().store(BATCH_REFUSED, Ordering::Relaxed);
                    // Refused after it worked (a deny set later): the
                    // pieces went with the call; nothing was enqueued.
                    if learned == BATCH_WORKS {
                        looped = false;
                        failed = Some((Call::MemcpyBatchAsync, code));
                    }
                }
                Err(code) => {
                    // cuda.h does not say that a failed batch enqueued
                    // nothing: it is synchronized below as if all were.
                    looped = false;
                    enqueued = n;
                    failed = Some((Call::MemcpyBatchAsync, code));
                }
            }
        }
        if looped {
            for c in &copies {
                // SAFETY: `dst` and `src` are local memory of the batch (borrowed
                // for 'a, or owned host buffers) or windows' memory, mapped in
                // this process and checked to cover the bytes (F9, resolved
                // above); they do not overlap (checked). Nothing is freed before
                // the stream passed the copy (F4): the record made below keeps
                // the local memory, the windows' mappings and the endpoints' id
                // ranges, whose binding records keep the bound memory until an
                // unbind or destroy settles this stream, and the host buffers are owned
                // by the token; on a failure, what was enqueued is synchronized
                // (or, if that fails, leaked) before anything is dropped.
                let r = unsafe { ctx.driver().memcpy_async(c.dst, c.src, c.size, handle) };
                if let Err(code) = r {
                    failed = Some((Call::MemcpyAsync, code));
                    break;
                }
                enqueued = enqueued.saturating_add(1);
            }
        }
        guard.disarm();
        let b = &mut *inner;
        if let Some((call, code)) = failed {
            let e = ctx.error(call, code);
            if enqueued > 0 {
                self.inner.record(std::mem::take(&mut b.keep));
                if self.inner.synchronize().is_err() {
                    std::mem::forget(b.host.take());
                }
            }
            super::spare::give_back(inner);
            return Err(e);
        }
        let seq = self.inner.record(std::mem::take(&mut b.keep));
        let token = InFlight::new(self, b.host.take(), seq);
        super::spare::give_back(inner);
        Ok(token)
    }

    /// A batch of one piece `c` (one op inside one window): one
    /// `cuMemcpyAsync`, nothing to ask, and its record; the end of
    /// [`Stream::enqueue_portable`].
    // Always: out of line, a one-piece batch cost 12 instructions more
    // (805 -> 817 on `Null`, `benches/copy_portable.rs`).
    #[inline(always)]
    fn memcpy_one<'a>(
        &'a self,
        mut inner: Box<crate::copy::BatchInner>,
        c: crate::driver::MemcpyOp,
    ) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        let b = &mut *inner;
        // A panic inside the call (a `tracing` layer, a user backend) may
        // come after the driver took the copy: what it uses stays in
        // flight, kept by the stream until it is synchronized, and the host
        // buffers are leaked, never freed under a copy (F4).
        let guard = OnUnwind::new(|| b.leave_in_flight(&self.inner));
        // SAFETY: as for each `cuMemcpyAsync` of `enqueue_portable`: local
        // memory of the batch (borrowed for 'a, or an owned host buffer)
        // and a window's memory, mapped here and checked to cover the
        // bytes (F9), apart (`one_piece`); the record made below keeps both
        // until the stream passed the copy (F4).
        let r = unsafe {
            ctx.driver()
                .memcpy_async(c.dst, c.src, c.size, self.inner.handle)
        };
        guard.disarm();
        if let Err(code) = r {
            // Nothing enqueued: what the batch holds is dropped with it.
            super::spare::give_back(inner);
            return Err(ctx.error(Call::MemcpyAsync, code));
        }
        let seq = self.inner.record(std::mem::take(&mut b.keep));
        let token = InFlight::new(self, b.host.take(), seq);
        super::spare::give_back(inner);
        Ok(token)
    }
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::{Holds, Pieces, View};
    use crate::ledger::holds::KeepMemory;
    use crate::model::ModelConfig;
    use crate::{Allocation, Context, CopyBatch, CopyPath, Device, Mapped, Private, Spec, Stream};

    const ALIGN: u64 = 2 << 20;
    const OPS: u64 = 8;

    /// What a batch of `OPS` puts into the first of `n` bindings (by
    /// address, each its own memory) holds while in flight on the portable
    /// path: the keep-alives its ops' windows add, and every reference to
    /// the bound memory and the source beyond their owners and bindings.
    fn held_against(n: u64) -> (Vec<usize>, usize) {
        let (ctx, model) = Context::model(ModelConfig {
            driver_version: 13050,
            ..ModelConfig::node(1)
        });
        ctx.set_copy_path(CopyPath::Portable);
        let map = || -> Mapped<Private> {
            Allocation::on_device(&ctx, 0, ALIGN)
                .and_then(|a| a.map(&[0]).map_err(|f| f.error))
                .expect("memory on the model")
        };
        let ep = ctx
            .reserve_one()
            .expect("an id")
            .create(Spec::unicast(0, n * ALIGN))
            .expect("created")
            .wait(std::time::Duration::from_secs(5))
            .expect("a ready endpoint");
        let (src, mems): (Mapped<Private>, Vec<Mapped<Private>>) =
            (map(), (0..n).map(|_| map()).collect());
        let binds: Vec<_> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| ep.bind(Device(0), i as u64 * ALIGN, m).expect("bound"))
            .collect();
        // The view op by op: the keep-alives each use adds to the batch's.
        let mut view = View::new(ep.range(), ep.id(), &[Device(0)], 1);
        let mut pieces = Pieces::new();
        let mut keep = KeepMemory::new();
        let mut per_op = Vec::new();
        for k in 0..OPS {
            view.resolve(k as usize, k * 64, 64, &mut pieces)
                .expect("a window");
            assert_eq!(pieces.len(), 1);
            let used = view
                .wins
                .iter()
                .filter(|w| w.used && w.keep.is_some())
                .count();
            per_op.push(used);
        }
        view.hold_used(&mut Holds::new(&mut keep));
        assert!(
            keep.is_empty(),
            "a local binding's memory is held by its record"
        );
        drop(keep);
        // The whole path: the batch in flight, its token kept.
        let base: usize = mems.iter().map(Mapped::holders).sum::<usize>() + src.holders();
        let stream = Stream::new(&ctx, 0).expect("a stream");
        let batch = (0..OPS).fold(CopyBatch::new(), |b, k| {
            b.put(&src, k * 64, &ep, k * 64, 64)
        });
        let token = stream.enqueue(batch).expect("enqueued");
        let in_flight = mems.iter().map(Mapped::holders).sum::<usize>() + src.holders() - base;
        token.wait().expect("completed");
        drop((stream, binds));
        drop((ep, src, mems));
        assert!(ctx.take_teardown_errors().is_empty());
        assert!(model.violations().is_empty(), "{:?}", model.violations());
        (per_op, in_flight)
    }

    /// Issue 30, item 5: pieces go as one `cuMemcpyBatchAsync`, whose
    /// copies run in no order, only when that order cannot show: several
    /// pieces, none of host memory (which the `cuMemcpyAsync` loop stages),
    /// none writing bytes another reads or writes. Pieces of distinct
    /// endpoints may reach one memory through peer windows, which the
    /// batch's checks by id do not compare: the addresses are.
    #[test]
    fn only_independent_device_pieces_go_as_one_batch_call() {
        use super::batchable;
        use crate::driver::{MemcpyOp, Pointer};
        let op = |dst: u64, src: u64, size: u64| MemcpyOp {
            dst: Pointer::device(dst),
            src: Pointer::device(src),
            size,
        };
        let puts: Vec<MemcpyOp> = (0..64)
            .map(|k| op(0x10_000 + k * 128, 0x90_000 + k * 64, 64))
            .collect();
        assert!(batchable(&puts), "64 independent puts");
        assert!(!batchable(&puts[..1]), "one piece: cuMemcpyAsync");
        assert!(!batchable(&[]), "no piece");
        // Two pieces writing the same bytes (two endpoints, one memory).
        assert!(!batchable(&[
            op(0x1000, 0x9000, 64),
            op(0x1020, 0x9100, 64)
        ]));
        // A piece reading what another writes, before or after it.
        assert!(!batchable(&[
            op(0x1000, 0x9000, 64),
            op(0x2000, 0x1030, 64)
        ]));
        assert!(!batchable(&[
            op(0x2000, 0x1030, 64),
            op(0x1000, 0x9000, 64)
        ]));
        // Sources may overlap each other; touching ranges do not overlap.
        assert!(batchable(&[op(0x1000, 0x9000, 64), op(0x1040, 0x9000, 64)]));
        assert!(batchable(&[op(0x1000, 0x1040, 64), op(0x2000, 0x1080, 64)]));
        // Host memory of the process: the loop.
        let mut host = puts.clone();
        host[3].src = Pointer::host(0x7000_0000);
        assert!(!batchable(&host));
    }

    /// F4 kept without a copy per op and binding: the in-flight record of a
    /// portable batch holds its source once and the endpoint's id range
    /// (whose binding records keep the bound memory until an unbind or
    /// destroy, which settle the batch first), so what it holds is the
    /// same against 1 and 256 bindings (it held each binding's memory once
    /// per op: 8 × 256 keep-alives here).
    #[test]
    fn f4_a_portable_batch_in_flight_holds_as_much_against_1_binding_as_against_256() {
        let one = held_against(1);
        let many = held_against(256);
        assert_eq!(one, many, "(keep-alives added per op, held in flight)");
        assert_eq!(one, (vec![0; OPS as usize], 1), "the source alone");
    }
}

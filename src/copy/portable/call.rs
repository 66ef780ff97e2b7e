//! Which driver call carries a portable batch's pieces: one
//! `cuMemcpyBatchAsync` ([`batch_call`], [`batchable_in`] of the pieces'
//! [`Order`], gathered as they are made) or one
//! `cuMemcpyAsync` per piece, and what a context learned of the batch call
//! ([`refused`]). A child of `portable`.

use std::sync::atomic::Ordering;

use crate::context::Context;
use crate::driver::{Code, MEMCPY_BATCH_MIN_VERSION, MemHint, MemcpyOp};

/// What a context learned of `cuMemcpyBatchAsync` ([`Context::memcpy_batch`]):
/// 0, nothing yet (a batch call keeps the pieces for the loop, in case the
/// driver refuses it); that it works; that it was refused.
pub(super) const BATCH_WORKS: u8 = 1;
pub(super) const BATCH_REFUSED: u8 = 2;

/// Whether `ctx`'s copies of several pieces go to the driver as one
/// `cuMemcpyBatchAsync` (with what the context learned of it): its driver
/// reports 12.8 or later and has not refused the call (decided once per
/// context: [`refused`]).
pub(super) fn batch_call(ctx: &Context) -> Option<u8> {
    let learned = ctx.memcpy_batch().load(Ordering::Relaxed);
    let new_enough = ctx
        .driver_version()
        .is_some_and(|v| v >= MEMCPY_BATCH_MIN_VERSION);
    (learned != BATCH_REFUSED && new_enough).then_some(learned)
}

/// Whether the driver's answer to `cuMemcpyBatchAsync` says it has no such
/// call here, before it touched anything: `NOT_SUPPORTED` (the real backend
/// on a driver that does not export `cuMemcpyBatchAsync_v2`, 12.8 and 12.9
/// included; the model before 12.8) or `NOT_PERMITTED` (the call policy,
/// `CUDA_ENDPOINTS_DENY=cuMemcpyBatchAsync`). The context then takes the
/// `cuMemcpyAsync` loop for good.
pub(super) fn refused(code: Code) -> bool {
    code == Code::NOT_SUPPORTED || code == Code::NOT_PERMITTED
}

/// What [`batchable`] reads of the pieces, gathered as they are made
/// ([`Order::add`]; no second pass over them): host memory among them,
/// whether each destination starts at or past the end of the one before
/// (ascending and disjoint: the order the typed API's puts come in; then
/// the first starts lowest and the last ends highest), and the span of
/// all sources.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Order {
    host: bool,
    ascending: bool,
    dst_end: u64,
    s_lo: u64,
    s_hi: u64,
}

impl Order {
    /// No piece yet.
    pub(super) const NEW: Order = Order {
        host: false,
        ascending: true,
        dst_end: 0,
        s_lo: u64::MAX,
        s_hi: 0,
    };

    /// `c`, the next piece.
    #[inline(always)]
    pub(super) fn add(&mut self, c: &MemcpyOp) {
        self.host |= c.dst.hint == MemHint::Host || c.src.hint == MemHint::Host;
        self.ascending &= c.dst.ptr >= self.dst_end;
        self.dst_end = c.dst.ptr.saturating_add(c.size);
        self.s_lo = self.s_lo.min(c.src.ptr);
        self.s_hi = self.s_hi.max(c.src.ptr.saturating_add(c.size));
    }
}

/// Whether the pieces can go as one `cuMemcpyBatchAsync` with the same
/// outcome as the `cuMemcpyAsync` loop in stream order: at least two, none
/// hinted host memory of the process (possibly pageable: the loop's
/// `cuMemcpyAsync` stages it as the batch may not), and none writing bytes
/// another reads or writes (the batch runs its copies in no order; cuda.h
/// makes dependent copies undefined behaviour). Distinct endpoints or
/// windows may reach the same memory, which the batch's checks by id do
/// not see: the addresses are compared here.
#[cfg(test)]
pub(super) fn batchable(copies: &[MemcpyOp]) -> bool {
    let mut order = Order::NEW;
    for c in copies {
        order.add(c);
    }
    batchable_in(copies, &order)
}

/// [`batchable`] of `copies`, whose [`Order`] is `order`.
#[inline]
pub(super) fn batchable_in(copies: &[MemcpyOp], order: &Order) -> bool {
    let [first, .., _] = copies else {
        return false;
    };
    if order.host {
        return false;
    }
    if !order.ascending {
        return independent_sorted(copies);
    }
    // No source byte among the destinations' (the usual batch: one memory
    // read, another written): independent.
    let (d_lo, d_hi) = (first.dst.ptr, order.dst_end);
    if order.s_hi <= d_lo || d_hi <= order.s_lo {
        return true;
    }
    independent_ascending(copies)
}

/// [`batchable_in`] for ascending, disjoint destinations some source lies
/// among: whether any source meets a destination. Sorted by start, the
/// destinations' ends rise too: of those that start before a source
/// ends, the last reaches furthest.
#[cold]
#[inline(never)]
fn independent_ascending(copies: &[MemcpyOp]) -> bool {
    !copies.iter().any(|c| {
        let (start, end) = (c.src.ptr, c.src.ptr.saturating_add(c.size));
        let i = copies.partition_point(|d| d.dst.ptr < end);
        i > 0
            && copies
                .get(i - 1)
                .is_some_and(|d| d.dst.ptr.saturating_add(d.size) > start)
    })
}

/// [`batchable`]'s independence of copies whose destinations come in no
/// order: sorted by start first.
#[cold]
pub(super) fn independent_sorted(copies: &[MemcpyOp]) -> bool {
    // Inline for a few copies (a multicast put's, one per member): no
    // allocation per small batch (issue 30, `no_allocation` in `tests/copy`).
    let mut dsts: smallvec::SmallVec<[(u64, u64); 8]> = copies
        .iter()
        .map(|c| (c.dst.ptr, c.dst.ptr.saturating_add(c.size)))
        .collect();
    dsts.sort_unstable();
    if dsts.windows(2).any(|w| matches!(w, [a, b] if b.0 < a.1)) {
        return false;
    }
    !copies.iter().any(|c| {
        let (start, end) = (c.src.ptr, c.src.ptr.saturating_add(c.size));
        let i = dsts.partition_point(|d| d.0 < end);
        i > 0 && dsts.get(i - 1).is_some_and(|d| d.1 > start)
    })
}

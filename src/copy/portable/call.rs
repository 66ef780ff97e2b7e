//! Which driver call carries a portable batch's pieces: one
//! `cuMemcpyBatchAsync` ([`batch_call`], [`batchable`]) or one
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

/// Whether the pieces can go as one `cuMemcpyBatchAsync` with the same
/// outcome as the `cuMemcpyAsync` loop in stream order: at least two, none
/// hinted host memory of the process (possibly pageable: the loop's
/// `cuMemcpyAsync` stages it as the batch may not), and none writing bytes
/// another reads or writes (the batch runs its copies in no order; cuda.h
/// makes dependent copies undefined behaviour). Distinct endpoints or
/// windows may reach the same memory, which the batch's checks by id do
/// not see: the addresses are compared here.
pub(super) fn batchable(copies: &[MemcpyOp]) -> bool {
    if copies.len() < 2 {
        return false;
    }
    // One pass: host memory; whether each destination starts at or past
    // the end of the one before (ascending and disjoint: the order the
    // typed API's puts come in); the span of all destinations and of all
    // sources.
    let mut ascending = true;
    let mut dst_end = 0u64;
    let (mut d_lo, mut d_hi, mut s_lo, mut s_hi) = (u64::MAX, 0u64, u64::MAX, 0u64);
    for c in copies {
        if c.dst.hint == MemHint::Host || c.src.hint == MemHint::Host {
            return false;
        }
        ascending &= c.dst.ptr >= dst_end;
        dst_end = c.dst.ptr.saturating_add(c.size);
        d_lo = d_lo.min(c.dst.ptr);
        d_hi = d_hi.max(dst_end);
        s_lo = s_lo.min(c.src.ptr);
        s_hi = s_hi.max(c.src.ptr.saturating_add(c.size));
    }
    if !ascending {
        return independent_sorted(copies);
    }
    // No source byte among the destinations' (the usual batch: one memory
    // read, another written): independent.
    if s_hi <= d_lo || d_hi <= s_lo {
        return true;
    }
    // Disjoint and sorted by start, the destinations' ends rise too: of
    // those that start before a source ends, the last reaches furthest.
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
    let mut dsts: Vec<(u64, u64)> = copies
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

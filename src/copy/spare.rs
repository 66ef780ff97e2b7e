//! The process's spare batch state: one emptied [`BatchInner`], so that
//! [`CopyBatch::new`](super::CopyBatch::new) allocates nothing in a loop
//! of batches. One for the process, not one per thread (the crate keeps no
//! thread-local state): a thread that finds it taken allocates, and a
//! give-back that finds it full frees.
//!
//! Its tests: what room the spare keeps.

use std::sync::atomic::{AtomicPtr, Ordering};

use super::BatchInner;

/// `Box::into_raw` of the spare, or null.
static SPARE: AtomicPtr<BatchInner> = AtomicPtr::new(std::ptr::null_mut());

// The spare moves between threads.
const _: () = {
    const fn send<T: Send>() {}
    send::<BatchInner>();
};

/// The spare, or a new empty state.
#[inline]
pub(super) fn take() -> Box<BatchInner> {
    let p = SPARE.swap(std::ptr::null_mut(), Ordering::Acquire);
    if p.is_null() {
        return Box::new(BatchInner::empty());
    }
    // SAFETY: a non-null `SPARE` is what `give_back` stored, from
    // `Box::into_raw` (its writes visible through the Release/Acquire
    // pair); the swap took it out, so this thread alone owns it.
    // Measured (benches/copy_batch.rs, `Null`, 2026-12-02): a one-op
    // batch 1,467 instructions with the spare against 1,860 without.
    unsafe { Box::from_raw(p) }
}

/// Empties `inner` (what it still holds is dropped) and keeps it as
/// the spare if there is none.
#[inline]
pub(crate) fn give_back(mut inner: Box<BatchInner>) {
    inner.reset();
    give_back_empty(inner);
}

/// [`give_back`] of a state its enqueue left as [`BatchInner::reset`]
/// would (the one-put lane: its deferred put cleared, nothing else
/// written; the put's keep made by the lane, never held here).
#[inline]
pub(crate) fn give_back_empty(inner: Box<BatchInner>) {
    debug_assert!(inner.is_reset());
    let p = Box::into_raw(inner);
    if SPARE
        .compare_exchange(
            std::ptr::null_mut(),
            p,
            Ordering::Release,
            Ordering::Relaxed,
        )
        .is_err()
    {
        // SAFETY: `p` is the `Box::into_raw` just above, never stored:
        // still this thread's alone.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use crate::copy::{BatchInner, FIRST_ROOM, SPARE_OPS, put_op};

    /// A batch too long for the driver's inline list gives its list away
    /// and leaves the next batch as much room (up to the spare's most), kept
    /// by the spare: a loop of long batches allocates once per batch, not
    /// once per doubling with a copy of the ops each time.
    #[test]
    fn a_long_batch_leaves_the_next_as_much_room_up_to_the_spares_most() {
        let mut inner = BatchInner::empty();
        for (len, room) in [(5, FIRST_ROOM), (1000, 1000), (3 * SPARE_OPS, SPARE_OPS)] {
            inner.list = vec![put_op(0, 1, 0, 64); len];
            assert_eq!(inner.take_list().len(), len);
            inner.reset();
            assert!(
                inner.list.capacity() >= room,
                "after {len} ops: room for {}",
                inner.list.capacity()
            );
        }
    }

    /// The spare (one per process) keeps a list of a few thousand ops of
    /// room, not the room of the largest batch the process ever made.
    #[test]
    fn the_spare_batch_state_keeps_no_more_than_a_few_thousand_ops_of_room() {
        let mut inner = BatchInner::empty();
        inner.list.reserve(200_000);
        inner.reset();
        assert_eq!(inner.list.capacity(), 0);
        inner.list.reserve_exact(SPARE_OPS);
        let cap = inner.list.capacity();
        inner.reset();
        assert_eq!(inner.list.capacity(), cap, "a usual batch's room is kept");
    }
}

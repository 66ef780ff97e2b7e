//! The gate between a copy's enqueue and an unbind on one endpoint range,
//! on different threads (F4).
//!
//! A copy names `&ep` and an unbind consumes a `Binding` of the same
//! endpoint: both are shared borrows, so two threads may do them at once.
//! An enqueue checks the bindings (F9), calls the driver, then records the
//! batch as in flight; an unbind synchronizes the streams with a copy in
//! flight on the id ([`crate::stream::settle`]), then calls the driver. An
//! unbind between the enqueue's check and its record would find nothing in
//! flight and unbind under the copy. What this file owns keeps the two
//! apart without a lock across either driver call:
//!
//! - an enqueue (and a capture, until its graph pins its ids) holds an
//!   [`EnqueueGate`] on every range of its batch, from before its checks to
//!   after its record: a count per range, entered only while no unbind is
//!   in its gate there (all ranges or none: it never waits holding one);
//! - an unbind holds an [`UnbindGate`] from before its settle to after its
//!   driver call: a count per range; it waits until no enqueue is inside.
//!
//! Enqueues never wait for each other, nor unbinds. Each side's window is
//! one check and one driver call (and the settle's synchronize), so a wait
//! is as long as that. One thread inside one side that calls back into the
//! crate for the other on the same range (a `tracing` layer or a backend
//! during the driver call) would wait for itself: refused instead,
//! [`Error::CopyUnbindReentered`].

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::range::RangeInner;

thread_local! {
    /// The ranges (by address) this thread is inside an enqueue's gate of:
    /// few, usually none.
    static ENQUEUING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// How many unbinds this thread is inside (a constant-initialized
    /// `Cell`: one load and one store each way, on every unbind).
    static UNBINDING: Cell<u32> = const { Cell::new(0) };
}

fn key(range: &RangeInner) -> usize {
    std::ptr::from_ref(range).addr()
}

/// Whether this thread is inside an enqueue's gate on `range`.
fn enqueuing_here(range: &RangeInner) -> bool {
    let k = key(range);
    ENQUEUING.with_borrow(|v| v.contains(&k))
}

/// An enqueue (or capture) inside the gates of its batch's ranges.
pub(crate) struct EnqueueGate {
    ranges: SmallVec<[Arc<RangeInner>; 1]>,
}

impl EnqueueGate {
    /// Enters the gate of every distinct range of `endpoints`, once no
    /// unbind is inside any of them.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside an unbind
    /// on one of them.
    pub(crate) fn enter(endpoints: &[(Arc<RangeInner>, u32)]) -> Result<EnqueueGate> {
        let mut ranges: SmallVec<[Arc<RangeInner>; 1]> = SmallVec::new();
        for (range, id) in endpoints {
            if ranges.iter().any(|r| Arc::ptr_eq(r, range)) {
                continue;
            }
            // This thread inside an unbind, and one on this range: it may
            // be this thread's (a layer enqueueing during it), which would
            // wait for itself. Refused (for this rare case, even when the
            // unbind on this range is another thread's).
            if range.gate_unbinds().load(Ordering::SeqCst) != 0 && UNBINDING.get() != 0 {
                return Err(Error::CopyUnbindReentered { id: *id });
            }
            ranges.push(range.clone());
        }
        loop {
            // Announce on every range, then look for an unbind on any
            // (SeqCst on both sides: one of the two sees the other).
            for r in &ranges {
                r.gate_enqueues().fetch_add(1, Ordering::SeqCst);
            }
            let busy = ranges
                .iter()
                .position(|r| r.gate_unbinds().load(Ordering::SeqCst) != 0);
            let Some(busy) = busy else { break };
            for r in &ranges {
                r.gate_enqueues().fetch_sub(1, Ordering::SeqCst);
            }
            // Holding none: an unbind waiting for this range's enqueues
            // cannot wait for this thread.
            while ranges[busy].gate_unbinds().load(Ordering::SeqCst) != 0 {
                std::thread::yield_now();
            }
        }
        ENQUEUING.with_borrow_mut(|v| v.extend(ranges.iter().map(|r| key(r))));
        Ok(EnqueueGate { ranges })
    }
}

impl Drop for EnqueueGate {
    fn drop(&mut self) {
        for r in &self.ranges {
            let k = key(r);
            ENQUEUING.with_borrow_mut(|v| {
                if let Some(i) = v.iter().rposition(|&x| x == k) {
                    v.swap_remove(i);
                }
            });
            r.gate_enqueues().fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// An unbind inside the gate of its range.
pub(crate) struct UnbindGate<'r> {
    range: &'r RangeInner,
}

impl<'r> UnbindGate<'r> {
    /// Enters the gate of `range`, once no enqueue is inside it. Inline:
    /// with no enqueue there (the usual unbind), two atomic operations.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside an
    /// enqueue on `range`.
    #[inline]
    pub(crate) fn enter(range: &'r RangeInner, id: u32) -> Result<UnbindGate<'r>> {
        UNBINDING.set(UNBINDING.get().wrapping_add(1));
        range.gate_unbinds().fetch_add(1, Ordering::SeqCst);
        let gate = UnbindGate { range };
        if range.gate_enqueues().load(Ordering::SeqCst) != 0 {
            gate.wait_for_enqueues(id)?;
        }
        Ok(gate)
    }

    /// Some enqueue is inside: refused if it is this thread's, else waited
    /// for (its check and driver call; new ones wait for this unbind).
    #[cold]
    #[inline(never)]
    fn wait_for_enqueues(&self, id: u32) -> Result<()> {
        if enqueuing_here(self.range) {
            return Err(Error::CopyUnbindReentered { id });
        }
        while self.range.gate_enqueues().load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        Ok(())
    }
}

impl Drop for UnbindGate<'_> {
    #[inline]
    fn drop(&mut self) {
        self.range.gate_unbinds().fetch_sub(1, Ordering::SeqCst);
        UNBINDING.set(UNBINDING.get().wrapping_sub(1));
    }
}

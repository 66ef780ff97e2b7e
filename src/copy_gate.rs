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
//!   A bind holds one too, from its record (made before its driver call)
//!   to its end: a copy checked against that record in between would
//!   reach the driver before the memory is bound there (R13.3).
//!
//! Enqueues never wait for each other, nor unbinds. Each side's window is
//! one check and one driver call (and the settle's synchronize), so a wait
//! is as long as that. One thread inside one side that calls back into the
//! crate for the other on the same range (a `tracing` layer or a backend
//! during the driver call) would wait for itself: refused instead,
//! [`Error::CopyUnbindReentered`]. Which thread is inside is a count per
//! thread, not per range (one load on every enqueue and unbind): a call
//! back that meets another thread's gate on the range is refused too.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::range::RangeInner;

thread_local! {
    /// How many enqueues this thread is inside, and how many unbinds
    /// (constant-initialized `Cell`s: one load and one store each way).
    static ENQUEUING: Cell<u32> = const { Cell::new(0) };
    static UNBINDING: Cell<u32> = const { Cell::new(0) };
}

/// An enqueue (or capture) inside the gates of its batch's ranges.
pub(crate) enum EnqueueGate {
    /// The usual batch: its endpoints are of one range.
    One(Arc<RangeInner>),
    Many(Vec<Arc<RangeInner>>),
}

impl EnqueueGate {
    /// Enters the gate of every distinct range of `endpoints`, once no
    /// unbind is inside any of them.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside an unbind
    /// on one of them.
    #[inline]
    pub(crate) fn enter(endpoints: &[(Arc<RangeInner>, u32)]) -> Result<EnqueueGate> {
        let Some(((first, id), rest)) = endpoints.split_first() else {
            // Nothing to hold (the `Drop` still counts this thread out).
            ENQUEUING.set(ENQUEUING.get().wrapping_add(1));
            return Ok(EnqueueGate::Many(Vec::new()));
        };
        if rest.iter().any(|(r, _)| !Arc::ptr_eq(r, first)) {
            return Self::enter_many(endpoints);
        }
        // One range: announce, then look for an unbind (SeqCst on both
        // sides: one of the two sees the other).
        first.gate_enqueues().fetch_add(1, Ordering::SeqCst);
        if first.gate_unbinds().load(Ordering::SeqCst) != 0 {
            first.gate_enqueues().fetch_sub(1, Ordering::SeqCst);
            return Self::enter_many(&[(first.clone(), *id)]);
        }
        ENQUEUING.set(ENQUEUING.get().wrapping_add(1));
        Ok(EnqueueGate::One(first.clone()))
    }

    /// [`EnqueueGate::enter`] for several ranges, or after an unbind was
    /// seen: waits with none announced.
    #[cold]
    #[inline(never)]
    fn enter_many(endpoints: &[(Arc<RangeInner>, u32)]) -> Result<EnqueueGate> {
        let mut ranges: Vec<Arc<RangeInner>> = Vec::new();
        for (range, id) in endpoints {
            if ranges.iter().any(|r| Arc::ptr_eq(r, range)) {
                continue;
            }
            // This thread inside an unbind, and one on this range: it may
            // be this thread's (a layer enqueueing during it), which would
            // wait for itself. Refused (in this rare case even when the
            // unbind on this range is another thread's: a count per thread
            // is one load, a list of ranges a search on every enqueue).
            if range.gate_unbinds().load(Ordering::SeqCst) != 0 && UNBINDING.get() != 0 {
                return Err(Error::CopyUnbindReentered { id: *id });
            }
            ranges.push(range.clone());
        }
        loop {
            // Announce on every range, then look for an unbind on any.
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
            while ranges
                .get(busy)
                .is_some_and(|r| r.gate_unbinds().load(Ordering::SeqCst) != 0)
            {
                std::thread::yield_now();
            }
        }
        ENQUEUING.set(ENQUEUING.get().wrapping_add(1));
        Ok(EnqueueGate::Many(ranges))
    }
}

impl Drop for EnqueueGate {
    #[inline]
    fn drop(&mut self) {
        match self {
            EnqueueGate::One(r) => {
                r.gate_enqueues().fetch_sub(1, Ordering::SeqCst);
            }
            EnqueueGate::Many(ranges) => {
                for r in ranges.iter() {
                    r.gate_enqueues().fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        ENQUEUING.set(ENQUEUING.get().wrapping_sub(1));
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
    // Always: a call returning the 88-byte `Result` cost bind 23 more
    // instructions than inline (`benches/instructions.rs`).
    #[inline(always)]
    pub(crate) fn enter(range: &'r RangeInner, id: u32) -> Result<UnbindGate<'r>> {
        UNBINDING.set(UNBINDING.get().wrapping_add(1));
        range.gate_unbinds().fetch_add(1, Ordering::SeqCst);
        let gate = UnbindGate { range };
        if range.gate_enqueues().load(Ordering::SeqCst) != 0 {
            gate.wait_for_enqueues(id)?;
        }
        Ok(gate)
    }

    /// Some enqueue is inside: refused when this thread is inside one (it
    /// may be this one's: as for an enqueue inside an unbind, refused even
    /// when it is another thread's), else waited for (its check and driver
    /// call; new ones wait for this unbind).
    #[cold]
    #[inline(never)]
    fn wait_for_enqueues(&self, id: u32) -> Result<()> {
        if ENQUEUING.get() != 0 {
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

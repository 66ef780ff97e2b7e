//! The gate between a copy's enqueue and a bind or an unbind on one
//! endpoint range, on different threads (F4, R13.3): [`Gate`], one per
//! range, and the guards that hold it.
//!
//! A copy names `&ep` and an unbind consumes a `Binding` of the same
//! endpoint: both are shared borrows, so two threads may do them at once.
//! An enqueue checks the bindings (F9), calls the driver, then records the
//! batch as in flight; an unbind synchronizes the streams with a copy in
//! flight on the id ([`crate::stream::settle`]), then calls the driver; a
//! bind records its binding, then calls the driver. The gate keeps them
//! apart with a count per side in one atomic word:
//!
//! - an enqueue (and a capture, until its graph pins its ids) holds an
//!   [`EnqueueGate`] on every range of its batch, from before its checks to
//!   after its record, entered only while no bind or unbind is inside (all
//!   ranges or none: it never waits holding one). After its checks, before
//!   its first driver call, [`EnqueueGate::checked`] looks again: a bind
//!   that entered meanwhile may have recorded a binding the checks passed
//!   on before the driver bound it (R13.3), so the enqueue leaves, waits
//!   for the bind, and checks again;
//! - an unbind holds a [`ChangeGate`] from before its settle to after its
//!   driver call, and waits until no enqueue is inside (the copy must be
//!   recorded in flight before the settle looks);
//! - a bind holds a [`ChangeGate`] from before its record to its end and
//!   waits for nothing: an enqueue inside that checked before the record
//!   never sees it, and one that checks after it looks again.
//!
//! So the only wait across another thread's driver call is an unbind's
//! for a copy's enqueue, which F4 needs (a copy's enqueue must be recorded
//! before the unbind settles), and a copy's for a bind or unbind in
//! progress. A layer inside a copy's driver call may wait for another
//! thread's bind on the range; what it must not wait for is another
//! thread's unbind on the range, nor a layer inside a bind or unbind for
//! another thread's copy through it: those would wait for each other.
//!
//! The gate records which threads are inside it, on each side (no
//! thread-local state): a thread that would wait at a gate for a side it
//! is itself inside (a `tracing` layer or a backend calling back into the
//! crate during the outer driver call) would wait for itself, and is
//! refused instead ([`Error::CopyUnbindReentered`]).
//!
//! Waiters park on the gate's condition variable; a holder that leaves
//! wakes them only when the word says some wait. Uncontended, an enqueue
//! is one atomic add, one load and one subtract, a bind or an unbind one
//! add and one subtract, and each a store of its thread's name into the
//! gate and one of 0. Interleavings checked by loom (`ci/loom.sh`).

use std::sync::Arc;
use std::sync::PoisonError;

use crate::error::{Error, Result};
use crate::range::RangeInner;
use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, thread_id};

/// The gate's word: four 16-bit counts (more than 65,535 threads inside or
/// parked at one range's gate at once would carry into the next field).
const ENQUEUE: u64 = 1;
const BIND: u64 = 1 << 16;
const UNBIND: u64 = 1 << 32;
const WAITER: u64 = 1 << 48;
const FIELD: u64 = 0xFFFF;
const ENQUEUES: u64 = FIELD;
const BINDS: u64 = FIELD << 16;
const CHANGES: u64 = BINDS | FIELD << 32;
const WAITERS: u64 = FIELD << 48;

/// The side of the gate a thread is inside.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    /// A copy's enqueue or capture.
    Enqueue,
    /// A bind or an unbind.
    Change,
}

/// Where a thread inside the gate wrote its name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Named {
    /// The side's slot: it was alone on its side when it entered.
    Slot,
    /// The list under the lock.
    Listed,
}

/// The gate of one endpoint range (a field of the range's record).
pub(crate) struct Gate {
    /// The counts inside, per side, and of the threads parked.
    word: AtomicU64,
    /// The name of the thread that entered its side alone (0: none); only
    /// that thread writes it until it leaves. Read only by a thread about
    /// to wait, looking for its own name, which no other thread writes.
    enqueuer: AtomicUsize,
    changer: AtomicUsize,
    /// The names of the other threads inside (allocated the first time two
    /// threads are inside one side at once, kept), and the lock that
    /// waiters park under.
    listed: Mutex<Vec<(usize, Side)>>,
    parked: Condvar,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("word", &self.word.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    /// An open gate: nobody inside.
    pub(crate) fn new() -> Gate {
        Gate {
            word: AtomicU64::new(0),
            enqueuer: AtomicUsize::new(0),
            changer: AtomicUsize::new(0),
            listed: Mutex::new(Vec::new()),
            parked: Condvar::new(),
        }
    }

    /// The slot of `side`.
    #[inline]
    fn slot(&self, side: Side) -> &AtomicUsize {
        match side {
            Side::Enqueue => &self.enqueuer,
            Side::Change => &self.changer,
        }
    }

    /// Writes this thread's name in the gate, on `side`: in its slot when
    /// the thread came in alone there (`was`, the word before it entered).
    #[inline]
    fn name(&self, side: Side, was: u64) -> Named {
        let alone = match side {
            Side::Enqueue => was & ENQUEUES == 0,
            Side::Change => was & CHANGES == 0,
        };
        if alone {
            // The last thread alone here cleared the slot before it left
            // (its subtract, which the add that saw 0 read, orders them).
            self.slot(side).store(thread_id(), Ordering::Relaxed);
            Named::Slot
        } else {
            self.list(side)
        }
    }

    #[cold]
    #[inline(never)]
    fn list(&self, side: Side) -> Named {
        self.lock().push((thread_id(), side));
        Named::Listed
    }

    /// Takes this thread's name out of the gate.
    #[inline]
    fn unname(&self, side: Side, named: Named) {
        match named {
            Named::Slot => self.slot(side).store(0, Ordering::Relaxed),
            Named::Listed => self.unlist(side),
        }
    }

    #[cold]
    #[inline(never)]
    fn unlist(&self, side: Side) {
        let me = (thread_id(), side);
        let mut listed = self.lock();
        if let Some(i) = listed.iter().position(|&n| n == me) {
            listed.swap_remove(i);
        }
    }

    /// Whether this thread is inside the gate on `side`. Exact without
    /// ordering: only this thread writes its own name, and reads its last
    /// write; other threads' names never equal it.
    #[cold]
    fn holds(&self, side: Side) -> bool {
        let me = thread_id();
        self.slot(side).load(Ordering::Relaxed) == me || self.lock().contains(&(me, side))
    }

    /// The lock (nothing panics while it is held: poisoning is ignored).
    fn lock(&self) -> crate::sync::MutexGuard<'_, Vec<(usize, Side)>> {
        self.listed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters as an enqueue, unless a bind or an unbind is inside (then
    /// leaves again at once).
    #[inline]
    fn try_enqueue(&self) -> Option<Named> {
        let was = self.word.fetch_add(ENQUEUE, Ordering::SeqCst);
        if was & CHANGES == 0 {
            return Some(self.name(Side::Enqueue, was));
        }
        self.subtract(ENQUEUE);
        None
    }

    /// Whether a bind is inside: one that entered after an enqueue did may
    /// have recorded a binding that the enqueue's checks passed on.
    #[inline]
    fn binding(&self) -> bool {
        self.word.load(Ordering::SeqCst) & BINDS != 0
    }

    /// Enters as a bind or an unbind (`what`): the word before.
    #[inline]
    fn enter_change(&self, what: u64) -> (u64, Named) {
        let was = self.word.fetch_add(what, Ordering::SeqCst);
        (was, self.name(Side::Change, was))
    }

    /// Leaves `side` (`what` of it).
    #[inline]
    fn leave(&self, side: Side, what: u64, named: Named) {
        self.unname(side, named);
        self.subtract(what);
    }

    /// Takes `what` off the word, and wakes the parked if any.
    #[inline]
    fn subtract(&self, what: u64) {
        if self.word.fetch_sub(what, Ordering::SeqCst) & WAITERS != 0 {
            self.wake();
        }
    }

    /// A waiter counted itself under the lock before it looked at the
    /// word: taking the lock here means it is parked (or gone), so the
    /// notification reaches it.
    #[cold]
    #[inline(never)]
    fn wake(&self) {
        drop(self.lock());
        self.parked.notify_all();
    }

    /// Parks until none of `busy` is inside, or refuses (`id` names the
    /// endpoint) when this thread is inside on `mine`, the side it waits
    /// for: it would wait for itself.
    #[cold]
    #[inline(never)]
    fn wait(&self, busy: u64, mine: Side, id: u32) -> Result<()> {
        if self.holds(mine) {
            return Err(Error::CopyUnbindReentered { id });
        }
        let mut guard = self.lock();
        self.word.fetch_add(WAITER, Ordering::SeqCst);
        while self.word.load(Ordering::SeqCst) & busy != 0 {
            guard = self
                .parked
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.word.fetch_sub(WAITER, Ordering::SeqCst);
        drop(guard);
        Ok(())
    }
}

/// What has a gate: an endpoint range (or, in the loom tests, a stand-in).
pub(crate) trait Gated {
    /// The gate.
    fn gate(&self) -> &Gate;
}

impl Gated for RangeInner {
    #[inline]
    fn gate(&self) -> &Gate {
        RangeInner::gate(self)
    }
}

impl<R: Gated> Gated for Arc<R> {
    #[inline]
    fn gate(&self) -> &Gate {
        (**self).gate()
    }
}

/// An enqueue (or capture) inside the gates of its batch's ranges.
pub(crate) enum EnqueueGate<R: Gated = RangeInner> {
    /// The usual batch: its endpoints are of one range (`u32`: an id there).
    One(Arc<R>, u32, Named),
    Many(Vec<(Arc<R>, u32, Named)>),
}

impl<R: Gated> EnqueueGate<R> {
    /// Enters the gate of every distinct range of `endpoints`, once no bind
    /// or unbind is inside any of them. Once the checks are done,
    /// [`EnqueueGate::checked`] says whether they stand.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside a bind or
    /// an unbind on one of them.
    #[inline]
    pub(crate) fn enter(endpoints: &[(Arc<R>, u32)]) -> Result<EnqueueGate<R>> {
        let Some(((first, id), rest)) = endpoints.split_first() else {
            return Ok(EnqueueGate::Many(Vec::new()));
        };
        if rest.iter().all(|(r, _)| Arc::ptr_eq(r, first))
            && let Some(named) = first.gate().try_enqueue()
        {
            return Ok(EnqueueGate::One(first.clone(), *id, named));
        }
        Self::enter_many(endpoints)
    }

    /// [`EnqueueGate::enter`] for several ranges, or after a bind or unbind
    /// was seen: waits with none entered.
    #[cold]
    #[inline(never)]
    fn enter_many(endpoints: &[(Arc<R>, u32)]) -> Result<EnqueueGate<R>> {
        let mut ranges: Vec<(&Arc<R>, u32)> = Vec::new();
        for (range, id) in endpoints {
            if !ranges.iter().any(|(r, _)| Arc::ptr_eq(r, range)) {
                ranges.push((range, *id));
            }
        }
        loop {
            let mut inside = Vec::with_capacity(ranges.len());
            let mut busy = None;
            for &(range, id) in &ranges {
                match range.gate().try_enqueue() {
                    Some(named) => inside.push((range.clone(), id, named)),
                    None => {
                        busy = Some((range, id));
                        break;
                    }
                }
            }
            let Some((range, id)) = busy else {
                return Ok(EnqueueGate::Many(inside));
            };
            // Holding none: a bind or unbind there never waits for this one.
            drop(EnqueueGate::Many(inside));
            range.gate().wait(CHANGES, Side::Change, id)?;
        }
    }

    /// After the enqueue's checks, before its first driver call: the gate
    /// when the checks stand, or `None` when a bind entered one of the
    /// ranges since (its record may be what they passed on, before the
    /// driver bound it, R13.3): then the gates were left and the bind
    /// waited for; enter and check again.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when that bind is this thread's.
    #[inline]
    pub(crate) fn checked(self) -> Result<Option<EnqueueGate<R>>> {
        let clear = match &self {
            EnqueueGate::One(range, ..) => !range.gate().binding(),
            EnqueueGate::Many(ranges) => !ranges.iter().any(|(r, ..)| r.gate().binding()),
        };
        if clear {
            return Ok(Some(self));
        }
        self.wait_for_binds()
    }

    #[cold]
    #[inline(never)]
    fn wait_for_binds(self) -> Result<Option<EnqueueGate<R>>> {
        let binding = match &self {
            EnqueueGate::One(range, id, _) => Some((range.clone(), *id)),
            EnqueueGate::Many(ranges) => ranges
                .iter()
                .find(|(r, ..)| r.gate().binding())
                .map(|(r, id, _)| (r.clone(), *id)),
        };
        drop(self);
        if let Some((range, id)) = binding {
            range.gate().wait(CHANGES, Side::Change, id)?;
        }
        Ok(None)
    }
}

impl<R: Gated> Drop for EnqueueGate<R> {
    #[inline]
    fn drop(&mut self) {
        match self {
            EnqueueGate::One(r, _, named) => r.gate().leave(Side::Enqueue, ENQUEUE, *named),
            EnqueueGate::Many(ranges) => {
                for (r, _, named) in ranges.iter() {
                    r.gate().leave(Side::Enqueue, ENQUEUE, *named);
                }
            }
        }
    }
}

/// A bind or an unbind inside the gate of its range.
pub(crate) struct ChangeGate<'r, R: Gated = RangeInner> {
    range: &'r R,
    what: u64,
    named: Named,
}

impl<'r, R: Gated> ChangeGate<'r, R> {
    /// Enters the gate of `range` for an unbind, once no enqueue is inside
    /// it. Inline: with no enqueue there (the usual unbind), two atomic
    /// operations and two stores.
    ///
    /// # Errors
    /// [`Error::CopyUnbindReentered`] when this thread is inside an
    /// enqueue on `range`.
    // Always: a call returning the 88-byte `Result` cost bind 23 more
    // instructions than inline (`benches/instructions.rs`).
    #[inline(always)]
    pub(crate) fn unbind(range: &'r R, id: u32) -> Result<ChangeGate<'r, R>> {
        let (was, named) = range.gate().enter_change(UNBIND);
        let gate = ChangeGate {
            range,
            what: UNBIND,
            named,
        };
        if was & ENQUEUES != 0 {
            // Their checks and driver calls; new ones wait for this unbind.
            range.gate().wait(ENQUEUES, Side::Enqueue, id)?;
        }
        Ok(gate)
    }

    /// Enters the gate of `range` for a bind, at once: enqueues inside
    /// either checked before its record or look again after their checks
    /// ([`EnqueueGate::checked`]).
    #[inline(always)]
    pub(crate) fn bind(range: &'r R) -> ChangeGate<'r, R> {
        let (_, named) = range.gate().enter_change(BIND);
        ChangeGate {
            range,
            what: BIND,
            named,
        }
    }
}

impl<R: Gated> Drop for ChangeGate<'_, R> {
    #[inline]
    fn drop(&mut self) {
        self.range.gate().leave(Side::Change, self.what, self.named);
    }
}

#[cfg(test)]
mod tests {
    //! The gate's interleavings, on a stand-in range whose bindings, in
    //! flight record and driver are locks of their own. Under loom
    //! (`ci/loom.sh`: `--cfg loom`, `LOOM_MAX_PREEMPTIONS=2`) every
    //! interleaving; without, one run of each on real threads.

    use super::{ChangeGate, EnqueueGate, Gate, Gated};
    use crate::Error;
    use crate::sync::Mutex;
    use std::sync::Arc;

    #[cfg(loom)]
    use loom::{model, thread};
    #[cfg(not(loom))]
    use std::thread;

    #[cfg(not(loom))]
    fn model(f: impl Fn() + Sync + Send + 'static) {
        f();
    }

    /// A range with one id: its gate, the crate's record of the binding
    /// (what an enqueue checks, F9), the streams' record of a copy in
    /// flight (what an unbind's settle looks at), and the driver.
    struct Range {
        gate: Gate,
        record: Mutex<bool>,
        in_flight: Mutex<bool>,
        driver: Mutex<Driver>,
    }

    #[derive(Default)]
    struct Driver {
        bound: bool,
        /// Copies the driver took while the memory was bound.
        copies: u32,
        /// Copies the driver took with nothing bound (F4, R13.3 broken).
        strays: u32,
        /// Copies that were in flight when the driver unbound, not settled.
        unsettled: u32,
    }

    impl Gated for Range {
        fn gate(&self) -> &Gate {
            &self.gate
        }
    }

    fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn range(bound: bool) -> Arc<Range> {
        Arc::new(Range {
            gate: Gate::new(),
            record: Mutex::new(bound),
            in_flight: Mutex::new(false),
            driver: Mutex::new(Driver {
                bound,
                ..Driver::default()
            }),
        })
    }

    /// `Stream::enqueue`'s use of the gate: whether the copy was enqueued.
    fn enqueue(r: &Arc<Range>) -> bool {
        let endpoints = [(r.clone(), 0u32)];
        let gate = loop {
            let Ok(gate) = EnqueueGate::enter(&endpoints) else {
                unreachable!("no thread is inside twice")
            };
            if !*lock(&r.record) {
                return false; // F9: not bound
            }
            match gate.checked() {
                Ok(Some(gate)) => break gate,
                Ok(None) => {}
                Err(e) => unreachable!("{e}"),
            }
        };
        {
            let mut d = lock(&r.driver);
            if d.bound {
                d.copies += 1;
            } else {
                d.strays += 1;
            }
        }
        *lock(&r.in_flight) = true;
        drop(gate);
        true
    }

    /// `Binding::unbind`'s: settle, then the driver, then the record.
    fn unbind(r: &Range) {
        let Ok(gate) = ChangeGate::unbind(r, 0) else {
            unreachable!("no thread is inside twice")
        };
        let settled = std::mem::take(&mut *lock(&r.in_flight));
        {
            let mut d = lock(&r.driver);
            if d.copies > 0 && !settled {
                d.unsettled += 1;
            }
            d.bound = false;
            d.copies = 0;
        }
        *lock(&r.record) = false;
        drop(gate);
    }

    /// `Endpoint::bind_part`'s: the record, then the driver.
    fn bind(r: &Range) {
        let gate = ChangeGate::bind(r);
        *lock(&r.record) = true;
        lock(&r.driver).bound = true;
        drop(gate);
    }

    fn assert_clean(r: &Range) {
        let d = lock(&r.driver);
        assert_eq!((d.strays, d.unsettled), (0, 0), "a copy met an unbind");
    }

    #[test]
    fn f4_an_enqueue_and_an_unbind_on_two_threads_never_meet() {
        model(|| {
            let r = range(true);
            let copier = {
                let r = r.clone();
                thread::spawn(move || enqueue(&r))
            };
            unbind(&r);
            let _ = copier.join();
            assert_clean(&r);
        });
    }

    #[test]
    fn f4_two_enqueues_and_an_unbind_on_three_threads_never_meet() {
        model(|| {
            let r = range(true);
            let copiers: Vec<_> = (0..2)
                .map(|_| {
                    let r = r.clone();
                    thread::spawn(move || enqueue(&r))
                })
                .collect();
            unbind(&r);
            for c in copiers {
                let _ = c.join();
            }
            assert_clean(&r);
        });
    }

    #[test]
    fn r13_3_an_enqueue_never_reaches_the_driver_on_a_bind_not_yet_made() {
        model(|| {
            // The bind on the other thread: the interleaving that breaks
            // R13.3 (enter, the bind's record, checks, driver) is then two
            // preemptions, within `LOOM_MAX_PREEMPTIONS=2`.
            let r = range(false);
            let binder = {
                let r = r.clone();
                thread::spawn(move || bind(&r))
            };
            enqueue(&r);
            let _ = binder.join();
            assert_clean(&r);
        });
    }

    #[test]
    fn a_thread_inside_an_enqueue_may_wait_for_another_threads_bind() {
        model(|| {
            let r = range(true);
            let endpoints = [(r.clone(), 0u32)];
            let Ok(Some(gate)) = EnqueueGate::enter(&endpoints).and_then(EnqueueGate::checked)
            else {
                unreachable!("nobody else is inside")
            };
            // A layer in the enqueue's driver call waits for a bind on
            // another thread: the bind never waits for the enqueue.
            let binder = {
                let r = r.clone();
                thread::spawn(move || bind(&r))
            };
            let _ = binder.join();
            drop(gate);
        });
    }

    #[test]
    fn f4_an_unbind_inside_this_threads_enqueue_is_refused() {
        model(|| {
            let r = range(true);
            let endpoints = [(r.clone(), 7u32)];
            let gate = EnqueueGate::enter(&endpoints);
            assert!(matches!(
                ChangeGate::unbind(&*r, 7),
                Err(Error::CopyUnbindReentered { id: 7 })
            ));
            // A bind there waits for nothing; and the gate is open after.
            drop(ChangeGate::bind(&*r));
            drop(gate);
            assert!(ChangeGate::unbind(&*r, 7).is_ok());
        });
    }

    #[test]
    fn f4_an_enqueue_inside_this_threads_bind_or_unbind_is_refused() {
        model(|| {
            let r = range(true);
            let endpoints = [(r.clone(), 7u32)];
            for unbinding in [true, false] {
                let gate = if unbinding {
                    ChangeGate::unbind(&*r, 7).ok()
                } else {
                    Some(ChangeGate::bind(&*r))
                };
                assert!(gate.is_some());
                assert!(matches!(
                    EnqueueGate::enter(&endpoints),
                    Err(Error::CopyUnbindReentered { id: 7 })
                ));
                drop(gate);
            }
            assert!(matches!(
                EnqueueGate::enter(&endpoints).and_then(EnqueueGate::checked),
                Ok(Some(_))
            ));
        });
    }
}

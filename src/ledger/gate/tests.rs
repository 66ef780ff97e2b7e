//! The gate's interleavings, on a stand-in range whose bindings, in
//! flight record and driver are locks of their own. Under loom
//! (`ci/loom.sh`: `--cfg loom`, `LOOM_MAX_PREEMPTIONS=2`) every
//! interleaving; without, one run of each on real threads.

use super::{ChangeGate, EnqueueGate, Gate, Gated, OneGate};
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
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let Ok(gate) = (unsafe { EnqueueGate::enter(&endpoints) }) else {
            unreachable!("no thread is inside twice")
        };
        if !*lock(&r.record) {
            return false; // F9: not bound
        }
        if gate.clear() {
            break gate;
        }
        if let Err(e) = gate.wait_for_changes() {
            unreachable!("{e}")
        }
    };
    copy(r);
    // As the enqueue leaves on its usual path.
    gate.end();
    true
}

/// The copy inside the gate: the driver takes it, the stream records it.
fn copy(r: &Range) {
    {
        let mut d = lock(&r.driver);
        if d.bound {
            d.copies += 1;
        } else {
            d.strays += 1;
        }
    }
    *lock(&r.in_flight) = true;
}

/// The one-put lane's use of the gate (`copy::one::usual_put`): one try of
/// [`OneGate`], the general [`enqueue`] when a bind or an unbind is inside
/// or entered before the checks ended.
fn enqueue_lane(r: &Arc<Range>) -> bool {
    // SAFETY: `r` holds the range past the gate's end.
    if let Some(gate) = unsafe { OneGate::enter(&**r) } {
        if !*lock(&r.record) {
            return false; // F9: not bound
        }
        if gate.clear() {
            copy(r);
            gate.end();
            return true;
        }
        gate.end();
    }
    enqueue(r)
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

/// An enqueue (`enqueue`, or the lane's `enqueue_lane`) on one thread and
/// an unbind on another.
fn an_enqueue_and_an_unbind(enqueue: fn(&Arc<Range>) -> bool) {
    model(move || {
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

/// An enqueue (`enqueue`, or the lane's `enqueue_lane`) on one thread and
/// the bind it needs on another.
fn an_enqueue_and_its_bind(enqueue: fn(&Arc<Range>) -> bool) {
    model(move || {
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
fn f4_an_enqueue_and_an_unbind_on_two_threads_never_meet() {
    an_enqueue_and_an_unbind(enqueue);
}

#[test]
fn f4_the_one_put_lanes_enqueue_and_an_unbind_on_two_threads_never_meet() {
    an_enqueue_and_an_unbind(enqueue_lane);
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
fn r13_3_the_one_put_lanes_enqueue_never_reaches_the_driver_on_a_bind_not_yet_made() {
    an_enqueue_and_its_bind(enqueue_lane);
}

#[test]
fn r13_3_an_enqueue_never_reaches_the_driver_on_a_bind_not_yet_made() {
    an_enqueue_and_its_bind(enqueue);
}

#[test]
fn a_thread_inside_an_enqueue_may_wait_for_another_threads_bind() {
    model(|| {
        let r = range(true);
        let endpoints = [(r.clone(), 0u32)];
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let Ok(gate) = (unsafe { EnqueueGate::enter(&endpoints) }) else {
            unreachable!("nobody else is inside")
        };
        assert!(gate.clear());
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
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let gate = unsafe { EnqueueGate::enter(&endpoints) };
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
                // SAFETY: `endpoints` holds the ranges past the gate's end.
                unsafe { EnqueueGate::enter(&endpoints) },
                Err(Error::CopyUnbindReentered { id: 7 })
            ));
            drop(gate);
        }
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        assert!(unsafe { EnqueueGate::enter(&endpoints) }.is_ok_and(|g| g.clear()));
    });
}

#[test]
fn f4_an_unbind_inside_this_threads_enqueue_is_refused_with_another_thread_inside_too() {
    model(|| {
        // Another thread's enqueue may be inside too: the unbind waits for
        // it to leave, then knows the one left inside is its own thread.
        let r = range(true);
        let endpoints = [(r.clone(), 7u32)];
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let gate = unsafe { EnqueueGate::enter(&endpoints) };
        assert!(gate.is_ok());
        let copier = {
            let r = r.clone();
            thread::spawn(move || enqueue(&r))
        };
        assert!(matches!(
            ChangeGate::unbind(&*r, 7),
            Err(Error::CopyUnbindReentered { id: 7 })
        ));
        drop(gate);
        let _ = copier.join();
        assert_clean(&r);
    });
}

#[test]
fn f4_an_unbind_inside_two_enqueues_of_this_thread_is_refused() {
    model(|| {
        let r = range(true);
        let endpoints = [(r.clone(), 7u32)];
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let outer = unsafe { EnqueueGate::enter(&endpoints) };
        // SAFETY: `endpoints` holds the ranges past the gate's end.
        let inner = unsafe { EnqueueGate::enter(&endpoints) };
        assert!(matches!(
            ChangeGate::unbind(&*r, 7),
            Err(Error::CopyUnbindReentered { id: 7 })
        ));
        // The one that came in alone leaves first: the other still counts.
        drop(outer);
        assert!(matches!(
            ChangeGate::unbind(&*r, 7),
            Err(Error::CopyUnbindReentered { id: 7 })
        ));
        drop(inner);
        assert!(ChangeGate::unbind(&*r, 7).is_ok());
    });
}

#[test]
fn f4_an_enqueue_gate_ended_leaves_every_range_as_a_drop_does() {
    model(|| {
        let (a, b) = (range(true), range(true));
        for endpoints in [
            vec![(a.clone(), 1u32)],
            vec![(a.clone(), 1), (b.clone(), 2)],
        ] {
            // SAFETY: `endpoints` holds the ranges past the gate's end.
            let Ok(gate) = (unsafe { EnqueueGate::enter(&endpoints) }) else {
                unreachable!("nobody else is inside")
            };
            assert!(matches!(
                ChangeGate::unbind(&*a, 1),
                Err(Error::CopyUnbindReentered { id: 1 })
            ));
            gate.end();
            // Both gates open: an unbind on either waits for nothing.
            assert!(ChangeGate::unbind(&*a, 1).is_ok());
            assert!(ChangeGate::unbind(&*b, 2).is_ok());
        }
        // And each range's `Arc` was let go once: only `a` and `b` hold them.
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1));
    });
}

//! The hold/settle protocol's interleavings (F4, issue 27 item 1), on
//! stand-in [`Parts`]: a "device" that counts, per stream, the batches
//! enqueued and completed, the synchronizes and the destroys, and memory
//! that checks, when it is freed, that its batch completed. Under loom
//! (`ci/loom.sh`: `--cfg loom`, `LOOM_MAX_PREEMPTIONS=2`) every
//! interleaving of the locks and atomics of `holds.rs`; without, one run of
//! each on real threads.

use std::sync::{Arc, PoisonError};

use super::{HoldsOf, KeepOf, Parts, StreamCore, entries_in, live_in, settle_holds};
use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};

#[cfg(loom)]
use loom::{model, thread};
#[cfg(not(loom))]
use std::thread;

#[cfg(not(loom))]
fn model(f: impl Fn() + Sync + Send + 'static) {
    f();
}

/// The stand-in parts.
enum Sim {}

/// What the device saw of one stream.
#[derive(Default)]
struct Device {
    /// Batches the driver took (numbered from 0 in that order).
    enqueued: u64,
    /// Batches below this one completed.
    completed: u64,
    destroys: u32,
    /// Synchronizes of a destroyed stream (issue 27 item 1).
    after_destroy: u32,
    /// Buffers freed.
    freed: u32,
}

/// The device's record, shared. Under loom's lock: each driver call is a
/// point where another thread may run.
type Log = Arc<Mutex<Device>>;

fn new_log() -> Log {
    Arc::new(Mutex::new(Device::default()))
}

fn dev(log: &Log) -> MutexGuard<'_, Device> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stream's handle: destroyed in its `Drop`, once its last holder let go.
struct Handle(Log);

impl Drop for Handle {
    fn drop(&mut self) {
        dev(&self.0).destroys += 1;
    }
}

/// Memory a batch uses, freed when its last keep goes: never before the
/// batch completed (F4).
struct Buffer {
    log: Log,
    batch: u64,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut d = dev(&self.log);
        assert!(
            self.batch < d.completed,
            "F4: the memory of batch {} freed under its copy",
            self.batch
        );
        d.freed += 1;
    }
}

struct Range {
    holds: HoldsOf<Sim>,
    serial: u64,
}

impl Parts for Sim {
    type Handle = Handle;
    type Range = Range;
    type Memory = Option<Arc<Buffer>>;

    fn holds(range: &Range) -> &HoldsOf<Sim> {
        &range.holds
    }

    fn serial(range: &Range) -> u64 {
        range.serial
    }

    fn synchronize(stream: &Handle) -> crate::Result<()> {
        let mut d = dev(&stream.0);
        if d.destroys > 0 {
            d.after_destroy += 1;
        }
        d.completed = d.enqueued;
        Ok(())
    }
}

fn stream(log: &Log) -> Arc<StreamCore<Sim>> {
    StreamCore::with(Handle(log.clone()))
}

fn range() -> Arc<Range> {
    // std's atomic in both builds: no part of the protocol.
    static SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    Arc::new(Range {
        holds: HoldsOf::default(),
        serial: SERIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    })
}

/// `Stream::enqueue`'s order: the driver takes a copy into id 0 of `r`,
/// then the batch is recorded. Returns its sequence number.
fn enqueue(s: &Arc<StreamCore<Sim>>, r: &Arc<Range>, log: &Log) -> u64 {
    enqueue_to(s, &[r], log)
}

/// [`enqueue`] of a batch into id 0 of each of `ranges`.
fn enqueue_to(s: &Arc<StreamCore<Sim>>, ranges: &[&Arc<Range>], log: &Log) -> u64 {
    let batch = {
        let mut d = dev(log);
        d.enqueued += 1;
        d.enqueued - 1
    };
    s.record(KeepOf {
        memory: Some(Arc::new(Buffer {
            log: log.clone(),
            batch,
        })),
        endpoints: ranges.iter().map(|r| (Arc::clone(r), 0)).collect(),
    })
}

/// `Stream`'s drop: synchronize (or leak what is in flight), let go of
/// the handle (its entries are pruned once it is gone).
fn close(s: Arc<StreamCore<Sim>>) {
    if s.synchronize().is_err() {
        s.leak_in_flight();
    }
    drop(s);
}

#[test]
fn f4_a_settle_racing_the_last_streams_drop_never_meets_a_destroyed_stream() {
    model(|| {
        let log = new_log();
        let r = range();
        let s = stream(&log);
        enqueue(&s, &r, &log);
        // The last `Stream` is dropped on another thread while the unbind's
        // settle finds the stream in the range's holds.
        let dropper = thread::spawn(move || close(s));
        let settled = settle_holds(&r.holds, 0);
        assert!(dropper.join().is_ok());
        assert!(settled.is_ok());
        let d = dev(&log);
        assert_eq!(d.after_destroy, 0, "a synchronize met a destroyed stream");
        assert_eq!(d.destroys, 1, "the handle destroyed once");
        assert_eq!(d.freed, 1, "the batch's memory freed once");
        drop(d);
        assert_eq!(live_in(&r.holds), 0, "no live entry outlives the stream");
        // The next settle prunes the entry of the stream gone.
        assert!(settle_holds(&r.holds, 0).is_ok());
        assert!(r.holds.is_empty(), "an entry of a stream gone was kept");
    });
}

/// Another thread records a batch into id 0 of `r` on `s` while this one
/// settles that id. The gate orders an unbind's settle after the enqueues
/// inside it (`gate.rs`): a batch recorded before the settle begins is
/// one, and must be synchronized by it (the stream's `batches` completed).
fn record_racing_a_settle(log: &Log, r: &Arc<Range>, s: &Arc<StreamCore<Sim>>, batches: u64) {
    let recorded = Arc::new(AtomicUsize::new(0));
    let copier = {
        let (log, r, s, recorded) = (log.clone(), r.clone(), s.clone(), recorded.clone());
        thread::spawn(move || {
            enqueue(&s, &r, &log);
            recorded.store(1, Ordering::Release);
        })
    };
    let before = recorded.load(Ordering::Acquire) == 1;
    assert!(settle_holds(&r.holds, 0).is_ok());
    if before {
        assert_eq!(dev(log).completed, batches, "F4: the settle missed a batch");
    }
    assert!(copier.join().is_ok());
}

#[test]
fn f4_a_batch_recorded_before_a_settle_looks_is_synchronized_by_it() {
    model(|| {
        let log = new_log();
        let r = range();
        let s = stream(&log);
        record_racing_a_settle(&log, &r, &s, 1);
        // A settle that synchronized the batch let it go: no record, the
        // memory freed once; the stream's entry stays until it is dropped.
        if dev(&log).completed == 1 {
            assert_eq!(s.in_flight_in(&r.holds), 0, "a record left");
            assert!(s.has_passed(0), "a record left");
            assert_eq!(dev(&log).freed, 1);
        }
        // Whatever the settle saw, the stream's next pass leaves nothing
        // in flight.
        assert!(s.synchronize().is_ok());
        assert_eq!(s.in_flight_in(&r.holds), 0);
        assert_eq!(entries_in(&r.holds, Arc::as_ptr(&s)), 1);
        assert!(s.has_passed(0));
        assert_eq!(dev(&log).freed, 1);
        close(s);
        assert_eq!(live_in(&r.holds), 0, "no live entry outlives the stream");
        assert_eq!(dev(&log).destroys, 1);
    });
}

/// As above, for a stream already on the range (its first batch there
/// passed): its record then takes no lock of the range's, and the settle
/// finds it by the stream's entry and its records alone.
#[test]
fn f4_a_batch_of_a_stream_already_on_the_range_recorded_before_a_settle_looks_is_synchronized_by_it()
 {
    model(|| {
        let log = new_log();
        let r = range();
        let s = stream(&log);
        enqueue(&s, &r, &log);
        assert!(s.synchronize().is_ok());
        record_racing_a_settle(&log, &r, &s, 2);
        assert_eq!(
            entries_in(&r.holds, Arc::as_ptr(&s)),
            1,
            "one entry per stream"
        );
        close(s);
        let d = dev(&log);
        assert_eq!((d.freed, d.destroys), (2, 1));
        assert_eq!(live_in(&r.holds), 0);
    });
}

#[test]
fn f4_a_passed_batch_is_let_go_once_whoever_passes_it() {
    model(|| {
        let log = new_log();
        let r = range();
        let s = stream(&log);
        let first = enqueue(&s, &r, &log);
        // A synchronize on another thread (the owner's, or a settle's)
        // while this one records a second batch and observes an event
        // after the first.
        let syncer = {
            let s = s.clone();
            thread::spawn(move || assert!(s.synchronize().is_ok()))
        };
        let second = enqueue(&s, &r, &log);
        {
            let mut d = dev(&log);
            d.completed = d.completed.max(first + 1);
        }
        s.passed_through(first);
        assert!(syncer.join().is_ok());
        // The first batch is let go, once, by whichever passed it first;
        // the second only if the synchronize covered it (its memory checks
        // that the batch completed when it is freed).
        assert!(s.has_passed(first));
        let covered = s.has_passed(second);
        assert_eq!(dev(&log).freed, 1 + u32::from(covered));
        close(s);
        let d = dev(&log);
        assert_eq!((d.freed, d.destroys), (2, 1));
        assert_eq!(live_in(&r.holds), 0);
    });
}

#[test]
fn f4_a_batch_on_two_ranges_recorded_while_both_are_settled_is_synchronized_by_each() {
    model(|| {
        let log = new_log();
        let (r1, r2) = (range(), range());
        let s = stream(&log);
        let recorded = Arc::new(AtomicUsize::new(0));
        // The record takes the stream's lock, then (its first on each)
        // each range's; the two settles each a range's, then (after
        // letting it go) the stream's.
        let copier = {
            let (log, r1, r2, s, recorded) = (
                log.clone(),
                r1.clone(),
                r2.clone(),
                s.clone(),
                recorded.clone(),
            );
            thread::spawn(move || {
                enqueue_to(&s, &[&r1, &r2], &log);
                recorded.store(1, Ordering::Release);
            })
        };
        let other = {
            let (r1, recorded) = (r1.clone(), recorded.clone());
            thread::spawn(move || {
                let before = recorded.load(Ordering::Acquire) == 1;
                (before, settle_holds(&r1.holds, 0).is_ok())
            })
        };
        let before = recorded.load(Ordering::Acquire) == 1;
        assert!(settle_holds(&r2.holds, 0).is_ok());
        if before {
            assert_eq!(dev(&log).completed, 1, "F4: the settle missed a batch");
        }
        let Ok((before, settled)) = other.join() else {
            unreachable!("the other settle panicked")
        };
        assert!(settled);
        if before {
            assert_eq!(dev(&log).completed, 1, "F4: the settle missed a batch");
        }
        assert!(copier.join().is_ok());
        if dev(&log).completed == 1 {
            let left = s.in_flight_in(&r1.holds) + s.in_flight_in(&r2.holds);
            assert_eq!(left, 0, "a record left");
            assert_eq!(dev(&log).freed, 1);
        }
        close(s);
        assert_eq!(live_in(&r1.holds) + live_in(&r2.holds), 0);
        let d = dev(&log);
        assert_eq!((d.freed, d.destroys), (1, 1));
    });
}

/// What a sequence of [`f4_a_ranges_entries_are_its_live_streams_and_their_records_what_is_in_flight`] does.
#[cfg(not(loom))]
#[derive(Clone, Debug)]
enum Step {
    /// Stream `.0` records a batch into id 0 of each range named (repeats
    /// allowed: one endpoint each).
    Record(usize, Vec<usize>),
    /// Stream `.0` passed its batches up to `.1` below its next number
    /// (an event observed; `.1` past its batches picks none).
    Passed(usize, u64),
    Synchronize(usize),
    Drop(usize),
}

#[cfg(not(loom))]
use proptest::strategy::Strategy;

/// The ranges of the proptest: more than a stream remembers having an
/// entry in (`ENTERED`), so that it enters a range again.
#[cfg(not(loom))]
const RANGES: usize = 6;

#[cfg(not(loom))]
proptest::proptest! {
    /// After any order of records, passes (an event's, which may pick
    /// none), synchronizes and drops on three streams: a range's entries
    /// are one per live stream that recorded a batch on it, and each
    /// stream's records name it once per endpoint of each batch in flight
    /// on it (what a settle reads), against a plain model. The one-record
    /// fast path of `StreamCore::passed`, and the record that enters a
    /// range only the first time (issue 30).
    #[test]
    fn f4_a_ranges_entries_are_its_live_streams_and_their_records_what_is_in_flight(
        steps in proptest::collection::vec(
            proptest::prop_oneof![
                3 => (0..3usize, proptest::collection::vec(0..RANGES, 1..=3))
                    .prop_map(|(s, r)| Step::Record(s, r)),
                1 => (0..3usize, 0..4u64).prop_map(|(s, back)| Step::Passed(s, back)),
                1 => (0..3usize).prop_map(Step::Synchronize),
                1 => (0..3usize).prop_map(Step::Drop),
            ],
            0..14,
        )
    ) {
        let log = new_log();
        let ranges: Vec<Arc<Range>> = (0..RANGES).map(|_| range()).collect();
        let mut streams: Vec<Option<Arc<StreamCore<Sim>>>> =
            (0..3).map(|_| Some(stream(&log))).collect();
        // The model: (stream, batch number, ranges named) in flight, and
        // (stream, range) for each range a live stream entered.
        let mut in_flight: Vec<(usize, u64, Vec<usize>)> = Vec::new();
        let mut entered: Vec<(usize, usize)> = Vec::new();
        for step in steps {
            match step {
                Step::Record(s, named) => {
                    let Some(stream) = &streams[s] else { continue };
                    let on: Vec<&Arc<Range>> = named.iter().map(|&i| &ranges[i]).collect();
                    let seq = enqueue_to(stream, &on, &log);
                    for &i in &named {
                        if !entered.contains(&(s, i)) {
                            entered.push((s, i));
                        }
                    }
                    in_flight.push((s, seq, named));
                }
                Step::Passed(s, back) => {
                    let Some(stream) = &streams[s] else { continue };
                    // Up to `back` below the next number: 0 is past every
                    // batch recorded so far; nothing when it would wrap.
                    let Some(seq) = stream.enqueued().checked_sub(back) else { continue };
                    // The device completed what an event after it says.
                    let mut d = dev(&log);
                    d.completed = d.enqueued;
                    drop(d);
                    stream.passed_through(seq);
                    in_flight.retain(|&(i, q, _)| !(i == s && q <= seq));
                }
                Step::Synchronize(s) => {
                    let Some(stream) = &streams[s] else { continue };
                    proptest::prop_assert!(stream.synchronize().is_ok());
                    in_flight.retain(|&(i, ..)| i != s);
                }
                Step::Drop(s) => {
                    let Some(stream) = streams[s].take() else { continue };
                    close(stream);
                    in_flight.retain(|&(i, ..)| i != s);
                    entered.retain(|&(i, _)| i != s);
                }
            }
            for (i, r) in ranges.iter().enumerate() {
                let got = live_in(&r.holds);
                let want = entered.iter().filter(|&&(_, x)| x == i).count();
                proptest::prop_assert_eq!(got, want, "range {}", i);
                proptest::prop_assert_eq!(r.holds.len.load(Ordering::Acquire), r.holds.lock().len());
                for (s, stream) in streams.iter().enumerate() {
                    let Some(stream) = stream else { continue };
                    let want: usize = in_flight
                        .iter()
                        .filter(|(at, ..)| *at == s)
                        .map(|(_, _, named)| named.iter().filter(|&&x| x == i).count())
                        .sum();
                    let got = stream.in_flight_in(&r.holds);
                    proptest::prop_assert_eq!(got, want, "stream {} on range {}", s, i);
                    let entries = entries_in(&r.holds, Arc::as_ptr(stream));
                    let want = usize::from(entered.contains(&(s, i)));
                    proptest::prop_assert_eq!(entries, want, "stream {}'s entries in range {}", s, i);
                }
            }
        }
        for stream in streams.into_iter().flatten() {
            close(stream);
        }
        for r in &ranges {
            proptest::prop_assert_eq!(live_in(&r.holds), 0);
        }
    }
}

//! What is in flight on each endpoint id, and the streams it is in flight
//! on (F4, F8): a stream's handle with its in-flight records
//! ([`StreamInner`], destroyed by its last holder), each range's list of
//! the streams that copy to it and the graphs naming it ([`Holds`]), and
//! [`settle`]/[`settle_destroy`], which an unbind and a destroy call first.
//!
//! - the handle's life: it lives in a shared `StreamInner`, destroyed
//!   (`cuStreamDestroy`) by its last `Arc` holder, as cudarc's
//!   `CudaStream`. A settle that found the stream in a range's holds, or
//!   an event that reached it, holds it (a strong `Arc`) for its
//!   synchronize: a `Stream` dropped on another thread meanwhile leaves
//!   the handle to it, so no synchronize ever meets a destroyed stream;
//! - the stream's *in-flight records* (F4, as R7.2 for bindings): each
//!   enqueued batch leaves, until the stream is synchronized, the memory it
//!   reads or writes and the id ranges of its endpoints ([`Keep`]). So a
//!   forgotten in-flight token (`mem::forget`) can free nothing a copy
//!   still uses: the memory lives until the stream passed the copy, and
//!   [`settle`] synchronizes every stream with a copy in flight on that id
//!   first;
//! - each range's holds: one entry per stream that recorded a batch on the
//!   range, from its first record there for as long as the stream lives
//!   (an entry whose stream is gone is pruned by the next settle or entry
//!   there), and one per graph and id. The stream remembers the last few
//!   ranges it has an entry in (by address and serial, under the lock of
//!   its records: it never reaches a range through them), so a batch's
//!   record is one lock, the stream's, and its pass the same lock again: a
//!   loop of copies to one endpoint never takes the range's lock (issue
//!   30). [`settle`] reads one atomic load of the range's count when no
//!   stream ever copied to the range and no graph names it; else it asks
//!   each live stream, under its lock, whether a record names the id. An
//!   entry holds its stream weakly, so it never keeps a handle alive; and
//!   nothing holds a range weakly (`range.rs` changes a range whose last
//!   `Arc` it holds in place).
//!
//! When a synchronize fails, the records stay: the memory is leaked rather
//! than freed under a copy that may still run.
//!
//! The protocol is generic over its [`Parts`] (the stream's handle and its
//! synchronize, the range, the memory), as the gate is over its range, and
//! its locks and atomics are [`crate::sync`]'s: `holds_tests.rs` runs it on
//! stand-ins that count each stream's synchronizes and destroys, under
//! loom (`ci/loom.sh`) through every interleaving. The crate's own parts
//! are [`Cuda`]; [`StreamInner`], [`Keep`] and [`Holds`] name them.

use std::any::Any;
// loom has no `Weak`: std's `Arc` and `Weak` in both builds. Their counts
// are no preemption points of loom's, but the locks around them are, so the
// orders of an upgrade and a last drop on two threads are all explored.
use std::sync::{Arc, Weak};

use crate::sync::{AtomicU64, AtomicUsize, Lock, LockGuard, Ordering};

use smallvec::SmallVec;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::error::{Error, Result};

use super::RangeInner;

/// What the hold/settle protocol is generic over, as the gate is over
/// [`Gated`](super::gate::Gated): the crate's own streams, ranges and
/// memory ([`Cuda`]), or a test's stand-ins (`holds_tests.rs`, explored by
/// loom: `ci/loom.sh`).
pub(crate) trait Parts: Sized + 'static {
    /// A stream's handle, synchronized by [`Parts::synchronize`] and
    /// destroyed by its own `Drop`, when the last holder of its
    /// [`StreamCore`] lets go.
    type Handle;
    /// An id range: where its [`HoldsOf`] are.
    type Range;
    /// The memory a batch keeps alive until the stream passed it.
    type Memory: Clone + Default;
    /// The holds of `range`.
    fn holds(range: &Self::Range) -> &HoldsOf<Self>;
    /// A number no other range of the process had at that address
    /// ([`RangeInner::serial`]): with the address, what a stream
    /// remembers of the ranges it has an entry in.
    fn serial(range: &Self::Range) -> u64;
    /// Waits until the stream completed every batch enqueued so far.
    fn synchronize(stream: &Self::Handle) -> Result<()>;
}

/// The crate's parts: [`StreamHandle`], [`RangeInner`], [`KeepMemory`].
pub(crate) enum Cuda {}

impl Parts for Cuda {
    type Handle = StreamHandle;
    type Range = RangeInner;
    type Memory = KeepMemory;

    #[inline]
    fn holds(range: &RangeInner) -> &Holds {
        &range.holds
    }

    #[inline]
    fn serial(range: &RangeInner) -> u64 {
        range.serial
    }

    #[inline]
    fn synchronize(stream: &StreamHandle) -> Result<()> {
        // SAFETY: the stream is this object's own and live until its Drop.
        let r = unsafe { stream.ctx.driver().stream_synchronize(stream.handle) };
        stream.ctx.check(Call::StreamSynchronize, r)
    }
}

/// What one enqueued batch keeps alive until the stream passed it.
pub(crate) type Keep = KeepOf<Cuda>;

/// What one enqueued batch keeps alive until the stream passed it. A batch
/// usually names one allocation and one endpoint: inline, no allocation.
pub(crate) struct KeepOf<P: Parts> {
    /// Local memory read or written (`Mapped` keep-alives).
    pub memory: P::Memory,
    /// The id ranges of the endpoints, with the ids in flight.
    pub endpoints: SmallVec<[(Arc<P::Range>, u32); 1]>,
}

impl<P: Parts> Clone for KeepOf<P> {
    fn clone(&self) -> Self {
        KeepOf {
            memory: self.memory.clone(),
            endpoints: self.endpoints.clone(),
        }
    }
}

impl<P: Parts> Default for KeepOf<P> {
    fn default() -> Self {
        KeepOf {
            memory: P::Memory::default(),
            endpoints: SmallVec::new(),
        }
    }
}

/// Keep-alives of memory a batch reads or writes.
pub(crate) type KeepMemory = SmallVec<[crate::memory::KeepAlive; 1]>;

/// The crate's streams.
pub(crate) type StreamInner = StreamCore<Cuda>;

/// A stream's handle and its in-flight records, shared: by the
/// [`Stream`](crate::Stream), and for the length of one call by a settle
/// ([`settle`]) or an [`Event`](crate::Event) that reached it through a
/// range's holds or its `Weak`. The handle is destroyed in its `Drop`, by
/// its last holder (as cudarc's `CudaStream`), so whoever synchronizes it
/// holds it and never meets a destroyed stream. Derefs to its handle
/// (`inner.ctx`, `inner.handle`).
pub(crate) struct StreamCore<P: Parts> {
    /// First: destroyed before the records below are let go, as the
    /// stream's own `Drop` did.
    stream: P::Handle,
    /// Batches enqueued since the last successful synchronize, and the
    /// last ranges this stream entered ([`Records`]).
    inflight: Lock<Records<P>>,
    /// The next batch's sequence number: moved under the `inflight` lock,
    /// read without it ([`StreamCore::enqueued`]).
    next_seq: AtomicU64,
}

impl<P: Parts> std::ops::Deref for StreamCore<P> {
    type Target = P::Handle;

    #[inline]
    fn deref(&self) -> &P::Handle {
        &self.stream
    }
}

/// A stream's in-flight records and the last ranges it entered, under one
/// lock.
pub(crate) struct Records<P: Parts> {
    /// Batches enqueued since the last successful synchronize, each with
    /// its sequence number.
    list: Vec<(u64, KeepOf<P>)>,
    /// The last [`ENTERED`] ranges whose holds have this stream's entry,
    /// by address and serial ([`Parts::serial`]: a range gone and another
    /// made at its address differ): an entry stays for the stream's life,
    /// so a range found here needs none. Never dereferenced, and no
    /// reference count: an idle stream keeps no range alive.
    on: SmallVec<[(usize, u64); ENTERED]>,
}

/// How many ranges a stream remembers having an entry in ([`Records::on`]);
/// one more takes the range's lock once to find its entry there.
const ENTERED: usize = 4;

/// A stream of the driver's: destroyed (`cuStreamDestroy`) in its `Drop`,
/// unless borrowed.
pub(crate) struct StreamHandle {
    pub(crate) ctx: Context,
    pub(crate) dev: Device,
    pub(crate) handle: u64,
    /// A stream this crate did not make (cudarc's): kept alive by this,
    /// synchronized but never destroyed here.
    borrowed: Option<Arc<dyn Any + Send + Sync>>,
}

/// What may hold an endpoint id of a range: a stream that recorded a batch
/// there (its records say which ids are in flight now), or a graph of
/// copies that names the id (for the graph's whole life, F8).
enum Holder<P: Parts> {
    /// A stream that entered the range ([`Records::on`]).
    Stream(Weak<StreamCore<P>>),
    /// The graph numbered `.1` ([`pin_for_graph`]) names id `.0`.
    Graph(u32, u64),
}

impl<P: Parts> Holder<P> {
    /// Whether this is the entry of the stream at `stream` (gone or not:
    /// the entry's `Weak` keeps the address from being another stream's).
    fn is_stream(&self, stream: *const StreamCore<P>) -> bool {
        matches!(self, Holder::Stream(s) if std::ptr::eq(s.as_ptr(), stream))
    }

    /// Whether this is the entry of a stream that is gone.
    fn is_gone(&self) -> bool {
        matches!(self, Holder::Stream(s) if s.strong_count() == 0)
    }
}

/// Who may hold the ids of one range (a field of its [`RangeInner`]): one
/// entry per stream that recorded a batch on the range (pruned once the
/// stream is gone), and one per graph and id it names, gone when the graph
/// is dropped. Whether a batch is in flight on an id now is in its
/// stream's records.
pub(crate) struct HoldsOf<P: Parts> {
    list: Lock<Vec<Holder<P>>>,
    /// `list.len()`, read without the lock.
    len: AtomicUsize,
}

/// The holds of the crate's ranges.
pub(crate) type Holds = HoldsOf<Cuda>;

impl<P: Parts> Default for HoldsOf<P> {
    fn default() -> Self {
        HoldsOf {
            list: Lock::new(Vec::new()),
            len: AtomicUsize::new(0),
        }
    }
}

impl<P: Parts> HoldsOf<P> {
    fn lock(&self) -> LockGuard<'_, Vec<Holder<P>>> {
        self.list.lock()
    }

    /// Pushes one entry.
    fn push(&self, holder: Holder<P>) {
        let mut list = self.lock();
        list.push(holder);
        self.len.store(list.len(), Ordering::Release);
    }

    /// The entry of `stream`, made unless it has one; the entries of
    /// streams gone are pruned.
    fn enter(&self, stream: &Arc<StreamCore<P>>) {
        let me = Arc::as_ptr(stream);
        let mut list = self.lock();
        self.retain(&mut list, |h| !h.is_gone());
        if !list.iter().any(|h| h.is_stream(me)) {
            list.push(Holder::Stream(Arc::downgrade(stream)));
            self.len.store(list.len(), Ordering::Release);
        }
    }

    /// The live streams with an entry (entries of streams gone pruned),
    /// each held for the caller's synchronize; or
    /// [`Error::UnbindUnderGraph`] when a graph names `id`.
    fn streams(&self, id: u32) -> Result<Vec<Arc<StreamCore<P>>>> {
        let mut list = self.lock();
        if list
            .iter()
            .any(|h| matches!(h, Holder::Graph(i, _) if *i == id))
        {
            return Err(Error::UnbindUnderGraph { id });
        }
        self.retain(&mut list, |h| !h.is_gone());
        // A stream dropped since does not upgrade (it was synchronized).
        // One that does is held (a strong `Arc`) until its synchronize
        // returned. One entry per stream: no stream twice.
        Ok(list
            .iter()
            .filter_map(|h| match h {
                Holder::Stream(s) => s.upgrade(),
                Holder::Graph(..) => None,
            })
            .collect())
    }

    /// Drops the entries `gone` picks.
    fn forget(&self, gone: impl Fn(&Holder<P>) -> bool) {
        let mut list = self.lock();
        self.retain(&mut list, |h| !gone(h));
    }

    /// Keeps the entries `keep` picks, under the lock held as `list`.
    fn retain(&self, list: &mut Vec<Holder<P>>, keep: impl Fn(&Holder<P>) -> bool) {
        list.retain(keep);
        // Capacity given back once the entries fell well below it (many
        // streams or graphs gone); a small list is kept.
        let len = list.len();
        if list.capacity() > 64 && len < list.capacity() / 4 {
            list.shrink_to(len.saturating_mul(2));
        }
        self.len.store(len, Ordering::Release);
    }

    /// Whether nothing is in flight on the range (one load).
    #[inline]
    fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }
}

/// The number of the next graph that pins its ids (std's atomic in both
/// builds: a static, and no part of the protocol).
static NEXT_GRAPH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Pins the ids a graph of copies names (F8: "every id valid and bound for
/// as long as the graph may run"): until [`unpin_graph`], unbinding memory
/// of any of them is refused ([`settle`]). Returns the graph's number.
pub(crate) fn pin_for_graph(endpoints: &[(Arc<RangeInner>, u32)]) -> u64 {
    let graph = NEXT_GRAPH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for (range, id) in endpoints {
        range.holds.push(Holder::Graph(*id, graph));
    }
    graph
}

/// The graph numbered `graph`, of `endpoints`, is gone: its ids may be
/// unbound again.
pub(crate) fn unpin_graph(endpoints: &[(Arc<RangeInner>, u32)], graph: u64) {
    let mut last: *const Holds = std::ptr::null();
    for (range, _) in endpoints {
        // A run of one range's endpoints is forgotten at once.
        if !std::ptr::eq(last, &range.holds) {
            range
                .holds
                .forget(|h| matches!(h, Holder::Graph(_, g) if *g == graph));
        }
        last = &range.holds;
    }
}

/// Before a binding on `id` of `range` is unbound: synchronizes every
/// stream with a copy in flight on it (F4).
///
/// # Errors
/// [`Error::UnbindUnderGraph`] while a graph of copies names the id (F8),
/// before any synchronize; else the first synchronize that failed: the
/// caller must not go on (the copy may still run).
#[inline]
pub(crate) fn settle(range: &RangeInner, id: u32) -> Result<()> {
    settle_holds(&range.holds, id)
}

/// [`settle`] on the holds of any [`Parts`].
#[inline]
fn settle_holds<P: Parts>(holds: &HoldsOf<P>, id: u32) -> Result<()> {
    // Inline: with no stream that ever copied to the range and no graph
    // (the usual unbind and destroy), one load and no call.
    if holds.is_empty() {
        return Ok(());
    }
    settle_in_flight(holds, id, false)
}

/// Before the endpoint on `id` of `range` is destroyed: as [`settle`], but
/// a graph's pin on the id is dropped, not refused. A live graph borrows
/// the endpoint, so only a forgotten one (`mem::forget`, never launched
/// again) can still pin it, and its entry must not outlive the endpoint.
///
/// # Errors
/// The first synchronize that failed, as [`settle`].
#[inline]
pub(crate) fn settle_destroy(range: &RangeInner, id: u32) -> Result<()> {
    settle_destroy_holds(&range.holds, id)
}

/// [`settle_destroy`] on the holds of any [`Parts`].
#[inline]
fn settle_destroy_holds<P: Parts>(holds: &HoldsOf<P>, id: u32) -> Result<()> {
    if holds.is_empty() {
        return Ok(());
    }
    settle_in_flight(holds, id, true)
}

/// [`settle`] and [`settle_destroy`] when some stream copied to the range
/// or a graph names it: each stream whose records name the id is
/// synchronized.
#[cold]
#[inline(never)]
fn settle_in_flight<P: Parts>(holds: &HoldsOf<P>, id: u32, destroying: bool) -> Result<()> {
    if destroying {
        holds.forget(|h| matches!(h, Holder::Graph(i, _) if *i == id));
    }
    // The range's lock is let go before a stream's is taken (the record
    // takes the stream's, then a range's).
    for s in holds.streams(id)? {
        if s.names(holds, id) {
            s.synchronize()?;
        }
    }
    Ok(())
}

/// The live entries in `range` of the stream at `me` (tests: 1 from its
/// first record there for as long as it lives).
#[cfg(all(test, feature = "model"))]
pub(crate) fn entries_of(range: &RangeInner, me: *const StreamInner) -> usize {
    entries_in(&range.holds, me)
}

/// The live entries in `holds` of the stream at `me`.
#[cfg(test)]
fn entries_in<P: Parts>(holds: &HoldsOf<P>, me: *const StreamCore<P>) -> usize {
    holds
        .lock()
        .iter()
        .filter(|h| h.is_stream(me) && !h.is_gone())
        .count()
}

/// The live entries in `holds`: streams that live, and graphs (tests).
#[cfg(test)]
fn live_in<P: Parts>(holds: &HoldsOf<P>) -> usize {
    holds.lock().iter().filter(|h| !h.is_gone()).count()
}

/// The batches of `stream` in flight on `range` by its records (tests),
/// one per endpoint of the range each names.
#[cfg(all(test, feature = "model"))]
pub(crate) fn in_flight_on(range: &RangeInner, stream: &StreamInner) -> usize {
    stream.in_flight_in(&range.holds)
}

impl StreamInner {
    /// A stream's handle, with nothing in flight yet.
    pub(crate) fn new(
        ctx: &Context,
        dev: Device,
        handle: u64,
        borrowed: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Arc<StreamInner> {
        StreamCore::with(StreamHandle {
            ctx: ctx.clone(),
            dev,
            handle,
            borrowed,
        })
    }
}

impl<P: Parts> StreamCore<P> {
    /// `stream`, with nothing in flight yet.
    fn with(stream: P::Handle) -> Arc<Self> {
        Arc::new(StreamCore {
            stream,
            inflight: Lock::new(Records {
                list: Vec::new(),
                on: SmallVec::new(),
            }),
            next_seq: AtomicU64::new(0),
        })
    }

    /// A synchronize failed for good (the `Stream` is dropped): copies may
    /// still run, so what they use is kept alive for ever, and no record
    /// is left for a settle to find (a later unbind cannot wait for a
    /// stream its owner let go of).
    pub(crate) fn leak_in_flight(&self) {
        std::mem::forget(std::mem::take(&mut self.lock().list));
    }

    /// Records a batch just enqueued; returns its sequence number. One
    /// lock, the stream's: its entry in each range of the batch is there
    /// from its first record on the range.
    // Always: a call cost a one-op batch 9 instructions (859 -> 850 on
    // `Null`, `benches/copy_batch.rs`).
    #[inline(always)]
    pub(crate) fn record(self: &Arc<Self>, keep: KeepOf<P>) -> u64 {
        // The stream's lock across the number, the entries and the record:
        // a pass that covers the batch (its `before` read after the number
        // was taken) finds its record; a settle that finds the stream in a
        // range after this finds the record.
        let (mut records, seq) = self.numbered();
        for (range, _) in &keep.endpoints {
            self.entered(&mut records, range);
        }
        records.list.push((seq, keep));
        seq
    }

    /// [`StreamCore::record`] of a batch on one range, `range`, the one of
    /// `keep`'s one endpoint (the one-put lane's on the portable path, its
    /// windows' memory in `keep` too): its entry found without a walk of
    /// `keep`'s list (a one-put batch there 539 -> 523 instructions on
    /// `Null`, the route's put 323 -> 308: `benches/copy_portable.rs`).
    #[inline(always)]
    pub(crate) fn record_on(self: &Arc<Self>, range: &P::Range, keep: KeepOf<P>) -> u64 {
        debug_assert!(matches!(&keep.endpoints[..], [(r, _)] if std::ptr::eq(&**r, range)));
        let (mut records, seq) = self.numbered();
        self.entered(&mut records, range);
        records.list.push((seq, keep));
        seq
    }

    /// [`StreamCore::record`] of the keep of one memory, `memory`, and the
    /// endpoint on `id` of `range` (the one-put lane's): its entry found
    /// without a walk of the keep's list (a one-put batch 427 -> 416
    /// instructions on `Null`, the route's put 214 -> 196), the keep made
    /// where it is recorded (not made before and moved in, with the lane's
    /// unwinding record and its portable record out of line: 401 -> 385,
    /// the route's put 195 -> 187; `benches/copy_batch.rs`).
    #[inline(always)]
    pub(crate) fn record_one(
        self: &Arc<Self>,
        range: &Arc<P::Range>,
        id: u32,
        memory: P::Memory,
    ) -> u64 {
        let (mut records, seq) = self.numbered();
        self.entered(&mut records, range);
        let list = &mut records.list;
        if list.len() == list.capacity() {
            list.reserve(1);
        }
        let endpoints = SmallVec::from_buf([(range.clone(), id)]);
        let len = list.len();
        // SAFETY: the list has room for one more (just above): the slot
        // at `len` lies in its allocation, unused, written before the
        // length counts it. Unsafe for speed: `push`, which the inliner
        // left out of line in the lane, measured a one-put batch 412
        // instructions against 385, the route's put 200 against 187
        // (`Null`, `benches/copy_batch.rs`).
        unsafe {
            list.as_mut_ptr()
                .add(len)
                .write((seq, KeepOf { memory, endpoints }));
            list.set_len(len + 1);
        }
        seq
    }

    /// The stream's records, locked, and the next batch's number, taken.
    #[inline(always)]
    fn numbered(&self) -> (LockGuard<'_, Records<P>>, u64) {
        let records = self.lock();
        let seq = self.next_seq.load(Ordering::Relaxed);
        self.next_seq.store(seq.wrapping_add(1), Ordering::Release);
        (records, seq)
    }

    /// This stream's entry in the holds of `range`, made unless it is
    /// known there.
    #[inline(always)]
    fn entered(self: &Arc<Self>, records: &mut Records<P>, range: &P::Range) {
        let key = (std::ptr::from_ref(range).addr(), P::serial(range));
        if !records.on.contains(&key) {
            self.enter(records, range, key);
        }
    }

    /// A record on `range`, which this stream does not remember entering:
    /// its entry there (made unless the range has it), before the record
    /// (under the stream's lock, then the range's); remembered in place of
    /// the oldest.
    #[cold]
    #[inline(never)]
    fn enter(self: &Arc<Self>, records: &mut Records<P>, range: &P::Range, key: (usize, u64)) {
        P::holds(range).enter(self);
        if records.on.len() == ENTERED {
            records.on.remove(0);
        }
        records.on.push(key);
    }

    /// Whether a record of this stream names `id` of the range whose holds
    /// are `holds`: a batch on it may be in flight.
    fn names(&self, holds: &HoldsOf<P>, id: u32) -> bool {
        self.lock().list.iter().any(|(_, k)| {
            k.endpoints
                .iter()
                .any(|(r, i)| *i == id && std::ptr::eq(P::holds(r), holds))
        })
    }

    /// The endpoints on the range whose holds are `holds` of this stream's
    /// records (tests: what is in flight there).
    #[cfg(test)]
    fn in_flight_in(&self, holds: &HoldsOf<P>) -> usize {
        self.lock()
            .list
            .iter()
            .flat_map(|(_, k)| k.endpoints.iter())
            .filter(|(r, _)| std::ptr::eq(P::holds(r), holds))
            .count()
    }

    /// The stream passed batch `seq` (an event after it was observed): the
    /// records of the batches up to it go.
    pub(crate) fn passed_through(&self, seq: u64) {
        self.passed(|s| s <= seq);
    }

    /// The stream passed every batch whose number `done` picks: drop their
    /// records (so that a later destroy or unbind synchronizes nothing for
    /// them).
    fn passed(&self, done: impl Fn(u64) -> bool + Copy) {
        let mut records = self.lock();
        // The usual wait: the stream's one record, taken without a list
        // (`InFlight::wait` of a one-op batch 650 -> 417 instructions on
        // `Null`, `benches/copy_batch.rs`: the `Vec` this was collected
        // into was an allocation and a free per wait).
        if let [(seq, _)] = &records.list[..]
            && done(*seq)
        {
            let one = records.list.pop();
            drop(records);
            drop(one); // may release memory: outside the lock
            return;
        }
        // Taken out in place: the list keeps its capacity for the next
        // record (no allocation per enqueue), and a few records taken out
        // stay inline.
        let done_now: SmallVec<[(u64, KeepOf<P>); 2]> =
            records.list.extract_if(.., |(s, _)| done(*s)).collect();
        drop(records);
        drop(done_now); // may release memory: outside the lock
    }

    /// Whether the stream is known to have passed batch `seq` (its record
    /// was let go: waited, an event after it observed, or synchronized).
    pub(crate) fn has_passed(&self, seq: u64) -> bool {
        !self.lock().list.iter().any(|(s, _)| *s == seq)
    }

    fn lock(&self) -> LockGuard<'_, Records<P>> {
        self.inflight.lock()
    }

    /// `cuStreamSynchronize`; on success lets go of every in-flight record
    /// (outside the locks: dropping memory may call the driver).
    pub(crate) fn synchronize(&self) -> Result<()> {
        let before = self.enqueued();
        P::synchronize(&self.stream)?;
        self.passed_before(before);
        Ok(())
    }

    /// The number the next batch will take, read before a call that
    /// completes the stream: every batch numbered below it was enqueued on
    /// the driver before (its number is taken after its enqueue), so the
    /// call covers it; one another thread enqueues during the call may not
    /// be covered, and must keep what it uses.
    pub(crate) fn enqueued(&self) -> u64 {
        self.next_seq.load(Ordering::Acquire)
    }

    /// The stream passed every batch numbered below `before`.
    pub(crate) fn passed_before(&self, before: u64) {
        self.passed(|s| s < before);
    }
}

impl Drop for StreamHandle {
    /// The last holder of its [`StreamCore`] let go (the `Stream`, or a
    /// settle or an event that held it for a synchronize): nothing can
    /// reach the handle any more.
    fn drop(&mut self) {
        if self.borrowed.is_some() {
            // cudarc's stream: cudarc destroys it.
            return;
        }
        crate::unwind::in_drop(|| {
            // SAFETY: the stream is this object's own, and this is its last
            // holder: nothing uses the handle after.
            let r = unsafe { self.ctx.driver().stream_destroy(self.handle) };
            if let Err(e) = self.ctx.check(Call::StreamDestroy, r) {
                self.ctx.record_teardown(e);
            }
        });
    }
}

#[cfg(test)]
#[path = "holds_tests.rs"]
mod tests;

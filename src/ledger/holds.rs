//! What is in flight on each endpoint id, and the streams it is in flight
//! on (F4, F8): a stream's handle with its in-flight records
//! ([`StreamInner`], destroyed by its last holder), each range's list of
//! the batches in flight on its ids and the graphs naming them
//! ([`Holds`]), and [`settle`]/[`settle_destroy`], which an unbind and a
//! destroy call first.
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
//! - each range's holds: one entry per batch (or graph) and id, read by
//!   [`settle`] (one atomic load of the range's count, unless a copy is in
//!   flight on the range or a graph names it). An entry goes when the
//!   stream passed its batch (synchronize, query, an event after it) or
//!   the stream is dropped, and when its graph is dropped; an entry holds
//!   its stream weakly, so it never keeps a handle alive.
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
    /// Batches enqueued since the last successful synchronize, each with
    /// its sequence number.
    inflight: Lock<Vec<(u64, KeepOf<P>)>>,
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

/// What holds an endpoint id: a stream's batch in flight (until the
/// stream passed it), or a graph of copies that names the id (for the
/// graph's whole life, F8).
enum Holder<P: Parts> {
    /// Batch `seq` of the stream.
    Batch(Weak<StreamCore<P>>, u64),
    /// The graph numbered so ([`pin_for_graph`]).
    Graph(u64),
}

impl<P: Parts> Holder<P> {
    /// Whether this is one of `stream`'s batches that `done`.
    fn of_batch(&self, stream: *const StreamCore<P>, done: impl Fn(u64) -> bool) -> bool {
        matches!(self, Holder::Batch(s, seq) if std::ptr::eq(s.as_ptr(), stream) && done(*seq))
    }
}

/// What is in flight on the ids of one range (a field of its
/// [`RangeInner`]): one entry per batch (or graph) and id, gone once the
/// stream passed the batch (a synchronize, a query, an event after it),
/// the stream was dropped, or the graph was dropped. So its length is what
/// is in flight now, not what ever was. Each batch that holds an entry
/// holds the range (`Keep::endpoints`), so no entry outlives its range.
pub(crate) struct HoldsOf<P: Parts> {
    list: Lock<Vec<(u32, Holder<P>)>>,
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
    fn lock(&self) -> LockGuard<'_, Vec<(u32, Holder<P>)>> {
        self.list.lock()
    }

    /// Pushes an entry for each id of the run of `endpoints` at its start
    /// that names this range (a batch's endpoints of one range are usually
    /// one run): one lock per run. Returns the length of the run.
    fn push_run(
        &self,
        endpoints: &[(Arc<P::Range>, u32)],
        holder: impl Fn() -> Holder<P>,
    ) -> usize {
        let mut list = self.lock();
        let mut n = 0;
        for (range, id) in endpoints {
            if !std::ptr::eq(P::holds(range), self) {
                break;
            }
            list.push((*id, holder()));
            n += 1;
        }
        self.len.store(list.len(), Ordering::Release);
        n
    }

    /// Pushes one entry.
    // Always: out of line, a one-op batch cost 17 instructions more (846
    // -> 829 on `Null`, `benches/copy_batch.rs`; portable 1,039 -> 1,020).
    #[inline(always)]
    fn push_one(&self, id: u32, holder: Holder<P>) {
        let mut list = self.lock();
        list.push((id, holder));
        self.len.store(list.len(), Ordering::Release);
    }

    /// Drops the entries `gone` picks.
    fn forget(&self, gone: impl Fn(u32, &Holder<P>) -> bool) {
        let mut list = self.lock();
        if let [(id, h)] = &list[..] {
            // The usual wait: the range's one entry, without `retain`.
            if gone(*id, h) {
                list.clear();
                self.len.store(0, Ordering::Release);
            }
            return;
        }
        list.retain(|(id, h)| !gone(*id, h));
        // Capacity given back once what is in flight fell well below it (a
        // burst of forgotten batches, then a synchronize); a small list is
        // kept, so that a loop of waited batches allocates nothing.
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

/// Pushes an entry per endpoint into its range's holds, one lock per run
/// of endpoints of one range.
fn push_all<P: Parts>(endpoints: &[(Arc<P::Range>, u32)], holder: impl Fn() -> Holder<P> + Copy) {
    let mut rest = endpoints;
    while let Some((range, _)) = rest.first() {
        // At least one: the run starts with this range's endpoint.
        let n = P::holds(range).push_run(rest, holder).max(1);
        rest = rest.get(n..).unwrap_or_default();
    }
}

/// The ranges of the endpoints of `keeps`, each run of one range once (a
/// batch's endpoints of one range, and batches on one range, are usually
/// runs): forgetting in a range twice finds nothing the second time, so a
/// range met again after another is only scanned again, in linear time.
fn ranges<'a, P: Parts>(
    keeps: impl Iterator<Item = &'a [(Arc<P::Range>, u32)]>,
) -> impl Iterator<Item = &'a HoldsOf<P>> {
    let mut last: *const HoldsOf<P> = std::ptr::null();
    keeps.flatten().filter_map(move |(range, _)| {
        let holds = P::holds(range);
        let new = !std::ptr::eq(last, holds);
        last = holds;
        new.then_some(holds)
    })
}

/// Pins the ids a graph of copies names (F8: "every id valid and bound for
/// as long as the graph may run"): until [`unpin_graph`], unbinding memory
/// of any of them is refused ([`settle`]). Returns the graph's number.
pub(crate) fn pin_for_graph(endpoints: &[(Arc<RangeInner>, u32)]) -> u64 {
    let graph = NEXT_GRAPH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    push_all::<Cuda>(endpoints, || Holder::Graph(graph));
    graph
}

/// The graph numbered `graph`, of `endpoints`, is gone: its ids may be
/// unbound again.
pub(crate) fn unpin_graph(endpoints: &[(Arc<RangeInner>, u32)], graph: u64) {
    for holds in ranges::<Cuda>(std::iter::once(endpoints)) {
        holds.forget(|_, h| matches!(h, Holder::Graph(g) if *g == graph));
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
    // Inline: with no copy in flight on the range (the usual unbind and
    // destroy), one load and no call.
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

/// [`settle`] and [`settle_destroy`] when some copy may be in flight on the
/// range or a graph names it.
#[cold]
#[inline(never)]
fn settle_in_flight<P: Parts>(holds: &HoldsOf<P>, id: u32, destroying: bool) -> Result<()> {
    if destroying {
        holds.forget(|i, h| i == id && matches!(h, Holder::Graph(_)));
    }
    let mut streams: Vec<Arc<StreamCore<P>>> = Vec::new();
    for (_, holder) in holds.lock().iter().filter(|(i, _)| *i == id) {
        match holder {
            Holder::Graph(_) => return Err(Error::UnbindUnderGraph { id }),
            // A dropped stream does not upgrade (it was synchronized, and
            // its entries are gone with it anyway). One that does is held
            // (a strong `Arc`) until its synchronize below returned.
            Holder::Batch(s, _) => {
                if let Some(s) = s.upgrade()
                    && !streams.iter().any(|o| Arc::ptr_eq(o, &s))
                {
                    streams.push(s);
                }
            }
        }
    }
    for s in streams {
        s.synchronize()?;
    }
    Ok(())
}

/// The entries in `range` of the batches of the stream at `me` (tests:
/// what is left).
#[cfg(all(test, feature = "model"))]
pub(crate) fn entries_of(range: &RangeInner, me: *const StreamInner) -> usize {
    entries_in(&range.holds, me)
}

/// The entries in `holds` of the batches of the stream at `me`.
#[cfg(test)]
fn entries_in<P: Parts>(holds: &HoldsOf<P>, me: *const StreamCore<P>) -> usize {
    holds
        .lock()
        .iter()
        .filter(|(_, h)| h.of_batch(me, |_| true))
        .count()
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
            inflight: Lock::new(Vec::new()),
            next_seq: AtomicU64::new(0),
        })
    }

    /// A synchronize failed for good (the `Stream` is dropped): copies may
    /// still run, so what they use is kept alive for ever; their entries
    /// go (a later unbind cannot wait for a stream its owner let go of).
    pub(crate) fn leak_in_flight(&self) {
        let records = std::mem::take(&mut *self.lock());
        self.forget_entries_of(&records, |_| true);
        std::mem::forget(records);
    }

    /// The `Stream` is dropped: none of its entries may outlive it.
    pub(crate) fn forget_entries(&self) {
        self.forget_entries_of(&self.lock(), |_| true);
    }

    /// Drops this stream's entries of the batches `done` picks from the
    /// ranges `records` name.
    // Always: out of line, `InFlight::wait` of a one-op batch cost 9
    // instructions more (335 -> 326 on `Null`, `benches/copy_batch.rs`).
    #[inline(always)]
    fn forget_entries_of(&self, records: &[(u64, KeepOf<P>)], done: impl Fn(u64) -> bool + Copy) {
        let me: *const StreamCore<P> = self;
        if let [(_, keep)] = records
            && let [(range, _)] = &keep.endpoints[..]
        {
            // The usual wait: one record of one endpoint, without the walk
            // that finds each range once (`InFlight::wait` of a one-op batch
            // 347 -> 321 instructions on `Null`, `benches/copy_batch.rs`;
            // with `HoldsOf::forget`'s one entry taken without `retain`,
            // 399 -> 335 when both came).
            P::holds(range).forget(|_, h| h.of_batch(me, done));
            return;
        }
        for holds in ranges::<P>(records.iter().map(|(_, k)| &k.endpoints[..])) {
            holds.forget(|_, h| h.of_batch(me, done));
        }
    }

    /// Records a batch just enqueued; returns its sequence number.
    // Always: a call cost a one-op batch 9 instructions (859 -> 850 on
    // `Null`, `benches/copy_batch.rs`).
    #[inline(always)]
    pub(crate) fn record(self: &Arc<Self>, keep: KeepOf<P>) -> u64 {
        // The stream's lock across the number, the entries and the record:
        // a pass that covers the batch (its `before` read after the number
        // was taken) finds its record, and so forgets its entries, as one.
        // Lock order: a stream's, then a range's (as `forget_entries`).
        let mut inflight = self.lock();
        let seq = self.next_seq.load(Ordering::Relaxed);
        self.next_seq.store(seq.wrapping_add(1), Ordering::Release);
        // The entries before the lock goes: a settle that looks after this
        // record finds the batch.
        let holder = || Holder::Batch(Arc::downgrade(self), seq);
        if let [(range, id)] = &keep.endpoints[..] {
            // The usual batch: one endpoint, one range.
            P::holds(range).push_one(*id, holder());
        } else {
            push_all(&keep.endpoints, holder);
        }
        inflight.push((seq, keep));
        seq
    }

    /// The stream passed batch `seq` (an event after it was observed): the
    /// records of the batches up to it go, memory and range entries.
    pub(crate) fn passed_through(&self, seq: u64) {
        self.passed(|s| s <= seq);
    }

    /// The stream passed every batch whose number `done` picks: drop their
    /// records, and their entries in their ranges (so that a later destroy
    /// or unbind synchronizes nothing for them, and a range holds only what
    /// is in flight on it).
    fn passed(&self, done: impl Fn(u64) -> bool + Copy) {
        let mut list = self.lock();
        // The usual wait: the stream's one record, taken without a list
        // (`InFlight::wait` of a one-op batch 650 -> 417 instructions on
        // `Null`, `benches/copy_batch.rs`: the `Vec` this was collected
        // into was an allocation and a free per wait).
        if let [(seq, _)] = &list[..]
            && done(*seq)
        {
            let one = list.pop();
            drop(list);
            if let Some(record) = one {
                self.forget_entries_of(std::slice::from_ref(&record), done);
                drop(record); // may release memory: outside the locks
            }
            return;
        }
        // Taken out in place: the list keeps its capacity for the next
        // record (no allocation per enqueue), and a few records taken out
        // stay inline.
        let done_now: SmallVec<[(u64, KeepOf<P>); 2]> =
            list.extract_if(.., |(s, _)| done(*s)).collect();
        drop(list);
        self.forget_entries_of(&done_now, done);
        drop(done_now); // may release memory: outside the locks
    }

    /// Whether the stream is known to have passed batch `seq` (its record
    /// was let go: waited, an event after it observed, or synchronized).
    pub(crate) fn has_passed(&self, seq: u64) -> bool {
        !self.lock().iter().any(|(s, _)| *s == seq)
    }

    fn lock(&self) -> LockGuard<'_, Vec<(u64, KeepOf<P>)>> {
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

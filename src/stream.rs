//! Streams in the crate's own terms: a [`Stream`] is a non-blocking stream
//! made on one device of a [`Context`] (never the legacy NULL stream, F6),
//! that owns what its copies in flight need kept alive.
//!
//! What this file owns:
//! - [`Stream`]: create (`cuStreamCreate`), [`Stream::synchronize`],
//!   [`Stream::query`], and `Drop` (synchronize; a failure is kept on the
//!   context, [`Context::take_teardown_errors`]);
//! - the handle's life: it lives in a shared `StreamInner`, destroyed
//!   (`cuStreamDestroy`) by its last `Arc` holder, as cudarc's
//!   `CudaStream`. A settle that found the stream in the index, or an
//!   event that reached it, holds it for its synchronize: a `Stream`
//!   dropped on another thread meanwhile leaves the handle to it, so no
//!   synchronize ever meets a destroyed stream;
//! - the stream's *in-flight records* (F4, as R7.2 for bindings): each
//!   enqueued batch leaves, until the stream is synchronized, the memory it
//!   reads or writes (`Mapped::keep_alive`) and the id ranges of its
//!   endpoints. So a forgotten in-flight token (`mem::forget`) can free
//!   nothing a copy still uses: the memory lives until the stream passed
//!   the copy, and [`settle`] — called by an endpoint's destroy and a
//!   binding's unbind — synchronizes every stream with a copy in flight on
//!   that id first;
//! - the process-wide index from `(range, id)` to the batches in flight on
//!   it and the graphs of copies naming it (F8), which [`settle`] reads
//!   (empty, and one atomic load, unless a copy is in flight or a graph
//!   lives). An entry goes when the stream passed its batch (synchronize,
//!   query, an event after it) or the stream is dropped, and when its
//!   graph is dropped: the index holds what is in flight now, and no
//!   settle begins on a dropped stream. The index stays keyed by range
//!   address until the ranges carry their own in-flight records (issue
//!   27, item 2): a stream's entries hold it weakly, so an entry never
//!   keeps a handle alive.
//!
//! - [`Event`], made and used by `cuEventCreate`/`Record`/`Query`/`Synchronize`/`Destroy`;
//!   an event recorded after a batch completes it (F4: "or an event after
//!   it observed"), and lets go of the records up to it;
//! - [`Stream::from_cudarc`] (feature `cudarc`): a cudarc stream as a
//!   `Stream`, kept alive, never destroyed here.
//!
//! When a synchronize fails, the records stay: the memory is leaked rather
//! than freed under a copy that may still run. When one that ends a copy's
//! life panics (a `tracing` layer, a user backend), it is made once more
//! (`unwind::completing`), and the stream, event or graph is destroyed
//! either way; the records go only if that one answered.

use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use smallvec::SmallVec;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::error::{Error, Result};
use crate::range::RangeInner;

/// What one enqueued batch keeps alive until the stream passed it. A batch
/// usually names one allocation and one endpoint: inline, no allocation.
#[derive(Clone, Default)]
pub(crate) struct Keep {
    /// Local memory read or written (`Mapped` keep-alives).
    pub memory: KeepMemory,
    /// The id ranges of the endpoints, with the ids in flight.
    pub endpoints: SmallVec<[(Arc<RangeInner>, u32); 1]>,
}

/// Keep-alives of memory a batch reads or writes.
pub(crate) type KeepMemory = SmallVec<[crate::memory::KeepAlive; 1]>;

/// A stream's handle and its in-flight records, shared: by the [`Stream`],
/// and for the length of one call by a settle ([`settle`]) or an
/// [`Event`] that reached it through the index or its `Weak`. The handle
/// is destroyed in its `Drop`, by its last holder (as cudarc's
/// `CudaStream`), so whoever synchronizes it holds it and never meets a
/// destroyed stream.
pub(crate) struct StreamInner {
    pub(crate) ctx: Context,
    pub(crate) dev: Device,
    pub(crate) handle: u64,
    /// Batches enqueued since the last successful synchronize, each with
    /// its sequence number.
    inflight: Mutex<Vec<(u64, Keep)>>,
    /// The next batch's sequence number.
    next_seq: AtomicU64,
    /// A stream this crate did not make (cudarc's): kept alive by this,
    /// synchronized but never destroyed here.
    borrowed: Option<Arc<dyn Any + Send + Sync>>,
}

/// What keeps an endpoint id in the index: a stream's batch in flight
/// (until the stream passed it), or a graph of copies that names the id
/// (for the graph's whole life, F8).
enum Holder {
    /// Batch `seq` of the stream.
    Batch(Weak<StreamInner>, u64),
    /// The graph numbered so ([`pin_for_graph`]).
    Graph(u64),
}

/// One `(range address, id)` with a copy in flight, or named by a graph.
struct Entry {
    range: usize,
    id: u32,
    holder: Holder,
}

impl Entry {
    /// Whether this is an entry of one of `stream`'s batches that `done`.
    fn of_batch(&self, stream: *const StreamInner, done: impl Fn(u64) -> bool) -> bool {
        matches!(&self.holder, Holder::Batch(s, seq) if std::ptr::eq(s.as_ptr(), stream) && done(*seq))
    }
}

/// Every endpoint id with a copy in flight or a graph naming it: one entry
/// per batch (or graph) and id, gone once the stream passed the batch (a
/// synchronize, a query, an event after it), the stream was dropped, or
/// the graph was dropped. So its length is what is in flight now, not
/// what ever was.
static INDEX: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// `INDEX.len()`, read without the lock.
static IN_INDEX: AtomicUsize = AtomicUsize::new(0);
/// The number of the next graph that pins its ids.
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(0);

fn index() -> MutexGuard<'static, Vec<Entry>> {
    INDEX.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drops the entries `gone` picks, under the index lock.
fn forget_entries(gone: impl Fn(&Entry) -> bool) {
    let mut idx = index();
    idx.retain(|e| !gone(e));
    // Capacity given back once what is in flight fell well below it (a
    // burst of forgotten batches, then a synchronize); a small list is
    // kept, so that a loop of waited batches allocates nothing.
    let len = idx.len();
    if idx.capacity() > 64 && len < idx.capacity() / 4 {
        idx.shrink_to(len.saturating_mul(2));
    }
    IN_INDEX.store(idx.len(), Ordering::Release);
}

fn range_key(range: &RangeInner) -> usize {
    std::ptr::from_ref(range).addr()
}

/// Pins the ids a graph of copies names (F8: "every id valid and bound for
/// as long as the graph may run"): until [`unpin_graph`], unbinding memory
/// of any of them is refused ([`settle`]). Returns the graph's number.
pub(crate) fn pin_for_graph(endpoints: &[(Arc<RangeInner>, u32)]) -> u64 {
    let graph = NEXT_GRAPH.fetch_add(1, Ordering::Relaxed);
    let mut idx = index();
    for (range, id) in endpoints {
        idx.push(Entry {
            range: range_key(range),
            id: *id,
            holder: Holder::Graph(graph),
        });
    }
    IN_INDEX.store(idx.len(), Ordering::Release);
    graph
}

/// The graph numbered `graph` is gone: its ids may be unbound again.
pub(crate) fn unpin_graph(graph: u64) {
    forget_entries(|e| matches!(e.holder, Holder::Graph(g) if g == graph));
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
    // Inline: with no copy in flight anywhere (the usual unbind and
    // destroy), one load and no call.
    if IN_INDEX.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    settle_in_flight(range, id, false)
}

/// Before the endpoint on `id` of `range` is destroyed: as [`settle`], but
/// a graph's pin on the id is dropped, not refused. A live graph borrows
/// the endpoint, so only a forgotten one (`mem::forget`, never launched
/// again) can still pin it, and its entry must not outlive the id (the
/// index names ranges by address).
///
/// # Errors
/// The first synchronize that failed, as [`settle`].
#[inline]
pub(crate) fn settle_destroy(range: &RangeInner, id: u32) -> Result<()> {
    if IN_INDEX.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    settle_in_flight(range, id, true)
}

/// [`settle`] and [`settle_destroy`] when some copy may be in flight or a
/// graph live.
#[cold]
#[inline(never)]
fn settle_in_flight(range: &RangeInner, id: u32, destroying: bool) -> Result<()> {
    let key = range_key(range);
    let ours = |e: &Entry| e.range == key && e.id == id;
    if destroying {
        forget_entries(|e| ours(e) && matches!(e.holder, Holder::Graph(_)));
    }
    let mut streams: Vec<Arc<StreamInner>> = Vec::new();
    for e in index().iter().filter(|e| ours(e)) {
        match &e.holder {
            Holder::Graph(_) => return Err(Error::UnbindUnderGraph { id }),
            // A dropped stream does not upgrade (it was synchronized, and
            // its entries are gone with it anyway).
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

/// The entries of the index of the batches of the stream at `me` (tests:
/// what is left; other tests' streams run at the same time).
#[cfg(test)]
fn entries_of(me: *const StreamInner) -> usize {
    index().iter().filter(|e| e.of_batch(me, |_| true)).count()
}

impl StreamInner {
    /// Records a batch just enqueued; returns its sequence number.
    pub(crate) fn record(self: &Arc<Self>, keep: Keep) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::AcqRel);
        let mut idx = index();
        for (range, id) in &keep.endpoints {
            idx.push(Entry {
                range: range_key(range),
                id: *id,
                holder: Holder::Batch(Arc::downgrade(self), seq),
            });
        }
        IN_INDEX.store(idx.len(), Ordering::Release);
        // Pushed under the index lock: `passed_before` sees the index and
        // the records agree.
        self.lock().push((seq, keep));
        drop(idx);
        seq
    }

    /// The stream passed batch `seq` (an event after it was observed): the
    /// records of the batches up to it go, memory and index entries.
    pub(crate) fn passed_through(&self, seq: u64) {
        self.passed(|s| s <= seq);
    }

    /// The stream passed every batch whose number `done` picks: drop their
    /// records, and their entries of the index (so that a later destroy or
    /// unbind synchronizes nothing for them, and the index holds only what
    /// is in flight).
    fn passed(&self, done: impl Fn(u64) -> bool + Copy) {
        // Taken out in place: the list keeps its capacity for the next
        // record (no allocation per enqueue).
        let done_now: Vec<(u64, Keep)> = self.lock().extract_if(.., |(s, _)| done(*s)).collect();
        if done_now.iter().any(|(_, k)| !k.endpoints.is_empty()) {
            let me: *const StreamInner = self;
            forget_entries(|e| e.of_batch(me, done));
        }
        drop(done_now); // may release memory: outside the locks
    }

    /// Whether the stream is known to have passed batch `seq` (its record
    /// was let go: waited, an event after it observed, or synchronized).
    pub(crate) fn has_passed(&self, seq: u64) -> bool {
        !self.lock().iter().any(|(s, _)| *s == seq)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(u64, Keep)>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `cuStreamSynchronize`; on success lets go of every in-flight record
    /// (outside the locks: dropping memory may call the driver).
    pub(crate) fn synchronize(&self) -> Result<()> {
        let before = self.enqueued();
        // SAFETY: the stream is this object's own and live until its Drop.
        let r = unsafe { self.ctx.driver().stream_synchronize(self.handle) };
        self.ctx.check(Call::StreamSynchronize, r)?;
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

/// A non-blocking stream on one device (`cuStreamCreate` with
/// `CU_STREAM_NON_BLOCKING` in the device's primary context), never the
/// legacy NULL stream (F6).
///
/// Copies enqueued on it ([`crate::CopyBatch`]) run in stream order and
/// complete at [`Stream::synchronize`], at a [`Stream::query`] that
/// answers `true`, or when their token is waited. Dropping the stream
/// synchronizes it first, then destroys it.
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.dev)
            .field("handle", &format_args!("{:#x}", self.inner.handle))
            .finish()
    }
}

impl Stream {
    /// A new stream on `dev`.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`]; [`Error::Driver`] from `cuStreamCreate`.
    pub fn new(ctx: &Context, dev: impl Into<Device>) -> Result<Stream> {
        let dev = dev.into();
        ctx.check_device(dev)?;
        let handle = ctx.check(Call::StreamCreate, ctx.queries().stream_create(dev))?;
        if handle == 0 {
            // Never the legacy NULL stream (F6), whatever a backend says.
            return Err(Error::driver(Call::StreamCreate, crate::Code::UNKNOWN));
        }
        Ok(Stream::over(ctx, dev, handle, None))
    }

    fn over(
        ctx: &Context,
        dev: Device,
        handle: u64,
        borrowed: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Stream {
        Stream {
            inner: Arc::new(StreamInner {
                ctx: ctx.clone(),
                dev,
                handle,
                inflight: Mutex::new(Vec::new()),
                next_seq: AtomicU64::new(0),
                borrowed,
            }),
        }
    }

    /// A cudarc stream as a `Stream` of `ctx` (made by
    /// [`Context::from_cudarc`] for the stream's context), so that copies
    /// run in order with the kernels cudarc launches on it. The stream is
    /// kept alive by the `Stream` and synchronized when it is dropped, never
    /// destroyed here (cudarc owns it).
    ///
    /// # Errors
    /// [`Error::NullStream`] for cudarc's default stream when it is the
    /// legacy NULL stream (F6: make one with `CudaContext::new_stream`);
    /// [`Error::NoSuchDevice`] when its device is not one of `ctx`'s.
    #[cfg(feature = "cudarc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
    pub fn from_cudarc(ctx: &Context, stream: &Arc<cudarc::driver::CudaStream>) -> Result<Stream> {
        let raw = stream.cu_stream();
        if raw.is_null() {
            return Err(Error::NullStream);
        }
        let dev = Device(i32::try_from(stream.context().ordinal()).unwrap_or(i32::MAX));
        ctx.check_device(dev)?;
        let handle = raw.expose_provenance() as u64;
        Ok(Stream::over(ctx, dev, handle, Some(stream.clone())))
    }

    /// The device the stream runs on.
    pub fn device(&self) -> Device {
        self.inner.dev
    }

    /// The context it was made from.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Waits until every copy enqueued so far completed (`cuStreamSynchronize`).
    ///
    /// # Errors
    /// [`Error::Driver`]: an asynchronous fault of a copy; what the copies
    /// use then stays alive (leaked rather than freed under them).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Whether every copy enqueued so far completed (`cuStreamQuery`);
    /// never blocks.
    ///
    /// # Errors
    /// [`Error::Driver`], as [`Stream::synchronize`].
    pub fn query(&self) -> Result<bool> {
        let before = self.inner.enqueued();
        // SAFETY: the stream is this object's own and live.
        let r = unsafe { self.inner.ctx.driver().stream_query(self.inner.handle) };
        let done = self.inner.ctx.check(Call::StreamQuery, r)?;
        if done {
            self.inner.passed_before(before);
        }
        Ok(done)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let inner = &self.inner;
            let end = crate::unwind::completing(|| inner.synchronize());
            if !end.done {
                // Copies may still run: keep what they use alive for good.
                std::mem::forget(std::mem::take(&mut *inner.lock()));
            }
            // None of its entries may outlive the `Stream`: after a failed
            // synchronize the fault is recorded below, and a later unbind
            // cannot wait for a stream its owner let go of. A settle that
            // found it before holds it (`Arc`): its handle is destroyed by
            // whichever lets go last ([`StreamInner`]'s `Drop`), never
            // under that settle's synchronize.
            let me = Arc::as_ptr(inner);
            forget_entries(|e| e.of_batch(me, |_| true));
            if let Err(e) = end.resume() {
                inner.ctx.record_teardown(e);
            }
        });
        // The `Arc` goes with the fields, after this (also when the resume
        // above unwinds): the handle is destroyed there, by the last holder.
    }
}

impl Drop for StreamInner {
    /// The last holder let go (the `Stream`, or a settle or an event that
    /// held it for a synchronize): nothing can reach the handle any more.
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

/// An event on one device (`cuEventCreate`, timing off): recorded on a
/// [`Stream`], it completes when the stream passed everything enqueued
/// before the record (F4: a copy has completed once "an event after it" is
/// observed). [`crate::InFlight::with_event`] records one after its batch.
/// Dropping it destroys it (`cuEventDestroy`).
pub struct Event {
    ctx: Context,
    dev: Device,
    handle: u64,
    /// The stream and the last batch recorded before it, if recorded.
    /// Weak: an event may outlive its stream, and must not keep a dropped
    /// (destroyed) stream reachable.
    at: Option<(Weak<StreamInner>, Option<u64>)>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.dev)
            .field("handle", &format_args!("{:#x}", self.handle))
            .field("recorded", &self.at.is_some())
            .finish()
    }
}

impl Event {
    /// A new event on `dev`.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`]; [`Error::Driver`] from `cuEventCreate`.
    pub fn new(ctx: &Context, dev: impl Into<Device>) -> Result<Event> {
        let dev = dev.into();
        ctx.check_device(dev)?;
        let handle = ctx.check(Call::EventCreate, ctx.queries().event_create(dev))?;
        Ok(Event {
            ctx: ctx.clone(),
            dev,
            handle,
            at: None,
        })
    }

    /// Records the event on `stream` (`cuEventRecord`): it completes once
    /// the stream passed everything enqueued on it so far.
    ///
    /// # Errors
    /// [`Error::WrongContext`]; [`Error::EventOnOtherDevice`] for a stream
    /// of another device than the event's (the driver would answer
    /// `CUDA_ERROR_INVALID_HANDLE`); [`Error::Driver`].
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        if !stream.inner.ctx.same(&self.ctx) {
            return Err(Error::WrongContext);
        }
        if stream.inner.dev != self.dev {
            return Err(Error::EventOnOtherDevice {
                event_device: self.dev,
                stream_device: stream.inner.dev,
            });
        }
        // Read before the record: a batch numbered below it was enqueued
        // on the driver before its number was taken, so before the record,
        // and the event covers it. One another thread enqueues during the
        // call may fall after the record: reading after the call would let
        // the event release that batch's memory while it still runs.
        let last = stream.inner.enqueued().checked_sub(1);
        // SAFETY: both are live objects of this crate, borrowed for the call.
        let r = unsafe {
            self.ctx
                .driver()
                .event_record(self.handle, stream.inner.handle)
        };
        self.ctx.check(Call::EventRecord, r)?;
        self.at = Some((Arc::downgrade(&stream.inner), last));
        Ok(())
    }

    /// Whether the work before the record completed (`cuEventQuery`);
    /// never blocks.
    ///
    /// # Errors
    /// [`Error::Driver`]: an asynchronous fault of that work.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the event is this object's own and live.
        let r = unsafe { self.ctx.driver().event_query(self.handle) };
        let done = self.ctx.check(Call::EventQuery, r)?;
        if done {
            self.passed();
        }
        Ok(done)
    }

    /// Waits until the work before the record completed (`cuEventSynchronize`).
    ///
    /// # Errors
    /// [`Error::Driver`]: an asynchronous fault of that work.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is this object's own and live.
        let r = unsafe { self.ctx.driver().event_synchronize(self.handle) };
        self.ctx.check(Call::EventSynchronize, r)?;
        self.passed();
        Ok(())
    }

    /// The stream passed the record: its records up to it go.
    fn passed(&self) {
        if let Some((stream, Some(seq))) = &self.at
            && let Some(stream) = stream.upgrade()
        {
            stream.passed_through(*seq);
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            // SAFETY: the event is this object's own; nothing uses it after.
            let r = unsafe { self.ctx.driver().event_destroy(self.handle) };
            if let Err(e) = self.ctx.check(Call::EventDestroy, r) {
                self.ctx.record_teardown(e);
            }
        });
    }
}

static_assertions::assert_impl_all!(Stream: Send, Sync);
static_assertions::assert_impl_all!(Event: Send, Sync);

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::*;
    use crate::{Allocation, CopyBatch, Mapped, Private, Spec};

    const SIZE: u64 = 2 << 20;

    fn mapped(ctx: &Context) -> Mapped<Private> {
        Allocation::<Private>::on_device(ctx, 0, SIZE)
            .expect("memory on the model")
            .map(&[0])
            .expect("mapped")
    }

    /// The index holds what is in flight now, not what ever was: batches
    /// completed through their events leave it one by one, even while a
    /// later batch is still in flight (no synchronize ever empties the
    /// stream), and a dropped stream leaves nothing.
    #[test]
    fn batches_completed_through_events_leave_the_index_and_a_dropped_stream_leaves_nothing() {
        let mut config = crate::model::ModelConfig::node(1);
        config.driver_version = 13050;
        let (ctx, _model) = Context::model(config);
        let ep = ctx
            .reserve_one()
            .expect("an id")
            .create(Spec::unicast(0, SIZE))
            .expect("created")
            .wait(std::time::Duration::from_secs(1))
            .expect("a ready endpoint");
        let (src, owner) = (mapped(&ctx), mapped(&ctx));
        let _b = ep.bind(Device(0), 0, &owner).expect("bound");
        let s = Stream::new(&ctx, 0).expect("a stream");
        let me = Arc::as_ptr(&s.inner);
        let put = |at| CopyBatch::new().put(&src, at, &ep, at, 64);
        let mut prev = s
            .enqueue(put(0))
            .and_then(|t| t.with_event())
            .expect("enqueued");
        for i in 1..1_000u64 {
            let next = s
                .enqueue(put(64 * (i % 2)))
                .and_then(|t| t.with_event())
                .expect("enqueued");
            prev.wait().expect("completed");
            assert_eq!(entries_of(me), 1, "only the batch still in flight");
            prev = next;
        }
        prev.wait().expect("completed");
        assert_eq!(entries_of(me), 0);
        std::mem::forget(s.enqueue(put(0)).expect("enqueued"));
        assert_eq!(entries_of(me), 1);
        drop(s);
        assert_eq!(entries_of(me), 0, "a dropped stream's entries outlived it");
    }
}

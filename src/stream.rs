//! Streams in the crate's own terms: a [`Stream`] is a non-blocking stream
//! made on one device of a [`Context`] (never the legacy NULL stream, F6),
//! that owns what its copies in flight need kept alive.
//!
//! What this file owns:
//! - [`Stream`]: create (`cuStreamCreate`), [`Stream::synchronize`],
//!   [`Stream::query`], and `Drop` (synchronize, then `cuStreamDestroy`;
//!   a failure is kept on the context, [`Context::take_teardown_errors`]);
//! - the stream's *in-flight records* (F4, as R7.2 for bindings): each
//!   enqueued batch leaves, until the stream is synchronized, the memory it
//!   reads or writes (`Mapped::keep_alive`) and the id ranges of its
//!   endpoints. So a forgotten in-flight token (`mem::forget`) can free
//!   nothing a copy still uses: the memory lives until the stream passed
//!   the copy, and [`settle`] — called by an endpoint's destroy and a
//!   binding's unbind — synchronizes every stream with a copy in flight on
//!   that id first;
//! - the process-wide index from `(range, id)` to the streams with copies
//!   in flight on it, which [`settle`] reads (empty, and one atomic load,
//!   unless a copy is in flight).
//!
//! - [`Event`], made and used by `cuEventCreate`/`Record`/`Query`/`Synchronize`/`Destroy`;
//!   an event recorded after a batch completes it (F4: "or an event after
//!   it observed"), and lets go of the records up to it;
//! - [`Stream::from_cudarc`] (feature `cudarc`): a cudarc stream as a
//!   `Stream`, kept alive, never destroyed here.
//!
//! When a synchronize fails, the records stay: the memory is leaked rather
//! than freed under a copy that may still run.

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
#[derive(Clone)]
pub(crate) struct Keep {
    /// Local memory read or written (`Mapped` keep-alives).
    pub memory: KeepMemory,
    /// The id ranges of the endpoints, with the ids in flight.
    pub endpoints: SmallVec<[(Arc<RangeInner>, u32); 1]>,
}

/// Keep-alives of memory a batch reads or writes.
pub(crate) type KeepMemory = SmallVec<[Arc<dyn Any + Send + Sync>; 1]>;

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

/// `(range address, id, stream)` for every endpoint id with a copy in flight.
static INDEX: Mutex<Vec<(usize, u32, Weak<StreamInner>)>> = Mutex::new(Vec::new());
/// `INDEX.len()`, read without the lock.
static IN_INDEX: AtomicUsize = AtomicUsize::new(0);

fn index() -> MutexGuard<'static, Vec<(usize, u32, Weak<StreamInner>)>> {
    INDEX.lock().unwrap_or_else(PoisonError::into_inner)
}

fn range_key(range: &RangeInner) -> usize {
    std::ptr::from_ref(range).addr()
}

/// Before an endpoint on `id` of `range` is destroyed or a binding on it
/// unbound: synchronizes every stream with a copy in flight on it (F4).
///
/// # Errors
/// The first synchronize that failed: the caller must not go on (the copy
/// may still run).
#[inline]
pub(crate) fn settle(range: &RangeInner, id: u32) -> Result<()> {
    // Inline: with no copy in flight anywhere (the usual unbind and
    // destroy), one load and no call.
    if IN_INDEX.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    settle_in_flight(range, id)
}

/// [`settle`] when some copy may be in flight.
#[cold]
#[inline(never)]
fn settle_in_flight(range: &RangeInner, id: u32) -> Result<()> {
    let key = range_key(range);
    let streams: Vec<Arc<StreamInner>> = index()
        .iter()
        .filter(|(r, i, _)| *r == key && *i == id)
        .filter_map(|(_, _, s)| s.upgrade())
        .collect();
    for s in streams {
        s.synchronize()?;
    }
    Ok(())
}

impl StreamInner {
    /// Records a batch just enqueued; returns its sequence number.
    pub(crate) fn record(self: &Arc<Self>, keep: Keep) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::AcqRel);
        let mut idx = index();
        for (range, id) in &keep.endpoints {
            idx.push((range_key(range), *id, Arc::downgrade(self)));
        }
        IN_INDEX.store(idx.len(), Ordering::Release);
        // Pushed under the index lock: `passed_before` sees the index and
        // the records agree.
        self.lock().push((seq, keep));
        drop(idx);
        seq
    }

    /// The stream passed batch `seq` (an event after it was observed): the
    /// memory of the batches up to it is let go. Their endpoint ids stay in
    /// the index until the stream is synchronized (a later destroy or
    /// unbind synchronizes once more: early, never late).
    pub(crate) fn passed_through(&self, seq: u64) {
        // Taken out in place: the list keeps its capacity for the next
        // record (no allocation per enqueue).
        let done: Vec<(u64, Keep)> = self.lock().extract_if(.., |(s, _)| *s <= seq).collect();
        drop(done); // may release memory: outside the lock
    }

    /// Whether the stream is known to have passed batch `seq` (its record
    /// was let go: waited, an event after it observed, or synchronized).
    pub(crate) fn passed(&self, seq: u64) -> bool {
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

    /// The stream passed every batch numbered below `before`: drop their
    /// records, and this stream's entries of the index once no record is
    /// left (checked under the index lock, which `record` holds too).
    pub(crate) fn passed_before(&self, before: u64) {
        // Taken out in place, as in `passed_through`.
        let done: Vec<(u64, Keep)> = self.lock().extract_if(.., |(s, _)| *s < before).collect();
        if done.iter().any(|(_, k)| !k.endpoints.is_empty()) {
            let me: *const StreamInner = self;
            let mut idx = index();
            if self.lock().is_empty() {
                idx.retain(|(_, _, s)| !std::ptr::eq(s.as_ptr(), me));
                IN_INDEX.store(idx.len(), Ordering::Release);
            }
        }
        drop(done); // may release memory: outside the lock
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
            if let Err(e) = inner.synchronize() {
                // Copies may still run: keep what they use alive for good.
                std::mem::forget(std::mem::take(&mut *inner.lock()));
                inner.ctx.record_teardown(e);
            }
            if inner.borrowed.is_some() {
                // cudarc's stream: cudarc destroys it.
                return;
            }
            // SAFETY: the stream is this object's own; nothing uses it after.
            let r = unsafe { inner.ctx.driver().stream_destroy(inner.handle) };
            if let Err(e) = inner.ctx.check(Call::StreamDestroy, r) {
                inner.ctx.record_teardown(e);
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
    handle: u64,
    /// The stream and the last batch recorded before it, if recorded.
    at: Option<(Arc<StreamInner>, Option<u64>)>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
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
            handle,
            at: None,
        })
    }

    /// Records the event on `stream` (`cuEventRecord`): it completes once
    /// the stream passed everything enqueued on it so far.
    ///
    /// # Errors
    /// [`Error::WrongContext`]; [`Error::Driver`].
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        if !stream.inner.ctx.same(&self.ctx) {
            return Err(Error::WrongContext);
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
        self.at = Some((stream.inner.clone(), last));
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
        if let Some((stream, Some(seq))) = &self.at {
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

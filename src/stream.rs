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
//! When a synchronize fails, the records stay: the memory is leaked rather
//! than freed under a copy that may still run.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::error::{Error, Result};
use crate::range::RangeInner;

/// What one enqueued batch keeps alive until the stream passed it.
pub(crate) struct Keep {
    /// Local memory read or written (`Mapped` keep-alives).
    pub memory: Vec<Arc<dyn Any + Send + Sync>>,
    /// The id ranges of the endpoints, with the ids in flight.
    pub endpoints: Vec<(Arc<RangeInner>, u32)>,
}

pub(crate) struct StreamInner {
    pub(crate) ctx: Context,
    pub(crate) dev: Device,
    pub(crate) handle: u64,
    /// Batches enqueued since the last successful synchronize.
    inflight: Mutex<Vec<Keep>>,
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
    /// Records a batch just enqueued.
    pub(crate) fn record(self: &Arc<Self>, keep: Keep) {
        let mut idx = index();
        for (range, id) in &keep.endpoints {
            idx.push((range_key(range), *id, Arc::downgrade(self)));
        }
        IN_INDEX.store(idx.len(), Ordering::Release);
        drop(idx);
        self.lock().push(keep);
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Keep>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `cuStreamSynchronize`; on success lets go of every in-flight record
    /// (outside the locks: dropping memory may call the driver).
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is this object's own and live until its Drop.
        let r = unsafe { self.ctx.driver().stream_synchronize(self.handle) };
        self.ctx.check(Call::StreamSynchronize, r)?;
        self.passed_everything();
        Ok(())
    }

    /// The stream passed everything enqueued: drop the records.
    fn passed_everything(&self) {
        let done = std::mem::take(&mut *self.lock());
        if done.iter().any(|k| !k.endpoints.is_empty()) {
            let me: *const StreamInner = self;
            let mut idx = index();
            idx.retain(|(_, _, s)| !std::ptr::eq(s.as_ptr(), me));
            IN_INDEX.store(idx.len(), Ordering::Release);
        }
        drop(done);
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
        Ok(Stream {
            inner: Arc::new(StreamInner {
                ctx: ctx.clone(),
                dev,
                handle,
                inflight: Mutex::new(Vec::new()),
            }),
        })
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
        // SAFETY: the stream is this object's own and live.
        let r = unsafe { self.inner.ctx.driver().stream_query(self.inner.handle) };
        let done = self.inner.ctx.check(Call::StreamQuery, r)?;
        if done {
            self.inner.passed_everything();
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
            // SAFETY: the stream is this object's own; nothing uses it after.
            let r = unsafe { inner.ctx.driver().stream_destroy(inner.handle) };
            if let Err(e) = inner.ctx.check(Call::StreamDestroy, r) {
                inner.ctx.record_teardown(e);
            }
        });
    }
}

static_assertions::assert_impl_all!(Stream: Send, Sync);

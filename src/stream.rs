//! Streams in the crate's own terms: a [`Stream`] is a non-blocking stream
//! made on one device of a [`Context`] (never the legacy NULL stream, F6),
//! that owns what its copies in flight need kept alive.
//!
//! What this file owns:
//! - [`Stream`]: create (`cuStreamCreate`), [`Stream::synchronize`],
//!   [`Stream::query`], and `Drop` (synchronize; a failure is kept on the
//!   context, [`Context::take_teardown_errors`]). Its handle and in-flight
//!   records are the ledger's ([`crate::ledger::holds`]): a shared
//!   `StreamInner`, destroyed by its last holder;
//! - [`Event`], made and used by `cuEventCreate`/`Record`/`Query`/`Synchronize`/`Destroy`;
//!   an event recorded after a batch completes it (F4: "or an event after
//!   it observed"), and lets go of the records up to it;
//! - [`Stream::from_cudarc`] (feature `cudarc`): a cudarc stream as a
//!   `Stream`, kept alive, never destroyed here.
//!
//! When a synchronize that ends a copy's life panics (a `tracing` layer, a
//! user backend), it is made once more (`unwind::completing`), and the
//! stream, event or graph is destroyed either way; the records go only if
//! that one answered.

use std::any::Any;
use std::sync::{Arc, Weak};

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::error::{Error, Result};
use crate::ledger::holds::StreamInner;

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
            inner: StreamInner::new(ctx, dev, handle, borrowed),
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
                // Copies may still run: keep what they use alive for good,
                // and leave no record for a later unbind to wait on (it
                // cannot wait for a stream its owner let go of; the fault
                // is recorded below). The ranges' entries of the stream
                // are pruned once it is gone. A settle that found it
                // before holds it (`Arc`): its handle is destroyed by
                // whichever lets go last ([`StreamInner`]'s `Drop`), never
                // under that settle's synchronize.
                inner.leak_in_flight();
            }
            if let Err(e) = end.resume() {
                inner.ctx.record_teardown(e);
            }
        });
        // The `Arc` goes with the fields, after this (also when the resume
        // above unwinds): the handle is destroyed there, by the last holder.
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
            return Err(Error::WrongContext {
                pair: crate::error::ContextPair::EventOnStream,
            });
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

    /// A stream's records are what is in flight now, not what ever was:
    /// batches completed through their events leave them one by one, even
    /// while a later batch is still in flight (no synchronize ever empties
    /// the stream); the range holds one entry of the stream, from its first
    /// batch there, and a dropped stream leaves nothing.
    #[test]
    fn batches_completed_through_events_leave_the_records_and_a_dropped_stream_leaves_nothing() {
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
            assert_eq!(
                crate::ledger::holds::in_flight_on(ep.range(), &s.inner),
                1,
                "only the batch still in flight"
            );
            assert_eq!(crate::ledger::holds::entries_of(ep.range(), me), 1);
            prev = next;
        }
        prev.wait().expect("completed");
        assert_eq!(crate::ledger::holds::in_flight_on(ep.range(), &s.inner), 0);
        std::mem::forget(s.enqueue(put(0)).expect("enqueued"));
        assert_eq!(crate::ledger::holds::in_flight_on(ep.range(), &s.inner), 1);
        assert_eq!(crate::ledger::holds::entries_of(ep.range(), me), 1);
        drop(s);
        assert_eq!(
            crate::ledger::holds::entries_of(ep.range(), me),
            0,
            "a dropped stream's entries outlived it"
        );
    }
}

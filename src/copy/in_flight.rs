//! The token of a batch in flight: [`InFlight`], and what a waited one
//! hands back, [`Completed`].
//!
//! What this file owns: how a batch completes (through its event, if
//! [`InFlight::with_event`] recorded one, else its stream), what waiting,
//! querying and dropping the token do, and its host buffers: handed back
//! when the copies completed, leaked when they may still be in use (F4).

use std::marker::PhantomData;

use crate::error::Result;
use crate::stream::Stream;

/// The copies of one batch, in flight on a stream. Wait with
/// [`InFlight::wait`]; dropping it synchronizes the stream too.
///
/// It borrows the endpoints and the memory of the batch: destroying or
/// freeing them while it lives does not compile (F4). An unbind of one of
/// its endpoints waits for it at run time (the stream synchronized first),
/// or does not compile for a batch made through the binding
/// ([`Binding::copy_through`](crate::Binding::copy_through)).
#[must_use = "the copies are in flight: call `.wait()` (or keep the token while the stream runs, then wait) before reading the destination; dropping it synchronizes the stream"]
pub struct InFlight<'a> {
    pub(crate) stream: &'a Stream,
    /// Its host buffers, if it has any.
    pub(crate) host: Option<Box<super::HostBufs>>,
    /// The stream's sequence number of the batch.
    pub(crate) seq: u64,
    /// An event recorded after the batch ([`InFlight::with_event`]).
    /// Boxed: the token is moved out of every enqueue, and most have none
    /// (on `Null`, `benches/copy_batch.rs`: a one-op batch 850 -> 844
    /// instructions, its `InFlight::wait` 416 -> 399).
    pub(crate) event: Option<Box<crate::stream::Event>>,
    pub(crate) _borrow: PhantomData<&'a ()>,
}

impl std::fmt::Debug for InFlight<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("stream", self.stream)
            .finish()
    }
}

/// What a waited batch hands back: its host buffers.
#[derive(Debug, Default)]
pub struct Completed {
    /// The host buffers given to
    /// [`CopyBatch::put_host`](super::CopyBatch::put_host), in order.
    pub sent: Vec<Vec<u8>>,
    /// The buffers [`CopyBatch::get_host`](super::CopyBatch::get_host)
    /// filled, in order.
    pub received: Vec<Vec<u8>>,
}

impl<'a> InFlight<'a> {
    /// The token of the batch `seq`, just enqueued on `stream`.
    pub(crate) fn new(stream: &'a Stream, host: Option<Box<super::HostBufs>>, seq: u64) -> Self {
        InFlight {
            stream,
            host,
            seq,
            event: None,
            _borrow: PhantomData,
        }
    }

    /// Records an event right after the batch (`cuEventCreate`,
    /// `cuEventRecord`), so that the batch completes through the event
    /// (F4: "an event after it observed"): [`InFlight::is_done`] queries
    /// it and [`InFlight::wait`] waits for it alone, not for work enqueued
    /// on the stream after the batch.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) from either call; the token
    /// is dropped then (which synchronizes the stream).
    pub fn with_event(mut self) -> Result<Self> {
        let mut event = crate::stream::Event::new(self.stream.context(), self.stream.device())?;
        event.record(self.stream)?;
        // Recorded after this batch and whatever was enqueued since: it
        // completes no earlier than the batch.
        self.event = Some(Box::new(event));
        Ok(self)
    }

    /// Waits until the batch completed: through its event when it has one,
    /// else the stream (`cuStreamSynchronize`).
    // Always: where the compiler left it out of line, a one-put batch's
    // wait cost 32 instructions more (210 -> 242 on `Null`,
    // `benches/copy_batch.rs`).
    #[inline(always)]
    fn settle(&self) -> Result<()> {
        match &self.event {
            Some(e) => {
                e.synchronize()?;
                self.stream.inner.passed_through(self.seq);
                Ok(())
            }
            None => self.stream.synchronize(),
        }
    }

    /// Waits until the stream passed the batch (its event, if
    /// [`InFlight::with_event`] recorded one, else `cuStreamSynchronize`)
    /// and hands back the host buffers.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) (an asynchronous fault). The
    /// host buffers are then leaked, not freed: a copy may still use them.
    pub fn wait(self) -> Result<Completed> {
        let mut me = std::mem::ManuallyDrop::new(self);
        let end = crate::unwind::completing(|| me.settle());
        // The event goes now (the token's Drop does not run).
        drop(me.event.take());
        // Not done: the copies may still use the host buffers, which stay
        // with `me`, never dropped.
        let completed = end.done.then(|| match me.host.take() {
            Some(h) => Completed {
                sent: h.sent,
                received: h.received.into_iter().map(|(_, b)| b).collect(),
            },
            None => Completed::default(),
        });
        end.resume()?;
        Ok(completed.unwrap_or_default())
    }

    /// Whether the stream passed the batch, without blocking: its event
    /// (`cuEventQuery`) if [`InFlight::with_event`] recorded one, else the
    /// stream (`cuStreamQuery`).
    ///
    /// # Errors
    /// As [`Stream::query`].
    pub fn is_done(&self) -> Result<bool> {
        match &self.event {
            Some(e) => e.query(),
            None => self.stream.query(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let end = crate::unwind::completing(|| self.settle());
            if !end.done {
                // The copies may still use the host buffers: leak them.
                std::mem::forget(self.host.take());
            }
            if let Err(e) = end.resume() {
                self.stream.context().record_teardown(e);
            }
        });
    }
}

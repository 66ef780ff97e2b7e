//! [`BoundEndpoint`]: the owning form of a ready endpoint and the memory
//! bound to it, for structs that live as long as a communicator, with no
//! borrow to thread through them.
//!
//! The borrow-checked form (`ep.bind(..)` returning a `Binding<'_>`) stays
//! the primary one. This one owns the three things a binding ties together
//! and tears them down in the only safe order — unbind, destroy, free — when
//! it is dropped or [`BoundEndpoint::unbind_all`] is called.

use crate::binding::BindingRecord;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::error::{Error, Failed, Failure, Result};
use crate::kind::{Accepts, CanBind, Kind};
use crate::memory::BindSource;
use crate::state::Ready;

/// A ready endpoint that owns the memory bound to it. Dropping it unbinds
/// everything (R6), destroys the endpoint (R7), then frees the memory; a
/// teardown failure is kept on the context, and memory that may still be
/// bound is kept alive (R7.2).
pub struct BoundEndpoint<K: Kind, M: BindSource> {
    // Field order is drop order after `Drop::drop` unbinds: endpoint, then memory.
    bindings: Vec<BindingRecord>,
    endpoint: Endpoint<Ready, K>,
    memory: Vec<M>,
}

impl<K: Kind, M: BindSource> std::fmt::Debug for BoundEndpoint<K, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundEndpoint")
            .field("endpoint", &self.endpoint)
            .field("bindings", &self.bindings.len())
            .finish()
    }
}

impl<K: Kind> Endpoint<Ready, K> {
    /// The owning form of this endpoint, with no memory bound yet: bind with
    /// [`BoundEndpoint::bind`], which takes the memory by value.
    pub fn into_bound<M: BindSource>(self) -> BoundEndpoint<K, M> {
        BoundEndpoint {
            bindings: Vec::new(),
            endpoint: self,
            memory: Vec::new(),
        }
    }
}

impl<K: Kind + CanBind, M: BindSource> BoundEndpoint<K, M>
where
    K: Accepts<M::Share>,
{
    /// Binds all of `mem` on `dev` at `offset` (R5), and keeps `mem`. The
    /// checks and errors are those of [`Endpoint::bind`]; on failure `mem`
    /// comes back.
    ///
    /// # Errors
    /// As [`Endpoint::bind`], with the memory handed back.
    pub fn bind(&mut self, dev: impl Into<Device>, offset: u64, mem: M) -> Result<(), Failed<M>> {
        let bound = self
            .endpoint
            .bind(dev, offset, &mem)
            .map(crate::binding::Binding::into_record);
        match bound {
            Ok(record) => {
                self.bindings.push(record);
                self.memory.push(mem);
                Ok(())
            }
            Err(error) => Err(Failure::new(error, mem)),
        }
    }
}

impl<K: Kind, M: BindSource> BoundEndpoint<K, M> {
    /// The endpoint (for ids, sizes and kernel references).
    pub fn endpoint(&self) -> &Endpoint<Ready, K> {
        &self.endpoint
    }

    /// The memory bound, in bind order.
    pub fn memory(&self) -> &[M] {
        &self.memory
    }

    /// The devices bound on, in bind order.
    pub fn devices(&self) -> Vec<Device> {
        self.bindings.iter().map(BindingRecord::device).collect()
    }

    /// Unbinds everything and hands back the endpoint and the memory —
    /// also when an unbind fails.
    ///
    /// # Errors
    /// The first failed unbind ([`Error::Driver`]), with the endpoint and
    /// the memory in [`Failure::value`]: the endpoint keeps alive what stayed
    /// bound until it is destroyed (R7.2), so that memory may not be freed
    /// at once.
    // The error hands back by value what the caller owns, as every `Failed`
    // does; it is the failure path.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub fn unbind_all(
        mut self,
    ) -> Result<(Endpoint<Ready, K>, Vec<M>), Failed<(Endpoint<Ready, K>, Vec<M>)>> {
        let first = self.unbind_now();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; each field is moved
        // out exactly once.
        let (endpoint, memory) =
            unsafe { (std::ptr::read(&me.endpoint), std::ptr::read(&me.memory)) };
        // SAFETY: as above; `bindings` is empty after `unbind_now`.
        drop(unsafe { std::ptr::read(&me.bindings) });
        match first {
            Some(error) => Err(Failure::new(error, (endpoint, memory))),
            None => Ok((endpoint, memory)),
        }
    }

    fn unbind_now(&mut self) -> Option<Error> {
        let range = self.endpoint.range().clone();
        let mut first = None;
        for record in self.bindings.drain(..).rev() {
            if let Err(e) = record.attach(&range).unbind() {
                first.get_or_insert(e);
            }
        }
        first
    }
}

impl<K: Kind, M: BindSource> Drop for BoundEndpoint<K, M> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            if let Some(e) = self.unbind_now() {
                // Still bound: the endpoint keeps that memory alive until its
                // destroy unbinds it (R7).
                self.endpoint.context().record_teardown(e);
            }
        });
    }
}

//! A put prepared once and made many times: [`Route`] (issue 30).
//!
//! What this file owns: [`Stream::route`], which pairs one local
//! allocation, one endpoint and the stream, and reads once what every put
//! between them would read again (the endpoint's facts, F2, the contexts);
//! and [`Route::put`], a batch of one put at a few comparisons, then the
//! one-put lane's end (`one::usual_put`: the copy gate, the driver's call
//! and the record), on either path.
//!
//! A route's put is the batch of that put alone, checked the same: it is
//! taken here only where the one-put lane (`one.rs`) would take it (the
//! memory and the endpoint of the stream's context, the memory on its
//! device, the put inside the memory and inside the first interval bound
//! on every device here, below a heap's agreed top, and, compared inside
//! the gate, no bind or unbind since the facts were read), and for an
//! imported endpoint too (inside it and below its agreed top). Anything else
//! is enqueued as `CopyBatch::new().put(..)` is, which makes every check
//! and names any error as it always has, and the facts are read again for
//! the next put after a change. So what a put gets never depends on
//! whether it went through a route (the test
//! `data_path::issue_30_a_routes_put_is_checked_as_the_batch_of_that_put`).
//!
//! What it saves, on `Null` (`benches/copy_batch.rs`): the builder's state
//! (taken from the spare, written, given back), the first put's checks
//! against the memo of the last batch, and the erased put the lane reads
//! back; the route's facts are its own, read once.

use super::{BatchInner, CopyBatch, EpFacts, InFlight};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::kind::{Kind, MemShare};
use crate::memory::{CopyMemory, Mapped};
use crate::state::{Agreed, IsReady, State};
use crate::stream::Stream;

/// Puts from one allocation into one endpoint on one stream, each its own
/// batch: what a loop of small messages to one peer sends, prepared once
/// as an MPI persistent request is ([`Stream::route`]).
///
/// Each [`Route::put`] is checked exactly as the batch of that put alone
/// (`CopyBatch::new().put(..)`, enqueued on the stream) and answers the
/// same (its errors name the put as that batch's op 0); a route reads the endpoint's facts once rather than per batch,
/// and again after a bind or unbind changed them. It borrows the memory,
/// the endpoint and the stream, as the batches and tokens it makes do:
/// freeing the memory or destroying the endpoint while it or a token of
/// its puts lives does not compile. An unbind on the endpoint (by its
/// `Binding`) is a run-time matter, as for any copy naming `&ep`: it
/// waits for the puts in flight, and the route's next put is checked
/// against the bindings then; a route made with `b.copy_through(&ep)?`
/// makes it a compile error instead.
///
/// ```no_run
/// # fn f(stream: &cuda_endpoints::Stream,
/// #      src: &cuda_endpoints::Mapped<cuda_endpoints::Private>,
/// #      peer: &cuda_endpoints::Endpoint<cuda_endpoints::Ready, cuda_endpoints::ImportedUnicast>)
/// # -> cuda_endpoints::Result<()> {
/// let mut route = stream.route(src, peer);
/// for step in 0..100u64 {
///     route.put(0, (step % 16) * 4096, 4096)?.wait()?;
/// }
/// # Ok(()) }
/// ```
pub struct Route<'a, H: MemShare, S: State, K: Kind> {
    stream: &'a Stream,
    src: &'a Mapped<H>,
    ep: &'a Endpoint<S, K>,
    /// The endpoint's facts, as a batch's first put reads them, with the
    /// range's bindings generation they are current at (`None` while the
    /// memory or the endpoint is not the usual one: every put then goes
    /// as a batch).
    facts: Option<EpFacts>,
    /// The memory's address and size (its end does not wrap).
    mem: (u64, u64),
    /// [`as_batch`] at the route's types, made where they are known to be
    /// ready and agreed ([`Stream::route`]): `put` asks no bound of the
    /// state, so a route the compiler refused (before an agreement) is
    /// one error, not a second one at each `put`.
    as_batch: AsBatch<'a, H, S, K>,
}

/// [`as_batch`]'s signature.
type AsBatch<'a, H, S, K> =
    fn(&'a Stream, &'a Mapped<H>, &'a Endpoint<S, K>, u64, u64, u64) -> Result<InFlight<'a>>;

/// The batch of one put, enqueued (a route's put that is not the usual one).
fn as_batch<'a, H: MemShare, S, K: Kind>(
    stream: &'a Stream,
    src: &'a Mapped<H>,
    ep: &'a Endpoint<S, K>,
    at: u64,
    offset: u64,
    size: u64,
) -> Result<InFlight<'a>>
where
    S: State + IsReady + Agreed,
{
    stream.enqueue(CopyBatch::new().put(src, at, ep, offset, size))
}

impl<H: MemShare, S: State, K: Kind> std::fmt::Debug for Route<'_, H, S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("stream", self.stream)
            .field("endpoint", &self.ep.id())
            .field("memory", &format_args!("{:#x}", self.mem.0))
            .finish()
    }
}

impl Stream {
    /// A [`Route`] of puts from `src` into `ep` on this stream. Nothing is
    /// checked yet: each put is checked as a batch of it alone. `src` is
    /// memory mapped in this process, by reference, as
    /// [`CopyBatch::put`](crate::CopyBatch::put)'s
    /// ([`CopyMemory`](crate::bounds::CopyMemory)).
    pub fn route<'a, M: CopyMemory<'a>, S, K: Kind>(
        &'a self,
        src: M,
        ep: &'a Endpoint<S, K>,
    ) -> Route<'a, M::Share, S, K>
    where
        S: State + IsReady + Agreed,
    {
        let src = src.mapped();
        let mut route = Route {
            stream: self,
            src,
            ep,
            facts: None,
            mem: (src.device_ptr(), src.size()),
            as_batch: as_batch::<M::Share, S, K>,
        };
        route.read_facts();
        route
    }
}

impl<'a, H: MemShare, S: State, K: Kind> Route<'a, H, S, K> {
    /// Puts `size` bytes of the route's memory from `src_offset` into its
    /// endpoint at `offset`: `CopyBatch::new().put(src, src_offset, ep,
    /// offset, size)` enqueued on the route's stream, with its answer.
    ///
    /// # Errors
    /// Those of [`Stream::enqueue`] for that batch.
    #[inline]
    pub fn put(&mut self, src_offset: u64, offset: u64, size: u64) -> Result<InFlight<'a>> {
        match self.put_usual(src_offset, offset, size) {
            Some(made) => super::one::answer(self.stream, made),
            None => self.put_as_batch(src_offset, offset, size),
        }
    }

    /// The put where the one-put lane would take it, with what it made;
    /// `None` (nothing enqueued, nothing held) for any other.
    #[inline(always)]
    fn put_usual(&self, at: u64, offset: u64, size: u64) -> super::one::Lane {
        let facts = self.facts.as_ref()?;
        let (ptr, len) = self.mem;
        // `BatchInner::defer`'s memory check (its end's wrap checked when
        // the facts were read).
        if !(at < len && at.checked_add(size)? <= len) {
            return None;
        }
        BatchInner::first_hit_of(facts, offset, size)?;
        // No wrap: `at < len` and `ptr + len` does not.
        let usual = super::one::Usual {
            from: ptr.wrapping_add(at),
            generation: facts.bindings_gen,
            local: facts.local.as_ref(),
        };
        // SAFETY: the route borrows its memory and endpoint for 'a; the put
        // lies inside the memory and the facts' first interval; F2 and the
        // contexts were checked when the facts were read. (What this path
        // gains, on `Null` at `8cee20a`: one put 385 instructions as a
        // batch, 187 here; portable 523 and 308; `benches/copy_batch.rs`,
        // `copy_portable.rs`.)
        unsafe { super::one::usual_put(self.stream, self.src, self.ep, usual, offset, size) }
    }

    /// Any other put: the batch of it alone, and the facts read again if a
    /// bind or an unbind changed them.
    #[cold]
    #[inline(never)]
    fn put_as_batch(&mut self, at: u64, offset: u64, size: u64) -> Result<InFlight<'a>> {
        let r = (self.as_batch)(self.stream, self.src, self.ep, at, offset, size);
        let stale = self
            .facts
            .as_ref()
            .is_none_or(|f| f.bindings_gen != self.ep.range().bindings_gen());
        if stale {
            self.read_facts();
        }
        r
    }

    /// The endpoint's facts, where a put between the route's memory and
    /// endpoint on its stream is the usual one: the memory of the stream's
    /// context and on its device, its end not wrapping, the endpoint of
    /// that context (F2, as `one.rs`'s `lane`). The generation is read with
    /// the facts, under the range's lock (`BatchInner::facts`: the bindings
    /// here, a heap's agreed top, what peers bound), so a later change
    /// makes them stale, never current. (Unlike the lane, which keeps only
    /// a bound endpoint's facts from one batch to the next, a route takes
    /// an imported endpoint's too: the usual put into a peer.)
    fn read_facts(&mut self) {
        let (src, ep) = (self.src, self.ep);
        let (ctx, dev) = (&self.stream.inner.ctx, self.stream.inner.dev);
        let usual = super::one::on_stream(src, ep, ctx, dev)
            && self.mem.0.checked_add(self.mem.1).is_some();
        self.facts = usual.then(|| BatchInner::facts(ep));
    }
}

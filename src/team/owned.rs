//! The owning form of unicast peers, and the symmetric heap that grows in it
//! (the NVSHMEM pattern, R13.5).
//!
//! What this file owns:
//! - [`OwnedPeers`]: what [`Peers::into_owned`] makes of a bring-up's
//!   result — this rank's own endpoint, the memory bound on it (chunk by
//!   chunk), and every peer's endpoint as imported here — with no lifetime,
//!   to keep in a communicator struct. Its teardown is agreed:
//!   [`OwnedPeers::close`] completes this rank's copies, agrees with every
//!   rank that all did (R13.7), then unbinds its chunks top first, destroys
//!   the endpoints (R7; importers' aliases need no coordination, R13.7) and
//!   frees the memory. Dropped without it (or when the agreement fails) on
//!   a team of more than one rank, it keeps its own endpoint, with every
//!   chunk bound, and their memory until the process exits (R12.2): a peer
//!   may still write there. Only the peers' aliases go.
//! - The heap: the endpoints are sized for the heap's maximum up front (the
//!   bring-up's bytes); [`OwnedPeers::grow`] binds the next chunk at the
//!   next offset on every rank and agrees on it over the bootstrap, so peers
//!   use it with no re-import; [`OwnedPeers::shrink`] agrees that every rank
//!   stopped using the top chunk before any rank unbinds it (R13.7). A
//!   chunk whose unbind failed leaves the heap on every rank all the same
//!   (the agreed top) and is kept aside, bound, with its memory
//!   (`stranded`) until an unbind of it succeeds or the endpoints are
//!   destroyed (R7.2). On
//!   the portable path the grow agreement carries each new chunk's share
//!   and registers the peers' windows over it (`windows`, as `agree_bound`
//!   does at the bring-up); shrink removes them.
//! - [`DynPeers`]: the erased twin (the memory type known at run time only),
//!   as [`DynEndpoint`](crate::DynEndpoint) is the endpoint's.

use std::any::Any;
use std::mem::ManuallyDrop;
use std::time::Duration;

use crate::binding::BindingRecord;
use crate::bootstrap::{Bootstrap, Deadline, NodeId};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::{Accepts, Exportable, ImportedUnicast, Unicast};
use crate::memory::BindSource;
use crate::state::Ready;

use super::agree::{self, agree};
use super::error::{Cause, Mismatch, Step, TeamError};
use super::peers::Peers;
use super::windows;
use super::wire::{from_bytes, to_bytes};

/// Unicast peers that own everything: this rank's endpoint with the memory
/// bound on it as a symmetric heap of chunks, and every peer's endpoint
/// imported here. No lifetime; one value per communicator.
///
/// Copies go through [`OwnedPeers::own`] and [`OwnedPeers::peer`] at
/// offsets below [`OwnedPeers::top`]: every rank bound that much and agreed
/// on it (R13.3, R13.5).
///
/// Tear it down with [`OwnedPeers::close`] on every rank. Dropped without
/// it, with more than one rank, it frees nothing a peer may still write:
/// see [`OwnedPeers::close`].
pub struct OwnedPeers<M: BindSource> {
    rank: usize,
    tag: u64,
    /// Every rank agreed that it stopped copying ([`OwnedPeers::close`]):
    /// the drop may unbind and free.
    closed: bool,
    // Drop, closed (or alone): `Drop::drop` unbinds `stranded`, then
    // `chunks` top first, then destroys the own endpoint; then the fields in
    // order: the peers (destroyed, which unbinds whatever is still bound,
    // R7), then the memory. Not closed: the own endpoint and the memory are
    // never dropped (kept until the process exits, R12.2).
    chunks: Vec<BindingRecord>,
    own: ManuallyDrop<Endpoint<Ready, Unicast<Exportable>>>,
    peers: Vec<Option<Endpoint<Ready, ImportedUnicast>>>,
    /// The memory of each chunk of `chunks` (same index), and its size.
    memory: Vec<M>,
    sizes: Vec<u64>,
    /// Chunks out of the heap (above the agreed top on every rank) whose
    /// unbind failed: still bound, so their memory is kept until an unbind
    /// succeeds (retried at the next grow and at drop) or, failing that,
    /// until the endpoint's destroy unbinds them (R7.2).
    stranded: Vec<(BindingRecord, M)>,
}

impl<M: BindSource> std::fmt::Debug for OwnedPeers<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPeers")
            .field("rank", &self.rank)
            .field("ranks", &self.peers.len())
            .field("top", &self.top())
            .field("max", &self.max())
            .finish()
    }
}

impl Peers {
    /// The owning form, with an empty heap: grow it with
    /// [`OwnedPeers::grow`] on every rank before the first copy (the first
    /// grow is the every-rank-bound agreement, R13.3).
    pub fn into_owned<M: BindSource>(self) -> OwnedPeers<M> {
        let (rank, tag, own, peers) = self.into_parts();
        let mut owned = OwnedPeers {
            rank,
            tag,
            closed: false,
            chunks: Vec::new(),
            own: ManuallyDrop::new(own),
            peers,
            memory: Vec::new(),
            sizes: Vec::new(),
            stranded: Vec::new(),
        };
        owned.agree_top();
        owned
    }
}

impl<M: BindSource> OwnedPeers<M> {
    /// This rank's number, and the index of its own endpoint.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.peers.len()
    }

    /// This rank's own endpoint, to put into or get from below
    /// [`OwnedPeers::top`].
    pub fn own(&self) -> &Endpoint<Ready, Unicast<Exportable>> {
        &self.own
    }

    /// Rank `rank`'s endpoint as imported here; `None` for this rank's own
    /// index (use [`OwnedPeers::own`]) or past the last rank.
    pub fn peer(&self, rank: usize) -> Option<&Endpoint<Ready, ImportedUnicast>> {
        self.peers.get(rank).and_then(Option::as_ref)
    }

    /// The id at `rank`'s index, as kernels address it.
    pub fn id_of(&self, rank: usize) -> Option<u32> {
        if rank == self.rank {
            Some(self.own.id())
        } else {
            self.peer(rank).map(Endpoint::id)
        }
    }

    /// Bytes bound on every rank and agreed on: the heap's top offset.
    pub fn top(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// The heap's maximum: the endpoints' size, fixed at the bring-up.
    pub fn max(&self) -> u64 {
        self.own.size()
    }

    /// The memory of each chunk, bottom first: one per chunk below
    /// [`OwnedPeers::top`] (a chunk whose unbind failed at a shrink is not
    /// in the heap any more, and not here).
    pub fn memory(&self) -> &[M] {
        &self.memory
    }

    /// Grows the heap by `chunk`, on every rank in one call: each rank binds
    /// its chunk at the current top on its own endpoint's device, then all
    /// agree that every rank bound the same size at the same offset (R13.5).
    /// Peers use the new bytes through the endpoints they already imported.
    /// Returns the chunk's offset.
    ///
    /// On the portable path ([`CopyPath::Portable`](crate::CopyPath)) the
    /// agreement also carries each rank's new chunk, as `agree_bound` does:
    /// a `Mapped<FabricShareable>` chunk's fabric handle rides in it, and
    /// every rank imports, maps and registers it as the window of that
    /// peer's endpoint at the chunk's offset ([`OwnedPeers::grow_fds`] for
    /// `PosixFd` chunks, which this call refuses on every rank with
    /// [`Error::PosixFdWithoutFds`]; other memory gets no window and a
    /// `tracing` warning — `tracing_subscriber::fmt::init()` prints it — and
    /// a copy that needs it fails with [`Error::CopyNoWindow`] before the
    /// driver).
    ///
    /// # Errors
    /// A [`TeamError`] at [`Step::Grow`] on every rank: a chunk that would
    /// end past [`OwnedPeers::max`] ([`Error::OutOfRange`], refused before
    /// the driver; each rank that refused names itself, the others the
    /// lowest such rank), a failed bind (likewise), a rank at another offset
    /// or chunk size than rank 0 ([`Mismatch::Heap`], the same error on
    /// every rank), or the bootstrap's failure within `timeout`; on the
    /// portable path, at [`Step::Import`], a peer's chunk that some rank
    /// could not import or map (every rank fails, naming that rank). A rank
    /// that keeps a chunk an earlier shrink or grow could not unbind
    /// unbinds it first; if that fails again, the grow fails on every rank,
    /// that rank naming the unbind's error. On
    /// error no rank keeps the chunk bound or any window of it (a chunk
    /// whose undo fails is kept aside, as at a shrink); the heap is as it
    /// was.
    pub fn grow(
        &mut self,
        boot: &dyn Bootstrap,
        chunk: M,
        timeout: Duration,
    ) -> Result<u64, TeamError>
    where
        Unicast<Exportable>: Accepts<M::Share>,
    {
        self.grow_on(boot, None, chunk, timeout)
    }

    /// As [`OwnedPeers::grow`], for ranks of one node whose chunks are
    /// `PosixFd` memory and copy on the portable path: each rank's new
    /// chunk's descriptor is passed within `node` (`FdExchange`,
    /// `SCM_RIGHTS`), imported and registered as a window, as
    /// [`Peers::agree_bound_fds`] does at the bring-up. Call it on every
    /// rank (`NodeId::current()`; on the model fabric `Process::node_id()`).
    ///
    /// # Errors
    /// As [`OwnedPeers::grow`]; at [`Step::Import`], a descriptor that could
    /// not cross (a rank on another node, the bootstrap's failure).
    pub fn grow_fds(
        &mut self,
        boot: &dyn Bootstrap,
        node: &NodeId,
        chunk: M,
        timeout: Duration,
    ) -> Result<u64, TeamError>
    where
        Unicast<Exportable>: Accepts<M::Share>,
    {
        self.grow_on(boot, Some(node), chunk, timeout)
    }

    fn grow_on(
        &mut self,
        boot: &dyn Bootstrap,
        node: Option<&NodeId>,
        chunk: M,
        timeout: Duration,
    ) -> Result<u64, TeamError>
    where
        Unicast<Exportable>: Accepts<M::Share>,
    {
        let deadline = Deadline::after(timeout);
        let offset = self.top();
        let size = chunk.size();
        let portable = windows::portable(&self.own);
        let dev = self.own.devices().first().copied();
        let bound = match (dev, self.unbind_stranded()) {
            (_, Err(e)) => Err(Cause::Local(e)),
            (None, Ok(())) => Err(Cause::BadMessage {
                reason: "the own endpoint names no device",
            }),
            (Some(dev), Ok(())) => self.bind_checked(dev, offset, &chunk).map_err(Cause::Local),
        };
        // On the portable path the report carries the new chunk's share
        // (and its descriptor crosses after the agreement, with `node`).
        let (record, local, my_fds) = match bound {
            Ok(r) if portable => match windows::export(&self.own, node.is_some(), Some(offset)) {
                Ok((shares, fds)) => (Some(r), Ok(to_bytes(&(offset, size, shares))), fds),
                Err(c) => (Some(r), Err((Step::Grow, c)), Vec::new()),
            },
            Ok(r) => (
                Some(r),
                Ok(to_bytes(&(offset, size, Vec::<u8>::new()))),
                Vec::new(),
            ),
            Err(c) => (None, Err((Step::Grow, c)), Vec::new()),
        };
        // Every rank is checked against rank 0's report, so all name the
        // same first rank that differs.
        let verdict = agree(boot, self.tag, Step::Grow, local, deadline).and_then(|all| {
            let mut reference = None;
            let mut rests = Vec::with_capacity(all.len());
            for (rank, bytes) in all.iter().enumerate() {
                let (o, s, shares) = read_grow_word(rank, bytes)?;
                let &mut (ro, rs) = reference.get_or_insert((o, s));
                same(rank, Step::Grow, "offset", o, ro)?;
                same(rank, Step::Grow, "chunk size", s, rs)?;
                rests.push(shares);
            }
            let rests: Vec<&[u8]> = rests.iter().map(Vec::as_slice).collect();
            let peers = &self.peers;
            let ep_of = |r: usize| peers.get(r).and_then(Option::as_ref);
            windows::import_and_register(
                boot, self.tag, &self.own, ep_of, node, &rests, my_fds, portable, deadline,
            )
        });
        match (verdict, record) {
            (Ok(()), Some(record)) => {
                self.chunks.push(record);
                self.memory.push(chunk);
                self.sizes.push(size);
                self.agree_top();
                Ok(offset)
            }
            (verdict, record) => {
                if let Some(record) = record
                    && let Err((e, record)) = record.unbind_on(self.own.range())
                {
                    // Still bound: kept aside with its memory (R7.2), and
                    // unbound again before the next grow binds there.
                    self.own.context().record_teardown(e);
                    self.stranded.push((record, chunk));
                }
                Err(verdict.err().unwrap_or_else(|| {
                    TeamError::new(
                        self.rank,
                        Step::Grow,
                        Cause::BadMessage {
                            reason: "no chunk bound",
                        },
                    )
                }))
            }
        }
    }

    /// Shrinks the heap by its top chunk, on every rank in one call: all
    /// agree that every rank stopped using it and has the same top (R13.7;
    /// `&mut self` proves this rank holds no copy through the endpoints),
    /// then each rank unbinds its top chunk and gets its memory back. On
    /// the portable path each rank first removes the windows of the peers'
    /// top chunks that [`OwnedPeers::grow`] registered.
    /// `Ok(None)` on every rank when the heap is empty.
    ///
    /// # Errors
    /// The same [`TeamError`] on every rank when a rank's top differs from
    /// rank 0's ([`Step::Shrink`], [`Mismatch::Heap`]) or the bootstrap fails within
    /// `timeout`; nothing is unbound then. This rank's own unbind failure
    /// after the agreement is reported on this rank only; the heap is one
    /// chunk lower on every rank all the same (the top they agreed to
    /// leave, so copies past it are refused everywhere), and this rank keeps
    /// the chunk it could not unbind aside, bound, with its memory: the next
    /// [`OwnedPeers::grow`] unbinds it first, and drop unbinds it or,
    /// failing that, lets the memory go only after the endpoints are
    /// destroyed (R7.2). [`OwnedPeers::memory`] stays one entry per chunk
    /// below the top.
    pub fn shrink(
        &mut self,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<Option<M>, TeamError> {
        let deadline = Deadline::after(timeout);
        let top = self.top();
        // `&mut self` ends every borrow of the endpoints, but not a copy whose
        // token was forgotten: this rank's copies in flight through any of
        // them (into a peer's top chunk too) complete before it agrees that
        // it stopped using the top chunk (R13.7, F4).
        let settled = crate::ledger::settle(self.own.range(), self.own.id()).and_then(|()| {
            self.peers
                .iter()
                .flatten()
                .try_for_each(|ep| crate::ledger::settle(ep.range(), ep.id()))
        });
        let local = match settled {
            Ok(()) => Ok(heap_word(top, 0)),
            Err(e) => Err((Step::Shrink, Cause::Local(e))),
        };
        let all = agree(boot, self.tag, Step::Shrink, local, deadline)?;
        let mut reference = None;
        for (rank, bytes) in all.iter().enumerate() {
            let (t, _) = read_heap_word(rank, Step::Shrink, bytes)?;
            same(rank, Step::Shrink, "top", t, *reference.get_or_insert(t))?;
        }
        let (Some(record), Some(mem), Some(size)) =
            (self.chunks.pop(), self.memory.pop(), self.sizes.pop())
        else {
            return Ok(None);
        };
        // No copy past the new top from here on, on this rank (R13.3).
        self.agree_top();
        // Every rank stopped using the top chunk: the windows of the peers'
        // top chunks go (the portable path; unmapped here, outside the lock).
        let bottom = top.saturating_sub(size);
        let gone: Vec<_> = (0..self.peers.len())
            .filter_map(|r| Some((u32::try_from(r).ok()?, self.peer(r)?)))
            .flat_map(|(r, ep)| ep.remove_peer_windows(r, bottom, size))
            .collect();
        drop(gone);
        match record.unbind_on(self.own.range()) {
            Ok(()) => Ok(Some(mem)),
            Err((e, record)) => {
                // Still bound, but out of the heap on every rank (they all
                // agreed to leave it): kept aside with its memory (R7.2),
                // not in `memory`, which the next shrink pops.
                self.stranded.push((record, mem));
                Err(TeamError::new(self.rank, Step::Shrink, Cause::Local(e)))
            }
        }
    }

    /// Tears the peers down on every rank in one call, once every rank has
    /// completed its copies into them (R13.7): this rank's copies in flight
    /// through any of the endpoints complete first (`self` by value proves
    /// no borrow of them is left), then every rank agrees over `boot` that
    /// it did, and only then does this rank unbind its chunks (top first),
    /// destroy the endpoints and free the memory. So no rank unbinds memory
    /// that a peer copies into: a rank that closes early waits in the
    /// agreement for the others. Call it on every rank.
    ///
    /// Without it, a drop on a team of more than one rank cannot know that
    /// no peer still writes into this rank's memory, so it frees nothing a
    /// peer may write: the own endpoint stays, with every chunk bound, and
    /// the memory stays allocated until the process exits, where the driver
    /// reclaims them (R12.2); the peers' aliases are destroyed (an importer
    /// needs no coordination, R13.7); and
    /// [`Error::CloseNotAgreed`] is kept on the context
    /// ([`Context::take_teardown_errors`](crate::Context::take_teardown_errors)).
    /// A single rank's drop tears down at once: nobody else can write.
    ///
    /// # Errors
    /// The same [`TeamError`] at [`Step::Close`] on every rank that closes,
    /// within `timeout`: a rank whose own copies could not be completed (a
    /// failed synchronize: [`Cause::Local`] there, [`Cause::Peer`] on the
    /// others), or a rank that never joins the close (the bootstrap's
    /// timeout, naming it). Then no rank knows that every peer stopped, so
    /// each keeps its memory as a drop does ([`Error::CloseNotAgreed`] on
    /// its context). After the agreement, a failed unbind or destroy of
    /// this rank is kept on its context, with the memory it may still
    /// hold, as at a drop (R7.2).
    pub fn close(mut self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        let deadline = Deadline::after(timeout);
        let settled = agree::settle(&self.own)
            .and_then(|()| self.peers.iter().flatten().try_for_each(agree::settle));
        let agreed = agree::close(boot, self.tag, settled, deadline);
        self.closed = agreed.is_ok();
        drop(self);
        agreed
    }

    /// A peer may still write into this rank's memory (no close was
    /// agreed): the own endpoint, every chunk bound on it and their memory
    /// are kept until the process exits (R12.2, R13.7).
    fn keep_for_peers(&mut self) {
        self.own.context().record_teardown(Error::CloseNotAgreed {
            what: "an OwnedPeers",
            ranks: self.ranks(),
        });
        std::mem::forget(std::mem::take(&mut self.memory));
        std::mem::forget(std::mem::take(&mut self.stranded));
        // `own` is never dropped: its id keeps its bindings, and so the
        // memory, alive.
    }

    /// Unbinds the chunks kept aside after a failed unbind, the latest
    /// first; each one unbound lets its memory go. The first failure is
    /// returned, and that chunk and those kept before it stay aside.
    fn unbind_stranded(&mut self) -> Result<(), Error> {
        while let Some((record, mem)) = self.stranded.pop() {
            if let Err((e, record)) = record.unbind_on(self.own.range()) {
                self.stranded.push((record, mem));
                return Err(e);
            }
            drop(mem); // unbound: nothing holds it any more
        }
        Ok(())
    }

    /// Copies through the endpoints stay below the agreed top: past it a
    /// peer may have nothing bound (R13.3), so they are refused before the
    /// driver ([`crate::Error::CopyNotAgreed`]).
    fn agree_top(&mut self) {
        let top = Some(self.top());
        self.own.set_agreed(top);
        for ep in self.peers.iter().flatten() {
            ep.set_agreed(top);
        }
    }

    /// The erased twin, for a collection that holds peers over memory of
    /// several types.
    pub fn into_dyn(self) -> DynPeers
    where
        M: Send + 'static,
    {
        DynPeers {
            rank: self.rank,
            ranks: self.ranks(),
            top: self.top(),
            inner: Box::new(Some(self)),
        }
    }

    /// Binds `chunk` at `offset` on `dev`, refusing before the driver a
    /// chunk that ends past the endpoint (the heap's maximum).
    fn bind_checked(
        &self,
        dev: crate::Device,
        offset: u64,
        chunk: &M,
    ) -> Result<BindingRecord, Error>
    where
        Unicast<Exportable>: Accepts<M::Share>,
    {
        let size = self.own.size();
        let end = offset.checked_add(chunk.size());
        if end.is_none_or(|end| end > size) {
            return Err(Error::OutOfRange {
                what: crate::error::Extent::EndpointRange,
                offset,
                size: chunk.size(),
                limit: size,
                rule: crate::error::Rule::R5_4,
            });
        }
        self.own
            .bind(dev, offset, chunk)
            .map(crate::binding::Binding::into_record)
    }
}

/// `(offset, size)` as one rank reports it.
fn heap_word(a: u64, b: u64) -> Vec<u8> {
    to_bytes(&(a, b))
}

/// A peer's grow report, read checked: its chunk's `(offset, size)` and
/// its memory shares (empty off the portable path, `windows`).
fn read_grow_word(rank: usize, bytes: &[u8]) -> Result<(u64, u64, Vec<u8>), TeamError> {
    from_bytes(bytes).map_err(|_| {
        TeamError::new(
            rank,
            Step::Grow,
            Cause::BadMessage {
                reason: "a heap report of the wrong form",
            },
        )
    })
}

/// A peer's `(offset, size)`, read checked.
fn read_heap_word(rank: usize, step: Step, bytes: &[u8]) -> Result<(u64, u64), TeamError> {
    from_bytes(bytes).map_err(|_| {
        TeamError::new(
            rank,
            step,
            Cause::BadMessage {
                reason: "a heap report of the wrong form",
            },
        )
    })
}

fn same(
    rank: usize,
    step: Step,
    field: &'static str,
    got: u64,
    want: u64,
) -> Result<(), TeamError> {
    if got == want {
        Ok(())
    } else {
        Err(TeamError::new(
            rank,
            step,
            Cause::Mismatch(Mismatch::Heap {
                field,
                reported: got,
                expected: want,
            }),
        ))
    }
}

impl<M: BindSource> Drop for OwnedPeers<M> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            // The peers' ids go back to their range with no heap top: a
            // later endpoint on one of them is no heap's.
            for ep in self.peers.iter().flatten() {
                ep.set_agreed(None);
            }
            if !self.closed && self.ranks() > 1 {
                self.keep_for_peers();
                return;
            }
            self.own.set_agreed(None);
            let range = self.own.range().clone();
            // Above the top: first. A chunk still bound stays in
            // `stranded`, whose memory drops after the endpoints' destroy.
            if let Err(e) = self.unbind_stranded() {
                self.own.context().record_teardown(e);
            }
            while let Some(record) = self.chunks.pop() {
                if let Err(e) = record.attach(&range).unbind() {
                    // Still bound: the endpoint keeps that memory alive
                    // until its destroy unbinds it (R7).
                    self.own.context().record_teardown(e);
                }
            }
            // SAFETY: `own` is dropped here only, once (this is `drop`, and
            // nothing above returns after this point), and never used again.
            unsafe { ManuallyDrop::drop(&mut self.own) };
        });
    }
}

/// What [`DynPeers`] holds: an [`OwnedPeers`] of some memory type (in an
/// `Option`, so that [`DynPeers::try_into_typed`] can take it out), which
/// it closes ([`OwnedPeers::close`]) or hands back typed.
trait Erased: Send {
    /// [`OwnedPeers::close`]; `Ok` when it was taken out (not reached: only
    /// `try_into_typed` takes it, and that consumes the `DynPeers`).
    fn close(&mut self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<M: BindSource + Send + 'static> Erased for Option<OwnedPeers<M>> {
    fn close(&mut self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        self.take().map_or(Ok(()), |p| p.close(boot, timeout))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// [`OwnedPeers`] with its memory type erased: the same teardown
/// ([`DynPeers::close`], and the same rule at a drop without it);
/// [`DynPeers::try_into_typed`] gives the typed value back.
pub struct DynPeers {
    rank: usize,
    ranks: usize,
    top: u64,
    inner: Box<dyn Erased>,
}

impl std::fmt::Debug for DynPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynPeers")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("top", &self.top)
            .finish()
    }
}

impl DynPeers {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The heap's top when it was erased.
    pub fn top(&self) -> u64 {
        self.top
    }

    /// Whether its memory is `M`.
    pub fn is<M: BindSource + 'static>(&self) -> bool {
        self.inner.as_any().is::<Option<OwnedPeers<M>>>()
    }

    /// The typed value back, when its memory is `M`; else `self`.
    ///
    /// # Errors
    /// `self`, unchanged, when the memory type differs.
    pub fn try_into_typed<M: BindSource + Send + 'static>(self) -> Result<OwnedPeers<M>, DynPeers> {
        let mut me = self;
        match me
            .inner
            .as_any_mut()
            .downcast_mut::<Option<OwnedPeers<M>>>()
            .and_then(Option::take)
        {
            Some(typed) => Ok(typed),
            None => Err(me),
        }
    }

    /// [`OwnedPeers::close`], whatever the memory type: call it on every
    /// rank (on ranks that hold the typed form, `OwnedPeers::close`).
    ///
    /// # Errors
    /// As [`OwnedPeers::close`].
    pub fn close(mut self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        self.inner.close(boot, timeout)
    }
}

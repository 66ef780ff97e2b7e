//! The every-rank-bound agreement (R13.3) that stands between a team
//! bring-up and its first copy.
//!
//! What this file owns:
//! - [`SharedTeam::agree_bound`] and [`Peers::agree_bound`]: every rank
//!   reports, over the bootstrap, the memory it bound (per device of its own:
//!   the devices it enrolled in a multicast team, the owner device of its
//!   unicast endpoint), and every rank checks every report alike, so that a
//!   rank that bound nothing fails every rank with the same [`TeamError`]
//!   (that rank, [`Step::Bind`], [`Mismatch::NotBound`]).
//! - [`BoundTeam`] and [`BoundPeers`], what the agreement hands back: the
//!   team's endpoints as `Endpoint<Ready, _>`, the only form a
//!   [`CopyBatch`](crate::CopyBatch) accepts. Before the agreement the
//!   bring-up lends them as [`TeamReady`](crate::TeamReady), which binds,
//!   exports and makes kernel references but copies nothing
//!   ([`Agreed`](crate::bounds::Agreed)): a copy before every rank bound
//!   does not compile. Their `close` is the agreement at the other end:
//!   every rank completed its copies through them before any rank unbinds
//!   (R13.7).
//! - [`OwnedTeam`], the owning form of a multicast team
//!   ([`SharedTeam::into_bound`]): no lifetime; torn down only by an agreed
//!   [`OwnedTeam::close`] (R13.7). It has no `unbind_all` (one member's
//!   unbind alone would let the others put into a member with nothing
//!   bound, or into memory it rebound); dropped without the close, it
//!   keeps its endpoint and memory until the process exits (R12.2).
//!
//! On the portable path ([`CopyPath::Portable`](crate::CopyPath)) the
//! agreement also makes the windows the copies go through (`windows`):
//! each rank's shareable memory is imported, mapped and registered on every
//! other rank (`agree_bound_fds` for `PosixFd` memory, one node). The
//! reports travel within the limits of `limits` (in several exchanges
//! when large; a rank past them refuses to send, and every rank fails
//! alike).
//!
//! Unicast: each importer copies only after the owner bound; multicast:
//! every member only after every member bound (R13.3). The agreement checks
//! that each rank bound *something* on each of its devices, and every rank
//! keeps what each peer device bound (the reports name each binding's
//! extent) on the endpoint that reaches it: a copy outside it is refused
//! before the driver ([`Error::CopyPeerNotBound`](crate::Error::CopyPeerNotBound);
//! R13.5, F9), as one outside this process's own bindings is. Binding more
//! later (R13.5) needs another agreement before peers copy into it: what a
//! peer bound since is not known here. A copy made before an agreement (a
//! batch built, a route, a captured graph) is checked against the record
//! when it goes; a close on this rank (`BoundTeam::close`,
//! `BoundPeers::close`, `OwnedTeam::close`) empties the record's bytes
//! first, so no copy goes through another bound form of the bring-up
//! until the ranks agree again (R13.7: peers may unbind after it).

use std::mem::ManuallyDrop;
use std::time::Duration;

use crate::bootstrap::Bootstrap;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::Accepts;
use crate::kind::{Exportable, ImportedUnicast, Kind, Unicast};
use crate::memory::BindSource;
use crate::owned::BoundEndpoint;
use crate::state::{IsReady, Ready, State};

use super::agree;
use super::error::{Cause, Mismatch, Step, TeamError};
use super::limits;
use super::multicast::SharedTeam;
use super::peers::Peers;
use super::shared::SharedMulticast;
use super::windows;
use crate::bootstrap::{Deadline, NodeId};

/// The most devices one rank's report may name (a peer's count is checked
/// against it before anything is allocated for it).
const MAX_REPORTED: usize = 4096;

/// This rank's report: for each device of its own, `(device, ranges
/// bound)`, then each range's endpoint offset and size.
fn report<S: State, K: Kind>(ep: &Endpoint<S, K>) -> Vec<u8> {
    let slot = ep.slot();
    let devices = ep.devices();
    let mut out = Vec::with_capacity(4 + devices.len() * 24);
    out.extend_from_slice(&(devices.len() as u32).to_le_bytes());
    for &d in devices {
        let n = slot.spans(d).count();
        out.extend_from_slice(&d.0.to_le_bytes());
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        for (offset, size) in slot.spans(d) {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
        }
    }
    out
}

/// A report's devices: `(device, the ranges bound there as (offset,
/// size))` each.
type Devices = Vec<(i32, Vec<(u64, u64)>)>;

/// A peer's report, read checked: the ranges bound per device, and what
/// follows (its memory shares on the portable path, `windows`). Every
/// count is checked against the bytes that carry it before anything is
/// allocated for it.
fn decode(bytes: &[u8]) -> Result<(Devices, &[u8]), Cause> {
    let bad = |reason| Cause::BadMessage { reason };
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], Cause> {
        let end = at.checked_add(n).ok_or(bad("bind report too long"))?;
        let b = bytes.get(at..end).ok_or(bad("bind report cut short"))?;
        at = end;
        Ok(b)
    };
    let word = |b: &[u8]| -> [u8; 4] { b.try_into().unwrap_or_default() };
    let long = |b: &[u8]| -> [u8; 8] { b.try_into().unwrap_or_default() };
    let n = usize::try_from(u32::from_le_bytes(word(take(4)?))).unwrap_or(usize::MAX);
    if n > MAX_REPORTED {
        return Err(bad("bind report names too many devices"));
    }
    let mut devices = Vec::with_capacity(n);
    for _ in 0..n {
        let device = i32::from_le_bytes(word(take(4)?));
        let count = usize::try_from(u32::from_le_bytes(word(take(4)?))).unwrap_or(usize::MAX);
        // The ranges' bytes are there before a place is made for them.
        let spans = take(count.checked_mul(16).ok_or(bad("bind report too long"))?)?;
        let spans = spans
            .chunks_exact(16)
            .map(|c| {
                let (o, s) = c.split_at(8);
                (u64::from_le_bytes(long(o)), u64::from_le_bytes(long(s)))
            })
            .collect();
        devices.push((device, spans));
    }
    let rest = bytes.get(at..).ok_or(bad("bind report cut short"))?;
    Ok((devices, rest))
}

/// What the reports say each peer bound on the endpoint it reaches
/// (`ep_of(rank)`), recorded there once every rank agreed (F9, R13.5):
/// each device of every other rank, its ranges merged. A range a peer
/// claims past the endpoint is kept as claimed: a copy is checked against
/// the endpoint's size as well.
fn record_peers<'a, P: State + IsReady + 'a, Q: Kind + 'a>(
    me: usize,
    all: &[Devices],
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>>,
) {
    let mut each: Vec<(&Endpoint<P, Q>, Vec<crate::error::PeerBound>)> = Vec::new();
    for (rank, devices) in all.iter().enumerate() {
        let Some(ep) = ep_of(rank).filter(|_| rank != me) else {
            continue;
        };
        let bound = devices.iter().map(|(d, spans)| crate::error::PeerBound {
            rank: u32::try_from(rank).unwrap_or(u32::MAX),
            device: Device(*d),
            covered: crate::copy::merged(spans.iter().copied()).into_vec(),
        });
        match each.iter_mut().find(|(e, _)| std::ptr::eq(*e, ep)) {
            Some((_, v)) => v.extend(bound),
            None => each.push((ep, bound.collect())),
        }
    }
    for (ep, bound) in each {
        ep.set_peers(bound);
    }
}

/// Every rank reports what `ep` has bound on this rank's devices; every
/// rank checks every report in rank order, so all name the same first rank
/// that bound nothing. On the portable path the reports also carry each
/// rank's memory, which every rank imports and registers as windows on
/// `ep_of(rank)` (`windows`), after one more agreement that every import
/// worked. With `node`, `PosixFd` memory is shared too, its descriptors
/// passed within the node after the agreement.
fn agree_bound_on<'a, S: State, K: Kind, P: State + IsReady + 'a, Q: Kind + 'a>(
    boot: &dyn Bootstrap,
    tag: u64,
    ep: &Endpoint<S, K>,
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>> + Copy,
    node: Option<&NodeId>,
    local: Option<Error>,
    timeout: Duration,
) -> Result<(), TeamError> {
    let deadline = Deadline::after(timeout);
    let portable = windows::portable(ep);
    // The report's limits (`limits`); a device past them is refused here,
    // before anything is exported, and every rank hears why.
    let limit = limits::bind(ep, windows::SHARE_BYTES as u64);
    let (mine, my_fds) = match (local, limits::over_per_device(ep, limit), portable) {
        // This rank's own bind failed: every rank fails alike, naming it.
        (Some(e), _, _) => (Err(Cause::Local(e)), Vec::new()),
        (None, Some(too_many), _) => (Err(too_many), Vec::new()),
        (None, None, true) => match windows::export(ep, node.is_some(), None) {
            Ok((shares, fds)) => (Ok([report(ep), shares].concat()), fds),
            Err(c) => (Err(c), Vec::new()),
        },
        (None, None, false) => (Ok(report(ep)), Vec::new()),
    };
    let reports = limits::agree_large(
        boot,
        tag,
        Step::Bind,
        mine.map_err(|c| (Step::Bind, c)),
        limit.bytes,
        deadline,
    )?;
    let mut rests = Vec::with_capacity(reports.len());
    let mut all = Vec::with_capacity(reports.len());
    for (rank, bytes) in reports.iter().enumerate() {
        let (devices, rest) = decode(bytes).map_err(|c| TeamError::new(rank, Step::Bind, c))?;
        let not_bound = |device| {
            TeamError::new(
                rank,
                Step::Bind,
                Cause::Mismatch(Mismatch::NotBound { device }),
            )
        };
        if devices.is_empty() {
            return Err(not_bound(None));
        }
        if let Some((d, _)) = devices.iter().find(|(_, spans)| spans.is_empty()) {
            return Err(not_bound(Some(*d)));
        }
        if devices
            .iter()
            .any(|(_, spans)| spans.len() as u64 > limit.per_device)
        {
            // An honest rank refuses to send it (`limits::over_per_device`).
            let reason = "a bind report past the bindings one device may have";
            return Err(TeamError::new(
                rank,
                Step::Bind,
                Cause::BadMessage { reason },
            ));
        }
        rests.push(rest);
        all.push(devices);
    }
    windows::import_and_register(
        boot, tag, ep, ep_of, node, &rests, my_fds, portable, deadline,
    )?;
    record_peers(boot.rank(), &all, ep_of);
    Ok(())
}

impl SharedTeam {
    /// Agrees, with every rank of `boot`, that every rank bound memory on
    /// each of its team devices (R13.3); call it on every rank after this
    /// rank's binds. What it returns lends the endpoint as
    /// `Endpoint<Ready, SharedMulticast>`, the form a copy accepts.
    ///
    /// On the portable path ([`CopyPath::Portable`](crate::CopyPath)) it
    /// also makes the windows every copy goes through: each rank's
    /// `Mapped<FabricShareable>` bindings travel as fabric handles in the
    /// agreement, and every rank imports, maps and registers them, so no
    /// rank calls `add_peer_window` (`PosixFd` memory:
    /// [`SharedTeam::agree_bound_fds`]; bound here, it fails every rank with
    /// [`Error::PosixFdWithoutFds`](crate::Error::PosixFdWithoutFds): each
    /// rank that bound it names itself, the others the lowest such rank). Other memory peers cannot import that way (an
    /// `Allocation` bound by handle, raw addresses) gets no window and a
    /// `tracing` warning (`tracing_subscriber::fmt::init()` in `main` prints
    /// it); a copy that needs it fails with
    /// [`Error::CopyNoWindow`](crate::Error::CopyNoWindow), before the
    /// driver.
    ///
    /// # Errors
    /// The same [`TeamError`] on every rank when a rank bound nothing on one
    /// of its devices ([`Step::Bind`], [`Mismatch::NotBound`], naming the
    /// first such rank), or the bootstrap's failure within `timeout`; on
    /// the portable path, at [`Step::Import`], a peer's memory that some
    /// rank could not import or map (every rank fails, naming that rank;
    /// everything imported is released before it returns).
    pub fn agree_bound(
        &self,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<BoundTeam<'_>, TeamError> {
        let ep = self.ready_endpoint();
        agree_bound_on(boot, self.tag(), ep, |_| Some(ep), None, None, timeout)?;
        Ok(BoundTeam { team: self })
    }

    /// As [`SharedTeam::agree_bound`], for ranks of one node that bound
    /// `PosixFd` memory and copy on the portable path
    /// ([`CopyPath::Portable`](crate::CopyPath)): their descriptors are
    /// passed within `node` (`FdExchange`, `SCM_RIGHTS`), imported and
    /// registered as windows, so no rank calls `add_peer_window`. Call it on
    /// every rank (`NodeId::current()`; on the model fabric `Process::node_id()`).
    ///
    /// # Errors
    /// As [`SharedTeam::agree_bound`]; at [`Step::Import`], a descriptor
    /// that could not cross (a rank on another node, the bootstrap's
    /// failure) or an import that failed on some rank; everything imported
    /// is released before it returns.
    pub fn agree_bound_fds(
        &self,
        boot: &dyn Bootstrap,
        node: &NodeId,
        timeout: Duration,
    ) -> Result<BoundTeam<'_>, TeamError> {
        let ep = self.ready_endpoint();
        agree_bound_on(
            boot,
            self.tag(),
            ep,
            |_| Some(ep),
            Some(node),
            None,
            timeout,
        )?;
        Ok(BoundTeam { team: self })
    }
}

impl SharedTeam {
    /// The communicator's owning form of the team: binds each
    /// `(device, offset, memory)` of `memory` on this rank, then agrees with
    /// every rank of `boot` that every rank bound (R13.3), as
    /// [`SharedTeam::agree_bound`] does. Call it on every rank. What it
    /// returns owns the endpoint and the memory, with no lifetime, and can
    /// copy at once: the owning form exists only after the agreement, so a
    /// copy before it does not compile. Tear it down with
    /// [`OwnedTeam::close`] on every rank (R13.7).
    ///
    /// # Errors
    /// As [`SharedTeam::agree_bound`]; a bind that failed on some rank
    /// fails every rank alike ([`Step::Bind`], [`Cause::Local`] on that
    /// rank, [`Cause::Peer`] on the others). On every error this rank's
    /// memory is unbound and freed and its endpoint destroyed.
    pub fn into_bound<M>(
        self,
        memory: impl IntoIterator<Item = (Device, u64, M)>,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<OwnedTeam<M>, TeamError>
    where
        M: BindSource,
        SharedMulticast: Accepts<M::Share>,
    {
        let (tag, rank, ranks) = (self.tag(), self.rank(), self.ranks());
        let mut owned = self.into_ready_endpoint().into_bound::<M>();
        let mut local = None;
        for (dev, offset, mem) in memory {
            if let Err(f) = owned.bind(dev, offset, mem) {
                local = Some(f.into_parts().0);
                break;
            }
        }
        let ep = owned.endpoint();
        // On an error `owned` drops: unbinds, destroys and frees. No rank
        // copies then: the agreement failed on every rank (R13.3).
        agree_bound_on(boot, tag, ep, |_| Some(ep), None, local, timeout)?;
        Ok(OwnedTeam {
            rank,
            ranks,
            tag,
            closed: false,
            inner: ManuallyDrop::new(owned),
        })
    }
}

/// A multicast team's owning form on this rank ([`SharedTeam::into_bound`]):
/// its endpoint, ready to copy through (every rank bound, R13.3), and the
/// memory this rank bound on it. No lifetime; one value per communicator.
///
/// Its teardown is agreed: [`OwnedTeam::close`] on every rank. It has no
/// `unbind_all`: a member that unbinds alone lets the others put into it
/// with nothing bound, or into memory it binds there next (R13.7).
pub struct OwnedTeam<M: BindSource> {
    rank: usize,
    ranks: usize,
    tag: u64,
    /// Every rank agreed that it stopped copying ([`OwnedTeam::close`]):
    /// the drop may unbind, destroy and free.
    closed: bool,
    /// Dropped only when `closed` (or alone); else kept until the process
    /// exits (R12.2).
    inner: ManuallyDrop<BoundEndpoint<SharedMulticast, M>>,
}

impl<M: BindSource> std::fmt::Debug for OwnedTeam<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedTeam")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("owned", &*self.inner)
            .finish()
    }
}

impl<M: BindSource> OwnedTeam<M> {
    /// The team's endpoint, to put into (a multicast put lands in every
    /// member's bound memory, F1). Lent for as long as this `OwnedTeam`
    /// lives: its [`close`](OwnedTeam::close) is every rank's word that it
    /// stopped copying (R13.7), so no copy can name the endpoint after it.
    pub fn endpoint(&self) -> &Endpoint<Ready, SharedMulticast> {
        self.inner.endpoint()
    }

    /// The memory this rank bound, in bind order.
    pub fn memory(&self) -> &[M] {
        self.inner.memory()
    }

    /// The devices this rank bound on, in bind order.
    pub fn devices(&self) -> Vec<Device> {
        self.inner.devices()
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Tears the team down on every rank in one call, once every rank has
    /// completed its copies into it (R13.7): this rank's puts in flight
    /// through the endpoint complete first, then every rank agrees over
    /// `boot` that it did, and only then does this rank unbind its memory,
    /// destroy its endpoint and free the memory. A rank that closes early
    /// waits in the agreement for the others. Call it on every rank.
    ///
    /// Without it, a drop on a team of more than one rank frees nothing a
    /// peer may still write: the endpoint stays, with this rank's memory
    /// bound, and the memory stays allocated until the process exits, where
    /// the driver reclaims them (R12.2); [`Error::CloseNotAgreed`] is kept
    /// on the context. A single rank's drop tears down at once.
    ///
    /// # Errors
    /// As [`OwnedPeers::close`](super::OwnedPeers::close): the same
    /// [`TeamError`] at [`Step::Close`] on every rank that closes, within
    /// `timeout`; then each keeps its memory, as a drop does.
    pub fn close(mut self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        let deadline = Deadline::after(timeout);
        self.inner.endpoint().peers_stop();
        let settled = agree::settle(self.inner.endpoint());
        let agreed = agree::close(boot, self.tag, settled, deadline);
        self.closed = agreed.is_ok();
        drop(self);
        agreed
    }
}

impl<M: BindSource> Drop for OwnedTeam<M> {
    fn drop(&mut self) {
        if self.closed || self.ranks <= 1 {
            // SAFETY: `inner` is dropped here only, once, and never used
            // again.
            unsafe { ManuallyDrop::drop(&mut self.inner) };
            return;
        }
        // A peer may still put into this rank's memory: the endpoint, with
        // everything bound on it, and the memory are kept (R13.7, R12.2).
        self.inner
            .endpoint()
            .context()
            .record_teardown(Error::CloseNotAgreed {
                what: "an OwnedTeam",
                ranks: self.ranks,
            });
    }
}

/// Never implemented: it carries the message for `OwnedTeam::unbind_all`.
#[diagnostic::on_unimplemented(
    message = "an owned team has no `unbind_all`: one member's unbind alone lets the others put into a member with nothing bound (R13.7)",
    label = "one rank's teardown alone is not offered",
    note = "call `team.close(&boot, timeout)?` on every rank: each completes its copies, all agree, then each unbinds, destroys and frees (R13.7)"
)]
pub trait CloseOnEveryRank {}

impl<M: BindSource> OwnedTeam<M> {
    /// Not callable: it exists so that `team.unbind_all()` is a compile
    /// error that points to [`OwnedTeam::close`] (R13.7).
    #[doc(hidden)]
    pub fn unbind_all(self)
    where
        M: CloseOnEveryRank,
    {
    }
}

/// A multicast team whose ranks all bound their memory (R13.3): its
/// endpoint, ready to copy through. Borrows the team.
///
/// Before any rank unbinds the memory it bound on the team, every rank
/// calls [`BoundTeam::close`] (R13.7). Not `Copy`: the close consumes it.
#[derive(Debug)]
pub struct BoundTeam<'t> {
    team: &'t SharedTeam,
}

impl<'t> BoundTeam<'t> {
    /// The team's endpoint, to put into (a multicast put lands in every
    /// member's bound memory, F1).
    pub fn endpoint(&self) -> &Endpoint<Ready, SharedMulticast> {
        self.team.ready_endpoint()
    }

    /// The team.
    pub fn team(&self) -> &'t SharedTeam {
        self.team
    }

    /// Agrees with every rank of `boot` that every rank completed its
    /// copies through the team's endpoint (R13.7): this rank's copies in
    /// flight through it complete first, then all agree. After `Ok`, no
    /// rank copies through the team any more (each consumed its
    /// `BoundTeam`), so each may unbind the memory it bound (drop its
    /// `Binding`s) and drop the team. Call it on every rank, before any
    /// rank unbinds: the bindings are yours, so unbinding before the close
    /// is not refused here (the owning form, [`OwnedTeam::close`], does
    /// the unbind itself, after the agreement).
    ///
    /// # Errors
    /// The same [`TeamError`] at [`Step::Close`] on every rank that closes,
    /// within `timeout` (a rank whose copies could not be completed, a rank
    /// that never joins): keep the bindings then; a peer may still write.
    pub fn close(self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        let deadline = Deadline::after(timeout);
        // No copy through the team's endpoint from here on, through this
        // or another `BoundTeam` of it, before the next agreement.
        self.endpoint().peers_stop();
        let settled = agree::settle(self.endpoint());
        agree::close(boot, self.team.tag(), settled, deadline)
    }
}

impl Peers {
    /// Agrees, with every rank of `boot`, that every rank bound memory on
    /// its own endpoint (R13.3: each owner bound before its importers copy);
    /// call it on every rank after this rank's binds. What it returns lends
    /// the endpoints as `Endpoint<Ready, _>`, the form a copy accepts. On
    /// the portable path it registers every owner's memory as the window of
    /// that owner's endpoint here, as [`SharedTeam::agree_bound`] does:
    /// `Mapped<FabricShareable>` memory. `PosixFd` memory crosses processes
    /// only as a descriptor: bind it `Mapped` and call
    /// [`Peers::agree_bound_fds`] instead (one node); with this call it
    /// fails every rank with [`crate::Error::PosixFdWithoutFds`] (each rank
    /// that bound it names itself, the others the lowest such rank).
    ///
    /// # Errors
    /// The same [`TeamError`] on every rank when a rank bound nothing on its
    /// own endpoint ([`Step::Bind`], [`Mismatch::NotBound`], naming the
    /// first such rank), or the bootstrap's failure within `timeout`; on
    /// the portable path, as [`SharedTeam::agree_bound`].
    pub fn agree_bound(
        &self,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<BoundPeers<'_>, TeamError> {
        agree_bound_on(
            boot,
            self.tag(),
            self.ready_own(),
            |r| self.ready_peer(r),
            None,
            None,
            timeout,
        )?;
        Ok(BoundPeers { peers: self })
    }

    /// As [`Peers::agree_bound`], for ranks of one node that bound `PosixFd`
    /// memory and copy on the portable path: as
    /// [`SharedTeam::agree_bound_fds`].
    ///
    /// # Errors
    /// As [`SharedTeam::agree_bound_fds`].
    pub fn agree_bound_fds(
        &self,
        boot: &dyn Bootstrap,
        node: &NodeId,
        timeout: Duration,
    ) -> Result<BoundPeers<'_>, TeamError> {
        let own = self.ready_own();
        let ep_of = |r| self.ready_peer(r);
        agree_bound_on(boot, self.tag(), own, ep_of, Some(node), None, timeout)?;
        Ok(BoundPeers { peers: self })
    }
}

/// Unicast peers whose owners all bound their memory (R13.3): every
/// endpoint, ready to copy through. Borrows the peers.
///
/// Before any rank unbinds the memory it bound on its own endpoint, every
/// rank calls [`BoundPeers::close`] (R13.7). Not `Copy`: the close
/// consumes it.
#[derive(Debug)]
pub struct BoundPeers<'p> {
    peers: &'p Peers,
}

impl<'p> BoundPeers<'p> {
    /// This rank's own endpoint. Lent, as [`BoundPeers::peer`]'s, for as
    /// long as this `BoundPeers` lives: its [`close`](BoundPeers::close)
    /// is every rank's word that it stopped copying through the peers
    /// (R13.7), so no copy can name them after it (a review found them
    /// lent for the peers' life, past the close).
    pub fn own(&self) -> &Endpoint<Ready, Unicast<Exportable>> {
        self.peers.ready_own()
    }

    /// Rank `rank`'s endpoint as imported here, to get from (or put into);
    /// `None` for this rank's own index (use [`BoundPeers::own`]) or past
    /// the last rank.
    pub fn peer(&self, rank: usize) -> Option<&Endpoint<Ready, ImportedUnicast>> {
        self.peers.ready_peer(rank)
    }

    /// The peers.
    pub fn peers(&self) -> &'p Peers {
        self.peers
    }

    /// Agrees with every rank of `boot` that every rank completed its
    /// copies through the peers' endpoints (R13.7), as
    /// [`BoundTeam::close`] does: this rank's copies in flight through any
    /// of them complete first, then all agree. After `Ok`, each rank may
    /// unbind the memory it bound on its own endpoint and drop the peers;
    /// the owning form, [`OwnedPeers::close`](super::OwnedPeers::close),
    /// does that itself.
    ///
    /// # Errors
    /// As [`BoundTeam::close`].
    pub fn close(self, boot: &dyn Bootstrap, timeout: Duration) -> Result<(), TeamError> {
        let deadline = Deadline::after(timeout);
        let peers = self.peers;
        // As `BoundTeam::close`: no copy into a peer before the next
        // agreement, through any `BoundPeers` of these peers.
        for r in 0..peers.ranks() {
            if let Some(ep) = peers.ready_peer(r) {
                ep.peers_stop();
            }
        }
        let settled = agree::settle(peers.ready_own()).and_then(|()| {
            (0..peers.ranks())
                .filter_map(|r| peers.ready_peer(r))
                .try_for_each(agree::settle)
        });
        agree::close(boot, peers.tag(), settled, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_report_from_a_peer_is_read_checked_never_trusted() {
        let mut ok = 2u32.to_le_bytes().to_vec();
        for (d, spans) in [(0i32, &[(4096u64, 8192u64)][..]), (3, &[][..])] {
            ok.extend_from_slice(&d.to_le_bytes());
            ok.extend_from_slice(&(spans.len() as u32).to_le_bytes());
            for (o, s) in spans {
                ok.extend_from_slice(&o.to_le_bytes());
                ok.extend_from_slice(&s.to_le_bytes());
            }
        }
        let want = vec![(0, vec![(4096, 8192)]), (3, vec![])];
        assert_eq!(decode(&ok).ok(), Some((want, &[][..])));
        for cut in 0..ok.len() {
            assert!(decode(&ok[..cut]).is_err(), "cut at {cut}");
        }
        // What follows is the memory shares, read checked in their turn.
        let mut long = ok.clone();
        long.push(0);
        assert_eq!(decode(&long).ok().map(|(_, rest)| rest), Some(&[0u8][..]));
        assert!(windows::decode(&[0]).is_err());
        assert!(decode(&u32::MAX.to_le_bytes()).is_err());
        // A count of ranges the message does not carry allocates nothing.
        let mut lying = 1u32.to_le_bytes().to_vec();
        lying.extend_from_slice(&0i32.to_le_bytes());
        lying.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&lying).is_err());
    }
}

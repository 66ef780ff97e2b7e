//! The portable path's peer windows, made by the every-rank-bound agreement
//! (`agree_bound`) and by a heap's grow agreement (`OwnedPeers::grow`, the
//! new chunk only) so that no user registers them by hand (issue 19,
//! item 4).
//!
//! What this file owns:
//! - [`export`]: on a rank whose copies take [`CopyPath::Portable`], what
//!   its report adds for peers: for each binding by address of
//!   [`FabricShareable`](crate::FabricShareable) memory, where it is bound
//!   and the allocation's fabric handle (bytes, so they cross in the
//!   agreement's own message); with `agree_bound_fds`, its `PosixFd`
//!   bindings too, whose descriptors cross after the agreement
//!   ([`pass_fds`]: `FdExchange`, `SCM_RIGHTS`, one node). `PosixFd`
//!   memory without `agree_bound_fds` fails the agreement on every rank
//!   (`Error::PosixFdWithoutFds`: the one fix is that call). Other memory
//!   is named in a `tracing` warning and gets no window: an `Allocation`
//!   bound by handle (no address); `Private` memory does not bind to a
//!   team endpoint at all (R5.6, a compile error).
//! - [`import`] and [`register`]: every peer's memory imported and mapped
//!   here, checked against the endpoint before the driver sees a byte and
//!   against the memory this process knows (`known`: a share that is its
//!   own memory or another rank's window is refused, every rank naming the
//!   sender, [`Cause::Aliased`]); one
//!   more agreement ([`Step::Import`]) so that a failed import fails every
//!   rank alike; then the windows registered on the endpoints that reach
//!   each peer ([`import_and_register`], the part both agreements share).
//!   On any error everything imported is dropped (unmapped and
//!   released) before the error returns; registered windows go with the
//!   endpoint (`endpoint::forget_rest`).

use std::os::fd::{AsFd, OwnedFd};

use crate::CopyPath;
use crate::bootstrap::{Bootstrap, BootstrapError, Deadline, Exchange, FdExchange, NodeId, Op};
use crate::copy::local_binds;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::{FabricShareable, Kind, PosixFd};
use crate::memory::{Allocation, BindSource, NotForPeers, PeerHandle, export_for_peers};
use crate::state::{IsReady, State};

use super::error::{Cause, Step, TeamError};
use super::known;
use super::limits::MAX_BINDINGS_PER_DEVICE;
use super::wire::{MAX_DEVICES, from_bytes, to_bytes};

/// Bytes of one share on the wire: device, offset, size, offset in the
/// mapping, allocation size, fabric handle (zeros for a descriptor), and
/// whether a descriptor follows instead.
pub(crate) const SHARE_BYTES: usize = 4 + 8 * 4 + 64 + 1;
/// The most shares one rank's report may carry (checked before anything is
/// allocated for them): a share per binding of every device a rank may
/// bring (`limits`, which bounds each report tighter by what the ranks
/// agreed).
const MAX_SHARES: usize = MAX_DEVICES * MAX_BINDINGS_PER_DEVICE as usize;

/// One binding of a peer, as its report says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub device: i32,
    pub offset: u64,
    pub size: u64,
    pub map_offset: u64,
    pub alloc_size: u64,
    pub bytes: [u8; 64],
    /// Its descriptor crosses after the agreement ([`pass_fds`]).
    pub fd: bool,
}

/// Whether this rank's copies take the portable path, so that its report
/// carries shares and it imports its peers'.
pub(crate) fn portable<S: State, K: Kind>(ep: &Endpoint<S, K>) -> bool {
    ep.context().copy_path() == CopyPath::Portable
}

/// This rank's shares, encoded (a count, then the shares), for its report,
/// and the descriptors of its `PosixFd` shares (with `fds`), in order:
/// every binding of `ep`, or with `at` only the one at that offset (a
/// heap's new chunk, `OwnedPeers::grow`).
pub(crate) fn export<S: State, K: Kind>(
    ep: &Endpoint<S, K>,
    fds: bool,
    at: Option<u64>,
) -> Result<(Vec<u8>, Vec<OwnedFd>), Cause> {
    let mut shares = Vec::new();
    let mut descriptors = Vec::new();
    let binds = local_binds(ep)
        .into_iter()
        .filter(|b| at.is_none_or(|o| b.offset == o));
    for b in binds {
        let (Some(addr), Some(keep)) = (b.addr, b.keep.as_ref()) else {
            tracing::warn!(
                device = b.device.0,
                offset = b.offset,
                "a bind by handle or raw address has no window for peers on the portable path: bind `Mapped<FabricShareable>` memory (`agree_bound`), or `Mapped<PosixFd>` memory with `agree_bound_fds` (one node)"
            );
            continue;
        };
        let e = match export_for_peers(keep, fds).map_err(Cause::Local)? {
            Ok(e) => e,
            // The one agreement this rank could have made and did not:
            // every rank fails (this one naming itself, the others the
            // lowest rank that failed so), rather than a peer's first copy
            // here (F9).
            Err(NotForPeers::PosixFdWithoutFds) => {
                return Err(Cause::Local(Error::PosixFdWithoutFds {
                    id: ep.id(),
                    device: b.device,
                    offset: b.offset,
                    size: b.size,
                }));
            }
            Err(NotForPeers::Other(what)) => {
                tracing::warn!(
                    device = b.device.0,
                    offset = b.offset,
                    memory = what,
                    "peers cannot import this memory from bootstrap bytes, so the portable path gets no window for it: bind `Mapped<FabricShareable>` memory, pass `PosixFd` memory with `agree_bound_fds` (one node), or register windows with `Endpoint::add_peer_window`"
                );
                continue;
            }
        };
        let Some(map_offset) = addr.checked_sub(e.map_base) else {
            continue; // a window always lies in its mapping
        };
        let (bytes, fd) = match e.handle {
            PeerHandle::Fabric(bytes) => {
                // Known as this process's own: a peer that sends it back as
                // its share is refused (`known`).
                known::note_own(ep.context(), &bytes, &keep.token());
                (bytes, false)
            }
            PeerHandle::Fd(fd) => {
                descriptors.push(fd);
                ([0; 64], true)
            }
        };
        shares.push(Share {
            device: b.device.0,
            offset: b.offset,
            size: b.size,
            map_offset,
            alloc_size: e.alloc_size,
            bytes,
            fd,
        });
    }
    Ok((encode(&shares), descriptors))
}

/// `shares` on the wire: a count, then each share.
fn encode(shares: &[Share]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + shares.len() * SHARE_BYTES);
    out.extend_from_slice(
        &u32::try_from(shares.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for s in shares {
        out.extend_from_slice(&s.device.to_le_bytes());
        for w in [s.offset, s.size, s.map_offset, s.alloc_size] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&s.bytes);
        out.push(u8::from(s.fd));
    }
    out
}

/// A peer's shares, read checked, never trusted.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<Share>, Cause> {
    let bad = |reason| Cause::BadMessage { reason };
    let cut = bad("memory shares cut short");
    let count = bytes
        .get(..4)
        .and_then(|w| w.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(bad("memory shares cut short"))?;
    let n = usize::try_from(count).unwrap_or(usize::MAX);
    if n > MAX_SHARES {
        return Err(bad("memory shares name too many bindings"));
    }
    if n.checked_mul(SHARE_BYTES).and_then(|b| b.checked_add(4)) != Some(bytes.len()) {
        return Err(bad("memory shares of the wrong length"));
    }
    let mut out = Vec::with_capacity(n);
    for one in bytes.get(4..).unwrap_or_default().chunks_exact(SHARE_BYTES) {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(one.get(at..at + 8)?.try_into().ok()?))
        };
        let (Some(device), Some(offset), Some(size), Some(map_offset), Some(alloc_size), Some(h)) = (
            one.get(..4)
                .and_then(|w| w.try_into().ok())
                .map(i32::from_le_bytes),
            word(4),
            word(12),
            word(20),
            word(28),
            one.get(36..100).and_then(|h| <[u8; 64]>::try_from(h).ok()),
        ) else {
            return Err(cut);
        };
        let fd = match one.get(100) {
            Some(0) => false,
            Some(1) => true,
            _ => return Err(bad("a memory share of an unknown kind")),
        };
        out.push(Share {
            device,
            offset,
            size,
            map_offset,
            alloc_size,
            bytes: h,
            fd,
        });
    }
    Ok(out)
}

/// A peer's binding imported and mapped here: the window to register.
pub(crate) struct Imported {
    rank: u32,
    device: Device,
    offset: u64,
    size: u64,
    addr: u64,
    /// The mapping, kept alive by the window.
    mem: crate::memory::KeepAlive,
}

/// Imports every share of `rank`'s report into this process and maps it
/// for `ep`'s devices (the ones this rank copies on). `ep_size` bounds the
/// shares' ranges, checked before the driver.
pub(crate) fn import<S: State, K: Kind>(
    ep: &Endpoint<S, K>,
    rank: usize,
    shares: &[Share],
    fds: &mut impl Iterator<Item = OwnedFd>,
    ep_size: u64,
    into: &mut Vec<Imported>,
) -> Result<(), Cause> {
    let bad = |reason| Cause::BadMessage { reason };
    let rank = u32::try_from(rank).map_err(|_| bad("a rank past u32"))?;
    for s in shares {
        if s.size == 0 || s.offset.checked_add(s.size).is_none_or(|e| e > ep_size) {
            return Err(bad("a peer's binding reaches past the endpoint"));
        }
        if s.map_offset
            .checked_add(s.size)
            .is_none_or(|e| e > s.alloc_size)
        {
            return Err(bad("a peer's binding reaches past its memory"));
        }
        let (ctx, devices) = (ep.context(), ep.devices());
        let (ptr, mem) = if s.fd {
            let fd = fds.next().ok_or(bad("a descriptor missing"))?;
            let m = Allocation::<PosixFd>::import_fd(ctx, fd.as_fd(), s.alloc_size)
                .map_err(Cause::Local)?
                .map(devices)
                .map_err(|f| Cause::Local(f.error))?;
            (m.device_ptr(), m.keep_alive())
        } else {
            let m = Allocation::<FabricShareable>::import_fabric(ctx, &s.bytes, s.alloc_size)
                .map_err(Cause::Local)?
                .map(devices)
                .map_err(|f| Cause::Local(f.error))?;
            (m.device_ptr(), m.keep_alive())
        };
        let addr = ptr
            .checked_add(s.map_offset)
            .ok_or(bad("a peer's binding past the address space"))?;
        into.push(Imported {
            rank,
            device: Device(s.device),
            offset: s.offset,
            size: s.size,
            addr,
            mem,
        });
    }
    Ok(())
}

/// Why [`import_all`] kept nothing.
pub(crate) enum NotImported {
    /// An import failed, or a share did not read.
    Failed(Cause),
    /// Rank `rank`'s share is memory this process knows as rank `owner`'s
    /// (`known`): refused before its import.
    Aliased { rank: usize, owner: usize },
}

impl From<Cause> for NotImported {
    fn from(c: Cause) -> NotImported {
        NotImported::Failed(c)
    }
}

/// Every peer's shares (`rest` of each report in rank order, empty where a
/// rank sent none) imported here for `ep`'s devices, each checked against
/// the endpoint `ep_of(rank)` that reaches that peer, and first against the
/// memory this process knows (`known`: its own, or another rank's). On an
/// error, what was imported is dropped (unmapped, released) before it
/// returns.
pub(crate) fn import_all<'a, S: State, K: Kind, P: State + IsReady + 'a, Q: Kind + 'a>(
    ep: &Endpoint<S, K>,
    me: usize,
    rests: &[&[u8]],
    fds: Vec<Vec<OwnedFd>>,
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>>,
) -> Result<Vec<Imported>, NotImported> {
    let mut imported = Vec::new();
    let mut fds = fds.into_iter();
    for (rank, rest) in rests.iter().enumerate() {
        let mut theirs = fds.next().unwrap_or_default().into_iter();
        let Some(peer) = ep_of(rank).filter(|_| rank != me && !rest.is_empty()) else {
            continue;
        };
        let shares = decode(rest)?;
        let (ctx, comm) = (ep.context(), ep.id());
        if let Some(owner) = shares
            .iter()
            .find_map(|s| known::check(ctx, comm, me, rank, &s.bytes).err())
        {
            return Err(NotImported::Aliased { rank, owner });
        }
        let before = imported.len();
        import(ep, rank, &shares, &mut theirs, peer.size(), &mut imported)?;
        // One `Imported` per share, in order.
        for (s, i) in shares
            .iter()
            .zip(imported.get(before..).unwrap_or_default())
        {
            known::note_peer(ctx, comm, rank, &s.bytes, &i.mem.token());
        }
    }
    Ok(imported)
}

/// What follows a report agreement whose reports carried memory shares
/// (`rests`, each rank's in rank order, empty where a rank sent none): the
/// descriptors cross (`mine`, this rank's, in its shares' order), every
/// peer's memory is imported here when this rank copies on the portable
/// path (`portable`), one more agreement ([`Step::Import`]) makes a failed
/// import fail every rank alike, then the windows are registered on
/// `ep_of(rank)`. Nothing runs where no rank sent shares (the fabric
/// copy's case). On an error everything imported is dropped (unmapped,
/// released) before it returns.
#[allow(clippy::too_many_arguments)] // one step of the agreement, every input named
pub(crate) fn import_and_register<'a, S: State, K: Kind, P: State + IsReady + 'a, Q: Kind + 'a>(
    boot: &dyn Bootstrap,
    tag: u64,
    ep: &Endpoint<S, K>,
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>> + Copy,
    node: Option<&NodeId>,
    rests: &[&[u8]],
    mine: Vec<OwnedFd>,
    portable: bool,
    deadline: Deadline,
) -> Result<(), TeamError> {
    if rests.iter().all(|r| r.is_empty()) {
        return Ok(());
    }
    // Descriptors cross now (none where no rank shares `PosixFd` memory).
    let fds = pass_all_fds(boot, node, rests, mine, deadline)?;
    let imported = match portable {
        true => import_all(ep, boot.rank(), rests, fds, ep_of),
        false => Ok(Vec::new()),
    };
    // An aliased share is no failure of this rank: its outcome names the
    // sender, so that every rank fails alike naming that rank.
    let (imported, outcome) = match imported {
        Ok(i) => (i, Ok(Vec::new())),
        Err(NotImported::Aliased { rank, owner }) => {
            let said = to_bytes(&(rank as u64, owner as u64));
            (Vec::new(), Ok(said))
        }
        Err(NotImported::Failed(c)) => (Vec::new(), Err((Step::Import, c))),
    };
    // Every rank imported every peer's memory, or every rank fails alike;
    // `imported` is dropped (unmapped, released) on the way out.
    let said = super::agree::agree(boot, tag, Step::Import, outcome, deadline)?;
    if let Some(e) = first_aliased(&said) {
        return Err(e);
    }
    register(imported, ep_of);
    Ok(())
}

/// The first share in rank order that a rank refused as aliased memory (its
/// import outcome names the sender and whose memory it is), as the same
/// error on every rank: the sender, at [`Step::Import`].
fn first_aliased(said: &[Vec<u8>]) -> Option<TeamError> {
    let (seen_by, bytes) = said.iter().enumerate().find(|(_, b)| !b.is_empty())?;
    let bad = |reason| TeamError::new(seen_by, Step::Import, Cause::BadMessage { reason });
    let Ok((rank, owner)) = from_bytes::<(u64, u64)>(bytes) else {
        return Some(bad("an import outcome of the wrong form"));
    };
    match (usize::try_from(rank), usize::try_from(owner)) {
        (Ok(rank), Ok(owner)) if rank < said.len() && owner < said.len() => Some(TeamError::new(
            rank,
            Step::Import,
            Cause::Aliased { seen_by, owner },
        )),
        _ => Some(bad("an import outcome naming no rank")),
    }
}

/// Registers each imported binding on the endpoint `ep_of(rank)` that
/// reaches that rank; the endpoint keeps the mapping from now on. Nothing
/// can fail here: every range was checked at import.
pub(crate) fn register<'a, P: State + IsReady + 'a, Q: Kind + 'a>(
    imported: Vec<Imported>,
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>>,
) {
    let mut replaced = Vec::new();
    for i in imported {
        let Some(ep) = usize::try_from(i.rank).ok().and_then(&ep_of) else {
            continue; // this rank's own index: its binds are its windows
        };
        replaced.extend(ep.set_peer_window(i.rank, i.device, i.offset, i.size, i.addr, i.mem));
    }
    // Outside every lock: a replaced window may hold the last mapping.
    drop(replaced);
}

/// Every rank's descriptors (entry `r`: rank `r`'s, in its shares' order),
/// passed in rounds every rank reads off the same reports (`rests`); a rank
/// that passed no `node` joins them on its own (`NodeId::current`). Empty
/// where no rank shares a descriptor, with no round run.
pub(crate) fn pass_all_fds(
    boot: &dyn Bootstrap,
    node: Option<&NodeId>,
    rests: &[&[u8]],
    mine: Vec<OwnedFd>,
    deadline: Deadline,
) -> Result<Vec<Vec<OwnedFd>>, TeamError> {
    let me = boot.rank();
    let Some(counts) = fd_counts(rests).map_err(|(r, c)| TeamError::new(r, Step::Bind, c))? else {
        return Ok(Vec::new());
    };
    let here;
    let node = match node {
        Some(n) => n,
        None => {
            here = NodeId::current().map_err(|source| {
                let step = Exchange {
                    op: Op::FdPassing,
                    seq: 0,
                };
                let e = BootstrapError::Io {
                    rank: me,
                    step,
                    peer: None,
                    source,
                };
                TeamError::new(me, Step::Import, Cause::Bootstrap(e))
            })?;
            &here
        }
    };
    pass_fds(boot, node, &counts, &mine, deadline)
        .map_err(|(r, c)| TeamError::new(r, Step::Import, c))
}

/// How many descriptors each rank's shares (`rests`, in rank order) say
/// cross; `None` where none does (the usual case: no round is run).
fn fd_counts(rests: &[&[u8]]) -> Result<Option<Vec<usize>>, (usize, Cause)> {
    let mut counts = Vec::with_capacity(rests.len());
    for (rank, rest) in rests.iter().enumerate() {
        let n = match rest.is_empty() {
            true => 0,
            false => decode(rest)
                .map_err(|c| (rank, c))?
                .iter()
                .filter(|s| s.fd)
                .count(),
        };
        counts.push(n);
    }
    Ok(counts.iter().any(|&n| n > 0).then_some(counts))
}

/// Passes every rank's descriptors to every rank of the node, one
/// `FdExchange` round per descriptor, each rank's in rank order: entry `r`
/// is rank `r`'s (this rank's own as duplicates). Every rank runs the same
/// rounds, since every rank read the same `counts`.
fn pass_fds(
    boot: &dyn Bootstrap,
    node: &NodeId,
    counts: &[usize],
    mine: &[OwnedFd],
    deadline: Deadline,
) -> Result<Vec<Vec<OwnedFd>>, (usize, Cause)> {
    let me = boot.rank();
    let mut all = Vec::with_capacity(counts.len());
    for (root, &n) in counts.iter().enumerate() {
        let mut theirs = Vec::with_capacity(n);
        for i in 0..n {
            let offer = (root == me)
                .then(|| mine.get(i).map(|f| f.as_fd()))
                .flatten();
            let fd = FdExchange::broadcast_fd_on(boot, node, root, offer, deadline.remaining())
                .map_err(|e| (failed_at(&e, root), Cause::Bootstrap(e)))?;
            theirs.push(fd);
        }
        all.push(theirs);
    }
    Ok(all)
}

/// The rank a failed descriptor round of `root`'s is reported at: across
/// nodes, the first rank off `root`'s node, the same on every rank; else
/// `root`.
fn failed_at(e: &BootstrapError, root: usize) -> usize {
    match e {
        BootstrapError::OtherNode { outside, .. } => *outside,
        _ => root,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_memory_shares_are_read_checked_never_trusted() {
        let share = |device, fd| Share {
            device,
            offset: 2 << 20,
            size: 4096,
            map_offset: 8192,
            alloc_size: 2 << 20,
            bytes: [device as u8; 64],
            fd,
        };
        let shares = vec![share(0, false), share(3, true)];
        let ok = encode(&shares);
        assert_eq!(decode(&ok).ok(), Some(shares));
        for cut in 0..ok.len() {
            assert!(decode(&ok[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = ok.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        let mut kind = ok.clone();
        if let Some(last) = kind.last_mut() {
            *last = 2;
        }
        assert!(decode(&kind).is_err(), "a share of an unknown kind");
        assert!(decode(&u32::MAX.to_le_bytes()).is_err());
    }
}

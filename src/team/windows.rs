//! The portable path's peer windows, made by the every-rank-bound agreement
//! (`agree_bound`) so that no user registers them by hand (issue 19,
//! item 4).
//!
//! What this file owns:
//! - [`export`]: on a rank whose copies take [`CopyPath::Portable`], what
//!   its report adds for peers: for each binding by address of
//!   [`FabricShareable`](crate::FabricShareable) memory, where it is bound
//!   and the allocation's fabric handle (bytes, so they cross in the
//!   agreement's own message). Other memory is named in a `tracing`
//!   warning and gets no window: `PosixFd` memory crosses only as a
//!   descriptor (`SCM_RIGHTS`, one node), an `Allocation` bound by handle
//!   has no address, and `Private` memory does not bind to a team endpoint
//!   at all (R5.6, a compile error).
//! - [`import`] and [`register`]: every peer's memory imported and mapped
//!   here, checked against the endpoint before the driver sees a byte; one
//!   more agreement ([`Step::Import`]) so that a failed import fails every
//!   rank alike; then the windows registered on the endpoints that reach
//!   each peer. On any error everything imported is dropped (unmapped and
//!   released) before the error returns; registered windows go with the
//!   endpoint (`endpoint::forget_rest`).

use crate::CopyPath;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::kind::Kind;
use crate::memory::{Allocation, FabricShareable, Mapped, export_for_peers};
use crate::portable::local_binds;
use crate::state::{IsReady, State};

use super::error::Cause;

/// Bytes of one share on the wire: device, offset, size, offset in the
/// mapping, allocation size, fabric handle.
const SHARE_BYTES: usize = 4 + 8 * 4 + 64;
/// The most shares one rank's report may carry (checked before anything is
/// allocated for them).
const MAX_SHARES: usize = 4096;

/// One binding of a peer, as its report says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub device: i32,
    pub offset: u64,
    pub size: u64,
    pub map_offset: u64,
    pub alloc_size: u64,
    pub bytes: [u8; 64],
}

/// Whether this rank's copies take the portable path, so that its report
/// carries shares and it imports its peers'.
pub(crate) fn portable<S: State, K: Kind>(ep: &Endpoint<S, K>) -> bool {
    ep.context().copy_path() == CopyPath::Portable
}

/// This rank's shares, encoded (a count, then the shares), for its report.
pub(crate) fn export<S: State, K: Kind>(ep: &Endpoint<S, K>) -> Result<Vec<u8>, Cause> {
    let mut shares = Vec::new();
    for b in local_binds(ep) {
        let (Some(addr), Some(keep)) = (b.addr, b.keep.as_ref()) else {
            tracing::warn!(
                device = b.device.0,
                offset = b.offset,
                "a bind by handle or raw address has no window for peers on the portable path: bind `Mapped<FabricShareable>` memory"
            );
            continue;
        };
        let e = match export_for_peers(keep).map_err(Cause::Local)? {
            Ok(e) => e,
            Err(what) => {
                tracing::warn!(
                    device = b.device.0,
                    offset = b.offset,
                    memory = what,
                    "peers cannot import this memory from bootstrap bytes, so the portable path gets no window for it: bind `Mapped<FabricShareable>` memory, or register windows with `Endpoint::add_peer_window`"
                );
                continue;
            }
        };
        let Some(map_offset) = addr.checked_sub(e.map_base) else {
            continue; // a window always lies in its mapping
        };
        shares.push(Share {
            device: b.device.0,
            offset: b.offset,
            size: b.size,
            map_offset,
            alloc_size: e.alloc_size,
            bytes: e.bytes,
        });
    }
    let mut out = Vec::with_capacity(4 + shares.len() * SHARE_BYTES);
    out.extend_from_slice(
        &u32::try_from(shares.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for s in &shares {
        out.extend_from_slice(&s.device.to_le_bytes());
        for w in [s.offset, s.size, s.map_offset, s.alloc_size] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&s.bytes);
    }
    Ok(out)
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
            one.get(36..).and_then(|h| <[u8; 64]>::try_from(h).ok()),
        ) else {
            return Err(cut);
        };
        out.push(Share {
            device,
            offset,
            size,
            map_offset,
            alloc_size,
            bytes: h,
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
    mem: Mapped<FabricShareable>,
}

/// Imports every share of `rank`'s report into this process and maps it
/// for `ep`'s devices (the ones this rank copies on). `ep_size` bounds the
/// shares' ranges, checked before the driver.
pub(crate) fn import<S: State, K: Kind>(
    ep: &Endpoint<S, K>,
    rank: usize,
    shares: &[Share],
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
        let mem =
            Allocation::<FabricShareable>::import_fabric(ep.context(), &s.bytes, s.alloc_size)
                .map_err(Cause::Local)?
                .map(ep.devices())
                .map_err(|f| Cause::Local(f.error))?;
        let addr = mem
            .device_ptr()
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

/// Every peer's shares (`rest` of each report in rank order, empty where a
/// rank sent none) imported here for `ep`'s devices, each checked against
/// the endpoint `ep_of(rank)` that reaches that peer. On an error, what was
/// imported is dropped (unmapped, released) before it returns.
pub(crate) fn import_all<'a, S: State, K: Kind, P: State + IsReady + 'a, Q: Kind + 'a>(
    ep: &Endpoint<S, K>,
    me: usize,
    rests: &[&[u8]],
    ep_of: impl Fn(usize) -> Option<&'a Endpoint<P, Q>>,
) -> Result<Vec<Imported>, Cause> {
    let mut imported = Vec::new();
    for (rank, rest) in rests.iter().enumerate() {
        let Some(peer) = ep_of(rank).filter(|_| rank != me && !rest.is_empty()) else {
            continue;
        };
        import(ep, rank, &decode(rest)?, peer.size(), &mut imported)?;
    }
    Ok(imported)
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
        let keep = crate::memory::BindSource::keep_alive(&i.mem);
        replaced.extend(ep.set_peer_window(i.rank, i.device, i.offset, i.size, i.addr, keep));
    }
    // Outside every lock: a replaced window may hold the last mapping.
    drop(replaced);
}

//! The words of the error messages: the suffixes and phrases the
//! [`Error`](super::Error) variants' `#[error(..)]` formats and its methods share,
//! and the driver codes the predicates read.

use crate::driver::{Call, Code, Device, Location};

use super::Rule;

pub(super) fn device_suffix(d: Option<crate::Device>) -> String {
    d.map(|d| format!(" for {d}")).unwrap_or_default()
}

pub(super) fn numa_suffix(n: Option<i32>) -> String {
    n.map(|n| format!(" or on its host NUMA node {n}"))
        .unwrap_or_default()
}

pub(super) fn not_local_words(location: Location, stream: Device, fabric_import: bool) -> String {
    if fabric_import {
        format!(
            "the local memory was imported by fabric handle, so it is on {} of the node that exported it, which may be another node (an ordinal names a device of its own node), not on this node's {stream} (F2: the pointer of a copy through an endpoint is on the stream's device or host memory); copy from memory allocated in this process, or imported with `import_fd` from a process of this node, and reach the exporter's memory through an endpoint bound to it",
            location_words(location)
        )
    } else {
        format!(
            "the local memory is on {}, but the stream is on {stream} (F2); copy on a stream of that device, or from memory on {stream} or host memory",
            location_words(location)
        )
    }
}

pub(super) fn peer_window_words(
    rank: u32,
    device: Device,
    targets: u32,
    here: u32,
    peers: u32,
) -> String {
    if here >= targets {
        format!(
            "a peer window for {device} of rank {rank} names a target the endpoint does not have: its {targets} target(s) are all devices of this process (a unicast endpoint it created, or a team of its own devices), whose memory a bind by address here reaches with no window; bind `Mapped` memory on the endpoint here, and add peer windows in the processes that imported it, for the memory bound here"
        )
    } else {
        format!(
            "a peer window for {device} of rank {rank} would be one target more than the endpoint's {targets}: {here} are devices of this process and {peers} other rank and device pairs have windows already; name each target in another process by the same rank and device in every window"
        )
    }
}

pub(super) fn devices_words(devices: &[Device]) -> String {
    match devices {
        [] => "no device".into(),
        _ => devices
            .iter()
            .map(Device::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

pub(super) fn location_words(l: Location) -> String {
    match l {
        Location::Device(d) => d.to_string(),
        Location::HostNuma(n) => format!("host NUMA node {n}"),
    }
}

pub(super) fn version_suffix(v: Option<i32>) -> String {
    match v {
        Some(v) => format!(
            " (driver reports CUDA {}.{}, {v})",
            v / 1000,
            (v % 1000) / 10
        ),
        None => String::new(),
    }
}

pub(super) fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

pub(super) fn rule_suffix(rule: Option<Rule>) -> String {
    rule.map(|r| format!(" ({r})")).unwrap_or_default()
}

/// Raw `CUresult` numbers the predicates and hints read. Kept as numbers so
/// that they do not depend on how [`Code`] names them.
// TODO(boundary): delegate to `Code::is_retryable` /
// `Code::is_resource_exhausted` once `Code` has them.
pub(super) mod raw {
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const DEINITIALIZED: u32 = 4;
    pub const MULTICAST_RESOURCE_FULL: u32 = 47;
    pub const ILLEGAL_STATE: u32 = 401;
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const SYSTEM_NOT_READY: u32 = 802;
    pub const FABRIC_NOT_READY: u32 = 919;
}

/// Retrying the same call later can succeed without the caller changing
/// anything: fabric software still coming up (SPEC R5.10, 13.5 notes).
pub(super) fn code_is_retryable(code: Code) -> bool {
    matches!(code.raw(), raw::SYSTEM_NOT_READY | raw::FABRIC_NOT_READY)
}

/// Memory or fabric resources (multicast groups) ran out: free some, then retry.
pub(super) fn code_is_resource_exhausted(code: Code) -> bool {
    matches!(
        code.raw(),
        raw::OUT_OF_MEMORY | raw::MULTICAST_RESOURCE_FULL
    )
}

pub(super) fn hint_suffix(call: Call, code: Code) -> &'static str {
    let multicast = matches!(
        call,
        Call::Create | Call::BindMem | Call::BindAddr | Call::MulticastCreate
    );
    // The typed layer checked the batch (F1-F9) before the driver: what
    // the driver refuses then is its own limit or state.
    let copy = matches!(call, Call::FabricCpyBatchAsync | Call::MemcpyAsync);
    match code.raw() {
        raw::INVALID_VALUE if copy => {
            ": the driver refused a batch the library had checked: it is larger than the driver takes in one call (the model fabric: at most 16384 ops, and 1 MiB of host bytes each way), or a peer changed the bindings it copies through (F9); split the batch"
        }
        raw::OUT_OF_MEMORY if copy => {
            ": too much in flight on the stream (R11; the model fabric: 1.25 MiB of host-destination bytes per stream, each op counting its bytes and 16); wait for the earlier copies (synchronize the stream), or split the batch"
        }
        raw::OUT_OF_MEMORY if multicast => {
            ": device memory or fabric resources (multicast groups) are exhausted (R5.10, R11); free endpoints or bindings and retry"
        }
        raw::OUT_OF_MEMORY => ": out of memory (R11); free memory or endpoints and retry",
        raw::MULTICAST_RESOURCE_FULL => {
            ": the fabric has no multicast resources left; destroy multicast endpoints and retry"
        }
        raw::SYSTEM_NOT_READY => {
            ": the fabric software (fabric manager / IMEX) is not running (R5.10); start it and retry (retryable)"
        }
        raw::FABRIC_NOT_READY => ": the fabric is not ready yet; retry after a delay (retryable)",
        raw::ILLEGAL_STATE => {
            ": the system is misconfigured (fabric or NVLink state, R5.10); fix the setup, then retry"
        }
        raw::NOT_PERMITTED => {
            ": this process may not do this (denied by policy or by the driver, R11)"
        }
        raw::DEINITIALIZED => ": the driver is shutting down (R11)",
        raw::INVALID_VALUE if call == Call::MemImportFromShareableHandle => {
            ": not a live shareable handle here; a POSIX descriptor reaches only the processes of its node (R12.4): use fabric handles across nodes"
        }
        _ => "",
    }
}

/// The fix for [`Error::Timeout`], by kind.
pub(super) fn timeout_fix(multicast: bool) -> &'static str {
    if multicast {
        "wait longer: a multicast team finishes only once every device of every process is enrolled (R3.2)"
    } else {
        "wait longer: construction is asynchronous and the driver has not finished it yet"
    }
}

/// `[start, end)` spans as words (a peer's bound bytes, this process's):
/// "bytes a..b, c..d", the first few, so that a message stays short
/// whatever was bound; or "no bytes".
fn spans(covered: &[(u64, u64)]) -> String {
    const SHOWN: usize = 8;
    let mut spans: Vec<String> = covered
        .iter()
        .take(SHOWN)
        .map(|(a, b)| format!("{a}..{b}"))
        .collect();
    if covered.len() > SHOWN {
        spans.push(format!("and {} more", covered.len() - SHOWN));
    }
    if spans.is_empty() {
        return "no bytes".to_owned();
    }
    format!("bytes {}", spans.join(", "))
}

/// What to do about [`Error::CopyOutOfRange`](super::Error::CopyOutOfRange):
/// the size or the offset that fits.
pub(super) fn out_of_range_fix(offset: u64, size: u64, limit: u64) -> String {
    match limit.checked_sub(size) {
        None => format!("a copy there is at most {limit} bytes"),
        Some(last) => format!(
            "this size fits at an offset of at most {last}{}",
            if offset > limit {
                " (the offset is past the end)"
            } else {
                ""
            }
        ),
    }
}

/// What to do about [`Error::CopyNotBound`](super::Error::CopyNotBound),
/// with what this process bound on that device.
pub(super) fn not_bound_fix(bound: &[(u64, u64)]) -> String {
    let across = "; across processes, copy only after every rank bound and agreed (`agree_bound`)";
    if bound.is_empty() {
        return format!(
            "nothing is bound there in this process: bind memory there first and keep its `Binding` (one dropped unbinds, as `let _ = ep.bind(..)` does at once){across}"
        );
    }
    format!(
        "this process bound {} there: copy inside those bytes, or bind memory over the rest (a dropped `Binding` unbinds){across}",
        spans(bound)
    )
}

/// What to do about [`Error::CopyPeerNotBound`](super::Error::CopyPeerNotBound).
pub(super) fn peer_not_bound_fix(p: &super::PeerBound) -> String {
    // An agreement refuses a rank that bound nothing on a device: nothing
    // known is what a close left (R13.7).
    if p.covered.is_empty() {
        return format!(
            "the ranks closed since (every rank stopped copying, so rank {} may unbind): agree again on every rank (`agree_bound`) before copying through it",
            p.rank
        );
    }
    format!(
        "it bound {} there: copy inside those bytes, or have rank {} bind more there and agree again on every rank (`agree_bound`) before copying into them",
        spans(&p.covered),
        p.rank
    )
}

/// What to do about [`Error::CopyNoWindow`](super::Error::CopyNoWindow):
/// for a peer that bound memory elsewhere on the endpoint, put inside what
/// it bound or have it bind there; else how this process gets windows.
pub(super) fn no_window_fix(peer: Option<&super::PeerBound>) -> String {
    if let Some(p) = peer {
        return format!(
            "rank {}'s memory on this endpoint (its {}) is reachable here only at {}: put inside those bytes, or have rank {} bind more there before an agreement that registers it here (`agree_bound`, `OwnedPeers::grow`)",
            p.rank,
            p.device,
            spans(&p.covered),
            p.rank
        );
    }
    "bind `Mapped` memory in this process (`Allocation::map(&[dev])`, then `bind`: a bind by `Allocation` handle has no address here), and for each target in another process: after a bring-up, bind `Mapped<FabricShareable>` memory on every rank before `agree_bound` or `OwnedPeers::grow` (or `PosixFd` memory and `agree_bound_fds` or `grow_fds`, one node), which registers the peers' memory; otherwise import it (`import_fd` within a node, `import_fabric` across), map it and register it with `Endpoint::add_peer_window`"
        .to_owned()
}

//! The crate's error type [`Error`], with [`Failed`] and [`Result`] (all
//! three public at the crate root only, re-exported in [`crate::error`] for
//! the crate's own paths), and the details its variants carry.
//!
//! Every message names the value, the rule and the fix; none formats through
//! the driver.
//!
//! This file owns [`Error`] and its predicates; `detail.rs` the details,
//! `words.rs` the message helpers, `failed.rs` [`Failed`].

use std::time::Duration;

use crate::driver::{Call, Code, Device, Location};

mod detail;
mod failed;
#[cfg(test)]
mod tests;
mod words;

pub use detail::{
    Alignment, Answer, Arg, ContextPair, CopyBytes, Extent, Feature, PeerBound, Role, Rule,
};
pub use failed::{Failed, Failure};
use words::*;

/// Everything that can go wrong, with the value, the rule and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda` could not be loaded.
    #[error(
        "no CUDA driver: {reason}. Install the NVIDIA driver, or use the reference model (`Context::model`)"
    )]
    NoDriver {
        /// Why the library could not be loaded.
        reason: String,
    },

    /// The driver, or the backend chosen, lacks a feature altogether.
    #[error(
        "unsupported: {feature}{}{} ({}); {}",
        version_suffix(*.driver_version),
        detail_suffix(.detail),
        .feature.rule(),
        .feature.fix()
    )]
    Unsupported {
        /// What is missing.
        feature: Feature,
        /// The driver version (`cuDriverGetVersion`), when known.
        driver_version: Option<i32>,
        /// What the machine or backend has instead, in words (may be empty).
        detail: String,
    },

    /// An environment variable this library reads has a value it cannot use.
    #[error("{variable}={value:?} is not valid: {problem}; {fix}")]
    BadEnvironment {
        /// The variable, e.g. `CUDA_ENDPOINTS_DENY`.
        variable: &'static str,
        /// Its value (lossily decoded when not UTF-8).
        value: String,
        /// What is wrong with it.
        problem: String,
        /// What to set instead.
        fix: String,
    },

    /// The driver answered a call with an error code.
    #[error("{call} failed with {code}{}", hint_suffix(*.call, *.code))]
    Driver {
        /// The entry point.
        call: Call,
        /// Its result code.
        code: Code,
    },

    /// The context a call needed could not be made current (the real
    /// driver's primary context of a device the program uses): the step
    /// that failed is named, and `call` itself was never made.
    #[error(
        "{step}{} failed with {code}, so {call} was not made; check that the device is visible to this process and usable (CUDA_VISIBLE_DEVICES, compute mode, `nvidia-smi`)",
        device_suffix(*.device)
    )]
    Context {
        /// The call that needed the context.
        call: Call,
        /// The context step that failed (`cuDevicePrimaryCtxRetain`, ...).
        step: crate::driver::ContextStep,
        /// The device whose context it was.
        device: Option<crate::Device>,
        /// The step's result code.
        code: Code,
    },

    /// A size, offset or address that must be a multiple of the bind
    /// alignment (SPEC R2.3, R5.3, R6.3) or of the allocation granularity.
    #[error(
        "{what} = {value} bytes is not a multiple of the {alignment_kind} ({alignment} bytes) ({rule}); use {what} = {suggested} bytes, the next valid multiple up (or down, where up does not fit)"
    )]
    Misaligned {
        /// Which argument.
        what: Arg,
        /// The value given, in bytes.
        value: u64,
        /// The alignment required, in bytes.
        alignment: u64,
        /// Which alignment that is.
        alignment_kind: Alignment,
        /// A valid value: the next multiple up where that fits, else the
        /// one below, in bytes.
        suggested: u64,
        /// The SPEC rule.
        rule: Rule,
    },

    /// A zero size or count where a non-zero one is needed.
    #[error(
        "{what} must not be zero{}; the smallest valid value is {suggested} {}",
        rule_suffix(*.rule),
        .what.unit_for(*.suggested)
    )]
    ZeroSize {
        /// Which argument.
        what: Arg,
        /// The smallest valid value, in [`Arg::unit`].
        suggested: u64,
        /// The SPEC rule; `None` for VMM allocations, which the contract
        /// does not cover (`cuMemCreate` refuses size 0).
        rule: Option<Rule>,
    },

    /// An endpoint size above the driver's `maxSize` (SPEC R2.3, R10).
    #[error(
        "endpoint size {requested} bytes exceeds the driver's maximum of {max_size} bytes for these properties (R2.3, R10); use at most {suggested} bytes per device"
    )]
    SizeTooLarge {
        /// The size asked for, in bytes.
        requested: u64,
        /// `maxSize` from `cuLogicalEndpointGetLimits`, in bytes.
        max_size: u64,
        /// The largest valid size (`max_size` rounded down to the bind alignment).
        suggested: u64,
    },

    /// A bind range that does not fit (SPEC R5.4).
    #[error(
        "{what}: offset {offset} + size {size} bytes exceeds {limit} bytes ({rule}); shrink the size or the offset"
    )]
    OutOfRange {
        /// What overflowed.
        what: Extent,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// The bytes available, in bytes.
        limit: u64,
        /// The SPEC rule.
        rule: Rule,
    },

    /// A device ordinal the driver does not have.
    #[error("{device} does not exist: the machine has {count} devices (0..{count})")]
    NoSuchDevice {
        /// The device given.
        device: Device,
        /// How many devices there are.
        count: i32,
    },

    /// A bind on a device that is not the owner / not enrolled (SPEC R5.2).
    #[error(
        "{device} is not {role} of this endpoint ({rule}); bind on one of: {}",
        devices_words(.allowed)
    )]
    WrongDevice {
        /// The device given.
        device: Device,
        /// The role it would need.
        role: Role,
        /// The devices that may be used.
        allowed: Vec<Device>,
        /// The SPEC rule.
        rule: Rule,
    },

    /// Memory that lives elsewhere than the device it is bound for (SPEC R5.5).
    #[error(
        "memory for {device} lives on {} (R5.5); allocate it on {device}{}",
        location_words(*.location),
        numa_suffix(*.host_numa)
    )]
    MemoryOnWrongDevice {
        /// The device bound for.
        device: Device,
        /// Where the memory lives.
        location: Location,
        /// The device's host NUMA node, when known.
        host_numa: Option<i32>,
    },

    /// A device enrolled twice in a team (SPEC R4.2).
    #[error("{device} is already enrolled in this team (R4.2); each device joins once")]
    AlreadyEnrolled {
        /// The device given twice.
        device: Device,
    },

    /// More devices than the team holds (SPEC R4.2).
    #[error("the team holds {team_size} devices and all are enrolled (R4.2); create a larger team")]
    TeamFull {
        /// The team size.
        team_size: u32,
    },

    /// A team of zero devices (SPEC R2.2).
    #[error(
        "a multicast team needs at least one device (R2.2); give `Spec::multicast` a non-empty device list"
    )]
    EmptyTeam,

    /// Two binds on one device that overlap in the endpoint range (SPEC R5.9).
    #[error(
        "bind on {device} at offset {offset} ({size} bytes) overlaps a live binding at {other_offset} ({other_size} bytes) (R5.9); unbind it or bind elsewhere"
    )]
    Overlap {
        /// The device.
        device: Device,
        /// Offset asked for, in bytes.
        offset: u64,
        /// Size asked for, in bytes.
        size: u64,
        /// The live binding's offset, in bytes.
        other_offset: u64,
        /// The live binding's size, in bytes.
        other_size: u64,
    },

    /// A bind over bytes that a bind or unbind whose driver call unwound
    /// (a panic inside it) left held: the driver may hold them, and no
    /// token is left to unbind them, so they stay until the endpoint is
    /// destroyed (SPEC R5.9).
    #[error(
        "bind on {device} at offset {offset} ({size} bytes) overlaps bytes {other_offset}..{} that a bind or unbind whose driver call panicked left held (R5.9): the driver may still hold them and no token is left to unbind them; bind elsewhere, or destroy the endpoint to free them",
        other_offset.saturating_add(*other_size)
    )]
    OverlapUnwound {
        /// The device.
        device: Device,
        /// Offset asked for, in bytes.
        offset: u64,
        /// Size asked for, in bytes.
        size: u64,
        /// The held bytes' offset.
        other_offset: u64,
        /// How many bytes are held.
        other_size: u64,
    },

    /// An op of a copy batch reaches past the endpoint, or past the local
    /// memory or host buffer it reads or writes (F9).
    #[error(
        "copy op {op}: {what}: offset {offset} + size {size} bytes exceeds {limit} bytes (F9); {}",
        out_of_range_fix(*offset, *size, *limit)
    )]
    CopyOutOfRange {
        /// The op's index in the batch.
        op: usize,
        /// What it overflowed.
        what: Extent,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// The bytes available.
        limit: u64,
    },

    /// An op of a copy batch reaches endpoint bytes that this process knows
    /// are not bound on a device of the endpoint (F9, R13.3).
    #[error(
        "copy op {op}: endpoint {id} bytes {offset}..{end} are not all bound on {device} (F9, R13.3); {}",
        not_bound_fix(bound),
        end = offset.saturating_add(*size)
    )]
    CopyNotBound {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// The device without memory bound there.
        device: Device,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// What this process bound on that device: `[start, end)` of the
        /// endpoint, merged, in order.
        bound: Box<[(u64, u64)]>,
    },

    /// An op of a copy batch reaches endpoint bytes outside what a peer
    /// bound on its device, as the ranks' last every-rank-bound agreement
    /// said ([`crate::team::SharedTeam::agree_bound`],
    /// [`crate::team::Peers::agree_bound`]; none after a close, until the
    /// next agreement): a copy outside the bound range is undefined
    /// behaviour (R13.5, F9).
    #[error(
        "copy op {op}: endpoint {id} bytes {offset}..{end} are outside what rank {rank} bound on its {device} when the ranks last agreed (F9, R13.5: a copy outside the bound range is undefined behaviour); {}",
        peer_not_bound_fix(peer),
        end = offset.saturating_add(*size),
        rank = peer.rank,
        device = peer.device,
    )]
    CopyPeerNotBound {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// The peer device without memory there, with what it bound.
        peer: Box<PeerBound>,
    },

    /// A binding on an endpoint that a live graph of copies names cannot be
    /// unbound (F8: a copy node needs every id valid and bound for as long
    /// as the graph may run); the memory stays bound.
    #[error(
        "endpoint {id}: a graph of copies through it lives, and may run again (F8: every id a graph names stays valid and bound for as long as the graph may run); drop the `CopyGraph` first (it synchronizes its stream), then unbind"
    )]
    UnbindUnderGraph {
        /// The endpoint id.
        id: u32,
    },

    /// An op of a copy batch reaches bytes of a heap's endpoint above what
    /// every rank bound and agreed on ([`crate::team::OwnedPeers::top`]):
    /// a peer may have nothing bound there (R13.3).
    #[error(
        "copy op {op}: endpoint {id} bytes {offset}..{end} are past the heap's top, {agreed} bytes, the most every rank bound and agreed on (R13.3); grow the heap on every rank first (`OwnedPeers::grow`), then copy below its new top",
        end = offset.saturating_add(*size)
    )]
    CopyNotAgreed {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// The bytes every rank bound and agreed on.
        agreed: u64,
    },

    /// A team's owning form ([`crate::team::OwnedPeers`],
    /// [`crate::team::OwnedTeam`]) was dropped, or its `close` failed,
    /// before every rank agreed that it stopped copying into it (R13.7):
    /// a peer may still write into this rank's memory, so the memory stays
    /// bound and allocated, and the endpoint alive, until the process exits
    /// (the driver reclaims them then, R12.2). Kept on the context
    /// ([`crate::Context::take_teardown_errors`]).
    #[error(
        "{what} of {ranks} ranks was torn down before every rank agreed it stopped copying into it (R13.7): its memory stays bound and allocated until the process exits (R12.2), since a peer may still write there; call `close(&boot, timeout)` on every rank instead of dropping it"
    )]
    CloseNotAgreed {
        /// What was dropped: `"an OwnedPeers"` or `"an OwnedTeam"`.
        what: &'static str,
        /// How many ranks share it.
        ranks: usize,
    },

    /// The local memory of a copy op is not on the stream's device nor
    /// host memory of this node (F2): on another device, or imported by
    /// fabric handle (on a device of the node that exported it, maybe
    /// another one, whatever its ordinal).
    #[error("copy op {op}: {}", not_local_words(*.location, *.stream_device, *.fabric_import))]
    CopyNotLocal {
        /// The op's index in the batch.
        op: usize,
        /// Where the memory lives (for memory imported by fabric handle: on
        /// the node that exported it).
        location: Location,
        /// The stream's device.
        stream_device: Device,
        /// Whether the memory was imported by fabric handle
        /// ([`crate::Allocation::import_fabric`]): a copy never takes it as
        /// local, since `location` may be on another node.
        fabric_import: bool,
    },

    /// The local memory of a copy op is host memory mapped without access
    /// for the stream's device (F2: "every operand accessible from the
    /// stream's device"): the copy would fault when the stream reached it.
    #[error(
        "copy op {op}: the local memory is host memory (host NUMA node {host_numa}) mapped with access for {}, not for the stream's {stream_device} (F2: every operand of a copy through an endpoint is accessible from the stream's device); map it with access for {stream_device} (`Allocation::map(&[{}])`), or copy on a stream of a device it is mapped for",
        devices_words(.access),
        .stream_device.0
    )]
    CopyNotAccessible {
        /// The op's index in the batch.
        op: usize,
        /// The host NUMA node of the memory.
        host_numa: i32,
        /// The devices its mapping gives access to ([`crate::Mapped::access`]).
        access: Vec<Device>,
        /// The stream's device.
        stream_device: Device,
    },

    /// An [`crate::Event`] recorded on a [`crate::Stream`] of another
    /// device: the driver refuses it (`CUDA_ERROR_INVALID_HANDLE`, the event
    /// and the stream are of different contexts).
    #[error(
        "the event is on {event_device} but the stream is on {stream_device}: an event records only on a stream of its own device (its context); make the event on {stream_device} (`Event::new(&ctx, {})`)",
        .stream_device.0
    )]
    EventOnOtherDevice {
        /// The event's device.
        event_device: Device,
        /// The stream's device.
        stream_device: Device,
    },

    /// Two ops of one copy batch depend on each other: one's destination
    /// overlaps the other's source or destination (F3).
    ///
    /// Compared by address and endpoint span: one allocation mapped twice
    /// in one process (an import of this process's own export) is two
    /// memories to the check, so ops dependent through its two addresses
    /// are not refused; they run in no order, as every batch's ops, and on
    /// the portable path ops end to end may run as one copy. Copy through
    /// one mapping of an allocation per batch.
    #[error(
        "copy ops {op} and {other} of one batch overlap: op {op} writes {writes} and op {other} {} {bytes}{}, and the copies of a batch run in no order (F3); if they are meant to be apart, check their offsets against their sizes (a stride below the size overlaps), else put them in two batches, one after the other",
        if *other_writes { "writes" } else { "reads" },
        if writes.meets(bytes) { "" } else { " (the same memory, through an endpoint bound to it)" }
    )]
    CopyDependent {
        /// The op that writes.
        op: usize,
        /// The op it overlaps.
        other: usize,
        /// The bytes `op` writes (its destination), as it names them.
        writes: CopyBytes,
        /// The bytes of `other` that `op`'s meet, as `other` names them.
        bytes: CopyBytes,
        /// Whether they are `other`'s destination (else its source).
        other_writes: bool,
    },

    /// On the portable path ([`crate::CopyPath::Portable`]): an op whose
    /// local memory is the memory that its endpoint bytes reach (bound
    /// there by address, or a peer window onto it), so that it would copy
    /// bytes onto themselves: `cuMemcpyAsync` forbids overlapping source
    /// and destination ranges. Also across the pieces of one op (an op
    /// across two bound memories, a put to several members), which run in
    /// no order: one piece reading what another writes.
    #[error(
        "copy op {op} on the portable path (cuMemcpyAsync): its local memory is (in part) the memory that endpoint {id} bytes {offset}..{end} reach, so it would copy bytes onto themselves, and cuMemcpyAsync forbids overlapping source and destination ranges; leave the op out when the bytes are already where they should be, or copy through other memory (into a staging buffer in one batch, from it in the next)",
        end = offset.saturating_add(*size)
    )]
    CopyOntoItself {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
    },

    /// A copy's enqueue and an unbind on one endpoint range, one called
    /// from inside the other on one thread (a `tracing` layer or a backend
    /// called back into the crate during the outer driver call): the copy
    /// and the unbind would race (F4), and the inner call would wait for
    /// the outer one for ever. Refused before the driver.
    #[error(
        "endpoint {id}: this thread is inside a copy's enqueue and an unbind on the same endpoint range at once (a `tracing` layer or a backend called back into the crate during the outer call), and the copy and the unbind would race (F4); make the inner call after the outer one returned"
    )]
    CopyUnbindReentered {
        /// The endpoint id of the inner call.
        id: u32,
    },

    /// A strided put or get ([`crate::Strided`]) of more ops than this
    /// process can hold in one batch's op list (56 bytes each): refused
    /// before any of it is allocated.
    #[error(
        "a strided copy of {ops} ops cannot be held in one batch (its op list of 56 bytes per op could not be allocated); copy fewer, larger blocks, or split it into several batches"
    )]
    CopyTooManyOps {
        /// The ops asked for.
        ops: u64,
    },

    /// The host buffer of a [`crate::CopyBatch::get_host`] op could not be
    /// allocated in this process (an endpoint's size, and an imported one's
    /// is what its exporter claims, can be far more than this process can
    /// hold): refused at enqueue, nothing allocated, instead of aborting.
    #[error(
        "copy op {op}: a host buffer of {size} bytes for `get_host` could not be allocated in this process; get fewer bytes per op (several `get_host` ops over parts of the range, in several batches if need be), or `get` into `Mapped` memory"
    )]
    CopyHostBufferUnavailable {
        /// The op's index in the batch.
        op: usize,
        /// The bytes asked for.
        size: u64,
    },

    /// On the portable path ([`crate::CopyPath::Portable`]): an op reaches
    /// endpoint bytes that this process cannot reach on every target — no
    /// memory it bound by address there, and no peer window
    /// ([`crate::Endpoint::add_peer_window`]) (F9).
    #[error(
        "copy op {op} on the portable path (cuMemcpyAsync): endpoint {id} bytes {offset}..{end} are reachable here on {known} of its {targets} targets (F9); {}",
        no_window_fix(.peer.as_deref()),
        end = offset.saturating_add(*size)
    )]
    CopyNoWindow {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// Targets with a window over those bytes.
        known: u32,
        /// Targets of the endpoint: 1 for unicast, the team size for multicast.
        targets: u32,
        /// The first target without them when it is another process's with
        /// windows elsewhere on the endpoint (it bound memory, not there),
        /// with what they cover; `None` otherwise.
        peer: Option<Box<PeerBound>>,
    },

    /// On the portable path ([`crate::CopyPath::Portable`]): an agreement
    /// that shares this rank's memory with its peers (`agree_bound`,
    /// `OwnedPeers::grow`) found [`crate::PosixFd`] memory bound, whose
    /// descriptors cross only with the `_fds` agreements: peers would get
    /// no window onto it, and their copies there would fail (F9).
    #[error(
        "endpoint {id}: {device} binds `PosixFd` memory at bytes {offset}..{end}, which this agreement cannot share with peers on the portable path (they reach it through windows, F9); agree with `agree_bound_fds` (a heap's chunk: `OwnedPeers::grow_fds`), whose descriptors pass within one node, or bind `FabricShareable` memory",
        end = offset.saturating_add(*size)
    )]
    PosixFdWithoutFds {
        /// The endpoint id.
        id: u32,
        /// The device it is bound on.
        device: Device,
        /// Where, in endpoint bytes.
        offset: u64,
        /// How many bytes.
        size: u64,
    },

    /// On the portable path ([`crate::CopyPath::Portable`]): the endpoint's
    /// windows name more targets than it has (its devices in this process
    /// and each `(rank, device)` of a peer window count one each), so which
    /// memory is a target's cannot be told. [`crate::Endpoint::add_peer_window`]
    /// refuses the window that would do it; a team that enrolled devices
    /// of this process after windows were added for them as peers' gets
    /// here.
    #[error(
        "copy op {op} on the portable path (cuMemcpyAsync): endpoint {id} has windows for {members} targets, but it has {targets} (its devices in this process, and each rank and device named by a peer window, count one each), so which memory is a target's cannot be told; add a peer window only for a target in another process, named by the same rank and device every time (make the endpoint again to drop the extra ones)"
    )]
    CopyWindowsPastTargets {
        /// The op's index in the batch.
        op: usize,
        /// The endpoint id.
        id: u32,
        /// Targets with windows: devices of this process and peers.
        members: u32,
        /// Targets of the endpoint: 1 for unicast, the team size for multicast.
        targets: u32,
    },

    /// [`crate::Endpoint::add_peer_window`] for a `(rank, device)` that
    /// would be one target more than the endpoint has: every target is a
    /// device of this process (a unicast endpoint it created, a team of
    /// its own devices), or every other one is named by a window already.
    #[error("endpoint {id}: {}", peer_window_words(*.rank, *.device, *.targets, *.here, *.peers))]
    PeerWindowNoTarget {
        /// The endpoint id.
        id: u32,
        /// The rank the window was added for.
        rank: u32,
        /// The device the window was added for.
        device: Device,
        /// Targets of the endpoint: 1 for unicast, the team size for multicast.
        targets: u32,
        /// Targets that are devices of this process.
        here: u32,
        /// Other `(rank, device)` pairs that peer windows name already.
        peers: u32,
    },

    /// A device attribute says the device lacks a feature (SPEC R2.4, C6).
    #[error(
        "{device} does not support {feature} (attribute {attribute} = {value}; {}); {}",
        .feature.rule(),
        .feature.fix()
    )]
    FeatureMissing {
        /// The device.
        device: Device,
        /// The feature.
        feature: Feature,
        /// The attribute number.
        attribute: i32,
        /// Its value on the device (0, or a bitmask without the bit needed).
        value: i32,
    },

    /// `wait` ran out of time; the endpoint comes back pending (SPEC R3).
    #[error(
        "{} endpoint {id} not ready after {waited:?} and {polls} {} (R3); {}",
        if *.multicast { "multicast" } else { "unicast" },
        if *.polls == 1 { "query" } else { "queries" },
        timeout_fix(*.multicast)
    )]
    Timeout {
        /// The (first) id waited on.
        id: u32,
        /// How long was waited.
        waited: Duration,
        /// How many `cuLogicalEndpointQuery` calls were made.
        polls: u64,
        /// Whether it is a multicast endpoint, which waits for its team too.
        multicast: bool,
    },

    /// A fabric handle that was not issued by this driver (SPEC R9.4).
    #[error(
        "the bytes are not a fabric handle of a {expected} endpoint ({reason}; R9.4); pass the bytes `FabricHandle::to_bytes` gave, unchanged"
    )]
    BadHandle {
        /// The kind expected.
        expected: &'static str,
        /// What did not match.
        reason: String,
    },

    /// An allocation size that cannot be rounded up to the granularity.
    #[error(
        "an allocation of {requested} bytes cannot be rounded up to the allocation granularity ({granularity} bytes); ask for at most {largest} bytes"
    )]
    AllocationTooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The granularity, bytes.
        granularity: u64,
        /// The largest size that can be asked for, bytes.
        largest: u64,
    },

    /// A fabric handle already attached in this context (R9).
    #[error(
        "this process already holds the endpoint behind this fabric handle (endpoint {id}, through this or another context of the process, R9); use that endpoint: a second attachment in one process shares its bindings with the first, and destroying either would unbind both"
    )]
    AlreadyAttached {
        /// The id that holds it.
        id: u32,
    },

    /// The driver answered a value no driver may give: nothing was built
    /// on it (and what it reserved was handed back).
    #[error(
        "{call} answered {value} ({what}): not a value the driver contract allows; the driver or a wrapper of it is broken, nothing was built on the answer"
    )]
    BadAnswer {
        /// The call that answered.
        call: Call,
        /// Which value.
        what: Answer,
        /// The value.
        value: u64,
    },

    /// A team device in another multicast clique than a device this process
    /// already enrolled (13.4+, `cuDeviceGetCliqueInfo`): the driver would
    /// refuse it at AddDevice or fail construction at Query (R4.5).
    #[error(
        "{device} is in multicast clique {clique}, but {team_device} of the team is in clique {team_clique} (R4.5, cuDeviceGetCliqueInfo); build the team from devices of one clique"
    )]
    OtherClique {
        /// The device refused.
        device: Device,
        /// Its clique.
        clique: u32,
        /// A device already in the team.
        team_device: Device,
        /// That device's clique.
        team_clique: u32,
    },

    /// [`crate::Binding::copy_through`] given another endpoint than the one
    /// the binding is on.
    #[error(
        "the binding is on endpoint id {binding_id}, not on endpoint id {id}: lend the endpoint through its own binding"
    )]
    NotThisBinding {
        /// The endpoint given.
        id: u32,
        /// The endpoint the binding is on.
        binding_id: u32,
    },

    /// A stream handed in from elsewhere (cudarc's default stream) that is
    /// the legacy NULL stream, which carries no copy (F6).
    #[error(
        "the legacy NULL stream cannot carry copies (F6): make a stream with `CudaContext::new_stream` (cudarc) or `Stream::new`"
    )]
    NullStream,

    /// Two objects of different [`crate::Context`]s (driver backends) met:
    /// memory and the endpoint it binds into, an endpoint or memory and the
    /// stream of its copy, an event and its stream.
    #[error(
        "the {} belongs to another context (driver backend) than the {}: every object of one call comes from one `Context`; {}",
        .pair.objects().0,
        .pair.objects().1,
        .pair.fix()
    )]
    WrongContext {
        /// Which two.
        pair: ContextPair,
    },

    /// Imported memory (C5) that is not what the importer declared, as the
    /// driver reports it after import: the bytes or descriptor are never
    /// trusted for size, location or handle type.
    #[error(
        "the imported allocation is not the declared {declared} bytes of `{share}` memory: {problem} (C5); declare the size and handle type of the exporter's `Allocation`"
    )]
    ImportMismatch {
        /// The size the importer declared, bytes.
        declared: u64,
        /// The handle type the importer declared (`PosixFd`, `FabricShareable`).
        share: &'static str,
        /// What the driver reported instead.
        problem: String,
    },

    /// Fabric handles are refused: no fabric daemon (seen on the H200 test machine).
    #[error(
        "fabric handles are not permitted on {device} ({call}: CUDA_ERROR_NOT_PERMITTED): the fabric manager/IMEX daemon is not running or this process lacks access (R9.1, R12.4); use POSIX file descriptors (`PosixFd`) for one-node sharing"
    )]
    FabricNotPermitted {
        /// The device.
        device: Device,
        /// The call that refused.
        call: Call,
    },
}

impl Error {
    /// Wraps a driver code from `call`.
    pub fn driver(call: Call, code: Code) -> Error {
        Error::Driver { call, code }
    }

    /// A feature the driver or backend lacks; `detail` says what it has
    /// instead (may be empty).
    pub fn unsupported(
        feature: Feature,
        driver_version: Option<i32>,
        detail: impl Into<String>,
    ) -> Error {
        Error::Unsupported {
            feature,
            driver_version,
            detail: detail.into(),
        }
    }

    /// An environment variable with a value this library cannot use.
    pub fn bad_environment(
        variable: &'static str,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Error {
        Error::BadEnvironment {
            variable,
            value: value.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// The driver code, if this came from the driver.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Driver { code, .. } | Error::Context { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The contract rule this error cites, if it cites one.
    pub fn rule(&self) -> Option<Rule> {
        match self {
            Error::Misaligned { rule, .. }
            | Error::OutOfRange { rule, .. }
            | Error::WrongDevice { rule, .. } => Some(*rule),
            Error::ZeroSize { rule, .. } => *rule,
            Error::Unsupported { feature, .. } | Error::FeatureMissing { feature, .. } => {
                Some(feature.rule())
            }
            Error::SizeTooLarge { .. } => Some(Rule::R2_3),
            Error::MemoryOnWrongDevice { .. } => Some(Rule::R5_5),
            Error::AlreadyEnrolled { .. } | Error::TeamFull { .. } => Some(Rule::R4_2),
            Error::EmptyTeam => Some(Rule::R2_2),
            Error::Overlap { .. } | Error::OverlapUnwound { .. } => Some(Rule::R5_9),
            Error::CopyOutOfRange { .. } => Some(Rule::F9),
            Error::CopyNotBound { .. }
            | Error::CopyPeerNotBound { .. }
            | Error::CopyNoWindow { .. }
            | Error::PosixFdWithoutFds { .. } => Some(Rule::F9),
            Error::CopyNotAgreed { .. } => Some(Rule::R13_3),
            Error::CloseNotAgreed { .. } => Some(Rule::R13_7),
            Error::CopyNotLocal { .. } | Error::CopyNotAccessible { .. } => Some(Rule::F2),
            Error::UnbindUnderGraph { .. } => Some(Rule::F8),
            Error::CopyDependent { .. } => Some(Rule::F3),
            Error::CopyUnbindReentered { .. } => Some(Rule::F4),
            Error::Timeout { .. } => Some(Rule::R3),
            Error::BadHandle { .. } => Some(Rule::R9_4),
            Error::FabricNotPermitted { .. } => Some(Rule::R9_1),
            _ => None,
        }
    }

    /// Whether this driver, backend or device cannot do this at all, so that
    /// the caller should take another path (another backend, no
    /// `.counted_ops()`, ...): [`Error::Unsupported`],
    /// [`Error::FeatureMissing`], or the driver's own `NOT_SUPPORTED`.
    /// Not [`Error::NoDriver`]: there is no driver to ask.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Error::Unsupported { .. } | Error::FeatureMissing { .. } => true,
            Error::Driver { code, .. } => code.raw() == raw::NOT_SUPPORTED,
            _ => false,
        }
    }

    /// Whether retrying the same call later, unchanged, can succeed: the
    /// fabric software is not ready yet (`SYSTEM_NOT_READY`, R5.10;
    /// `FABRIC_NOT_READY`, "retry after a delay"), or a [`Error::Timeout`]
    /// (wait longer). Exhausted resources are
    /// [`Error::is_resource_exhausted`] instead: retrying helps only after
    /// something is freed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Driver { code, .. } => code_is_retryable(*code),
            Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Whether memory or fabric resources ran out (`OUT_OF_MEMORY`, which
    /// on a multicast create or bind can mean no multicast groups are left,
    /// R5.10; `MULTICAST_RESOURCE_FULL`), or this process's own memory
    /// ([`Error::CopyHostBufferUnavailable`]): free endpoints, bindings or
    /// memory, then retry (or ask for less).
    pub fn is_resource_exhausted(&self) -> bool {
        match self {
            Error::Driver { code, .. } => code_is_resource_exhausted(*code),
            Error::CopyHostBufferUnavailable { .. } => true,
            _ => false,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

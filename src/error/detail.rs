//! The details the crate's errors carry, so that callers match on values,
//! not strings: [`Rule`], [`Role`], [`Arg`], [`Alignment`], [`Extent`],
//! [`Answer`] and [`Feature`] (public at [`crate::error`]).

use std::fmt;

use crate::driver::Device;

macro_rules! rules {
    ($($v:ident = $name:literal: $statement:literal;)*) => {
        /// A rule of the driver contract, as the crate's errors cite it
        /// (the contract is restated in [`crate::guide::contract`]).
        /// `Display` prints its number (`R5.3`); [`Rule::statement`] says it in
        /// one line.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Rule {
            $(#[doc = concat!("**", $name, "**: ", $statement, ".")] $v,)*
        }

        impl Rule {
            /// Every rule, in the contract's order.
            pub const ALL: &'static [Rule] = &[$(Rule::$v,)*];

            /// The rule's number, e.g. `"R5.3"`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Rule::$v => $name,)*
                }
            }

            /// The rule in one line.
            pub fn statement(self) -> &'static str {
                match self {
                    $(Rule::$v => $statement,)*
                }
            }

            /// The rule numbered `name` (`"R5.3"`), if there is one.
            pub fn from_name(name: &str) -> Option<Rule> {
                match name {
                    $($name => Some(Rule::$v),)*
                    _ => None,
                }
            }
        }
    };
}

rules! {
    R1 = "R1": "ids are reserved as a contiguous range `[base, base+count)` and released as one";
    R1_1 = "R1.1": "every id in a released range must be reserved by this process";
    R1_2 = "R1.2": "no id in a released range may still hold an endpoint";
    R1_3 = "R1.3": "an id count of zero is refused";
    R2 = "R2": "an endpoint is created on a reserved id from its properties";
    R2_1 = "R2.1": "create needs a reserved id that holds no endpoint";
    R2_2 = "R2.2": "a unicast endpoint has one owner device; a multicast team has at least one device";
    R2_3 = "R2.3": "the size per device is a non-zero multiple of the bind alignment and at most the driver's maxSize";
    R2_4 = "R2.4": "IPC handle types are FABRIC only; flags are COUNTED_OPS only, which needs attribute 155";
    R2_5 = "R2.5": "a successful create returns before the endpoint is usable";
    R3 = "R3": "a query, which never blocks, reports whether construction finished";
    R3_1 = "R3.1": "a query must report the endpoint constructed before any bind";
    R3_2 = "R3.2": "a multicast endpoint finishes construction only once every team device is added";
    R3_3 = "R3.3": "unicast endpoints need the query as well";
    R3_4 = "R3.4": "using an id before it is constructed is undefined behaviour in the driver";
    R3_5 = "R3.5": "one query can cover a whole range of ids";
    R4 = "R4": "each team device is added to a multicast endpoint";
    R4_1 = "R4.1": "devices are added only to multicast endpoints";
    R4_2 = "R4.2": "each device joins at most once, and at most the team size in all";
    R4_3 = "R4.3": "a device stays enrolled for the endpoint's life";
    R4_4 = "R4.4": "every device is added before memory is bound on any of them";
    R4_5 = "R4.5": "(13.4+) a device outside the clique of the devices already added is refused";
    R5 = "R5": "memory is bound to a ready endpoint by allocation handle or by mapped address";
    R5_1 = "R5.1": "bind only after a query reported the endpoint constructed";
    R5_2 = "R5.2": "bind on the owner device (unicast) or an enrolled team device (multicast)";
    R5_3 = "R5.3": "offsets, sizes and addresses of a bind are multiples of the bind alignment";
    R5_4 = "R5.4": "a bind fits in its allocation and in the endpoint's size";
    R5_5 = "R5.5": "device memory lives on the device bound, host memory on its host NUMA node";
    R5_6 = "R5.6": "exportable and imported multicast endpoints accept only externally shareable memory";
    R5_7 = "R5.7": "an imported unicast endpoint accepts no memory";
    R5_8 = "R5.8": "bind flags must be zero";
    R5_9 = "R5.9": "two binds on one device may not overlap in the endpoint range";
    R5_10 = "R5.10": "a bind refused for memory, fabric readiness or misconfiguration did not happen; the endpoint stays usable";
    R6 = "R6": "an unbind names a device, an offset and a size";
    R6_1 = "R6.1": "the offset is the start of an earlier bind on that device";
    R6_2 = "R6.2": "the size covers whole binds that follow each other";
    R6_3 = "R6.3": "unbind offsets and sizes are multiples of the bind alignment";
    R7 = "R7": "destroy detaches the endpoint, unbinds what this process bound and drops its reference";
    R7_1 = "R7.1": "after destroy the id is still reserved: release it";
    R7_2 = "R7.2": "memory bound through an endpoint must outlive the binding";
    R8 = "R8": "an endpoint is exported as a 64-byte fabric handle";
    R8_1 = "R8.1": "only endpoints created with FABRIC IPC handles can be exported";
    R9 = "R9": "an exported endpoint is attached to a reserved, free id of this process";
    R9_1 = "R9.1": "an import may be refused for lack of access rights or support";
    R9_2 = "R9.2": "an imported endpoint is pending until a query reports it ready";
    R9_3 = "R9.3": "imported endpoints bind only what R5.6 and R5.7 allow";
    R9_4 = "R9.4": "bytes that are not a handle this driver issued are refused";
    R10 = "R10": "the bind alignment and maxSize depend on the properties";
    R11 = "R11": "every call can fail with initialisation, permission, support or memory errors";
    R12 = "R12": "driver state belongs to processes";
    R12_1 = "R12.1": "ids, endpoints, bindings and allocations belong to the process that made them";
    R12_2 = "R12.2": "a process that exits or is killed drops everything it held";
    R12_3 = "R12.3": "an endpoint lives until its last reference is gone; the creator keeps its reference until every rank imported";
    R12_4 = "R12.4": "fabric handles reach across one fabric; POSIX file descriptors stay within a node";
    R12_5 = "R12.5": "a device already enrolled elsewhere, or one past the team size over all processes, is the driver's refusal";
    C1 = "C1": "a classic multicast object is created synchronously from team size and size";
    C2 = "C2": "the multicast granularity plays the role of the bind alignment";
    C3 = "C3": "a classic bind before every device is added blocks until they are";
    C4 = "C4": "a classic unbind that does not match its bind is undefined behaviour";
    C5 = "C5": "a classic object is released with cuMemRelease and shared as a POSIX fd or fabric handle";
    C6 = "C6": "classic multicast needs MULTICAST_SUPPORTED on every team device";
    R13_1 = "R13.1": "a query must report the endpoint ready before any bind, unbind or fabric operation on it";
    R13_3 = "R13.3": "after binding, every participant waits until the peers bound before any fabric operation";
    R13_7 = "R13.7": "every rank stops issuing operations and synchronizes its streams before any rank unbinds";
    F1 = "F1": "a fabric copy goes pointer to pointer, pointer to a unicast or multicast endpoint, or a unicast endpoint to a pointer";
    F2 = "F2": "the pointer of a fabric copy that involves an endpoint is local: on the stream's device or host memory; every operand is accessible from the stream's device";
    F3 = "F3": "the copies of one batch are independent: no destination overlaps another copy's source or destination";
    F4 = "F4": "no operand is freed, unbound or its endpoint destroyed before the copy completed";
    F5 = "F5": "the flags of a fabric copy are 0; a size of 0 is a validated no-op";
    F6 = "F6": "a fabric copy never goes on the legacy NULL stream";
    F7 = "F7": "cuFabricCpyBatchAsync exists from CUDA 13.5 on, where logical endpoints are supported";
    F8 = "F8": "a graph of copies needs every id it names valid and bound for as long as the graph may run";
    F9 = "F9": "an endpoint range of a fabric copy is covered by memory bound on every target device";
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The part a device must play for a call (SPEC R5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// The owner device of a unicast endpoint.
    Owner,
    /// A device enrolled in a multicast team.
    TeamDevice,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Owner => "the owner device",
            Role::TeamDevice => "a team device",
        })
    }
}

/// The argument a size, offset or count error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Arg {
    /// The number of ids to reserve (R1.3).
    IdCount,
    /// An endpoint's size per device, `prop.size` (R2.3).
    EndpointSize,
    /// Where a bind starts in the endpoint range (R5.3).
    BindOffset,
    /// How many bytes a bind covers (R5.3).
    BindSize,
    /// Where a bind starts in its allocation (R5.3).
    MemoryOffset,
    /// The device address a bind by address starts at (R5.3).
    DeviceAddress,
    /// The bytes a VMM allocation asks for.
    AllocationSize,
}

impl Arg {
    /// The unit its values are in: `"ids"` or `"bytes"`.
    pub fn unit(self) -> &'static str {
        match self {
            Arg::IdCount => "ids",
            _ => "bytes",
        }
    }
}

impl Arg {
    /// The unit for `n` of it: `"id"` for one id.
    pub(super) fn unit_for(self, n: u64) -> &'static str {
        match (self, n) {
            (Arg::IdCount, 1) => "id",
            _ => self.unit(),
        }
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arg::IdCount => "id count",
            Arg::EndpointSize => "endpoint size",
            Arg::BindOffset => "bind offset",
            Arg::BindSize => "bind size",
            Arg::MemoryOffset => "memory offset",
            Arg::DeviceAddress => "device address",
            Arg::AllocationSize => "allocation size",
        })
    }
}

/// What an alignment error measures against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Alignment {
    /// `bindAlignment` from `cuLogicalEndpointGetLimits` (R10), or the
    /// multicast granularity on the classic backend (C2).
    BindAlignment,
    /// The VMM allocation granularity (`cuMemGetAllocationGranularity`).
    AllocationGranularity,
}

impl fmt::Display for Alignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Alignment::BindAlignment => "bind alignment",
            Alignment::AllocationGranularity => "allocation granularity",
        })
    }
}

/// The two objects of different [`Context`](crate::Context)s (driver
/// backends) an [`Error::WrongContext`](super::Error::WrongContext) names:
/// the first is of another context than the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ContextPair {
    /// Memory bound into an endpoint, or laid on it as a peer's window
    /// (`Endpoint::bind`, `add_peer_window`).
    MemoryForEndpoint,
    /// An endpoint a copy names, on a stream (`Stream::enqueue`, `Route::put`).
    EndpointOnStream,
    /// Memory a copy reads or writes, on a stream.
    MemoryOnStream,
    /// An event recorded on a stream (`Event::record`).
    EventOnStream,
}

impl ContextPair {
    /// The two objects, in words: the first is of another context.
    pub(crate) fn objects(self) -> (&'static str, &'static str) {
        match self {
            ContextPair::MemoryForEndpoint => ("memory", "endpoint"),
            ContextPair::EndpointOnStream => ("endpoint", "stream"),
            ContextPair::MemoryOnStream => ("memory", "stream"),
            ContextPair::EventOnStream => ("event", "stream"),
        }
    }

    /// What to do instead.
    pub(crate) fn fix(self) -> &'static str {
        match self {
            ContextPair::MemoryForEndpoint => "allocate and map it from the endpoint's context",
            ContextPair::EndpointOnStream => {
                "enqueue on a stream made from the endpoint's context (`Stream::new(&ctx, device)`)"
            }
            ContextPair::MemoryOnStream => {
                "allocate and map it from the stream's context, or enqueue on a stream of the memory's"
            }
            ContextPair::EventOnStream => "record it on a stream of the event's context",
        }
    }
}

/// What a target in another process bound on an endpoint, as far as a
/// copy on the portable path here reaches it: `device` of rank `rank` (as
/// a bring-up or [`Endpoint::add_peer_window`](crate::Endpoint::add_peer_window)
/// named them) and the endpoint bytes its windows here cover.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerBound {
    /// The rank.
    pub rank: u32,
    /// Its device.
    pub device: Device,
    /// The endpoint bytes `[start, end)` its windows here cover, in order.
    pub covered: Vec<(u64, u64)>,
}

/// The bytes one op of a copy batch names on one side, as it names them
/// ([`Error::CopyDependent`](super::Error::CopyDependent)): `[start, end)`
/// of an endpoint, or of device (or mapped host) addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyBytes {
    /// The endpoint id whose bytes these are; `None`: addresses.
    pub endpoint: Option<u32>,
    /// The first byte.
    pub start: u64,
    /// Past the last byte.
    pub end: u64,
}

impl CopyBytes {
    /// Whether the two name some byte in common as they are named (both of
    /// one endpoint, or both addresses); two that meet only through memory
    /// bound to an endpoint do not.
    pub fn meets(&self, other: &CopyBytes) -> bool {
        self.endpoint == other.endpoint && self.start < other.end && other.start < self.end
    }
}

impl fmt::Display for CopyBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.endpoint {
            Some(id) => write!(f, "endpoint {id} bytes {}..{}", self.start, self.end),
            None => write!(f, "addresses {:#x}..{:#x}", self.start, self.end),
        }
    }
}

/// What a range error overflowed (R5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Extent {
    /// The endpoint's size per device (`offset + size <= prop.size`).
    EndpointRange,
    /// The allocation bound (`memOffset + size <=` its size), or the
    /// mapped memory a copy reads or writes.
    Allocation,
    /// A host buffer of a copy.
    HostBuffer,
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Extent::EndpointRange => "endpoint range",
            Extent::Allocation => "allocation",
            Extent::HostBuffer => "host buffer",
        })
    }
}

/// A value a driver returned, as named in [`Error::BadAnswer`](super::Error::BadAnswer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Answer {
    /// The first id of a reservation (`cuLogicalEndpointIdReserve`): the
    /// range `[base, base + count)` must fit in a `u32` id (R1).
    IdBase,
    /// The start of a reserved address range (`cuMemAddressReserve`): a
    /// mapped allocation's bytes must not run past the end of the address
    /// space.
    MappedAddress,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::IdBase => "the first id of the range, whose last id runs past u32::MAX",
            Answer::MappedAddress => {
                "the start of a mapping, whose bytes run past the end of the address space"
            }
        })
    }
}

/// A capability that a driver, a backend or a device lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Logical endpoints (`cuLogicalEndpoint*`), on a driver before 13.3.
    LogicalEndpoints,
    /// What a unicast endpoint on the classic fallback cannot have: it is
    /// process-local bookkeeping for the portable path, with no driver
    /// object (C1), so no counted operations (`COUNTED_OPS`).
    UnicastOnClassic,
    /// Exporting or importing an endpoint on the classic multicast backend.
    FabricOnClassic,
    /// Counted operations (`COUNTED_OPS`) on the classic multicast backend.
    CountedOpsOnClassic,
    /// A team device without `MULTICAST_SUPPORTED` (attribute 132) on the
    /// classic multicast backend (C6).
    ClassicMulticastDevice,
    /// A multicast team on these devices, by either backend.
    MulticastTeam,
    /// The base driver entry points this library needs (`cuCtx*`,
    /// `cuDevice*`): a driver older than CUDA 12.
    BaseDriver,
    /// Counted operations (`COUNTED_OPS`, attribute 155) on a device (R2.4).
    CountedOps,
    /// Multicast logical endpoints on a device (attribute 154, R4).
    MulticastEndpoints,
    /// An exportable endpoint (`ipcHandleTypes` FABRIC) on a device whose
    /// attribute 158 (`LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES`, 13.5+)
    /// lacks FABRIC (R2.4, R8).
    FabricHandles,
    /// A multicast virtual address (`multimem` access to a classic
    /// multicast object) on a backend that has none.
    MulticastAddress,
    /// The fabric copy (`cuFabricCpyBatchAsync`): absent before CUDA 13.5,
    /// `NOT_SUPPORTED` where logical endpoints are unsupported (F7).
    FabricCopy,
}

impl Feature {
    /// The contract rule behind it.
    pub fn rule(self) -> Rule {
        match self {
            Feature::LogicalEndpoints | Feature::BaseDriver => Rule::R11,
            Feature::UnicastOnClassic | Feature::CountedOpsOnClassic => Rule::C1,
            Feature::FabricOnClassic | Feature::MulticastAddress => Rule::C5,
            Feature::ClassicMulticastDevice | Feature::MulticastTeam => Rule::C6,
            Feature::CountedOps | Feature::FabricHandles => Rule::R2_4,
            Feature::MulticastEndpoints => Rule::R4,
            Feature::FabricCopy => Rule::F7,
        }
    }

    /// What to do instead, in one line.
    pub fn fix(self) -> &'static str {
        match self {
            Feature::LogicalEndpoints => {
                "install a CUDA 13.3+ driver, or build the context with `Context::auto`: on older drivers its classic emulation gives unicast endpoints and copies"
            }
            Feature::UnicastOnClassic => {
                "drop `.counted_ops()`: a classic unicast endpoint is bookkeeping for the portable path; or use logical endpoints (a CUDA 13.3+ driver)"
            }
            Feature::FabricOnClassic => {
                "share a classic team with `team::multicast` (a POSIX descriptor within a node, fabric bytes across nodes), or use logical endpoints (a CUDA 13.3+ driver)"
            }
            Feature::CountedOpsOnClassic => {
                "drop `.counted_ops()`, or use logical endpoints (a CUDA 13.3+ driver)"
            }
            Feature::ClassicMulticastDevice => {
                "build the team from devices that report MULTICAST_SUPPORTED = 1, or use logical endpoints (a CUDA 13.3+ driver)"
            }
            Feature::MulticastTeam => {
                "use a CUDA 13.3+ driver, or opt in to the classic fallback on devices with MULTICAST_SUPPORTED = 1"
            }
            Feature::BaseDriver => "install a CUDA 12+ driver",
            Feature::CountedOps => "drop `.counted_ops()` from the spec",
            Feature::FabricHandles => {
                "drop `.exportable()` from the spec, or use devices whose attribute 158 includes FABRIC (1)"
            }
            Feature::MulticastEndpoints => {
                "build the team from devices that report attribute 154 = 1"
            }
            Feature::FabricCopy => {
                "take the portable path, `ctx.set_copy_path(CopyPath::Portable)` (cuMemcpyAsync through the endpoints' mapped memory; what `Context::copy_path` picks by itself on a driver before 13.5), or install a CUDA 13.5+ driver"
            }
            Feature::MulticastAddress => {
                "kernels reach a logical endpoint by its id (`kernel_ref`); a multicast address exists for classic multicast objects only (the classic fallback)"
            }
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::LogicalEndpoints => "logical endpoints (cuLogicalEndpoint*, driver 13.3+)",
            Feature::UnicastOnClassic => {
                "counted operations on a classic unicast endpoint (bookkeeping, no driver object)"
            }
            Feature::FabricOnClassic => "fabric export and import on the classic multicast backend",
            Feature::MulticastAddress => "a multicast virtual address (multimem mapping)",
            Feature::CountedOpsOnClassic => {
                "counted operations (COUNTED_OPS) on the classic multicast backend"
            }
            Feature::ClassicMulticastDevice => {
                "classic multicast on a device without MULTICAST_SUPPORTED (attribute 132)"
            }
            Feature::MulticastTeam => "multicast teams on these devices",
            Feature::BaseDriver => "the base driver entry points (cuCtx*, cuDevice*)",
            Feature::CountedOps => "counted operations (COUNTED_OPS)",
            Feature::MulticastEndpoints => "multicast logical endpoints",
            Feature::FabricHandles => "fabric export of logical endpoints (ipcHandleTypes FABRIC)",
            Feature::FabricCopy => "the fabric copy (cuFabricCpyBatchAsync, CUDA 13.5+)",
        })
    }
}

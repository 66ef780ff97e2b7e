//! The crate's error type [`Error`], with [`Failed`] and [`Result`] (all
//! three public at the crate root only, re-exported in [`crate::error`] for
//! the crate's own paths), and the details its variants carry.
//!
//! Every message names the value, the rule and the fix; none formats through
//! the driver.

use std::fmt;
use std::time::Duration;

use crate::driver::{Call, Code, Device, Location};

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
    fn unit_for(self, n: u64) -> &'static str {
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

/// A value a driver returned, as named in [`Error::BadAnswer`].
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
                "install a CUDA 13.3+ driver; for multicast teams, the classic fallback (`Context::auto`) works on older drivers"
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
                "use a CUDA 13.3+ driver, or devices that report MULTICAST_SUPPORTED = 1 with the classic fallback switched on"
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
        "{what} = {value} bytes is not a multiple of the {alignment_kind} ({alignment} bytes) ({rule}); use {suggested} bytes"
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
        /// The nearest valid value (rounded up where that is valid), in bytes.
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
    #[error("{device} is not {role} of this endpoint ({rule}); bind on one of {allowed:?}")]
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

    /// An op of a copy batch reaches past the endpoint, or past the local
    /// memory or host buffer it reads or writes (F9).
    #[error(
        "copy op {op}: {what}: offset {offset} + size {size} bytes exceeds {limit} bytes (F9); shrink the copy or move it inside"
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
        "copy op {op}: endpoint {id} bytes {offset}..{end} are not bound on {device} (F9, R13.3); bind memory there first (and, across processes, wait until every rank bound)",
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
    #[error(
        "copy ops {op} and {other} of one batch overlap: op {op} writes bytes that op {other} reads or writes, and the copies of a batch run in no order (F3); put them in two batches, one after the other"
    )]
    CopyDependent {
        /// The op that writes.
        op: usize,
        /// The op it overlaps.
        other: usize,
    },

    /// On the portable path ([`crate::CopyPath::Portable`]): an op whose
    /// local memory is the memory that its endpoint bytes reach (bound
    /// there by address, or a peer window onto it), so that it would copy
    /// bytes onto themselves: `cuMemcpyAsync` forbids overlapping source
    /// and destination ranges.
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
        "copy op {op} on the portable path (cuMemcpyAsync): endpoint {id} bytes {offset}..{end} are reachable here on {known} of its {targets} targets (F9); bind `Mapped` memory there in this process (a bind by `Allocation` handle has no address here), and for each target in another process: after a bring-up, bind `Mapped<FabricShareable>` memory on every rank before `agree_bound` or `OwnedPeers::grow` (or `PosixFd` memory and `agree_bound_fds` or `grow_fds`, one node), which registers the peers' memory; otherwise import it (`import_fd` within a node, `import_fabric` across), map it and register it with `Endpoint::add_peer_window`",
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

    /// Memory from another [`crate::Context`] than the endpoint's.
    #[error(
        "the memory belongs to another context (driver backend) than the endpoint; allocate it from the endpoint's context"
    )]
    WrongContext,

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

fn device_suffix(d: Option<crate::Device>) -> String {
    d.map(|d| format!(" for {d}")).unwrap_or_default()
}

fn numa_suffix(n: Option<i32>) -> String {
    n.map(|n| format!(" or on its host NUMA node {n}"))
        .unwrap_or_default()
}

fn not_local_words(location: Location, stream: Device, fabric_import: bool) -> String {
    if fabric_import {
        format!(
            "the local memory was imported by fabric handle, so it is on {} of the node that exported it, which may be another node (an ordinal names a device of its own node), not on this node's {stream} (F2: the pointer of a copy through an endpoint is on the stream's device or host memory); copy from memory allocated in this process, or imported with `import_fd` from a process of this node, and reach the exporter's memory through an endpoint bound to it",
            location_words(location)
        )
    } else {
        format!(
            "the local memory is at {location:?}, but the stream is on {stream} (F2); copy on a stream of that device, or from memory on {stream} or host memory"
        )
    }
}

fn peer_window_words(rank: u32, device: Device, targets: u32, here: u32, peers: u32) -> String {
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

fn devices_words(devices: &[Device]) -> String {
    match devices {
        [] => "no device".into(),
        _ => devices
            .iter()
            .map(Device::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn location_words(l: Location) -> String {
    match l {
        Location::Device(d) => d.to_string(),
        Location::HostNuma(n) => format!("host NUMA node {n}"),
    }
}

fn version_suffix(v: Option<i32>) -> String {
    match v {
        Some(v) => format!(
            " (driver reports CUDA {}.{}, {v})",
            v / 1000,
            (v % 1000) / 10
        ),
        None => String::new(),
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn rule_suffix(rule: Option<Rule>) -> String {
    rule.map(|r| format!(" ({r})")).unwrap_or_default()
}

/// Raw `CUresult` numbers the predicates and hints read. Kept as numbers so
/// that they do not depend on how [`Code`] names them.
// TODO(boundary): delegate to `Code::is_retryable` /
// `Code::is_resource_exhausted` once `Code` has them.
mod raw {
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
fn code_is_retryable(code: Code) -> bool {
    matches!(code.raw(), raw::SYSTEM_NOT_READY | raw::FABRIC_NOT_READY)
}

/// Memory or fabric resources (multicast groups) ran out: free some, then retry.
fn code_is_resource_exhausted(code: Code) -> bool {
    matches!(
        code.raw(),
        raw::OUT_OF_MEMORY | raw::MULTICAST_RESOURCE_FULL
    )
}

fn hint_suffix(call: Call, code: Code) -> &'static str {
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
            Error::Overlap { .. } => Some(Rule::R5_9),
            Error::CopyOutOfRange { .. } => Some(Rule::F9),
            Error::CopyNotBound { .. } | Error::CopyNoWindow { .. } => Some(Rule::F9),
            Error::CopyNotAgreed { .. } => Some(Rule::R13_3),
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

/// The fix for [`Error::Timeout`], by kind.
fn timeout_fix(multicast: bool) -> &'static str {
    if multicast {
        "wait longer: a multicast team finishes only once every device of every process is enrolled (R3.2)"
    } else {
        "wait longer: construction is asynchronous and the driver has not finished it yet"
    }
}

/// A failed consuming transition: the error, and the value it was called on,
/// unchanged, so nothing leaks and the caller can retry or drop it.
///
/// One pointer ([`Failure`] boxed), so that a transition's
/// `Result<Endpoint<_>, Failed<_>>` is 16 bytes and comes back in two
/// registers: the error is allocated on the error path only. Its fields read
/// as before (`f.error`, `f.value`, moved out with `f.value` or
/// [`Failure::into_parts`]).
///
/// Transparent: `Display` is the [`Error`]'s message and
/// [`std::error::Error::source`] is the error's own source, so `{e}`, a
/// report that walks the chain, and `?` into `Box<dyn Error>` all show the
/// cause's wording once. `Debug` is the error's `Debug` and the type of the
/// value that came back. `?` into [`Error`] keeps only the error (and drops
/// the value).
pub type Failed<T> = Box<Failure<T>>;

/// What a [`Failed`] points to: the error and the value handed back.
pub struct Failure<T> {
    /// What went wrong.
    pub error: Error,
    /// The value handed back, in the state it had before the call.
    pub value: T,
}

impl<T> Failure<T> {
    /// The error and the value, boxed: a [`Failed`].
    #[cold]
    #[inline(never)]
    pub fn new(error: Error, value: T) -> Failed<T> {
        Box::new(Failure { error, value })
    }

    /// Splits into the error and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }
}

/// `T`'s name without module paths: `Endpoint<Reserved, NoKind>`, not
/// `cuda_endpoints::endpoint::Endpoint<cuda_endpoints::state::Reserved, ..>`.
fn short_type_name<T>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(word.rsplit("::").next().unwrap_or(word));
        word.clear();
    };
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Shows a type name without quotes in a `Debug` struct.
struct TypeName(String);

impl fmt::Debug for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Hand-written: no `T: Debug` bound, so `?` works for any endpoint type; the
// value is named by its type.
impl<T> fmt::Debug for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("value", &TypeName(short_type_name::<T>()))
            .finish()
    }
}

impl<T> fmt::Display for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Failure<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<T> From<Failed<T>> for Error {
    fn from(f: Failed<T>) -> Error {
        f.error
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_displays_its_number_and_parses_back() {
        for &r in Rule::ALL {
            assert_eq!(Rule::from_name(&r.to_string()), Some(r));
            assert!(!r.statement().is_empty());
        }
        assert_eq!(Rule::R5_3.to_string(), "R5.3");
        assert_eq!(Rule::R12_5.to_string(), "R12.5");
        assert_eq!(Rule::from_name("R5.11"), None);
    }

    #[test]
    fn failed_shows_its_cause_once_in_a_chain() {
        let f = Failure::new(Error::EmptyTeam, ());
        let cause = Error::EmptyTeam.to_string();
        assert_eq!(f.to_string(), cause);
        let mut chain = vec![f.to_string()];
        let mut s = std::error::Error::source(&f);
        while let Some(e) = s {
            chain.push(e.to_string());
            s = e.source();
        }
        assert_eq!(chain.iter().filter(|m| m.contains(&cause)).count(), 1);
    }

    #[test]
    fn failed_debug_shows_the_error_and_which_value_came_back() {
        let f = Failure::new(Error::EmptyTeam, Device(3));
        let debug = format!("{f:?}");
        assert_eq!(debug, "Failed { error: EmptyTeam, value: Device }");
        let boxed: Box<dyn std::error::Error> = Box::new(f);
        assert_eq!(boxed.to_string(), Error::EmptyTeam.to_string());
        assert!(short_type_name::<Option<Vec<Device>>>() == "Option<Vec<Device>>");
    }

    #[test]
    fn a_bad_environment_variable_names_itself_its_value_and_the_fix() {
        let e = Error::bad_environment(
            "CUDA_ENDPOINTS_DENY",
            "cuMulticastCreat",
            "no such entry point",
            "use cuda.h names",
        );
        let msg = e.to_string();
        for part in [
            "CUDA_ENDPOINTS_DENY",
            "\"cuMulticastCreat\"",
            "no such entry point",
            "use cuda.h names",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        assert!(!e.is_unsupported() && e.rule().is_none());
    }

    #[test]
    fn unsupported_names_the_feature_its_rule_and_the_fix() {
        let e = Error::unsupported(Feature::UnicastOnClassic, Some(13000), "");
        let msg = e.to_string();
        assert!(msg.contains("on a classic unicast endpoint"), "{msg}");
        assert!(msg.contains("13000") && msg.contains("(C1)"), "{msg}");
        assert!(msg.ends_with(Feature::UnicastOnClassic.fix()), "{msg}");
        assert!(e.is_unsupported() && e.rule() == Some(Rule::C1));
        let missing = Error::FeatureMissing {
            device: Device(0),
            feature: Feature::CountedOps,
            attribute: 155,
            value: 0,
        };
        assert!(missing.is_unsupported() && missing.rule() == Some(Rule::R2_4));
    }

    #[test]
    fn predicates_read_the_13_5_codes() {
        let d = |raw| Error::driver(Call::BindMem, Code::from_raw(raw).unwrap());
        assert!(d(802).is_retryable() && d(919).is_retryable());
        assert!(!d(2).is_retryable() && d(2).is_resource_exhausted());
        assert!(d(47).is_resource_exhausted() && !d(47).is_retryable());
        assert!(d(801).is_unsupported() && !d(1).is_unsupported());
        assert!(d(919).to_string().contains("retry after a delay"));
    }
}

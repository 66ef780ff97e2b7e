//! Driver result codes: [`Code`], a `CUresult` number that is not
//! `CUDA_SUCCESS`.
//!
//! A code is read as a plain integer: a newer driver's code is never
//! undefined behaviour, only a number without a name.

use std::fmt;

use crate::{Call, ContextFailure, ContextStep};

/// The result of one driver call.
pub type DriverResult<T> = Result<T, Code>;

/// A non-success `CUresult` returned by a driver call: the raw number, with a
/// name and a hint when the library knows it, and where it arose when that
/// was not the call itself ([`Code::origin`]).
///
/// A backend answers through this value alone: one that emulates a call on
/// other entry points (the classic fallback) says which one failed
/// ([`Code::raised_by`]); one that makes a context current first (the real
/// driver) says when that step failed and the call was never made
/// ([`Code::in_context`]). Codes compare, hash and order by the number only:
/// `Err(Code::INVALID_VALUE)` equals that code wherever it arose; compare
/// with `==` or a match guard (`Err(c) if c == Code::NOT_READY`), since a
/// constant of it is no pattern. Only the number crosses a wire (serde).
#[derive(Clone, Copy)]
pub struct Code(u32);

// The layout, one `u32` so that a `DriverResult` of a scalar is still
// returned in registers (`ci/codegen.sh` holds that): the `CUresult` number
// in bits 0–15 and where it arose in bits 16–30 — the inner entry point
// (index in `Call::ALL` + 1) in 16–21, the context step (+ 1) in 22–23, the
// step's device (+ 1; one of 127 or more is not named) in 24–30. A number
// above 0xffff (none in `cuda.h`, whose largest is 999) sets bit 31 and
// keeps its 31 bits, with no origin.
const NUMBER: u32 = 0xffff;
const LARGE: u32 = 1 << 31;
// Every entry point of the table has a 6-bit index.
const _: () = assert!(Call::ALL.len() < 1 << 6);

/// Where a [`Code`] arose ([`Code::origin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodeOrigin {
    /// The call itself answered the code.
    Call,
    /// A backend that emulates the call made another entry point, which
    /// answered the code (the classic fallback's `cuMulticast*` or VMM call).
    Inner(Call),
    /// The context step before the call failed; the call was never made.
    Context(ContextFailure),
}

impl PartialEq for Code {
    fn eq(&self, other: &Code) -> bool {
        self.raw() == other.raw()
    }
}

impl Eq for Code {}

impl std::hash::Hash for Code {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.raw().hash(state);
    }
}

impl PartialOrd for Code {
    fn partial_cmp(&self, other: &Code) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Code {
    fn cmp(&self, other: &Code) -> std::cmp::Ordering {
        self.raw().cmp(&other.raw())
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw().serialize(s)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Code {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Code, D::Error> {
        u32::deserialize(d).map(Code::number)
    }
}

macro_rules! codes {
    ($($konst:ident = $num:literal, $name:literal, $hint:literal $(, since $since:literal)?;)*) => {
        /// Every named code: `cuda.h` name, number, first `CUDA_VERSION`
        /// whose header has it (for the ABI check).
        #[allow(dead_code)]
        #[doc(hidden)]
        pub const KNOWN: &[(&str, u32, u32)] = &[$(($name, $num, 0 $(+ $since)?),)*];

        impl Code {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($num), "): ", $hint)]
                pub const $konst: Code = Code($num);
            )*

            /// The `cuda.h` name, e.g. `CUDA_ERROR_INVALID_VALUE`; `None` for a
            /// number this library does not know.
            pub fn known_name(self) -> Option<&'static str> {
                match self.raw() {
                    $($num => Some($name),)*
                    _ => None,
                }
            }

            /// What the code means, in one line; `None` for an unknown number.
            pub fn hint(self) -> Option<&'static str> {
                match self.raw() {
                    $($num => Some($hint),)*
                    _ => None,
                }
            }
        }
    };
}

// Every CUresult of the CUDA 13.5 `cuda.h`, names as there, hints in our words.
codes! {
    INVALID_VALUE = 1, "CUDA_ERROR_INVALID_VALUE", "an argument is out of range or breaks a rule of the call";
    OUT_OF_MEMORY = 2, "CUDA_ERROR_OUT_OF_MEMORY", "the driver could not allocate the memory or resource the call needs";
    NOT_INITIALIZED = 3, "CUDA_ERROR_NOT_INITIALIZED", "cuInit has not run (or failed) in this process";
    DEINITIALIZED = 4, "CUDA_ERROR_DEINITIALIZED", "the driver is shutting down in this process";
    PROFILER_DISABLED = 5, "CUDA_ERROR_PROFILER_DISABLED", "the profiler is disabled for this run (e.g. by a tool)";
    PROFILER_NOT_INITIALIZED = 6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "deprecated profiler state code";
    PROFILER_ALREADY_STARTED = 7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "deprecated profiler state code";
    PROFILER_ALREADY_STOPPED = 8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "deprecated profiler state code";
    STUB_LIBRARY = 34, "CUDA_ERROR_STUB_LIBRARY", "the loaded libcuda is the toolkit's stub, not a real driver";
    CALL_REQUIRES_NEWER_DRIVER = 36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "this call needs a newer driver than the one installed";
    DEVICE_UNAVAILABLE = 46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "the device is busy or unavailable (e.g. exclusive compute mode)";
    MULTICAST_RESOURCE_FULL = 47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL", "no multicast resources are left on the fabric; free some and retry", since 13040;
    NO_DEVICE = 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device was found";
    INVALID_DEVICE = 101, "CUDA_ERROR_INVALID_DEVICE", "the device ordinal is not a valid device, or not one the call accepts";
    DEVICE_NOT_LICENSED = 102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "the device lacks a licence for this feature";
    INVALID_IMAGE = 200, "CUDA_ERROR_INVALID_IMAGE", "the kernel image is not valid";
    INVALID_CONTEXT = 201, "CUDA_ERROR_INVALID_CONTEXT", "no valid context is current for this call";
    CONTEXT_ALREADY_CURRENT = 202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "deprecated: the context was already current";
    MAP_FAILED = 205, "CUDA_ERROR_MAP_FAILED", "a map or register operation failed";
    UNMAP_FAILED = 206, "CUDA_ERROR_UNMAP_FAILED", "an unmap or unregister operation failed";
    ARRAY_IS_MAPPED = 207, "CUDA_ERROR_ARRAY_IS_MAPPED", "the array is mapped and cannot be destroyed";
    ALREADY_MAPPED = 208, "CUDA_ERROR_ALREADY_MAPPED", "the resource is already mapped";
    NO_BINARY_FOR_GPU = 209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image fits this device";
    ALREADY_ACQUIRED = 210, "CUDA_ERROR_ALREADY_ACQUIRED", "the resource was already acquired";
    NOT_MAPPED = 211, "CUDA_ERROR_NOT_MAPPED", "the resource is not mapped";
    NOT_MAPPED_AS_ARRAY = 212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "the mapped resource is not an array";
    NOT_MAPPED_AS_POINTER = 213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "the mapped resource is not a pointer";
    ECC_UNCORRECTABLE = 214, "CUDA_ERROR_ECC_UNCORRECTABLE", "an uncorrectable ECC error was detected";
    UNSUPPORTED_LIMIT = 215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "the context limit is not supported by this device";
    CONTEXT_ALREADY_IN_USE = 216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "the context is already in use by another thread";
    PEER_ACCESS_UNSUPPORTED = 217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access between these devices is not supported";
    INVALID_PTX = 218, "CUDA_ERROR_INVALID_PTX", "the PTX could not be compiled";
    INVALID_GRAPHICS_CONTEXT = 219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "the graphics interop context is invalid";
    NVLINK_UNCORRECTABLE = 220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "an uncorrectable NVLink error was detected";
    JIT_COMPILER_NOT_FOUND = 221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "the PTX JIT compiler library is missing";
    UNSUPPORTED_PTX_VERSION = 222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the PTX was made by a newer toolchain than the driver supports";
    JIT_COMPILATION_DISABLED = 223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation is disabled";
    UNSUPPORTED_EXEC_AFFINITY = 224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the execution affinity type is not supported";
    UNSUPPORTED_DEVSIDE_SYNC = 225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "the code uses device-side synchronization this device lacks";
    CONTAINED = 226, "CUDA_ERROR_CONTAINED", "an error was contained on the device; the context must be torn down";
    INSUFFICIENT_LOADER_VERSION = 227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION", "the CUDA loader is older than this driver needs; update it", since 13040;
    INVALID_SOURCE = 300, "CUDA_ERROR_INVALID_SOURCE", "the kernel source or image is invalid";
    FILE_NOT_FOUND = 301, "CUDA_ERROR_FILE_NOT_FOUND", "a file named in the call was not found";
    SHARED_OBJECT_SYMBOL_NOT_FOUND = 302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "a symbol could not be resolved in a shared object";
    SHARED_OBJECT_INIT_FAILED = 303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "a shared object failed to initialise";
    OPERATING_SYSTEM = 304, "CUDA_ERROR_OPERATING_SYSTEM", "an operating-system call failed";
    INVALID_HANDLE = 400, "CUDA_ERROR_INVALID_HANDLE", "a handle passed to the call is not valid (or of the wrong kind)";
    ILLEGAL_STATE = 401, "CUDA_ERROR_ILLEGAL_STATE", "the resource is not in a state the call accepts (or the system is misconfigured)";
    LOSSY_QUERY = 402, "CUDA_ERROR_LOSSY_QUERY", "the answer would lose information; ask with a larger or different query";
    NOT_FOUND = 500, "CUDA_ERROR_NOT_FOUND", "the named symbol, clique or object does not exist";
    NOT_READY = 600, "CUDA_ERROR_NOT_READY", "the operation has not completed yet; ask again later";
    ILLEGAL_ADDRESS = 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "a kernel accessed an illegal address; the context is unusable";
    LAUNCH_OUT_OF_RESOURCES = 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "the launch needs more resources than the device has";
    LAUNCH_TIMEOUT = 702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the kernel ran past the watchdog time limit";
    LAUNCH_INCOMPATIBLE_TEXTURING = 703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "the launch uses an incompatible texturing mode";
    PEER_ACCESS_ALREADY_ENABLED = 704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access was already enabled";
    PEER_ACCESS_NOT_ENABLED = 705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access was never enabled";
    PRIMARY_CONTEXT_ACTIVE = 708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "the primary context is already active";
    CONTEXT_IS_DESTROYED = 709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "the current context was destroyed";
    ASSERT = 710, "CUDA_ERROR_ASSERT", "a device-side assert fired; the context is unusable";
    TOO_MANY_PEERS = 711, "CUDA_ERROR_TOO_MANY_PEERS", "no more peer mappings are possible";
    HOST_MEMORY_ALREADY_REGISTERED = 712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "the host memory range is already registered";
    HOST_MEMORY_NOT_REGISTERED = 713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "the host memory range was never registered";
    HARDWARE_STACK_ERROR = 714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "a kernel hit a device stack error; the context is unusable";
    ILLEGAL_INSTRUCTION = 715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "a kernel executed an illegal instruction; the context is unusable";
    MISALIGNED_ADDRESS = 716, "CUDA_ERROR_MISALIGNED_ADDRESS", "a kernel used a misaligned address; the context is unusable";
    INVALID_ADDRESS_SPACE = 717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "a kernel used an address in the wrong space; the context is unusable";
    INVALID_PC = 718, "CUDA_ERROR_INVALID_PC", "a kernel's program counter went bad; the context is unusable";
    LAUNCH_FAILED = 719, "CUDA_ERROR_LAUNCH_FAILED", "a kernel failed; the context is unusable";
    COOPERATIVE_LAUNCH_TOO_LARGE = 720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "the cooperative launch has more blocks than can run at once";
    TENSOR_MEMORY_LEAK = 721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "a kernel exited without freeing its tensor memory";
    NOT_PERMITTED = 800, "CUDA_ERROR_NOT_PERMITTED", "the operation is not permitted here (e.g. no fabric or IMEX access, or denied by policy)";
    NOT_SUPPORTED = 801, "CUDA_ERROR_NOT_SUPPORTED", "the driver, device or backend does not support this operation";
    SYSTEM_NOT_READY = 802, "CUDA_ERROR_SYSTEM_NOT_READY", "system software (e.g. the fabric manager) is not running yet; retry after a delay";
    SYSTEM_DRIVER_MISMATCH = 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the display driver and the CUDA driver versions differ";
    COMPAT_NOT_SUPPORTED_ON_DEVICE = 804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility is not supported on this device";
    MPS_CONNECTION_FAILED = 805, "CUDA_ERROR_MPS_CONNECTION_FAILED", "the MPS client could not reach the MPS server";
    MPS_RPC_FAILURE = 806, "CUDA_ERROR_MPS_RPC_FAILURE", "a remote call to the MPS server failed";
    MPS_SERVER_NOT_READY = 807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "the MPS server is not ready for clients";
    MPS_MAX_CLIENTS_REACHED = 808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "the MPS server has no room for another client";
    MPS_MAX_CONNECTIONS_REACHED = 809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "the MPS server has no room for another connection";
    MPS_CLIENT_TERMINATED = 810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client was terminated by the server";
    CDP_NOT_SUPPORTED = 811, "CUDA_ERROR_CDP_NOT_SUPPORTED", "dynamic parallelism is not supported here";
    CDP_VERSION_MISMATCH = 812, "CUDA_ERROR_CDP_VERSION_MISMATCH", "the dynamic-parallelism version does not match";
    STREAM_CAPTURE_UNSUPPORTED = 900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "the operation is not allowed while a stream is capturing";
    STREAM_CAPTURE_INVALIDATED = 901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "the stream capture was invalidated by an earlier error";
    STREAM_CAPTURE_MERGE = 902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "two independent captures would be merged";
    STREAM_CAPTURE_UNMATCHED = 903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "the capture was not started in this stream";
    STREAM_CAPTURE_UNJOINED = 904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "a forked capture was not joined back";
    STREAM_CAPTURE_ISOLATION = 905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "a dependency would cross the capture boundary";
    STREAM_CAPTURE_IMPLICIT = 906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "an implicit dependency on the legacy stream is not allowed in capture";
    CAPTURED_EVENT = 907, "CUDA_ERROR_CAPTURED_EVENT", "the event was recorded in a capture and cannot be used this way";
    STREAM_CAPTURE_WRONG_THREAD = 908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "the capture was ended from another thread";
    TIMEOUT = 909, "CUDA_ERROR_TIMEOUT", "the wait timed out";
    GRAPH_EXEC_UPDATE_FAILURE = 910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update breaks an update rule";
    EXTERNAL_DEVICE = 911, "CUDA_ERROR_EXTERNAL_DEVICE", "an external device reported an error";
    INVALID_CLUSTER_SIZE = 912, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "the kernel cluster size is invalid";
    FUNCTION_NOT_LOADED = 913, "CUDA_ERROR_FUNCTION_NOT_LOADED", "the function has not been loaded yet";
    INVALID_RESOURCE_TYPE = 914, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "the resource type is not valid for this call";
    INVALID_RESOURCE_CONFIGURATION = 915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "the resource configuration is not valid";
    KEY_ROTATION = 916, "CUDA_ERROR_KEY_ROTATION", "a key rotation happened; the context is unusable";
    STREAM_DETACHED = 917, "CUDA_ERROR_STREAM_DETACHED", "the stream was detached";
    GRAPH_RECAPTURE_FAILURE = 918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", "re-capturing the graph failed";
    FABRIC_NOT_READY = 919, "CUDA_ERROR_FABRIC_NOT_READY", "the fabric is not ready yet; retry after a delay", since 13040;
    UNKNOWN = 999, "CUDA_ERROR_UNKNOWN", "an error the driver did not classify";
}

impl Code {
    /// Converts a raw `CUresult` number; `None` for `CUDA_SUCCESS` (0).
    pub const fn from_raw(raw: u32) -> Option<Code> {
        if raw == 0 {
            None
        } else {
            Some(Code::number(raw))
        }
    }

    /// The code of a non-zero number, with no origin.
    const fn number(raw: u32) -> Code {
        if raw > NUMBER {
            Code(raw | LARGE)
        } else {
            Code(raw)
        }
    }

    /// This code as answered by `inner`, an entry point a backend made to
    /// emulate the call at hand ([`CodeOrigin::Inner`]).
    pub fn raised_by(self, inner: Call) -> Code {
        if self.0 & LARGE != 0 {
            return self;
        }
        let index = Call::ALL
            .iter()
            .position(|&c| c == inner)
            .and_then(|i| u32::try_from(i + 1).ok())
            .filter(|&i| i < 1 << 6)
            .unwrap_or(0);
        Code(self.0 & NUMBER | index << 16)
    }

    /// This code as answered by the context step before a call, which was
    /// then never made ([`CodeOrigin::Context`]).
    pub fn in_context(self, failure: ContextFailure) -> Code {
        if self.0 & LARGE != 0 {
            return self;
        }
        let step: u32 = match failure.step {
            ContextStep::PrimaryCtxRetain => 1,
            ContextStep::CtxGetCurrent => 2,
            ContextStep::CtxSetCurrent => 3,
        };
        let device = failure
            .device
            .and_then(|d| u32::try_from(d.0).ok())
            .filter(|&d| d < 0x7f)
            .map_or(0, |d| d + 1);
        Code(self.0 & NUMBER | step << 22 | device << 24)
    }

    /// Where this code arose (see [`Code`]).
    pub fn origin(self) -> CodeOrigin {
        if self.0 & LARGE != 0 {
            return CodeOrigin::Call;
        }
        let o = self.0 >> 16;
        let step = match (o >> 6) & 0b11 {
            1 => Some(ContextStep::PrimaryCtxRetain),
            2 => Some(ContextStep::CtxGetCurrent),
            3 => Some(ContextStep::CtxSetCurrent),
            _ => None,
        };
        if let Some(step) = step {
            let device = match o >> 8 {
                0 => None,
                d => i32::try_from(d - 1).ok().map(crate::Device),
            };
            return CodeOrigin::Context(ContextFailure { step, device });
        }
        match usize::try_from(o & 0x3f).unwrap_or(0) {
            0 => CodeOrigin::Call,
            i => Call::ALL
                .get(i - 1)
                .copied()
                .map_or(CodeOrigin::Call, CodeOrigin::Inner),
        }
    }

    /// The raw `CUresult` number.
    pub const fn raw(self) -> u32 {
        if self.0 & LARGE != 0 {
            self.0 & !LARGE
        } else {
            self.0 & NUMBER
        }
    }

    /// The `cuda.h` name, or `"unknown CUresult"`.
    pub fn name(self) -> &'static str {
        self.known_name().unwrap_or("unknown CUresult")
    }

    /// Whether the same call may succeed if retried after a delay: the
    /// driver or the fabric is not ready yet (`SYSTEM_NOT_READY`,
    /// `FABRIC_NOT_READY`, `NOT_READY`, `MPS_SERVER_NOT_READY`).
    pub fn is_retryable(self) -> bool {
        [
            Code::SYSTEM_NOT_READY,
            Code::FABRIC_NOT_READY,
            Code::NOT_READY,
            Code::MPS_SERVER_NOT_READY,
        ]
        .contains(&self)
    }

    /// Whether a resource ran out: device memory, multicast groups or
    /// another finite driver resource (`OUT_OF_MEMORY`,
    /// `MULTICAST_RESOURCE_FULL`...). Freeing something may help.
    pub fn is_resource_exhausted(self) -> bool {
        [
            Code::OUT_OF_MEMORY,
            Code::MULTICAST_RESOURCE_FULL,
            Code::LAUNCH_OUT_OF_RESOURCES,
            Code::TOO_MANY_PEERS,
        ]
        .contains(&self)
    }
}

// Hand-written so that nothing calls into the driver (`cuGetErrorString`).
impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// `CUDA_ERROR_INVALID_VALUE (1)`: the name and the number, always.
/// A driver result code is an error of its own, so that `?` carries it
/// into `Box<dyn std::error::Error>` (a raw call's answer, or the model's
/// `read` and `write`).
impl std::error::Error for Code {}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_numbers_stay_numbers() {
        assert_eq!(Code::from_raw(0), None);
        assert_eq!(Code::from_raw(1), Some(Code::INVALID_VALUE));
        let odd = Code::from_raw(12345).unwrap();
        assert_eq!(odd.raw(), 12345);
        assert_eq!(odd.known_name(), None);
        assert_eq!(format!("{odd}"), "unknown CUresult (12345)");
        assert_eq!(
            format!("{}", Code::NOT_PERMITTED),
            "CUDA_ERROR_NOT_PERMITTED (800)"
        );
    }

    #[test]
    fn codes_new_in_13_5_have_names_and_predicates() {
        assert_eq!(
            Code::MULTICAST_RESOURCE_FULL.name(),
            "CUDA_ERROR_MULTICAST_RESOURCE_FULL"
        );
        assert_eq!(Code::MULTICAST_RESOURCE_FULL.raw(), 47);
        assert_eq!(Code::INSUFFICIENT_LOADER_VERSION.raw(), 227);
        assert_eq!(Code::FABRIC_NOT_READY.raw(), 919);
        assert!(Code::FABRIC_NOT_READY.is_retryable());
        assert!(Code::SYSTEM_NOT_READY.is_retryable());
        assert!(!Code::INVALID_VALUE.is_retryable());
        assert!(Code::MULTICAST_RESOURCE_FULL.is_resource_exhausted());
        assert!(Code::OUT_OF_MEMORY.is_resource_exhausted());
        assert!(!Code::NOT_PERMITTED.is_resource_exhausted());
    }

    #[test]
    fn a_code_says_where_it_arose_and_still_equals_the_plain_code() {
        let inner = Code::INVALID_VALUE.raised_by(Call::MulticastBindMem);
        assert_eq!(inner, Code::INVALID_VALUE);
        assert_eq!(inner.origin(), CodeOrigin::Inner(Call::MulticastBindMem));
        let step = ContextFailure {
            step: ContextStep::CtxSetCurrent,
            device: Some(crate::Device(3)),
        };
        let ctx = Code::OUT_OF_MEMORY.in_context(step);
        assert_eq!(ctx, Code::OUT_OF_MEMORY);
        assert_eq!(ctx.origin(), CodeOrigin::Context(step));
        let none = ContextFailure {
            step: ContextStep::CtxGetCurrent,
            device: None,
        };
        assert_eq!(
            Code::UNKNOWN.in_context(none).origin(),
            CodeOrigin::Context(none)
        );
        assert_eq!(Code::UNKNOWN.origin(), CodeOrigin::Call);
        for &call in Call::ALL {
            assert_eq!(
                Code::UNKNOWN.raised_by(call).origin(),
                CodeOrigin::Inner(call)
            );
        }
        // Small enough to come back in registers.
        assert_eq!(std::mem::size_of::<Code>(), 4);
        // A number past 16 bits stays a number, with no origin.
        let big = Code::from_raw(0x1_0000).unwrap().raised_by(Call::MemMap);
        assert_eq!((big.raw(), big.origin()), (0x1_0000, CodeOrigin::Call));
    }

    #[test]
    fn every_known_code_has_a_hint() {
        for n in 1..1100 {
            let c = Code::number(n);
            assert_eq!(c.known_name().is_some(), c.hint().is_some(), "{n}");
            if let Some(h) = c.hint() {
                assert!(!h.is_empty() && !h.contains('\n'), "{n}");
            }
        }
    }
}

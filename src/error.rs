//! The crate's error type. Every variant names what was wrong, the SPEC rule
//! behind it and what to do; none formats through the driver.

use std::fmt;
use std::time::Duration;

use crate::driver::{Call, Code, Device};

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

    /// The driver (or the backend chosen) cannot do this at all.
    #[error("unsupported: {what}{}. {hint}", version_suffix(*.driver_version))]
    Unsupported {
        /// What is missing, e.g. `cuLogicalEndpointCreate`.
        what: String,
        /// The driver version (`cuDriverGetVersion`), when known.
        driver_version: Option<i32>,
        /// What the machine does support, or what to do instead.
        hint: String,
    },

    /// The driver answered a call with an error code.
    #[error("{call} failed with {code}{}", hint_suffix(*.call, *.code))]
    Driver {
        /// The entry point.
        call: Call,
        /// Its result code.
        code: Code,
    },

    /// A size, offset or address that must be a multiple of the bind
    /// alignment (SPEC R2.3, R5.3, R6.3) or of the allocation granularity.
    #[error(
        "{what} = {value} bytes is not a multiple of the {alignment_name} ({alignment} bytes) ({rule}); use {suggested} bytes"
    )]
    Misaligned {
        /// Which argument.
        what: &'static str,
        /// The value given, in bytes.
        value: u64,
        /// The alignment required, in bytes.
        alignment: u64,
        /// `"bind alignment"` or `"allocation granularity"`.
        alignment_name: &'static str,
        /// The nearest valid value (rounded up), in bytes.
        suggested: u64,
        /// The SPEC rule.
        rule: &'static str,
    },

    /// A zero size where the rule needs a non-zero one.
    #[error("{what} must not be zero ({rule}); the smallest valid value is {suggested} {unit}")]
    ZeroSize {
        /// Which argument.
        what: &'static str,
        /// The smallest valid value, in `unit`.
        suggested: u64,
        /// `"bytes"` or `"ids"`.
        unit: &'static str,
        /// The SPEC rule.
        rule: &'static str,
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

    /// A bind or unbind range that does not fit (SPEC R5.4).
    #[error(
        "{what}: offset {offset} + size {size} bytes exceeds {limit} bytes ({rule}); shrink the size or the offset"
    )]
    OutOfRange {
        /// What overflowed: `"endpoint range"` or `"allocation"`.
        what: &'static str,
        /// Offset, in bytes.
        offset: u64,
        /// Size, in bytes.
        size: u64,
        /// The bytes available, in bytes.
        limit: u64,
        /// The SPEC rule.
        rule: &'static str,
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
        /// `"the owner device"` or `"a team device"`.
        role: &'static str,
        /// The devices that may be used.
        allowed: Vec<Device>,
        /// The SPEC rule.
        rule: &'static str,
    },

    /// Memory that lives elsewhere than the device it is bound for (SPEC R5.5).
    #[error(
        "memory for {device} lives on {location} (R5.5); allocate it on {device}{}",
        numa_suffix(*.host_numa)
    )]
    MemoryOnWrongDevice {
        /// The device bound for.
        device: Device,
        /// Where the memory lives, in words.
        location: String,
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
    #[error("a multicast team needs at least one device (R2.2)")]
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

    /// A device attribute says the feature is missing (SPEC R2.4, C6).
    #[error("{device} does not support {feature} (attribute {attribute} = 0; {rule})")]
    FeatureMissing {
        /// The device.
        device: Device,
        /// In words, e.g. "counted operations".
        feature: &'static str,
        /// The attribute number.
        attribute: i32,
        /// The SPEC rule.
        rule: &'static str,
    },

    /// `wait` ran out of time; the endpoint comes back pending (SPEC R3).
    #[error(
        "endpoint {id} not ready after {waited:?} and {polls} queries (R3); wait longer (a multicast team finishes only once every device of every process is enrolled, R3.2)"
    )]
    Timeout {
        /// The (first) id waited on.
        id: u32,
        /// How long was waited.
        waited: Duration,
        /// How many `cuLogicalEndpointQuery` calls were made.
        polls: u64,
    },

    /// A fabric handle that was not issued by this driver (SPEC R9.4).
    #[error("the bytes are not a fabric handle of a {expected} endpoint ({reason}; R9.4)")]
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
        "this context already holds the endpoint behind this fabric handle (endpoint {id}); use that endpoint: a second attachment in one process shares its bindings with the first, and destroying either would unbind both"
    )]
    AlreadyAttached {
        /// The id that holds it.
        id: u32,
    },

    /// Memory from another [`crate::Context`] than the endpoint's.
    #[error(
        "the memory belongs to another context (driver backend) than the endpoint; allocate it from the endpoint's context"
    )]
    WrongContext,

    /// Fabric handles are refused: no fabric daemon (seen on the H200 test machine).
    #[error(
        "fabric handles are not permitted on {device} ({call}: CUDA_ERROR_NOT_PERMITTED): the fabric manager/IMEX daemon is not running or this process lacks access; use POSIX file descriptors (`PosixFd`) for one-node sharing"
    )]
    FabricNotPermitted {
        /// The device.
        device: Device,
        /// The call that refused.
        call: Call,
    },
}

fn numa_suffix(n: Option<i32>) -> String {
    n.map(|n| format!(" or on its host NUMA node {n}"))
        .unwrap_or_default()
}

fn version_suffix(v: Option<i32>) -> String {
    match v {
        Some(v) => format!(" (driver {}.{}, CUDA {v})", v / 1000, (v % 1000) / 10),
        None => String::new(),
    }
}

fn hint_suffix(call: Call, code: Code) -> &'static str {
    let multicast = matches!(
        call,
        Call::Create | Call::BindMem | Call::BindAddr | Call::MulticastCreate
    );
    match code {
        Code::OUT_OF_MEMORY if multicast => {
            ": device memory or fabric resources (multicast groups) are exhausted; free endpoints or bindings and retry"
        }
        Code::SYSTEM_NOT_READY => {
            ": the fabric software (fabric manager / IMEX) is not running; start it and retry (retryable)"
        }
        Code::ILLEGAL_STATE => {
            ": the system is misconfigured (fabric or NVLink state); fix the setup, then retry"
        }
        Code::NOT_PERMITTED => ": this process may not do this (denied by policy or by the driver)",
        Code::DEINITIALIZED => ": the driver is shutting down",
        _ => "",
    }
}

impl Error {
    /// Wraps a driver code from `call`.
    pub fn driver(call: Call, code: Code) -> Error {
        Error::Driver { call, code }
    }

    /// The driver code, if this came from the driver.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying the same call later can succeed (SPEC R5.10): fabric
    /// software not ready, or resources exhausted.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code(),
            Some(Code::SYSTEM_NOT_READY) | Some(Code::OUT_OF_MEMORY)
        ) || matches!(self, Error::Timeout { .. })
    }
}

/// A failed consuming transition: the error, and the value it was called on,
/// unchanged, so nothing leaks and the caller can retry or drop it.
pub struct Failed<T> {
    /// What went wrong.
    pub error: Error,
    /// The value handed back, in the state it had before the call.
    pub value: T,
}

impl<T> Failed<T> {
    /// Splits into the error and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }
}

// Hand-written: no `T: Debug` bound, so `?` works for any endpoint type.
impl<T> fmt::Debug for Failed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Failed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Failed<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Failed<T>> for Error {
    fn from(f: Failed<T>) -> Error {
        f.error
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Driver result codes and entry-point names.
//!
//! `cudarc`'s `CUresult` is a Rust enum, so reading a code that a newer driver
//! adds as that enum would be undefined behaviour. [`Code::from_raw`] converts
//! the plain integer with a checked match; anything unlisted stays a number.
//! The model only ever builds [`Code`] from listed `CUresult` values.

use std::fmt;

use cudarc::driver::sys::CUresult;

/// The result of one driver call.
pub type DriverResult<T> = Result<T, Code>;

macro_rules! codes {
    ($($name:ident = $num:literal),* $(,)?) => {
        /// A non-success code returned by a driver call.
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            /// A code listed in `cudarc`'s `CUresult` that this library names.
            Known(CUresult),
            /// A number this library does not know (a newer driver's code).
            Unknown(u32),
        }

        impl Code {
            /// Converts a raw `CUresult` number; `None` for `CUDA_SUCCESS`.
            pub fn from_raw(raw: u32) -> Option<Code> {
                match raw {
                    0 => None,
                    $($num => Some(Code::Known(CUresult::$name)),)*
                    other => Some(Code::Unknown(other)),
                }
            }

            /// The raw number of this code.
            pub fn raw(self) -> u32 {
                match self {
                    Code::Known(c) => c as u32,
                    Code::Unknown(n) => n,
                }
            }

            /// The `cuda.h` name, e.g. `CUDA_ERROR_INVALID_VALUE`, or `"unknown"`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Code::Known(CUresult::$name) => stringify!($name),)*
                    _ => "unknown CUresult",
                }
            }
        }
    };
}

codes! {
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_UNMAP_FAILED = 206,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_UNKNOWN = 999,
}

impl Code {
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: Code = Code::Known(CUresult::CUDA_ERROR_INVALID_VALUE);
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: Code = Code::Known(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: Code = Code::Known(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    /// `CUDA_ERROR_DEINITIALIZED`.
    pub const DEINITIALIZED: Code = Code::Known(CUresult::CUDA_ERROR_DEINITIALIZED);
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: Code = Code::Known(CUresult::CUDA_ERROR_INVALID_DEVICE);
    /// `CUDA_ERROR_ILLEGAL_STATE`.
    pub const ILLEGAL_STATE: Code = Code::Known(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    /// `CUDA_ERROR_NOT_PERMITTED`.
    pub const NOT_PERMITTED: Code = Code::Known(CUresult::CUDA_ERROR_NOT_PERMITTED);
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: Code = Code::Known(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    /// `CUDA_ERROR_SYSTEM_NOT_READY`.
    pub const SYSTEM_NOT_READY: Code = Code::Known(CUresult::CUDA_ERROR_SYSTEM_NOT_READY);
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: Code = Code::Known(CUresult::CUDA_ERROR_NOT_FOUND);
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: Code = Code::Known(CUresult::CUDA_ERROR_INVALID_HANDLE);
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub const ILLEGAL_ADDRESS: Code = Code::Known(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    /// `CUDA_ERROR_NOT_MAPPED`.
    pub const NOT_MAPPED: Code = Code::Known(CUresult::CUDA_ERROR_NOT_MAPPED);
    /// `CUDA_ERROR_ALREADY_MAPPED`.
    pub const ALREADY_MAPPED: Code = Code::Known(CUresult::CUDA_ERROR_ALREADY_MAPPED);
}

// Hand-written so that nothing calls into the driver (cudarc's `DriverError`
// formats through `cuGetErrorString`).
impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

macro_rules! calls {
    ($($variant:ident => $cname:literal),* $(,)?) => {
        /// A driver entry point, named as in `cuda.h`. Used in errors, traces,
        /// call policies and fault injection.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Call { $(#[doc = $cname] $variant,)* }

        impl Call {
            /// Every entry point, in declaration order.
            pub const ALL: &'static [Call] = &[$(Call::$variant,)*];

            /// The C name, e.g. `"cuLogicalEndpointCreate"`.
            pub fn name(self) -> &'static str {
                match self { $(Call::$variant => $cname,)* }
            }

            /// Looks a C name up, e.g. for a deny list read from the environment.
            pub fn from_name(name: &str) -> Option<Call> {
                match name { $($cname => Some(Call::$variant),)* _ => None }
            }
        }
    };
}

calls! {
    DriverGetVersion => "cuDriverGetVersion",
    DeviceGetCount => "cuDeviceGetCount",
    DeviceGetAttribute => "cuDeviceGetAttribute",
    MemGetInfo => "cuMemGetInfo",
    IdReserve => "cuLogicalEndpointIdReserve",
    IdRelease => "cuLogicalEndpointIdRelease",
    GetLimits => "cuLogicalEndpointGetLimits",
    Create => "cuLogicalEndpointCreate",
    AddDevice => "cuLogicalEndpointAddDevice",
    Query => "cuLogicalEndpointQuery",
    BindMem => "cuLogicalEndpointBindMem",
    BindAddr => "cuLogicalEndpointBindAddr",
    Unbind => "cuLogicalEndpointUnbind",
    Destroy => "cuLogicalEndpointDestroy",
    Export => "cuLogicalEndpointExport",
    Import => "cuLogicalEndpointImport",
    MemGetAllocationGranularity => "cuMemGetAllocationGranularity",
    MemCreate => "cuMemCreate",
    MemRelease => "cuMemRelease",
    MemGetAllocationProperties => "cuMemGetAllocationPropertiesFromHandle",
    MemAddressReserve => "cuMemAddressReserve",
    MemAddressFree => "cuMemAddressFree",
    MemMap => "cuMemMap",
    MemUnmap => "cuMemUnmap",
    MemSetAccess => "cuMemSetAccess",
    MulticastGetGranularity => "cuMulticastGetGranularity",
    MulticastCreate => "cuMulticastCreate",
    MulticastAddDevice => "cuMulticastAddDevice",
    MulticastBindMem => "cuMulticastBindMem",
    MulticastBindAddr => "cuMulticastBindAddr",
    MulticastUnbind => "cuMulticastUnbind",
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_numbers_stay_numbers() {
        assert_eq!(Code::from_raw(0), None);
        assert_eq!(Code::from_raw(1), Some(Code::INVALID_VALUE));
        assert_eq!(Code::from_raw(12345), Some(Code::Unknown(12345)));
        assert_eq!(Code::Unknown(12345).raw(), 12345);
        assert_eq!(
            format!("{}", Code::NOT_PERMITTED),
            "CUDA_ERROR_NOT_PERMITTED (800)"
        );
    }

    #[test]
    fn call_names_round_trip() {
        for &c in Call::ALL {
            assert_eq!(Call::from_name(c.name()), Some(c));
        }
    }
}

//! The C declarations the real backend calls, written once here and nowhere
//! else: typedefs, `repr(C)` structs, enum values and function prototypes of
//! `cuda.h` (CUDA 13.3 ABI, x86-64 / aarch64 Linux).
//!
//! Enums are plain integers (`c_uint`) and every function returns
//! [`CUresult`] as `c_uint`, so a value a newer driver adds is never
//! undefined behaviour. Rust names follow `cuda.h` so that the ABI check
//! (`abi.rs`) can print each declaration back as C and have a C
//! compiler compare it with the real header: every macro below also records
//! what it declared (sizes, offsets, values, prototypes).
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};
use std::mem::{offset_of, size_of};

/// A typedef as declared here: its C name, size and signedness.
#[derive(Clone, Copy, Debug)]
pub struct CTypedef {
    /// The `cuda.h` name.
    pub name: &'static str,
    /// `size_of` of the Rust type.
    pub size: usize,
    /// Whether the Rust type is signed (`None` for pointers).
    pub signed: Option<bool>,
}

/// A struct field (or a member path inside an anonymous union) as declared here.
#[derive(Clone, Copy, Debug)]
pub struct CField {
    /// The C member designator, e.g. `"unicast.device"`.
    pub path: &'static str,
    /// `offset_of` in the Rust struct.
    pub offset: usize,
    /// `size_of` of the Rust field.
    pub size: usize,
}

/// A struct as declared here.
#[derive(Clone, Copy, Debug)]
pub struct CStruct {
    /// The `cuda.h` typedef name.
    pub name: &'static str,
    /// `size_of` of the Rust struct.
    pub size: usize,
    /// The first `CUDA_VERSION` whose header has it.
    pub since: u32,
    /// Its fields.
    pub fields: &'static [CField],
}

/// An enum value as declared here.
#[derive(Clone, Copy, Debug)]
pub struct CConst {
    /// The `cuda.h` enumerator name.
    pub name: &'static str,
    /// Its value here.
    pub value: i64,
    /// The first `CUDA_VERSION` whose header has it.
    pub since: u32,
}

/// A function prototype as declared here.
#[derive(Clone, Copy, Debug)]
pub struct CFunction {
    /// The exported symbol, e.g. `"cuMemGetInfo_v2"`.
    pub name: &'static str,
    /// The parameter types, as Rust tokens (`"*const CUlogicalEndpointProp"`).
    pub params: &'static [&'static str],
    /// The first `CUDA_VERSION` whose header has it.
    pub since: u32,
}

/// Signedness of an integer typedef's Rust type, for the ABI check.
pub trait Signedness {
    /// `Some(true)` for signed integers, `Some(false)` unsigned, `None` pointers.
    const SIGNED: Option<bool>;
}
macro_rules! signedness {
    ($($t:ty => $s:expr),*) => {$(impl Signedness for $t { const SIGNED: Option<bool> = $s; })*};
}
signedness!(i32 => Some(true), u32 => Some(false), u64 => Some(false), usize => Some(false));
impl<T> Signedness for *mut T {
    const SIGNED: Option<bool> = None;
}

macro_rules! c_typedefs {
    ($($(#[$m:meta])* $name:ident = $t:ty;)*) => {
        $($(#[$m])* pub type $name = $t;)*
        /// Every typedef declared here.
        pub const TYPEDEFS: &[CTypedef] = &[$(CTypedef {
            name: stringify!($name),
            size: size_of::<$t>(),
            signed: <$t as Signedness>::SIGNED,
        },)*];
    };
}

c_typedefs! {
    /// `CUresult`: an enum, read as its integer.
    CUresult = c_uint;
    /// `CUdevice`.
    CUdevice = c_int;
    /// `CUdeviceptr` (64-bit).
    CUdeviceptr = c_ulonglong;
    /// `CUmemGenericAllocationHandle`.
    CUmemGenericAllocationHandle = c_ulonglong;
    /// `cuuint32_t`.
    cuuint32_t = u32;
    /// `cuuint64_t`.
    cuuint64_t = u64;
    /// `CUlogicalEndpointId`.
    CUlogicalEndpointId = cuuint32_t;
    /// `CUlogicalEndpointType` (enum).
    CUlogicalEndpointType = c_uint;
    /// `CUlogicalEndpointIpcHandleType` (enum).
    CUlogicalEndpointIpcHandleType = c_uint;
    /// `CUdevice_attribute` (enum).
    CUdevice_attribute = c_uint;
    /// `CUmemLocationType` (enum).
    CUmemLocationType = c_uint;
    /// `CUmemAllocationType` (enum).
    CUmemAllocationType = c_uint;
    /// `CUmemAllocationHandleType` (enum).
    CUmemAllocationHandleType = c_uint;
    /// `CUmemAccess_flags` (enum).
    CUmemAccess_flags = c_uint;
    /// `CUmemAllocationGranularity_flags` (enum).
    CUmemAllocationGranularity_flags = c_uint;
    /// `CUmulticastGranularity_flags` (enum).
    CUmulticastGranularity_flags = c_uint;
    /// `CUcontext`: an opaque pointer, never dereferenced here.
    CUcontext = *mut c_void;
    /// `CUstream`: an opaque pointer, never dereferenced here; null is the
    /// legacy NULL stream, which the crate never uses (F6).
    CUstream = *mut c_void;
    /// `CUgraph`: an opaque pointer, never dereferenced here.
    CUgraph = *mut c_void;
    /// `CUgraphExec`: an opaque pointer, never dereferenced here.
    CUgraphExec = *mut c_void;
    /// `CUevent`: an opaque pointer, never dereferenced here.
    CUevent = *mut c_void;
    /// `CUstreamCaptureMode` (enum).
    CUstreamCaptureMode = c_uint;
    /// `CUmemcpySrcAccessOrder` (enum, 12.8+).
    CUmemcpySrcAccessOrder = c_uint;
}

/// `CUfabricCpyOperandType` (enum, 13.5+); not in [`TYPEDEFS`] because 13.3 lacks it.
pub type CUfabricCpyOperandType = c_uint;

/// `CUcliqueType` (enum, 13.4+); not in [`TYPEDEFS`] because 13.3 lacks it.
pub type CUcliqueType = c_uint;

macro_rules! c_structs {
    ($($(#[$m:meta])* pub $kind:ident $name:ident since $since:literal {
        $($(#[$fm:meta])* pub $f:ident: $t:ty => [$($path:literal),+],)*
    })*) => {
        $($(#[$m])* #[repr(C)] #[derive(Clone, Copy)]
        pub $kind $name { $($(#[$fm])* pub $f: $t,)* })*

        /// Every struct declared here.
        pub const STRUCTS: &[CStruct] = &[$(CStruct {
            name: stringify!($name),
            size: size_of::<$name>(),
            since: $since,
            fields: &[$($(CField {
                path: $path,
                offset: offset_of!($name, $f),
                size: size_of::<$t>(),
            },)+)*],
        },)*];
    };
}

/// The union inside `CUlogicalEndpointProp`: `unicast.device` or
/// `multicast.numDevices`, both 4-byte integers at the same offset.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUlogicalEndpointTarget {
    /// `unicast.device`.
    pub device: CUdevice,
    /// `multicast.numDevices`.
    pub num_devices: c_uint,
}

/// `allocFlags` of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUmemAllocFlags {
    /// `compressionType`.
    pub compressionType: c_uchar,
    /// `gpuDirectRDMACapable`.
    pub gpuDirectRDMACapable: c_uchar,
    /// `usage`.
    pub usage: c_ushort,
    /// `reserved`.
    pub reserved: [c_uchar; 4],
}

/// `op.ptr` of `CUfabricCpyOperand` (an anonymous struct in `cuda.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfabricCpyOperandPtr {
    /// `ptr`: where the copy begins.
    pub ptr: CUdeviceptr,
    /// `locHint`.
    pub locHint: CUmemLocation,
}

/// `op.le` of `CUfabricCpyOperand` (an anonymous struct in `cuda.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfabricCpyOperandLe {
    /// `id`: the logical endpoint.
    pub id: CUlogicalEndpointId,
    /// `offset`: bytes into the endpoint.
    pub offset: cuuint64_t,
}

/// The union `op` of `CUfabricCpyOperand`: `ptr` or `le`, by `type`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUfabricCpyOperandOp {
    /// `CU_FABRIC_COPY_OPERAND_TYPE_POINTER`.
    pub ptr: CUfabricCpyOperandPtr,
    /// `CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT`.
    pub le: CUfabricCpyOperandLe,
}

c_structs! {
    /// `CUlogicalEndpointProp` (SPEC "Types": 24 bytes).
    pub struct CUlogicalEndpointProp since 13030 {
        pub type_: CUlogicalEndpointType => ["type"],
        pub target: CUlogicalEndpointTarget => ["unicast.device", "multicast.numDevices"],
        pub size: c_ulonglong => ["size"],
        pub ipcHandleTypes: c_uint => ["ipcHandleTypes"],
        pub flags: c_uint => ["flags"],
    }
    /// `CUlogicalEndpointFabricHandle`: 64 opaque bytes.
    pub struct CUlogicalEndpointFabricHandle since 13030 {
        pub data: [c_uchar; 64] => ["data"],
    }
    /// `CUmemLocation` (the `id` member of its union).
    pub struct CUmemLocation since 12000 {
        pub type_: CUmemLocationType => ["type"],
        pub id: c_int => ["id"],
    }
    /// `CUmemAllocationProp`.
    pub struct CUmemAllocationProp since 12000 {
        pub type_: CUmemAllocationType => ["type"],
        pub requestedHandleTypes: CUmemAllocationHandleType => ["requestedHandleTypes"],
        pub location: CUmemLocation => ["location"],
        pub win32HandleMetaData: *mut c_void => ["win32HandleMetaData"],
        pub allocFlags: CUmemAllocFlags => ["allocFlags"],
    }
    /// `CUmemAccessDesc`.
    pub struct CUmemAccessDesc since 12000 {
        pub location: CUmemLocation => ["location"],
        pub flags: CUmemAccess_flags => ["flags"],
    }
    /// `CUmulticastObjectProp`.
    pub struct CUmulticastObjectProp since 12000 {
        pub numDevices: c_uint => ["numDevices"],
        pub size: usize => ["size"],
        pub handleTypes: c_ulonglong => ["handleTypes"],
        pub flags: c_ulonglong => ["flags"],
    }
    /// `CUcliqueInfo` (13.4+).
    pub struct CUcliqueInfo since 13040 {
        pub type_: CUcliqueType => ["type"],
        pub id: c_uint => ["id"],
    }
    /// `CUfabricCpyOperand` (13.5+, SPEC F1); the members inside the union
    /// are in [`NESTED`].
    pub struct CUfabricCpyOperand since 13050 {
        pub type_: CUfabricCpyOperandType => ["type"],
        pub op: CUfabricCpyOperandOp => ["op", "op.ptr", "op.le"],
    }
    /// `CUmemcpyAttributes` (12.8+): the attributes of the copies of a
    /// `cuMemcpyBatchAsync` (24 bytes).
    pub struct CUmemcpyAttributes since 12080 {
        pub srcAccessOrder: CUmemcpySrcAccessOrder => ["srcAccessOrder"],
        pub srcLocHint: CUmemLocation => ["srcLocHint"],
        pub dstLocHint: CUmemLocation => ["dstLocHint"],
        pub flags: c_uint => ["flags"],
    }
    /// `CUDA_FABRIC_COPY_BATCH_OP` (13.5+): one copy of `cuFabricCpyBatchAsync`.
    pub struct CUDA_FABRIC_COPY_BATCH_OP since 13050 {
        pub src: CUfabricCpyOperand => ["src"],
        pub dst: CUfabricCpyOperand => ["dst"],
        pub size: usize => ["size"],
        pub flags: c_uint => ["flags"],
    }
}

/// The members of anonymous structs inside unions, which `c_structs!`
/// cannot name: their C paths with offsets from the outer struct, checked
/// by the ABI check like [`STRUCTS`].
pub const NESTED: &[CStruct] = &[CStruct {
    name: "CUfabricCpyOperand",
    size: size_of::<CUfabricCpyOperand>(),
    since: 13050,
    fields: &[
        CField {
            path: "op.ptr.ptr",
            offset: offset_of!(CUfabricCpyOperand, op) + offset_of!(CUfabricCpyOperandPtr, ptr),
            size: size_of::<CUdeviceptr>(),
        },
        CField {
            path: "op.ptr.locHint",
            offset: offset_of!(CUfabricCpyOperand, op) + offset_of!(CUfabricCpyOperandPtr, locHint),
            size: size_of::<CUmemLocation>(),
        },
        CField {
            path: "op.le.id",
            offset: offset_of!(CUfabricCpyOperand, op) + offset_of!(CUfabricCpyOperandLe, id),
            size: size_of::<CUlogicalEndpointId>(),
        },
        CField {
            path: "op.le.offset",
            offset: offset_of!(CUfabricCpyOperand, op) + offset_of!(CUfabricCpyOperandLe, offset),
            size: size_of::<cuuint64_t>(),
        },
    ],
}];

macro_rules! c_consts {
    ($($(#[$m:meta])* $name:ident: $t:ty = $v:literal since $since:literal;)*) => {
        $($(#[$m])* pub const $name: $t = $v;)*
        /// Every enum value declared here.
        pub const CONSTS: &[CConst] = &[$(CConst {
            name: stringify!($name),
            value: $v as i64,
            since: $since,
        },)*];
    };
}

c_consts! {
    CUDA_SUCCESS: CUresult = 0 since 12000;
    CU_LOGICAL_ENDPOINT_TYPE_INVALID: CUlogicalEndpointType = 0 since 13030;
    CU_LOGICAL_ENDPOINT_TYPE_UNICAST: CUlogicalEndpointType = 1 since 13030;
    CU_LOGICAL_ENDPOINT_TYPE_MULTICAST: CUlogicalEndpointType = 2 since 13030;
    CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_NONE: CUlogicalEndpointIpcHandleType = 0 since 13030;
    CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC: CUlogicalEndpointIpcHandleType = 1 since 13030;
    CU_LOGICAL_ENDPOINT_FLAG_NONE: c_uint = 0 since 13030;
    CU_LOGICAL_ENDPOINT_FLAG_COUNTED_OPS: c_uint = 1 since 13030;
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: CUdevice_attribute = 128 since 12000;
    CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: CUdevice_attribute = 132 since 12000;
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: CUdevice_attribute = 134 since 12000;
    CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_UNICAST_SUPPORTED: CUdevice_attribute = 153 since 13030;
    CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_MULTICAST_SUPPORTED: CUdevice_attribute = 154 since 13030;
    CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_COUNTED_OPS_SUPPORTED: CUdevice_attribute = 155 since 13030;
    CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_UNICAST_ACCESS_ON_OWNER_DEVICE_SUPPORTED: CUdevice_attribute = 156 since 13030;
    CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES: CUdevice_attribute = 158 since 13040;
    CU_MEM_LOCATION_TYPE_INVALID: CUmemLocationType = 0 since 12000;
    CU_MEM_LOCATION_TYPE_DEVICE: CUmemLocationType = 1 since 12000;
    CU_MEM_LOCATION_TYPE_HOST_NUMA: CUmemLocationType = 3 since 12000;
    CU_MEM_ALLOCATION_TYPE_PINNED: CUmemAllocationType = 1 since 12000;
    CU_MEM_HANDLE_TYPE_NONE: CUmemAllocationHandleType = 0 since 12000;
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 1 since 12000;
    CU_MEM_HANDLE_TYPE_FABRIC: CUmemAllocationHandleType = 8 since 12000;
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE: CUmemAccess_flags = 3 since 12000;
    CU_MEM_ALLOC_GRANULARITY_MINIMUM: CUmemAllocationGranularity_flags = 0 since 12000;
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: CUmemAllocationGranularity_flags = 1 since 12000;
    CU_MULTICAST_GRANULARITY_MINIMUM: CUmulticastGranularity_flags = 0 since 12000;
    CU_MULTICAST_GRANULARITY_RECOMMENDED: CUmulticastGranularity_flags = 1 since 12000;
    CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT: CUcliqueType = 3 since 13040;
    CU_MEM_LOCATION_TYPE_HOST: CUmemLocationType = 2 since 12020;
    CU_STREAM_NON_BLOCKING: c_uint = 1 since 12000;
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1 since 12000;
    CU_EVENT_DISABLE_TIMING: c_uint = 2 since 12000;
    CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: CUmemcpySrcAccessOrder = 1 since 12080;
    CU_MEMCPY_FLAG_DEFAULT: c_uint = 0 since 12080;
    CU_FABRIC_COPY_OPERAND_TYPE_POINTER: CUfabricCpyOperandType = 1 since 13050;
    CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT: CUfabricCpyOperandType = 2 since 13050;
}

/// Declares, for every entry point the backend calls: its function-pointer
/// type `PFN_name`, a field of [`Symbols`] (`None` when the driver lacks it),
/// and its prototype in [`FUNCTIONS`].
macro_rules! c_functions {
    ($($(#[$m:meta])* $name:ident($($p:ident: $t:ty),* $(,)?) since $since:literal;)*) => {
        $($(#[$m])*
        pub type $name = unsafe extern "C" fn($($t),*) -> CUresult;)*

        /// The resolved entry points, each `None` when the loaded driver does
        /// not export it.
        #[derive(Clone, Copy, Default)]
        pub struct Symbols {
            $(#[doc = concat!("`", stringify!($name), "`.")]
            pub $name: Option<$name>,)*
        }

        impl Symbols {
            /// Resolves every entry point with `lookup(name) -> address`.
            ///
            /// # Safety
            ///
            /// Every non-null address `lookup` returns for `name` must be the
            /// C function `name` of `cuda.h`, valid for the life of the process.
            pub unsafe fn resolve(mut lookup: impl FnMut(&'static std::ffi::CStr) -> *mut c_void) -> Symbols {
                Symbols {
                    $($name: {
                        // Checked at compile time: the name has one trailing NUL.
                        const NAME: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
                            concat!(stringify!($name), "\0").as_bytes(),
                        ) {
                            Ok(c) => c,
                            Err(_) => panic!("symbol name with an inner NUL"),
                        };
                        let p = lookup(NAME);
                        if p.is_null() {
                            None
                        } else {
                            // SAFETY: the caller promises `p` is `$name`, whose
                            // prototype is the one declared above.
                            Some(unsafe { std::mem::transmute::<*mut c_void, $name>(p) })
                        }
                    },)*
                }
            }

            /// Whether the entry point called `name` was resolved.
            pub fn has(&self, name: &str) -> bool {
                match name {
                    $(stringify!($name) => self.$name.is_some(),)*
                    _ => false,
                }
            }

            /// The entry points that did not resolve, for reports.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $(if self.$name.is_none() {
                    out.push(stringify!($name));
                })*
                out
            }
        }

        /// Every prototype declared here.
        pub const FUNCTIONS: &[CFunction] = &[$(CFunction {
            name: stringify!($name),
            params: &[$(stringify!($t)),*],
            since: $since,
        },)*];
    };
}

c_functions! {
    // Setup and contexts.
    cuInit(flags: c_uint) since 12000;
    cuCtxGetCurrent(pctx: *mut CUcontext) since 12000;
    cuCtxSetCurrent(ctx: CUcontext) since 12000;
    cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) since 12000;
    cuDevicePrimaryCtxRelease_v2(dev: CUdevice) since 12000;
    cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) since 12000;
    // Base calls.
    cuDriverGetVersion(version: *mut c_int) since 12000;
    cuDeviceGetCount(count: *mut c_int) since 12000;
    cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) since 12000;
    cuMemGetInfo_v2(free: *mut usize, total: *mut usize) since 12000;
    cuDeviceGetCliqueCount(count: *mut usize, dev: CUdevice) since 13040;
    cuDeviceGetCliqueInfo(info: *mut CUcliqueInfo, count: *mut usize, dev: CUdevice) since 13040;
    // Logical endpoints.
    cuLogicalEndpointIdReserve(base: *mut CUlogicalEndpointId, count: cuuint32_t) since 13030;
    cuLogicalEndpointIdRelease(base: CUlogicalEndpointId, count: cuuint32_t) since 13030;
    cuLogicalEndpointGetLimits(align: *mut cuuint64_t, max: *mut cuuint64_t, prop: *const CUlogicalEndpointProp) since 13030;
    cuLogicalEndpointCreate(id: CUlogicalEndpointId, prop: *const CUlogicalEndpointProp) since 13030;
    cuLogicalEndpointAddDevice(id: CUlogicalEndpointId, dev: CUdevice) since 13030;
    cuLogicalEndpointQuery(base: CUlogicalEndpointId, count: cuuint32_t, status: *mut c_int) since 13030;
    cuLogicalEndpointBindMem(id: CUlogicalEndpointId, dev: CUdevice, offset: cuuint64_t, mem: CUmemGenericAllocationHandle, mem_offset: cuuint64_t, size: cuuint64_t, flags: c_ulonglong) since 13030;
    cuLogicalEndpointBindAddr(id: CUlogicalEndpointId, dev: CUdevice, offset: cuuint64_t, ptr: *mut c_void, size: cuuint64_t, flags: c_ulonglong) since 13030;
    cuLogicalEndpointUnbind(id: CUlogicalEndpointId, dev: CUdevice, offset: cuuint64_t, size: cuuint64_t) since 13030;
    cuLogicalEndpointDestroy(id: CUlogicalEndpointId) since 13030;
    cuLogicalEndpointExport(handle: *mut c_void, id: CUlogicalEndpointId, ty: CUlogicalEndpointIpcHandleType) since 13030;
    cuLogicalEndpointImport(id: CUlogicalEndpointId, handle: *const c_void, ty: CUlogicalEndpointIpcHandleType) since 13030;
    // VMM.
    cuMemGetAllocationGranularity(g: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags) since 12000;
    cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) since 12000;
    cuMemRelease(handle: CUmemGenericAllocationHandle) since 12000;
    cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) since 12000;
    cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, ty: CUmemAllocationHandleType, flags: c_ulonglong) since 12000;
    cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, ty: CUmemAllocationHandleType) since 12000;
    cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) since 12000;
    cuMemAddressFree(ptr: CUdeviceptr, size: usize) since 12000;
    cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) since 12000;
    cuMemUnmap(ptr: CUdeviceptr, size: usize) since 12000;
    cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) since 12000;
    // Classic multicast.
    cuMulticastGetGranularity(g: *mut usize, prop: *const CUmulticastObjectProp, option: CUmulticastGranularity_flags) since 12000;
    cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) since 12000;
    cuMulticastAddDevice(mc: CUmemGenericAllocationHandle, dev: CUdevice) since 12000;
    cuMulticastBindMem(mc: CUmemGenericAllocationHandle, mc_offset: usize, mem: CUmemGenericAllocationHandle, mem_offset: usize, size: usize, flags: c_ulonglong) since 12000;
    cuMulticastBindAddr(mc: CUmemGenericAllocationHandle, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: c_ulonglong) since 12000;
    cuMulticastUnbind(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize, size: usize) since 12000;
    // Streams and the data path.
    cuStreamCreate(stream: *mut CUstream, flags: c_uint) since 12000;
    cuStreamDestroy_v2(stream: CUstream) since 12000;
    cuStreamSynchronize(stream: CUstream) since 12000;
    cuStreamQuery(stream: CUstream) since 12000;
    // The stream's own context: where a stream call a driver refused in
    // another context (or in none) is made again (`context.rs`).
    cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) since 12000;
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, size: usize, stream: CUstream) since 12000;
    // `cuda.h` 13.0+ maps `cuMemcpyBatchAsync` to this symbol (12.8's
    // `cuMemcpyBatchAsync` took a `size_t *failIdx` before the stream).
    cuMemcpyBatchAsync_v2(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut CUmemcpyAttributes, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream) since 13000;
    cuFabricCpyBatchAsync(num_ops: usize, ops: *mut CUDA_FABRIC_COPY_BATCH_OP, flags: c_ulonglong, stream: CUstream) since 13050;
    // Graphs of captured copies (F8).
    cuStreamBeginCapture_v2(stream: CUstream, mode: CUstreamCaptureMode) since 12000;
    cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) since 12000;
    cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) since 12000;
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream) since 12000;
    cuGraphExecDestroy(exec: CUgraphExec) since 12000;
    cuGraphDestroy(graph: CUgraph) since 12000;
    // Events (F4).
    cuEventCreate(event: *mut CUevent, flags: c_uint) since 12000;
    cuEventRecord(event: CUevent, stream: CUstream) since 12000;
    cuEventQuery(event: CUevent) since 12000;
    cuEventSynchronize(event: CUevent) since 12000;
    cuEventDestroy_v2(event: CUevent) since 12000;
}

// The layouts the marshalling relies on (SPEC "Types", x86-64 / aarch64);
// `super::abi` checks the same against the real header with a C compiler.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<CUlogicalEndpointProp>() == 24);
    assert!(offset_of!(CUlogicalEndpointProp, size) == 8);
    assert!(offset_of!(CUlogicalEndpointProp, ipcHandleTypes) == 16);
    assert!(offset_of!(CUlogicalEndpointProp, flags) == 20);
    assert!(size_of::<CUlogicalEndpointFabricHandle>() == 64);
    assert!(size_of::<CUmemLocation>() == 8);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(size_of::<CUmemAccessDesc>() == 12);
    assert!(size_of::<CUmulticastObjectProp>() == 32);
    assert!(size_of::<CUcliqueInfo>() == 8);
    assert!(size_of::<CUfabricCpyOperand>() == 24);
    assert!(offset_of!(CUfabricCpyOperand, op) == 8);
    assert!(size_of::<CUmemcpyAttributes>() == 24);
    assert!(offset_of!(CUmemcpyAttributes, srcLocHint) == 4);
    assert!(offset_of!(CUmemcpyAttributes, dstLocHint) == 12);
    assert!(offset_of!(CUmemcpyAttributes, flags) == 20);
    assert!(size_of::<CUDA_FABRIC_COPY_BATCH_OP>() == 64);
    assert!(offset_of!(CUDA_FABRIC_COPY_BATCH_OP, size) == 48);
    assert!(offset_of!(CUDA_FABRIC_COPY_BATCH_OP, flags) == 56);
};

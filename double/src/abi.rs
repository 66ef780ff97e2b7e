//! The C ABI the double exports: `cuda.h` type names as Rust aliases, the C
//! structs it reads and writes, the `exports!` macro that defines each
//! `extern "C"` entry point once (symbol, prototype, panic guard, call
//! counter), and the C text that lets a compiler check those prototypes
//! against the real `cuda.h` ([`abi_check_c`]).
//!
//! The aliases carry the `cuda.h` names on purpose: the prototype check
//! prints each parameter by its alias name, so `CUdeviceptr` here must be
//! `CUdeviceptr` there, and a `_Static_assert` per alias pins its width.
#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::fmt::Write as _;

/// `CUresult`: the double returns plain numbers, including unknown ones.
pub type CUresult = c_uint;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUcontext` (an opaque pointer; the double hands out fake ones).
pub type CUcontext = *mut c_void;
/// `CUdevice_attribute` (an enum: read as a plain integer).
pub type CUdevice_attribute = c_int;
/// `CUlogicalEndpointId`.
pub type CUlogicalEndpointId = u32;
/// `CUlogicalEndpointIpcHandleType` (enum).
pub type CUlogicalEndpointIpcHandleType = c_uint;
/// `cuuint32_t`.
pub type cuuint32_t = u32;
/// `cuuint64_t`.
pub type cuuint64_t = u64;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = c_ulonglong;
/// `CUdeviceptr`.
pub type CUdeviceptr = c_ulonglong;
/// `size_t`.
pub type size_t = usize;
/// `CUmemAllocationGranularity_flags` (enum).
pub type CUmemAllocationGranularity_flags = c_uint;
/// `CUmulticastGranularity_flags` (enum).
pub type CUmulticastGranularity_flags = c_uint;
/// `CUmemAllocationHandleType` (an enum: `unsigned int`).
pub type CUmemAllocationHandleType = c_uint;
/// `CUdriverProcAddressQueryResult` (enum).
pub type CUdriverProcAddressQueryResult = c_uint;
/// `CUstream` (an opaque pointer; the double hands out the model's stream
/// handles as its value, never dereferenced).
pub type CUstream = *mut c_void;
/// `CUfabricCpyOperandType` (enum, 13.5+).
pub type CUfabricCpyOperandType = c_uint;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: c_uint,
    /// `id` (the union's first member).
    pub id: c_int,
}

/// `CUmemAllocationProp` (the `allocFlags` sub-struct as its 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub type_: c_uint,
    /// `CUmemAllocationHandleType` bitmask.
    pub requested_handle_types: c_uint,
    /// `location`.
    pub location: CUmemLocation,
    /// `win32HandleMetaData`.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (compression, RDMA, usage, reserved).
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    /// `location`.
    pub location: CUmemLocation,
    /// `CUmemAccess_flags`.
    pub flags: c_uint,
}

/// `CUmulticastObjectProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmulticastObjectProp {
    /// `numDevices`.
    pub num_devices: c_uint,
    /// `size`.
    pub size: usize,
    /// `handleTypes`.
    pub handle_types: c_ulonglong,
    /// `flags`.
    pub flags: c_ulonglong,
}

/// `CUlogicalEndpointProp` (13.3+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlogicalEndpointProp {
    /// `CUlogicalEndpointType`.
    pub type_: c_uint,
    /// The union: `unicast.device` (an `int`) or `multicast.numDevices`.
    pub union_: u32,
    /// `size`.
    pub size: c_ulonglong,
    /// `ipcHandleTypes`.
    pub ipc_handle_types: c_uint,
    /// `flags`.
    pub flags: c_uint,
}

/// `CUcliqueInfo` (13.4+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUcliqueInfo {
    /// `CUcliqueType`.
    pub type_: c_uint,
    /// `id`.
    pub id: c_uint,
}

/// `op.ptr` of `CUfabricCpyOperand` (an anonymous struct in `cuda.h`, 13.5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfabricCpyOperandPtr {
    /// `ptr`.
    pub ptr: CUdeviceptr,
    /// `locHint`.
    pub loc_hint: CUmemLocation,
}

/// `op.le` of `CUfabricCpyOperand` (an anonymous struct in `cuda.h`, 13.5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfabricCpyOperandLe {
    /// `id`.
    pub id: CUlogicalEndpointId,
    /// `offset`.
    pub offset: cuuint64_t,
}

/// The union `op` of `CUfabricCpyOperand`: `ptr` or `le`, by `type`. Both
/// members are plain integers (16 bytes, 8-aligned): any bit pattern reads
/// as either.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUfabricCpyOperandOp {
    /// `CU_FABRIC_COPY_OPERAND_TYPE_POINTER`.
    pub ptr: CUfabricCpyOperandPtr,
    /// `CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT`.
    pub le: CUfabricCpyOperandLe,
}

/// `CUfabricCpyOperand` (13.5+).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfabricCpyOperand {
    /// `CUfabricCpyOperandType`.
    pub type_: CUfabricCpyOperandType,
    /// `op`.
    pub op: CUfabricCpyOperandOp,
}

/// `CUDA_FABRIC_COPY_BATCH_OP` (13.5+): one copy of `cuFabricCpyBatchAsync`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct CUDA_FABRIC_COPY_BATCH_OP {
    /// `src`.
    pub src: CUfabricCpyOperand,
    /// `dst`.
    pub dst: CUfabricCpyOperand,
    /// `size`.
    pub size: size_t,
    /// `flags` (must be 0).
    pub flags: c_uint,
}

/// One exported entry point, for `cuGetProcAddress`, the call table and the
/// ABI check.
pub struct Export {
    /// The symbol, e.g. `"cuMemGetInfo_v2"`.
    pub symbol: &'static str,
    /// The first driver version that has it (13030 for logical endpoints).
    pub since: i32,
    /// The parameters as `(name, Rust type as written)`.
    pub params: &'static [(&'static str, &'static str)],
    /// The function.
    pub ptr: *const c_void,
}

// SAFETY: `ptr` is the address of a function: immutable, shareable.
unsafe impl Sync for Export {}

/// Defines `extern "C"` entry points with `cuda.h` names. Each body runs
/// inside [`crate::state::enter`]: counted, checked for initialisation, and
/// with any panic turned into `CUDA_ERROR_UNKNOWN` (a panic must never
/// cross `extern "C"`). Also defines `EXPORTS`, the module's table.
macro_rules! exports {
    ($( [$since:literal $(, $flag:ident)?] fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "` (see `cuda.h`), forwarded to the reference model.")]
            ///
            /// # Safety
            ///
            /// As in `cuda.h`: pointer arguments are null or valid for the
            /// access the C function documents.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::abi::CUresult {
                $crate::state::enter(
                    stringify!($name),
                    exports!(@init $($flag)?),
                    || -> Result<(), $crate::abi::CUresult> { $body },
                )
            }
        )*

        /// This module's entry points.
        pub static EXPORTS: &[$crate::abi::Export] = &[$(
            $crate::abi::Export {
                symbol: stringify!($name),
                since: $since,
                params: &[$((stringify!($arg), stringify!($ty))),*],
                ptr: $name as *const std::ffi::c_void,
            },
        )*];
    };
    (@init) => { true };
    (@init no_init) => { false };
}
pub(crate) use exports;

/// Every entry point the double exports (in this build).
pub fn all_exports() -> impl Iterator<Item = &'static Export> {
    static GROUPS: &[&[Export]] = &[
        crate::base::EXPORTS,
        crate::vmm::EXPORTS,
        crate::stream::EXPORTS,
        #[cfg(not(feature = "cuda-13000"))]
        crate::le::EXPORTS,
        #[cfg(not(feature = "cuda-13000"))]
        crate::copy::EXPORTS,
    ];
    GROUPS.iter().flat_map(|g| g.iter())
}

/// A Rust type as `stringify!` wrote it → its C spelling.
fn c_type(rust: &str) -> String {
    let t: String = rust.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(rest) = t.strip_prefix("*mut ").or_else(|| t.strip_prefix("* mut ")) {
        return format!("{} *", c_type(rest));
    }
    if let Some(rest) = t
        .strip_prefix("*const ")
        .or_else(|| t.strip_prefix("* const "))
    {
        let inner = c_type(rest);
        // `const T *`, but `T *const *` for a pointer to a const pointer.
        return if inner.ends_with('*') {
            format!("{inner} const *")
        } else {
            format!("const {inner} *")
        };
    }
    match t.as_str() {
        "c_int" => "int".into(),
        "c_uint" => "unsigned int".into(),
        "c_uchar" => "unsigned char".into(),
        "c_char" => "char".into(),
        "c_void" => "void".into(),
        "c_ulonglong" => "unsigned long long".into(),
        other => other.into(),
    }
}

/// A C file that includes `cuda.h` and fails to compile (with `-Werror`)
/// when any exported prototype, alias width or struct layout of the double
/// differs from the header's: each entry point is declared again under a
/// prefixed name with the double's parameter types and assigned to a
/// pointer of the header's type.
pub fn abi_check_c() -> String {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "/* Generated by the libcuda test double (cuDoubleAbiC): its prototypes\n\
         \x20* and layouts against the real cuda.h. Compile with -Werror. */\n\
         #include <stddef.h>\n#include <cuda.h>\n"
    );
    macro_rules! width {
        ($($t:ident),*) => {$(
            let _ = writeln!(
                c,
                "_Static_assert(sizeof({}) == {}, \"width of {}\");",
                stringify!($t), std::mem::size_of::<$t>(), stringify!($t)
            );
        )*};
    }
    width!(
        CUresult,
        CUdevice,
        CUcontext,
        CUdevice_attribute,
        cuuint32_t,
        cuuint64_t,
        CUmemGenericAllocationHandle,
        CUdeviceptr,
        size_t,
        CUmemAllocationGranularity_flags,
        CUmulticastGranularity_flags,
        CUdriverProcAddressQueryResult,
        CUstream,
        CUmemLocation,
        CUmemAllocationProp,
        CUmemAccessDesc,
        CUmulticastObjectProp
    );
    let mut field = |ty: &str, c_field: &str, off: usize| {
        let _ = writeln!(
            c,
            "_Static_assert(offsetof({ty}, {c_field}) == {off}, \"{ty}.{c_field}\");"
        );
    };
    use std::mem::offset_of;
    field("CUmemLocation", "id", offset_of!(CUmemLocation, id));
    field(
        "CUmemAllocationProp",
        "requestedHandleTypes",
        offset_of!(CUmemAllocationProp, requested_handle_types),
    );
    field(
        "CUmemAllocationProp",
        "location",
        offset_of!(CUmemAllocationProp, location),
    );
    field(
        "CUmemAllocationProp",
        "allocFlags",
        offset_of!(CUmemAllocationProp, alloc_flags),
    );
    field(
        "CUmemAccessDesc",
        "flags",
        offset_of!(CUmemAccessDesc, flags),
    );
    field(
        "CUmulticastObjectProp",
        "size",
        offset_of!(CUmulticastObjectProp, size),
    );
    field(
        "CUmulticastObjectProp",
        "handleTypes",
        offset_of!(CUmulticastObjectProp, handle_types),
    );
    field(
        "CUmulticastObjectProp",
        "flags",
        offset_of!(CUmulticastObjectProp, flags),
    );
    #[cfg(not(feature = "cuda-13000"))]
    {
        width!(
            CUlogicalEndpointId,
            CUlogicalEndpointIpcHandleType,
            CUlogicalEndpointProp
        );
        let _ = writeln!(
            c,
            "_Static_assert(sizeof(CUlogicalEndpointFabricHandle) == 64, \"fabric handle\");"
        );
        for (f, off) in [
            ("unicast.device", offset_of!(CUlogicalEndpointProp, union_)),
            (
                "multicast.numDevices",
                offset_of!(CUlogicalEndpointProp, union_),
            ),
            ("size", offset_of!(CUlogicalEndpointProp, size)),
            (
                "ipcHandleTypes",
                offset_of!(CUlogicalEndpointProp, ipc_handle_types),
            ),
            ("flags", offset_of!(CUlogicalEndpointProp, flags)),
        ] {
            let _ = writeln!(
                c,
                "_Static_assert(offsetof(CUlogicalEndpointProp, {f}) == {off}, \"CUlogicalEndpointProp.{f}\");"
            );
        }
        let _ = writeln!(
            c,
            "#if CUDA_VERSION >= 13040\n\
             _Static_assert(sizeof(CUcliqueInfo) == {}, \"CUcliqueInfo\");\n\
             _Static_assert(offsetof(CUcliqueInfo, id) == {}, \"CUcliqueInfo.id\");\n#endif",
            std::mem::size_of::<CUcliqueInfo>(),
            offset_of!(CUcliqueInfo, id)
        );
        // The data path (13.5+): the operand union's members by path.
        let op = offset_of!(CUfabricCpyOperand, op);
        let mut asserts = vec![
            format!(
                "_Static_assert(sizeof(CUfabricCpyOperandType) == {}, \"width of CUfabricCpyOperandType\");",
                std::mem::size_of::<CUfabricCpyOperandType>()
            ),
            format!(
                "_Static_assert(sizeof(CUfabricCpyOperand) == {}, \"CUfabricCpyOperand\");",
                std::mem::size_of::<CUfabricCpyOperand>()
            ),
            format!(
                "_Static_assert(sizeof(CUDA_FABRIC_COPY_BATCH_OP) == {}, \"CUDA_FABRIC_COPY_BATCH_OP\");",
                std::mem::size_of::<CUDA_FABRIC_COPY_BATCH_OP>()
            ),
        ];
        for (f, off) in [
            ("op", op),
            ("op.ptr.ptr", op + offset_of!(CUfabricCpyOperandPtr, ptr)),
            (
                "op.ptr.locHint",
                op + offset_of!(CUfabricCpyOperandPtr, loc_hint),
            ),
            ("op.le.id", op + offset_of!(CUfabricCpyOperandLe, id)),
            (
                "op.le.offset",
                op + offset_of!(CUfabricCpyOperandLe, offset),
            ),
        ] {
            asserts.push(format!(
                "_Static_assert(offsetof(CUfabricCpyOperand, {f}) == {off}, \"CUfabricCpyOperand.{f}\");"
            ));
        }
        for (f, off) in [
            ("dst", offset_of!(CUDA_FABRIC_COPY_BATCH_OP, dst)),
            ("size", offset_of!(CUDA_FABRIC_COPY_BATCH_OP, size)),
            ("flags", offset_of!(CUDA_FABRIC_COPY_BATCH_OP, flags)),
        ] {
            asserts.push(format!(
                "_Static_assert(offsetof(CUDA_FABRIC_COPY_BATCH_OP, {f}) == {off}, \"CUDA_FABRIC_COPY_BATCH_OP.{f}\");"
            ));
        }
        let _ = writeln!(
            c,
            "#if CUDA_VERSION >= 13050\n{}\n#endif",
            asserts.join("\n")
        );
    }
    let _ = writeln!(c);
    for e in all_exports() {
        let params: Vec<String> = e
            .params
            .iter()
            .map(|(n, t)| format!("{} {n}", c_type(t)))
            .collect();
        let params = if params.is_empty() {
            "void".to_owned()
        } else {
            params.join(", ")
        };
        // Symbols newer than 13.3 (the clique queries, the fabric copy) exist
        // only in newer headers.
        let guard = e.since > 13030;
        if guard {
            let _ = writeln!(c, "#if CUDA_VERSION >= {}", e.since);
        }
        let _ = writeln!(
            c,
            "CUresult double_{s}({params});\n\
             __typeof__({s}) *const check_{s} = &double_{s};",
            s = e.symbol
        );
        if guard {
            let _ = writeln!(c, "#endif");
        }
    }
    c
}

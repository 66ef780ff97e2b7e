//! The C ABI the double exports. The `cuda.h` types, structs, enum values
//! and prototypes are the library's own, `src/driver/cuda/ffi.rs`, compiled
//! here as [`crate::ffi`] (one C ABI, written once); this file adds the
//! `exports!` macro that defines each `extern "C"` entry point (symbol,
//! prototype, panic guard, call counter), the two aliases only the
//! double's own exports need, and the C text that lets a compiler check
//! both against the real `cuda.h` ([`abi_check_c`]).
//!
//! The parameters of an export are spelled with the `cuda.h` names on
//! purpose: the prototype check prints each by its name, and
//! `every_entry_point_the_backend_calls_has_its_prototype` holds each
//! export the backend resolves to `ffi.rs`'s prototype.
#![allow(non_camel_case_types)]

use std::fmt::Write as _;

pub use crate::ffi::{
    CUDA_FABRIC_COPY_BATCH_OP, CUcliqueInfo, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr,
    CUfabricCpyOperand, CUlogicalEndpointId, CUlogicalEndpointIpcHandleType, CUlogicalEndpointProp,
    CUmemAccessDesc, CUmemAllocFlags, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemLocation, CUmulticastGranularity_flags,
    CUmulticastObjectProp, CUresult, CUstream, cuuint32_t, cuuint64_t,
};

/// `size_t`, as the double's own exports spell it.
pub type size_t = usize;
/// `CUdriverProcAddressQueryResult` (enum), for `cuGetProcAddress`, which
/// only the double exports (the backend resolves symbols with `dlsym`).
pub type CUdriverProcAddressQueryResult = std::ffi::c_uint;

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
    pub ptr: *const std::ffi::c_void,
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

/// A C file that includes `cuda.h` and fails to compile (with `-Werror`)
/// when any declaration of `ffi.rs` (the library's check, shared:
/// [`crate::cabi::declarations`]) or any exported prototype of the double
/// differs from the header's: each entry point is declared again under a
/// prefixed name with the double's parameter types and assigned to a
/// pointer of the header's type.
pub fn abi_check_c() -> String {
    use crate::cabi::{HEAD, c_type, declarations};
    let mut c = String::from(HEAD);
    c.push_str(&declarations());
    let _ = writeln!(
        c,
        "\n/* the double's own exports */\n\
         CHECK(sizeof(size_t) == {}, \"width of size_t\");\n\
         CHECK(sizeof(CUdriverProcAddressQueryResult) == {}, \"width of CUdriverProcAddressQueryResult\");",
        std::mem::size_of::<size_t>(),
        std::mem::size_of::<CUdriverProcAddressQueryResult>()
    );
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
        let since = u32::try_from(e.since).unwrap_or(0);
        crate::cabi::guarded(&mut c, if since > 13030 { since } else { 12000 }, |c| {
            let _ = writeln!(
                c,
                "CUresult double_{s}({params});\n\
                 __typeof__({s}) *const check_double_{s} = &double_{s};",
                s = e.symbol
            );
        });
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One C ABI: every entry point the backend resolves (`ffi.rs`) that
    /// this build exports has the same parameters there and here, spelled
    /// alike in C.
    #[test]
    fn every_entry_point_the_backend_calls_has_its_prototype() {
        use crate::cabi::c_type;
        let mut checked = 0;
        for f in crate::ffi::FUNCTIONS {
            let Some(e) = all_exports().find(|e| e.symbol == f.name) else {
                // Newer than this build's pretended driver (the 13.0 build).
                assert!(
                    cfg!(feature = "cuda-13000") && f.since > 13000,
                    "{} is not exported",
                    f.name
                );
                continue;
            };
            let ours: Vec<String> = e.params.iter().map(|(_, t)| c_type(t)).collect();
            let theirs: Vec<String> = f.params.iter().map(|t| c_type(t)).collect();
            assert_eq!(ours, theirs, "{}", f.name);
            checked += 1;
        }
        assert!(checked > 20, "{checked}");
    }
}

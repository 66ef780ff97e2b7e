//! A libcuda test double: a `cdylib` named `libcuda` that exports the `cu*`
//! entry points the crate's real backend (`driver::cuda::Cuda`) resolves,
//! with the prototypes of `cuda.h` 13.3/13.5, and forwards each to the
//! crate's reference model (`cuda_endpoints::model::Model`). The rules are
//! the model's; what the double adds is the C side: pointers and
//! out-parameters, result codes as plain numbers, `cuInit`, primary
//! contexts and the per-thread current context, the symbol table of a
//! given driver version, and host-backed memory behind `cuMemsetD8`,
//! `cuMemcpyHtoD` and `cuMemcpyDtoH`, streams and the copies in stream order
//! (`cuMemcpyAsync`, `cuFabricCpyBatchAsync`) with host pointers told apart
//! as unified addressing does.
//!
//! - [`ffi`], [`cabi`]: the library's C declarations and their check,
//!   compiled here from `src/driver/cuda/` (one C ABI);
//! - [`abi`]: the `exports!` macro, the ABI check text;
//! - [`state`]: the node, contexts, counters, violations, misbehaviour;
//! - [`node`]: the model behind the calls, the process's own or a model
//!   fabric's shared with other OS processes (`CUDA_ENDPOINTS_FABRIC`);
//! - [`config`]: the simulated node from the environment;
//! - [`base`], [`vmm`], [`stream`], `le` and `copy` (both absent in the
//!   `cuda-13000` build): entry points;
//! - [`extra`]: the double's own `cuDouble*` symbols for tests.
//!
//! No exported function panics across `extern "C"`: every body runs under
//! `catch_unwind` and answers `CUDA_ERROR_UNKNOWN` if it ever did.

pub mod abi;
pub mod base;
/// The library's ABI check generator, `src/driver/cuda/abi.rs` (one C ABI).
#[path = "../../src/driver/cuda/abi.rs"]
pub mod cabi;
pub mod config;
#[cfg(not(feature = "cuda-13000"))]
pub mod copy;
pub mod extra;
/// The library's C declarations, `src/driver/cuda/ffi.rs` (one C ABI).
#[path = "../../src/driver/cuda/ffi.rs"]
pub mod ffi;
#[cfg(not(feature = "cuda-13000"))]
pub mod le;
pub mod node;
pub mod state;
pub mod stream;
pub mod vmm;

use cuda_endpoints::driver::Driver;
use cuda_endpoints::driver::DriverResult;

use abi::CUresult;

/// Runs one driver call on the node with the state's lock released (the
/// model has its own; a fabric's call may wait on its socket).
fn model<T>(f: impl FnOnce(&dyn Driver) -> DriverResult<T>) -> Result<T, CUresult> {
    state::node().call(f)
}

/// Writes an out-parameter; a null pointer is `INVALID_VALUE`.
fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(state::INVALID_VALUE);
    }
    // SAFETY: non-null; the caller passed it as an out-parameter for a `T`
    // (cuda.h contract). Unaligned writes are allowed for.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Reads an in-parameter; a null pointer is `INVALID_VALUE`.
fn read<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(state::INVALID_VALUE);
    }
    // SAFETY: non-null; the caller passed it as a pointer to a `T`.
    Ok(unsafe { p.read_unaligned() })
}

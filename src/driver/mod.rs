//! The driver boundary ([`cuda_endpoints_driver`], re-exported here: the
//! table of calls, the [`Driver`] trait, the domain types, but for
//! [`Device`] and [`Location`], which are at
//! the crate root) and the backends
//! this crate brings: the real driver ([`cuda::Cuda`]) and the classic
//! `cuMulticast*` fallback ([`Classic`]). The reference model is the crate
//! `cuda-endpoints-model` (feature `model`).
//!
//! Layers: the C ABI (declared in `cuda/`, the only place that sees C
//! structs) → a [`Driver`] implementation → the typed API, which only ever
//! talks to `dyn Driver`. Wrappers stack: a `Classic` over a [`Traced`]
//! over `Cuda` records exactly what reached the real driver.
//!
//! Calling a driver method is `unsafe` (see [`Driver`]'s `# Safety`):
//! safe code reaches the driver only through the typed API.

mod classic;
pub mod cuda;

pub use classic::Classic;
// Every item of the boundary once: `Device` and `Location`, which the
// lifecycle speaks, are at the crate root only.
#[doc(hidden)]
pub use cuda_endpoints_driver::Queries;
// In the crate, the whole boundary is `crate::driver::*`.
#[doc(no_inline)]
pub use cuda_endpoints_driver::{
    AllocationRequest, BoundedLog, Call, Code, CodeOrigin, ContextFailure, ContextStep, CopyOp,
    CopyOps, Driver, DriverResult, EndpointProps, FABRIC_COPY_MIN_VERSION, FabricHandleBytes,
    Family, Forward, Granularity, LOGICAL_ENDPOINT_MIN_VERSION, Limits, MEMCPY_BATCH_MIN_VERSION,
    MemHint, MemcpyOp, MemcpyOps, ObjectExport, ObjectSharing, Operand, OpsIntoIter, Pointer,
    Shape, ShareableHandle, ShareableKind, TraceEntry, Traced, UnwoundAnswers, attr, fnv1a,
    for_each_driver_call, handle_bits,
};
pub(crate) use cuda_endpoints_driver::{Device, Location};

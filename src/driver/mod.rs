//! The driver boundary: one table of driver calls
//! ([`for_each_driver_call!`](crate::for_each_driver_call)), from which
//! the [`Driver`] trait, the [`Call`] names and the [`Forward`] wrappers
//! follow; the domain types the calls speak ([`EndpointProps`],
//! [`AllocationRequest`], [`FabricHandleBytes`]...); and the backends.
//!
//! Layers: the C ABI (declared in `cuda/`, the only place that sees C
//! structs) → a [`Driver`] implementation ([`cuda::Cuda`], the reference
//! `model::Model`, the classic fallback [`Classic`], the call recorder
//! [`Traced`]) → the typed API, which only ever talks to `dyn Driver`.
//! Wrappers stack: a `Classic` over a `Traced` over `Cuda` records exactly
//! what reached the real driver. `Arc<D>` is a [`Driver`] whenever `D` is.
//!
//! Calling a driver method is `unsafe` (see [`Driver`]'s `# Safety`):
//! safe code reaches the driver only through the typed API.

mod calls;
pub mod classic;
pub mod code;
mod copy_types;
pub mod cuda;
pub mod trace;
mod types;

pub(crate) use calls::Queries;
pub use calls::{Call, Driver, Family, Forward};
pub use classic::Classic;
pub use code::{Code, DriverResult};
pub use copy_types::{CopyOp, FABRIC_COPY_MIN_VERSION, MemHint, Operand, Pointer};
pub use trace::{TraceEntry, TraceLog, Traced};
pub use types::{
    AllocationRequest, ContextFailure, ContextStep, Device, EndpointProps, FabricHandleBytes,
    Granularity, LOGICAL_ENDPOINT_MIN_VERSION, Limits, Location, Shape, ShareableHandle,
    ShareableKind, attr, fabric_checksum, handle_bits,
};

//! The driver boundary of `cuda-endpoints`: one table of driver calls
//! ([`for_each_driver_call!`]), from which the [`Driver`] trait, the
//! [`Call`] names and the [`Forward`] wrappers follow; the domain types the
//! calls speak ([`EndpointProps`], [`AllocationRequest`],
//! [`FabricHandleBytes`]...); the result codes ([`Code`]); the call recorder
//! [`Traced`]; and the capabilities a backend may offer beside the table
//! ([`ObjectSharing`]).
//!
//! Layers: the C ABI (declared in `cuda_endpoints::driver::cuda`, the only
//! place that sees C structs) → a [`Driver`] implementation (the real
//! driver, the reference model of `cuda-endpoints-model`, the classic
//! fallback, [`Traced`]) → the typed API of `cuda-endpoints`, which only
//! ever talks to `dyn Driver`. This crate holds no backend and no C: it is
//! what every backend and the typed layer agree on. Wrappers stack: a
//! classic fallback over a [`Traced`] over the real driver records exactly
//! what reached it. `Arc<D>` is a [`Driver`] whenever `D` is.
//!
//! Calling a driver method is `unsafe` (see [`Driver`]'s `# Safety`): safe
//! code reaches the driver only through the typed API.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod calls;
mod code;
mod copy_types;
mod log;
mod op_list;
mod sharing;
mod trace;
mod types;
mod unwound;

#[doc(hidden)]
pub use calls::Queries;
pub use calls::{Call, Driver, Family, Forward};
#[doc(hidden)]
pub use code::KNOWN;
pub use code::{Code, CodeOrigin, DriverResult};
pub use copy_types::{
    CopyOp, FABRIC_COPY_MIN_VERSION, MEMCPY_BATCH_MIN_VERSION, MemHint, MemcpyOp, Operand, Pointer,
};
pub use log::BoundedLog;
pub use op_list::{CopyOps, MemcpyOps, OpsIntoIter};
pub use sharing::{ObjectExport, ObjectSharing};
pub use trace::{TraceEntry, Traced};
pub use types::{
    AllocationRequest, ContextFailure, ContextStep, Device, EndpointProps, FabricHandleBytes,
    Granularity, LOGICAL_ENDPOINT_MIN_VERSION, Limits, Location, Shape, ShareableHandle,
    ShareableKind, attr, fnv1a, handle_bits,
};
pub use unwound::UnwoundAnswers;

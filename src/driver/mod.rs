//! The driver boundary ([`cuda_endpoints_driver`], re-exported here: the
//! table of calls, the [`Driver`] trait, the domain types) and the backends
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

pub mod classic;
pub mod cuda;

pub use classic::Classic;
#[doc(no_inline)]
pub use cuda_endpoints_driver::*;

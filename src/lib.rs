//! Typestate-safe Rust API for CUDA 13.3 logical endpoints.
#![warn(missing_docs)]

pub mod driver;
pub mod error;

pub use driver::{Call, Code, Device, Driver, Limits};
pub use error::{Error, Failed, Result};
#[cfg(feature = "model")]
pub mod model;

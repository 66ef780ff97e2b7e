#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod binding;
pub mod context;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod kernel;
pub mod kind;
pub mod memory;
#[cfg(feature = "model")]
pub mod model;
pub mod range;
pub mod ready;
pub mod sharing;
pub mod spec;
pub mod state;

pub use binding::Binding;
pub use context::Context;
pub use driver::{Call, Code, Device, Driver, Limits, Location};
pub use endpoint::{Endpoint, Readiness};
pub use error::{Error, Failed, Result};
pub use kernel::EndpointRef;
pub use kind::{
    Exportable, ImportedMulticast, ImportedUnicast, Local, Multicast, NoKind, SpreadTeam, Team,
    Unicast,
};
pub use memory::{Allocation, Fabric, Mapped, PosixFd, Private};
pub use range::IdRange;
pub use ready::wait_all;
pub use sharing::FabricHandle;
pub use spec::Spec;
pub use state::{Pending, Ready, Reserved};
pub use typenum;

impl Context {
    /// Reserves `count` contiguous ids (`cuLogicalEndpointIdReserve`, R1).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for 0 (R1.3); [`Error::Unsupported`] on a driver
    /// before 13.3; [`Error::Driver`] (`OUT_OF_MEMORY`).
    pub fn reserve(&self, count: u32) -> Result<IdRange> {
        IdRange::reserve(self, count)
    }

    /// Reserves one id.
    ///
    /// # Errors
    /// As [`Context::reserve`].
    pub fn reserve_one(&self) -> Result<Endpoint<Reserved>> {
        Ok(self.reserve(1)?.first())
    }
}

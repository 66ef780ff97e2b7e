#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod backend;
pub mod binding;
pub mod context;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod guide;
pub mod kernel;
pub mod kind;
pub mod memory;
#[cfg(feature = "model")]
pub mod model;
pub mod probe;
pub mod range;
pub mod ready;
pub mod sharing;
pub mod spec;
pub mod state;

pub use backend::{BackendChoice, Decision, Policy, decide};
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
pub use probe::Capabilities;
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

/// Compile-time proofs of the zero-cost claims: markers are zero-sized, an
/// endpoint is 16 bytes (an `Arc` and the id) in every state, a kernel
/// reference is exactly a `CUlogicalEndpointId`, and owners are not copyable.
mod layout {
    use static_assertions::{
        assert_eq_size, assert_impl_all, assert_not_impl_any, const_assert_eq,
    };

    use super::*;
    use typenum::{U0, U4};

    const_assert_eq!(std::mem::size_of::<Reserved>(), 0);
    const_assert_eq!(std::mem::size_of::<Pending>(), 0);
    const_assert_eq!(std::mem::size_of::<Ready>(), 0);
    const_assert_eq!(std::mem::size_of::<Unicast>(), 0);
    const_assert_eq!(std::mem::size_of::<Multicast<Exportable>>(), 0);
    const_assert_eq!(std::mem::size_of::<Team<U4, U0>>(), 0);
    const_assert_eq!(std::mem::size_of::<Endpoint<Reserved>>(), 16);
    assert_eq_size!(Endpoint<Reserved>, Endpoint<Pending, Team<U4, U0>>);
    assert_eq_size!(Endpoint<Reserved>, Endpoint<Ready, Multicast>);
    assert_eq_size!(Endpoint<Ready, Multicast>, Option<Endpoint<Ready, Multicast>>);
    assert_eq_size!(EndpointRef<'static>, u32);

    assert_not_impl_any!(Endpoint<Reserved>: Clone, Copy);
    assert_not_impl_any!(Endpoint<Pending, Unicast>: Clone, Copy);
    assert_not_impl_any!(Endpoint<Ready, Multicast>: Clone, Copy);
    assert_not_impl_any!(Binding<'static>: Clone, Copy);
    assert_not_impl_any!(Allocation: Clone, Copy);
    assert_impl_all!(EndpointRef<'static>: Copy, Send, Sync);
    // Thread rules: endpoints move between threads and a ready endpoint is
    // shared by one binding thread per device; a binding can be unbound on
    // another thread.
    assert_impl_all!(Endpoint<Pending, Team<U4, U0>>: Send, Sync);
    assert_impl_all!(Endpoint<Ready, Multicast>: Send, Sync);
    assert_impl_all!(Binding<'static>: Send, Sync);
    assert_impl_all!(Allocation<PosixFd>: Send, Sync);
    assert_impl_all!(Mapped: Send, Sync);
    assert_impl_all!(Context: Send, Sync, Clone);
}

#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

// The root holds the lifecycle; every other item is in one public module:
// `backend` (which backend a machine gets), `probe` (what a device supports),
// `error` (the details errors carry), `driver` (for writing backends and
// wrappers), `bootstrap` (byte exchange among ranks), `team` (bring-ups),
// `model` (the reference model), `fabric` (the model fabric), `bounds` (the
// traits behind the typestate's `where` clauses) and `guide` (documentation
// only). The other modules are private and re-exported here.
pub mod backend;
mod binding;
mod context;
mod copy;
mod copy_gate;
pub mod driver;
mod endpoint;
mod erased;
#[path = "error.rs"]
mod errors;
pub mod error {
    //! The details the crate's errors carry, so that callers match on
    //! values, not strings: the [`Rule`] of the driver contract behind a
    //! refusal, the [`Role`] a device lacked, the [`Arg`] that was wrong, the
    //! [`Alignment`] or [`Extent`] it broke, the [`Answer`] a driver gave that
    //! made no sense, the [`Feature`] a driver or backend does not have, and
    //! the [`Failure`] a failed transition boxes. The error type itself,
    //! [`Error`], [`Failed`] and
    //! [`Result`], are at the crate root.
    //!
    //! Every message names the value, the rule and the fix; none formats
    //! through the driver. The predicates
    //! [`Error::is_unsupported`](crate::Error::is_unsupported),
    //! [`Error::is_retryable`](crate::Error::is_retryable) and
    //! [`Error::is_resource_exhausted`](crate::Error::is_resource_exhausted)
    //! answer what callers decide on.

    pub use crate::errors::{Alignment, Answer, Arg, Extent, Failure, Feature, Role, Rule};
    // In the crate, every error item is `crate::error::*`; publicly, these
    // three are at the root only.
    pub(crate) use crate::errors::{Error, Failed, Result};
}
#[cfg(feature = "fabric")]
#[cfg_attr(docsrs, doc(cfg(feature = "fabric")))]
pub mod fabric;
mod graph;
pub mod guide;
mod kernel;
mod kind;
mod memory;
#[cfg(feature = "model")]
#[cfg_attr(docsrs, doc(cfg(feature = "model")))]
pub mod model {
    //! The reference model of the driver contract (crate
    //! `cuda-endpoints-model`): [`Model`], one simulated process of a
    //! simulated fabric of nodes and devices, whose [`Live`] leak counters
    //! and [`Violation`] log tests read; [`faults`] fails calls on demand.
    //! [`Context::model`](crate::Context::model) makes a context over a new
    //! one. The fabric that OS processes share is [`crate::fabric`].
    #[doc(no_inline)]
    pub use cuda_endpoints_model::{
        FabricConfig, FabricLive, Live, MAX_VIOLATIONS, Model, ModelConfig, ShareableKind,
        SimDevice, Violation, faults,
    };
}
mod multicast_mapping;
mod owned;
mod portable;
pub mod probe;
mod range;
mod ready;
mod sharing;
mod spec;
mod state;
mod stream;
mod sync;
pub mod team;
mod unwind;

pub use binding::Binding;
pub use context::Context;
pub use copy::{CanGet, Completed, CopyBatch, InFlight, Strided};
pub use cuda_endpoints_bootstrap as bootstrap;
pub use cuda_endpoints_driver::{Device, Location};
// Crate-private shorthands: these are public at `driver::` only.
pub(crate) use driver::{Call, Code, Limits};
pub use endpoint::{Endpoint, Readiness};
pub use erased::DynEndpoint;
pub use errors::{Error, Failed, Result};
pub use graph::CopyGraph;
pub use kernel::EndpointRef;
pub use kind::{
    Exportable, ImportedMulticast, ImportedUnicast, Local, Multicast, NoKind, SpreadTeam, Team,
    Unicast,
};
pub use memory::{Allocation, FabricShareable, Mapped, PosixFd, Private};
pub use multicast_mapping::MulticastMapping;
pub use owned::BoundEndpoint;
pub use portable::CopyPath;
pub use range::IdRange;
pub use ready::{PendingList, ReadyList, wait_all};
pub use sharing::FabricHandle;
pub use spec::Spec;
pub use state::{Pending, Ready, Reserved, TeamReady};
pub use stream::{Event, Stream};
pub use typenum;

/// The traits behind the typestate's `where` clauses, for code that is
/// generic over states, kinds or memory (`fn f<K: Kind>(ep: &Endpoint<Ready, K>)`).
///
/// All are sealed: they are implemented for this crate's markers only. A
/// call whose bound is not met is a compile error worded by the trait (see
/// [`guide::reading_the_compiler`]).
pub mod bounds {
    pub use crate::binding::UnbindThroughBinding;
    pub use crate::kind::{
        Accepts, CanBind, CanExport, Count, Creatable, Enroll, Enrolled, HasFabricHandles, Kind,
        Sharing, TeamHasRoom, TeamIsComplete, TeamIsNonEmpty, TeamSize,
    };
    pub use crate::memory::{BindSource, MemShare};
    pub use crate::state::{
        Agreed, CanCreate, CanDestroy, CanEnroll, CanQuery, CanRelease, CanShare, IsReady, State,
    };
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
    const_assert_eq!(std::mem::size_of::<TeamReady>(), 0);
    const_assert_eq!(std::mem::size_of::<Unicast>(), 0);
    const_assert_eq!(std::mem::size_of::<Multicast<Exportable>>(), 0);
    const_assert_eq!(std::mem::size_of::<Team<U4, U0>>(), 0);
    const_assert_eq!(std::mem::size_of::<Endpoint<Reserved>>(), 16);
    assert_eq_size!(Endpoint<Reserved>, Endpoint<Pending, Team<U4, U0>>);
    assert_eq_size!(Endpoint<Reserved>, Endpoint<Ready, Multicast>);
    assert_eq_size!(Endpoint<TeamReady, Multicast>, Endpoint<Ready, Multicast>);
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

    // A failed transition is one pointer (issue 22): a transition's
    // `Result<Endpoint<_>, Failed<_>>` is the endpoint's 16 bytes, with no
    // tag (the `Arc`'s niche tells the two apart), whatever the error's size.
    const_assert_eq!(std::mem::size_of::<Failed<Endpoint<Reserved>>>(), 8);
    const_assert_eq!(
        std::mem::size_of::<std::result::Result<Endpoint<Pending, Unicast>, Failed<Endpoint>>>(),
        16
    );
    const_assert_eq!(
        std::mem::size_of::<
            std::result::Result<Endpoint<Ready, Unicast>, Failed<Endpoint<Pending, Unicast>>>,
        >(),
        16
    );
    // `Error` itself stays an enum to match on; pinned so that growing it is
    // a decision (it is what `Result<_, Error>` writes through memory).
    const_assert_eq!(std::mem::size_of::<Error>(), 88);
    // A binding record: `handle_at` in what was padding (an endpoint's
    // heap per id, `benches/readiness_heap.rs`).
    const_assert_eq!(std::mem::size_of::<crate::range::Bound>(), 40);
}

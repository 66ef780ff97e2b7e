#![doc = include_str!("../README.md")]
//!
//! ## The guide's chapters, linked
//!
//! [`guide::lifecycle`], [`guide::copies`], [`guide::threads`],
//! [`guide::reading_the_compiler`], [`guide::sharing`], [`guide::backends`],
//! [`guide::security`], [`guide::guarantees`], [`guide::contract`].
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

// The root holds the lifecycle; every other item is in one public module:
// `backend`, `probe`, `error`, `driver`, `bootstrap`, `team`, `model`,
// `fabric`, `bounds` (the traits behind the typestate's `where` clauses) and
// `guide` (docs only). The other modules are private and re-exported here.
//
// Floors (`ci/floors.sh` reads this table; a module names its folder too): a
// file of src/ imports only its own floor and those below, never in a circle.
// floor 0 words: state kind error unwind driver guide report sync
// floor 1 context: context
// floor 2 ledger: window ledger memory
// floor 3 lifecycle: range id_range endpoint binding ready spec kernel erased owned sharing multicast_mapping
// floor 4 data path: stream copy graph
// floor 5 setup: backend probe
// floor 6 bring-up: team fabric
pub mod backend;
mod binding;
mod context;
mod copy;
pub mod driver;
mod endpoint;
mod erased;
#[path = "error/mod.rs"]
mod errors;
pub mod error {
    //! The details the crate's errors carry, so that callers match on
    //! values, not strings: the [`Rule`] of the driver contract behind a
    //! refusal, the [`Role`] a device lacked, the [`Arg`] that was wrong, the
    //! [`Alignment`] or [`Extent`] it broke, the [`CopyBytes`] two copies
    //! meet in, the [`Answer`] a driver gave that
    //! made no sense, the [`Feature`] a driver or backend does not have, and
    //! the [`Failure`] a failed transition boxes. The error type itself,
    //! [`Error`], [`Failed`] and [`Result`], are at the crate root.
    //!
    //! Every message names the value, the rule and the fix; none formats
    //! through the driver. The predicates
    //! [`Error::is_unsupported`](crate::Error::is_unsupported),
    //! [`Error::is_retryable`](crate::Error::is_retryable) and
    //! [`Error::is_resource_exhausted`](crate::Error::is_resource_exhausted)
    //! answer what callers decide on.

    pub use crate::errors::{
        Alignment, Answer, Arg, ContextPair, CopyBytes, Extent, Failure, Feature, PeerBound, Role,
        Rule,
    };
    // In the crate, every error item is `crate::error::*`; publicly, these
    // three are at the root only.
    pub(crate) use crate::errors::{Error, Failed, Result};
}
#[cfg(feature = "fabric")]
#[cfg_attr(docsrs, doc(cfg(feature = "fabric")))]
pub mod fabric;
mod graph;
pub mod guide;
mod id_range;
mod kernel;
mod kind;
mod ledger;
mod memory;
#[cfg(feature = "model")]
#[cfg_attr(docsrs, doc(cfg(feature = "model")))]
pub mod model {
    //! The reference model of the driver contract (crate
    //! `cuda-endpoints-model`): [`Model`], one simulated process of a
    //! simulated fabric of nodes and devices, whose [`Live`] leak counters
    //! and [`Violation`] log tests read; [`faults`] fails calls on demand.
    //! [`Context::model`](crate::Context::model) makes a context over a new
    //! one. The fabric that OS processes share is module `fabric`
    //! (feature `fabric`).
    #[doc(no_inline)]
    pub use cuda_endpoints_model::{
        FabricConfig, FabricLive, Live, MAX_VIOLATIONS, Model, ModelConfig, ShareableKind,
        SimDevice, Violation, faults,
    };
}
mod multicast_mapping;
mod owned;
pub mod probe;
mod range;
mod ready;
mod report;
mod sharing;
mod spec;
mod state;
mod stream;
mod sync;
pub mod team;
mod unwind;
mod window;

pub use binding::Binding;
pub use context::{Context, CopyPath};
pub use copy::{CanGet, Completed, CopyBatch, InFlight, Route, Strided};
pub use cuda_endpoints_bootstrap as bootstrap;
pub use cuda_endpoints_driver::{Device, Location};
// Crate-private shorthands: these are public at `driver::` only.
pub(crate) use driver::{Call, Code, Limits};
pub use endpoint::{Endpoint, Readiness};
pub use erased::DynEndpoint;
pub use errors::{Error, Failed, Result};
pub use graph::CopyGraph;
pub use id_range::IdRange;
pub use kernel::EndpointRef;
pub use kind::{
    Exportable, FabricShareable, ImportedMulticast, ImportedUnicast, Local, Multicast, NoKind,
    PosixFd, Private, SpreadTeam, Team, Unicast,
};
pub use memory::{Allocation, Mapped};
pub use multicast_mapping::MulticastMapping;
pub use owned::BoundEndpoint;
pub use ready::{PendingList, ReadyList, wait_all};
pub use report::Report;
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
        MemShare, Sharing, TeamHasRoom, TeamIsComplete, TeamIsNonEmpty, TeamSize,
    };
    pub use crate::memory::{BindSource, CopyMemory};
    pub use crate::report::BoxedError;
    pub use crate::spec::TeamDevices;
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
    // A batch and its token hold addresses and keep-alives of their own,
    // never the caller's holder (an `Rc<Mapped>` included: `CopyMemory`).
    assert_impl_all!(CopyBatch<'static>: Send);
    assert_impl_all!(InFlight<'static>: Send);
    assert_impl_all!(Context: Send, Sync, Clone);
    // A thread returns the crate's `Error`; `Report` takes any error, `Send`
    // or not, as `Box<dyn Error>` does (its doc says so).
    assert_impl_all!(Error: Send, Sync);
    assert_not_impl_any!(Report: Send);

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
}

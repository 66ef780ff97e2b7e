//! Lifecycle state markers and the per-method requirement traits.
//!
//! An endpoint is [`Reserved`] (an id, no endpoint: SPEC R1), [`Pending`]
//! (created or imported, construction not yet reported finished: R2.5, R3) or
//! [`Ready`] (a query reported it constructed: R3.1). A team bring-up hands
//! its endpoints out as [`TeamReady`]: ready on this rank, but no agreement
//! yet that every rank bound its memory (R13.3), so no copy goes through
//! them until `agree_bound` says so. The markers are zero-sized and sealed.
//!
//! Every method of `Endpoint` lives in one generic `impl` and names what it
//! needs as a `where` bound on one of the traits below. A call in the wrong
//! state is then an unmet bound (E0277), which carries the message, label and
//! note written here, instead of rustc's uncustomisable "no method found".

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A lifecycle state. Sealed: the four markers below are all there is.
pub trait State: Sealed + Send + Sync + 'static {
    /// Whether an endpoint exists on the id (so `Drop` must destroy it).
    const CREATED: bool;
    /// The marker's name, for messages.
    const NAME: &'static str;
    /// Whether a query reported the endpoint constructed (R3).
    const READY: bool;
}

/// An id reserved with `cuLogicalEndpointIdReserve`, no endpoint on it yet (R1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved;
/// An endpoint created (or imported) whose construction a query has not yet
/// reported finished (R2.5, R3, R9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending;
/// An endpoint a query reported constructed: memory may be bound (R3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready;
/// An endpoint a team bring-up readied on this rank (R3.1), whose ranks have
/// not yet agreed that every one of them bound its memory (R13.3): it binds,
/// exports and destroys as a [`Ready`] one, but copies only through what
/// `agree_bound` hands back (`team::SharedTeam::agree_bound`,
/// `team::Peers::agree_bound`), as an `Endpoint<Ready, _>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TeamReady;

impl Sealed for Reserved {}
impl Sealed for Pending {}
impl Sealed for Ready {}
impl Sealed for TeamReady {}

impl State for Reserved {
    const CREATED: bool = false;
    const NAME: &'static str = "Reserved";
    const READY: bool = false;
}
impl State for Pending {
    const CREATED: bool = true;
    const NAME: &'static str = "Pending";
    const READY: bool = false;
}
impl State for Ready {
    const CREATED: bool = true;
    const NAME: &'static str = "Ready";
    const READY: bool = true;
}
impl State for TeamReady {
    const CREATED: bool = true;
    const NAME: &'static str = "TeamReady";
    const READY: bool = true;
}

/// `create` and `import` need a [`Reserved`] id (R2.1, R9).
#[diagnostic::on_unimplemented(
    message = "this id already holds an endpoint: `create`/`import` need a `Reserved` id, but this endpoint is `{Self}`",
    label = "already holds an endpoint (state `{Self}`)",
    note = "an id holds one endpoint at a time (R2.1): call `.destroy()` first, which hands back the `Endpoint<Reserved>` to create on again, or reserve another id with `ctx.reserve_one()`"
)]
pub trait CanCreate: Sealed {}
impl CanCreate for Reserved {}

/// `release` needs a [`Reserved`] id: no endpoint may remain on it (R1.2).
#[diagnostic::on_unimplemented(
    message = "cannot release the id of a `{Self}` endpoint: the endpoint on it still exists",
    label = "this endpoint is `{Self}`, not `Reserved`",
    note = "ids are released only once empty (R1.2, R7.1): call `.destroy()` first; it hands back the `Endpoint<Reserved>` to release"
)]
pub trait CanRelease: Sealed {}
impl CanRelease for Reserved {}

/// `add_device` needs a [`Pending`] endpoint (R4.3, R4.4).
#[diagnostic::on_unimplemented(
    message = "`add_device` needs a `Pending` team, but this endpoint is `{Self}`",
    label = "team enrollment is not open in state `{Self}`",
    note = "enroll devices between `.create(Spec::team(..))` and `.wait(..)`: a `Reserved` id has no team yet (call `.create(spec)` first), and a `Ready` team is closed for good (R4.3, R4.4): to change it, `.destroy()` it and create a new team"
)]
pub trait CanEnroll: Sealed {}
impl CanEnroll for Pending {}

/// `poll` and `wait` need a [`Pending`] endpoint (R3).
#[diagnostic::on_unimplemented(
    message = "`poll`/`wait` needs a `Pending` endpoint, but this endpoint is `{Self}`",
    label = "nothing to wait for in state `{Self}`",
    note = "a `Reserved` id has no endpoint yet: call `.create(spec)` or `.import(&handle)` first and wait on what it returns; a `Ready` endpoint needs no more waiting: use it as it is (R3)"
)]
pub trait CanQuery: Sealed {}
impl CanQuery for Pending {}

/// Binding, copies, kernel references and export need a [`Ready`] endpoint (R3.1, R5.1).
#[diagnostic::on_unimplemented(
    message = "the endpoint is not ready: binding memory, copies and `kernel_ref` need a `Ready` endpoint, but this endpoint is `{Self}`",
    label = "state `{Self}`, not `Ready`",
    note = "call `.wait(timeout)` (or `.poll()`) first and use the `Endpoint<Ready, _>` it returns; a `Reserved` id needs `.create(spec)` before that, and a `Spec::team(..)` team needs every device of the team enrolled with `.add_device(dev)` before it can be waited for (R3.2). A copy through a bring-up's endpoint (`TeamReady`) needs the ranks' `agree_bound` too (R13.3). Using an endpoint before a query reported it constructed is undefined behaviour in the driver (R3.1, R3.4, R5.1)"
)]
pub trait IsReady: Sealed {}
impl IsReady for Ready {}
impl IsReady for TeamReady {}

/// A copy through an endpoint (`CopyBatch::put`, `get`, `put_host`,
/// `get_host`) needs no every-rank agreement pending: every state but
/// [`TeamReady`], whose ranks have not yet agreed that every rank bound its
/// memory (R13.3). (Whether the state is ready is [`IsReady`]'s question.)
#[diagnostic::on_unimplemented(
    message = "no copy through a team's endpoint before its ranks agreed that every rank bound its memory (R13.3): this endpoint is `{Self}`",
    label = "the bring-up's endpoint, before `agree_bound`",
    note = "bind this rank's memory on the team's endpoint, then call `team.agree_bound(&boot, timeout)?` on every rank (`peers.agree_bound(..)` for `team::unicast_peers`) and copy through the endpoints of what it returns: `bound.endpoint()`, `bound.own()`, `bound.peer(rank)`; to own the team's endpoint, `team.into_bound([(dev, offset, mem)], &boot, timeout)?` binds and agrees in one call. A copy before every rank bound is undefined behaviour in the driver (R13.3)"
)]
pub trait Agreed: Sealed {}
#[diagnostic::do_not_recommend]
impl Agreed for Reserved {}
#[diagnostic::do_not_recommend]
impl Agreed for Pending {}
#[diagnostic::do_not_recommend]
impl Agreed for Ready {}

/// `destroy` needs an endpoint on the id (R7).
#[diagnostic::on_unimplemented(
    message = "`destroy` needs a created endpoint, but this id is `{Self}`",
    label = "no endpoint to destroy in state `{Self}`",
    note = "a `Reserved` id holds no endpoint: give it back with `.release()`, or create on it with `.create(spec)` (R1, R7)"
)]
pub trait CanDestroy: Sealed {}
impl CanDestroy for Pending {}
impl CanDestroy for Ready {}
impl CanDestroy for TeamReady {}

/// `export` needs an endpoint on the id (R8). Pending is enough: a team
/// spread over processes is exported before it is complete, so that the
/// other ranks can import it and enroll their devices (R3.2, R4, R9).
#[diagnostic::on_unimplemented(
    message = "`export` needs a created endpoint, but this id is `{Self}`",
    label = "no endpoint to export in state `{Self}`",
    note = "create it first from an exportable spec: `.create(Spec::unicast(dev, bytes).exportable())` (R8, R8.1)"
)]
pub trait CanShare: Sealed {}
impl CanShare for Pending {}
impl CanShare for Ready {}
impl CanShare for TeamReady {}

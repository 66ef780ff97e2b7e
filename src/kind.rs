//! Endpoint kind markers: unicast or multicast, how a multicast team is
//! enrolled, whether the endpoint is exportable or imported, and the traits
//! that let the compiler check team size (typenum), enrollment and which
//! memory may be bound (SPEC R2.2, R3.2, R4, R5.6, R5.7, R8.1); and the
//! shareable handle types of memory ([`MemShare`]: [`Private`], [`PosixFd`],
//! [`FabricShareable`]), which those traits name.
//!
//! Team counting bounds the typenum *boolean* results (`Le<E, N>`, `Eq<E, N>`)
//! with traits implemented for `B1` only, so a misuse reads "not implemented
//! for `B0`" and never prints a binary `UInt<..>` type.

use std::marker::PhantomData;
use std::ops::Add;

use typenum::{
    Add1, B1, Eq, Gr, IsEqual, IsGreater, IsLess, Le, Min, Minimum, U0, UInt, UTerm, Unsigned,
};

use crate::driver::handle_bits;
use crate::state::{Pending, Ready, Reserved, Sealed};

/// Whether an endpoint is created with fabric IPC handles (R2.4, R8).
pub trait Sharing: Sealed + Send + Sync + 'static {
    /// `FABRIC` in `ipcHandleTypes`.
    const FABRIC: bool;
}

/// Created without IPC handles: cannot be exported; binds any memory.
#[derive(Debug)]
pub struct Local;
/// Created with `FABRIC` IPC handles: can be exported (R8); binds only
/// externally shareable memory (R5.6).
#[derive(Debug)]
pub struct Exportable;
impl Sealed for Local {}
impl Sealed for Exportable {}
impl Sharing for Local {
    const FABRIC: bool = false;
}
impl Sharing for Exportable {
    const FABRIC: bool = true;
}

/// The shareable handle type of an allocation. Sealed.
pub trait MemShare: Sealed + Send + Sync + 'static {
    /// `CUmemAllocationHandleType` bits requested at `cuMemCreate`.
    const BITS: u32;
    /// The name, for messages.
    const NAME: &'static str;
}

/// No shareable handle: this process only (`CU_MEM_HANDLE_TYPE_NONE`).
#[derive(Debug)]
pub struct Private;
/// Shareable as a POSIX file descriptor, within one node.
#[derive(Debug)]
pub struct PosixFd;
/// Shareable as a fabric handle, across nodes (needs the fabric daemon).
#[derive(Debug)]
pub struct FabricShareable;
impl Sealed for Private {}
impl Sealed for PosixFd {}
impl Sealed for FabricShareable {}
impl MemShare for Private {
    const BITS: u32 = handle_bits::NONE;
    const NAME: &'static str = "Private";
}
impl MemShare for PosixFd {
    const BITS: u32 = handle_bits::POSIX_FD;
    const NAME: &'static str = "PosixFd";
}
impl MemShare for FabricShareable {
    const BITS: u32 = handle_bits::FABRIC;
    const NAME: &'static str = "FabricShareable";
}

/// What kind of endpoint sits on an id. Sealed.
pub trait Kind: Sealed + Send + Sync + 'static {
    /// For messages and `Debug`.
    const NAME: &'static str;
    /// `MULTICAST` (else `UNICAST`).
    const MULTICAST: bool;
    /// `B1` when readiness may be waited for now; `B0` for a compile-time team
    /// that still has devices to enroll (R3.2).
    type Complete;
    /// The kind once ready: team counts are erased (a complete team is an
    /// ordinary multicast endpoint).
    type Ready: Kind;
    /// How the endpoint came to this process, in a name that reads well in a
    /// compile error: [`Local`] or [`Exportable`] (created from a spec with or
    /// without `.exportable()`), [`ImportedUnicast`] or [`ImportedMulticast`].
    /// Only `Exportable` has a fabric handle to export (R8.1).
    type Origin;
}

/// No endpoint yet: the kind of a [`crate::Reserved`] id.
#[derive(Debug)]
pub struct NoKind;

/// A unicast endpoint: one owner device (R2.2).
pub struct Unicast<X = Local>(PhantomData<X>);

/// A multicast endpoint whose team was enrolled in full by `create` (a team
/// known at run time), or any multicast endpoint once ready.
pub struct Multicast<X = Local>(PhantomData<X>);

/// A multicast endpoint whose team size `N` is known at compile time, with `E`
/// devices enrolled so far (typenum numbers). Waiting before `E == N` and
/// enrolling past `N` do not compile (R3.2, R4.2).
pub struct Team<N, E = U0, X = Local>(PhantomData<(N, E, X)>);

/// A multicast team spread over processes: each process enrolls its own
/// devices, so completeness is a run-time fact that only a query reveals (R3.2).
pub struct SpreadTeam<X = Local>(PhantomData<X>);

/// A unicast endpoint imported from another process: binds no memory (R5.7).
#[derive(Debug)]
pub struct ImportedUnicast;

/// A multicast endpoint imported from another process: binds only externally
/// shareable memory (R5.6).
#[derive(Debug)]
pub struct ImportedMulticast;

impl Sealed for NoKind {}
impl<X> Sealed for Unicast<X> {}
impl<X> Sealed for Multicast<X> {}
impl<N, E, X> Sealed for Team<N, E, X> {}
impl<X> Sealed for SpreadTeam<X> {}
impl Sealed for ImportedUnicast {}
impl Sealed for ImportedMulticast {}

impl Kind for NoKind {
    const NAME: &'static str = "no kind";
    const MULTICAST: bool = false;
    type Complete = B1;
    type Ready = NoKind;
    type Origin = NoKind;
}
impl<X: Sharing> Kind for Unicast<X> {
    const NAME: &'static str = "unicast";
    const MULTICAST: bool = false;
    type Complete = B1;
    type Ready = Unicast<X>;
    type Origin = X;
}
impl<X: Sharing> Kind for Multicast<X> {
    const NAME: &'static str = "multicast";
    const MULTICAST: bool = true;
    type Complete = B1;
    type Ready = Multicast<X>;
    type Origin = X;
}
impl<N, E, X> Kind for Team<N, E, X>
where
    N: Unsigned + Send + Sync + 'static,
    E: Unsigned + IsEqual<N> + Send + Sync + 'static,
    X: Sharing,
{
    const NAME: &'static str = "multicast team";
    const MULTICAST: bool = true;
    type Complete = Eq<E, N>;
    type Ready = Multicast<X>;
    type Origin = X;
}
impl<X: Sharing> Kind for SpreadTeam<X> {
    const NAME: &'static str = "spread multicast team";
    const MULTICAST: bool = true;
    type Complete = B1;
    type Ready = Multicast<X>;
    type Origin = X;
}
impl Kind for ImportedUnicast {
    const NAME: &'static str = "imported unicast";
    const MULTICAST: bool = false;
    type Complete = B1;
    type Ready = ImportedUnicast;
    type Origin = ImportedUnicast;
}
impl Kind for ImportedMulticast {
    const NAME: &'static str = "imported multicast";
    const MULTICAST: bool = true;
    type Complete = B1;
    type Ready = ImportedMulticast;
    type Origin = ImportedMulticast;
}

/// Readiness may be waited for only once every team device is enrolled (R3.2).
#[diagnostic::on_unimplemented(
    message = "this multicast team is not complete: `wait`, `poll` and `wait_all` need every team device enrolled",
    label = "devices are still missing from this team",
    note = "call `.add_device(dev)` for every device of the team still missing, then wait: a `Spec::team(..)` team takes exactly as many devices as its size, all enrolled by this process, and its construction cannot finish before the whole team is in (R3.2, R4.4); for a team spread over processes use `Spec::spread(n, bytes)`"
)]
pub trait TeamIsComplete {}
#[diagnostic::do_not_recommend]
impl TeamIsComplete for B1 {}

/// A team enrolls at most its size (R4.2).
#[diagnostic::on_unimplemented(
    message = "this multicast team is already complete: it has no room for another device",
    label = "one `add_device` too many",
    note = "a team holds exactly the size given to `Spec::team(..)` (R4.2): drop this call, or create the endpoint with a larger team"
)]
pub trait TeamHasRoom {}
#[diagnostic::do_not_recommend]
impl TeamHasRoom for B1 {}

/// A team has at least one device (R2.2).
#[diagnostic::on_unimplemented(
    message = "a multicast team needs at least one device, but this team size is zero",
    label = "team size 0",
    note = "give the team size as a non-zero typenum value, e.g. `Spec::team(U4::new(), bytes)` (R2.2)"
)]
pub trait TeamIsNonEmpty {}
#[diagnostic::do_not_recommend]
impl TeamIsNonEmpty for B1 {}

/// A compile-time team size: a typenum unsigned number. Bound used by
/// `Spec::team`. Sealed: the team's count is the type itself.
///
/// ```
/// use cuda_endpoints::bounds::{TeamIsNonEmpty, TeamSize};
/// use cuda_endpoints::{Spec, Team, typenum::U4};
///
/// // Generic over the size: the count is the size's own type.
/// fn team_of<N: TeamSize<Count = N>>(size: N) -> Spec<Team<N>>
/// where
///     N::NonEmpty: TeamIsNonEmpty,
/// {
///     Spec::team(size, 2 << 20)
/// }
/// let _: Spec<Team<U4>> = team_of(U4::new());
/// ```
///
/// No other crate implements it, so no size claims a count other than its
/// own (a team of 4 counted as 2 would let `wait` compile on a team the
/// driver still counts incomplete):
///
/// ```compile_fail,E0277
/// use cuda_endpoints::bounds::TeamSize;
/// use cuda_endpoints::typenum::{B1, U2};
/// struct Liar;
/// impl TeamSize for Liar {
///     const SIZE: u32 = 4;
///     type NonEmpty = B1;
///     type Count = U2;
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "the team size must be a typenum number such as `U4::new()`, not `{Self}`",
    label = "not a typenum number",
    note = "write `Spec::team(U4::new(), bytes)` (`use cuda_endpoints::typenum::U4;`) for a team counted by the compiler, or `Spec::multicast(&devices, bytes)` for a team known only at run time"
)]
pub trait TeamSize: Sealed + Send + Sync + 'static {
    /// The number.
    const SIZE: u32;
    /// `B1` when the size is not zero (R2.2).
    type NonEmpty;
    /// The number itself (`Self`): what `Spec::team` makes its team of, so
    /// that a size that is not a number leaves the team's count unknown and
    /// rustc stops at the first error (not six more from inside typenum).
    /// Code generic over the size writes `N: TeamSize<Count = N>` to get a
    /// `Spec<Team<N>>` from `Spec::team(size, bytes)`.
    type Count;
}
// On typenum's two shapes of number rather than on every `N`: a size of
// another type (`Spec::team(4, bytes)`) then matches no impl, and rustc
// stops at this trait's error.
impl<U, B> Sealed for UInt<U, B> {}
impl Sealed for UTerm {}
#[diagnostic::do_not_recommend]
impl<U, B> TeamSize for UInt<U, B>
where
    UInt<U, B>: Unsigned + IsGreater<U0> + Send + Sync + 'static,
{
    // `numDevices` is a `u32` (R2.2): a larger size is a compile error, not
    // a silent truncation.
    const SIZE: u32 = if <Self as Unsigned>::U64 > u32::MAX as u64 {
        panic!(
            "a multicast team has at most u32::MAX (4294967295) devices: `numDevices` is a u32 (R2.2)"
        )
    } else {
        <Self as Unsigned>::U32
    };
    type NonEmpty = Gr<Self, U0>;
    type Count = Self;
}
// Zero: a number, refused by `TeamIsNonEmpty` with its own words (R2.2).
#[diagnostic::do_not_recommend]
impl TeamSize for UTerm {
    const SIZE: u32 = 0;
    type NonEmpty = Gr<UTerm, U0>;
    type Count = UTerm;
}

/// Kinds that enroll devices one at a time with `add_device` (R4), for an
/// endpoint in state `S`. Outside `Pending` every kind implements it
/// trivially: the state bound (`CanEnroll`) refuses the call there.
#[diagnostic::on_unimplemented(
    message = "`add_device` is only for teams enrolled device by device (`Spec::team`, `Spec::spread`); a `{Self}` endpoint takes no devices after `create`",
    label = "no device can be added to this endpoint",
    note = "a unicast endpoint has one device, its owner, fixed by `Spec::unicast(owner, ..)` (R4.1); a `Spec::multicast(&devices, ..)` team is enrolled in full by `create`: list every device there, or create with `Spec::team(size, ..)` (a typenum size such as `U2::new()`) to add them one by one (R4)"
)]
pub trait Enroll<S = Pending>: Kind {
    /// The kind after one more device.
    type Next: Kind;
    /// `B1` while the team has room (R4.2).
    type HasRoom;
}
// Outside `Pending` the state bound (`CanEnroll`) already refuses
// `add_device`: these impls add nothing, so that the compiler reports that one
// error instead of a second one about the kind.
#[diagnostic::do_not_recommend]
impl<K: Kind> Enroll<Reserved> for K {
    type Next = K;
    type HasRoom = B1;
}
#[diagnostic::do_not_recommend]
impl<K: Kind> Enroll<Ready> for K {
    type Next = K;
    type HasRoom = B1;
}
impl<N: Count, E: Enrolled<N>, X: Sharing> Enroll for Team<N, E, X> {
    type Next = Team<N, E::Next, X>;
    type HasRoom = E::HasRoom;
}

/// A typenum number, as team sizes and enrollment counts are.
pub trait Count: Unsigned + Send + Sync + 'static {}
impl<N: Unsigned + Send + Sync + 'static> Count for N {}

/// The typenum arithmetic of one more enrollment in a team of `N`, kept out
/// of the `Enroll` impl so that rustc's list of kinds that enroll (printed
/// under a misuse) shows a one-line impl, not typenum bounds.
pub trait Enrolled<N>: Count + IsEqual<N> {
    /// One more device.
    type Next: Count + IsEqual<N>;
    /// `B1` while the team has room (R4.2).
    type HasRoom;
}
// `Next` saturates at `N`: past a refused `add_device` (no room) the team
// still counts as complete, so that one misuse gives one error, not a second
// one ("not complete") from a later `wait` that contradicts it.
impl<N, E> Enrolled<N> for E
where
    N: Count,
    E: Count + IsEqual<N> + IsLess<N> + Add<B1>,
    Add1<E>: Min<N>,
    Minimum<Add1<E>, N>: Count + IsEqual<N>,
{
    type Next = Minimum<Add1<E>, N>;
    type HasRoom = Le<E, N>;
}
impl<X: Sharing> Enroll for SpreadTeam<X> {
    type Next = SpreadTeam<X>;
    type HasRoom = B1;
}
/// An importing process enrolls its own devices in the team (R4, R9).
impl Enroll for ImportedMulticast {
    type Next = ImportedMulticast;
    type HasRoom = B1;
}

/// Kinds that a spec creates; `exportable()` maps to the fabric variant.
pub trait Creatable: Kind {
    /// The same kind with `FABRIC` IPC handles.
    type Exportable: Kind;
    /// The kind of a team known at compile time (`Team<N, U0, X>`)? Its size.
    const STATIC_TEAM: Option<u32>;
}
impl<X: Sharing> Creatable for Unicast<X> {
    type Exportable = Unicast<Exportable>;
    const STATIC_TEAM: Option<u32> = None;
}
impl<X: Sharing> Creatable for Multicast<X> {
    type Exportable = Multicast<Exportable>;
    const STATIC_TEAM: Option<u32> = None;
}
impl<N, X> Creatable for Team<N, U0, X>
where
    N: Unsigned + Send + Sync + 'static,
    U0: IsEqual<N>,
    X: Sharing,
{
    type Exportable = Team<N, U0, Exportable>;
    const STATIC_TEAM: Option<u32> = Some(N::U32);
}
impl<X: Sharing> Creatable for SpreadTeam<X> {
    type Exportable = SpreadTeam<Exportable>;
    const STATIC_TEAM: Option<u32> = None;
}

/// Whether an endpoint has a fabric handle to export (R8.1), asked of the
/// kind's [`Kind::Origin`] so that the message names `Local` or
/// `ImportedUnicast` rather than the whole kind (a compile-time team's kind
/// holds typenum numbers).
#[diagnostic::on_unimplemented(
    message = "`export` needs an endpoint created with fabric handles (`.exportable()`), but this endpoint is `{Self}`",
    label = "no fabric handle to export",
    note = "create it from a spec with `.exportable()`, e.g. `Spec::unicast(dev, bytes).exportable()` or `Spec::team(size, bytes).exportable()` (FABRIC in `ipcHandleTypes`, R8.1); an imported endpoint cannot be exported again: pass on the handle it was imported from"
)]
pub trait HasFabricHandles {}
impl HasFabricHandles for Exportable {}
// A `Reserved` id is refused by its state (`CanShare`); this impl only keeps
// the compiler from adding a second error about the kind.
#[diagnostic::do_not_recommend]
impl HasFabricHandles for NoKind {}

/// Kinds whose endpoints can be exported with a fabric handle (R8.1): exactly
/// those created with fabric handles.
#[diagnostic::on_unimplemented(
    message = "`FabricHandle` needs a kind created with fabric handles (`Exportable`), but `{Self}` is not one",
    label = "not a kind with fabric handles",
    note = "name the kind the exporter had, `Exportable` included: `FabricHandle::<SpreadTeam<Exportable>>` for what `team::multicast` shares or `Spec::spread(..).exportable()` makes, `FabricHandle::<Unicast<Exportable>>` for `Spec::unicast(..).exportable()`, `FabricHandle::<Multicast<Exportable>>` for `Spec::multicast(..).exportable()` (R8.1)"
)]
pub trait CanExport: Kind<Origin = Exportable> {
    /// The kind an importer gets.
    type Imported: Kind;
    /// Tag on the wire.
    const WIRE: u8;
}
impl CanExport for Unicast<Exportable> {
    type Imported = ImportedUnicast;
    const WIRE: u8 = 1;
}
impl CanExport for Multicast<Exportable> {
    type Imported = ImportedMulticast;
    const WIRE: u8 = 2;
}
impl CanExport for SpreadTeam<Exportable> {
    type Imported = ImportedMulticast;
    const WIRE: u8 = 2;
}
impl<N, E> CanExport for Team<N, E, Exportable>
where
    Team<N, E, Exportable>: Kind<Origin = Exportable>,
{
    type Imported = ImportedMulticast;
    const WIRE: u8 = 2;
}

/// Kinds that accept memory at all (R5.7).
#[diagnostic::on_unimplemented(
    message = "an imported unicast endpoint accepts no memory: binding on it is not allowed",
    label = "`{Self}` endpoints cannot bind",
    note = "only the owner's process binds a unicast endpoint (R5.7): bind on the endpoint you exported from, and use this one from kernels"
)]
pub trait CanBind: Kind {}
impl<X: Sharing> CanBind for Unicast<X> {}
impl<X: Sharing> CanBind for Multicast<X> {}
impl CanBind for ImportedMulticast {}
// A team is never `Ready` under its own kind (`wait` erases it to
// `Multicast`), so `bind` on it is always refused by its state (`IsReady`):
// these impls add nothing, so that the compiler reports that one true error
// and no second one about the kind (whose name holds typenum numbers).
#[diagnostic::do_not_recommend]
impl<N, E, X> CanBind for Team<N, E, X> where Team<N, E, X>: Kind {}
#[diagnostic::do_not_recommend]
impl<N, E, X, H: MemShare> Accepts<H> for Team<N, E, X> where Team<N, E, X>: Kind {}
// Likewise a spread team; but its name reads well, so it keeps the memory
// rule of its sharing (R5.6) and a pending exportable spread team given
// `Private` memory hears both true errors at once.
// (`do_not_recommend` also keeps these impls out of the list of kinds that
// bind, which rustc prints under the R5.7 error: none binds while pending.)
#[diagnostic::do_not_recommend]
impl<X: Sharing> CanBind for SpreadTeam<X> {}
impl<H: MemShare> Accepts<H> for SpreadTeam<Local> {}
impl Accepts<PosixFd> for SpreadTeam<Exportable> {}
impl Accepts<FabricShareable> for SpreadTeam<Exportable> {}
// A `Reserved` id (`NoKind`) never becomes `Ready`, and `bind` refuses it by
// its state (`IsReady`): these impls add nothing, so that the compiler reports
// that one error instead of two more about the kind.
#[diagnostic::do_not_recommend]
impl CanBind for NoKind {}
#[diagnostic::do_not_recommend]
impl<H: MemShare> Accepts<H> for NoKind {}

/// Which memory a kind accepts (R5.6).
#[diagnostic::on_unimplemented(
    message = "`{H}` memory cannot be bound here: this `{Self}` endpoint takes only externally shareable memory",
    label = "`{H}` allocations are not shareable",
    note = "exportable endpoints (unicast or multicast), imported multicast endpoints and the team endpoints a bring-up shares among ranks accept only allocations made with a shareable handle type (R5.6): allocate with `FabricShareable` (any node; after a bring-up, agree with `agree_bound`) or `PosixFd` (one node; after a bring-up, agree with `agree_bound_fds`, not `agree_bound`) instead of `Private`"
)]
pub trait Accepts<H: MemShare>: Kind {}
impl<H: MemShare> Accepts<H> for Unicast<Local> {}
impl<H: MemShare> Accepts<H> for Multicast<Local> {}
impl<H: MemShare> Accepts<H> for ImportedUnicast {}
impl Accepts<PosixFd> for Unicast<Exportable> {}
impl Accepts<FabricShareable> for Unicast<Exportable> {}
impl Accepts<PosixFd> for Multicast<Exportable> {}
impl Accepts<FabricShareable> for Multicast<Exportable> {}
impl Accepts<PosixFd> for ImportedMulticast {}
impl Accepts<FabricShareable> for ImportedMulticast {}

//! [`SharedMulticast`]: the kind every rank holds after a multicast bring-up,
//! the creator and the importers alike, so that `if rank == root { … } else
//! { … }` needs no generic function over kinds.

use typenum::B1;

use crate::kind::{Accepts, CanBind, Enroll, Kind};
use crate::kind::{FabricShareable, PosixFd};
use crate::state::Sealed;

/// A multicast endpoint shared by the ranks of a job: created by the root,
/// imported by the others, each rank's own devices enrolled (R4, R9). It binds
/// only externally shareable memory (`PosixFd`, `FabricShareable`; R5.6), on the
/// devices this rank enrolled (R5.2).
#[derive(Debug)]
pub struct SharedMulticast;

impl Sealed for SharedMulticast {}
impl Kind for SharedMulticast {
    const NAME: &'static str = "shared multicast";
    const MULTICAST: bool = true;
    type Complete = B1;
    type Ready = SharedMulticast;
    type Origin = SharedMulticast;
}
impl Enroll for SharedMulticast {
    type Next = SharedMulticast;
    type HasRoom = B1;
}
impl CanBind for SharedMulticast {}
impl Accepts<PosixFd> for SharedMulticast {}
impl Accepts<FabricShareable> for SharedMulticast {}

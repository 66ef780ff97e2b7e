//! Bindings as the ledger records them: each live binding with where it
//! starts in its allocation ([`Bound`]), in its id's [`Slot`] behind the
//! range's lock, and the questions the copy checks ask of them.

use smallvec::SmallVec;

use crate::driver::Device;

/// A live binding as the endpoint remembers it. Its device and offset name
/// it: live bindings on one device never overlap (R5.9, checked and recorded
/// under the lock before the driver call).
pub(crate) struct Bound {
    pub dev: Device,
    pub offset: u64,
    pub size: u64,
    /// The memory bound, kept alive until unbound or destroyed (R7.2).
    /// `None` for raw binds, whose memory the caller keeps alive.
    pub _keep: Option<crate::memory::KeepAlive>,
    /// A bind by handle: where in its allocation, in units of the
    /// endpoint's bind alignment ([`Bound::BY_ADDRESS`] for a bind by
    /// address, whose window says where). In the record's padding: F3
    /// tells apart two binds of one allocation by it.
    pub handle_at: u32,
}

// A binding record: `handle_at` in what was padding (an endpoint's heap
// per id, `benches/readiness_heap.rs`); pinned so that growing it is a
// decision.
const _: () = assert!(std::mem::size_of::<Bound>() == 40);

impl Bound {
    /// [`Bound::handle_at`] of a bind by address (or one whose offset
    /// does not fit: 2^32 alignment units into the allocation).
    pub const BY_ADDRESS: u32 = u32::MAX;
}

/// Per-id bookkeeping that bindings change through a shared endpoint,
/// behind the range's lock. One binding inline (the usual case; a second
/// one moves the list to the heap), so that a record stays small in ranges
/// of many ids.
#[derive(Default)]
pub(crate) struct Slot {
    pub bindings: SmallVec<[Bound; 1]>,
}

impl Slot {
    /// Back to an empty id, in place; returns the bindings so that the memory
    /// they keep alive is dropped by the caller, outside the lock.
    pub fn reset(&mut self) -> SmallVec<[Bound; 1]> {
        std::mem::take(&mut self.bindings)
    }
}

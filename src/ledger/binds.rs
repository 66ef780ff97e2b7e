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
    /// does not fit: 2^32 - 2 alignment units into the allocation or more,
    /// the two highest values being the sentinels).
    pub const BY_ADDRESS: u32 = u32::MAX;
    /// [`Bound::handle_at`] of a bind or unbind whose driver call unwound:
    /// the driver may or may not hold the bytes. The record keeps its
    /// extent and its memory until the endpoint is destroyed: another bind
    /// over those bytes is refused (R5.9, the driver may hold them) and no
    /// copy passes F9 on them ([`Bound::covers`]: it may not).
    pub const UNWOUND: u32 = u32::MAX - 1;

    /// Whether the record's bytes are known bound: a copy may go there.
    #[inline(always)]
    pub fn covers(&self) -> bool {
        self.handle_at != Bound::UNWOUND
    }

    /// The call behind the record unwound ([`Bound::UNWOUND`]).
    pub fn mark_unwound(&mut self) {
        self.handle_at = Bound::UNWOUND;
    }
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

/// A bind by handle in its allocation's bytes: `(endpoint offset, size,
/// the allocation's identity, offset in the allocation)`.
pub(crate) type HandleSpan = (u64, u64, u64, u64);

impl Bound {
    /// Whether this is a bind by handle that covers bytes (not a record
    /// whose bind or unbind unwound: the two sentinels are the highest).
    fn is_by_handle(&self) -> bool {
        self.handle_at < Bound::UNWOUND
    }
}

/// The questions the copy checks ask of an id's bindings (read with the
/// range's lock held, through a [`super::SlotGuard`]).
impl Slot {
    /// Where the bindings on `dev` are: `(offset, size)` of each, in the
    /// order they were made.
    #[inline]
    pub fn spans(&self, dev: Device) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.bindings
            .iter()
            .filter(move |b| b.dev == dev && b.covers())
            .map(|b| (b.offset, b.size))
    }

    /// How many of the bindings are by handle (F3: two endpoint spans may
    /// be one allocation's bytes only then).
    #[inline]
    pub fn by_handle(&self) -> usize {
        self.bindings.iter().filter(|b| b.is_by_handle()).count()
    }

    /// Where each bind by handle is in its allocation, for F3: facts
    /// recorded at bind time (the allocation the record keeps, and
    /// [`Bound::handle_at`]), never reference counts, so that two binds of
    /// one allocation are known as such whoever else holds it (its owner
    /// dropped, the bindings forgotten). `align`: the endpoint's bind
    /// alignment.
    pub fn handle_spans(&self, align: u64) -> Vec<HandleSpan> {
        let mut out = Vec::new();
        for b in self.bindings.iter().filter(|b| b.is_by_handle()) {
            let alloc = b._keep.as_ref().and_then(|k| k.allocation());
            let at = u64::from(b.handle_at).checked_mul(align);
            if let (Some(alloc), Some(at)) = (alloc, at) {
                out.push((b.offset, b.size, alloc.get(), at));
            }
        }
        out
    }
}

//! Reserved id ranges (rule R1). A range is shared by every endpoint made from
//! it and released, in one `cuLogicalEndpointIdRelease`, when the last of them
//! is gone, so "destroy before release" (R1.2) holds by construction.
//!
//! The range also keeps each id's bookkeeping: what the endpoint is
//! (`Facts`: its size, bind alignment and devices, read without a lock) and
//! the live bindings with the memory they keep alive (`Slot`, R7.2), behind
//! one lock per range, with the fabric handles of its attached ids.
//!
//! An id's record is 96 bytes, allocated once per range at its exact count,
//! so that 100 000 endpoints in one range cost 112 bytes of heap each with
//! their `Endpoint`s (`benches/readiness_heap.rs` counts them).

use std::any::Any;
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::kind::NoKind;
use crate::state::Reserved;
use crate::unwind::OnUnwind;

/// A live binding as the endpoint remembers it. Its device and offset name
/// it: live bindings on one device never overlap (R5.9, checked and recorded
/// under the lock before the driver call).
pub(crate) struct Bound {
    pub dev: Device,
    pub offset: u64,
    pub size: u64,
    /// The memory bound, kept alive until unbound or destroyed (R7.2).
    /// `None` for raw binds, whose memory the caller keeps alive.
    pub _keep: Option<Arc<dyn Any + Send + Sync>>,
    /// A bind by handle: where in its allocation, in units of the
    /// endpoint's bind alignment ([`Bound::BY_ADDRESS`] for a bind by
    /// address, whose window says where). In the record's padding: F3
    /// tells apart two binds of one allocation by it.
    pub handle_at: u32,
}

impl Bound {
    /// [`Bound::handle_at`] of a bind by address (or one whose offset
    /// does not fit: 2^32 alignment units into the allocation).
    pub const BY_ADDRESS: u32 = u32::MAX;
}

/// What the endpoint on one id is: fixed by the transitions that make it
/// (create, import, add_device) and cleared by destroy.
///
/// Kept outside the slot's lock: only the one [`Endpoint`] holding the id
/// writes it, through `&mut` (its consuming transitions and its `Drop`), and
/// reads go through `&Endpoint`, so the borrow rules of the endpoint are
/// those of its facts and the getters neither lock nor allocate.
#[derive(Default)]
pub(crate) struct Facts {
    /// Bytes per device (R2.3).
    pub size: u64,
    /// `bindAlignment` (R5.3).
    pub align: u64,
    /// Owner (unicast) or enrolled team devices in this process (multicast).
    pub devices: SmallVec<[Device; 4]>,
    /// Team size (multicast), 1 for unicast.
    pub team_size: u32,
    /// Created (or, in a team bring-up, agreed) with `COUNTED_OPS`: every
    /// device enrolled later needs attribute 155 (R2.4).
    pub counted_ops: bool,
    /// Exportable (created with FABRIC, or imported by a fabric handle):
    /// every device enrolled later needs FABRIC in attribute 158 (13.5).
    pub exportable: bool,
    /// An endpoint whose destroy failed (after a failed create, from `Drop`,
    /// or a driver call that panicked): destroy it before the id is used or
    /// released. Only the id's owner sets it, so no lock is needed.
    pub orphaned: bool,
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

/// What the range's lock guards besides the slots: the fabric handle of each
/// attachment (exported or imported id), which the context refuses to attach
/// a second time (R9). Few ids of a range have one, so they are a list, not
/// a field of every record.
#[derive(Default)]
struct Attachments {
    fabric: Vec<(u32, [u8; 64])>,
    /// The portable path's windows of each id (`crate::portable`): few ids
    /// have one, so a list beside the fabric handles, not a record field.
    windows: Vec<(u32, crate::portable::Window)>,
    /// The heap top of each id of an [`crate::team::OwnedPeers`]: the bytes
    /// every rank bound and agreed on, past which copies are refused before
    /// the driver (R13.3). Set and cleared by the heap that owns the ids.
    agreed: Vec<(u32, u64)>,
}

/// The slot of one id, with the range's lock held. The lock is the whole
/// range's: hold one guard at a time, never across a driver call or a drop
/// of kept-alive memory (as every caller does), or a second one on the same
/// thread would wait for ever.
pub(crate) struct SlotGuard<'a> {
    shared: MutexGuard<'a, Attachments>,
    /// The range's [`RangeInner::attached`], set before an attachment is
    /// recorded.
    attached: &'a AtomicBool,
    id: u32,
    /// Into the id's record; valid, and only reached through this guard,
    /// while `shared` holds the lock.
    slot: NonNull<Slot>,
}

impl SlotGuard<'_> {
    /// Whether any id of the range has a window (the portable path).
    #[inline]
    pub fn has_windows(&self) -> bool {
        !self.shared.windows.is_empty()
    }

    /// The fabric handle of this id's attachment, if any.
    pub fn fabric(&self) -> Option<&[u8; 64]> {
        let id = self.id;
        self.shared
            .fabric
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, f)| f)
    }

    /// Records the fabric handle of this id's attachment; returns the one it
    /// replaces.
    pub fn set_fabric(&mut self, handle: [u8; 64]) -> Option<[u8; 64]> {
        self.attached.store(true, Ordering::Relaxed);
        let id = self.id;
        match self.shared.fabric.iter_mut().find(|(i, _)| *i == id) {
            Some((_, f)) => Some(std::mem::replace(f, handle)),
            None => {
                self.shared.fabric.push((id, handle));
                None
            }
        }
    }

    /// Lets go of this id's fabric handle (the id holds no endpoint any more).
    pub fn take_fabric(&mut self) -> Option<[u8; 64]> {
        take_fabric(&mut self.shared, self.id)
    }

    /// The heap top agreed for this id, if it belongs to a heap.
    pub fn agreed(&self) -> Option<u64> {
        let id = self.id;
        self.shared
            .agreed
            .iter()
            .find(|(i, _)| *i == id)
            .map(|&(_, top)| top)
    }

    /// Sets (`Some`) or clears (`None`) this id's agreed heap top.
    pub fn set_agreed(&mut self, top: Option<u64>) {
        let id = self.id;
        self.shared.agreed.retain(|(i, _)| *i != id);
        if let Some(top) = top {
            self.shared.agreed.push((id, top));
        }
    }

    /// This id's windows (the portable path), in the order they were added.
    pub fn windows(&self) -> impl Iterator<Item = &crate::portable::Window> {
        let id = self.id;
        self.shared
            .windows
            .iter()
            .filter(move |(i, _)| *i == id)
            .map(|(_, w)| w)
    }

    /// Adds a window to this id.
    pub fn push_window(&mut self, w: crate::portable::Window) {
        self.attached.store(true, Ordering::Relaxed);
        let id = self.id;
        self.shared.windows.push((id, w));
    }

    /// Removes the windows of this id that `remove` picks; returns them, to
    /// be dropped outside the lock (they may keep memory alive).
    #[inline]
    pub fn take_windows(
        &mut self,
        remove: impl FnMut(&crate::portable::Window) -> bool,
    ) -> Vec<crate::portable::Window> {
        // Inline: no window in the range (the usual case), no call.
        if self.shared.windows.is_empty() {
            return Vec::new();
        }
        self.take_windows_some(remove)
    }

    #[inline(never)]
    fn take_windows_some(
        &mut self,
        mut remove: impl FnMut(&crate::portable::Window) -> bool,
    ) -> Vec<crate::portable::Window> {
        let id = self.id;
        let (out, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.shared.windows)
            .into_iter()
            .partition(|(i, w)| *i == id && remove(w));
        self.shared.windows = keep;
        out.into_iter().map(|(_, w)| w).collect()
    }
}

fn take_fabric(shared: &mut Attachments, id: u32) -> Option<[u8; 64]> {
    let i = shared.fabric.iter().position(|(i, _)| *i == id)?;
    Some(shared.fabric.swap_remove(i).1)
}

impl Deref for SlotGuard<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        // SAFETY: the range's lock is held (`shared`) for the guard's life, and
        // every access to a slot of the range goes through such a guard (or
        // through `&mut RangeInner`), so no `&mut` of this slot exists.
        unsafe { self.slot.as_ref() }
    }
}

impl DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Slot {
        // SAFETY: as in `deref`; `&mut self` makes this the only borrow.
        unsafe { self.slot.as_mut() }
    }
}

/// One id's record, found once ([`RangeInner::record_ref`]): a transition
/// that reads the facts and then takes the slot looks the record up once
/// (5 instructions less per lookup saved).
pub(crate) struct RecordRef<'a> {
    range: &'a RangeInner,
    id: u32,
    rec: &'a Record,
}

impl<'a> RecordRef<'a> {
    /// The facts, read.
    ///
    /// # Safety
    /// As [`RangeInner::facts`].
    #[inline]
    pub unsafe fn facts(&self) -> &'a Facts {
        // SAFETY: by the caller's contract no write can happen while the
        // returned borrow lives.
        unsafe { &*self.rec.facts.0.get() }
    }

    /// The facts, to change.
    ///
    /// # Safety
    /// As [`RangeInner::facts_mut`].
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn facts_mut(&self) -> &'a mut Facts {
        // SAFETY: by the caller's contract this is the only reference.
        unsafe { &mut *self.rec.facts.0.get() }
    }

    /// The slot, with the range's lock held.
    #[inline(always)]
    pub fn slot(&self) -> SlotGuard<'a> {
        let shared = self.range.lock.lock();
        let slot = NonNull::from(&self.rec.slot.0).cast::<Slot>();
        SlotGuard {
            shared,
            attached: &self.range.attached,
            id: self.id,
            slot,
        }
    }
}

/// A cell that the one endpoint of an id governs (see [`Facts`]).
pub(crate) struct OwnerCell<T>(UnsafeCell<T>);

// SAFETY: through a shared `RangeInner` the cell is only read while a `&` of
// the id's endpoint is held, and written while its `&mut` (or the endpoint
// itself) is: the endpoint's borrows exclude a write during any read, on any
// thread. Concurrent reads need `T: Sync`; moving the range moves `T`.
unsafe impl<T: Send + Sync> Sync for OwnerCell<T> {}

/// A cell behind the range's lock (see [`SlotGuard`]).
struct LockedCell<T>(UnsafeCell<T>);

// SAFETY: the cell is only reached through a `SlotGuard`, which holds the
// range's lock, or through `&mut RangeInner`: one thread at a time, so
// `T: Send` suffices.
unsafe impl<T: Send> Sync for LockedCell<T> {}

/// One id's record: 96 bytes (48 of facts, 48 of slot).
struct Record {
    facts: OwnerCell<Facts>,
    slot: LockedCell<Slot>,
}

// The record's size is what a range of many ids costs per id (see the
// module doc); pinned so that a field added to it is a decision.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Record>() == 96);

pub(crate) struct RangeInner {
    /// Its context; none while the range is the context's spare (see
    /// [`Spare`]), or the two would keep each other alive.
    pub ctx: RangeContext,
    /// `base + count` fits in a `u32` (checked by [`IdRange::reserve`]).
    pub base: u32,
    pub count: u32,
    /// The lock of every slot of the range, and the fabric handles.
    /// `parking_lot`'s: no poisoning to test on lock and unlock (nothing
    /// it guards is left half-written by a panic: each guard's holder
    /// changes one record at a time), an inline fast path.
    lock: Mutex<Attachments>,
    /// Whether any id of the range ever had a fabric handle or a window
    /// (never cleared but in a spare): while not, an owner that destroys
    /// its endpoint finds its id bare without the lock (see
    /// [`RangeInner::owner_bare`]).
    attached: AtomicBool,
    /// Inline for one id: `reserve_one` makes a single allocation. Else
    /// allocated at the exact count.
    records: SmallVec<[Record; 1]>,
    /// Where the records start: `records.as_ptr()` of the range in its
    /// `Arc`, set by [`fresh`] once the range is there. A range never moves
    /// out of its `Arc` while shared (only [`release_shared`]'s last holder
    /// takes it out, and then reaches its records through `&mut`, never
    /// through [`RangeInner::record`]), and its records never move or
    /// grow, so the pointer stays valid for every `&RangeInner` of an
    /// `Arc`. A `&mut RangeInner` made in place in the `Arc` (by the last
    /// holder in [`release_shared`], or [`reuse`]) lives between two uses of
    /// the pointer, never across one, and reaches no record (see
    /// [`release_shared`]). Atomic only to be set through the `Arc` (a
    /// relaxed load is a plain load); every holder got its `Arc` after the
    /// store.
    first: AtomicPtr<Record>,
    released: bool,
    /// The context's spare: released, `ctx` already let go.
    spare: bool,
    /// Moves (under the lock) on every change to a binding list of the
    /// range, so that facts read from the bindings earlier (a copy batch's,
    /// F9) are known stale without a lock (`bindings_gen`).
    bindings_gen: AtomicU64,
    /// Enqueues and unbinds inside the range's copy gate
    /// ([`crate::copy_gate`]): an unbind waits for the enqueues, an
    /// enqueue for the unbinds (F4).
    gate_enqueues: AtomicU32,
    gate_unbinds: AtomicU32,
}

/// The context of a range, read as a `&Context` without a test: it is
/// missing only while the range is its context's spare, and a spare is
/// reached only through [`Spare`], which gives it a context again before
/// anyone else sees it. (An `Option`, not a `ManuallyDrop`: a panic while a
/// range is dropped still drops its context.)
pub(crate) struct RangeContext(Option<Context>);

impl std::ops::Deref for RangeContext {
    type Target = Context;

    #[inline]
    fn deref(&self) -> &Context {
        // SAFETY: `None` only in a spare range (above), whose context no
        // code reads: `reuse` sets it before the range leaves the `Spare`,
        // and `RangeInner::drop` returns early for a spare. Unsafe for
        // speed: a test with a panic for `None` measured 899 instructions
        // per `Null` lifecycle against 881 (bind 190 against 182;
        // `benches/instructions.rs`, rustc 1.95).
        unsafe { self.0.as_ref().unwrap_unchecked() }
    }
}

/// A context's spare one-id range: the allocation of the last one-id range
/// released through [`release_shared`], kept for the next `reserve(1)`, so
/// that a program that reserves and releases one id at a time (the usual
/// lifecycle) allocates once, not once per lifecycle, and builds no record
/// on the stack to copy in. At most one per context; freed with the context.
#[derive(Default)]
pub(crate) struct Spare(AtomicPtr<RangeInner>);

impl Spare {
    // An `AtomicPtr` for speed: a `parking_lot::Mutex<Option<Arc<_>>>`
    // measured 908 instructions per `Null` lifecycle against 881 (reserve
    // 66 against 56, release 111 against 95; `benches/instructions.rs`,
    // rustc 1.95), for one pointer swapped in and out.

    /// The spare, if there is one (it is taken: no one else can have it).
    fn take(&self) -> Option<Arc<RangeInner>> {
        // SAFETY: a pointer of `take_raw` is an `Arc::into_raw` of `put`,
        // swapped out atomically, so this is its one owner. (Unsafe for
        // speed: see the figure above.)
        self.take_raw().map(|p| unsafe { Arc::from_raw(p) })
    }

    /// The spare as `Arc::into_raw` gave it, if there is one: the caller
    /// owns it (and must give it back to `Arc::from_raw`).
    #[inline]
    fn take_raw(&self) -> Option<*const RangeInner> {
        let p = self.0.swap(std::ptr::null_mut(), Ordering::Acquire);
        (!p.is_null()).then_some(p.cast_const())
    }

    /// Keeps `range` (released, unique, one id, reset) as the spare; an older
    /// spare is freed.
    fn put(&self, range: Arc<RangeInner>) {
        let old = self
            .0
            .swap(Arc::into_raw(range).cast_mut(), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: as in `take`: the pointer swapped out is owned here.
            drop(unsafe { Arc::from_raw(old.cast_const()) });
        }
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl RangeInner {
    /// Whether any id of the range may have a fabric handle or a window
    /// (never cleared): while not, none has, and nothing need be locked
    /// to know it.
    #[inline]
    pub(crate) fn maybe_attached(&self) -> bool {
        self.attached.load(Ordering::Relaxed)
    }

    #[inline]
    fn record(&self, id: u32) -> &Record {
        let i = (id - self.base) as usize;
        debug_assert!(i < self.records.len());
        let first = self.first.load(Ordering::Relaxed);
        debug_assert!(std::ptr::eq(first, self.records.as_ptr()));
        // SAFETY: `id` is an id of this range (every caller passes the id of
        // an endpoint, binding or copy target of this range, all made from
        // it), so `i < count`; `first` is `records.as_ptr()` of this range
        // in its `Arc`, where it stays (see `first`). Unsafe for speed:
        // indexing `records` tests the bound and whether the records are
        // inline at every lookup: 794 instructions per `Null` lifecycle
        // against 752 here (779 with `get_unchecked` alone; create 180
        // against 169, bind 181 against 167, destroy 93 against 81;
        // `benches/instructions.rs`, rustc 1.95). A range made without the
        // spare pays 6 for setting the pointer (`reserve_one_no_spare` 324
        // against 318).
        unsafe { &*first.add(i) }
    }

    // Always inline: the guard is four words, returned through memory when
    // this is a call (bind measured 214 instructions against 182).
    #[inline(always)]
    pub fn slot(&self, id: u32) -> SlotGuard<'_> {
        self.record_ref(id).slot()
    }

    /// The record of `id`, found once for its facts and its slot.
    #[inline(always)]
    pub fn record_ref(&self, id: u32) -> RecordRef<'_> {
        RecordRef {
            range: self,
            id,
            rec: self.record(id),
        }
    }

    /// Clears the facts of `id` (its endpoint is gone) and says whether the
    /// id holds no binding, fabric handle or window, read without the lock:
    /// for the owner of the endpoint on `id`, destroying it. (The lock and
    /// a scan of the range's attachments cost about 30 instructions per
    /// destroy; one record lookup for both, 5 less.)
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`] of `id` by value (or is its
    /// `Drop`): no `&Endpoint` of it is left, so no bind, `Binding` or copy
    /// reaches its slot on another thread, and whatever did happened before
    /// (a borrow ended, a thread joined). Its attachments are recorded
    /// through that endpoint only, so `attached` was set before too.
    #[inline]
    pub unsafe fn owner_forget(&self, id: u32) -> bool {
        let rec = self.record(id);
        // SAFETY: by the caller's contract no other reference to the facts
        // exists (the endpoint is the caller's).
        unsafe { *rec.facts.0.get() = Facts::default() };
        // SAFETY: by the caller's contract no guard of this slot is alive
        // on any thread and none can be made while this borrow lives; the
        // read is of this id's record only, never of the shared lists.
        let slot = unsafe { &*rec.slot.0.get() };
        slot.bindings.is_empty() && !self.attached.load(Ordering::Relaxed)
    }

    /// A binding list of the range changed: called with the range's lock
    /// held (a [`SlotGuard`] alive), so changes are counted one at a time.
    #[inline]
    pub fn bindings_changed(&self) {
        self.bindings_gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Enqueues inside the copy gate ([`crate::copy_gate`]).
    #[inline]
    pub fn gate_enqueues(&self) -> &AtomicU32 {
        &self.gate_enqueues
    }

    /// Unbinds inside the copy gate ([`crate::copy_gate`]).
    #[inline]
    pub fn gate_unbinds(&self) -> &AtomicU32 {
        &self.gate_unbinds
    }

    /// The count of changes to the range's binding lists so far: facts
    /// read under the lock along with it are current while it stays.
    #[inline]
    pub fn bindings_gen(&self) -> u64 {
        self.bindings_gen.load(Ordering::Acquire)
    }

    /// The slot of `id` without a lock: `&mut` proves no one else holds it.
    fn slot_mut(&mut self, id: u32) -> &mut Slot {
        let i = (id - self.base) as usize;
        self.records[i].slot.0.get_mut()
    }

    /// The fabric handle of `id`, taken without a lock (`&mut`, as above).
    fn take_fabric_mut(&mut self, id: u32) -> Option<[u8; 64]> {
        take_fabric(self.lock.get_mut(), id)
    }

    /// Whether `id` holds an orphan (see [`Facts::orphaned`]), without a
    /// lock or an `unsafe`: `&mut` proves no endpoint of the range is left.
    fn orphaned(&mut self, id: u32) -> bool {
        let i = (id - self.base) as usize;
        self.records[i].facts.0.get_mut().orphaned
    }

    /// The facts of `id`, read.
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`] of `id` or a shared borrow of it,
    /// for as long as the returned reference lives, and no `&mut` of it.
    #[inline]
    pub unsafe fn facts(&self, id: u32) -> &Facts {
        // SAFETY: by the caller's contract no write can happen while the
        // returned borrow lives (writes need the endpoint's `&mut`).
        unsafe { &*self.record(id).facts.0.get() }
    }

    /// The facts of `id`, to change.
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`] of `id` by value or through `&mut`,
    /// for as long as the returned reference lives: no other reference to
    /// these facts exists.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn facts_mut(&self, id: u32) -> &mut Facts {
        // SAFETY: by the caller's contract this is the only reference.
        unsafe { &mut *self.record(id).facts.0.get() }
    }

    /// Resets the one record of a released one-id range, in its `Arc`, for
    /// reuse as the spare; `false` (keep it out) when something is left in
    /// it. Through `&self` and [`RangeInner::record`], never a `&mut
    /// RangeInner`: see [`release_shared`] for why the two never meet.
    ///
    /// # Safety
    /// The caller holds the range's last `Arc` and no `&mut RangeInner` of
    /// it is used after this call: no other reference to the record exists.
    unsafe fn reset_spare_record(&self) -> bool {
        debug_assert_eq!(self.count, 1);
        let rec = self.record(self.base);
        // SAFETY: by the caller's contract no other reference to the record
        // exists. Unsafe for speed (`record` rather than `records.first_mut()`
        // through a `&mut RangeInner`, which tests the length and where the
        // records are): `release` 82 instructions against 77 here
        // (`benches/instructions.rs`, rustc 1.95); with the `&mut` of
        // `release_shared` below, see there for the whole lifecycle.
        let slot = unsafe { &*rec.slot.0.get() };
        if !slot.bindings.is_empty() || slot.bindings.spilled() {
            return false;
        }
        // SAFETY: as above.
        let facts = unsafe { &mut *rec.facts.0.get() };
        if facts.devices.spilled() {
            return false;
        }
        *facts = Facts::default();
        true
    }

    /// Makes a released one-id range whose record was reset
    /// ([`RangeInner::reset_spare_record`]) the spare; `false` (keep it
    /// out) when an attachment list holds something. Touches no record.
    fn make_spare(&mut self) -> bool {
        debug_assert_eq!(self.count, 1);
        // Nothing was ever attached (the usual case): the lists are empty
        // and hold no allocation, without looking.
        if *self.attached.get_mut() {
            let shared = self.lock.get_mut();
            if !shared.fabric.is_empty()
                || shared.fabric.capacity() != 0
                || !shared.windows.is_empty()
            {
                return false;
            }
        }
        // Nothing attached is left in it (tested above).
        *self.attached.get_mut() = false;
        self.spare = true;
        true
    }

    fn release_now(&mut self) -> Result<()> {
        for i in 0..self.count {
            let id = self.base + i;
            if !self.orphaned(id) {
                continue;
            }
            // Out of the record before the call: a panic inside it is taken
            // as coming after the driver destroyed the orphan (see
            // [`OnUnwind`]), so its handle is detached and its memory let go
            // while unwinding, and `released` still false makes the range's
            // `Drop` finish the release.
            self.set_orphaned(id, false);
            let slot = std::mem::take(self.slot_mut(id));
            let fabric = self.take_fabric_mut(id);
            let ctx = &self.ctx;
            let detach = OnUnwind::new(|| {
                if let Some(f) = &fabric {
                    ctx.detach(f);
                }
            });
            // SAFETY: an orphan: its `Endpoint` is gone (dropped while its
            // destroy failed), so nothing typed holds the id any more.
            let r = unsafe { ctx.driver().destroy(id) };
            detach.disarm();
            match r {
                Ok(()) => {
                    if let Some(f) = fabric {
                        self.ctx.detach(&f);
                    }
                    drop(slot); // unbound now: the memory may go
                }
                Err(code) => {
                    // Still attached, so memory may still be bound: leak what
                    // every orphan keeps rather than free it with the range,
                    // and keep the ids (R1.2).
                    self.set_orphaned(id, true);
                    std::mem::forget(slot);
                    for j in i + 1..self.count {
                        let id = self.base + j;
                        std::mem::forget(std::mem::take(self.slot_mut(id)));
                    }
                    self.released = true;
                    return Err(self.ctx.error(Call::Destroy, code));
                }
            }
        }
        // A panic inside the release is taken as after the driver released:
        // never released twice.
        self.released = true;
        // SAFETY: the range's last owner is gone: every `Endpoint` of it was
        // destroyed (orphans just above), so no id holds an endpoint (R1.2).
        let r = unsafe { self.ctx.driver().id_release(self.base, self.count) };
        self.ctx.check(Call::IdRelease, r)
    }

    fn set_orphaned(&mut self, id: u32, orphaned: bool) {
        let i = (id - self.base) as usize;
        self.records[i].facts.0.get_mut().orphaned = orphaned;
    }
}

impl Drop for RangeInner {
    fn drop(&mut self) {
        if self.spare || self.released {
            return; // released (as the spare, its context let go already)
        }
        crate::unwind::in_drop(|| {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.release_now())) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.ctx.record_teardown(e),
                Err(panic) => {
                    // A panic inside an orphan's destroy left the range
                    // unreleased (see `release_now`): finish, then go on
                    // unwinding.
                    if !self.released
                        && let Ok(Err(e)) =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                self.release_now()
                            }))
                    {
                        self.ctx.record_teardown(e);
                    }
                    std::panic::resume_unwind(panic);
                }
            }
        });
    }
}

/// A contiguous range of reserved ids `[base, base+len)` (R1), not yet split
/// into endpoints. Dropping it (or every endpoint made from it) releases it.
pub struct IdRange {
    inner: Arc<RangeInner>,
}

impl std::fmt::Debug for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IdRange[{}..{})",
            self.inner.base,
            self.inner.base + self.inner.count
        )
    }
}

impl IdRange {
    pub(crate) fn reserve(ctx: &Context, count: u32) -> Result<IdRange> {
        if count == 0 {
            return Err(crate::Error::ZeroSize {
                what: crate::error::Arg::IdCount,
                suggested: 1,
                rule: Some(crate::error::Rule::R1_3),
            });
        }
        let base = reserve_ids(ctx, count)?;
        if count == 1
            && let Some(spare) = reuse(ctx, base)
        {
            return Ok(IdRange { inner: spare });
        }
        Ok(IdRange {
            inner: fresh(ctx, base, count),
        })
    }

    /// One id as an endpoint (`Context::reserve_one`): the context's spare
    /// range when it has one, else a new one.
    #[inline]
    pub(crate) fn reserve_one(ctx: &Context) -> Result<Endpoint<Reserved, NoKind>> {
        let base = reserve_ids(ctx, 1)?;
        let inner = match reuse(ctx, base) {
            Some(spare) => spare,
            None => fresh(ctx, base, 1),
        };
        Ok(Endpoint::from_parts(inner, base))
    }

    /// The first id.
    pub fn base(&self) -> u32 {
        self.inner.base
    }

    /// How many ids.
    pub fn len(&self) -> u32 {
        self.inner.count
    }

    /// Never true: ranges hold at least one id (R1.3).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Splits the range into one [`Endpoint<Reserved>`] per id, in id order.
    /// The range is released once all of them (and whatever they become) are gone.
    pub fn into_endpoints(self) -> Vec<Endpoint<Reserved, NoKind>> {
        (self.inner.base..self.inner.base + self.inner.count)
            .map(|id| Endpoint::from_parts(self.inner.clone(), id))
            .collect()
    }

    /// Splits a range of exactly `N` ids into an array.
    ///
    /// # Errors
    /// The range back when it does not hold `N` ids.
    pub fn into_array<const N: usize>(self) -> Result<[Endpoint<Reserved, NoKind>; N], IdRange> {
        if self.inner.count as usize != N {
            return Err(self);
        }
        let (inner, base) = (&self.inner, self.inner.base);
        Ok(std::array::from_fn(|i| {
            Endpoint::from_parts(inner.clone(), base + i as u32)
        }))
    }

    /// Releases the ids now (`cuLogicalEndpointIdRelease`, R1).
    ///
    /// # Errors
    /// [`crate::Error::Driver`] from the driver; the ids are then lost to this
    /// process, as the driver left them.
    pub fn release(self) -> Result<()> {
        release_shared(self.inner)
    }
}

/// `cuLogicalEndpointIdReserve` of `count` ids; the base, checked so that
/// every id of the range is `base + i` below `base + count`: checked once
/// here, so that no later sum (splitting, `Debug`, release in `Drop`) can
/// overflow.
#[inline]
fn reserve_ids(ctx: &Context, count: u32) -> Result<u32> {
    match ctx.queries().id_reserve(count) {
        Ok(base) if base.checked_add(count).is_some() => Ok(base),
        r => Err(reserve_failed(ctx, count, r)),
    }
}

/// The error of a failed [`reserve_ids`]; ids the driver reserved past
/// `u32::MAX` are given back.
#[cold]
#[inline(never)]
fn reserve_failed(ctx: &Context, count: u32, r: crate::driver::DriverResult<u32>) -> crate::Error {
    match r {
        Err(code) => ctx.error(Call::IdReserve, code),
        Ok(base) => {
            // SAFETY: the ids the driver just reserved, never handed out.
            let r = unsafe { ctx.driver().id_release(base, count) };
            if let Err(code) = r {
                ctx.record_teardown(ctx.error(Call::IdRelease, code));
            }
            crate::Error::BadAnswer {
                call: Call::IdReserve,
                what: crate::error::Answer::IdBase,
                value: u64::from(base),
            }
        }
    }
}

/// The context's spare range, for the one id `base`, if it has one.
#[inline]
fn reuse(ctx: &Context, base: u32) -> Option<Arc<RangeInner>> {
    let p = ctx.spare().take_raw()?;
    // SAFETY: `p` came from `Arc::into_raw` in `Spare::put`, which is only
    // given a range its last holder proved unique (`release_shared`), and
    // was swapped out of the spare atomically: no other `Arc` or `Weak` of
    // it exists (no `Weak` of a range is ever made), so this is the only
    // reference, and the pointer, from the `Arc`'s own allocation, may
    // write. Unsafe for speed: `Arc::get_mut` tests uniqueness again with
    // a compare-and-swap: `reserve_one` 57 instructions against 47 here
    // (`benches/instructions.rs`, rustc 1.95). It reaches no record (see
    // `release_shared`) and is gone before `first` is used again.
    let inner = unsafe { &mut *p.cast_mut() };
    // Reused in place: its one record was reset when it became the spare,
    // and it holds no context until now.
    // The spare has no context: nothing to drop (forgetting `None` skips
    // the test for one).
    std::mem::forget(inner.ctx.0.replace(ctx.clone()));
    inner.base = base;
    inner.released = false;
    inner.spare = false;
    // SAFETY: as above: the pointer of `Arc::into_raw`, owned here.
    Some(unsafe { Arc::from_raw(p) })
}

/// A new range of `count` ids from `base`, with one empty record per id.
#[inline(never)]
fn fresh(ctx: &Context, base: u32, count: u32) -> Arc<RangeInner> {
    let record = || Record {
        facts: OwnerCell(UnsafeCell::new(Facts::default())),
        slot: LockedCell(UnsafeCell::new(Slot::default())),
    };
    // One id (`reserve_one`, the common case) without the generic
    // `collect`, which costs more than the record it builds. Many at
    // their exact count: `collect` would round the allocation up to a
    // power of two (131 072 records for 100 000 ids).
    let records = if count == 1 {
        smallvec::smallvec![record()]
    } else {
        let mut records = SmallVec::with_capacity(count as usize);
        records.extend((0..count).map(|_| record()));
        records
    };
    let range = Arc::new(RangeInner {
        ctx: RangeContext(Some(ctx.clone())),
        base,
        count,
        lock: Mutex::default(),
        attached: AtomicBool::new(false),
        records,
        first: AtomicPtr::new(std::ptr::null_mut()),
        released: false,
        spare: false,
        bindings_gen: AtomicU64::new(0),
        gate_enqueues: AtomicU32::new(0),
        gate_unbinds: AtomicU32::new(0),
    });
    // Where the records are now that the range is in its `Arc` (inline
    // ones moved with it), before anyone else has the `Arc`.
    range
        .first
        .store(range.records.as_ptr().cast_mut(), Ordering::Relaxed);
    range
}

/// Releases `range` now if `this` was its last holder; else just lets go.
///
/// The last holder changes the range in place, in its `Arc`, through a
/// `&mut RangeInner` made from the `Arc`'s pointer, while the records are
/// reached through [`RangeInner::first`], a pointer made from a shared
/// borrow. A use of `first` ends every `&mut RangeInner` made before it
/// (Stacked and Tree Borrows), so the two never overlap: each `&mut` is
/// made after the last use of `first` before it and dropped before the
/// next, and no record is reached through one (`ci/miri.sh` runs
/// `range::tests` under both models).
pub(crate) fn release_shared(range: Arc<RangeInner>) -> Result<()> {
    // The last holder releases in place: moving the records out of the
    // allocation (`into_inner`) would copy them for nothing. The `Drop` that
    // follows finds the range released and only frees it.
    if Arc::strong_count(&range) == 1 {
        // Acquire: what the other holders did happened before their drops.
        std::sync::atomic::fence(Ordering::Acquire);
        let one = range.count == 1;
        // The orphan test through `record` (the range is in its `Arc`),
        // before the `&mut` below.
        // SAFETY: the last `Arc`: every `Endpoint` of the range is gone, so
        // nothing writes its facts.
        let fast = one && !unsafe { range.facts(range.base) }.orphaned;
        {
            // SAFETY: the last `Arc` of the range (no `Weak` of a range is
            // ever made, so no other thread can make one now), from the
            // `Arc`'s own allocation: the only reference, dropped at the end
            // of this block, before `first` is used again. Unsafe for speed:
            // `Arc::get_mut` also locks out a `Weak` being made, with a
            // compare-and-swap: `release` 95 instructions against 82 here,
            // with the orphan test above through `record`
            // (`benches/instructions.rs`, rustc 1.95). The safe twin of this
            // function (one `Arc::get_mut`, the orphan test and the reset
            // through `records`) measured 734 instructions per `Null`
            // lifecycle against 716 here (2026-12-02, Callgrind over
            // `benches/common`'s typed lifecycle alone, rustc 1.95; 717
            // before the reset moved out of the `&mut`). Miri-clean under
            // Stacked and Tree Borrows (`ci/miri.sh`).
            let inner = unsafe { &mut *Arc::as_ptr(&range).cast_mut() };
            if fast {
                // One id, no orphan to destroy first (the usual case): the
                // release alone, without `release_now`'s pass over the ids.
                inner.released = true;
                // SAFETY: the range's last owner is gone and its one id holds
                // no endpoint (not an orphan, and every `Endpoint` is gone), R1.2.
                let r = unsafe { inner.ctx.driver().id_release(inner.base, 1) };
                if let Err(code) = r {
                    return Err(inner.ctx.error(Call::IdRelease, code));
                }
            } else {
                inner.release_now()?;
            }
        }
        // SAFETY: the last `Arc`, and the `&mut` above is gone.
        if one && unsafe { range.reset_spare_record() } {
            // SAFETY: as the `&mut` above; `first` is not used while this
            // one lives (`make_spare` touches no record).
            let inner = unsafe { &mut *Arc::as_ptr(&range).cast_mut() };
            if inner.make_spare()
                && let Some(ctx) = inner.ctx.0.take()
            {
                // The range is released, unique and reset: from now on only
                // the context's `Spare` reaches it. The context moves out of
                // it (no reference count touched) and lives until the range
                // is stored.
                ctx.spare().put(range);
            }
        }
        return Ok(());
    }
    // Shared: `into_inner` decides atomically which of racing holders is last.
    match Arc::into_inner(range) {
        Some(mut inner) => inner.release_now(),
        None => Ok(()),
    }
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use crate::{Allocation, Context, Private, Spec};

    /// R1: the README's lifecycle (reserve_one, create, wait, bind, unbind,
    /// destroy, release) three times on one context: the first `release`
    /// keeps its range as the context's spare and each later `reserve_one`
    /// takes that same allocation, reset in place in its `Arc`; the ids are
    /// reserved and released each time, nothing is left behind. Under Miri
    /// (`ci/miri.sh`, Stacked and Tree Borrows) it proves the spare's
    /// unsafe sound: at `5d1fff7` Miri reported undefined behaviour at the
    /// first `release` (a `&mut RangeInner` used across a use of `first`).
    #[test]
    fn r1_a_released_range_is_kept_as_the_spare_and_reused_by_the_next_reserve() {
        let (ctx, model) = Context::model(Default::default());
        let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20).unwrap();
        let spare = || ctx.spare().0.load(Ordering::Relaxed).cast_const();
        assert!(spare().is_null());
        for round in 0..3 {
            let kept = spare();
            let ep = ctx.reserve_one().unwrap();
            let range = Arc::as_ptr(ep.range());
            assert_eq!(round > 0, std::ptr::eq(range, kept), "round {round}");
            assert!(spare().is_null(), "round {round}: the spare was taken");
            let ep = ep
                .create(Spec::unicast(0, 2 << 20))
                .unwrap()
                .wait(Duration::from_secs(1))
                .unwrap();
            assert_eq!(ep.size(), 2 << 20);
            let b = ep.bind(0, 0, &mem).unwrap();
            b.unbind().unwrap();
            ep.destroy().unwrap().release().unwrap();
            assert!(std::ptr::eq(spare(), range), "round {round}: kept");
        }
        drop(mem);
        assert!(model.live().is_empty());
    }
}

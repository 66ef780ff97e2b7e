//! The ledger: the only owner of what is recorded per endpoint range and
//! per id — the lifecycle facts ([`Facts`]), the bindings with where they
//! start ([`binds`]), what is attached ([`attach`]: fabric handles,
//! windows, the heap's agreed top) — and of what is in flight on each
//! ([`holds`]), with the copy gate between them ([`gate`]). Everything else
//! asks it questions (a [`RecordRef`], a [`SlotGuard`], [`settle`]);
//! `crate::range` owns the range's lifecycle (reserve, reuse, release, the
//! spare) and is the one other reader of the record's fields.
//!
//! F4 ("nothing freed under a copy") is kept by one rule: whatever a copy
//! uses is held by a record that lives until its stream has passed the
//! copy. A batch's record on its stream ([`holds::Keep`]) holds the memory
//! and the ranges of its endpoints; each range's [`holds::Holds`] lists
//! the streams that recorded a batch on it (a graph's pins its ids for its
//! whole life, F8); nothing an id holds is let go, by an unbind or a
//! destroy, before [`settle`] has synchronized every stream listed there
//! whose records name that id, and the copy gate makes every enqueue that
//! passed its checks recorded before a settle looks.
//!
//! The unsafe kept for speed is here: each id's record is two cells, one
//! governed by the id's one [`Endpoint`](crate::Endpoint) ([`OwnerCell`]),
//! one by the range's lock ([`LockedCell`]), reached without bounds tests,
//! each unchecked access with a `debug_assert!` beside it (as
//! `wgpu-core/src/track/` does). A record is 96 bytes, allocated once per
//! range at its exact count (`benches/readiness_heap.rs`).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::context::Context;
use crate::driver::Device;

pub(crate) mod attach;
pub(crate) mod binds;
pub(crate) mod gate;
pub(crate) mod holds;

use attach::{Attachments, take_fabric};
pub(crate) use binds::{Bound, Slot};
pub(crate) use holds::{settle, settle_destroy};

/// What the endpoint on one id is: fixed by the transitions that make it
/// (create, import, add_device) and cleared by destroy.
///
/// Kept outside the slot's lock: only the one [`Endpoint`](crate::Endpoint)
/// holding the id writes it, through `&mut` (its consuming transitions and
/// its `Drop`), and reads go through `&Endpoint`, so the borrow rules of the
/// endpoint are those of its facts and the getters neither lock nor
/// allocate.
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

/// The slot of one id, with the range's lock held. The lock is the whole
/// range's: hold one guard at a time, never across a driver call or a drop
/// of kept-alive memory (as every caller does), or a second one on the same
/// thread would wait for ever.
pub(crate) struct SlotGuard<'a> {
    shared: MutexGuard<'a, Attachments>,
    /// The range: its [`RangeInner::attached`], set before an attachment is
    /// recorded, and its bindings generation, moved by a change to the
    /// windows (`attach.rs`), which copies' facts read too.
    range: &'a RangeInner,
    id: u32,
    /// Into the id's record; valid, and only reached through this guard,
    /// while `shared` holds the lock.
    slot: NonNull<Slot>,
}

impl Deref for SlotGuard<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        debug_assert!(MutexGuard::mutex(&self.shared).is_locked());
        // SAFETY: the range's lock is held (`shared`) for the guard's life, and
        // every access to a slot of the range goes through such a guard (or
        // through `&mut RangeInner`), so no `&mut` of this slot exists.
        unsafe { self.slot.as_ref() }
    }
}

impl DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Slot {
        debug_assert!(MutexGuard::mutex(&self.shared).is_locked());
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
    /// The caller holds the [`Endpoint`](crate::Endpoint) of the id or a
    /// shared borrow of it, for as long as the returned reference lives,
    /// and no `&mut` of it.
    #[inline]
    pub unsafe fn facts(&self) -> &'a Facts {
        debug_assert!(std::ptr::eq(self.rec, self.range.record(self.id)));
        // SAFETY: by the caller's contract no write can happen while the
        // returned borrow lives.
        unsafe { &*self.rec.facts.0.get() }
    }

    /// The facts, to change.
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`](crate::Endpoint) of the id by value
    /// or through `&mut`, for as long as the returned reference lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn facts_mut(&self) -> &'a mut Facts {
        debug_assert!(std::ptr::eq(self.rec, self.range.record(self.id)));
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
            range: self.range,
            id: self.id,
            slot,
        }
    }
}

/// A cell that the one endpoint of an id governs (see [`Facts`]).
pub(crate) struct OwnerCell<T>(pub(crate) UnsafeCell<T>);

// SAFETY: through a shared `RangeInner` the cell is only read while a `&` of
// the id's endpoint is held, and written while its `&mut` (or the endpoint
// itself) is: the endpoint's borrows exclude a write during any read, on any
// thread. Concurrent reads need `T: Sync`; moving the range moves `T`.
unsafe impl<T: Send + Sync> Sync for OwnerCell<T> {}

/// A cell behind the range's lock (see [`SlotGuard`]).
pub(crate) struct LockedCell<T>(pub(crate) UnsafeCell<T>);

// SAFETY: the cell is only reached through a `SlotGuard`, which holds the
// range's lock, or through `&mut RangeInner`: one thread at a time, so
// `T: Send` suffices.
unsafe impl<T: Send> Sync for LockedCell<T> {}

/// One id's record: 96 bytes (48 of facts, 48 of slot).
pub(crate) struct Record {
    pub(crate) facts: OwnerCell<Facts>,
    pub(crate) slot: LockedCell<Slot>,
}

// The record's size is what a range of many ids costs per id (see the
// module doc); pinned so that a field added to it is a decision.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Record>() == 96);

/// One endpoint range's record: its lifecycle fields (read and changed by
/// `crate::range`, which owns them), each id's record, and its gate.
pub(crate) struct RangeInner {
    /// Its context; none while the range is the context's spare (see
    /// `context::Spare`), or the two would keep each other alive.
    pub ctx: RangeContext,
    /// `base + count` fits in a `u32` (checked by
    /// [`IdRange::reserve`](crate::IdRange::reserve)).
    pub base: u32,
    pub count: u32,
    /// The lock of every slot of the range, and the fabric handles.
    /// `parking_lot`'s: no poisoning to test on lock and unlock (nothing
    /// it guards is left half-written by a panic: each guard's holder
    /// changes one record at a time), an inline fast path.
    pub(crate) lock: Mutex<Attachments>,
    /// Whether any id of the range ever had a fabric handle or a window
    /// (never cleared but in a spare): while not, an owner that destroys
    /// its endpoint finds its id bare without the lock (see
    /// [`RangeInner::owner_forget`]).
    pub(crate) attached: AtomicBool,
    /// Inline for one id: `reserve_one` makes a single allocation. Else
    /// allocated at the exact count.
    records: SmallVec<[Record; 1]>,
    /// Where the records start: `records.as_ptr()` of the range in its
    /// `Arc`, set by [`RangeInner::new`] once the range is there. A range
    /// never moves out of its `Arc` while shared (only
    /// [`crate::range::release_shared`]'s last holder takes it out, and
    /// then reaches its records through `&mut`, never through
    /// [`RangeInner::record`]), and its records never move or
    /// grow, so the pointer stays valid for every `&RangeInner` of an
    /// `Arc`. A `&mut RangeInner` made in place in the `Arc` (by the last
    /// holder in [`crate::range::release_shared`], or the spare's reuse)
    /// lives between two uses of the pointer, never across one, and reaches
    /// no record. Atomic only to be set through the `Arc` (a relaxed load is
    /// a plain load); every holder got its `Arc` after the store.
    first: AtomicPtr<Record>,
    pub(crate) released: bool,
    /// The context's spare: released, `ctx` already let go.
    pub(crate) spare: bool,
    /// Moves on every change to a binding list, a window list or an agreed
    /// top of the range (under the lock, or through `&mut`), and on every endpoint
    /// made, imported or enrolled on one of its ids (by its owner, who
    /// holds it by value), so that facts read from them earlier (a copy
    /// batch's, F9, R13.3) are known stale without a lock
    /// (`bindings_gen`).
    bindings_gen: AtomicU64,
    /// This range among every range the process made ([`next_serial`]):
    /// with `bindings_gen`, what the copy's facts memo (`copy/check.rs`)
    /// keys on across batches, when the range may have gone and another
    /// come at its address.
    pub(crate) serial: u64,
    /// The range's copy gate ([`gate`]): an unbind waits for the enqueues,
    /// an enqueue for the binds and unbinds (F4, R13.3).
    gate: gate::Gate,
    /// What is in flight on the range's ids ([`holds`]): the batches and
    /// graphs that an unbind or destroy settles first (F4, F8).
    holds: holds::Holds,
}

/// A [`RangeInner::serial`] that no range of the process has had (a
/// `u64` at one range a nanosecond wraps after 584 years).
#[inline]
fn next_serial() -> u64 {
    static SERIALS: AtomicU64 = AtomicU64::new(0);
    SERIALS.fetch_add(1, Ordering::Relaxed)
}

/// The context of a range, read as a `&Context` without a test: it is
/// missing only while the range is its context's spare, and a spare is
/// reached only through `context::Spare`, which gives it a context again before
/// anyone else sees it. (An `Option`, not a `ManuallyDrop`: a panic while a
/// range is dropped still drops its context.)
pub(crate) struct RangeContext(pub(crate) Option<Context>);

impl std::ops::Deref for RangeContext {
    type Target = Context;

    #[inline]
    fn deref(&self) -> &Context {
        debug_assert!(self.0.is_some(), "a spare range's context was read");
        // SAFETY: `None` only in a spare range (above), whose context no
        // code reads: `reuse` sets it before the range leaves the `Spare`,
        // and `RangeInner::drop` returns early for a spare. Unsafe for
        // speed: a test with a panic for `None` measured 899 instructions
        // per `Null` lifecycle against 881 (bind 190 against 182;
        // `benches/instructions.rs`, rustc 1.95).
        unsafe { self.0.as_ref().unwrap_unchecked() }
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
    pub(crate) fn record(&self, id: u32) -> &Record {
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
    /// The caller holds the [`Endpoint`](crate::Endpoint) of `id` by value (or is its
    /// `Drop`): no `&Endpoint` of it is left, so no bind, `Binding` or copy
    /// reaches its slot on another thread, and whatever did happened before
    /// (a borrow ended, a thread joined). Its attachments are recorded
    /// through that endpoint only, so `attached` was set before too.
    #[inline]
    pub unsafe fn owner_forget(&self, id: u32) -> bool {
        let rec = self.record(id);
        debug_assert!(!self.spare && !self.released);
        // SAFETY: by the caller's contract no other reference to the facts
        // exists (the endpoint is the caller's).
        unsafe { *rec.facts.0.get() = Facts::default() };
        // SAFETY: by the caller's contract no guard of this slot is alive
        // on any thread and none can be made while this borrow lives; the
        // read is of this id's record only, never of the shared lists.
        let slot = unsafe { &*rec.slot.0.get() };
        slot.bindings.is_empty() && !self.attached.load(Ordering::Relaxed)
    }

    /// A binding list, an agreed top or a record of what peers bound of the
    /// range changed (called with the range's lock held, a [`SlotGuard`]
    /// alive), or an endpoint was
    /// made on one of its ids (by its owner): counted one at a time.
    #[inline]
    pub fn bindings_changed(&self) {
        self.bindings_gen.fetch_add(1, Ordering::Relaxed);
    }

    /// [`RangeInner::bindings_changed`] through `&mut` (a slot taken
    /// without the lock).
    pub(crate) fn bindings_changed_mut(&mut self) {
        let g = self.bindings_gen.get_mut();
        *g = g.wrapping_add(1);
    }

    /// The count of changes to the range's binding lists, windows, agreed
    /// tops, records of what peers bound and endpoints so far: facts read under
    /// the lock along with it are current while it stays.
    #[inline]
    pub fn bindings_gen(&self) -> u64 {
        self.bindings_gen.load(Ordering::Acquire)
    }

    /// The record of `id` through `&mut`, which proves no one else holds
    /// the range: no lock, no `unsafe`.
    fn record_mut(&mut self, id: u32) -> &mut Record {
        &mut self.records[(id - self.base) as usize]
    }

    /// The slot of `id` without a lock (`&mut`).
    pub(crate) fn slot_mut(&mut self, id: u32) -> &mut Slot {
        self.record_mut(id).slot.0.get_mut()
    }

    /// The fabric handle of `id`, taken without a lock (`&mut`, as above).
    pub(crate) fn take_fabric_mut(&mut self, id: u32) -> Option<[u8; 64]> {
        take_fabric(self.lock.get_mut(), id)
    }

    /// Whether `id` holds an orphan (see [`Facts::orphaned`]), `&mut`.
    pub(crate) fn orphaned(&mut self, id: u32) -> bool {
        self.record_mut(id).facts.0.get_mut().orphaned
    }

    /// The facts of `id`, read.
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`](crate::Endpoint) of `id` or a shared borrow of it,
    /// for as long as the returned reference lives, and no `&mut` of it.
    #[inline]
    pub unsafe fn facts(&self, id: u32) -> &Facts {
        debug_assert!(!self.spare);
        // SAFETY: the caller's contract is `RecordRef::facts`'s.
        unsafe { self.record_ref(id).facts() }
    }

    /// The facts of `id`, to change.
    ///
    /// # Safety
    /// The caller holds the [`Endpoint`](crate::Endpoint) of `id` by value or through `&mut`,
    /// for as long as the returned reference lives: no other reference to
    /// these facts exists.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn facts_mut(&self, id: u32) -> &mut Facts {
        debug_assert!(!self.spare && !self.released);
        // SAFETY: the caller's contract is `RecordRef::facts_mut`'s.
        unsafe { self.record_ref(id).facts_mut() }
    }

    /// A new range of `count` ids from `base`, with one empty record per
    /// id, in its `Arc` ([`RangeInner::first`] set).
    #[inline(always)]
    pub(crate) fn new(ctx: &Context, base: u32, count: u32) -> Arc<RangeInner> {
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
        // Written in place in the `Arc`'s allocation: `Arc::new` built the
        // record on the stack and copied its 336 bytes in
        // (`reserve_one_no_spare` 368 instructions against 338 here,
        // `benches/instructions.rs`, rustc 1.95).
        let range = Arc::<RangeInner>::new_uninit();
        let at = Arc::as_ptr(&range).cast_mut();
        // SAFETY: `range` is a new allocation that no one else holds, and
        // `at` is where its value goes; it is written whole, once, before
        // `assume_init` below.
        unsafe {
            (*at).write(RangeInner {
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
                serial: next_serial(),
                gate: gate::Gate::new(),
                holds: holds::Holds::default(),
            });
        }
        // SAFETY: written just above.
        let range = unsafe { range.assume_init() };
        // Where the records are now that the range is in its `Arc` (inline
        // ones moved with it), before anyone else has the `Arc`.
        range
            .first
            .store(range.records.as_ptr().cast_mut(), Ordering::Relaxed);
        range
    }

    pub(crate) fn set_orphaned(&mut self, id: u32, orphaned: bool) {
        self.record_mut(id).facts.0.get_mut().orphaned = orphaned;
    }
}

impl gate::Gated for RangeInner {
    #[inline]
    fn gate(&self) -> &gate::Gate {
        &self.gate
    }
}

//! [`Endpoint<S, K>`]: one logical-endpoint id in lifecycle state `S` holding
//! an endpoint of kind `K`, with every transition as a consuming method.
//!
//! All methods live in one generic `impl` and state what they need as `where`
//! bounds (see [`crate::state`] and [`crate::kind`]), so a call in the wrong
//! state or on the wrong kind is a compile error that says what to call first.
//!
//! Transitions that create driver state call the driver first and change type
//! after; those that destroy it change type after the driver agreed. A failed
//! transition hands the endpoint back unchanged in [`Failed`].

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::driver::{EndpointProps, Shape};
use crate::error::{Alignment, Arg, Error, Failed, Failure, Result, Rule};
use crate::kind::{CanExport, Creatable, Enroll, HasFabricHandles, Kind, NoKind, TeamHasRoom};
use crate::ledger::{Facts, RangeInner, SlotGuard};
use crate::memory::round_up;
use crate::range::release_shared;
use crate::sharing::FabricHandle;
use crate::spec::Spec;
use crate::state::{
    CanCreate, CanDestroy, CanEnroll, CanRelease, CanShare, IsReady, Pending, Reserved, State,
};
use crate::unwind::OnUnwind;

/// One logical-endpoint id in state `S` (`Reserved`, `Pending`, `Ready`)
/// holding an endpoint of kind `K` (`NoKind` while reserved).
///
/// 16 bytes in every state. Not `Clone`: an endpoint has one owner. `Send` and
/// `Sync`: a ready endpoint can be bound from one thread per device.
///
/// Dropping a created endpoint destroys it (`cuLogicalEndpointDestroy`, which
/// also unbinds what this process bound, R7); the id goes back to its range,
/// which is released when its last endpoint is gone (R1). Teardown errors are
/// kept on the [`Context`] ([`Context::take_teardown_errors`]).
// `repr(C)`: every `Endpoint<S, K>` has one layout (the same fields, the
// marker zero-sized), so that a `Vec` of them changes state in place
// (`cast_vec`).
#[repr(C)]
pub struct Endpoint<S: State = Reserved, K: Kind = NoKind> {
    range: Arc<RangeInner>,
    id: u32,
    _state: PhantomData<fn() -> (S, K)>,
}

impl<S: State, K: Kind> std::fmt::Debug for Endpoint<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint<{}, {}>(id {})", S::NAME, K::NAME, self.id)
    }
}

impl<S: State, K: Kind> Drop for Endpoint<S, K> {
    fn drop(&mut self) {
        // A reserved id has nothing to destroy: no unwinding test either.
        if S::CREATED {
            crate::unwind::in_drop(|| {
                destroy_now(&self.range, self.id, true);
            });
        }
    }
}

/// `cuLogicalEndpointDestroy`, then drop the memory the bindings kept alive.
/// On failure the memory is kept (it may still be bound) and, from `Drop`,
/// the error is recorded.
///
/// Only the owner of the endpoint on `id` calls this: a transition that took
/// it by value, or its `Drop`.
///
/// The error is boxed: `None` is one register, and the error paths are out
/// of line.
fn destroy_now(range: &RangeInner, id: u32, from_drop: bool) -> Option<Box<Error>> {
    destroy_inline(range, id, from_drop)
}

/// [`destroy_now`], inline: for [`Endpoint::destroy`], which is then one
/// frame, not three (the others call `destroy_now`).
#[inline(always)]
fn destroy_inline(range: &RangeInner, id: u32, from_drop: bool) -> Option<Box<Error>> {
    // Copies in flight on this id (a forgotten `InFlight`) complete first (F4).
    // A panic inside that synchronize comes before the destroy: the id
    // still holds the endpoint, so it is left an orphan, which the range
    // destroys before it releases the id (R1.2) and before the memory its
    // bindings keep alive is let go (R7.2).
    let orphan = OnUnwind::new(|| {
        // SAFETY: only the owner of the endpoint on `id` destroys it (see
        // `destroy_now`), so no other reference to its facts exists.
        unsafe { range.facts_mut(id) }.orphaned = true;
    });
    let settled = crate::ledger::settle_destroy(range, id);
    orphan.disarm();
    if let Err(e) = settled {
        return destroy_failed(range, id, from_drop, e);
    }
    // A panic inside the call is taken as coming after the destroy (see
    // `OnUnwind`): forget the endpoint then, and never destroy twice; unless
    // the backend says it refused the destroy: then the endpoint is there,
    // an orphan, as after a failed destroy from `Drop`.
    let done = OnUnwind::new(|| {
        if range.ctx.driver().unwound_answer(Call::Destroy).is_some() {
            // SAFETY: as in `destroy_failed`.
            unsafe { range.facts_mut(id) }.orphaned = true;
        } else {
            forget_endpoint(range, id);
        }
    });
    // SAFETY: `id` belongs to this range and its endpoint to the typed
    // `Endpoint` being destroyed or dropped; the borrow checker has ended every
    // `Binding` and `EndpointRef` of it (R3.4, R7.2).
    let r = unsafe { range.ctx.driver().destroy(id) };
    done.disarm();
    match r {
        Ok(()) => {
            forget_endpoint(range, id);
            None
        }
        Err(code) => destroy_failed(range, id, from_drop, range.ctx.error(Call::Destroy, code)),
    }
}

/// The endpoint on `id` is still there after `e`: from `Drop`, keep its
/// bookkeeping and the memory it keeps alive (freeing memory that may still
/// be bound is the one thing worse than a leak) and record the error; the id
/// still holds the endpoint, so the range retries the destroy before it
/// releases (R1.2), and if that fails too it leaks the memory for good.
#[cold]
#[inline(never)]
fn destroy_failed(range: &RangeInner, id: u32, from_drop: bool, e: Error) -> Option<Box<Error>> {
    if from_drop {
        // SAFETY: only the owner of the endpoint on `id` destroys it (see
        // `destroy_now`), so no other reference to its facts exists.
        unsafe { range.facts_mut(id) }.orphaned = true;
        range.ctx.record_teardown(e);
        None
    } else {
        Some(Box::new(e))
    }
}

/// The id holds no endpoint any more: clear its facts, let go of its fabric
/// handle, and drop the memory the bindings kept alive (R7.2), outside the lock.
#[inline]
fn forget_endpoint(range: &RangeInner, id: u32) {
    // Facts cleared; nothing bound and nothing attached (the usual case):
    // no lock, nothing to move out of the slot, and the rest out of line.
    // SAFETY: only the owner of the endpoint on `id` destroys it (see
    // `destroy_now`): a transition that took it by value, or its `Drop`.
    if unsafe { range.owner_forget(id) } {
        return;
    }
    forget_rest(range, range.slot(id));
}

/// The cold part of [`forget_endpoint`]: the bindings, fabric handle and
/// windows taken out under the lock, the handle detached and the memory
/// released outside it.
#[cold]
#[inline(never)]
fn forget_rest(range: &RangeInner, mut slot: SlotGuard<'_>) {
    let bindings = slot.reset();
    range.bindings_changed();
    let fabric = slot.take_fabric();
    let windows = slot.take_windows(|_| true);
    slot.set_peers(Vec::new());
    drop(slot);
    if let Some(f) = fabric {
        range.ctx.detach(&f);
    }
    drop(bindings); // releases memory only now that nothing is bound (R7.2)
    drop(windows); // peer memory the portable path kept
}

/// Either state after a non-blocking [`Endpoint::poll`].
pub enum Readiness<K: Kind> {
    /// A query reported the endpoint constructed.
    Ready(Endpoint<crate::Ready, K::Ready>),
    /// Not yet: poll again later.
    Pending(Endpoint<Pending, K>),
}

impl<K: Kind> std::fmt::Debug for Readiness<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readiness::Ready(e) => write!(f, "Ready({e:?})"),
            Readiness::Pending(e) => write!(f, "Pending({e:?})"),
        }
    }
}

impl<S: State, K: Kind> Endpoint<S, K> {
    pub(crate) fn from_parts(range: Arc<RangeInner>, id: u32) -> Self {
        Endpoint {
            range,
            id,
            _state: PhantomData,
        }
    }

    /// Takes the endpoint apart without running `Drop`.
    pub(crate) fn into_parts(self) -> (Arc<RangeInner>, u32) {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; the `Arc` moves out once.
        let range = unsafe { std::ptr::read(&me.range) };
        (range, me.id)
    }

    /// The same id in another state or kind, without running `Drop`.
    pub(crate) fn cast<S2: State, K2: Kind>(self) -> Endpoint<S2, K2> {
        let (range, id) = self.into_parts();
        Endpoint::from_parts(range, id)
    }

    /// [`Endpoint::cast`] of every endpoint of `v`, in place: no allocation
    /// and no pass over the elements.
    pub(crate) fn cast_vec<S2: State, K2: Kind>(v: Vec<Self>) -> Vec<Endpoint<S2, K2>> {
        let mut v = ManuallyDrop::new(v);
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        // SAFETY: `Endpoint` is `repr(C)` with fields that do not depend on
        // `S` or `K` (the marker is a zero-sized `PhantomData`), so both
        // types have the same size and alignment and every value of one is a
        // valid value of the other; the buffer was allocated by a `Vec` with
        // this layout, `len` and `cap` are its own, and `v` is never used or
        // dropped again. As with `cast`, the caller vouches for the state.
        unsafe { Vec::from_raw_parts(ptr.cast::<Endpoint<S2, K2>>(), len, cap) }
    }

    /// This endpoint seen in another state, borrowed: how a team's
    /// `TeamReady` endpoint is lent out as `Ready` once the ranks agreed
    /// that every rank bound (R13.3). The caller vouches for the state.
    pub(crate) fn as_state<S2: State>(&self) -> &Endpoint<S2, K> {
        // SAFETY: `Endpoint` is `repr(C)` with fields that do not depend on
        // `S` (the marker is a zero-sized `PhantomData`), so both types have
        // the same size, alignment and field offsets, and `self` is a valid
        // `Endpoint<S2, K>`; the result borrows `self` and cannot move or
        // drop it.
        unsafe { &*std::ptr::from_ref(self).cast::<Endpoint<S2, K>>() }
    }

    pub(crate) fn range(&self) -> &Arc<RangeInner> {
        &self.range
    }

    pub(crate) fn slot(&self) -> SlotGuard<'_> {
        self.range.slot(self.id)
    }

    /// What the endpoint is, without a lock.
    pub(crate) fn facts(&self) -> &Facts {
        // SAFETY: `self` is the one endpoint of its id (a range hands each id
        // out once and `Endpoint` is not `Clone`), borrowed shared for the
        // result's lifetime; writes need the endpoint owned, which that
        // borrow excludes.
        unsafe { self.range.facts(self.id) }
    }

    /// What the endpoint is, to change.
    ///
    /// # Safety
    /// Only for a transition that took the endpoint by value (or `Drop`):
    /// no borrow of `self` may exist while the result lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn facts_mut(&self) -> &mut Facts {
        // SAFETY: by the caller's contract this is the only reference.
        unsafe { self.range.facts_mut(self.id) }
    }

    /// Sets (`Some`) or clears (`None`) the bytes every rank bound and
    /// agreed on (a heap's top), past which copies through this endpoint
    /// are refused before the driver (R13.3).
    pub(crate) fn set_agreed(&self, top: Option<u64>) {
        let mut slot = self.slot();
        slot.set_agreed(top);
        // Under the lock: a copy's facts read before know they are stale.
        self.range.bindings_changed();
        drop(slot);
    }

    /// Sets what peer devices bound on this endpoint, as an every-rank-bound
    /// agreement said (`team::agree_bound`): copies outside it are refused
    /// before the driver (F9, R13.5).
    pub(crate) fn set_peers(&self, peers: Vec<crate::error::PeerBound>) {
        self.change_peers(|_| peers);
    }

    /// This rank stops copying through the endpoint (a close, R13.7): what
    /// its peers bound may be unbound from now on, so every copy through it
    /// is refused before the driver until the next agreement says what they
    /// bound again ([`Error::CopyPeerNotBound`], whichever bound form of
    /// the bring-up names the endpoint).
    pub(crate) fn peers_stop(&self) {
        self.change_peers(|slot| {
            slot.peers()
                .map(|p| crate::error::PeerBound {
                    covered: Vec::new(),
                    ..p.clone()
                })
                .collect()
        });
    }

    /// Replaces the record of what peers bound with `f` of the slot, and
    /// moves the range's generation under the lock, as `set_agreed` does,
    /// so that a copy's facts read before know they are stale.
    fn change_peers(&self, f: impl FnOnce(&SlotGuard<'_>) -> Vec<crate::error::PeerBound>) {
        let mut slot = self.slot();
        let peers = f(&slot);
        slot.set_peers(peers);
        self.range.bindings_changed();
        drop(slot);
    }

    /// For an imported endpoint of a team bring-up: the ranks agreed it was
    /// created with `COUNTED_OPS`, so each device this process enrolls is
    /// checked for attribute 155 before the driver (R2.4), as on the creator.
    pub(crate) fn agreed_counted_ops(self, counted_ops: bool) -> Self {
        // SAFETY: `self` is taken by value; no borrow of it exists.
        unsafe { self.facts_mut() }.counted_ops = counted_ops;
        self
    }

    fn fail<T>(self, error: Error) -> Result<T, Failed<Self>> {
        Err(Failure::new(error, self))
    }

    /// The logical-endpoint id (`CUlogicalEndpointId`).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The context this endpoint belongs to.
    pub fn context(&self) -> &Context {
        &self.range.ctx
    }

    /// Bytes that can be bound per device (`prop.size`, R2.3); 0 while reserved.
    pub fn size(&self) -> u64 {
        self.facts().size
    }

    /// The bind alignment in bytes (R5.3, R10); 0 while reserved.
    pub fn bind_alignment(&self) -> u64 {
        self.facts().align
    }

    /// The owner device (unicast) or the team devices this process enrolled
    /// (multicast). Empty for an imported unicast endpoint (its owner is in
    /// the exporting process) and for an imported team before this process
    /// enrolls its devices. Neither locks nor allocates.
    pub fn devices(&self) -> &[Device] {
        &self.facts().devices
    }

    // ---------------------------------------------------------------- Reserved

    /// Creates an endpoint on this id (`cuLogicalEndpointCreate`, R2), and for
    /// a [`Spec::multicast`] team enrolls every device (R4).
    ///
    /// Checked before the driver: devices exist and are distinct; the size is
    /// non-zero, a multiple of `bindAlignment` and at most `maxSize` from
    /// `cuLogicalEndpointGetLimits` (R2.3, R10), with the nearest valid size in
    /// the error; `COUNTED_OPS` against attribute 155 (R2.4).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`], [`Error::AlreadyEnrolled`], [`Error::EmptyTeam`],
    /// [`Error::ZeroSize`], [`Error::Misaligned`], [`Error::SizeTooLarge`],
    /// [`Error::FeatureMissing`], [`Error::Unsupported`] (driver before 13.3),
    /// [`Error::Driver`]. The id comes back, still reserved.
    pub fn create<K2: Creatable>(
        self,
        spec: Spec<K2>,
    ) -> Result<Endpoint<Pending, K2>, Failed<Self>>
    where
        S: CanCreate,
    {
        // The record once, for the orphan test and the facts written below.
        let rec = self.range.record_ref(self.id);
        // SAFETY: `create` holds the endpoint by value; no borrow of its
        // facts is alive.
        if unsafe { rec.facts() }.orphaned
            && let Err(e) = self.retry_orphan()
        {
            return self.fail(e);
        }
        let limits = match self.check_spec(&spec) {
            Ok(l) => l,
            Err(e) => return self.fail(e),
        };
        // Errors are built before `self.fail(..)` moves `self`: no context
        // clone on the success path.
        let d = self.context().driver();
        // `Err((created, code))`: which call failed, and with what (and for
        // an enrollment, the device in `failed_dev`).
        let mut failed_dev = None;
        let outcome = {
            // A panic inside create or an enrollment leaves an endpoint on
            // the id: the range destroys it before it releases (R1.2). Not a
            // create the backend says it refused (no endpoint was made; an
            // enrollment's panic finds no such answer: asked at once, the
            // create's is taken by this guard or forgotten by the next call).
            let orphan = OnUnwind::new(|| {
                if self
                    .context()
                    .driver()
                    .unwound_answer(Call::Create)
                    .is_some()
                {
                    return;
                }
                // SAFETY: `create` holds the endpoint by value and no borrow
                // of its facts is alive while the guard is.
                unsafe { self.facts_mut() }.orphaned = true;
            });
            // SAFETY: `self` is a `Reserved` endpoint: the id is this range's
            // and holds no endpoint (R2.1, R3.4).
            let mut r = unsafe { d.create(self.id, spec.props) }.map_err(|code| (false, code));
            // A unicast spec has no team devices: no loop (a constant).
            if K2::MULTICAST && r.is_ok() {
                for &dev in &spec.devices {
                    // SAFETY: the endpoint was created just above; nothing is
                    // bound (R4.4).
                    if let Err(code) = unsafe { d.add_device(self.id, dev) } {
                        failed_dev = Some(dev);
                        r = Err((true, code));
                        break;
                    }
                }
            }
            orphan.disarm();
            r
        };
        match outcome {
            Ok(()) => {}
            Err((false, code)) => {
                let error = self
                    .context()
                    .error_for(Call::Create, code, Some(&spec.props));
                return self.fail(error);
            }
            Err((true, code)) => {
                let ctx = self.context().clone();
                let error = match failed_dev {
                    Some(dev) => ctx.enroll_error(dev, code),
                    None => ctx.error(Call::AddDevice, code),
                };
                // Undo the create so that the id comes back empty. If even
                // that fails, the range retries before it releases (R1.2).
                if let Some(e2) = destroy_now(&self.range, self.id, false) {
                    tracing::error!("undo of create failed");
                    ctx.record_teardown(*e2); // not swallowed
                    // SAFETY: `create` took the endpoint by value.
                    unsafe { self.facts_mut() }.orphaned = true;
                }
                return self.fail(error);
            }
        }
        {
            // SAFETY: `create` took the endpoint by value.
            let facts = unsafe { rec.facts_mut() };
            facts.size = spec.props.size;
            facts.align = limits.bind_alignment;
            facts.devices = match spec.props.shape {
                // Inline, no `push`: one device in a buffer of four.
                Shape::Unicast { owner } => smallvec::SmallVec::from_buf_and_len(
                    [owner, Device(0), Device(0), Device(0)],
                    1,
                ),
                Shape::Multicast { .. } => spec.devices.as_slice().into(),
            };
            facts.team_size = match spec.props.shape {
                Shape::Unicast { .. } => 1,
                Shape::Multicast { num_devices } => num_devices,
            };
            facts.counted_ops = spec.props.counted_ops;
            facts.exportable = spec.props.ipc_fabric;
        }
        // A new endpoint on the id: facts kept of one before it (a copy's
        // memo, `copy/check.rs`) are stale.
        self.range.bindings_changed();
        Ok(self.cast())
    }

    /// A reserved id whose endpoint could not be destroyed earlier: try again.
    fn retry_orphan(&self) -> Result<()> {
        if !self.facts().orphaned {
            return Ok(());
        }
        match destroy_now(&self.range, self.id, false) {
            None => Ok(()),
            Some(e) => Err(*e),
        }
    }

    fn check_spec<K2>(&self, spec: &Spec<K2>) -> Result<crate::Limits> {
        let ctx = self.context();
        let props: EndpointProps = spec.props;
        let owner;
        let devices: &[Device] = match props.shape {
            Shape::Unicast { owner: o } => {
                // One device: it exists, and there is nothing to compare it with.
                ctx.check_device(o)?;
                owner = [o];
                &owner
            }
            Shape::Multicast { num_devices: 0 } => return Err(Error::EmptyTeam),
            Shape::Multicast { .. } => {
                let team = &spec.devices[..];
                for (i, &dev) in team.iter().enumerate() {
                    ctx.check_device(dev)?;
                    if team[..i].contains(&dev) {
                        return Err(Error::AlreadyEnrolled { device: dev });
                    }
                }
                for (i, &dev) in team.iter().enumerate() {
                    ctx.check_multicast_device(dev)?;
                    ctx.check_clique(dev, &team[..i])?;
                }
                team
            }
        };
        if props.counted_ops {
            // Attribute 155 is a device's (cuda.h: "Device supports counted
            // operations via logical endpoints"): the devices that take part
            // need it — the owner, the team devices named here; a team
            // enrolled later is checked device by device at `add_device`.
            // Not every device of the node: one without it that the
            // endpoint never involves refuses nothing.
            for &dev in devices {
                ctx.check_counted_ops(dev)?;
            }
        }
        if props.ipc_fabric {
            // Attribute 158 likewise (13.5): each device taking part.
            for &dev in devices {
                ctx.check_fabric_handles(dev)?;
            }
        }
        let limits = ctx
            .queries()
            .get_limits(props)
            .map_err(|code| ctx.error_for(Call::GetLimits, code, Some(&props)))?;
        // One test on the success path (for a power-of-two alignment, the
        // usual case, a mask); which rule failed, and the nearest valid
        // size, out of line (R2.3, R10).
        let (size, align) = (props.size, limits.bind_alignment);
        let aligned = if align.is_power_of_two() {
            size & (align - 1) == 0
        } else {
            size.is_multiple_of(align.max(1))
        };
        if size == 0 || size > limits.max_size || !aligned {
            return Err(size_refused(size, limits));
        }
        Ok(limits)
    }

    /// Attaches the endpoint behind a fabric handle exported by another
    /// process to this id (`cuLogicalEndpointImport`, R9). It is pending until
    /// a query reports it ready (R9.2). An imported multicast endpoint's
    /// process enrolls its own devices with `add_device`.
    ///
    /// # Errors
    /// [`Error::Driver`] with `NOT_PERMITTED` (no access to the handle),
    /// `NOT_SUPPORTED` (this process cannot use that endpoint) or
    /// `INVALID_VALUE` (not a handle of this driver, R9.4); before the driver,
    /// [`Error::BadHandle`] when the handle's metadata claims what no device
    /// here allows (a team's bind alignment or size, R10). The id comes back.
    pub fn import<K2: CanExport>(
        self,
        handle: &FabricHandle<K2>,
    ) -> Result<Endpoint<Pending, K2::Imported>, Failed<Self>>
    where
        S: CanCreate,
    {
        if let Err(e) = self.retry_orphan() {
            return self.fail(e);
        }
        if let Err(e) = self.check_claims(handle) {
            return self.fail(e);
        }
        let c = handle.bytes();
        if let Err(id) = self.context().try_attach(c.0, self.id) {
            return self.fail(Error::AlreadyAttached { id });
        }
        let r = {
            // A panic inside the import leaves the endpoint attached: the
            // range destroys it (and detaches the handle) before it releases;
            // an import the backend says it refused attached nothing.
            let orphan = OnUnwind::new(|| {
                if self
                    .context()
                    .driver()
                    .unwound_answer(Call::Import)
                    .is_some()
                {
                    self.context().detach(&c.0);
                    return;
                }
                // SAFETY: `import` holds the endpoint by value and no borrow
                // of its facts is alive while the guard is.
                unsafe { self.facts_mut() }.orphaned = true;
                self.slot().set_fabric(c.0);
            });
            // SAFETY: `self` is a `Reserved` endpoint: the id is this range's
            // and holds no endpoint (R2.1, R3.4).
            let r = unsafe { self.context().driver().import(self.id, c) };
            orphan.disarm();
            r
        };
        if let Err(code) = r {
            self.context().detach(&c.0);
            let error = self.context().error(Call::Import, code);
            return self.fail(error);
        }
        {
            // SAFETY: `import` took the endpoint by value.
            let facts = unsafe { self.facts_mut() };
            facts.size = handle.size();
            facts.align = handle.bind_alignment();
            facts.team_size = handle.team_size();
            facts.devices.clear();
            // It came by a fabric handle; counted operations are what a
            // bring-up agreed (`agreed_counted_ops`), unknown otherwise.
            facts.exportable = true;
            facts.counted_ops = false;
            self.slot().set_fabric(c.0);
        }
        // As `create`'s.
        self.range.bindings_changed();
        Ok(self.cast())
    }

    /// What a handle's metadata claims, checked against the driver before
    /// the import: the metadata travels beside the driver's bytes under a
    /// checksum anyone can recompute, so it is trusted only as far as the
    /// driver confirms it. For a team, `cuLogicalEndpointGetLimits` of the
    /// claimed properties must give the claimed bind alignment and allow the
    /// claimed size (R10), so that every bind the importer checks against
    /// them is aligned as the driver needs (R5.3). (An imported unicast
    /// endpoint binds nothing, R5.7.) A unicast endpoint's claimed size is
    /// not checked against this process's devices: the owner's device, on
    /// another node maybe, may allow more (R10 is the owner's limit). It
    /// bounds the copies' range checks, which the driver checks again (F9),
    /// and a [`crate::CopyBatch::get_host`] buffer, which is allocated
    /// fallibly. What the importer cannot know at all — the real kind, team
    /// size and size — the driver checks at AddDevice, bind and copy (R4.1,
    /// R4.2, R5.4, F9).
    fn check_claims<K2: CanExport>(&self, handle: &FabricHandle<K2>) -> Result<()> {
        let bad = |reason: String| Error::BadHandle {
            expected: K2::NAME,
            reason,
        };
        if !<K2 as Kind>::MULTICAST {
            return Ok(());
        }
        let mut props = EndpointProps::new(
            Shape::Multicast {
                num_devices: handle.team_size(),
            },
            handle.size(),
        );
        props.ipc_fabric = true;
        let limits = self.context().limits(&props)?;
        if limits.bind_alignment != handle.bind_alignment() {
            return Err(bad(format!(
                "it claims bind alignment {}, the driver gives {} for a team of {} with {} bytes (R10, R5.3)",
                handle.bind_alignment(),
                limits.bind_alignment,
                handle.team_size(),
                handle.size()
            )));
        }
        if handle.size() > limits.max_size {
            return Err(bad(format!(
                "it claims {} bytes, the driver allows at most {} (R10, R2.3)",
                handle.size(),
                limits.max_size
            )));
        }
        Ok(())
    }

    /// Gives the id back. The range it came from is released
    /// (`cuLogicalEndpointIdRelease`, R1) when this was its last id and
    /// nothing else holds the range (a [`CopyGraph`](crate::CopyGraph)
    /// naming it keeps it until the graph goes; a forgotten one, for the
    /// process's life:
    /// `data_path::r1_a_forgotten_graph_keeps_its_range_and_memory_while_release_lets_go`).
    ///
    /// # Errors
    /// [`Error::Driver`] from the release.
    #[inline(always)]
    pub fn release(self) -> Result<()>
    where
        S: CanRelease,
    {
        let (range, _) = self.into_parts();
        release_shared(range)
    }

    // ---------------------------------------------------------------- Pending

    /// Enrolls `dev` in the team (`cuLogicalEndpointAddDevice`, R4). For a
    /// [`crate::Team`] the count is in the type: one device too many does not
    /// compile (R4.2).
    ///
    /// Checked before the driver: `dev` exists and is not enrolled yet (R4.2).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`], [`Error::AlreadyEnrolled`], [`Error::TeamFull`],
    /// [`Error::Driver`] (`INVALID_DEVICE` for a device outside the team's
    /// clique, R4.5). The endpoint comes back unchanged.
    pub fn add_device<K2: Kind>(
        self,
        dev: impl Into<Device>,
    ) -> Result<Endpoint<Pending, K2>, Failed<Self>>
    where
        S: CanEnroll,
        K: Enroll<S, Next = K2>,
        <K as Enroll<S>>::HasRoom: TeamHasRoom,
    {
        let dev = dev.into();
        if let Err(e) = self
            .context()
            .check_device(dev)
            .and_then(|()| self.context().check_multicast_device(dev))
            .and_then(|()| self.context().check_clique(dev, &self.facts().devices))
            .and_then(|()| match self.facts().counted_ops {
                true => self.context().check_counted_ops(dev),
                false => Ok(()),
            })
            .and_then(|()| match self.facts().exportable {
                true => self.context().check_fabric_handles(dev),
                false => Ok(()),
            })
        {
            return self.fail(e);
        }
        let check = {
            let facts = self.facts();
            if facts.devices.contains(&dev) {
                Err(Error::AlreadyEnrolled { device: dev })
            } else if facts.devices.len() as u32 >= facts.team_size {
                Err(Error::TeamFull {
                    team_size: facts.team_size,
                })
            } else {
                Ok(())
            }
        };
        if let Err(e) = check {
            return self.fail(e);
        }
        // SAFETY: the endpoint is `Pending` and incomplete, so nothing can be
        // bound on it yet (R4.4); the id is this endpoint's own.
        if let Err(code) = unsafe { self.context().driver().add_device(self.id, dev) } {
            let error = self.context().enroll_error(dev, code);
            return self.fail(error);
        }
        // SAFETY: `add_device` took the endpoint by value.
        unsafe { self.facts_mut() }.devices.push(dev);
        // As `create`'s (no copy names a pending endpoint: the count is
        // for what the facts memo says it keys on).
        self.range.bindings_changed();
        Ok(self.cast())
    }

    // ------------------------------------------------------- Pending or Ready

    /// Destroys the endpoint (`cuLogicalEndpointDestroy`, R7) and hands the id
    /// back, still reserved (R7.1). Every [`crate::Binding`] must be gone
    /// first: the borrow checker refuses a destroy while one is alive.
    ///
    /// # Errors
    /// [`Error::Driver`]; the endpoint comes back unchanged.
    #[inline(always)]
    pub fn destroy(self) -> Result<Endpoint<Reserved, NoKind>, Failed<Self>>
    where
        S: CanDestroy,
    {
        // Out of the endpoint first: a panic inside the destroy must not
        // let the endpoint's `Drop` destroy it a second time.
        let (range, id) = self.into_parts();
        match destroy_inline(&range, id, false) {
            None => Ok(Endpoint::from_parts(range, id)),
            Some(error) => Err(Failure::new(*error, Endpoint::from_parts(range, id))),
        }
    }

    // ------------------------------------------------------------------ Ready

    /// A kernel-side reference to this endpoint: its id as a `Copy`,
    /// `#[repr(transparent)]` value that borrows the endpoint, to pass to
    /// kernels.
    pub fn kernel_ref(&self) -> crate::EndpointRef<'_>
    where
        S: IsReady,
    {
        crate::EndpointRef::new(self.id)
    }

    /// Exports a fabric handle for other processes (`cuLogicalEndpointExport`,
    /// R8). Only endpoints created from an `.exportable()` spec (R8.1).
    ///
    /// A pending endpoint can be exported (R13.1: Export, Destroy and
    /// IdRelease need no readiness): a team spread over processes is
    /// exported before it is complete, the other ranks import it and enroll
    /// their own devices, and every rank then waits (R3.2, R9.2); a unicast
    /// endpoint is exported while the driver still constructs it, so the
    /// handle exchange overlaps construction. Importers always wait for
    /// readiness themselves, and nothing binds before a query (R3.1).
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn export(&self) -> Result<FabricHandle<K>>
    where
        S: CanShare,
        K::Origin: HasFabricHandles,
    {
        let ctx = self.context();
        // SAFETY: the id holds this endpoint (created: `CanShare`); export
        // changes nothing about it (R3.4).
        let c = ctx.check(Call::Export, unsafe { ctx.driver().export(self.id) })?;
        let mut slot = self.slot();
        if slot.fabric() != Some(&c.0) {
            if let Some(old) = slot.set_fabric(c.0) {
                ctx.detach(&old);
            }
            ctx.attach(c.0, self.id);
        }
        drop(slot);
        let facts = self.facts();
        Ok(FabricHandle::new(
            c.0,
            facts.size,
            facts.align,
            facts.team_size,
        ))
    }
}

/// Why `size` is not a valid endpoint size for `limits` (R2.3, R10): zero,
/// over `maxSize`, or not a multiple of the bind alignment, with the
/// nearest valid size.
#[cold]
#[inline(never)]
fn size_refused(size: u64, limits: crate::Limits) -> Error {
    let align = limits.bind_alignment.max(1);
    // The largest valid size, for the suggestions.
    let largest = || limits.max_size / align * align;
    if size == 0 {
        return Error::ZeroSize {
            what: Arg::EndpointSize,
            suggested: align,
            rule: Some(Rule::R2_3),
        };
    }
    if size > limits.max_size {
        return Error::SizeTooLarge {
            requested: size,
            max_size: limits.max_size,
            suggested: largest(),
        };
    }
    let up = round_up(size, align);
    Error::Misaligned {
        what: Arg::EndpointSize,
        value: size,
        alignment: align,
        alignment_kind: Alignment::BindAlignment,
        suggested: if up <= limits.max_size { up } else { largest() },
        rule: Rule::R2_3,
    }
}

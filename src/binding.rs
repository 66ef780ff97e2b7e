//! Binding memory to a ready endpoint (rule R5) and unbinding it (R6).
//!
//! A [`Binding`] is the token a bind returns. It borrows the endpoint and the
//! memory, so neither can be destroyed or freed while it lives (R7.2), and it
//! remembers the exact device, offset and size, so the only unbind there is
//! is the one that matches the bind (R6.1, R6.2, C4). Dropping it unbinds.
//!
//! Soundness does not depend on `Drop` running: the endpoint also keeps the
//! memory alive until it is unbound or the endpoint destroyed, so a
//! `mem::forget` leaks memory but never leaves freed memory bound.

use crate::driver::{Call, Device, Location, attr};
use crate::endpoint::Endpoint;
use crate::error::{Alignment, Arg, Error, Extent, Result, Role, Rule};
use crate::kind::{Accepts, CanBind, Kind};
use crate::ledger::{Bound, RangeInner, Slot};
use crate::memory::{BindSource, Target};
use crate::state::{IsReady, State};

/// A live binding of memory to a ready endpoint on one device.
///
/// Unbind with [`Binding::unbind`] to see errors; dropping it unbinds too,
/// and if that unbind fails the error is kept on the context
/// ([`crate::Context::take_teardown_errors`]).
#[must_use = "dropping a Binding unbinds the memory at once: keep it in a named variable (`let b = ...`) for as long as the memory should stay bound (`let _ = ...` unbinds immediately)"]
pub struct Binding<'a> {
    range: &'a RangeInner,
    id: u32,
    dev: Device,
    offset: u64,
    size: u64,
}

impl std::fmt::Debug for Binding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("id", &self.id)
            .field("device", &self.dev)
            .field("offset", &self.offset)
            .field("size", &self.size)
            .finish()
    }
}

impl Binding<'_> {
    /// The device bound on.
    pub fn device(&self) -> Device {
        self.dev
    }

    /// Offset in the endpoint range, bytes.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes bound.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Lends `ep`, the endpoint this binding is on, to a
    /// [`CopyBatch`](crate::CopyBatch) *through the binding*: the copy's
    /// [`InFlight`](crate::InFlight) token then borrows the binding too, so
    /// unbinding it while the copy is in flight does not compile (F4, as
    /// destroying the endpoint does not). Wait the token, or synchronize
    /// the stream and drop it, before [`Binding::unbind`].
    ///
    /// (A copy that names `&ep` alone borrows the endpoint but not the
    /// binding; an unbind then synchronizes the streams with copies in
    /// flight on the endpoint first, at run time.)
    ///
    /// # Errors
    /// [`Error::NotThisBinding`] when `ep` is another endpoint.
    pub fn copy_through<'b, S: State, K: Kind>(
        &'b self,
        ep: &'b Endpoint<S, K>,
    ) -> Result<&'b Endpoint<S, K>> {
        if std::ptr::eq(&**ep.range(), self.range) && ep.id() == self.id {
            Ok(ep)
        } else {
            Err(Error::NotThisBinding {
                id: ep.id(),
                binding_id: self.id,
            })
        }
    }

    /// Unbinds (`cuLogicalEndpointUnbind` with this bind's exact device,
    /// offset and size, R6). The memory is let go only once the driver agreed.
    ///
    /// # Errors
    /// [`Error::UnbindUnderGraph`] while a [`CopyGraph`](crate::CopyGraph)
    /// that names the endpoint lives (F8), before the driver;
    /// [`Error::CopyUnbindReentered`] for an unbind made from inside a
    /// copy's enqueue on this thread (a layer calling back); [`Error::Driver`].
    /// The memory then stays bound, and the endpoint keeps
    /// it alive until `destroy` unbinds everything (R7); the error is `'static`
    /// so that `?` works into any error type.
    #[inline(always)]
    pub fn unbind(self) -> Result<()> {
        // The token forgets itself before the call that ends it: a panic
        // inside the unbind must not let `Drop` unbind a second time (R6.1).
        // Its fields copied out first, and the rollback below holds them by
        // value: the token moved into a `ManuallyDrop`, and borrowed by the
        // rollback, was kept on the stack (unbind 135 instructions against
        // 130, `benches/instructions.rs`).
        let me = self.parts();
        std::mem::forget(self);
        me.unbind_now()
    }
}

impl<'a> Binding<'a> {
    /// What an unbind needs of the token, by value.
    #[inline(always)]
    fn parts(&self) -> Parts<'a> {
        Parts {
            range: self.range,
            id: self.id,
            dev: self.dev,
            offset: self.offset,
            size: self.size,
        }
    }
}

/// A [`Binding`]'s fields without its `Drop`: what its unbind works on.
#[derive(Clone, Copy)]
struct Parts<'a> {
    range: &'a RangeInner,
    id: u32,
    dev: Device,
    offset: u64,
    size: u64,
}

impl Parts<'_> {
    /// Unbinds; the endpoint lets go of the memory once the driver agreed. A
    /// panic inside the call leaves the record (and the memory) with the
    /// endpoint until it is destroyed: kept a little longer, never freed
    /// while it may be bound (R7.2).
    // Always: `#[inline]` left it a call from `unbind` (6 instructions).
    #[inline(always)]
    fn unbind_now(self) -> Result<()> {
        let ctx = &self.range.ctx;
        // No copy through the range enqueued from another thread between
        // the settle and the driver's unbind (F4).
        let gate = crate::ledger::gate::ChangeGate::unbind(self.range, self.id)?;
        // Copies in flight on this id (a forgotten `InFlight`) complete first (F4).
        crate::ledger::settle(self.range, self.id)?;
        // A panic inside the call, before or after the driver unbound: the
        // record stays, keeping the memory until destroy (R7.2) and its
        // extent (no bind over it, R5.9), but covers no byte from then on,
        // so no copy passes F9 on it.
        let unwound = crate::unwind::OnUnwind::new(move || self.unbound_under_a_panic());
        // SAFETY: exactly the range this `Binding` token was made for, unbound
        // once (the token is consumed or dropped), so R6.1, R6.2 and C4 hold.
        let r = unsafe {
            ctx.driver()
                .unbind(self.id, self.dev, self.offset, self.size)
        };
        unwound.disarm();
        if let Err(code) = r {
            return Err(unbind_failed(ctx, code));
        }
        let (dev, offset) = (self.dev, self.offset);
        let mut slot = self.range.slot(self.id);
        let keep = take_record_unbind(&mut slot, dev, offset, self.size);
        self.range.bindings_changed();
        if slot.has_windows() {
            // The portable path's window of this bind (out of line).
            return take_window_then_drop(slot, keep, dev, offset);
        }
        drop(slot);
        drop(keep); // may release the memory: outside the lock
        // Left before the answer is made: dropped after it, the answer was
        // written and read back around the leave (the lifecycle on `Null`
        // 586 instructions against 581 here, `benches/instructions.rs`).
        gate.end();
        Ok(())
    }
}

impl Parts<'_> {
    /// After a panic inside the driver's unbind, which may or may not have
    /// unbound: [`record_unwound`]. Out of line: only unwinding comes here.
    #[cold]
    #[inline(never)]
    fn unbound_under_a_panic(&self) {
        record_unwound(self.range, self.id, self.dev, self.offset, self.size);
    }
}

/// After a panic inside a bind's or an unbind's driver call, which may or
/// may not have acted: the record of that bind becomes [`Bound::UNWOUND`]
/// (F9 refuses copies there, a bind over it is refused, R5.9) and keeps its
/// memory until the endpoint is destroyed (R7.2); its window goes.
fn record_unwound(range: &RangeInner, id: u32, dev: Device, offset: u64, size: u64) {
    let mut slot = range.slot(id);
    if let Some(b) = slot
        .bindings
        .iter_mut()
        .find(|b| b.dev == dev && b.offset == offset && b.size == size && b.covers())
    {
        b.mark_unwound();
    }
    range.bindings_changed();
    let window = slot.take_windows(|w| w.is_local(dev, offset));
    drop(slot);
    drop(window);
}

/// The error of a bind on a device the endpoint does not have (R5.2). Out
/// of line: its list of the allowed devices is an allocation.
#[cold]
#[inline(never)]
fn wrong_device(dev: Device, multicast: bool, allowed: &[Device]) -> Error {
    Error::WrongDevice {
        device: dev,
        role: if multicast {
            Role::TeamDevice
        } else {
            Role::Owner
        },
        allowed: allowed.to_vec(),
        rule: Rule::R5_2,
    }
}

/// The error of a bind over `b` (R5.9): a live binding, or bytes a bind
/// or unbind that unwound left held. Out of line: the bind's loop stays
/// short.
#[cold]
#[inline(never)]
fn overlap(dev: Device, offset: u64, size: u64, b: &Bound) -> Error {
    let (other_offset, other_size) = (b.offset, b.size);
    if b.covers() {
        Error::Overlap {
            device: dev,
            offset,
            size,
            other_offset,
            other_size,
        }
    } else {
        Error::OverlapUnwound {
            device: dev,
            offset,
            size,
            other_offset,
            other_size,
        }
    }
}

/// The error of a failed unbind.
#[cold]
#[inline(never)]
fn unbind_failed(ctx: &crate::Context, code: crate::driver::Code) -> Error {
    ctx.error(Call::Unbind, code)
}

/// The end of an unbind on a range with windows: this bind's window is
/// taken out under the lock, and it and `keep` are dropped outside it.
#[cold]
#[inline(never)]
fn take_window_then_drop(
    mut slot: crate::ledger::SlotGuard<'_>,
    keep: Option<crate::memory::KeepAlive>,
    dev: Device,
    offset: u64,
) -> Result<()> {
    let window = slot.take_windows(|w| w.is_local(dev, offset));
    drop(slot);
    drop((keep, window)); // may release the memory: outside the lock
    Ok(())
}

/// The error of a bind whose offset, size, memory offset or address is not
/// a multiple of the bind alignment (R5.3): the first such value, with a
/// suggestion (rounded up, else down) that is itself valid where it can be.
#[cold]
#[inline(never)]
fn misaligned(
    align: u64,
    ep_size: u64,
    offset: u64,
    size: u64,
    mem_offset: u64,
    mem_size: u64,
    addr: Option<u64>,
) -> Error {
    let fit = |limit: u64, other: u64| limit.saturating_sub(other);
    let values = [
        (Arg::BindOffset, offset, fit(ep_size, size)),
        (
            Arg::BindSize,
            size,
            fit(ep_size, offset).min(fit(mem_size, mem_offset)),
        ),
        (Arg::MemoryOffset, mem_offset, fit(mem_size, size)),
    ];
    let (what, v, most) = values
        .into_iter()
        .chain(addr.map(|a| (Arg::DeviceAddress, a, u64::MAX)))
        .find(|&(_, v, _)| !v.is_multiple_of(align))
        .unwrap_or((Arg::BindOffset, offset, fit(ep_size, size)));
    let down = v / align * align;
    let suggested = v
        .checked_next_multiple_of(align)
        .filter(|&up| up <= most)
        .unwrap_or(down);
    Error::Misaligned {
        what,
        value: v,
        alignment: align,
        alignment_kind: Alignment::BindAlignment,
        suggested,
        rule: Rule::R5_3,
    }
}

/// [`take_record`] for an unbind: the last record first (the usual unbind:
/// the id's one binding), without the general search's slice, swap and
/// length (unbind 128 instructions against 122, `benches/instructions.rs`;
/// in `take_record` itself it cost bind's error path, and bind, 3).
#[inline(always)]
fn take_record_unbind(
    slot: &mut Slot,
    dev: Device,
    offset: u64,
    size: u64,
) -> Option<crate::memory::KeepAlive> {
    let b = &mut slot.bindings;
    if b.last()
        .is_some_and(|r| r.dev == dev && r.offset == offset && r.size == size)
    {
        return b.pop().and_then(|r| r._keep);
    }
    take_record(slot, dev, offset, size)
}

/// Removes the record of the binding of `dev` at `offset` from `slot` and
/// returns the memory it kept alive, to be dropped outside the lock. The
/// last record takes the removed one's place.
#[inline]
fn take_record(
    slot: &mut Slot,
    dev: Device,
    offset: u64,
    size: u64,
) -> Option<crate::memory::KeepAlive> {
    let b = &mut slot.bindings;
    let all = b.as_mut_slice();
    // Not a record whose bind or unbind unwound: it stays until destroy
    // (none overlaps it, so none shares its place; skipped all the same).
    let i = all
        .iter()
        .position(|r| r.dev == dev && r.offset == offset && r.size == size && r.covers())?;
    let keep = all[i]._keep.take();
    let last = all.len() - 1;
    if i != last {
        all.swap(i, last);
    }
    // SAFETY: the record at `last` is the one found, whose only field with
    // a destructor (`_keep`) was taken just above: shortening the list by it
    // leaks nothing and drops nothing twice. Unsafe for speed: the safe
    // `b.swap_remove(i)._keep` moves the 40-byte record out and tests its
    // `_keep` again, 153 instructions per unbind against 137 here
    // (`benches/instructions.rs`, `unbind_typed`, `Null`, rustc 1.95).
    unsafe { b.set_len(last) };
    keep
}

/// A binding without its borrow, for owners that keep the endpoint and the
/// memory themselves ([`crate::BoundEndpoint`]): it unbinds only when attached
/// to its endpoint's range again.
pub(crate) struct BindingRecord {
    id: u32,
    dev: Device,
    offset: u64,
    size: u64,
}

impl BindingRecord {
    /// The binding again, borrowing `range` (the range of its endpoint).
    pub(crate) fn attach(self, range: &RangeInner) -> Binding<'_> {
        Binding {
            range,
            id: self.id,
            dev: self.dev,
            offset: self.offset,
            size: self.size,
        }
    }

    pub(crate) fn device(&self) -> Device {
        self.dev
    }

    /// Unbinds through `range` (its endpoint's). On failure the binding is
    /// still live: the record comes back with the error, for its owner to
    /// keep with the memory and retry (R7.2: never freed while bound).
    pub(crate) fn unbind_on(self, range: &RangeInner) -> Result<(), (Error, BindingRecord)> {
        let again = BindingRecord {
            id: self.id,
            dev: self.dev,
            offset: self.offset,
            size: self.size,
        };
        self.attach(range).unbind().map_err(|e| (e, again))
    }
}

impl Binding<'_> {
    /// Forgets the borrow; the binding stays live in the driver and in the
    /// endpoint's records (which keep the memory alive, R7.2).
    pub(crate) fn into_record(self) -> BindingRecord {
        let r = BindingRecord {
            id: self.id,
            dev: self.dev,
            offset: self.offset,
            size: self.size,
        };
        std::mem::forget(self);
        r
    }
}

impl Drop for Binding<'_> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            if let Err(e) = self.parts().unbind_now() {
                // Still bound: the endpoint keeps the memory until it is destroyed.
                self.range.ctx.record_teardown(e);
            }
        });
    }
}

/// Never implemented: it carries the message for `Endpoint::unbind`.
#[diagnostic::on_unimplemented(
    message = "an endpoint has no `unbind(dev, offset, size)`: unbind through the `Binding` that `bind` returned",
    label = "unbinding by offset and size is not offered",
    note = "call `.unbind()` on the `Binding` (or drop it): it remembers the exact device, offset and size of its bind, so a mismatched unbind cannot be written (R6.1, R6.2; for the classic API a mismatch is undefined behaviour, C4)"
)]
pub trait UnbindThroughBinding {}

impl<S: State, K: Kind> Endpoint<S, K> {
    /// Not callable: it exists so that `ep.unbind(dev, offset, size)` is a
    /// compile error that points to [`Binding::unbind`] (R6, C4).
    #[doc(hidden)]
    pub fn unbind<A, B, C>(&self, _dev: A, _offset: B, _size: C) -> Result<()>
    where
        S: UnbindThroughBinding,
    {
        Ok(())
    }

    /// Binds all of `mem` on `dev` at `offset` bytes into the endpoint range
    /// (`cuLogicalEndpointBindMem` for an [`crate::Allocation`],
    /// `cuLogicalEndpointBindAddr` for a [`crate::Mapped`] one; R5).
    ///
    /// Same checks and errors as [`Endpoint::bind_part`].
    #[inline]
    pub fn bind<'a, M: BindSource>(
        &'a self,
        dev: impl Into<Device>,
        offset: u64,
        mem: &'a M,
    ) -> Result<Binding<'a>>
    where
        S: IsReady,
        K: CanBind + Accepts<M::Share>,
    {
        self.bind_part(dev, offset, mem, 0, mem.size())
    }

    /// Binds `size` bytes of `mem`, from `mem_offset`, on `dev` at `offset`
    /// bytes into the endpoint range (R5). Only on a ready endpoint (R3.1);
    /// only memory the kind accepts (R5.6, R5.7), checked by the compiler.
    ///
    /// Checked before the driver: `dev` is the owner or an enrolled team
    /// device (R5.2); `offset`, `size` and `mem_offset` (and the address, for
    /// mapped memory) are multiples of the bind alignment (R5.3);
    /// `mem_offset + size <= mem.size()` and `offset + size <= self.size()`
    /// (R5.4); the memory lives on `dev` or its host NUMA node (R5.5); no
    /// overlap with a live binding on `dev` (R5.9).
    ///
    /// # Errors
    /// [`Error::WrongDevice`], [`Error::ZeroSize`], [`Error::Misaligned`],
    /// [`Error::OutOfRange`], [`Error::MemoryOnWrongDevice`],
    /// [`Error::Overlap`], [`Error::OverlapUnwound`], [`Error::WrongContext`]; from the driver,
    /// `OUT_OF_MEMORY` (memory or multicast resources exhausted),
    /// `SYSTEM_NOT_READY` (fabric software down; retryable) or `ILLEGAL_STATE`
    /// (misconfigured) — the endpoint stays usable (R5.10).
    #[inline]
    pub fn bind_part<'a, M: BindSource>(
        &'a self,
        dev: impl Into<Device>,
        offset: u64,
        mem: &'a M,
        mem_offset: u64,
        size: u64,
    ) -> Result<Binding<'a>>
    where
        S: IsReady,
        K: CanBind + Accepts<M::Share>,
    {
        if !mem.context().same(self.context()) {
            return Err(Error::WrongContext {
                pair: crate::error::ContextPair::MemoryForEndpoint,
            });
        }
        self.bind_checked(
            dev.into(),
            offset,
            mem.target(),
            mem.location(),
            mem_offset,
            size,
            mem.size(),
            Some(mem.keep_alive()),
        )
    }

    /// Binds `size` bytes at the raw device address `ptr` on `dev` at `offset`
    /// (`cuLogicalEndpointBindAddr`, R5), for memory this crate did not
    /// allocate (e.g. `cudaMallocAsync` pools). Same checks as
    /// [`Endpoint::bind_part`] except where the memory lives (R5.5), which the
    /// caller vouches for.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` must be mapped device memory of `dev` (or its host
    /// NUMA node) that stays allocated until the returned binding is unbound
    /// or dropped, or the endpoint destroyed, whichever comes first; and, on
    /// an exportable endpoint, it must be externally shareable (R5.6).
    pub unsafe fn bind_raw_addr(
        &self,
        dev: impl Into<Device>,
        offset: u64,
        ptr: u64,
        size: u64,
    ) -> Result<Binding<'_>>
    where
        S: IsReady,
        K: CanBind,
    {
        let dev = dev.into();
        self.bind_checked(
            dev,
            offset,
            Target::Addr(ptr),
            Location::Device(dev),
            0,
            size,
            size,
            None,
        )
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn bind_checked(
        &self,
        dev: Device,
        offset: u64,
        target: Target,
        location: Location,
        mem_offset: u64,
        size: u64,
        mem_size: u64,
        keep: Option<crate::memory::KeepAlive>,
    ) -> Result<Binding<'_>> {
        let ctx = self.context();
        // The record once, for the facts now and the slot below.
        let rec = self.range().record_ref(self.id());
        // SAFETY: `self` is the one endpoint of its id, borrowed shared for
        // the facts' lifetime (as in `Endpoint::facts`).
        let facts = unsafe { rec.facts() };
        let align = facts.align.max(1);
        // A unicast endpoint has its one owner (an imported one binds
        // nothing, R5.7): one comparison, no scan.
        let enrolled = if K::MULTICAST {
            facts.devices.contains(&dev)
        } else {
            facts.devices.first() == Some(&dev)
        };
        if !enrolled {
            return Err(wrong_device(dev, K::MULTICAST, &facts.devices));
        }
        if size == 0 {
            return Err(Error::ZeroSize {
                what: Arg::BindSize,
                suggested: align,
                rule: Some(Rule::R5_3),
            });
        }
        let out = |what, o: u64, limit| Error::OutOfRange {
            what,
            offset: o,
            size,
            limit,
            rule: Rule::R5_4,
        };
        // The address the driver gets: checked, the base may be a hostile
        // `cuMemAddressReserve` answer.
        let addr = match target {
            Target::Addr(ptr) => match ptr.checked_add(mem_offset) {
                Some(a) => Some((Arg::DeviceAddress, a, u64::MAX)),
                // The caller's offset past the memory: out of range, the
                // caller's error (R5.4), whatever the base.
                None if mem_offset.checked_add(size).is_none_or(|e| e > mem_size) => {
                    return Err(out(Extent::Allocation, mem_offset, mem_size));
                }
                // An offset within the memory that overflows the address:
                // the base came from `cuMemAddressReserve`.
                None => {
                    return Err(Error::BadAnswer {
                        call: Call::MemAddressReserve,
                        what: crate::error::Answer::MappedAddress,
                        value: ptr,
                    });
                }
            },
            Target::Handle(_) => None,
        };
        // One test for all values on the success path (for a power-of-two
        // alignment, the usual case, one `or` and one `and`); which value is
        // off, and the suggestion, on the error path only.
        let addr_v = addr.map_or(0, |(_, a, _)| a);
        let aligned = if align.is_power_of_two() {
            (offset | size | mem_offset | addr_v) & (align - 1) == 0
        } else {
            [offset, size, mem_offset, addr_v]
                .iter()
                .all(|v| v.is_multiple_of(align))
        };
        if !aligned {
            return Err(misaligned(
                align,
                facts.size,
                offset,
                size,
                mem_offset,
                mem_size,
                addr.map(|(_, a, _)| a),
            ));
        }
        if mem_offset.checked_add(size).is_none_or(|e| e > mem_size) {
            return Err(out(Extent::Allocation, mem_offset, mem_size));
        }
        let Some(end) = offset.checked_add(size).filter(|&e| e <= facts.size) else {
            return Err(out(Extent::EndpointRange, offset, facts.size));
        };
        match location {
            Location::Device(d) if d == dev => {}
            Location::Device(_) => {
                return Err(Error::MemoryOnWrongDevice {
                    device: dev,
                    location,
                    host_numa: None,
                });
            }
            Location::HostNuma(n) => {
                // The device's NUMA node decides (R5.5); a failed query is
                // the driver's error, not a wrong-device one.
                let numa = ctx.attribute(dev, attr::HOST_NUMA_ID)?;
                if numa != n {
                    return Err(Error::MemoryOnWrongDevice {
                        device: dev,
                        location,
                        host_numa: Some(numa),
                    });
                }
            }
        }
        // No copy checked against the record below reaches the driver
        // before the driver's bind (R13.3): an enqueue looks at the gate
        // again after its checks. The bind waits for nothing there.
        let gate = crate::ledger::gate::ChangeGate::bind(self.range());
        // Intent first: the binding is recorded (with the memory it keeps
        // alive) before the driver call, and the lock is let go for the call,
        // so that a tracing layer or a backend may use the endpoint again.
        // Concurrent binds on one endpoint still see each other (R5.9).
        {
            let mut slot = rec.slot();
            // A plain loop: `find` with a closure is not always inlined.
            for b in slot.bindings.iter() {
                if b.dev == dev && b.offset < end && offset < b.offset.saturating_add(b.size) {
                    return Err(overlap(dev, offset, size, b));
                }
            }
            let handle_at = match target {
                Target::Handle(_) if keep.is_some() => u32::try_from(mem_offset / align)
                    .ok()
                    .filter(|&at| at < Bound::UNWOUND)
                    .unwrap_or(Bound::BY_ADDRESS),
                _ => Bound::BY_ADDRESS,
            };
            let bound = Bound {
                dev,
                offset,
                size,
                _keep: keep,
                handle_at,
            };
            if slot.bindings.is_empty() && !slot.bindings.spilled() {
                // The id's first binding (the usual case), into the inline
                // buffer without a call (`push` is one).
                // SAFETY: the list is empty and inline, so it owns nothing:
                // overwriting it without dropping it leaks nothing. Unsafe
                // for speed: `bind` 151 instructions here against 167 with
                // `push` and 178 with a safe assignment, which drops the
                // empty list (`benches/instructions.rs`, `Null`, rustc 1.95).
                unsafe {
                    std::ptr::write(&mut slot.bindings, smallvec::SmallVec::from_buf([bound]));
                }
            } else {
                slot.bindings.push(bound);
            }
            // The portable path reaches memory bound by address at its
            // address (`crate::copy::portable`); by handle it has none here.
            // Either moves the bindings generation once (a window's push
            // does): one locked add, not two.
            if let Some((_, a, _)) = addr {
                slot.push_window(crate::window::Window::local(dev, offset, size, a));
            } else {
                self.range().bindings_changed();
            }
        }
        let d = ctx.driver();
        // A panic inside the call (a `tracing` layer on the call's denial
        // or failure, a backend before it forwarded the bind) may come
        // before the driver bound, or after: the record stays, keeping the
        // memory until the endpoint is destroyed, as for a forgotten
        // `Binding` (R7.2), and its extent, so that no bind goes over bytes
        // the driver may hold (R5.9), but covers no byte, so that no copy
        // passes F9 on bytes it may not hold (R13.3), as after an unbind's.
        let unwound = crate::unwind::OnUnwind::new(|| self.bind_unwound(dev, offset, size));
        // SAFETY: the endpoint is `Ready` (a query reported it, R3.4); the
        // memory is kept alive by the slot's `Bound` entry until the driver
        // unbinds it, even if the token is forgotten (R7.2); the range
        // overlaps no live binding (checked above, and recorded since).
        let (call, r) = unsafe {
            match (target, addr) {
                (Target::Handle(h), _) => (
                    Call::BindMem,
                    d.bind_mem(self.id(), dev, offset, h, mem_offset, size, 0),
                ),
                (Target::Addr(_), a) => (
                    Call::BindAddr,
                    d.bind_addr(self.id(), dev, offset, a.map_or(0, |a| a.1), size, 0),
                ),
            }
        };
        unwound.disarm();
        if let Err(code) = r {
            let mut slot = self.slot();
            let kept = take_record(&mut slot, dev, offset, size);
            self.range().bindings_changed();
            let window = slot.take_windows(|w| w.is_local(dev, offset));
            drop(slot);
            gate.end();
            drop((kept, window)); // may release the memory: outside the lock
            return Err(ctx.error(call, code));
        }
        gate.end();
        Ok(Binding {
            range: self.range(),
            id: self.id(),
            dev,
            offset,
            size,
        })
    }

    /// After a panic inside the driver's bind, which may or may not have
    /// bound: [`record_unwound`]. Out of line: only unwinding comes here.
    #[cold]
    #[inline(never)]
    fn bind_unwound(&self, dev: Device, offset: u64, size: u64) {
        record_unwound(self.range(), self.id(), dev, offset, size);
    }
}

//! Reserved id ranges (SPEC R1). A range is shared by every endpoint made from
//! it and released, in one `cuLogicalEndpointIdRelease`, when the last of them
//! is gone, so "destroy before release" (R1.2) holds by construction.
//!
//! The range also keeps each id's bookkeeping (`Slot`): its size and bind
//! alignment, its devices, and the live bindings with the memory they keep
//! alive (R7.2).

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::kind::NoKind;
use crate::state::Reserved;

/// A live binding as the endpoint remembers it.
pub(crate) struct Bound {
    pub key: u64,
    pub dev: Device,
    pub offset: u64,
    pub size: u64,
    /// The memory bound, kept alive until unbound or destroyed (R7.2).
    /// `None` for raw binds, whose memory the caller keeps alive.
    pub _keep: Option<Arc<dyn Any + Send + Sync>>,
}

/// Per-id bookkeeping.
#[derive(Default)]
pub(crate) struct Slot {
    /// Bytes per device (R2.3).
    pub size: u64,
    /// `bindAlignment` (R5.3).
    pub align: u64,
    /// Owner (unicast) or enrolled team devices in this process (multicast).
    pub devices: SmallVec<[Device; 4]>,
    /// Team size (multicast), 1 for unicast.
    pub team_size: u32,
    pub bindings: SmallVec<[Bound; 2]>,
    pub next_key: u64,
    /// An endpoint whose destroy failed after a failed create: destroy it
    /// before the id is used or released.
    pub orphaned: bool,
    /// The fabric handle of this attachment, once exported or imported: the
    /// context refuses a second attachment of it (R9).
    pub fabric: Option<Box<[u8; 64]>>,
}

impl Slot {
    /// Back to an empty id, in place; returns the bindings so that the memory
    /// they keep alive is dropped by the caller, outside the lock.
    pub fn reset(&mut self) -> SmallVec<[Bound; 2]> {
        self.size = 0;
        self.align = 0;
        self.devices.clear();
        self.team_size = 0;
        self.orphaned = false;
        std::mem::take(&mut self.bindings)
    }
}

pub(crate) struct RangeInner {
    pub ctx: Context,
    pub base: u32,
    pub count: u32,
    /// Inline for one id: `reserve_one` makes a single allocation.
    slots: SmallVec<[Mutex<Slot>; 1]>,
    released: bool,
}

impl RangeInner {
    pub fn slot(&self, id: u32) -> MutexGuard<'_, Slot> {
        let i = (id - self.base) as usize;
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_now(&mut self) -> Result<()> {
        self.released = true;
        for i in 0..self.count {
            let id = self.base + i;
            if !self.slot(id).orphaned {
                continue;
            }
            // SAFETY: an orphan: its `Endpoint` is gone (dropped while its
            // destroy failed), so nothing typed holds the id any more.
            match unsafe { self.ctx.driver().destroy(id) } {
                Ok(()) => {
                    let slot = std::mem::take(&mut *self.slot(id));
                    if let Some(f) = &slot.fabric {
                        self.ctx.detach(f);
                    }
                    drop(slot); // unbound now: the memory may go, outside the lock
                }
                Err(code) => {
                    // Still attached, so memory may still be bound: leak what
                    // every orphan keeps rather than free it with the range,
                    // and keep the ids (R1.2).
                    for j in i..self.count {
                        std::mem::forget(std::mem::take(&mut *self.slot(self.base + j)));
                    }
                    return Err(self.ctx.error(Call::Destroy, code));
                }
            }
        }
        // SAFETY: the range's last owner is gone: every `Endpoint` of it was
        // destroyed (orphans just above), so no id holds an endpoint (R1.2).
        let r = unsafe { self.ctx.driver().id_release(self.base, self.count) };
        self.ctx.check(Call::IdRelease, r)
    }
}

impl Drop for RangeInner {
    fn drop(&mut self) {
        if !self.released
            && let Err(e) = self.release_now()
        {
            self.ctx.record_teardown(e);
        }
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
                what: "id count",
                suggested: 1,
                unit: "ids",
                rule: "R1.3",
            });
        }
        let base = ctx.check(Call::IdReserve, ctx.queries().id_reserve(count))?;
        let slots = (0..count).map(|_| Mutex::new(Slot::default())).collect();
        Ok(IdRange {
            inner: Arc::new(RangeInner {
                ctx: ctx.clone(),
                base,
                count,
                slots,
                released: false,
            }),
        })
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

    /// The first id as an endpoint; the rest (if any) stay with the range.
    pub(crate) fn first(self) -> Endpoint<Reserved, NoKind> {
        Endpoint::from_parts(self.inner.clone(), self.inner.base)
    }

    /// Releases the ids now (`cuLogicalEndpointIdRelease`, R1).
    ///
    /// # Errors
    /// [`crate::Error::Driver`] from the driver; the ids are then lost to this
    /// process, as the driver left them.
    pub fn release(self) -> Result<()> {
        match Arc::into_inner(self.inner) {
            Some(mut inner) => inner.release_now(),
            None => Ok(()),
        }
    }
}

/// Releases `range` now if `this` was its last holder; else just lets go.
pub(crate) fn release_shared(range: Arc<RangeInner>) -> Result<()> {
    match Arc::into_inner(range) {
        Some(mut inner) => inner.release_now(),
        None => Ok(()),
    }
}

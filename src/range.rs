//! Reserved id ranges (rule R1): their lifecycle. A range is shared by
//! every endpoint made from it and released, in one
//! `cuLogicalEndpointIdRelease`, when the last of them is gone, so "destroy
//! before release" (R1.2) holds by construction; a released one-id range is
//! kept as its context's spare and reused by the next `reserve_one`.
//!
//! What is recorded per range and per id (facts, bindings, attachments,
//! the copy gate) is the ledger's ([`crate::ledger`]): this file reserves,
//! reuses and releases the range that holds it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::context::Context;
use crate::driver::Call;
use crate::error::Result;
use crate::ledger::Facts;
use crate::ledger::RangeInner;

impl RangeInner {
    /// Whether the one id of a one-id range held no orphan and its record
    /// holds no binding list (empty and inline): then its facts are the
    /// default (a reserved endpoint's: `destroy` and `Drop` reset them, a
    /// failed `create` or `import` never wrote them), and released it can
    /// be the spare without a reset.
    ///
    /// # Safety
    /// As [`RangeInner::reset_spare_record`], and it is read only.
    #[inline(always)]
    unsafe fn bare_one(&self) -> bool {
        debug_assert_eq!(self.count, 1);
        let rec = self.record(self.base);
        // SAFETY: by the caller's contract nothing writes the record.
        let (facts, slot) = unsafe { (&*rec.facts.0.get(), &*rec.slot.0.get()) };
        let bare = !facts.orphaned && !slot.bindings.spilled() && slot.bindings.is_empty();
        debug_assert!(
            !bare
                || (facts.size == 0
                    && facts.align == 0
                    && facts.devices.is_empty()
                    && !facts.devices.spilled()
                    && facts.team_size == 0
                    && !facts.counted_ops
                    && !facts.exportable),
            "a reserved endpoint's facts were left set"
        );
        bare
    }

    /// Resets the one record of a released one-id range, in its `Arc`, for
    /// reuse as the spare; `false` (keep it out) when something is left in
    /// it. Through `&self` and [`RangeInner::record`], never a `&mut
    /// RangeInner`: see [`release_shared`] for why the two never meet.
    ///
    /// # Safety
    /// The caller holds the range's last `Arc` and no `&mut RangeInner` of
    /// it is used after this call: no other reference to the record exists.
    ///
    /// `facts_clean`: the id held no orphan at release, so its facts are
    /// the default already (a reserved endpoint's are: `destroy` and `Drop`
    /// reset them, a failed `create` or `import` never wrote them) and are
    /// not written again.
    unsafe fn reset_spare_record(&self, facts_clean: bool) -> bool {
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
        if facts_clean {
            debug_assert!(
                facts.size == 0
                    && facts.align == 0
                    && facts.devices.is_empty()
                    && !facts.devices.spilled()
                    && facts.team_size == 0
                    && !facts.counted_ops
                    && !facts.exportable
                    && !facts.orphaned,
                "a reserved endpoint's facts were left set"
            );
            return true;
        }
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
            // `crate::unwind::OnUnwind`), so its handle is detached and its
            // memory let go before the panic goes on, and `released` still
            // false makes the range's `Drop` finish the release; unless the
            // backend says it refused the destroy: then as a failed one.
            self.set_orphaned(id, false);
            let slot = std::mem::take(self.slot_mut(id));
            self.bindings_changed_mut();
            let fabric = self.take_fabric_mut(id);
            let ctx = &self.ctx;
            // `unwind::answered`'s steps, written out here: through it, a
            // release that finds the spare slot taken read 280 instructions
            // against 271 (`Null`, `benches/instructions.rs`).
            let call = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: an orphan: its `Endpoint` is gone (dropped while its
                // destroy failed), so nothing typed holds the id any more.
                unsafe { ctx.driver().destroy(id) }
            }));
            let (r, panic) = match call {
                Ok(r) => (r, None),
                Err(panic) => (
                    ctx.driver()
                        .unwound_answer(Call::Destroy)
                        .map_or(Ok(()), Err),
                    Some(panic),
                ),
            };
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
                    self.bindings_changed_mut();
                    self.released = true;
                    if let Some(panic) = panic {
                        std::panic::resume_unwind(panic);
                    }
                    return Err(self.ctx.error(Call::Destroy, code));
                }
            }
            if let Some(panic) = panic {
                std::panic::resume_unwind(panic);
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

/// `cuLogicalEndpointIdReserve` of `count` ids; the base, checked so that
/// every id of the range is `base + i` below `base + count`: checked once
/// here, so that no later sum (splitting, `Debug`, release in `Drop`) can
/// overflow.
#[inline]
pub(crate) fn reserve_ids(ctx: &Context, count: u32) -> Result<u32> {
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
pub(crate) fn reuse(ctx: &Context, base: u32) -> Option<Arc<RangeInner>> {
    let p = ctx.spare().take_raw::<RangeInner>()?;
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
pub(crate) fn fresh(ctx: &Context, base: u32, count: u32) -> Arc<RangeInner> {
    RangeInner::new(ctx, base, count)
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
///
/// Inline, the usual case: the last holder of a one-id range whose id held
/// no orphan and whose record holds no binding list, released and kept as
/// the spare in the caller's frame, its record not reset again (`release`
/// 75 instructions on `Null` before, 55 now, with `Endpoint::release`
/// inline too, `benches/instructions.rs`); the rest out of line.
#[inline(always)]
pub(crate) fn release_shared(range: Arc<RangeInner>) -> Result<()> {
    if Arc::strong_count(&range) == 1 {
        // Acquire: what the other holders did happened before their drops.
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: the last `Arc`: every `Endpoint` of the range is gone, so
        // nothing writes its record. Read through `record` (the range is in
        // its `Arc`), before the `&mut` below.
        if range.count == 1 && unsafe { range.bare_one() } {
            // SAFETY: as in `release_rest`: the last `Arc`, from its own
            // allocation, and no record is reached while this lives.
            let inner = unsafe { &mut *Arc::as_ptr(&range).cast_mut() };
            inner.released = true;
            // SAFETY: the range's last owner is gone and its one id holds no
            // endpoint (not an orphan, and every `Endpoint` is gone), R1.2.
            let r = unsafe { inner.ctx.driver().id_release(inner.base, 1) };
            if let Err(code) = r {
                return Err(release_failed(&inner.ctx, code));
            }
            // Its facts are the default already (a reserved endpoint's) and
            // its binding list empty and inline (tested above): nothing to
            // reset.
            if inner.make_spare()
                && let Some(ctx) = inner.ctx.0.take()
            {
                ctx.spare().put(range);
            }
            return Ok(());
        }
    }
    release_rest(range)
}

/// The error of a failed release.
#[cold]
#[inline(never)]
fn release_failed(ctx: &Context, code: crate::driver::Code) -> crate::Error {
    ctx.error(Call::IdRelease, code)
}

/// [`release_shared`] but for its usual case: a range of several ids, one
/// still shared, or one whose id held an orphan or a binding list.
#[inline(never)]
fn release_rest(range: Arc<RangeInner>) -> Result<()> {
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
            // compare-and-swap (measured when this was the usual path, now
            // inline in `release_shared`): `release` 95 instructions against 82 here,
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
        if one && unsafe { range.reset_spare_record(fast) } {
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
        let spare = || ctx.spare().peek();
        assert!(spare().is_null());
        for round in 0..3 {
            let kept = spare();
            let ep = ctx.reserve_one().unwrap();
            let range = Arc::as_ptr(ep.range()).cast::<()>();
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

//! The checks of a [`CopyBatch`](super::CopyBatch) before the driver.
//!
//! What this file owns: the builder's checks as each op comes (the local
//! side's range, the endpoint side's range, F9 and a heap's agreed top,
//! R13.3), at a few comparisons against the batch's cursor for an op on the
//! same memory and endpoint as the one before, and what the slow path reads
//! of an endpoint ([`EpFacts`]: its bound intervals, [`merged`] and
//! [`intersect`]); and [`BatchInner::check`], which reports them at enqueue
//! in their order, reads again an endpoint whose bindings changed since
//! (F9), then checks F2 and asks `independence.rs` for F3.

use smallvec::SmallVec;

use super::independence::dependent;
use super::memo::{Memo, imported};
use super::portable::LocalWindow;
use super::{BatchInner, Cursor, EpFacts, Hot, Intervals};
use crate::driver::{Device, Location, Operand, Pointer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent, Result};
use crate::kind::{Kind, MemShare};
use crate::memory::{BindSource, Locality, Mapped};
use crate::state::State;

impl Hot {
    /// The address `at` bytes into `mem` when the cursor's memory is `mem`
    /// and the op lies inside it (the range check at two comparisons).
    #[inline(always)]
    fn mem_next<H: MemShare>(
        &self,
        c: &Cursor,
        mem: &Mapped<H>,
        at: u64,
        size: u64,
    ) -> Option<u64> {
        if std::ptr::from_ref(mem).addr() == self.mem
            && at.checked_add(size)? <= c.mem_size
            && at < c.mem_size
        {
            // No wrap: `at < mem_size` and `mem_ptr + mem_size` was checked
            // when the cursor took `mem`.
            return Some(self.mem_ptr.wrapping_add(at));
        }
        None
    }

    /// A put from the cursor's memory to its endpoint, after the last put
    /// there, written, with the put's end as the next `put_from`, after the
    /// memory range check and F3's order (the endpoint side's end: range,
    /// F9, R13.3, is checked when the cursor leaves, [`Cursor::run`]):
    /// `true`. `false`, nothing written, for anything else or with no room
    /// left ([`BatchInner::put_first`]).
    #[inline(always)]
    pub(super) fn put<H: MemShare, S: State, K: Kind>(
        &mut self,
        c: &Cursor,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> bool {
        if std::ptr::from_ref(ep).addr() == self.ep_at
            && offset >= self.put_from
            && let Some(from) = self.mem_next(c, mem, at, size)
            && let Some(end) = offset.checked_add(size)
            // A get's cursor: `put_from` is `u64::MAX` (no put ends there).
            && end != u64::MAX
            && self.push_put(from, offset, size)
        {
            self.put_from = end;
            // As they were (the compares above): said, so that the
            // compiler sees every put leave the same two (`Hot::mem`).
            self.mem = std::ptr::from_ref(mem).addr();
            self.ep_at = std::ptr::from_ref(ep).addr();
            return true;
        }
        // The loop's write placed inline, a jump fewer per put (1,024 puts
        // 25,755 -> 24,733 instructions on `Null`).
        std::hint::cold_path();
        false
    }

    /// A get from the cursor's endpoint inside its bound interval into the
    /// cursor's memory: the destination address. `None` for anything else
    /// ([`BatchInner::get_slow`]). (A get's source is kept out of F3's
    /// one-pass order: it can only meet a put's destination, and a batch
    /// with both is proven by `disjoint_in_order`, in `independence.rs`.)
    #[inline(always)]
    pub(super) fn get_next<H: MemShare, S: State, K: Kind>(
        &self,
        c: &Cursor,
        ep: &Endpoint<S, K>,
        offset: u64,
        mem: &Mapped<H>,
        at: u64,
        size: u64,
    ) -> Option<u64> {
        if std::ptr::from_ref(ep).addr() == self.ep_at
            && offset >= c.start
            && offset.checked_add(size)? <= c.end
        {
            return self.mem_next(c, mem, at, size);
        }
        None
    }
}

impl BatchInner {
    /// The address `at` bytes into `mem` for op `op`, after the range
    /// check, as [`Hot::mem_next`] when the last op named `mem` too.
    // Always: see `mapped_slow`.
    #[inline(always)]
    pub(super) fn mapped<H: MemShare>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        size: u64,
        op: usize,
    ) -> u64 {
        let c = &self.cursor;
        if std::ptr::from_ref(mem).addr() == c.mem
            && let Some(end) = at.checked_add(size)
            && end <= c.mem_size
            && at < c.mem_size
        {
            return c.mem_ptr.wrapping_add(at);
        }
        self.mapped_slow(mem, at, size, op)
    }

    /// [`BatchInner::mapped`] for another allocation than the last, or out
    /// of range. One keep-alive per allocation, however many ops name it,
    /// and one F2 location: compared by address, cloned only when new (no
    /// reference count touched per op). The latest first: ops usually name
    /// the same allocation one after the other.
    // Always, as `endpoint` and `mapped`: with the one-put lane's replay a
    // second caller, they stayed out of line (64 puts 3,130 -> 3,046
    // instructions on `Null`, `benches/copy_batch.rs`).
    #[inline(always)]
    fn mapped_slow<H: MemShare>(&mut self, mem: &Mapped<H>, at: u64, size: u64, op: usize) -> u64 {
        let known = self.keep.memory.iter().rev().any(|k| mem.keeps(k));
        if !known {
            self.keep.memory.push(mem.keep_alive());
            let span = (mem.device_ptr(), mem.size());
            self.locations
                .push((op, mem.locality(), mem.context().key(), span));
        }
        let (ptr, len) = (mem.device_ptr(), mem.size());
        self.cursor.mem = match ptr.checked_add(len) {
            Some(_) => std::ptr::from_ref(mem).addr(),
            None => 0, // never the fast path: the address saturates below
        };
        self.cursor.mem_ptr = ptr;
        self.cursor.mem_size = len;
        // A 0-byte op still names an address inside the memory (F5: its
        // operands are checked): not one past its end.
        if at.checked_add(size).is_none_or(|e| e > len) || at >= len {
            self.memory_out_of_range(op, at, size, len);
        }
        ptr.saturating_add(at)
    }

    #[cold]
    #[inline(never)]
    fn memory_out_of_range(&mut self, op: usize, offset: u64, size: u64, limit: u64) {
        self.error.get_or_insert_with(|| {
            Box::new(Error::CopyOutOfRange {
                op,
                what: Extent::Allocation,
                offset,
                size,
                limit,
            })
        });
    }

    /// A put [`Hot::put`] did not take: a batch's usual first put, checked
    /// and kept as its arguments (`one.rs`), else [`BatchInner::put_slow`].
    /// Not cold, apart from `put_slow`: every batch's first put comes here,
    /// and its few lines are what a one-put batch reads after the driver's
    /// call emptied the caches (`benches/copy_cold.rs`).
    #[inline(never)]
    pub(super) fn put_first<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) {
        if self.defer(mem, at, ep, offset, size).is_some() {
            return;
        }
        // The put after a deferred one, just made (`CopyBatch::cold`): the
        // fast path, as its cursor allows (64 puts 3,041 -> 3,002 on `Null`).
        let mut hot = Hot::of(self);
        if hot.put(&self.cursor, mem, at, ep, offset, size) {
            hot.park(self);
            return;
        }
        self.put_slow(mem, at, ep, offset, size);
    }

    /// [`BatchInner::put_first`] of any other put: each side on its own,
    /// and the op appended.
    #[cold]
    #[inline(never)]
    pub(super) fn put_slow<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) {
        let op = self.list.len();
        let from = self.mapped(mem, at, size, op);
        self.put_to(ep, offset, size, op);
        self.push(super::put_op(from, ep.id(), offset, size));
    }

    /// A get that [`Hot::get_next`] did not take (or with no room left):
    /// each side on its own, and the op appended.
    #[cold]
    #[inline(never)]
    pub(super) fn get_slow<H: MemShare, S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        mem: &Mapped<H>,
        at: u64,
        size: u64,
    ) {
        let op = self.list.len();
        self.get_from(ep, offset, size, op);
        let to = self.mapped(mem, at, size, op);
        // F3's order of the destination addresses.
        self.unordered |= to < self.get_end;
        self.get_end = to.saturating_add(size);
        self.push(super::get_op(ep.id(), offset, Pointer::device(to), size));
    }

    /// The endpoint side of a put: inside the endpoint, bound (F9) and after
    /// the last put's destination (F3's order), at three comparisons when
    /// the last op named `ep` too.
    #[inline]
    pub(super) fn put_to<S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
        op: usize,
    ) {
        let c = &mut self.cursor;
        if std::ptr::from_ref(ep).addr() == c.ep_at
            && offset >= c.put_from
            && let Some(end) = offset.checked_add(size)
            && end <= c.end
        {
            c.put_from = end;
            return;
        }
        self.put_to_slow(ep, offset, size, op);
    }

    /// The endpoint side of a get: inside the endpoint and bound (F9), at
    /// three comparisons when the last op named `ep` too.
    #[inline]
    pub(super) fn get_from<S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
        op: usize,
    ) {
        self.gets = true;
        let c = &self.cursor;
        if std::ptr::from_ref(ep).addr() == c.ep_at
            && offset >= c.start
            && offset.checked_add(size).is_some_and(|end| end <= c.end)
        {
            return;
        }
        self.get_from_slow(ep, offset, size, op);
    }

    // Into its callers, themselves cold: one frame for a first op.
    #[inline(always)]
    fn put_to_slow<S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
        op: usize,
    ) {
        self.leave_cursor();
        self.puts = true;
        let index = self.endpoint(ep);
        let id = ep.id();
        let hit = self
            .eps
            .get(index)
            .and_then(|f| Self::first_hit_of(f, offset, size));
        match hit.map_or_else(|| self.ep_check(index, offset, size, op), |h| Ok(Some(h))) {
            Ok(hit) => {
                let end = offset.saturating_add(size);
                if self
                    .put_last
                    .is_some_and(|(i, e)| id < i || (id == i && offset < e))
                {
                    self.unordered = true;
                }
                self.put_last = Some((id, end));
                if let Some((start, stop)) = hit {
                    let c = &mut self.cursor;
                    c.ep = u64::from(id);
                    c.ep_at = std::ptr::from_ref(ep).addr();
                    c.ep_index = index;
                    c.start = start;
                    c.end = stop;
                    // `end >= offset >= start`: the put lies in `[start, stop)`.
                    c.put_from = end;
                    c.putting = true;
                    c.run = op;
                }
            }
            Err(e) => {
                self.ep_error.get_or_insert_with(|| Box::new(e));
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn get_from_slow<S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
        op: usize,
    ) {
        self.leave_cursor();
        let index = self.endpoint(ep);
        match self.ep_check(index, offset, size, op) {
            Ok(Some((start, stop))) => {
                let c = &mut self.cursor;
                c.ep = u64::from(ep.id());
                c.ep_at = std::ptr::from_ref(ep).addr();
                c.ep_index = index;
                c.start = start;
                c.end = stop;
            }
            Ok(None) => {}
            Err(e) => {
                self.ep_error.get_or_insert_with(|| Box::new(e));
            }
        }
    }

    /// Before the cursor leaves its endpoint: the puts through it checked
    /// against its end ([`Cursor::run`]), the end of the last one to
    /// `put_last`, and the cursor names no endpoint.
    #[inline]
    fn leave_cursor(&mut self) {
        // Naming none already (a batch's first op): nothing to leave.
        if self.cursor.ep_at == 0 {
            return;
        }
        let c = self.cursor;
        if c.putting && c.put_from > c.end {
            self.check_run();
        }
        if c.putting
            && let Ok(id) = u32::try_from(c.ep)
        {
            self.put_last = Some((id, c.put_from));
        }
        let c = &mut self.cursor;
        c.ep = u64::MAX;
        c.ep_at = 0;
        c.put_from = u64::MAX;
        c.putting = false;
    }

    /// The puts through the cursor that end past its interval, checked one
    /// by one (range, R13.3, F9) as the slow path would have as each came:
    /// the first refused is kept, naming its op. (Another interval bound
    /// on every device may hold them: then they pass.)
    #[cold]
    #[inline(never)]
    fn check_run(&mut self) {
        let c = self.cursor;
        let run = self.list.get(c.run..).unwrap_or_default();
        let first = run.iter().enumerate().find_map(|(i, o)| match o.dst {
            Operand::LogicalEndpoint { id, offset }
                if u64::from(id) == c.ep && offset.saturating_add(o.size) > c.end =>
            {
                self.ep_check(c.ep_index, offset, o.size, c.run.saturating_add(i))
                    .err()
            }
            _ => None,
        });
        if let Some(e) = first {
            self.ep_error.get_or_insert_with(|| Box::new(e));
        }
    }

    /// The builder's last word before the checks at enqueue: the cursor
    /// leaves (its puts' ends checked).
    #[inline]
    pub(super) fn finish(&mut self) {
        self.leave_cursor();
    }

    /// `ep`'s index in `eps` (and `keep.endpoints`), added when new.
    // Always: see `mapped_slow`.
    #[inline(always)]
    fn endpoint<S: State, K: Kind>(&mut self, ep: &Endpoint<S, K>) -> usize {
        // By id and range: an endpoint of another context may carry the
        // same id, and must be checked (and refused) as itself.
        let same = |(e, (r, _)): (&EpFacts, &(std::sync::Arc<crate::ledger::RangeInner>, u32))| {
            e.id == ep.id() && std::ptr::eq(&**r, &**ep.range())
        };
        match self.eps.iter().zip(&self.keep.endpoints).rposition(same) {
            Some(i) => i,
            // The batch's first endpoint: `eps` holds at most the last
            // batch's first one, kept where it is with its memo.
            None if self.keep.endpoints.is_empty() => {
                if !(self.eps.len() == 1 && self.memo.as_ref().is_some_and(|m| m.holds(ep))) {
                    self.eps.clear();
                    let facts = Self::facts(ep);
                    self.memo = Memo::of(ep, &facts);
                    self.eps.push(facts);
                }
                self.keep.endpoints.push((ep.range().clone(), ep.id()));
                0
            }
            None => {
                self.eps.push(Self::facts(ep));
                self.keep.endpoints.push((ep.range().clone(), ep.id()));
                self.eps.len() - 1
            }
        }
    }

    /// What the checks need of `ep`: once per endpoint of the batch.
    pub(super) fn facts<S: State, K: Kind>(ep: &Endpoint<S, K>) -> EpFacts {
        let imported = imported::<K>();
        let devices = ep.devices();
        let bound_here = !imported && !devices.is_empty();
        let slot = ep.slot();
        // Read under the lock with what it stands for (this process's
        // bindings, a heap's agreed top, what peers bound): a later change
        // moves it, and enqueue reads them again (F9, R13.5).
        let bindings_gen = ep.range().bindings_gen();
        let agreed = slot.agreed();
        let by_handle = if bound_here { slot.by_handle() } else { 0 };
        let covered = covered_of(&slot, bound_here.then_some(devices), ep.size());
        let first = covered.first().map(|&(start, _)| start);
        let local = if bound_here {
            LocalWindow::of(&slot, devices, ep.facts().team_size, first)
        } else {
            None
        };
        drop(slot);
        EpFacts {
            id: ep.id(),
            ep_size: ep.size(),
            bound_here,
            covered,
            bindings_gen,
            agreed,
            by_handle,
            align: ep.facts().align,
            local,
        }
    }

    /// [`BatchInner::ep_check`]'s answer for an op inside the endpoint, below
    /// its agreed top and inside its first covered interval, inline (the
    /// usual first op on an endpoint: its `Result` is a large value);
    /// `None` for anything else, which `ep_check` answers.
    #[inline(always)]
    pub(super) fn first_hit_of(f: &EpFacts, offset: u64, size: u64) -> Option<(u64, u64)> {
        let end = offset.checked_add(size)?;
        if end > f.ep_size {
            return None;
        }
        let top = match f.agreed {
            Some(agreed) if end > agreed || (size == 0 && offset >= agreed) => return None,
            Some(agreed) => agreed,
            None => u64::MAX,
        };
        match f.covered.first() {
            Some(&(s, e)) if s <= offset && end <= e => Some((s, e.min(f.ep_size).min(top))),
            _ => None,
        }
    }

    /// The endpoint range check and F9 of one op on `eps[index]`: the
    /// interval of `covered` it lies in (clipped to the endpoint), if any,
    /// for the cursor.
    fn ep_check(
        &self,
        index: usize,
        offset: u64,
        size: u64,
        op: usize,
    ) -> Result<Option<(u64, u64)>> {
        let Some(ep) = self.eps.get(index) else {
            return Ok(None);
        };
        let end = match offset.checked_add(size) {
            Some(end) if end <= ep.ep_size => end,
            _ => {
                return Err(Error::CopyOutOfRange {
                    op,
                    what: Extent::EndpointRange,
                    offset,
                    size,
                    limit: ep.ep_size,
                });
            }
        };
        // Below a heap's agreed top (R13.3); the cursor's interval stays
        // below it too.
        let top = match ep.agreed {
            Some(agreed) if end > agreed || (size == 0 && offset >= agreed) => {
                return Err(Error::CopyNotAgreed {
                    op,
                    id: ep.id,
                    offset,
                    size,
                    agreed,
                });
            }
            Some(agreed) => agreed,
            None => u64::MAX,
        };
        // Bound on every device (F9); a 0-byte op inside an interval too
        // (every device bound something).
        if let Some(&(s, e)) = ep.covered.iter().find(|&&(s, e)| s <= offset && end <= e) {
            return Ok(Some((s, e.min(ep.ep_size).min(top))));
        }
        let Some((range, id)) = self.keep.endpoints.get(index) else {
            return Ok(None);
        };
        let slot = range.slot(*id);
        if ep.bound_here {
            // Not inside: walk each device's bound ranges from the op's
            // offset to its end, which names the device that misses bytes.
            // SAFETY: the batch borrows the endpoint on `id` (its entry in
            // `keep.endpoints`) for its life, which covers this call.
            let devices = unsafe { devices_of(range, *id) };
            for &dev in devices {
                let ranges: SmallVec<[(u64, u64); 4]> = slot.spans(dev).collect();
                let mut at = offset;
                while at < end {
                    match ranges.iter().find(|(o, s)| *o <= at && at < o + s) {
                        Some((o, s)) => at = o + s,
                        None => break,
                    }
                }
                if at < end || (size == 0 && ranges.is_empty()) {
                    return Err(Error::CopyNotBound {
                        op,
                        id: ep.id,
                        device: dev,
                        offset,
                        size,
                        bound: merged(ranges).into_iter().collect(),
                    });
                }
            }
        }
        if let Some(p) = outside_peers(&slot, offset, size) {
            return Err(Error::CopyPeerNotBound {
                op,
                id: ep.id,
                offset,
                size,
                peer: Box::new(p.clone()),
            });
        }
        Ok(None)
    }

    /// Every check before the driver (F2, F3, F9) for a copy on a stream
    /// of `ctx` on `stream_dev`, in the order they have always been
    /// reported: the endpoints and memory are of `ctx`, the local side's
    /// ranges, the endpoint side's (range, F9), F2, F3. The usual batch (no
    /// error met by the builder, no binding changed since, its memory on
    /// the stream's device, F3 proven in one pass, no memory reachable two
    /// ways: a bound endpoint of a range that had a window, or two binds
    /// by handle, [`BatchInner::aliases`]) passes in one pass over its
    /// endpoints and one over its allocations, at a few loads each;
    /// anything else goes to [`BatchInner::check_rest`].
    #[inline]
    pub(crate) fn check(&mut self, ctx: &crate::Context, stream_dev: Device) -> Result<()> {
        let mut usual = self.error.is_none()
            && self.ep_error.is_none()
            && !self.unordered
            && !(self.puts && self.gets);
        // Memory reached two ways matters only between two ops: F3's sweep
        // pairs spans of different ops (one op onto its own bytes is the
        // portable path's `CopyOntoItself`).
        let pairs = self.list.len() >= 2;
        let mut by_handle = 0usize;
        for (f, (range, _)) in self.eps.iter().zip(&self.keep.endpoints) {
            if !range.ctx.same(ctx) {
                return Err(Error::WrongContext {
                    pair: crate::error::ContextPair::EndpointOnStream,
                });
            }
            // Stale: a bind or unbind since the builder read it (F9).
            if range.bindings_gen() != f.bindings_gen {
                usual = false;
            }
            if f.bound_here {
                usual &= !(pairs && range.maybe_attached());
                by_handle = by_handle.saturating_add(f.by_handle);
            }
        }
        let key = ctx.key();
        for (_, l, c, _) in &self.locations {
            if *c != key {
                return Err(Error::WrongContext {
                    pair: crate::error::ContextPair::MemoryOnStream,
                });
            }
            usual &= matches!(l, Locality::Device(d) if *d == stream_dev);
        }
        if usual && !(pairs && by_handle >= 2) {
            return Ok(());
        }
        self.check_rest(stream_dev)
    }

    /// [`BatchInner::check`], every check made.
    #[cold]
    #[inline(never)]
    fn check_rest(&mut self, stream_dev: Device) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(*e);
        }
        if let Some(e) = self.ep_error.take() {
            return Err(*e);
        }
        self.recheck_stale()?;
        // Same index: `locations` and `keep.memory` are pushed together.
        for ((op, locality, ..), keep) in self.locations.iter().zip(&self.keep.memory) {
            let (location, fabric_import) = match locality {
                Locality::Device(d) if *d == stream_dev => continue,
                Locality::Host { .. } if keep.host_access().contains(&stream_dev) => continue,
                Locality::Host { numa } => {
                    return Err(Error::CopyNotAccessible {
                        op: *op,
                        host_numa: *numa,
                        access: keep.host_access().to_vec(),
                        stream_device: stream_dev,
                    });
                }
                Locality::Device(d) => (Location::Device(*d), false),
                // Its ordinal may name a device of another node: never
                // taken as local, whatever it is.
                Locality::Fabric(location) => (*location, true),
            };
            return Err(Error::CopyNotLocal {
                op: *op,
                location,
                stream_device: stream_dev,
                fabric_import,
            });
        }
        // F3: a destination overlapping another op's source or destination.
        // Proven by the builder when the destinations came in order and no
        // source can meet one (puts alone, or gets alone).
        let aliases = self.aliases();
        if (self.unordered || (self.puts && self.gets) || !aliases.is_empty())
            && let Some(e) = dependent(&self.list, &aliases)
        {
            return Err(e);
        }
        Ok(())
    }

    /// An endpoint whose bindings changed since the builder read them (a
    /// bind or unbind between building and enqueueing): its facts are read
    /// again and every op on it checked again (F9). Nothing to do, at one
    /// load per endpoint, when none changed.
    fn recheck_stale(&mut self) -> Result<()> {
        for index in 0..self.eps.len() {
            let (Some(facts), Some((range, id))) =
                (self.eps.get(index), self.keep.endpoints.get(index))
            else {
                continue;
            };
            if range.bindings_gen() == facts.bindings_gen {
                continue;
            }
            let slot = range.slot(*id);
            let now = range.bindings_gen();
            let by_handle = slot.by_handle();
            let agreed = slot.agreed();
            // SAFETY: as in `ep_check`: the batch borrows the endpoint.
            let here = facts.bound_here.then(|| unsafe { devices_of(range, *id) });
            let every = covered_of(&slot, here, facts.ep_size);
            drop(slot);
            let id = *id;
            if index == 0 {
                // `eps[0]` no longer what the memo says it was made of.
                self.memo = None;
            }
            if let Some(f) = self.eps.get_mut(index) {
                f.covered = every;
                f.bindings_gen = now;
                f.by_handle = by_handle;
                f.agreed = agreed;
            }
            for (op, o) in self.list.iter().enumerate() {
                let at = match (o.src, o.dst) {
                    (Operand::LogicalEndpoint { id: i, offset }, _)
                    | (_, Operand::LogicalEndpoint { id: i, offset })
                        if i == id =>
                    {
                        offset
                    }
                    _ => continue,
                };
                self.ep_check(index, at, o.size, op)?;
            }
        }
        Ok(())
    }
}

/// The devices in this process of the endpoint on `id` of `range` (read
/// where its facts are, not copied per batch: the portable path reads them
/// so too, `portable::view::target_of`).
///
/// # Safety
/// The caller holds a shared borrow of the endpoint on `id` for as long as
/// the result lives: an id of a batch's `keep.endpoints`, whose endpoints
/// the batch borrows for its life (`CopyBatch<'a>`).
unsafe fn devices_of(range: &crate::ledger::RangeInner, id: u32) -> &[Device] {
    // SAFETY: the caller's contract is `RangeInner::facts`'s.
    unsafe { &range.facts(id).devices }
}

/// The first peer device whose bytes, as the ranks last agreed, miss an op
/// of `size` bytes at `offset` of the slot's id (R13.5: a copy outside the
/// bound range is undefined behaviour); a 0-byte op names bytes of a device
/// that bound something (F5), as `ep_check` asks of this process's devices.
pub(crate) fn outside_peers<'s>(
    slot: &'s crate::ledger::SlotGuard<'_>,
    offset: u64,
    size: u64,
) -> Option<&'s crate::error::PeerBound> {
    let end = offset.saturating_add(size);
    let inside = |c: &[(u64, u64)]| match size {
        0 => !c.is_empty(),
        _ => c.iter().any(|&(s, e)| s <= offset && end <= e),
    };
    slot.peers().find(|p| !inside(&p.covered))
}

/// What a copy may reach of the slot's id: the bytes bound on every one of
/// `devices` here (`None`: nothing bound here to check, the endpoint's
/// `size` alone), cut to what its peers bound (F9, R13.5).
#[inline]
fn covered_of(
    slot: &crate::ledger::SlotGuard<'_>,
    devices: Option<&[Device]>,
    size: u64,
) -> Intervals {
    let here = match (devices, &slot.bindings[..]) {
        // The usual endpoint: one device, one binding (or none there:
        // nothing covered), without the general merge.
        (Some([d]), [b]) => {
            let mut one = Intervals::new();
            let end = b.offset.saturating_add(b.size);
            if b.dev == *d && b.offset < end && b.covers() {
                one.push((b.offset, end));
            }
            one
        }
        (Some(devices), _) => covered_on(slot, devices),
        (None, _) => smallvec::smallvec![(0, size)],
    };
    cut_to_peers(here, slot)
}

/// `covered` cut to what each peer device bound on the id, as the last
/// every-rank-bound agreement said (`team::agree_bound`: F9, R13.5); as it
/// is before any.
fn cut_to_peers(covered: Intervals, slot: &crate::ledger::SlotGuard<'_>) -> Intervals {
    slot.peers().fold(covered, |c, p| intersect(&c, &p.covered))
}

/// The `[start, end)` intervals bound on every one of `devices` in `slot`
/// (sorted, disjoint; none when `devices` is empty).
fn covered_on(slot: &crate::ledger::Slot, devices: &[Device]) -> Intervals {
    let mut every: Option<Intervals> = None;
    for &d in devices {
        let mine = merged(slot.spans(d));
        every = Some(match every {
            None => mine,
            Some(before) => intersect(&before, &mine),
        });
    }
    every.unwrap_or_default()
}

/// `(offset, size)` ranges as sorted, disjoint `[start, end)` intervals,
/// touching ones joined.
pub(crate) fn merged(ranges: impl IntoIterator<Item = (u64, u64)>) -> Intervals {
    let mut v: Intervals = ranges
        .into_iter()
        .map(|(o, s)| (o, o.saturating_add(s)))
        .filter(|r| r.0 < r.1)
        .collect();
    if !v.is_sorted() {
        v.sort_unstable();
    }
    // Joined in place (one allocation per device): `n` intervals kept, n ≤ i.
    let mut n = 0usize;
    for i in 0..v.len() {
        let (s, e) = v[i];
        match n.checked_sub(1).and_then(|l| v.get_mut(l)) {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => {
                v[n] = (s, e);
                n += 1;
            }
        }
    }
    v.truncate(n);
    v
}

/// The intersection of two lists of sorted, disjoint intervals.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Intervals {
    let (mut i, mut j, mut out) = (0, 0, Intervals::new());
    while let (Some(&(s1, e1)), Some(&(s2, e2))) = (a.get(i), b.get(j)) {
        let (s, e) = (s1.max(s2), e1.min(e2));
        if s < e {
            out.push((s, e));
        }
        if e1 < e2 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{intersect, merged};

    proptest::proptest! {
        #[test]
        fn f9_an_offset_is_covered_exactly_when_every_device_bound_it(
            devs in proptest::collection::vec(
                proptest::collection::vec((0u64..64, 0u64..24), 0..5),
                1..4,
            )
        ) {
            // The intervals the F9 fast path trusts, point by point against
            // the bound ranges of each device.
            let covered = devs
                .iter()
                .map(|r| merged(r.iter().copied()))
                .reduce(|a, b| intersect(&a, &b))
                .unwrap_or_default();
            proptest::prop_assert!(covered.windows(2).all(|w| w[0].1 < w[1].0));
            for p in 0u64..96 {
                let fast = covered.iter().any(|&(s, e)| s <= p && p < e);
                let every = devs
                    .iter()
                    .all(|r| r.iter().any(|&(o, n)| o <= p && p < o + n));
                proptest::prop_assert_eq!(fast, every, "offset {}", p);
            }
        }
    }
}

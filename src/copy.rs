//! Data through endpoints: a typed batch of fabric copies
//! (`cuFabricCpyBatchAsync`, SPEC F1–F9) on ready endpoints, enqueued on a
//! [`Stream`], and the token that says it is in flight.
//!
//! What this file owns:
//! - [`CopyBatch`]: puts (local mapped memory or owned host bytes → a
//!   unicast or multicast endpoint at an offset; a multicast put lands in
//!   every member's bound memory) and gets (a unicast endpoint at an offset
//!   → local mapped memory or a new host buffer). A get from a multicast
//!   kind does not compile ([`CanGet`], F1).
//! - the checks before the driver, each an [`Error`] naming the op: inside
//!   the endpoint and the memory ([`Error::CopyOutOfRange`]), inside memory
//!   this process bound ([`Error::CopyNotBound`], F9/R13.3), local memory on
//!   the stream's device ([`Error::CopyNotLocal`], F2), no dependent ops
//!   ([`Error::CopyDependent`], F3). The flags are always 0 (F5) and the
//!   stream is never the NULL stream (F6): neither can be written.
//! - [`InFlight`], the `#[must_use]` token: it borrows the endpoints and the
//!   local memory of the batch and the stream, so destroying an endpoint or
//!   dropping memory while the copy is in flight does not compile (F4).
//!
//! **Soundness without `Drop`.** The token's borrows end if it is
//! forgotten (`mem::forget`); nothing is freed under a copy even then:
//! - device memory: the stream's in-flight record keeps each `Mapped` alive
//!   (its keep-alive, as a binding keeps bound memory, R7.2) until the stream
//!   is synchronized;
//! - endpoints: the record names each endpoint's id, and destroying the
//!   endpoint or unbinding on it synchronizes those streams first
//!   (`stream::settle`);
//! - host memory: host bytes are *owned* buffers moved into the batch
//!   (`Vec<u8>`), never borrowed slices. A waited token hands them back; a
//!   dropped one synchronizes before it frees them; a forgotten one leaks
//!   them — so no copy ever reads or writes freed host memory. (A borrowed
//!   slice would dangle after `forget`; a scope that synchronizes at its
//!   end, as `std::thread::scope` joins, would work too, at the price of a
//!   closure around every copy.)
//!
//! **The portable path (issue 19, item 4; `crate::portable`).** On drivers
//! without `cuFabricCpyBatchAsync` (before 13.5, the classic fallback) the
//! same `CopyBatch` runs as `cuMemcpyAsync` through the endpoint's
//! *windows*: per endpoint id, the mapped address here of each target's
//! memory at each bound offset — this process's own binds by address, and
//! peers' memory imported (POSIX descriptor within a node, fabric handle
//! across) and registered — by a bring-up's `agree_bound` itself, or by
//! hand with [`Endpoint::add_peer_window`]. A put to a
//! unicast endpoint becomes one `cuMemcpyAsync` into the owner's mapping at
//! that offset, a multicast put one per member, a get one from the owner's
//! mapping. The choice is made once ([`crate::Context::copy_path`], from the
//! backend decision) and the trace shows `cuMemcpyAsync`; the checks,
//! tokens and compile errors above stay the same, and the in-flight record
//! keeps the windows' memory alive too.

use std::marker::PhantomData;

use crate::driver::{Call, CopyOp, Device, Location, Operand, Pointer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent, Result};
use crate::kind::{ImportedMulticast, ImportedUnicast, Kind, Unicast};
use crate::memory::{BindSource, Mapped, MemShare};
use crate::state::{Agreed, IsReady, Sealed, State};
use crate::stream::{Keep, Stream};

/// Kinds whose endpoint a get may read (F1: unicast only).
#[diagnostic::on_unimplemented(
    message = "a get reads from a unicast endpoint only: `{Self}` is a multicast endpoint, which has no single memory to read from (F1)",
    label = "`get` from a multicast endpoint",
    note = "read your own member's bound memory directly (it holds what the team put), or get from the unicast endpoint of the rank that owns the bytes (`team::unicast_peers`)"
)]
pub trait CanGet: Kind + Sealed {}
impl<X: Send + Sync + 'static> CanGet for Unicast<X> where Unicast<X>: Kind {}
impl CanGet for ImportedUnicast {}

/// One op as the batch remembers it, for the checks.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    /// `(id, offset)`.
    Ep(u32, u64),
    /// A device address.
    Addr(u64),
    /// The `n`th host buffer put.
    Host(usize),
    /// The `n`th host buffer got.
    HostOut(usize),
}

/// One op of a batch: its two sides, its size, and its endpoint (index in
/// [`BatchInner::eps`]) for the F9 checks: one record per op, pushed once.
#[derive(Clone, Copy)]
pub(crate) struct Op {
    pub(crate) src: Side,
    pub(crate) dst: Side,
    pub(crate) size: u64,
    pub(crate) ep: usize,
}

/// A batch of fabric copies to enqueue on a [`Stream`] at once
/// ([`Stream::enqueue`]); the copies of a batch run in no particular order
/// (F3), so none may depend on another.
///
/// `'a` is how long the endpoints and memory it names are borrowed: until
/// the [`InFlight`] token is waited or dropped.
#[must_use = "a batch does nothing until `stream.enqueue(batch)`"]
pub struct CopyBatch<'a> {
    /// Behind one pointer: the builder moves the batch on every call, and
    /// a moved pointer is a register where the state is ~200 bytes of
    /// memory (issue 22: about 160 instructions per op at 1,024 ops).
    pub(crate) inner: Box<BatchInner>,
    _borrow: PhantomData<&'a ()>,
}

/// The state of a [`CopyBatch`].
pub(crate) struct BatchInner {
    pub(crate) ops: Vec<Op>,
    pub(crate) keep: Keep,
    /// The distinct endpoints of the batch (few: looked up linearly).
    pub(crate) eps: Vec<EpFacts>,
    /// The location of each allocation of `keep.memory` (same index), with
    /// the first op naming it, for F2: checked once per allocation.
    locations: Vec<(usize, Location)>,
    pub(crate) host_in: Vec<Vec<u8>>,
    pub(crate) host_out: Vec<(usize, Vec<u8>)>,
    /// The first error a builder call met.
    error: Option<Box<Error>>,
}

/// What the checks need of one endpoint of the batch, read once however
/// many ops name it.
pub(crate) struct EpFacts {
    id: u32,
    ep_size: u64,
    /// For each device of the endpoint in this process: its bound ranges.
    bound: Vec<(Device, Vec<(u64, u64)>)>,
    /// The `[start, end)` intervals bound on every device of `bound`
    /// (sorted, disjoint): an op inside one passes F9 at one comparison;
    /// any other op is walked device by device, which names the device.
    covered: Vec<(u64, u64)>,
    /// What the portable path needs of the endpoint.
    pub(crate) target: crate::portable::Target,
    /// The range's bindings generation `bound` was read at (`None`:
    /// imported, not checked): an unbind since makes them stale.
    bindings_gen: Option<u64>,
}

impl EpFacts {
    /// Reads the bindings again if the range's changed since they were
    /// read (an unbind between building and enqueueing, F9).
    fn refresh(&mut self) {
        let Some(seen) = self.bindings_gen else {
            return;
        };
        let range = &self.target.range;
        if range.bindings_gen() == seen {
            return;
        }
        let slot = range.slot(self.id);
        self.bindings_gen = Some(range.bindings_gen());
        for (d, ranges) in &mut self.bound {
            *ranges = slot
                .bindings
                .iter()
                .filter(|b| b.dev == *d)
                .map(|b| (b.offset, b.size))
                .collect();
        }
        drop(slot);
        self.covered = self
            .bound
            .iter()
            .map(|(_, ranges)| merged(ranges))
            .reduce(|a, b| intersect(&a, &b))
            .unwrap_or_default();
    }
}

impl std::fmt::Debug for CopyBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyBatch")
            .field("ops", &self.inner.ops.len())
            .finish()
    }
}

impl Default for CopyBatch<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> CopyBatch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        CopyBatch {
            inner: Box::new(BatchInner {
                ops: Vec::new(),
                keep: Keep {
                    memory: Vec::new(),
                    endpoints: Vec::new(),
                },
                eps: Vec::new(),
                locations: Vec::new(),
                host_in: Vec::new(),
                host_out: Vec::new(),
                error: None,
            }),
            _borrow: PhantomData,
        }
    }

    /// Puts `size` bytes of `src` from `src_offset` into `ep` at `offset`
    /// (unicast: the owner's bound memory; multicast: every member's).
    pub fn put<H: MemShare, S, K: Kind>(
        mut self,
        src: &'a Mapped<H>,
        src_offset: u64,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
    {
        let src = self.inner.mapped(src, src_offset, size);
        let (dst, ep) = self.inner.endpoint(ep, offset);
        self.inner.ops.push(Op { src, dst, size, ep });
        self
    }

    /// Puts the host bytes `bytes` (all of them) into `ep` at `offset`; the
    /// buffer is handed back by [`InFlight::wait`].
    pub fn put_host<S, K: Kind>(
        mut self,
        bytes: Vec<u8>,
        ep: &'a Endpoint<S, K>,
        offset: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
    {
        let size = bytes.len() as u64;
        let n = self.inner.host_in.len();
        self.inner.host_in.push(bytes);
        let (dst, ep) = self.inner.endpoint(ep, offset);
        self.inner.ops.push(Op {
            src: Side::Host(n),
            dst,
            size,
            ep,
        });
        self
    }

    /// Gets `size` bytes of the unicast endpoint `ep` at `offset` into
    /// `dst` at `dst_offset`. Not for multicast endpoints (F1): see [`CanGet`].
    pub fn get<H: MemShare, S, K>(
        mut self,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        dst: &'a Mapped<H>,
        dst_offset: u64,
        size: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
        K: CanGet,
    {
        let (src, ep) = self.inner.endpoint(ep, offset);
        let dst = self.inner.mapped(dst, dst_offset, size);
        self.inner.ops.push(Op { src, dst, size, ep });
        self
    }

    /// Gets `size` bytes of the unicast endpoint `ep` at `offset` into a
    /// new host buffer, handed out by [`InFlight::wait`] (F1: see [`CanGet`]).
    pub fn get_host<S, K>(mut self, ep: &'a Endpoint<S, K>, offset: u64, size: u64) -> Self
    where
        S: State + IsReady + Agreed,
        K: CanGet,
    {
        let (src, ep) = self.inner.endpoint(ep, offset);
        let op = self.inner.ops.len();
        let n = self.inner.host_out.len();
        let buf = match usize::try_from(size) {
            Ok(len) => vec![0u8; len],
            Err(_) => {
                self.inner.error.get_or_insert_with(|| {
                    Box::new(Error::CopyOutOfRange {
                        op,
                        what: Extent::HostBuffer,
                        offset: 0,
                        size,
                        limit: usize::MAX as u64,
                    })
                });
                Vec::new()
            }
        };
        self.inner.host_out.push((op, buf));
        self.inner.ops.push(Op {
            src,
            dst: Side::HostOut(n),
            size,
            ep,
        });
        self
    }

    /// How many ops the batch has.
    pub fn len(&self) -> usize {
        self.inner.ops.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.inner.ops.is_empty()
    }
}

impl BatchInner {
    /// The side naming `ep` at `offset`, and `ep`'s index in `eps`.
    fn endpoint<S: State, K: Kind>(&mut self, ep: &Endpoint<S, K>, offset: u64) -> (Side, usize) {
        let index = match self.eps.iter().rposition(|e| e.id == ep.id()) {
            Some(i) => i,
            None => {
                self.eps.push(Self::facts(ep));
                self.keep.endpoints.push((ep.range().clone(), ep.id()));
                self.eps.len() - 1
            }
        };
        (Side::Ep(ep.id(), offset), index)
    }

    /// What the checks need of `ep`: once per endpoint of the batch.
    fn facts<S: State, K: Kind>(ep: &Endpoint<S, K>) -> EpFacts {
        let imported = std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedUnicast>()
            || std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedMulticast>();
        let mut bindings_gen = None;
        let bound: Vec<(Device, Vec<(u64, u64)>)> = if imported {
            Vec::new()
        } else {
            let slot = ep.slot();
            bindings_gen = Some(ep.range().bindings_gen());
            ep.devices()
                .iter()
                .map(|&d| {
                    let ranges = slot
                        .bindings
                        .iter()
                        .filter(|b| b.dev == d)
                        .map(|b| (b.offset, b.size))
                        .collect();
                    (d, ranges)
                })
                .collect()
        };
        let covered = bound
            .iter()
            .map(|(_, ranges)| merged(ranges))
            .reduce(|a, b| intersect(&a, &b))
            .unwrap_or_default();
        EpFacts {
            id: ep.id(),
            ep_size: ep.size(),
            bound,
            covered,
            target: crate::portable::Target {
                range: ep.range().clone(),
                id: ep.id(),
                devices: ep.devices().to_vec(),
                team_size: ep.facts().team_size,
            },
            bindings_gen,
        }
    }

    fn mapped<H: MemShare>(&mut self, mem: &Mapped<H>, at: u64, size: u64) -> Side {
        let op = self.ops.len();
        if at.checked_add(size).is_none_or(|e| e > mem.size()) {
            self.error.get_or_insert_with(|| {
                Box::new(Error::CopyOutOfRange {
                    op,
                    what: Extent::Allocation,
                    offset: at,
                    size,
                    limit: mem.size(),
                })
            });
        }
        // One keep-alive per allocation, however many ops name it, and one
        // F2 location: compared by address, cloned only when new (no
        // reference count touched per op). The latest first: ops usually
        // name the same allocation one after the other.
        let known = self.keep.memory.iter().rev().any(|k| mem.keeps(k));
        if !known {
            self.keep.memory.push(mem.keep_alive());
            self.locations.push((op, mem.location()));
        }
        Side::Addr(mem.device_ptr().saturating_add(at))
    }

    /// Every check before the driver (F2, F3, F9).
    pub(crate) fn check(&mut self, stream_dev: Device) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(*e);
        }
        for (op, &Op { src, dst, size, ep }) in self.ops.iter().enumerate() {
            let offset = match (src, dst) {
                (Side::Ep(_, offset), _) | (_, Side::Ep(_, offset)) => offset,
                _ => continue, // every op of the typed API names one endpoint
            };
            let Some(ep) = self.eps.get(ep) else {
                continue;
            };
            let end = offset.checked_add(size);
            if end.is_none_or(|e| e > ep.ep_size) {
                return Err(Error::CopyOutOfRange {
                    op,
                    what: Extent::EndpointRange,
                    offset,
                    size,
                    limit: ep.ep_size,
                });
            }
            let end = offset + size;
            if size > 0 && ep.covered.iter().any(|&(s, e)| s <= offset && end <= e) {
                continue; // bound on every device (F9)
            }
            for (dev, ranges) in &ep.bound {
                // Walk the bound ranges from the op's offset to its end.
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
                        device: *dev,
                        offset,
                        size,
                    });
                }
            }
        }
        for &(op, location) in &self.locations {
            let local = match location {
                Location::Device(d) => d == stream_dev,
                Location::HostNuma(_) => true,
            };
            if !local {
                return Err(Error::CopyNotLocal {
                    op,
                    location,
                    stream_device: stream_dev,
                });
            }
        }
        // F3: a destination overlapping another op's source or destination.
        match dependent(&self.ops) {
            Some((op, other)) => Err(Error::CopyDependent { op, other }),
            None => Ok(()),
        }
    }
}

/// `(offset, size)` ranges as sorted, disjoint `[start, end)` intervals,
/// touching ones joined.
fn merged(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(o, s)| (o, o.saturating_add(s)))
        .filter(|r| r.0 < r.1)
        .collect();
    v.sort_unstable();
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
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
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

/// The first pair of ops of `ops` that depend on each other (F3): one's
/// destination overlaps the other's source or destination, in the same
/// endpoint or address space. `(the op whose destination, the other)`; of two
/// destinations, the lower op first. One sort and one sweep: O(n log n).
fn dependent(ops: &[Op]) -> Option<(usize, usize)> {
    if disjoint_in_order(ops) {
        return None;
    }
    // (space: endpoint id or none for addresses, start, end, op, destination)
    type Span = (Option<u32>, u64, u64, usize, bool);
    let span = |side: Side, size: u64, op: usize, dst: bool| -> Option<Span> {
        match side {
            Side::Ep(id, off) => Some((Some(id), off, off.saturating_add(size), op, dst)),
            Side::Addr(a) => Some((None, a, a.saturating_add(size), op, dst)),
            Side::Host(_) | Side::HostOut(_) => None,
        }
    };
    // Addresses and endpoint offsets apart: each is usually in order
    // already (ops laid out one after the other), and then not sorted again.
    let (mut addrs, mut eps) = (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
    for (i, &Op { src, dst, size, .. }) in ops.iter().enumerate().filter(|(_, op)| op.size > 0) {
        for s in [span(src, size, i, false), span(dst, size, i, true)]
            .into_iter()
            .flatten()
        {
            if s.0.is_none() {
                addrs.push(s)
            } else {
                eps.push(s)
            }
        }
    }
    for spans in [&mut addrs, &mut eps] {
        if !spans.is_sorted_by_key(|&(space, start, ..)| (space, start)) {
            spans.sort_unstable_by_key(|&(space, start, ..)| (space, start));
        }
    }
    let spans = addrs.iter().chain(eps.iter());
    let pair = |a: (usize, bool), b: (usize, bool)| match (a.1, b.1) {
        (true, true) => (a.0.min(b.0), a.0.max(b.0)),
        (true, false) => (a.0, b.0),
        _ => (b.0, a.0),
    };
    // Per space, the two spans reaching furthest among those started so far
    // that belong to different ops (all, and destinations only): an
    // overlap with any earlier span shows against one of them.
    #[derive(Clone, Copy, Default)]
    struct Reach(Option<(u64, usize, bool)>, Option<(u64, usize, bool)>);
    impl Reach {
        /// `.0`: the furthest-reaching span; `.1`: the furthest-reaching
        /// one of another op than `.0`'s.
        fn add(&mut self, end: u64, op: usize, dst: bool) {
            let new = Some((end, op, dst));
            match self.0 {
                None => self.0 = new,
                Some((e, o, _)) if o == op => {
                    if end > e {
                        self.0 = new;
                    }
                }
                Some((e, ..)) if end > e => {
                    self.1 = self.0;
                    self.0 = new;
                }
                Some(_) => {
                    if self.1.is_none_or(|(e, ..)| end > e) {
                        self.1 = new;
                    }
                }
            }
        }
        /// An earlier span of another op than `op` that reaches past `start`.
        fn past(&self, start: u64, op: usize) -> Option<(usize, bool)> {
            [self.0, self.1]
                .into_iter()
                .flatten()
                .find(|&(e, o, _)| o != op && e > start)
                .map(|(_, o, d)| (o, d))
        }
    }
    let mut space = None;
    let (mut all, mut dsts) = (Reach::default(), Reach::default());
    for (i, &(sp, start, end, op, dst)) in spans.enumerate() {
        if i == 0 || sp != space {
            space = sp;
            (all, dsts) = (Reach::default(), Reach::default());
        }
        let earlier = if dst {
            all.past(start, op)
        } else {
            dsts.past(start, op)
        };
        if let Some(e) = earlier {
            return Some(pair((op, dst), e));
        }
        all.add(end, op, dst);
        if dst {
            dsts.add(end, op, dst);
        }
    }
    None
}

/// Whether the spans of `ops` (sources before destinations, in op order;
/// addresses and endpoint offsets apart, as [`dependent`] lists them) are
/// already in order of (space, start) with each starting at or after the
/// previous one's end: then no two overlap and no op depends on another
/// (F3). One pass and nothing built: ops laid out one after the other, the
/// usual batch, are proven independent here; any other batch goes to the
/// sort and sweep.
fn disjoint_in_order(ops: &[Op]) -> bool {
    // The end of the last address span, and (id, end) of the last endpoint one.
    let mut addr_end = 0u64;
    let mut ep_end: Option<(u32, u64)> = None;
    for &Op { src, dst, size, .. } in ops {
        if size == 0 {
            continue;
        }
        for side in [src, dst] {
            match side {
                Side::Addr(a) => {
                    if a < addr_end {
                        return false;
                    }
                    addr_end = a.saturating_add(size);
                }
                Side::Ep(id, off) => {
                    if ep_end.is_some_and(|(i, e)| id < i || (id == i && off < e)) {
                        return false;
                    }
                    ep_end = Some((id, off.saturating_add(size)));
                }
                Side::Host(_) | Side::HostOut(_) => {}
            }
        }
    }
    true
}

impl Stream {
    /// Enqueues `batch` (one `cuFabricCpyBatchAsync`, flags 0) after every
    /// check of [`CopyBatch`]; the copies run when the stream reaches them.
    /// On the portable path ([`Context::copy_path`](crate::Context::copy_path))
    /// the same batch runs as one `cuMemcpyAsync` per target piece, through
    /// the endpoints' windows (a bring-up's `agree_bound` registers peers';
    /// [`Endpoint::add_peer_window`] by hand).
    ///
    /// # Errors
    /// [`Error::CopyOutOfRange`], [`Error::CopyNotBound`],
    /// [`Error::CopyNotLocal`], [`Error::CopyDependent`],
    /// [`Error::WrongContext`], and on the portable path
    /// [`Error::CopyNoWindow`], before the driver; [`Error::Driver`] from
    /// the call; [`Error::Unsupported`] ([`Feature::FabricCopy`](crate::error::Feature::FabricCopy),
    /// naming the driver version) where the driver has no fabric copy (before 13.5, F7). Nothing was
    /// enqueued then (the portable path synchronizes what it had enqueued
    /// before a failed `cuMemcpyAsync`), and the host buffers are dropped
    /// with the batch.
    pub fn enqueue<'a>(&'a self, mut batch: CopyBatch<'a>) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        batch.check_for(self)?;
        if ctx.copy_path() == crate::CopyPath::Portable {
            return self.enqueue_portable(batch);
        }
        let FabricList {
            list,
            keep,
            host_in,
            host_out,
        } = batch.into_list();
        // SAFETY: every id is a ready endpoint borrowed for 'a (R13.1) whose
        // ranges were checked against the bindings this process knows (F9);
        // the ops are independent (F3, checked) and local (F2, checked);
        // the flags are 0 (F5) and the stream is this one (never NULL, F6).
        // Nothing is freed before the stream passed the ops (F4): the
        // memory and endpoints are kept by the record made just below (and
        // borrowed by the token), and the host buffers are owned by the
        // token, freed only after a synchronize or leaked when it is forgotten.
        let r = unsafe { ctx.driver().fabric_copy_batch(self.inner.handle, list, 0) };
        if let Err(code) = r {
            return Err(fabric_copy_error(ctx, code));
        }
        let seq = self.inner.record(keep);
        Ok(InFlight::new(self, host_in, host_out, seq))
    }
}

/// A checked batch as the driver takes it, with what it keeps and owns.
pub(crate) struct FabricList {
    pub(crate) list: Vec<CopyOp>,
    pub(crate) keep: Keep,
    pub(crate) host_in: Vec<Vec<u8>>,
    pub(crate) host_out: Vec<(usize, Vec<u8>)>,
}

impl<'a> CopyBatch<'a> {
    /// Every check before the driver for a copy on `stream`: the endpoints
    /// are of its context, then [`CopyBatch::check`].
    pub(crate) fn check_for(&mut self, stream: &Stream) -> Result<()> {
        let ctx = &stream.inner.ctx;
        if self
            .inner
            .keep
            .endpoints
            .iter()
            .any(|(r, _)| !r.ctx.same(ctx))
        {
            return Err(Error::WrongContext);
        }
        // Facts read before a bind or unbind since are read again (F9).
        for f in &mut self.inner.eps {
            f.refresh();
        }
        self.inner.check(stream.inner.dev)
    }

    /// The driver's op list of a checked batch: its host buffers by address
    /// (owned by what takes the list, which keeps them where they are).
    pub(crate) fn into_list(self) -> FabricList {
        let BatchInner {
            ops,
            keep,
            host_in,
            mut host_out,
            ..
        } = *self.inner;
        let list = op_list(&ops, &host_in, &mut host_out);
        FabricList {
            list,
            keep,
            host_in,
            host_out,
        }
    }
}

fn op_list(ops: &[Op], host_in: &[Vec<u8>], host_out: &mut [(usize, Vec<u8>)]) -> Vec<CopyOp> {
    let mut operand = |side: Side| match side {
        Side::Ep(id, offset) => Operand::LogicalEndpoint { id, offset },
        Side::Addr(a) => Operand::Pointer(Pointer::device(a)),
        Side::Host(n) => {
            let p = host_in.get(n).map_or(0, |b| b.as_ptr().addr() as u64);
            Operand::Pointer(Pointer::host(p))
        }
        Side::HostOut(n) => {
            let p = host_out
                .get_mut(n)
                .map_or(0, |(_, b)| b.as_mut_ptr().addr() as u64);
            Operand::Pointer(Pointer::host(p))
        }
    };
    ops.iter()
        .map(|&Op { src, dst, size, .. }| CopyOp {
            src: operand(src),
            dst: operand(dst),
            size,
        })
        .collect()
}

/// The error of a failed `cuFabricCpyBatchAsync`: `NOT_SUPPORTED` (F7) is
/// [`Error::Unsupported`] naming the driver version and the portable path.
#[cold]
#[inline(never)]
pub(crate) fn fabric_copy_error(ctx: &crate::Context, code: crate::Code) -> Error {
    if code != crate::Code::NOT_SUPPORTED {
        return ctx.error(Call::FabricCpyBatchAsync, code);
    }
    let version = ctx.driver_version();
    let detail = match version {
        Some(v) if v < crate::driver::FABRIC_COPY_MIN_VERSION => {
            "the driver has no cuFabricCpyBatchAsync: it exists from CUDA 13.5 on"
        }
        _ => "the driver answered NOT_SUPPORTED: no logical endpoints here",
    };
    Error::unsupported(crate::error::Feature::FabricCopy, version, detail)
}

/// The copies of one batch, in flight on a stream. Wait with
/// [`InFlight::wait`]; dropping it synchronizes the stream too.
///
/// It borrows the endpoints and the memory of the batch: destroying,
/// unbinding or freeing them while it lives does not compile (F4).
#[must_use = "the copies are in flight: call `.wait()` (or keep the token while the stream runs, then wait) before reading the destination; dropping it synchronizes the stream"]
pub struct InFlight<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) host_in: Vec<Vec<u8>>,
    pub(crate) host_out: Vec<(usize, Vec<u8>)>,
    /// The stream's sequence number of the batch.
    pub(crate) seq: u64,
    /// An event recorded after the batch ([`InFlight::with_event`]).
    pub(crate) event: Option<crate::stream::Event>,
    pub(crate) _borrow: PhantomData<&'a ()>,
}

impl std::fmt::Debug for InFlight<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("stream", self.stream)
            .finish()
    }
}

/// What a waited batch hands back: its host buffers.
#[derive(Debug, Default)]
pub struct Completed {
    /// The host buffers given to [`CopyBatch::put_host`], in order.
    pub sent: Vec<Vec<u8>>,
    /// The buffers [`CopyBatch::get_host`] filled, in order.
    pub received: Vec<Vec<u8>>,
}

impl<'a> InFlight<'a> {
    /// The token of the batch `seq`, just enqueued on `stream`.
    pub(crate) fn new(
        stream: &'a Stream,
        host_in: Vec<Vec<u8>>,
        host_out: Vec<(usize, Vec<u8>)>,
        seq: u64,
    ) -> Self {
        InFlight {
            stream,
            host_in,
            host_out,
            seq,
            event: None,
            _borrow: PhantomData,
        }
    }

    /// Records an event right after the batch (`cuEventCreate`,
    /// `cuEventRecord`), so that the batch completes through the event
    /// (F4: "an event after it observed"): [`InFlight::is_done`] queries
    /// it and [`InFlight::wait`] waits for it alone, not for work enqueued
    /// on the stream after the batch.
    ///
    /// # Errors
    /// [`Error::Driver`] from either call; the token is dropped then
    /// (which synchronizes the stream).
    pub fn with_event(mut self) -> Result<Self> {
        let mut event = crate::stream::Event::new(self.stream.context(), self.stream.device())?;
        event.record(self.stream)?;
        // Recorded after this batch and whatever was enqueued since: it
        // completes no earlier than the batch.
        self.event = Some(event);
        Ok(self)
    }

    /// Waits until the batch completed: through its event when it has one,
    /// else the stream (`cuStreamSynchronize`).
    fn settle(&self) -> Result<()> {
        match &self.event {
            Some(e) => {
                e.synchronize()?;
                self.stream.inner.passed_through(self.seq);
                Ok(())
            }
            None => self.stream.synchronize(),
        }
    }

    /// Waits until the stream passed the batch (its event, if
    /// [`InFlight::with_event`] recorded one, else `cuStreamSynchronize`)
    /// and hands back the host buffers.
    ///
    /// # Errors
    /// [`Error::Driver`] (an asynchronous fault). The host buffers are then
    /// leaked, not freed: a copy may still use them.
    pub fn wait(self) -> Result<Completed> {
        let mut me = std::mem::ManuallyDrop::new(self);
        let settled = me.settle();
        // The event goes now (the token's Drop does not run).
        drop(me.event.take());
        match settled {
            Ok(()) => Ok(Completed {
                sent: std::mem::take(&mut me.host_in),
                received: std::mem::take(&mut me.host_out)
                    .into_iter()
                    .map(|(_, b)| b)
                    .collect(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Whether the stream passed the batch, without blocking: its event
    /// (`cuEventQuery`) if [`InFlight::with_event`] recorded one, else the
    /// stream (`cuStreamQuery`).
    ///
    /// # Errors
    /// As [`Stream::query`].
    pub fn is_done(&self) -> Result<bool> {
        match &self.event {
            Some(e) => e.query(),
            None => self.stream.query(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            if let Err(e) = self.settle() {
                // The copies may still use the host buffers: leak them.
                std::mem::forget(std::mem::take(&mut self.host_in));
                std::mem::forget(std::mem::take(&mut self.host_out));
                self.stream.context().record_teardown(e);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{Op, Side, dependent, intersect, merged};

    /// The definition, pair by pair (F3).
    fn dependent_pairwise(ops: &[(Side, Side, u64)]) -> Option<(usize, usize)> {
        let range = |side: Side, size: u64| match side {
            Side::Ep(id, off) => Some((Some(id), off, off.saturating_add(size))),
            Side::Addr(a) => Some((None, a, a.saturating_add(size))),
            Side::Host(_) | Side::HostOut(_) => None,
        };
        for (i, &(_, dst, size)) in ops.iter().enumerate() {
            let Some(w) = range(dst, size).filter(|_| size > 0) else {
                continue;
            };
            for (j, &(src2, dst2, size2)) in ops.iter().enumerate() {
                if i == j || size2 == 0 {
                    continue;
                }
                for r in [range(src2, size2), range(dst2, size2)]
                    .into_iter()
                    .flatten()
                {
                    if r.0 == w.0 && r.1 < w.2 && w.1 < r.2 {
                        return Some((i, j));
                    }
                }
            }
        }
        None
    }

    fn side(k: u8, at: u64) -> Side {
        match k % 4 {
            0 => Side::Ep(1, at),
            1 => Side::Ep(2, at),
            2 => Side::Addr(at),
            _ => Side::Host(0),
        }
    }

    proptest::proptest! {
        #[test]
        fn f3_the_sweep_finds_a_dependency_exactly_when_some_pair_is_dependent(
            raw in proptest::collection::vec((0u8..4, 0u64..64, 0u8..4, 0u64..64, 0u64..16), 0..24)
        ) {
            let ops: Vec<_> = raw
                .iter()
                .map(|&(sk, sa, dk, da, n)| (side(sk, sa), side(dk, da), n))
                .collect();
            let typed: Vec<Op> = ops
                .iter()
                .map(|&(src, dst, size)| Op { src, dst, size, ep: 0 })
                .collect();
            let found = dependent(&typed);
            proptest::prop_assert_eq!(found.is_some(), dependent_pairwise(&ops).is_some());
            if let Some((a, b)) = found {
                // The pair named is a dependent pair.
                let two = [ops[a], ops[b]];
                proptest::prop_assert!(a != b && dependent_pairwise(&two).is_some());
            }
        }

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
                .map(|r| merged(r))
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

        #[test]
        fn f3_ops_laid_out_in_order_are_found_dependent_exactly_when_some_pair_is(
            raw in proptest::collection::vec((0u64..20, 0u64..20, 0u64..16, 0u8..8), 0..24)
        ) {
            // Puts at rising addresses and offsets, steps sometimes shorter
            // than the ops (overlap) and now and then to a second endpoint:
            // the one-pass proof's cases and its fall-backs to the sweep.
            let (mut a, mut o) = (0u64, 0u64);
            let ops: Vec<_> = raw
                .iter()
                .map(|&(da, dof, n, e)| {
                    a += da;
                    o += dof;
                    (Side::Addr(a), Side::Ep(if e == 0 { 2 } else { 1 }, o), n)
                })
                .collect();
            let typed: Vec<Op> = ops
                .iter()
                .map(|&(src, dst, size)| Op { src, dst, size, ep: 0 })
                .collect();
            proptest::prop_assert_eq!(
                dependent(&typed).is_some(),
                dependent_pairwise(&ops).is_some()
            );
        }
    }
}

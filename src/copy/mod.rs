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
//!   the stream's device, never memory imported by fabric handle, whose
//!   ordinal may name another node's device ([`Error::CopyNotLocal`], F2),
//!   host memory mapped with access for the stream's device
//!   ([`Error::CopyNotAccessible`], F2), no dependent ops
//!   ([`Error::CopyDependent`], F3). The flags are always 0 (F5) and the
//!   stream is never the NULL stream (F6): neither can be written.
//!   The builder writes the driver's op list itself and makes these checks
//!   as each op comes, against the memory and endpoint of the op before
//!   (issue 22, `benches/copy_batch.rs`): an op laid out after the last one
//!   on the same memory and endpoint costs seven comparisons (two of them
//!   overflow checks) and one store beside the op it writes; the errors are
//!   reported at enqueue, first the local side's ranges, then the endpoint
//!   side's, then F2, then F3, each naming its op. Blocks at a stride are
//!   one call ([`CopyBatch::put_strided`], [`Strided`], in `strided.rs`),
//!   checked once.
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
//!   (`ledger::settle`);
//! - host memory: host bytes are *owned* buffers moved into the batch
//!   (`Vec<u8>`), never borrowed slices. A waited token hands them back; a
//!   dropped one synchronizes before it frees them; a forgotten one leaks
//!   them — so no copy ever reads or writes freed host memory. (A borrowed
//!   slice would dangle after `forget`; a scope that synchronizes at its
//!   end, as `std::thread::scope` joins, would work too, at the price of a
//!   closure around every copy.)
//!
//! **The portable path (issue 19, item 4; `portable.rs`, a child module).** On drivers
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

use smallvec::SmallVec;

use crate::driver::{Call, CopyOp, Device, Location, MemHint, Operand, Pointer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent, Result};
use crate::kind::MemShare;
use crate::kind::{ImportedMulticast, ImportedUnicast, Kind, Unicast};
use crate::ledger::holds::Keep;
use crate::memory::{BindSource, Locality, Mapped};
use crate::state::{Agreed, IsReady, Sealed, State};
use crate::stream::Stream;
use crate::unwind::OnUnwind;

mod portable;
mod strided;
pub(crate) use portable::local_binds;
pub use strided::Strided;

/// Kinds whose endpoint a get may read (F1: unicast only).
#[diagnostic::on_unimplemented(
    message = "a get reads from a unicast endpoint only: `{Self}` is a multicast endpoint, which has no single memory to read from (F1)",
    label = "`get` from a multicast endpoint",
    note = "read your own member's bound memory directly (it holds what the team put), or get from the unicast endpoint of the rank that owns the bytes (`team::unicast_peers`)"
)]
pub trait CanGet: Kind + Sealed {}
impl<X: Send + Sync + 'static> CanGet for Unicast<X> where Unicast<X>: Kind {}
impl CanGet for ImportedUnicast {}

/// Sorted, disjoint `[start, end)` intervals (one or two in the usual
/// endpoint: inline, no allocation).
pub(crate) type Intervals = SmallVec<[(u64, u64); 2]>;

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

/// An allocation a batch names: the first op naming it, where it is (F2),
/// its context's key and its address range `(address, size)`.
type MemoryNamed = (usize, Locality, usize, (u64, u64));

/// The state of a [`CopyBatch`].
///
/// The builder writes the driver's op list itself and checks each op as it
/// comes (issue 22): an op on the same memory and endpoint as the one before
/// passes the range checks, F9 and F3's order in a few comparisons against
/// the [`Cursor`]; anything else takes the slow path, which reads the facts
/// of the endpoint and resets the cursor. The errors are kept, the first of
/// each kind, and [`BatchInner::check`] reports them in the order they
/// have always had.
pub(crate) struct BatchInner {
    /// The driver's op list, in op order: what `cuFabricCpyBatchAsync`
    /// takes, and what the portable path and the F3 sweep read.
    pub(crate) list: Vec<CopyOp>,
    pub(crate) keep: Keep,
    /// The distinct endpoints of the batch (few: looked up linearly), at the
    /// index of their entry in `keep.endpoints`.
    pub(crate) eps: SmallVec<[EpFacts; 1]>,
    /// Where each allocation of `keep.memory` is (same index), with
    /// the first op naming it, for F2, and its context's key (memory of
    /// another context is refused): checked once per allocation.
    /// And its address range `(address, size)`, for F3 through an
    /// endpoint's own bound memory.
    locations: SmallVec<[MemoryNamed; 1]>,
    pub(crate) host_in: Vec<Vec<u8>>,
    pub(crate) host_out: Vec<(usize, Vec<u8>)>,
    /// The first error a builder call met on the local side (memory range,
    /// host buffer).
    error: Option<Box<Error>>,
    /// The first error of an endpoint side (its range, F9), reported after
    /// `error`, as the checks always were.
    ep_error: Option<Box<Error>>,
    cursor: Cursor,
    /// F3 in op order: the endpoint and end of the last put's destination
    /// (as of the last slow path: the cursor holds the ends since).
    put_last: Option<(u32, u64)>,
    /// F3 in op order: the end of the last get's destination address.
    get_end: u64,
    /// A destination started before the end of the one before it in its
    /// space: the one-pass proof failed, the sort and sweep decides.
    unordered: bool,
    /// Some op writes an endpoint (put), some op reads one (get): with both,
    /// a source can meet a destination, which the order of destinations
    /// alone does not prove apart.
    puts: bool,
    gets: bool,
}

/// What the last op named, so that the next op on the same memory and
/// endpoint is checked against it alone.
struct Cursor {
    /// The address of the last `Mapped` borrowed (borrowed for the batch's
    /// life, so no other one can be there); 0: none. Its keep-alive and F2
    /// location are in the batch, and its address range does not wrap.
    mem: usize,
    /// Its address and size.
    mem_ptr: u64,
    mem_size: u64,
    /// The id of the last endpoint; `u64::MAX`: none.
    ep: u64,
    /// The address of that endpoint borrowed (borrowed for the batch's
    /// life, so no other one can be there); 0: none.
    ep_at: usize,
    /// `[start, end)`: bound on every device of that endpoint in this
    /// process (F9) and inside it: an op inside passes both checks.
    start: u64,
    end: u64,
    /// The least offset a put to that endpoint may start at to come after
    /// the last put (F3's order) and at or after `start`: the end of the
    /// last put, which was to this endpoint; `u64::MAX` when the last put
    /// was elsewhere (the slow path decides).
    put_from: u64,
    /// Whether the last put was to this endpoint, through the cursor: its
    /// end is `put_from`, not yet in `put_last`.
    putting: bool,
}

impl Cursor {
    const NONE: Cursor = Cursor {
        mem: 0,
        mem_ptr: 0,
        mem_size: 0,
        ep: u64::MAX,
        ep_at: 0,
        start: 0,
        end: 0,
        put_from: u64::MAX,
        putting: false,
    };
}

/// What the checks need of one endpoint of the batch, read once however
/// many ops name it.
pub(crate) struct EpFacts {
    pub(crate) id: u32,
    ep_size: u64,
    /// Whether its devices' bindings are checked (F9): not for imported
    /// endpoints, which bind nothing here.
    bound_here: bool,
    /// The `[start, end)` intervals bound on every device of the endpoint
    /// in this process (sorted, disjoint; `[0, size)` when nothing is
    /// checked): an op inside one passes F9 at one comparison; any other op
    /// is walked device by device, which names the device.
    covered: Intervals,
    /// What the portable path needs of the endpoint.
    pub(crate) target: portable::Target,
    /// The range's bindings generation `covered` was read at (`None`:
    /// imported, not checked): a bind or unbind since makes it stale.
    bindings_gen: Option<u64>,
    /// A heap's top ([`crate::team::OwnedPeers::top`]): the bytes every
    /// rank bound and agreed on; past it a copy is refused (R13.3).
    agreed: Option<u64>,
    /// How many of its binds here are by handle (F3: two endpoint spans,
    /// here or on another endpoint of the batch, may be one allocation's
    /// bytes; where each is, [`crate::ledger::Slot::handle_spans`], is read at enqueue only when
    /// the batch's endpoints have two or more).
    by_handle: usize,
    /// Its bind alignment, the unit of [`crate::ledger::Bound::handle_at`].
    align: u64,
}

impl std::fmt::Debug for CopyBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyBatch")
            .field("ops", &self.inner.list.len())
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
                list: Vec::new(),
                keep: Keep {
                    memory: SmallVec::new(),
                    endpoints: SmallVec::new(),
                },
                eps: SmallVec::new(),
                locations: SmallVec::new(),
                host_in: Vec::new(),
                host_out: Vec::new(),
                error: None,
                ep_error: None,
                cursor: Cursor::NONE,
                put_last: None,
                get_end: 0,
                unordered: false,
                puts: false,
                gets: false,
            }),
            _borrow: PhantomData,
        }
    }

    /// Puts `size` bytes of `src` from `src_offset` into `ep` at `offset`
    /// (unicast: the owner's bound memory; multicast: every member's).
    #[inline]
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
        let inner = &mut *self.inner;
        let from = match inner.put_next(src, src_offset, ep, offset, size) {
            Some(from) => from,
            None => inner.put_slow(src, src_offset, ep, offset, size),
        };
        inner.list.push(CopyOp {
            src: Operand::Pointer(Pointer::device(from)),
            dst: Operand::LogicalEndpoint {
                id: ep.id(),
                offset,
            },
            size,
        });
        self
    }

    /// Puts the host bytes `bytes` (all of them) into `ep` at `offset`; the
    /// buffer is handed back by [`InFlight::wait`].
    #[inline]
    pub fn put_host<S, K: Kind>(
        mut self,
        bytes: Vec<u8>,
        ep: &'a Endpoint<S, K>,
        offset: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
    {
        let inner = &mut *self.inner;
        let op = inner.list.len();
        let size = bytes.len() as u64;
        // The buffer's heap address: moving the `Vec` does not move it.
        let from = bytes.as_ptr().addr() as u64;
        inner.host_in.push(bytes);
        inner.put_to(ep, offset, size, op);
        inner.list.push(CopyOp {
            src: Operand::Pointer(Pointer::host(from)),
            dst: Operand::LogicalEndpoint {
                id: ep.id(),
                offset,
            },
            size,
        });
        self
    }

    /// Gets `size` bytes of the unicast endpoint `ep` at `offset` into
    /// `dst` at `dst_offset`. Not for multicast endpoints (F1): see [`CanGet`].
    #[inline]
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
        let inner = &mut *self.inner;
        let op = inner.list.len();
        inner.get_from(ep, offset, size, op);
        let to = inner.mapped(dst, dst_offset, size, op);
        // F3's order of the destination addresses.
        inner.unordered |= to < inner.get_end;
        inner.get_end = to.saturating_add(size);
        inner.list.push(CopyOp {
            src: Operand::LogicalEndpoint {
                id: ep.id(),
                offset,
            },
            dst: Operand::Pointer(Pointer::device(to)),
            size,
        });
        self
    }

    /// Gets `size` bytes of the unicast endpoint `ep` at `offset` into a
    /// new host buffer, handed out by [`InFlight::wait`] (F1: see [`CanGet`]).
    /// A buffer this process cannot allocate is refused at enqueue
    /// ([`Error::CopyHostBufferUnavailable`]), not an abort.
    #[inline]
    pub fn get_host<S, K>(mut self, ep: &'a Endpoint<S, K>, offset: u64, size: u64) -> Self
    where
        S: State + IsReady + Agreed,
        K: CanGet,
    {
        let inner = &mut *self.inner;
        let op = inner.list.len();
        inner.get_from(ep, offset, size, op);
        // A size past the endpoint is refused at enqueue (F9): no buffer of
        // that size is allocated for it here. Nor for a batch already
        // refused (bytes not bound here, F9): a get over unbound bytes of a
        // large endpoint must be an error, not an allocation that aborts.
        let inside = offset.checked_add(size).is_some_and(|end| end <= ep.size());
        let refused = inner.error.is_some() || inner.ep_error.is_some();
        let mut buf = match usize::try_from(size) {
            Ok(_) if !inside || refused => Vec::new(),
            Ok(len) => host_buffer(len).unwrap_or_else(|| {
                inner
                    .error
                    .get_or_insert_with(|| Box::new(Error::CopyHostBufferUnavailable { op, size }));
                Vec::new()
            }),
            Err(_) => {
                inner.error.get_or_insert_with(|| {
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
        // The buffer's heap address: moving the `Vec` does not move it.
        let to = buf.as_mut_ptr().addr() as u64;
        inner.host_out.push((op, buf));
        inner.list.push(CopyOp {
            src: Operand::LogicalEndpoint {
                id: ep.id(),
                offset,
            },
            dst: Operand::Pointer(Pointer::host(to)),
            size,
        });
        self
    }

    /// How many ops the batch has.
    pub fn len(&self) -> usize {
        self.inner.list.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.inner.list.is_empty()
    }
}

/// A zeroed host buffer of `len` bytes, or `None` when this process cannot
/// have one: `len` is an endpoint's bytes, and an imported endpoint's size
/// is what its exporter claims, so a failed allocation is an error at
/// enqueue, not an abort (`vec![0; len]` aborts). The zeroing is a pass the
/// copy overwrites; no stable safe API allocates zeroed memory fallibly.
#[inline]
fn host_buffer(len: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).ok()?;
    buf.resize(len, 0);
    Some(buf)
}

impl BatchInner {
    /// The address `at` bytes into `mem` for op `op`, after the range check;
    /// at two comparisons when the last op named `mem` too.
    #[inline]
    fn mapped<H: MemShare>(&mut self, mem: &Mapped<H>, at: u64, size: u64, op: usize) -> u64 {
        let c = &self.cursor;
        if std::ptr::from_ref(mem).addr() == c.mem
            && let Some(end) = at.checked_add(size)
            && end <= c.mem_size
            && at < c.mem_size
        {
            // No wrap: `at < mem_size` and `mem_ptr + mem_size` was checked
            // when the cursor took `mem`.
            return c.mem_ptr.wrapping_add(at);
        }
        self.mapped_slow(mem, at, size, op)
    }

    /// [`BatchInner::mapped`] for another allocation than the last, or out
    /// of range. One keep-alive per allocation, however many ops name it,
    /// and one F2 location: compared by address, cloned only when new (no
    /// reference count touched per op). The latest first: ops usually name
    /// the same allocation one after the other.
    #[cold]
    #[inline(never)]
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

    /// A put from the cursor's memory to its endpoint, after the last put
    /// there: the source address, after the memory range check, the
    /// endpoint range check, F9 and F3's order, in one chain of
    /// comparisons; `None` for anything else ([`BatchInner::put_slow`]).
    #[inline]
    fn put_next<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Option<u64> {
        let c = &mut self.cursor;
        if std::ptr::from_ref(mem).addr() == c.mem
            && std::ptr::from_ref(ep).addr() == c.ep_at
            && at.checked_add(size)? <= c.mem_size
            && at < c.mem_size
            && offset >= c.put_from
        {
            let end = offset.checked_add(size)?;
            if end <= c.end {
                c.put_from = end;
                // No wrap: see `mapped`.
                return Some(c.mem_ptr.wrapping_add(at));
            }
        }
        None
    }

    /// A put that [`BatchInner::put_next`] did not take: each side on its own.
    #[cold]
    #[inline(never)]
    fn put_slow<H: MemShare, S: State, K: Kind>(
        &mut self,
        mem: &Mapped<H>,
        at: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> u64 {
        let op = self.list.len();
        let from = self.mapped(mem, at, size, op);
        self.put_to(ep, offset, size, op);
        from
    }

    /// The endpoint side of a put: inside the endpoint, bound (F9) and after
    /// the last put's destination (F3's order), at three comparisons when
    /// the last op named `ep` too.
    #[inline]
    fn put_to<S: State, K: Kind>(
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
    /// three comparisons when the last op named `ep` too. (A get's source
    /// is kept out of F3's one-pass order: it can only meet a put's
    /// destination, and a batch with both is proven by [`disjoint_in_order`].)
    #[inline]
    fn get_from<S: State, K: Kind>(
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
        self.get_slow(ep, offset, size, op);
    }

    #[cold]
    #[inline(never)]
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
        match self.ep_check(index, offset, size, op) {
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
                    self.cursor.ep = u64::from(id);
                    self.cursor.ep_at = std::ptr::from_ref(ep).addr();
                    self.cursor.start = start;
                    self.cursor.end = stop;
                    // `end >= offset >= start`: the put lies in `[start, stop)`.
                    self.cursor.put_from = end;
                    self.cursor.putting = true;
                }
            }
            Err(e) => {
                self.ep_error.get_or_insert_with(|| Box::new(e));
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn get_slow<S: State, K: Kind>(
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
                self.cursor.ep = u64::from(ep.id());
                self.cursor.ep_at = std::ptr::from_ref(ep).addr();
                self.cursor.start = start;
                self.cursor.end = stop;
            }
            Ok(None) => {}
            Err(e) => {
                self.ep_error.get_or_insert_with(|| Box::new(e));
            }
        }
    }

    /// Before the cursor leaves its endpoint: the end of the puts made
    /// through it goes to `put_last`, and the cursor names no endpoint.
    fn leave_cursor(&mut self) {
        if self.list.capacity() == 0 {
            // The first op: room for 16 (896 bytes, one small allocation)
            // rather than 4, 8, 16: two reallocations fewer by 64 ops.
            self.list.reserve(16);
        }
        let c = &mut self.cursor;
        if c.putting
            && let Ok(id) = u32::try_from(c.ep)
        {
            self.put_last = Some((id, c.put_from));
        }
        c.ep = u64::MAX;
        c.ep_at = 0;
        c.put_from = u64::MAX;
        c.putting = false;
    }

    /// `ep`'s index in `eps` (and `keep.endpoints`), added when new.
    fn endpoint<S: State, K: Kind>(&mut self, ep: &Endpoint<S, K>) -> usize {
        // By id and range: an endpoint of another context may carry the
        // same id, and must be checked (and refused) as itself.
        let same = |(e, (r, _)): (&EpFacts, &(std::sync::Arc<crate::ledger::RangeInner>, u32))| {
            e.id == ep.id() && std::ptr::eq(&**r, &**ep.range())
        };
        match self.eps.iter().zip(&self.keep.endpoints).rposition(same) {
            Some(i) => i,
            None => {
                self.eps.push(Self::facts(ep));
                self.keep.endpoints.push((ep.range().clone(), ep.id()));
                self.eps.len() - 1
            }
        }
    }

    /// What the checks need of `ep`: once per endpoint of the batch.
    fn facts<S: State, K: Kind>(ep: &Endpoint<S, K>) -> EpFacts {
        let imported = std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedUnicast>()
            || std::any::TypeId::of::<K>() == std::any::TypeId::of::<ImportedMulticast>();
        let devices = ep.devices();
        let bound_here = !imported && !devices.is_empty();
        let mut bindings_gen = None;
        let slot = ep.slot();
        let agreed = slot.agreed();
        let by_handle = if bound_here { slot.by_handle() } else { 0 };
        let covered = if bound_here {
            // Read under the lock with the bindings: a later bind or unbind
            // moves it, and enqueue reads them again (F9).
            bindings_gen = Some(ep.range().bindings_gen());
            let mut every: Option<Intervals> = None;
            for &d in devices {
                let mine = merged(slot.spans(d));
                every = Some(match every {
                    None => mine,
                    Some(before) => intersect(&before, &mine),
                });
            }
            every.unwrap_or_default()
        } else {
            // Nothing bound here to check: the endpoint's range alone.
            smallvec::smallvec![(0, ep.size())]
        };
        drop(slot);
        EpFacts {
            id: ep.id(),
            ep_size: ep.size(),
            bound_here,
            covered,
            target: portable::Target {
                id: ep.id(),
                devices: SmallVec::from_slice(devices),
                team_size: ep.facts().team_size,
            },
            bindings_gen,
            agreed,
            by_handle,
            align: ep.facts().align,
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
        if !ep.bound_here {
            return Ok(None);
        }
        // Not inside: walk each device's bound ranges from the op's offset
        // to its end, which names the device that misses bytes.
        let Some((range, id)) = self.keep.endpoints.get(index) else {
            return Ok(None);
        };
        let slot = range.slot(*id);
        for &dev in &ep.target.devices {
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
                });
            }
        }
        Ok(None)
    }

    /// Every check before the driver (F2, F3, F9), in the order they have
    /// always been reported: the local side's ranges, the endpoint side's
    /// (range, F9), F2, F3.
    pub(crate) fn check(&mut self, stream_dev: Device) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(*e);
        }
        if let Some(e) = self.ep_error.take() {
            return Err(*e);
        }
        self.recheck_stale()?;
        for (op, locality, ..) in &self.locations {
            let (location, fabric_import) = match locality {
                Locality::Device(d) if *d == stream_dev => continue,
                Locality::Host { access, .. } if access.contains(&stream_dev) => continue,
                Locality::Host { numa, access } => {
                    return Err(Error::CopyNotAccessible {
                        op: *op,
                        host_numa: *numa,
                        access: access.to_vec(),
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
            && let Some((op, other)) = dependent(&self.list, &aliases)
        {
            return Err(Error::CopyDependent { op, other });
        }
        Ok(())
    }
}

/// A local endpoint's bound memory, in the space of its bytes:
/// `(id, endpoint offset, size, space, start)` — space 0 for memory bound
/// by address (`start` its address), an allocation's identity
/// ([`crate::memory::AllocId`], never 0) for one bound by handle (`start`
/// the offset in it). An op through the endpoint there reads or writes
/// those bytes too (F3).
type Alias = (u32, u64, u64, u64, u64);

impl BatchInner {
    /// The bindings of the batch's local endpoints, when some memory is
    /// reached two ways: one bound by address overlaps memory the batch
    /// names by address, or another binding (one allocation bound at two
    /// offsets, or to two endpoints, by address or by handle). Then an op
    /// through the endpoint there reads or writes those bytes too (F3).
    /// Usually none: one relaxed load per endpoint when its range never
    /// had a window, and nothing built unless one allocation is bound by
    /// handle twice among the batch's endpoints.
    fn aliases(&self) -> Vec<Alias> {
        let mut out = Vec::new();
        let mut by_handle = 0usize;
        for (f, (range, id)) in self.eps.iter().zip(&self.keep.endpoints) {
            if !f.bound_here {
                continue;
            }
            by_handle = by_handle.saturating_add(f.by_handle);
            if !range.maybe_attached() {
                continue;
            }
            let slot = range.slot(*id);
            out.extend(
                slot.windows()
                    .filter_map(crate::window::Window::local_span)
                    .map(|(off, size, addr)| (*id, off, size, 0, addr)),
            );
        }
        if by_handle >= 2 {
            self.shared_handles(&mut out);
        }
        if out.is_empty() || (out.len() == 1 && self.locations.is_empty()) {
            return Vec::new();
        }
        // `(space, start, end)` of each bound span and each memory named by
        // address, sorted: any two that overlap make every span an alias
        // (an extra alias only maps an op to the bytes it does reach).
        let mut spans: Vec<(u64, u64, u64)> = out
            .iter()
            .map(|&(_, _, size, space, at)| (space, at, at.saturating_add(size)))
            .chain(
                self.locations
                    .iter()
                    .map(|&(.., (p, len))| (0, p, p.saturating_add(len))),
            )
            .filter(|&(_, s, e)| s < e)
            .collect();
        spans.sort_unstable();
        let met = spans
            .windows(2)
            .any(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
            || {
                // Past the neighbour: a long span may reach over several.
                let mut reach = (u64::MAX, 0u64);
                spans.iter().any(|&(sp, s, e)| {
                    let hit = reach.0 == sp && s < reach.1;
                    reach = if reach.0 == sp {
                        (sp, reach.1.max(e))
                    } else {
                        (sp, e)
                    };
                    hit
                })
            };
        if !met {
            out.clear();
        }
        out
    }

    /// The binds by handle of the batch's local endpoints whose allocation
    /// is bound by handle at least twice among them (compared by identity,
    /// a recorded fact), pushed to `out`: only those can meet another bind
    /// in its bytes. Called when two or more binds are by handle.
    #[cold]
    #[inline(never)]
    fn shared_handles(&self, out: &mut Vec<Alias>) {
        let mut all: Vec<Alias> = Vec::new();
        for (f, (range, id)) in self.eps.iter().zip(&self.keep.endpoints) {
            if f.by_handle == 0 {
                continue;
            }
            // Read again under the lock: the bindings are those `by_handle`
            // counted (`recheck_stale` made it current, and the copy gate
            // keeps binds and unbinds out until the batch is recorded).
            let spans = range.slot(*id).handle_spans(f.align);
            all.extend(
                spans
                    .into_iter()
                    .map(|(off, size, alloc, at)| (*id, off, size, alloc, at)),
            );
        }
        all.sort_unstable_by_key(|a| a.3);
        for (i, a) in all.iter().enumerate() {
            let before = i.checked_sub(1).and_then(|j| all.get(j));
            if before.is_some_and(|b| b.3 == a.3) || all.get(i + 1).is_some_and(|b| b.3 == a.3) {
                out.push(*a);
            }
        }
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
            let Some(seen) = facts.bindings_gen else {
                continue;
            };
            if range.bindings_gen() == seen {
                continue;
            }
            let slot = range.slot(*id);
            let now = range.bindings_gen();
            let by_handle = slot.by_handle();
            let mut every: Option<Intervals> = None;
            for &d in &facts.target.devices {
                let mine = merged(slot.spans(d));
                every = Some(match every {
                    None => mine,
                    Some(before) => intersect(&before, &mine),
                });
            }
            drop(slot);
            let id = *id;
            if let Some(f) = self.eps.get_mut(index) {
                f.covered = every.unwrap_or_default();
                f.bindings_gen = Some(now);
                f.by_handle = by_handle;
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

/// `(offset, size)` ranges as sorted, disjoint `[start, end)` intervals,
/// touching ones joined.
fn merged(ranges: impl IntoIterator<Item = (u64, u64)>) -> Intervals {
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

/// The first pair of ops of `ops` that depend on each other (F3): one's
/// destination overlaps the other's source or destination, in the same
/// endpoint or address space. `(the op whose destination, the other)`; of two
/// destinations, the lower op first. One sort and one sweep: O(n log n).
fn dependent(ops: &[CopyOp], aliases: &[Alias]) -> Option<(usize, usize)> {
    if aliases.is_empty() && disjoint_in_order(ops) {
        return None;
    }
    // (space: endpoint id or none for addresses, start, end, op, destination)
    type Span = (Option<u32>, u64, u64, usize, bool);
    let span = |side: &Operand, size: u64, op: usize, dst: bool| -> Option<Span> {
        let (space, start) = space_of(side)?;
        Some((space, start, start.saturating_add(size), op, dst))
    };
    // Addresses and endpoint offsets apart: each is usually in order
    // already (ops laid out one after the other), and then not sorted again.
    let (mut addrs, mut eps) = (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
    // Spans in an allocation bound by handle (aliases only), by its key.
    let mut held: Vec<(u64, Span)> = Vec::new();
    for (i, CopyOp { src, dst, size }) in ops.iter().enumerate().filter(|(_, op)| op.size > 0) {
        let size = *size;
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
        // Through a local endpoint, the addresses of the memory bound there
        // (an op through it and an op by address may meet in that memory).
        for (side, dst) in [(src, false), (dst, true)] {
            let Operand::LogicalEndpoint { id, offset } = *side else {
                continue;
            };
            let end = offset.saturating_add(size);
            for &(a_id, a_off, a_size, a_space, a_at) in aliases {
                let (s, e) = (offset.max(a_off), end.min(a_off.saturating_add(a_size)));
                if a_id == id && s < e {
                    let at = a_at.saturating_add(s - a_off);
                    let span = (None, at, at.saturating_add(e - s), i, dst);
                    if a_space == 0 {
                        addrs.push(span);
                    } else {
                        held.push((a_space, span));
                    }
                }
            }
        }
    }
    for spans in [&mut addrs, &mut eps] {
        if !spans.is_sorted_by_key(|&(space, start, ..)| (space, start)) {
            spans.sort_unstable_by_key(|&(space, start, ..)| (space, start));
        }
    }
    held.sort_unstable_by_key(|&(key, (_, start, ..))| (key, start));
    sweep(addrs.iter().chain(eps.iter()).copied())
        .or_else(|| sweep(held.iter().map(|&(k, (_, s, e, op, d))| (k, s, e, op, d))))
}

/// The first dependent pair of ops among `spans` (sorted by space, then
/// start; `(space, start, end, op, destination)`), if any.
fn sweep<K: PartialEq + Copy>(
    spans: impl Iterator<Item = (K, u64, u64, usize, bool)>,
) -> Option<(usize, usize)> {
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
    for (i, (sp, start, end, op, dst)) in spans.enumerate() {
        if i == 0 || Some(sp) != space {
            space = Some(sp);
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
fn disjoint_in_order(ops: &[CopyOp]) -> bool {
    // The end of the last address span, and (id, end) of the last endpoint one.
    let mut addr_end = 0u64;
    let mut ep_end: Option<(u32, u64)> = None;
    for CopyOp { src, dst, size } in ops {
        if *size == 0 {
            continue;
        }
        for side in [src, dst] {
            match space_of(side) {
                Some((None, a)) => {
                    if a < addr_end {
                        return false;
                    }
                    addr_end = a.saturating_add(*size);
                }
                Some((Some(id), off)) => {
                    if ep_end.is_some_and(|(i, e)| id < i || (id == i && off < e)) {
                        return false;
                    }
                    ep_end = Some((id, off.saturating_add(*size)));
                }
                None => {}
            }
        }
    }
    true
}

/// Where an operand's bytes start, for F3: `(Some(id), offset)` in an
/// endpoint, `(None, address)` in device (or mapped) memory; `None` for an
/// owned host buffer, which no other op names.
fn space_of(side: &Operand) -> Option<(Option<u32>, u64)> {
    match *side {
        Operand::LogicalEndpoint { id, offset } => Some((Some(id), offset)),
        Operand::Pointer(Pointer {
            hint: MemHint::Host,
            ..
        }) => None,
        Operand::Pointer(Pointer { ptr, .. }) => Some((None, ptr)),
    }
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
    /// [`Error::CopyNotLocal`], [`Error::CopyNotAccessible`],
    /// [`Error::CopyDependent`], [`Error::WrongContext`], and on the
    /// portable path [`Error::CopyNoWindow`] and [`Error::CopyOntoItself`],
    /// before the driver; [`Error::Driver`] from
    /// the call; [`Error::Unsupported`] ([`Feature::FabricCopy`](crate::error::Feature::FabricCopy),
    /// naming the driver version) where the driver has no fabric copy (before 13.5, F7). Nothing was
    /// enqueued then (the portable path synchronizes what it had enqueued
    /// before a failed `cuMemcpyAsync`), and the host buffers are dropped
    /// with the batch.
    pub fn enqueue<'a>(&'a self, mut batch: CopyBatch<'a>) -> Result<InFlight<'a>> {
        let ctx = &self.inner.ctx;
        // No unbind on these ranges from another thread between the checks
        // below and the record of the batch as in flight (F4), nor a bind's
        // record passing them before the driver bound it (R13.3). (The
        // portable path's windows of a bind in progress never cover bytes
        // the checks passed: binds on one device never overlap, R5.9.)
        let _gate = loop {
            let gate = crate::ledger::gate::EnqueueGate::enter(&batch.inner.keep.endpoints)?;
            batch.check_for(self)?;
            if let Some(gate) = gate.checked()? {
                break gate;
            }
        };
        if ctx.copy_path() == crate::CopyPath::Portable {
            return self.enqueue_portable(batch);
        }
        let FabricList {
            list,
            keep,
            host_in,
            host_out,
        } = batch.into_list();
        // A panic inside the call (a `tracing` layer, a user backend) may
        // come after the driver took the batch: what the copies use stays
        // in flight then, kept by the stream until it is synchronized, and
        // the host buffers are leaked, never freed under a copy (F4).
        let mut held = Some((keep, host_in, host_out));
        let guard = OnUnwind::new(|| {
            if let Some((keep, host_in, host_out)) = held.take() {
                self.inner.record(keep);
                std::mem::forget((host_in, host_out));
            }
        });
        // SAFETY: every id is a ready endpoint borrowed for 'a (R13.1) whose
        // ranges were checked against the bindings this process knows (F9);
        // the ops are independent (F3, checked) and local (F2, checked);
        // the flags are 0 (F5) and the stream is this one (never NULL, F6).
        // Nothing is freed before the stream passed the ops (F4): the
        // memory and endpoints are kept by the record made just below (and
        // borrowed by the token), and the host buffers are owned by the
        // token, freed only after a synchronize or leaked when it is forgotten.
        let r = unsafe { ctx.driver().fabric_copy_batch(self.inner.handle, list, 0) };
        guard.disarm();
        // Taken only by the guard, which ran only if the call unwound.
        let (keep, host_in, host_out) = held.unwrap_or_default();
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
    /// are of its context, then [`BatchInner::check`].
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
        if self
            .inner
            .locations
            .iter()
            .any(|&(_, _, c, _)| c != ctx.key())
        {
            return Err(Error::WrongContext);
        }
        self.inner.check(stream.inner.dev)
    }

    /// The driver's op list of a checked batch (the builder wrote it): its
    /// host buffers by address (owned by what takes the list, which keeps
    /// them where they are).
    pub(crate) fn into_list(self) -> FabricList {
        let BatchInner {
            list,
            keep,
            host_in,
            host_out,
            ..
        } = *self.inner;
        FabricList {
            list,
            keep,
            host_in,
            host_out,
        }
    }
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
        let end = crate::unwind::completing(|| me.settle());
        // The event goes now (the token's Drop does not run).
        drop(me.event.take());
        // Not done: the copies may still use the host buffers, which stay
        // with `me`, never dropped.
        let completed = end.done.then(|| Completed {
            sent: std::mem::take(&mut me.host_in),
            received: std::mem::take(&mut me.host_out)
                .into_iter()
                .map(|(_, b)| b)
                .collect(),
        });
        end.resume()?;
        Ok(completed.unwrap_or_default())
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
            let end = crate::unwind::completing(|| self.settle());
            if !end.done {
                // The copies may still use the host buffers: leak them.
                std::mem::forget(std::mem::take(&mut self.host_in));
                std::mem::forget(std::mem::take(&mut self.host_out));
            }
            if let Err(e) = end.resume() {
                self.stream.context().record_teardown(e);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{dependent, intersect, merged};
    use crate::driver::{CopyOp, Operand, Pointer};

    /// One side of an op, as the tests lay them out.
    #[derive(Clone, Copy)]
    enum Side {
        /// `(id, offset)`.
        Ep(u32, u64),
        /// A device address.
        Addr(u64),
        /// An owned host buffer.
        Host,
    }

    /// The driver's op of `(src, dst, size)`, as the builder writes it.
    fn op(&(src, dst, size): &(Side, Side, u64)) -> CopyOp {
        let operand = |side| match side {
            Side::Ep(id, offset) => Operand::LogicalEndpoint { id, offset },
            Side::Addr(a) => Operand::Pointer(Pointer::device(a)),
            Side::Host => Operand::Pointer(Pointer::host(0)),
        };
        CopyOp {
            src: operand(src),
            dst: operand(dst),
            size,
        }
    }

    /// The definition, pair by pair (F3).
    fn dependent_pairwise(ops: &[(Side, Side, u64)]) -> Option<(usize, usize)> {
        let range = |side: Side, size: u64| match side {
            Side::Ep(id, off) => Some((Some(id), off, off.saturating_add(size))),
            Side::Addr(a) => Some((None, a, a.saturating_add(size))),
            Side::Host => None,
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
            _ => Side::Host,
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
            let typed: Vec<CopyOp> = ops.iter().map(op).collect();
            let found = dependent(&typed, &[]);
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
            let typed: Vec<CopyOp> = ops.iter().map(op).collect();
            proptest::prop_assert_eq!(
                dependent(&typed, &[]).is_some(),
                dependent_pairwise(&ops).is_some()
            );
        }
    }
}

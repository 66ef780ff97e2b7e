//! Data through endpoints: a typed batch of fabric copies
//! (`cuFabricCpyBatchAsync`, SPEC F1–F9) on ready endpoints, enqueued on a
//! [`Stream`](crate::Stream), and the token that says it is in flight.
//!
//! What this module owns (the files are listed at the end):
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
//!   checked once. The builder's state is recycled: taken from the
//!   thread's spare by [`CopyBatch::new`] and given back, emptied, by the
//!   enqueue (`spare`), so that a loop of batches allocates nothing but the
//!   op list the driver takes (issue 30); at enqueue the usual batch (no
//!   error met, no binding changed since, memory on the stream's device,
//!   F3 proven in one pass, no memory reachable two ways) passes its
//!   checks at a few loads per endpoint and allocation.
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
//!
//! **The files.** This one: [`CopyBatch`], its public ops and its state
//! (`BatchInner`, the cursor, `EpFacts`), and [`CanGet`]; `check.rs`: the
//! checks as each op comes and at enqueue (ranges, F9, R13.3, F2);
//! `independence.rs`: F3; `enqueue.rs`: `Stream::enqueue` and the fabric
//! call; `in_flight.rs`: [`InFlight`] and [`Completed`]; `strided.rs`:
//! [`Strided`]; `portable.rs`: the portable path.

use std::cell::Cell;
use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::driver::{CopyOp, Operand, Pointer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent};
use crate::kind::MemShare;
use crate::kind::{ImportedUnicast, Kind, Unicast};
use crate::ledger::holds::Keep;
use crate::memory::{Locality, Mapped};
use crate::state::{Agreed, IsReady, Sealed, State};

mod check;
mod enqueue;
mod in_flight;
mod independence;
mod portable;
mod strided;
pub(crate) use enqueue::{FabricList, fabric_copy_error};
pub use in_flight::{Completed, InFlight};
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

/// A batch of fabric copies to enqueue on a [`Stream`](crate::Stream) at
/// once ([`Stream::enqueue`](crate::Stream::enqueue)); the copies of a batch
/// run in no particular order (F3), so none may depend on another.
///
/// `'a` is how long the endpoints and memory it names are borrowed: until
/// the [`InFlight`] token is waited or dropped.
#[must_use = "a batch does nothing until `stream.enqueue(batch)`"]
pub struct CopyBatch<'a> {
    /// Behind one pointer: the builder moves the batch on every call, and
    /// a moved pointer is a register where the state is ~200 bytes of
    /// memory (issue 22: about 160 instructions per op at 1,024 ops).
    /// Recycled ([`spare`]): taken from the thread's spare by
    /// [`CopyBatch::new`], emptied and given back by the enqueue, so that a
    /// loop of batches allocates no state. (A batch dropped unenqueued
    /// frees it: a `Drop` here kept the builder's `put` from inlining.)
    pub(crate) inner: Box<BatchInner>,
    _borrow: PhantomData<&'a ()>,
}

/// The thread's spare batch state: one emptied [`BatchInner`], so that
/// [`CopyBatch::new`] allocates nothing after the first batch of a thread.
pub(crate) mod spare {
    use super::{BatchInner, Cell};

    thread_local! {
        static SPARE: Cell<Option<Box<BatchInner>>> = const { Cell::new(None) };
    }

    /// The spare, or a new empty state.
    #[inline]
    pub(super) fn take() -> Box<BatchInner> {
        match SPARE.try_with(Cell::take) {
            Ok(Some(inner)) => inner,
            _ => Box::new(BatchInner::empty()),
        }
    }

    /// Empties `inner` (what it still holds is dropped) and keeps it as
    /// the spare if the thread has none.
    #[inline]
    pub(crate) fn give_back(mut inner: Box<BatchInner>) {
        inner.reset();
        // During the thread's teardown (`try_with` fails) it is freed.
        let _ = SPARE.try_with(|s| {
            if let Some(other) = s.replace(Some(inner)) {
                // Two batches alive on the thread at once: keep one.
                s.set(Some(other));
            }
        });
    }
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

impl BatchInner {
    /// No op yet.
    fn empty() -> BatchInner {
        BatchInner {
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
        }
    }

    /// Back to [`BatchInner::empty`], in place: what it holds is dropped,
    /// the op list keeps its capacity (an enqueued batch's went to the
    /// driver).
    fn reset(&mut self) {
        self.list.clear();
        self.keep.memory.clear();
        self.keep.endpoints.clear();
        self.eps.clear();
        self.locations.clear();
        self.host_in = Vec::new();
        self.host_out = Vec::new();
        self.error = None;
        self.ep_error = None;
        self.cursor = Cursor::NONE;
        self.put_last = None;
        self.get_end = 0;
        self.unordered = false;
        self.puts = false;
        self.gets = false;
    }
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
    #[inline]
    pub fn new() -> Self {
        CopyBatch {
            inner: spare::take(),
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
        // Exposed: the driver boundary carries an integer, which the model
        // (and libcuda) turn back into a pointer to read the bytes.
        let from = bytes.as_ptr().expose_provenance() as u64;
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
        // Exposed, as in `put_host`: the driver writes the bytes through it.
        let to = buf.as_mut_ptr().expose_provenance() as u64;
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

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
//!   this process bound ([`Error::CopyNotBound`], F9/R13.3) and inside what
//!   each peer bound as the ranks last agreed ([`Error::CopyPeerNotBound`],
//!   F9/R13.5), local memory on
//!   the stream's device, never memory imported by fabric handle, whose
//!   ordinal may name another node's device ([`Error::CopyNotLocal`], F2),
//!   host memory mapped with access for the stream's device
//!   ([`Error::CopyNotAccessible`], F2), no dependent ops
//!   ([`Error::CopyDependent`], F3). The flags are always 0 (F5) and the
//!   stream is never the NULL stream (F6): neither can be written.
//!   The builder writes the driver's op list itself and makes these checks
//!   as each op comes, against the memory and endpoint of the op before
//!   (issue 22, `benches/copy_batch.rs`): a put laid out after the last one
//!   on the same memory and endpoint costs seven comparisons (two of them
//!   overflow checks, one the list's room) beside the op it writes, with
//!   the list's end and the cursor's `put_from` in registers (the batch's
//!   `Hot` part, by value; in a loop of puts on one memory and endpoint
//!   the compiler drops the two compares of their identity after the
//!   first put, `hot.rs`); the end of such a run of puts is checked
//!   against the endpoint's bound interval once, when the cursor leaves it
//!   (destination ends only grow), and a run past it is checked op by op
//!   then, naming the first op outside (issue 30). The errors are reported
//!   at enqueue, first the local side's ranges, then the endpoint side's,
//!   then F2, then F3, each naming its op. Blocks at a stride are
//!   one call ([`CopyBatch::put_strided`], [`Strided`], in `strided.rs`),
//!   checked once. The builder's state is recycled: taken from the
//!   process's spare by [`CopyBatch::new`] and given back, emptied, by the
//!   enqueue (`spare`), so that a loop of batches allocates nothing but the
//!   op list the driver takes (issue 30), and keeps the facts of the last
//!   batch's first endpoint, which the next batch whose first endpoint it
//!   is takes where they are, without the range's lock, while nothing they
//!   were read from changed (`memo::Memo`); at
//!   enqueue the usual batch (no
//!   error met, no binding changed since, memory on the stream's device,
//!   F3 proven in one pass, no memory reachable two ways) passes its
//!   checks at a few loads per endpoint and allocation. A batch's usual
//!   first put is checked as it comes and kept as its arguments
//!   (`one.rs`): a batch of that put alone, the usual small message, is
//!   recorded at enqueue without the batch's lists (the one-put lane, on
//!   either path, which a [`Route`]'s put shares); any other builder call
//!   first writes it into the state as the put would have.
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
//! **The portable path (issue 19, item 4; `portable/`, a child module).** On drivers
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
//! (`BatchInner`, the cursor, `EpFacts`), and [`CanGet`]; `hot.rs`: the
//! state's part a loop of builder calls keeps in registers; `check.rs`: the
//! checks as each op comes and at enqueue (ranges, F9, R13.3, F2);
//! `independence.rs`: F3; `enqueue.rs`: `Stream::enqueue` and the fabric
//! call; `one.rs`: the one-put lane; `in_flight.rs`: [`InFlight`] and
//! [`Completed`]; `route.rs`: [`Route`], a put prepared once; `spare.rs`: the
//! process's spare batch state; `strided.rs`:
//! [`Strided`]; `portable/`: the portable path.

use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::driver::{CopyOp, CopyOps, Operand, Pointer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Extent};
use crate::kind::{ImportedUnicast, Kind, Unicast};
use crate::ledger::holds::Keep;
use crate::memory::{CopyMemory, Locality};
use crate::state::{Agreed, IsReady, Sealed, State};
use hot::Hot;

mod check;
mod enqueue;
mod hot;
mod in_flight;
mod independence;
mod memo;
mod one;
mod op_words;
mod portable;
mod route;
pub(crate) mod spare;
mod strided;
pub(crate) use check::{merged, outside_peers};
pub(crate) use enqueue::FabricList;
pub use in_flight::{Completed, InFlight};
pub(crate) use one::fabric_copy_error;
pub(crate) use portable::local_binds;
pub use route::Route;
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
///
/// An op of 0 bytes moves nothing, and its operands are checked all the
/// same (F5): its memory offset inside the memory (not at its end), its
/// endpoint offset inside the endpoint or at its end, bound there or not
/// (an empty range needs no bound byte: F9 as the model reads it;
/// `data_path::f5_a_zero_byte_op_at_the_endpoints_end_goes_through_bound_or_not_and_one_past_it_is_refused`).
///
/// ```
/// use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Report, Spec, Stream};
/// # fn main() -> Result<(), Report> {
/// let (ctx, _model) = Context::model(Default::default());
/// let ep = ctx
///     .reserve_one()?
///     .create(Spec::unicast(0, 2 << 20))?
///     .wait(std::time::Duration::from_secs(1))?;
/// // The endpoint's bytes: memory on its owner, mapped and bound.
/// let owner = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
/// let bound = ep.bind(0, 0, &owner)?;
/// // A source on the stream's device.
/// let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
/// let stream = Stream::new(&ctx, 0)?;
/// // Two puts and a get, checked as they are added and at enqueue.
/// let batch = CopyBatch::new()
///     .put(&src, 0, &ep, 0, 4096)
///     .put(&src, 4096, &ep, 4096, 4096)
///     .get_host(&ep, 8192, 64);
/// let done = stream.enqueue(batch)?.wait()?; // the token borrowed `src` and `ep`
/// assert_eq!(done.received[0].len(), 64);
/// // Built in a loop: each builder call takes the batch and hands it back.
/// let mut batch = CopyBatch::new();
/// for i in 0..256 {
///     batch = batch.put(&src, i * 64, &ep, 16384 + i * 64, 64);
/// }
/// stream.enqueue(batch)?.wait()?;
/// drop(bound);
/// # Ok(())
/// # }
/// ```
#[must_use = "a batch does nothing until `stream.enqueue(batch)`"]
pub struct CopyBatch<'a> {
    /// What every op touches, by value: in a loop of builder calls it
    /// lives in registers, where behind the pointer each op loaded and
    /// stored it again (issue 30). Plain values (no drop, no address taken
    /// by a call): the cold paths park it in `inner` and take it back
    /// ([`CopyBatch::cold`]).
    hot: Hot,
    /// The rest, behind one pointer: the builder moves the batch on every
    /// call, and a moved pointer is a register where the state is ~200
    /// bytes of memory (issue 22: about 160 instructions per op at 1,024
    /// ops). Recycled ([`spare`]): taken from the process's spare by
    /// [`CopyBatch::new`], emptied and given back by the enqueue, so that
    /// a loop of batches allocates no state. (A batch dropped unenqueued
    /// frees it: a `Drop` here kept the builder's `put` from inlining.)
    pub(crate) inner: Box<BatchInner>,
    _borrow: PhantomData<&'a ()>,
}

/// The most ops of room the spare's op list keeps (56 bytes each).
const SPARE_OPS: usize = 4096;

/// The room of a batch's first op list (896 bytes: one small allocation,
/// two reallocations fewer by 64 ops than 4, 8, 16).
const FIRST_ROOM: usize = 16;

/// The most endpoints and allocations of room the spare keeps.
const SPARE_NAMED: usize = 64;

/// An allocation a batch names: the first op naming it, where it is (F2),
/// its context's key and its address range `(address, size)`.
pub(crate) type MemoryNamed = (usize, Locality, usize, (u64, u64));

/// The host buffers of a batch: owned, moved into it (puts) or made by it
/// (gets), and handed back by [`InFlight::wait`].
#[derive(Default)]
pub(crate) struct HostBufs {
    /// [`CopyBatch::put_host`]'s, in order.
    pub(crate) sent: Vec<Vec<u8>>,
    /// [`CopyBatch::get_host`]'s, in order, with the op of each.
    pub(crate) received: Vec<(usize, Vec<u8>)>,
}

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
    /// index of their entry in `keep.endpoints`. A `Vec` kept with its room
    /// by the spare, as `locations`.
    pub(crate) eps: Vec<EpFacts>,
    /// Where each allocation of `keep.memory` is (same index), with
    /// the first op naming it, for F2, and its context's key (memory of
    /// another context is refused): checked once per allocation.
    /// And its address range `(address, size)`, for F3 through an
    /// endpoint's own bound memory.
    locations: Vec<MemoryNamed>,
    /// Its host buffers; `None` for a batch without host ops (most), so
    /// that the state and its token move one word for them, not six.
    pub(crate) host: Option<Box<HostBufs>>,
    /// The first error a builder call met on the local side (memory range,
    /// host buffer).
    error: Option<Box<Error>>,
    /// The first error of an endpoint side (its range, F9), reported after
    /// `error`, as the checks always were.
    ep_error: Option<Box<Error>>,
    /// Parked here by the cold paths ([`CopyBatch::cold`]); the builder's
    /// fast paths read and write the copy in [`CopyBatch::hot`].
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
    /// What the facts of the last batch's first endpoint (`eps[0]`, kept
    /// by the spare) were made of: the next batch whose first endpoint is
    /// that one, unchanged, takes them where they are rather than reading
    /// them under the range's lock ([`memo::Memo`]). `None`: `eps` holds
    /// nothing between batches. Inline, not boxed: a batch whose first
    /// endpoint is not the last one's makes a new memo, and batches that
    /// alternate between two endpoints would allocate one each.
    memo: Option<memo::Memo>,
    /// The batch's first put, checked, while it is kept as its arguments
    /// and not yet written into the state (the one-put lane, `one.rs`):
    /// every path but the lane's enqueue materializes it first
    /// ([`CopyBatch::cold`], [`CopyBatch::parked`]).
    pending: Option<one::Deferred>,
}

/// What the last op named, so that the next op on the same memory and
/// endpoint is checked against it alone.
#[derive(Clone, Copy)]
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
    /// Its index in [`BatchInner::eps`].
    ep_index: usize,
    /// `[start, end)`: bound on every device of that endpoint in this
    /// process (F9) and inside it: an op inside passes both checks.
    start: u64,
    end: u64,
    /// The least offset a put to that endpoint may start at to come after
    /// the last put (F3's order) and at or after `start`: the end of the
    /// last put, which was to this endpoint; `u64::MAX` when the last put
    /// was elsewhere (the slow path decides: [`Hot::put`] takes no put
    /// that ends at `u64::MAX`, so not one of 0 bytes there either).
    put_from: u64,
    /// Whether the last put was to this endpoint, through the cursor: its
    /// end is `put_from`, not yet in `put_last`.
    putting: bool,
    /// The first op of the puts through the cursor. A put's end is checked
    /// against `end` once, when the cursor leaves the endpoint (or at
    /// enqueue), not per op: the ends of the puts through the cursor only
    /// grow (F3's order), so `put_from <= end` proves every one inside, and
    /// otherwise the puts from `run` on are checked one by one
    /// ([`BatchInner::check_run`]), naming the first outside.
    run: usize,
}

impl Cursor {
    const NONE: Cursor = Cursor {
        mem: 0,
        mem_ptr: 0,
        mem_size: 0,
        ep: u64::MAX,
        ep_at: 0,
        ep_index: 0,
        start: 0,
        end: 0,
        put_from: u64::MAX,
        putting: false,
        run: 0,
    };

    /// Its fields that say it names a memory or an endpoint, as in
    /// [`Cursor::NONE`]: the rest are read only once these name something,
    /// and are written then.
    #[inline(always)]
    fn names(&self) -> (usize, usize, u64, u64, bool) {
        (self.mem, self.ep_at, self.ep, self.put_from, self.putting)
    }
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
    /// The range's bindings generation `covered` and `agreed` were read
    /// at: a bind or unbind here, a heap's new top or an agreement on what
    /// peers bound since makes them stale.
    bindings_gen: u64,
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
    /// Where a put inside its first covered interval lands on the portable
    /// path, read with `covered` (`portable/local.rs`).
    local: Option<portable::LocalWindow>,
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
            eps: Vec::new(),
            locations: Vec::new(),
            host: None,
            error: None,
            ep_error: None,
            cursor: Cursor::NONE,
            put_last: None,
            get_end: 0,
            unordered: false,
            puts: false,
            gets: false,
            memo: None,
            pending: None,
        }
    }

    /// What a copy whose driver call unwound leaves (the driver may have
    /// taken it): what it keeps goes in flight with `stream`, until that is
    /// synchronized, and its host buffers are leaked, never freed under a
    /// copy (F4).
    pub(crate) fn leave_in_flight(
        &mut self,
        stream: &std::sync::Arc<crate::ledger::holds::StreamInner>,
    ) {
        stream.record(std::mem::take(&mut self.keep));
        std::mem::forget(self.host.take());
    }

    /// The op list as the driver takes it. A few ops are copied into the
    /// driver's list, inline, and the batch's own keeps its room for the
    /// next batch (the spare): a loop of small batches allocates nothing.
    /// Past [`CopyOps::INLINE`] the list goes itself, its buffer with it.
    /// (The builder's list stays a `Vec`: it writes through pointers into
    /// its buffer, which must not move with the batch, as inline room would.)
    #[inline]
    pub(crate) fn take_list(&mut self) -> CopyOps {
        if let [op] = self.list[..] {
            // The usual small batch, without `collect`'s copy of a slice
            // (a call to `memcpy` for one op): a one-op batch 1,096 -> 1,026
            // instructions (`benches/copy_batch.rs`, `Null`).
            let mut ops = CopyOps::new();
            ops.push(op);
            self.list.clear();
            return ops;
        }
        if self.list.len() <= CopyOps::INLINE {
            let ops = self.list.iter().copied().collect();
            self.list.clear();
            return ops;
        }
        // Its buffer goes with it; the next batch's room is made now (its
        // first cold push would make it anyway), so that the spare always
        // has some: a loop of one-op batches after a long batch allocates
        // nothing. As much room as this batch took (up to the spare's most):
        // a loop of long batches allocates once per batch, as a list built
        // by hand does, not once per doubling with a copy of the ops each
        // time (1,024 puts 31,935 -> 29,930 instructions, 64 puts 3,827 ->
        // 3,040: `benches/copy_batch.rs`, `Null`).
        let room = self.list.len().clamp(FIRST_ROOM, SPARE_OPS);
        CopyOps::from(std::mem::replace(&mut self.list, Vec::with_capacity(room)))
    }

    /// Back to [`BatchInner::empty`], in place: what it holds is dropped,
    /// the op list keeps its room (an enqueued batch's list of more than
    /// [`CopyOps::INLINE`] ops went to the driver, with new room left).
    fn reset(&mut self) {
        // The portable path gives its op list back with its room; a list
        // past a few thousand ops is not kept for the process's life.
        if self.list.capacity() > SPARE_OPS {
            self.list = Vec::new();
        }
        // Plain values: nothing to drop.
        self.list.clear();
        // Each cleared only when it holds something: an enqueued batch's
        // `keep` and host buffers went with it, and an empty `SmallVec`'s
        // clear still asks where its items are (a one-op batch's reset was
        // 126 instructions, `benches/copy_batch.rs`; the tests on the
        // `Vec`s below save 13 more, measured at `e4336a3`).
        if !self.keep.memory.is_empty() {
            self.keep.memory.clear();
        }
        if !self.keep.endpoints.is_empty() {
            self.keep.endpoints.clear();
        }
        // Kept with their room, as the op list (a `SmallVec` here cost a
        // one-op batch 59 instructions more: each access asks where its
        // items are); the room of a batch of many endpoints is not.
        if self.eps.capacity() > SPARE_NAMED || self.locations.capacity() > SPARE_NAMED {
            self.eps = Vec::new();
            self.locations = Vec::new();
            self.memo = None;
        }
        // The first endpoint's facts stay for the next batch when the memo
        // says what they were made of (`memo::Memo`); the rest go.
        if self.memo.is_none() {
            if !self.eps.is_empty() {
                self.eps.clear();
            }
        } else if self.eps.len() > 1 {
            self.eps.truncate(1);
        }
        if !self.locations.is_empty() {
            self.locations.clear();
        }
        if self.host.is_some() {
            self.host = None;
        }
        if self.error.is_some() || self.ep_error.is_some() {
            self.error = None;
            self.ep_error = None;
        }
        self.pending = None;
        self.cursor = Cursor::NONE;
        self.put_last = None;
        self.get_end = 0;
        self.unordered = false;
        self.puts = false;
        self.gets = false;
    }
}

impl BatchInner {
    /// Whether the state is as [`BatchInner::reset`] leaves it (the spare's
    /// test of a state given back without one).
    fn is_reset(&self) -> bool {
        let c = &self.cursor;
        self.list.is_empty()
            && self.list.capacity() <= SPARE_OPS
            && self.keep.memory.is_empty()
            && self.keep.endpoints.is_empty()
            && self.eps.len() <= usize::from(self.memo.is_some())
            && self.eps.capacity() <= SPARE_NAMED
            && self.locations.is_empty()
            && self.locations.capacity() <= SPARE_NAMED
            && self.host.is_none()
            && self.error.is_none()
            && self.ep_error.is_none()
            && c.names() == Cursor::NONE.names()
            && self.put_last.is_none()
            && self.get_end == 0
            && !(self.unordered || self.puts || self.gets)
            && self.pending.is_none()
    }
}

impl std::fmt::Debug for CopyBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyBatch")
            .field("ops", &self.len())
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
    // Always: a batch returned by a call would live in memory (see `cold`).
    #[inline(always)]
    pub fn new() -> Self {
        CopyBatch::of(spare::take())
    }

    /// The batch of a state whose hot part is parked.
    #[inline(always)]
    pub(crate) fn of(mut inner: Box<BatchInner>) -> Self {
        CopyBatch {
            hot: Hot::of(&mut inner),
            inner,
            _borrow: PhantomData,
        }
    }

    /// The state, its hot part parked in it and a deferred first put
    /// materialized: what the portable path and a capture read.
    #[inline(always)]
    pub(crate) fn parked(self) -> Box<BatchInner> {
        let CopyBatch { hot, mut inner, .. } = self;
        hot.park(&mut inner);
        inner.materialize();
        inner
    }

    /// Runs `f`, a cold part of the builder, on the state with the hot part
    /// parked in it, and takes the hot part back: no call ever sees the
    /// batch's own address, so in a loop of builder calls it stays in
    /// registers.
    #[inline(always)]
    fn cold<R>(&mut self, f: impl FnOnce(&mut BatchInner) -> R) -> R {
        self.hot.park(&mut self.inner);
        self.inner.materialize();
        let r = f(&mut self.inner);
        self.hot = Hot::of(&mut self.inner);
        r
    }

    /// A deferred first put written into the state (`one.rs`: its
    /// keep-alives and location, the cursor, F3's state, the op): for what
    /// reads the state directly (a capture enters the gate of the ranges in
    /// its list).
    pub(crate) fn materialize(&mut self) {
        self.cold(|_| ());
    }

    /// Puts `size` bytes of `src` from `src_offset` into `ep` at `offset`
    /// (unicast: the owner's bound memory; multicast: every member's).
    /// `src` is memory mapped in this process: an
    /// [`Allocation`](crate::Allocation) after
    /// [`map`](crate::Allocation::map)`(&[dev])`, by reference
    /// ([`CopyMemory`](crate::bounds::CopyMemory): `&mapped`, or a
    /// reference to an `Arc`, a `Box` or an `Rc` of one). On the portable path
    /// (drivers before 13.5) the memory bound to `ep` must be mapped too:
    /// it is what the copy writes ([`Error::CopyNoWindow`](crate::Error::CopyNoWindow)
    /// otherwise).
    // Always: the fast path is a few comparisons and a write, and only
    // inlined does the batch stay in registers across a loop of puts.
    #[inline(always)]
    pub fn put<M: CopyMemory<'a>, S, K: Kind>(
        mut self,
        src: M,
        src_offset: u64,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        size: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
    {
        let src = src.mapped();
        if !self
            .hot
            .put(&self.inner.cursor, src, src_offset, ep, offset, size)
        {
            self.cold(|inner| inner.put_first(src, src_offset, ep, offset, size));
            self.hot.named(
                std::ptr::from_ref(src).addr(),
                std::ptr::from_ref(ep).addr(),
            );
        }
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
        self.cold(|inner| inner.put_host(bytes, ep, offset));
        self
    }

    /// Gets `size` bytes of the unicast endpoint `ep` at `offset` into
    /// `dst` at `dst_offset`. Not for multicast endpoints (F1): see [`CanGet`].
    /// `dst` is memory mapped in this process, by reference, as `put`'s
    /// `src` ([`CopyMemory`](crate::bounds::CopyMemory)).
    // Always, as `put`.
    #[inline(always)]
    pub fn get<M: CopyMemory<'a>, S, K>(
        mut self,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        dst: M,
        dst_offset: u64,
        size: u64,
    ) -> Self
    where
        S: State + IsReady + Agreed,
        K: CanGet,
    {
        let dst = dst.mapped();
        let fast = self
            .hot
            .get_next(&self.inner.cursor, ep, offset, dst, dst_offset, size);
        let pushed = fast.is_some_and(|to| {
            self.hot
                .push(get_op(ep.id(), offset, Pointer::device(to), size))
        });
        match fast {
            Some(to) if pushed => {
                // As they were (`Hot::put`).
                self.hot.mem = std::ptr::from_ref(dst).addr();
                self.hot.ep_at = std::ptr::from_ref(ep).addr();
                let inner = &mut *self.inner;
                inner.gets = true;
                // F3's order of the destination addresses.
                inner.unordered |= to < inner.get_end;
                inner.get_end = to.saturating_add(size);
            }
            _ => {
                self.cold(|inner| inner.get_slow(ep, offset, dst, dst_offset, size));
                self.hot.named(
                    std::ptr::from_ref(dst).addr(),
                    std::ptr::from_ref(ep).addr(),
                );
            }
        }
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
        self.cold(|inner| inner.get_host(ep, offset, size));
        self
    }

    /// How many ops the batch has.
    pub fn len(&self) -> usize {
        // A deferred first put (`one.rs`) is not in the list yet.
        self.hot.len(&self.inner) + usize::from(self.inner.pending.is_some())
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The driver's op of a put from the device address `from`.
#[inline(always)]
fn put_op(from: u64, id: u32, offset: u64, size: u64) -> CopyOp {
    CopyOp {
        src: Operand::Pointer(Pointer::device(from)),
        dst: Operand::LogicalEndpoint { id, offset },
        size,
    }
}

/// The driver's op of a get into `to`.
#[inline(always)]
fn get_op(id: u32, offset: u64, to: Pointer, size: u64) -> CopyOp {
    CopyOp {
        src: Operand::LogicalEndpoint { id, offset },
        dst: Operand::Pointer(to),
        size,
    }
}

impl BatchInner {
    /// Appends `op` (the cold paths), making room when there is none: 16
    /// ops for the first (896 bytes, one small allocation) rather than 4,
    /// 8, 16: two reallocations fewer by 64 ops. Made new rather than
    /// `reserve`d: the growth path costs ~90 instructions more per batch.
    #[inline]
    fn push(&mut self, op: CopyOp) {
        if self.list.capacity() == 0 {
            self.list = Vec::with_capacity(FIRST_ROOM);
        }
        self.list.push(op);
    }

    /// [`CopyBatch::put_host`].
    #[inline(never)]
    fn put_host<S: State, K: Kind>(&mut self, bytes: Vec<u8>, ep: &Endpoint<S, K>, offset: u64) {
        let op = self.list.len();
        let size = bytes.len() as u64;
        // The buffer's heap address: moving the `Vec` does not move it.
        // Exposed: the driver boundary carries an integer, which the model
        // (and libcuda) turn back into a pointer to read the bytes.
        let from = bytes.as_ptr().expose_provenance() as u64;
        self.host.get_or_insert_default().sent.push(bytes);
        self.put_to(ep, offset, size, op);
        self.push(CopyOp {
            src: Operand::Pointer(Pointer::host(from)),
            dst: Operand::LogicalEndpoint {
                id: ep.id(),
                offset,
            },
            size,
        });
    }

    /// [`CopyBatch::get_host`].
    #[inline(never)]
    fn get_host<S: State, K: Kind>(&mut self, ep: &Endpoint<S, K>, offset: u64, size: u64) {
        let op = self.list.len();
        self.get_from(ep, offset, size, op);
        // A size past the endpoint is refused at enqueue (F9): no buffer of
        // that size is allocated for it here. Nor for a batch already
        // refused (bytes not bound here, F9): a get over unbound bytes of a
        // large endpoint must be an error, not an allocation that aborts.
        let inside = offset.checked_add(size).is_some_and(|end| end <= ep.size());
        let refused = self.error.is_some() || self.ep_error.is_some();
        let mut buf = match usize::try_from(size) {
            Ok(_) if !inside || refused => Vec::new(),
            Ok(len) => host_buffer(len).unwrap_or_else(|| {
                self.error
                    .get_or_insert_with(|| Box::new(Error::CopyHostBufferUnavailable { op, size }));
                Vec::new()
            }),
            Err(_) => {
                self.error.get_or_insert_with(|| {
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
        self.host.get_or_insert_default().received.push((op, buf));
        self.push(get_op(ep.id(), offset, Pointer::host(to), size));
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

//! Streams and the data path on the model: `cuStream*`,
//! `cuFabricCpyBatchAsync` (SPEC F1–F9, R13.1, R13.3), `cuMemcpyAsync` and
//! `cuMemcpyBatchAsync` (12.8+: its copies checked as `cuMemcpyAsync`'s,
//! none dependent on another, all before any is enqueued).
//!
//! What this file owns:
//! - the streams of every process (`World::streams`), each a queue of
//!   enqueued work; work runs only when the stream *reaches* it: at
//!   `cuStreamSynchronize`, at `cuStreamDestroy` (enqueued work still
//!   completes), or one batch per `cuStreamQuery` (the point in between:
//!   a query runs the oldest pending batch and reports done only once the
//!   queue is empty). A read of a destination before that sees the old bytes.
//! - the rules checked at enqueue, each logged as a violation with its
//!   rule: F1 (operand kinds), F2 (pointers local to the stream's device or
//!   host), F3 (no dependent ops in one batch), F5 (flags 0; size 0 still
//!   validated), F6 (no NULL stream), F9 (an endpoint range that is partly
//!   bound must be covered on every target device), R13.1 (the id was
//!   reported ready), F7 (no symbol before 13.5: `NOT_SUPPORTED`, no
//!   violation);
//! - the rules only the moment the stream reaches an op can see, logged
//!   then (the synchronize or query that ran it answers
//!   `CUDA_ERROR_ILLEGAL_ADDRESS`, as an asynchronous fault): R13.3 (the
//!   target had nothing bound yet: the peer had not bound, or the program
//!   did not wait for it), F4 (an operand unmapped, unbound or its endpoint
//!   destroyed while the op was in flight).
//!
//! Bytes: a unicast put writes the owner's memory bound at that endpoint
//! offset, a multicast put every member's bound memory (every process, every
//! node), a get reads the owner's. Host memory (a pointer hinted
//! `MemHint::Host` that is no mapping of the process) is read and written
//! through its address in this OS process — the row's contract makes the
//! caller vouch for it — unless the caller is another OS process (the model
//! fabric's `Remote` client): then the source bytes were snapshotted at
//! enqueue ([`Staged`]) and the bytes for a host destination wait in the
//! stream's outbox until the synchronize or query that completed them
//! hands them back ([`World::take_host_writes`]).

use std::collections::{HashMap, VecDeque};

use super::state::World;
use super::violate;
use crate::driver::{
    Code, CopyOp, Device, DriverResult, FABRIC_COPY_MIN_VERSION, Location,
    MEMCPY_BATCH_MIN_VERSION, MemHint, MemcpyOp, Operand, Pointer, Shape,
};

/// Host source bytes of a batch enqueued by another OS process: one entry
/// per op, `Some(bytes)` for each op whose source is host memory.
pub(crate) type Staged = Vec<Option<Vec<u8>>>;

/// Bytes to write to host memory of a remote client: `(address, bytes)`.
pub(crate) type HostWrites = Vec<(u64, Vec<u8>)>;

/// The most ops of one batch a remote client sends (`fabric::wire::MAX_BATCH_OPS`).
pub(crate) const MAX_REMOTE_BATCH_OPS: usize = 16_384;

/// What each host-destination write of a remote client costs on the wire
/// besides its bytes: its address and length (postcard varints, at most
/// 10 + 3 bytes).
pub(crate) const HOST_WRITE_OVERHEAD: u64 = 16;

/// The most a remote client's stream may have in flight for host
/// destinations, counted as it travels back in one reply frame: each op's
/// bytes plus [`HOST_WRITE_OVERHEAD`]. Room for one batch of
/// [`MAX_REMOTE_BATCH_OPS`] ops with 1 MiB of bytes; beyond it an enqueue is
/// `OUT_OF_MEMORY` (model's choice) until a synchronize hands bytes back.
pub(crate) const MAX_REMOTE_HOST_BYTES: u64 =
    (1 << 20) + HOST_WRITE_OVERHEAD * MAX_REMOTE_BATCH_OPS as u64;

/// What a host-destination op of `size` bytes of a remote client counts
/// against [`MAX_REMOTE_HOST_BYTES`] (an empty op writes nothing back).
pub(crate) fn host_write_charge(size: u64) -> u64 {
    if size == 0 {
        0
    } else {
        size.saturating_add(HOST_WRITE_OVERHEAD)
    }
}

/// Where an op reads.
#[derive(Clone, Debug)]
enum Src {
    /// A mapping of the process.
    Mapped(u64),
    /// Host memory of this OS process, read when the stream reaches the op.
    HostRaw(u64),
    /// Host bytes a remote client snapshotted at enqueue.
    HostBytes(Vec<u8>),
    /// An endpoint (unicast: the owner's bound memory).
    Ep { id: u32, offset: u64, covered: bool },
}

/// Where an op writes.
#[derive(Clone, Copy, Debug)]
enum Dst {
    Mapped(u64),
    HostRaw(u64),
    /// Host memory of a remote client: the bytes go to the outbox.
    HostRemote(u64),
    Ep {
        id: u32,
        offset: u64,
        covered: bool,
    },
}

#[derive(Clone, Debug)]
struct Exec {
    src: Src,
    dst: Dst,
    size: u64,
}

/// Work recorded by a capturing stream (F8): not run, replayed by
/// `cuGraphLaunch` with the host bytes it was captured with.
#[derive(Clone, Debug)]
enum Captured {
    Batch {
        ops: Vec<CopyOp>,
        flags: u64,
        staged: Option<Staged>,
    },
    Memcpy {
        dst: Pointer,
        src: Pointer,
        size: u64,
        staged: Option<Staged>,
    },
}

/// A graph or an executable graph of one process: what was captured.
#[derive(Debug)]
struct GraphObj {
    pid: usize,
    items: Vec<Captured>,
}

/// An event of one process on one device: where it was last recorded, as
/// `(stream, batches enqueued on it before the record)`.
#[derive(Debug)]
struct EventObj {
    pid: usize,
    dev: Device,
    at: Option<(u64, u64)>,
}

/// One stream of one process.
#[derive(Debug)]
pub(crate) struct StreamObj {
    pid: usize,
    dev: Device,
    /// Work recorded since `cuStreamBeginCapture`, if capturing.
    capturing: Option<Vec<Captured>>,
    /// Batches ever enqueued, and ever reached (run): an event recorded
    /// after `n` batches completes once `ran >= n`.
    enqueued: u64,
    ran: u64,
    /// Enqueued work, oldest first: one entry per batch (or memcpy).
    queue: VecDeque<Vec<Exec>>,
    /// Host-destination bytes for a remote client, completed but not yet
    /// handed back.
    outbox: HostWrites,
    /// What the host-destination ops enqueued for `outbox` and not yet
    /// handed back count against [`MAX_REMOTE_HOST_BYTES`] ([`host_write_charge`]).
    outbox_pending: u64,
    /// An asynchronous fault of work the stream ran, reported by the next
    /// synchronize or query.
    fault: Option<Code>,
}

/// The streams of the world (a field of [`World`]).
#[derive(Debug, Default)]
pub(crate) struct Streams {
    by_handle: HashMap<u64, StreamObj>,
    graphs: HashMap<u64, GraphObj>,
    execs: HashMap<u64, GraphObj>,
    events: HashMap<u64, EventObj>,
    next: u64,
}

impl Streams {
    /// Forgets every stream, graph and event of `pid` (it exited: R12.2),
    /// with its work.
    pub(crate) fn drop_process(&mut self, pid: usize) {
        self.by_handle.retain(|_, s| s.pid != pid);
        self.graphs.retain(|_, g| g.pid != pid);
        self.execs.retain(|_, g| g.pid != pid);
        self.events.retain(|_, e| e.pid != pid);
    }

    /// The streams, events, graphs and executable graphs `pid` holds
    /// (its [`super::Live`] counters).
    pub(crate) fn held_by(&self, pid: usize) -> (u64, u64, u64, u64) {
        (
            self.by_handle.values().filter(|s| s.pid == pid).count() as u64,
            self.events.values().filter(|e| e.pid == pid).count() as u64,
            self.graphs.values().filter(|g| g.pid == pid).count() as u64,
            self.execs.values().filter(|g| g.pid == pid).count() as u64,
        )
    }

    /// A new handle in the space `tag` (streams 5, graphs 6, executable
    /// graphs 7, events 8), never 0, and none still held: the counter comes
    /// back after 2^32 handles, and a stream of another process stays its
    /// own.
    fn handle(&mut self, tag: u64) -> u64 {
        loop {
            self.next = self.next.wrapping_add(1);
            let h = (tag << 32) | (self.next & 0xFFFF_FFFF);
            let held = match tag {
                5 => self.by_handle.contains_key(&h),
                6 => self.graphs.contains_key(&h),
                7 => self.execs.contains_key(&h),
                _ => self.events.contains_key(&h),
            };
            if !held {
                return h;
            }
        }
    }
}

/// A pointer range as the model sees it.
enum Place {
    /// A mapping of the process; `local`: on the stream's device or host-NUMA memory.
    Mapped { local: bool },
    /// Host memory (hinted `Host`, no mapping).
    Host,
    /// Neither: nothing the model may touch.
    Unknown,
}

/// The range an op reads or writes, in a space where overlap means dependence (F3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Space {
    Addr,
    Ep(u32),
}

/// One side of one op for F3: `(op, (space, start, end), is the destination)`.
type Span = (usize, (Space, u64, u64), bool);

/// Among the spans swept so far in one space, the one reaching furthest
/// and the one reaching furthest of another op than that one's:
/// `(end, op)` each.
#[derive(Clone, Copy, Default)]
struct Reach(Option<(u64, usize)>, Option<(u64, usize)>);

impl Reach {
    fn add(&mut self, end: u64, op: usize) {
        match self.0 {
            None => self.0 = Some((end, op)),
            Some((e, o)) if o == op => self.0 = Some((e.max(end), o)),
            Some((e, _)) if end > e => {
                // The old furthest is of another op than the new one, and
                // reaches further than any other: it is the runner-up.
                self.1 = self.0;
                self.0 = Some((end, op));
            }
            Some(_) => {
                if self.1.is_none_or(|(e, _)| end > e) {
                    self.1 = Some((end, op));
                }
            }
        }
    }

    /// Whether a span of another op than `op` reaches past `start`.
    fn past(&self, start: u64, op: usize) -> bool {
        match (self.0, self.1) {
            (Some((e, o)), _) if o != op => e > start,
            (_, Some((e, _))) => e > start,
            _ => false,
        }
    }
}

/// F3: whether one op's destination overlaps another op's source or
/// destination in the same space. `spans`: both sides of every op of
/// non-zero size. One sort and one sweep, O(n log n): the check runs under
/// the world's lock, where comparing every pair of a legal 16,384-op batch
/// stalled every process of a fabric for seconds.
///
/// Sorted by (space, start), a span overlaps an earlier one exactly when
/// that one reaches past its start (ranges are non-empty, or `(MAX, MAX)`,
/// which overlaps nothing and nothing reaches past).
fn dependent(spans: &mut [Span]) -> bool {
    spans.sort_unstable_by_key(|&(_, (space, start, _), _)| (space, start));
    let mut space = None;
    // Every earlier span of the space, and its destinations only.
    let (mut any, mut dsts) = (Reach::default(), Reach::default());
    for &(op, (sp, start, end), dst) in spans.iter() {
        if space != Some(sp) {
            space = Some(sp);
            (any, dsts) = (Reach::default(), Reach::default());
        }
        // A destination depends on any other op's side; a source only on
        // another op's destination.
        let earlier = if dst { &any } else { &dsts };
        if earlier.past(start, op) {
            return true;
        }
        any.add(end, op);
        if dst {
            dsts.add(end, op);
        }
    }
    false
}

/// The bound pieces `(alloc, offset in it, len)` of a range on each target
/// device of an endpoint: `None` for a target with nothing bound at all,
/// `Some(None)` for one bound only in part.
type Pieces = Vec<Option<Option<Vec<(u64, u64, u64)>>>>;

/// The memory bound on one target device of an endpoint, ready for
/// lookups: its bindings `(offset, end, alloc, offset in alloc)` sorted by
/// offset (stable: among equal offsets, in bind order), and for each the
/// furthest end among it and those before it.
#[derive(Debug, Default)]
struct Target {
    bound: Vec<(u64, u64, u64, u64)>,
    reach: Vec<u64>,
}

impl Target {
    fn new(mut bound: Vec<(u64, u64, u64, u64)>) -> Target {
        bound.sort_by_key(|b| b.0);
        let reach = bound
            .iter()
            .scan(0u64, |r, b| {
                *r = (*r).max(b.1);
                Some(*r)
            })
            .collect();
        Target { bound, reach }
    }

    /// The first binding in order that covers `at`: among those starting
    /// at or below `at`, the first whose end is past it, which is where the
    /// furthest end so far first passes `at`. O(log n).
    fn covering(&self, at: u64) -> Option<&(u64, u64, u64, u64)> {
        let started = self.bound.partition_point(|b| b.0 <= at);
        let first = self.reach.partition_point(|&r| r <= at);
        (first < started).then(|| &self.bound[first])
    }

    /// The pieces of `[offset, end)`, or `None` where a part is not bound.
    fn pieces(&self, offset: u64, end: u64) -> Option<Vec<(u64, u64, u64)>> {
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < end {
            let &(b_off, b_end, alloc, mem_offset) = self.covering(at)?;
            let stop = end.min(b_end);
            pieces.push((alloc, mem_offset + (at - b_off), stop - at));
            at = stop;
        }
        Some(pieces)
    }
}

/// The targets of one endpoint object (the owner, or every member), each
/// `None` when nothing is bound on it: made once per object for a batch,
/// so that checking or running n ops costs n lookups, not n passes over
/// every binding (under the world's lock, where an endpoint of many
/// bindings would stall every process of a fabric).
#[derive(Debug, Default)]
struct Cover(Vec<Option<Target>>);

impl Cover {
    fn pieces(&self, offset: u64, size: u64) -> Pieces {
        let end = offset.saturating_add(size);
        self.0
            .iter()
            .map(|t| t.as_ref().map(|t| t.pieces(offset, end)))
            .collect()
    }
}

/// The covers of the endpoint objects one batch touches, by object.
type Covers = HashMap<u64, Cover>;

impl World {
    fn stream_of(&mut self, pid: usize, stream: u64) -> DriverResult<()> {
        if stream == 0 {
            return violate(self, "F6", Code::INVALID_VALUE);
        }
        match self.streams.by_handle.get(&stream) {
            Some(s) if s.pid == pid => Ok(()),
            _ => violate(self, "cuStream handle", Code::INVALID_HANDLE),
        }
    }

    pub fn stream_create(&mut self, pid: usize, dev: Device) -> DriverResult<u64> {
        if self.device(dev).is_none() {
            return Err(Code::INVALID_DEVICE);
        }
        // Stream handles live apart from allocation handles, never 0 (F6).
        let h = self.streams.handle(5);
        self.streams.by_handle.insert(
            h,
            StreamObj {
                pid,
                dev,
                capturing: None,
                enqueued: 0,
                ran: 0,
                queue: VecDeque::new(),
                outbox: Vec::new(),
                outbox_pending: 0,
                fault: None,
            },
        );
        Ok(h)
    }

    /// Enqueued work still completes (as `cuStreamDestroy` documents); a
    /// remote client's host-destination bytes are then lost: the typed
    /// `Stream` synchronizes before it destroys.
    pub fn stream_destroy(&mut self, pid: usize, stream: u64) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        let _ = self.run_stream(stream, usize::MAX);
        self.streams.by_handle.remove(&stream);
        Ok(())
    }

    pub fn stream_synchronize(&mut self, pid: usize, stream: u64) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        self.not_capturing(stream)?;
        self.run_stream(stream, usize::MAX)
    }

    pub fn stream_query(&mut self, pid: usize, stream: u64) -> DriverResult<bool> {
        self.stream_of(pid, stream)?;
        self.not_capturing(stream)?;
        self.run_stream(stream, 1)?;
        Ok(self
            .streams
            .by_handle
            .get(&stream)
            .is_none_or(|s| s.queue.is_empty()))
    }

    /// The host-destination bytes of a remote client's stream that its work
    /// completed, to be written by the client.
    #[cfg(feature = "fabric")]
    pub fn take_host_writes(&mut self, stream: u64) -> HostWrites {
        match self.streams.by_handle.get_mut(&stream) {
            Some(s) => {
                let out = std::mem::take(&mut s.outbox);
                let n: u64 = out
                    .iter()
                    .map(|(_, b)| host_write_charge(b.len() as u64))
                    .sum();
                s.outbox_pending = s.outbox_pending.saturating_sub(n);
                out
            }
            None => Vec::new(),
        }
    }

    /// Runs at most `batches` pending batches of `stream`; reports (and
    /// clears) the first asynchronous fault.
    fn run_stream(&mut self, stream: u64, batches: usize) -> DriverResult<()> {
        for _ in 0..batches {
            let Some((pid, batch)) = self.streams.by_handle.get_mut(&stream).and_then(|s| {
                let b = s.queue.pop_front()?;
                s.ran = s.ran.saturating_add(1);
                Some((s.pid, b))
            }) else {
                break;
            };
            // Nothing binds or unbinds while the stream runs a batch.
            let mut covers = Covers::new();
            for op in batch {
                // A remote host destination's charge, returned if the op
                // faults and writes nothing back.
                let charge = match op.dst {
                    Dst::HostRemote(_) => host_write_charge(op.size),
                    _ => 0,
                };
                if let Err(code) = self.execute(pid, stream, op, &mut covers)
                    && let Some(s) = self.streams.by_handle.get_mut(&stream)
                {
                    s.fault.get_or_insert(code);
                    s.outbox_pending = s.outbox_pending.saturating_sub(charge);
                }
            }
        }
        match self
            .streams
            .by_handle
            .get_mut(&stream)
            .and_then(|s| s.fault.take())
        {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// Where `[ptr, ptr+size)` lives for a stream on `dev` of this node.
    fn place(&self, pid: usize, p: Pointer, size: u64, dev: Device) -> Place {
        if let Some((alloc, _)) = self.resolve_addr(pid, p.ptr, size.max(1)) {
            let node = self.node;
            let local = self.allocs.get(&alloc).is_some_and(|a| {
                a.node == node
                    && match a.location {
                        Location::Device(d) => d == dev,
                        Location::HostNuma(_) => true,
                    }
            });
            return Place::Mapped { local };
        }
        if p.hint == MemHint::Host {
            Place::Host
        } else {
            Place::Unknown
        }
    }

    /// The memory bound on each target device of endpoint object `o`: the
    /// owner (unicast) or every member (multicast); none for an object
    /// that is gone.
    fn cover(&self, o: u64) -> Cover {
        let Some(obj) = self.objects.get(&o) else {
            return Cover::default();
        };
        let members: Vec<(usize, Device)> = match obj.props.shape {
            Shape::Unicast { owner } => vec![(obj.node, owner)],
            Shape::Multicast { .. } => obj.enrolled.iter().map(|e| (e.node, e.dev)).collect(),
        };
        Cover(
            members
                .into_iter()
                .map(|(node, dev)| {
                    let mine: Vec<_> = obj
                        .bindings
                        .iter()
                        .filter(|b| {
                            b.dev == dev && self.procs.get(b.pid).is_some_and(|p| p.node == node)
                        })
                        .map(|b| {
                            (
                                b.offset,
                                b.offset.saturating_add(b.size),
                                b.alloc,
                                b.mem_offset,
                            )
                        })
                        .collect();
                    (!mine.is_empty()).then(|| Target::new(mine))
                })
                .collect(),
        )
    }

    /// The bound pieces `(alloc, offset in it, len)` of `[offset,
    /// offset+size)` of endpoint object `o` on each target device (see
    /// [`Pieces`]), through the batch's `covers`.
    fn targets(&self, covers: &mut Covers, o: u64, offset: u64, size: u64) -> Pieces {
        covers
            .entry(o)
            .or_insert_with(|| self.cover(o))
            .pieces(offset, size)
    }

    /// The endpoint object on `id` of `pid`, reported ready (R13.1).
    fn ready_endpoint(&mut self, pid: usize, id: u32) -> DriverResult<u64> {
        match self.procs.get(pid).and_then(|p| p.ids.get(&id)) {
            Some(s) if s.reported_ready => s
                .obj
                .map_or_else(|| violate(self, "R13.1", Code::INVALID_VALUE), Ok),
            _ => violate(self, "R13.1", Code::INVALID_VALUE),
        }
    }

    /// An endpoint operand at enqueue: ready (R13.1), inside the endpoint
    /// and, on every target with anything bound, inside bound memory (F9).
    /// Returns whether every target is fully covered now.
    fn check_endpoint(
        &mut self,
        pid: usize,
        id: u32,
        offset: u64,
        size: u64,
        covers: &mut Covers,
    ) -> DriverResult<(u64, bool)> {
        let o = self.ready_endpoint(pid, id)?;
        let ep_size = self.objects.get(&o).map_or(0, |obj| obj.props.size);
        if offset.checked_add(size).is_none_or(|e| e > ep_size) {
            return violate(self, "F9", Code::INVALID_VALUE);
        }
        let targets = self.targets(covers, o, offset, size);
        if targets.iter().any(|t| matches!(t, Some(None))) {
            return violate(self, "F9", Code::INVALID_VALUE);
        }
        Ok((o, targets.iter().all(Option::is_some)))
    }

    /// `cuFabricCpyBatchAsync` (F1-F9). `staged`: the host source bytes of a
    /// remote client (`None` in process: host memory is read through its address).
    pub fn fabric_copy_batch(
        &mut self,
        pid: usize,
        stream: u64,
        ops: &[CopyOp],
        flags: u64,
        staged: Option<&Staged>,
    ) -> DriverResult<()> {
        if self.config().driver_version < FABRIC_COPY_MIN_VERSION {
            // F7: the symbol is absent before 13.5.
            return Err(Code::NOT_SUPPORTED);
        }
        if flags != 0 {
            return violate(self, "F5", Code::INVALID_VALUE);
        }
        self.stream_of(pid, stream)?;
        if let Some(items) = self.capture_of(stream) {
            // Recorded, not run (F8): checked when a launch enqueues it.
            items.push(Captured::Batch {
                ops: ops.to_vec(),
                flags,
                staged: staged.cloned(),
            });
            return Ok(());
        }
        let dev = self
            .streams
            .by_handle
            .get(&stream)
            .map_or(Device(0), |s| s.dev);
        let mut execs = Vec::with_capacity(ops.len().min(1 << 16));
        let mut ranges = Vec::with_capacity(ops.len().min(1 << 16));
        let mut host_dst_bytes = 0u64;
        // Nothing binds or unbinds while the batch is checked.
        let mut covers = Covers::new();
        for (i, op) in ops.iter().enumerate() {
            let size = op.size;
            let src_place = match op.src {
                Operand::Pointer(p) => Some(self.place(pid, p, size, dev)),
                Operand::LogicalEndpoint { .. } => None,
            };
            let dst_place = match op.dst {
                Operand::Pointer(p) => Some(self.place(pid, p, size, dev)),
                Operand::LogicalEndpoint { .. } => None,
            };
            let local = |p: &Place| matches!(p, Place::Host | Place::Mapped { local: true });
            // F1: which operand kinds may meet.
            match (&op.src, &op.dst) {
                (Operand::LogicalEndpoint { .. }, Operand::LogicalEndpoint { .. }) => {
                    return violate(self, "F1", Code::INVALID_VALUE);
                }
                (Operand::LogicalEndpoint { id, .. }, Operand::Pointer(_)) => {
                    let multicast = self
                        .procs
                        .get(pid)
                        .and_then(|p| p.ids.get(id))
                        .and_then(|s| s.obj)
                        .and_then(|o| self.objects.get(&o))
                        .is_some_and(|o| matches!(o.props.shape, Shape::Multicast { .. }));
                    if multicast {
                        return violate(self, "F1", Code::INVALID_VALUE);
                    }
                }
                _ => {}
            }
            // F2: locality of the pointers.
            match (&src_place, &dst_place) {
                (Some(s), Some(d)) => {
                    let known = |p: &Place| !matches!(p, Place::Unknown);
                    if !known(s) || !known(d) || !(local(s) || local(d)) {
                        return violate(self, "F2", Code::INVALID_VALUE);
                    }
                }
                (Some(p), None) | (None, Some(p)) => {
                    if !local(p) {
                        return violate(self, "F2", Code::INVALID_VALUE);
                    }
                }
                (None, None) => {}
            }
            let src = match (op.src, src_place) {
                (Operand::LogicalEndpoint { id, offset }, _) => {
                    let (_, covered) = self.check_endpoint(pid, id, offset, size, &mut covers)?;
                    ranges.push((i, (Space::Ep(id), offset, offset + size), false));
                    Src::Ep {
                        id,
                        offset,
                        covered,
                    }
                }
                (Operand::Pointer(p), Some(Place::Host)) => {
                    ranges.push((i, (Space::Addr, p.ptr, p.ptr.saturating_add(size)), false));
                    match staged {
                        None => Src::HostRaw(p.ptr),
                        Some(staged) => match staged.get(i) {
                            Some(Some(b)) if b.len() as u64 == size => Src::HostBytes(b.clone()),
                            // A client that did not send the bytes: a protocol error.
                            _ => return Err(Code::INVALID_VALUE),
                        },
                    }
                }
                (Operand::Pointer(p), _) => {
                    ranges.push((i, (Space::Addr, p.ptr, p.ptr.saturating_add(size)), false));
                    Src::Mapped(p.ptr)
                }
            };
            let dst = match (op.dst, dst_place) {
                (Operand::LogicalEndpoint { id, offset }, _) => {
                    let (_, covered) = self.check_endpoint(pid, id, offset, size, &mut covers)?;
                    ranges.push((i, (Space::Ep(id), offset, offset + size), true));
                    Dst::Ep {
                        id,
                        offset,
                        covered,
                    }
                }
                (Operand::Pointer(p), Some(Place::Host)) => {
                    ranges.push((i, (Space::Addr, p.ptr, p.ptr.saturating_add(size)), true));
                    if staged.is_some() {
                        host_dst_bytes = host_dst_bytes.saturating_add(host_write_charge(size));
                        Dst::HostRemote(p.ptr)
                    } else {
                        Dst::HostRaw(p.ptr)
                    }
                }
                (Operand::Pointer(p), _) => {
                    ranges.push((i, (Space::Addr, p.ptr, p.ptr.saturating_add(size)), true));
                    Dst::Mapped(p.ptr)
                }
            };
            execs.push(Exec { src, dst, size });
        }
        // F3: a destination overlapping another op's source or destination.
        ranges.retain(|(i, _, _)| ops.get(*i).is_some_and(|o| o.size > 0));
        if dependent(&mut ranges) {
            return violate(self, "F3", Code::INVALID_VALUE);
        }
        let Some(s) = self.streams.by_handle.get_mut(&stream) else {
            return Err(Code::INVALID_HANDLE);
        };
        if host_dst_bytes > 0 {
            let total = s.outbox_pending.saturating_add(host_dst_bytes);
            if total > MAX_REMOTE_HOST_BYTES {
                // Model's choice: what one reply frame can carry back.
                return Err(Code::OUT_OF_MEMORY);
            }
            s.outbox_pending = total;
        }
        s.queue.push_back(execs);
        s.enqueued = s.enqueued.saturating_add(1);
        Ok(())
    }

    /// `cuMemcpyAsync` in stream order: each pointer a mapping of the
    /// process or (hinted `Host`) host memory.
    pub fn memcpy_async(
        &mut self,
        pid: usize,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
        staged: Option<&Staged>,
    ) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        if let Some(items) = self.capture_of(stream) {
            items.push(Captured::Memcpy {
                dst,
                src,
                size,
                staged: staged.cloned(),
            });
            return Ok(());
        }
        let one = staged.map(|s| s.first().and_then(Option::as_ref));
        let (exec, charge) = self.memcpy_exec(pid, dst, src, size, stream, one, false)?;
        self.push_execs(stream, vec![exec], charge)
    }

    /// `cuMemcpyBatchAsync` (CUDA 12.8+): every copy checked as
    /// `cuMemcpyAsync` checks one, and no copy writing what another reads
    /// or writes (cuda.h: the copies run in no order, dependent ones are
    /// undefined behaviour; logged, `INVALID_VALUE`), all before any is
    /// enqueued: a refused batch enqueued nothing (model's choice; cuda.h
    /// does not say). Then one queue entry, which the stream runs whole.
    /// `staged`: a remote client's host source bytes, one entry per copy.
    pub fn memcpy_batch_async(
        &mut self,
        pid: usize,
        copies: &[MemcpyOp],
        stream: u64,
        staged: Option<&Staged>,
    ) -> DriverResult<()> {
        if self.config().driver_version < MEMCPY_BATCH_MIN_VERSION {
            // No such call before 12.8.
            return Err(Code::NOT_SUPPORTED);
        }
        self.stream_of(pid, stream)?;
        if copies.is_empty() {
            // `numAttrs` (1) may not exceed `count`.
            return Err(Code::INVALID_VALUE);
        }
        let one = |i: usize| staged.map(|s| s.get(i).and_then(Option::as_ref));
        if let Some(items) = self.capture_of(stream) {
            // Captured as the copies it makes (one graph node each).
            for (i, c) in copies.iter().enumerate() {
                items.push(Captured::Memcpy {
                    dst: c.dst,
                    src: c.src,
                    size: c.size,
                    staged: one(i).map(|b| vec![b.cloned()]),
                });
            }
            return Ok(());
        }
        let mut execs = Vec::with_capacity(copies.len().min(1 << 16));
        let mut spans = Vec::with_capacity(copies.len().min(1 << 16).saturating_mul(2));
        let mut charge = 0u64;
        for (i, c) in copies.iter().enumerate() {
            let (exec, more) = self.memcpy_exec(pid, c.dst, c.src, c.size, stream, one(i), true)?;
            execs.push(exec);
            charge = charge.saturating_add(more);
            if c.size > 0 {
                spans.push((
                    i,
                    (Space::Addr, c.src.ptr, c.src.ptr.saturating_add(c.size)),
                    false,
                ));
                spans.push((
                    i,
                    (Space::Addr, c.dst.ptr, c.dst.ptr.saturating_add(c.size)),
                    true,
                ));
            }
        }
        if dependent(&mut spans) {
            return violate(
                self,
                "cuMemcpyBatchAsync dependent copies",
                Code::INVALID_VALUE,
            );
        }
        self.push_execs(stream, execs, charge)
    }

    /// One pointer-to-pointer copy checked (each pointer a mapping of the
    /// process or host memory; no overlap), as the work the stream runs,
    /// and what its host destination charges a remote client's outbox.
    /// `staged`: `Some` for a remote client, with its host source bytes.
    /// Violations are logged as `"cuMemcpyAsync address"` / `"… overlap"`,
    /// or `cuMemcpyBatchAsync`'s for a copy of a `batch`.
    #[allow(clippy::too_many_arguments)]
    fn memcpy_exec(
        &mut self,
        pid: usize,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
        staged: Option<Option<&Vec<u8>>>,
        batch: bool,
    ) -> DriverResult<(Exec, u64)> {
        let (address, overlap) = if batch {
            ("cuMemcpyBatchAsync address", "cuMemcpyBatchAsync overlap")
        } else {
            ("cuMemcpyAsync address", "cuMemcpyAsync overlap")
        };
        let dev = self
            .streams
            .by_handle
            .get(&stream)
            .map_or(Device(0), |s| s.dev);
        let s_place = self.place(pid, src, size, dev);
        let d_place = self.place(pid, dst, size, dev);
        if matches!(s_place, Place::Unknown) || matches!(d_place, Place::Unknown) {
            return violate(self, address, Code::INVALID_VALUE);
        }
        let (s_end, d_end) = (src.ptr.saturating_add(size), dst.ptr.saturating_add(size));
        if size > 0 && src.ptr < d_end && dst.ptr < s_end {
            return violate(self, overlap, Code::INVALID_VALUE);
        }
        let src_op = match (s_place, staged) {
            (Place::Host, None) => Src::HostRaw(src.ptr),
            (Place::Host, Some(bytes)) => match bytes {
                Some(b) if b.len() as u64 == size => Src::HostBytes(b.clone()),
                _ => return Err(Code::INVALID_VALUE),
            },
            _ => Src::Mapped(src.ptr),
        };
        let (dst_op, charge) = match (d_place, staged) {
            (Place::Host, None) => (Dst::HostRaw(dst.ptr), 0),
            (Place::Host, Some(_)) => (Dst::HostRemote(dst.ptr), host_write_charge(size)),
            _ => (Dst::Mapped(dst.ptr), 0),
        };
        let exec = Exec {
            src: src_op,
            dst: dst_op,
            size,
        };
        Ok((exec, charge))
    }

    /// Enqueues `execs` on `stream` as one entry, charging a remote
    /// client's outbox `charge` bytes.
    fn push_execs(&mut self, stream: u64, execs: Vec<Exec>, charge: u64) -> DriverResult<()> {
        let Some(s) = self.streams.by_handle.get_mut(&stream) else {
            return Err(Code::INVALID_HANDLE);
        };
        if charge > 0 {
            let total = s.outbox_pending.saturating_add(charge);
            if total > MAX_REMOTE_HOST_BYTES {
                return Err(Code::OUT_OF_MEMORY);
            }
            s.outbox_pending = total;
        }
        s.queue.push_back(execs);
        s.enqueued = s.enqueued.saturating_add(1);
        Ok(())
    }

    /// The capture of `stream`, if it is capturing.
    fn capture_of(&mut self, stream: u64) -> Option<&mut Vec<Captured>> {
        self.streams
            .by_handle
            .get_mut(&stream)
            .and_then(|s| s.capturing.as_mut())
    }

    /// A capturing stream cannot be synchronized or queried (the driver's
    /// `STREAM_CAPTURE_UNSUPPORTED`).
    fn not_capturing(&mut self, stream: u64) -> DriverResult<()> {
        if self.capture_of(stream).is_some() {
            return violate(
                self,
                "cuStreamBeginCapture: synchronize while capturing",
                Code::STREAM_CAPTURE_UNSUPPORTED,
            );
        }
        Ok(())
    }

    pub fn stream_begin_capture(&mut self, pid: usize, stream: u64) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        match self.streams.by_handle.get_mut(&stream) {
            Some(s) if s.capturing.is_none() => {
                s.capturing = Some(Vec::new());
                Ok(())
            }
            _ => violate(
                self,
                "cuStreamBeginCapture: already capturing",
                Code::ILLEGAL_STATE,
            ),
        }
    }

    pub fn stream_end_capture(&mut self, pid: usize, stream: u64) -> DriverResult<u64> {
        self.stream_of(pid, stream)?;
        let Some(items) = self
            .streams
            .by_handle
            .get_mut(&stream)
            .and_then(|s| s.capturing.take())
        else {
            return violate(
                self,
                "cuStreamEndCapture: not capturing",
                Code::ILLEGAL_STATE,
            );
        };
        let h = self.streams.handle(6);
        self.streams.graphs.insert(h, GraphObj { pid, items });
        Ok(h)
    }

    pub fn graph_instantiate(&mut self, pid: usize, graph: u64) -> DriverResult<u64> {
        let Some(items) = self
            .streams
            .graphs
            .get(&graph)
            .filter(|g| g.pid == pid)
            .map(|g| g.items.clone())
        else {
            return violate(self, "cuGraph handle", Code::INVALID_HANDLE);
        };
        let h = self.streams.handle(7);
        self.streams.execs.insert(h, GraphObj { pid, items });
        Ok(h)
    }

    pub fn graph_destroy(&mut self, pid: usize, graph: u64) -> DriverResult<()> {
        self.forget_graph(pid, graph, false)
    }

    pub fn graph_exec_destroy(&mut self, pid: usize, exec: u64) -> DriverResult<()> {
        self.forget_graph(pid, exec, true)
    }

    /// Destroys graph (or, `exec`, executable graph) `h` of `pid`.
    fn forget_graph(&mut self, pid: usize, h: u64, exec: bool) -> DriverResult<()> {
        let (map, what) = if exec {
            (&mut self.streams.execs, "cuGraphExec handle")
        } else {
            (&mut self.streams.graphs, "cuGraph handle")
        };
        if map.get(&h).is_some_and(|g| g.pid == pid) {
            map.remove(&h);
            return Ok(());
        }
        violate(self, what, Code::INVALID_HANDLE)
    }

    /// Whether endpoint `id` of `pid` is valid (reported ready, alive) and
    /// bound over `[offset, offset+size)` on every target now (F8).
    fn valid_and_bound(
        &self,
        pid: usize,
        id: u32,
        offset: u64,
        size: u64,
        covers: &mut Covers,
    ) -> bool {
        let Some(o) = self
            .procs
            .get(pid)
            .and_then(|p| p.ids.get(&id))
            .filter(|s| s.reported_ready)
            .and_then(|s| s.obj)
        else {
            return false;
        };
        if !self.objects.contains_key(&o) {
            return false;
        }
        let targets = self.targets(covers, o, offset, size);
        !targets.is_empty() && targets.iter().all(|t| matches!(t, Some(Some(_))))
    }

    /// `cuGraphLaunch`: F8 first (every endpoint id of every copy node
    /// valid and bound now), then the captured work enqueued on `stream`
    /// in capture order, each checked as when it was first enqueued.
    pub fn graph_launch(&mut self, pid: usize, exec: u64, stream: u64) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        let Some(items) = self
            .streams
            .execs
            .get(&exec)
            .filter(|g| g.pid == pid)
            .map(|g| g.items.clone())
        else {
            return violate(self, "cuGraphExec handle", Code::INVALID_HANDLE);
        };
        let mut covers = Covers::new();
        for item in &items {
            let Captured::Batch { ops, .. } = item else {
                continue;
            };
            for op in ops {
                for side in [op.src, op.dst] {
                    if let Operand::LogicalEndpoint { id, offset } = side
                        && !self.valid_and_bound(pid, id, offset, op.size, &mut covers)
                    {
                        return violate(self, "F8", Code::INVALID_VALUE);
                    }
                }
            }
        }
        for item in items {
            match item {
                Captured::Batch { ops, flags, staged } => {
                    self.fabric_copy_batch(pid, stream, &ops, flags, staged.as_ref())?;
                }
                Captured::Memcpy {
                    dst,
                    src,
                    size,
                    staged,
                } => self.memcpy_async(pid, dst, src, size, stream, staged.as_ref())?,
            }
        }
        Ok(())
    }

    pub fn event_create(&mut self, pid: usize, dev: Device) -> DriverResult<u64> {
        if self.device(dev).is_none() {
            return Err(Code::INVALID_DEVICE);
        }
        let h = self.streams.handle(8);
        self.streams
            .events
            .insert(h, EventObj { pid, dev, at: None });
        Ok(h)
    }

    fn event_of(&mut self, pid: usize, event: u64) -> DriverResult<Option<(u64, u64)>> {
        match self.streams.events.get(&event) {
            Some(e) if e.pid == pid => Ok(e.at),
            _ => violate(self, "cuEvent handle", Code::INVALID_HANDLE),
        }
    }

    pub fn event_destroy(&mut self, pid: usize, event: u64) -> DriverResult<()> {
        self.event_of(pid, event)?;
        self.streams.events.remove(&event);
        Ok(())
    }

    /// `cuEventRecord`: the event and the stream must be of one context
    /// (one device's primary context here); the driver answers
    /// `CUDA_ERROR_INVALID_HANDLE` otherwise (CUDA Runtime API,
    /// `cudaEventRecord`: "event and stream must be on the same CUDA
    /// context"; `cuCtxRecordEvent`: "must be from the same CUDA context,
    /// otherwise CUDA_ERROR_INVALID_HANDLE will be returned").
    pub fn event_record(&mut self, pid: usize, event: u64, stream: u64) -> DriverResult<()> {
        self.stream_of(pid, stream)?;
        self.event_of(pid, event)?;
        let (n, stream_dev) = self
            .streams
            .by_handle
            .get(&stream)
            .map_or((0, None), |s| (s.enqueued, Some(s.dev)));
        let event_dev = self.streams.events.get(&event).map(|e| e.dev);
        if stream_dev != event_dev {
            return violate(
                self,
                "cuEventRecord: event and stream of different devices",
                Code::INVALID_HANDLE,
            );
        }
        if let Some(e) = self.streams.events.get_mut(&event) {
            e.at = Some((stream, n));
        }
        Ok(())
    }

    /// How many more batches the stream must reach for `event` to complete.
    fn event_left(&self, at: Option<(u64, u64)>) -> (u64, usize) {
        match at.and_then(|(s, n)| Some((s, n, self.streams.by_handle.get(&s)?))) {
            Some((s, n, obj)) => (
                s,
                usize::try_from(n.saturating_sub(obj.ran)).unwrap_or(usize::MAX),
            ),
            // Never recorded, or its stream is gone (its work completed).
            None => (0, 0),
        }
    }

    /// `cuEventQuery`: runs one more batch of the event's stream when the
    /// event waits for it (the point in between, as `cuStreamQuery`).
    pub fn event_query(&mut self, pid: usize, event: u64) -> DriverResult<bool> {
        let at = self.event_of(pid, event)?;
        let (stream, left) = self.event_left(at);
        if left > 0 {
            self.run_stream(stream, 1)?;
        }
        Ok(self.event_left(at).1 == 0)
    }

    pub fn event_synchronize(&mut self, pid: usize, event: u64) -> DriverResult<()> {
        let at = self.event_of(pid, event)?;
        let (stream, left) = self.event_left(at);
        if left > 0 {
            self.run_stream(stream, left)?;
        }
        Ok(())
    }

    /// The stream `event` was last recorded on (0: none).
    #[cfg(feature = "fabric")]
    fn event_stream(&self, event: u64) -> u64 {
        self.streams
            .events
            .get(&event)
            .and_then(|e| e.at)
            .map_or(0, |(s, _)| s)
    }

    /// The bytes of allocation `alloc` at `off` (zeros where never written).
    fn load(&self, alloc: u64, off: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        if let Some(a) = self.allocs.get(&alloc) {
            let data = a.data.lock().unwrap_or_else(|e| e.into_inner());
            data.load(off, &mut out);
        }
        out
    }

    /// The endpoint object on `id` at the moment the stream reaches an op:
    /// gone is F4 (destroyed while in flight).
    fn endpoint_now(&mut self, pid: usize, id: u32) -> DriverResult<u64> {
        match self
            .procs
            .get(pid)
            .and_then(|p| p.ids.get(&id))
            .and_then(|s| s.obj)
        {
            Some(o) if self.objects.contains_key(&o) => Ok(o),
            _ => violate(self, "F4", Code::ILLEGAL_ADDRESS),
        }
    }

    /// The bound pieces of every target when the stream reaches an op:
    /// nothing bound on a target is R13.3 (the program did not wait for the
    /// peer's bind), a range bound at enqueue and not now is F4, one never
    /// covered is F9.
    fn pieces_now(
        &mut self,
        o: u64,
        offset: u64,
        size: u64,
        covered: bool,
        covers: &mut Covers,
    ) -> DriverResult<Vec<Vec<(u64, u64, u64)>>> {
        let mut out = Vec::new();
        for t in self.targets(covers, o, offset, size) {
            match t {
                Some(Some(p)) => out.push(p),
                None if !covered => return violate(self, "R13.3", Code::ILLEGAL_ADDRESS),
                Some(None) if !covered => return violate(self, "F9", Code::ILLEGAL_ADDRESS),
                _ => return violate(self, "F4", Code::ILLEGAL_ADDRESS),
            }
        }
        Ok(out)
    }

    /// One op, as the stream reaches it.
    fn execute(
        &mut self,
        pid: usize,
        stream: u64,
        op: Exec,
        covers: &mut Covers,
    ) -> DriverResult<()> {
        let len = usize::try_from(op.size).map_err(|_| Code::INVALID_VALUE)?;
        // Resolve the destination first, so a fault writes nothing.
        let dst_pieces = match op.dst {
            Dst::Ep {
                id,
                offset,
                covered,
            } => {
                let o = self.endpoint_now(pid, id)?;
                Some(self.pieces_now(o, offset, op.size, covered, covers)?)
            }
            Dst::Mapped(ptr) if self.resolve_addr(pid, ptr, op.size.max(1)).is_none() => {
                return violate(self, "F4", Code::ILLEGAL_ADDRESS);
            }
            _ => None,
        };
        if len == 0 {
            return Ok(());
        }
        let bytes = match op.src {
            Src::Mapped(ptr) => match self.read(pid, ptr, len) {
                Ok(b) => b,
                Err(_) => return violate(self, "F4", Code::ILLEGAL_ADDRESS),
            },
            Src::HostRaw(addr) => {
                let mut b = vec![0u8; len];
                // SAFETY: the caller of `cuFabricCpyBatchAsync` /
                // `cuMemcpyAsync` vouched (the row's contract) that this host
                // range is readable for `len` bytes until the stream passed
                // the op, which is now; `b` is a fresh buffer of `len` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        std::ptr::with_exposed_provenance::<u8>(addr as usize),
                        b.as_mut_ptr(),
                        len,
                    );
                }
                b
            }
            Src::HostBytes(b) => b,
            Src::Ep {
                id,
                offset,
                covered,
            } => {
                let o = self.endpoint_now(pid, id)?;
                let pieces = self.pieces_now(o, offset, op.size, covered, covers)?;
                let mut b = Vec::with_capacity(len);
                for (alloc, off, n) in pieces.into_iter().next().unwrap_or_default() {
                    b.extend(self.load(alloc, off, usize::try_from(n).unwrap_or(0)));
                }
                b.resize(len, 0);
                b
            }
        };
        match op.dst {
            Dst::Mapped(ptr) => {
                if self.write(pid, ptr, &bytes).is_err() {
                    return violate(self, "F4", Code::ILLEGAL_ADDRESS);
                }
            }
            Dst::HostRaw(addr) => {
                // SAFETY: as for the source: the caller vouched that this
                // host range is writable for `len` bytes until the stream
                // passed the op; `bytes` is `len` bytes long.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        std::ptr::with_exposed_provenance_mut::<u8>(addr as usize),
                        len,
                    );
                }
            }
            Dst::HostRemote(addr) => {
                if let Some(s) = self.streams.by_handle.get_mut(&stream) {
                    s.outbox.push((addr, bytes));
                }
            }
            Dst::Ep { .. } => {
                for target in dst_pieces.unwrap_or_default() {
                    let mut at = 0usize;
                    for (alloc, off, n) in target {
                        let n = usize::try_from(n).unwrap_or(0);
                        let end = at.saturating_add(n).min(bytes.len());
                        let off = usize::try_from(off).unwrap_or(usize::MAX);
                        self.store(alloc, off, &bytes[at..end]);
                        at = end;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The data path for a client in another OS process (the model fabric's
/// server calls these for its `Remote` clients): host bytes travel in the
/// messages, never as addresses the model would read or write here.
#[cfg(feature = "fabric")]
impl super::Model {
    /// `cuFabricCpyBatchAsync` with the host source bytes snapshotted by
    /// the client at enqueue; host destinations go to the stream's outbox.
    pub(crate) fn fabric_copy_batch_staged(
        &self,
        stream: u64,
        ops: &[CopyOp],
        flags: u64,
        staged: &Staged,
    ) -> DriverResult<()> {
        self.enter(crate::driver::Call::FabricCpyBatchAsync, |w, p| {
            w.fabric_copy_batch(p, stream, ops, flags, Some(staged))
        })
    }

    /// `cuMemcpyBatchAsync` as [`Self::fabric_copy_batch_staged`].
    pub(crate) fn memcpy_batch_async_staged(
        &self,
        copies: &[MemcpyOp],
        stream: u64,
        staged: &Staged,
    ) -> DriverResult<()> {
        self.enter(crate::driver::Call::MemcpyBatchAsync, |w, p| {
            w.memcpy_batch_async(p, copies, stream, Some(staged))
        })
    }

    /// `cuMemcpyAsync` as [`Self::fabric_copy_batch_staged`].
    pub(crate) fn memcpy_async_staged(
        &self,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
        staged: &Staged,
    ) -> DriverResult<()> {
        self.enter(crate::driver::Call::MemcpyAsync, |w, p| {
            w.memcpy_async(p, dst, src, size, stream, Some(staged))
        })
    }

    /// `cuStreamSynchronize`, `cuStreamQuery` or `cuStreamDestroy` for a
    /// remote client (`call` says which): the answer (`done` for a query),
    /// and the host-destination bytes completed so far, for the client to
    /// write — handed back whatever the answer.
    pub(crate) fn stream_call_staged(
        &self,
        call: crate::driver::Call,
        stream: u64,
    ) -> (DriverResult<bool>, HostWrites) {
        use crate::driver::Call;
        let mut writes = Vec::new();
        let r = self.enter(call, |w, p| {
            let r = match call {
                Call::StreamSynchronize | Call::StreamDestroy => {
                    w.stream_synchronize(p, stream).map(|()| true)
                }
                Call::StreamQuery => w.stream_query(p, stream),
                // `stream` names an event here: its stream's host bytes.
                Call::EventSynchronize => w.event_synchronize(p, stream).map(|()| true),
                Call::EventQuery => w.event_query(p, stream),
                _ => Err(Code::NOT_SUPPORTED),
            };
            let stream = match call {
                Call::EventSynchronize | Call::EventQuery => w.event_stream(stream),
                _ => stream,
            };
            writes = w.take_host_writes(stream);
            match (call, r) {
                (Call::StreamDestroy, Ok(_)) => w.stream_destroy(p, stream).map(|()| true),
                (_, r) => r,
            }
        });
        (r, writes)
    }
}

#[cfg(test)]
mod tests {
    use super::{Space, Span, dependent};

    /// A stream handle the counter comes back to after 2^32 creations is
    /// not given again while another process holds it.
    #[test]
    fn a_handle_still_held_is_never_given_again_when_the_counter_comes_back() {
        let m = Model::new(ModelConfig::node(1));
        let p = m.spawn_process();
        // SAFETY: streams this test owns alone.
        unsafe {
            let held = m.stream_create(Device(0)).unwrap();
            m.lock().streams.next = (held & 0xFFFF_FFFF) + (1 << 32) - 1;
            let other = p.stream_create(Device(0)).unwrap();
            assert_ne!(other, held);
            p.stream_destroy(other).unwrap();
            m.stream_destroy(held).unwrap();
        }
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }
    use crate::driver::{
        AllocationRequest, CopyOp, CopyOps, Device, Driver, EndpointProps, Location, Operand,
        Pointer, Shape,
    };
    use crate::{Model, ModelConfig};

    /// The definition, pair by pair (the check this model ran before the
    /// sweep): the oracle.
    fn dependent_pairwise(spans: &[Span]) -> bool {
        let overlaps =
            |a: (Space, u64, u64), b: (Space, u64, u64)| a.0 == b.0 && a.1 < b.2 && b.1 < a.2;
        spans.iter().any(|(a, ra, wa)| {
            spans
                .iter()
                .any(|(b, rb, wb)| a != b && (*wa || *wb) && overlaps(*ra, *rb))
        })
    }

    /// Both sides of ops `(src, dst)`, as `fabric_copy_batch` makes them.
    /// One side of an op: `(space, start, end)`.
    type Side = (Space, u64, u64);

    fn spans(ops: &[(Side, Side)]) -> Vec<Span> {
        ops.iter()
            .enumerate()
            .flat_map(|(i, &(s, d))| [(i, s, false), (i, d, true)])
            .collect()
    }

    fn agree(ops: &[(Side, Side)]) {
        let mut all = spans(ops);
        let oracle = dependent_pairwise(&all);
        assert_eq!(dependent(&mut all), oracle, "{ops:?}");
    }

    /// Every side a small range in one of two spaces, or the range that
    /// saturates at the top of the address space.
    fn universe() -> Vec<(Space, u64, u64)> {
        let mut out = vec![
            (Space::Addr, u64::MAX - 1, u64::MAX),
            (Space::Addr, u64::MAX, u64::MAX),
        ];
        for space in [Space::Addr, Space::Ep(1)] {
            for start in 0..3 {
                for len in 1..=2 {
                    out.push((space, start, start + len));
                }
            }
        }
        out
    }

    #[test]
    fn f3_the_sweep_finds_a_dependency_exactly_when_a_pair_of_ops_is_dependent_every_batch_of_up_to_three()
     {
        let u = universe();
        let sides: Vec<_> = u
            .iter()
            .flat_map(|&s| u.iter().map(move |&d| (s, d)))
            .collect();
        for &a in &sides {
            agree(&[a]);
            for &b in &sides {
                agree(&[a, b]);
            }
        }
        // Three ops: a smaller universe (one space of the two, and the top).
        let small: Vec<_> = sides
            .iter()
            .copied()
            .filter(|(s, d)| s.1 < 2 && d.1 < 2 || s.1 == u64::MAX)
            .collect();
        for &a in &small {
            for &b in &small {
                for &c in &small {
                    agree(&[a, b, c]);
                }
            }
        }
    }

    #[test]
    fn f3_the_sweep_finds_a_dependency_exactly_when_a_pair_of_ops_is_dependent_random_batches() {
        // xorshift64: reproducible, no dependency.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut found, mut clean) = (0, 0);
        for _ in 0..20_000 {
            let n = 2 + next(30);
            let spread = 1 + next(2000);
            let ops: Vec<_> = (0..n)
                .map(|_| {
                    let mut side = || {
                        let space = match next(3) {
                            0 => Space::Addr,
                            k => Space::Ep(k as u32),
                        };
                        let start = next(spread);
                        (space, start, start + 1 + next(16))
                    };
                    (side(), side())
                })
                .collect();
            let mut all = spans(&ops);
            let oracle = dependent_pairwise(&all);
            assert_eq!(dependent(&mut all), oracle, "{ops:?}");
            if oracle { found += 1 } else { clean += 1 }
        }
        // Both answers were exercised.
        assert!(
            found > 1000 && clean > 1000,
            "{found} dependent, {clean} not"
        );
    }

    /// The lookup the model made before `Target` (sort, then the first
    /// binding in order that covers each point): the oracle.
    fn pieces_linear(
        bound: &[(u64, u64, u64, u64)],
        offset: u64,
        end: u64,
    ) -> Option<Vec<(u64, u64, u64)>> {
        let mut mine: Vec<_> = bound.iter().collect();
        mine.sort_by_key(|b| b.0);
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < end {
            let b = mine.iter().find(|b| b.0 <= at && at < b.1)?;
            let stop = end.min(b.1);
            pieces.push((b.2, b.3 + (at - b.0), stop - at));
            at = stop;
        }
        Some(pieces)
    }

    #[test]
    fn f9_the_bound_pieces_of_a_range_are_found_by_binary_search_as_by_the_scan() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut covered = 0;
        for _ in 0..5_000 {
            // Bindings in bind order, overlapping or not, some adjacent.
            let bound: Vec<_> = (0..next(12))
                .map(|k| {
                    let off = next(40);
                    (off, off + 1 + next(12), k, next(1000))
                })
                .collect();
            let target = super::Target::new(bound.clone());
            for _ in 0..20 {
                let offset = next(50);
                let end = offset + next(20);
                let want = pieces_linear(&bound, offset, end);
                covered += usize::from(want.as_ref().is_some_and(|p| p.len() > 1));
                assert_eq!(
                    target.pieces(offset, end),
                    want,
                    "{bound:?} [{offset}, {end})"
                );
            }
        }
        // Ranges over several bindings were among them.
        assert!(covered > 1000, "{covered}");
    }

    /// A model node of 13.5 (fabric copy), a ready unicast endpoint of
    /// `size` bytes on device 0 with memory bound, source memory mapped,
    /// and a stream: `(model, id, source address, stream)`.
    fn put_setup(size: u64) -> (Model, u32, u64, u64) {
        let mut config = ModelConfig::node(1);
        config.driver_version = 13050;
        let m = Model::new(config);
        let d = Device(0);
        let req = AllocationRequest {
            location: Location::Device(d),
            handle_types: 0,
        };
        // SAFETY: a model process of this test only; every handle and
        // address is one the model just gave.
        unsafe {
            let id = m.id_reserve(1).unwrap();
            m.create(id, EndpointProps::new(Shape::Unicast { owner: d }, size))
                .unwrap();
            assert!((0..100).any(|_| m.query(id, 1).unwrap()), "never ready");
            let (owner, src) = (
                m.mem_create(size, req).unwrap(),
                m.mem_create(size, req).unwrap(),
            );
            let va = m.mem_address_reserve(size, 0).unwrap();
            m.mem_map(va, size, 0, src).unwrap();
            m.mem_set_access(va, size, vec![d]).unwrap();
            m.bind_mem(id, d, 0, owner, 0, size, 0).unwrap();
            let stream = m.stream_create(d).unwrap();
            (m, id, va, stream)
        }
    }

    /// No wall clock: with a pass over every binding per op (as before
    /// `Cover`), this batch is some 10^9 steps under the world's lock at
    /// enqueue and again when it runs.
    #[test]
    fn f9_a_batch_of_16384_ops_over_an_endpoint_of_8192_bindings_is_checked_and_run() {
        let (chunk, size) = (64u64 << 10, 512u64 << 20);
        let mut config = ModelConfig::node(1);
        config.driver_version = 13050;
        for d in &mut config.devices {
            (d.bind_alignment, d.granularity, d.recommended_granularity) = (chunk, chunk, chunk);
        }
        let m = Model::new(config);
        let d = Device(0);
        let req = AllocationRequest {
            location: Location::Device(d),
            handle_types: 0,
        };
        let n = 16_384u64;
        let step = size / n;
        // SAFETY: a model process of this test only; every handle and
        // address is one the model just gave; no host operand.
        unsafe {
            let id = m.id_reserve(1).unwrap();
            m.create(id, EndpointProps::new(Shape::Unicast { owner: d }, size))
                .unwrap();
            assert!((0..100).any(|_| m.query(id, 1).unwrap()), "never ready");
            let (owner, src) = (
                m.mem_create(size, req).unwrap(),
                m.mem_create(size, req).unwrap(),
            );
            for k in 0..size / chunk {
                m.bind_mem(id, d, k * chunk, owner, k * chunk, chunk, 0)
                    .unwrap();
            }
            let va = m.mem_address_reserve(size, 0).unwrap();
            m.mem_map(va, size, 0, src).unwrap();
            m.mem_set_access(va, size, vec![d]).unwrap();
            m.write(va + 8 * step, &[9; 64]).unwrap();
            let stream = m.stream_create(d).unwrap();
            // Each op at its own place; the even ones across two bindings.
            let offset = |i: u64| {
                if i.is_multiple_of(2) {
                    (i * step).saturating_sub(32)
                } else {
                    i * step + step / 2
                }
            };
            let ops: CopyOps = (0..n)
                .map(|i| CopyOp {
                    src: Operand::Pointer(Pointer::device(va + i * step)),
                    dst: Operand::LogicalEndpoint {
                        id,
                        offset: offset(i),
                    },
                    size: 64,
                })
                .collect();
            m.fabric_copy_batch(stream, ops, 0).unwrap();
            m.stream_synchronize(stream).unwrap();
            // Op 8's bytes landed across two bindings: read them back.
            let back = m.mem_address_reserve(size, 0).unwrap();
            m.mem_map(back, size, 0, owner).unwrap();
            m.mem_set_access(back, size, vec![d]).unwrap();
            let at = offset(8);
            assert_eq!(m.read(back + at, 64).unwrap(), [9; 64]);
        }
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }

    fn puts(id: u32, va: u64, n: u64, each: u64) -> CopyOps {
        (0..n)
            .map(|i| CopyOp {
                src: Operand::Pointer(Pointer::device(va + i * each)),
                dst: Operand::LogicalEndpoint {
                    id,
                    offset: i * each,
                },
                size: each,
            })
            .collect()
    }

    /// No wall clock: pairwise, 100,000 ops are 10^10 comparisons (hours
    /// in a debug build), so that this test finishes at all shows the sweep.
    #[test]
    fn f3_a_batch_of_a_hundred_thousand_independent_ops_is_checked_enqueued_and_run() {
        let (m, id, va, stream) = put_setup(8 << 20);
        let ops = puts(id, va, 100_000, 64);
        // SAFETY: as in `put_setup`; no host operand.
        unsafe {
            m.fabric_copy_batch(stream, ops, 0).unwrap();
            m.stream_synchronize(stream).unwrap();
        }
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }

    /// The in-flight bound of a remote client's host destinations
    /// (`MAX_REMOTE_HOST_BYTES`) is given back by an op that faults and so
    /// sends nothing back, not only by the bytes handed back.
    #[cfg(feature = "fabric")]
    #[test]
    fn a_faulted_host_destination_op_gives_back_its_share_of_the_in_flight_bound() {
        use crate::driver::Call;
        let size = 2 << 20;
        let (m, id, _, stream) = put_setup(size);
        let get = |n: u64| {
            let op = CopyOp {
                src: Operand::LogicalEndpoint { id, offset: 0 },
                dst: Operand::Pointer(Pointer::host(0x1000)),
                size: n,
            };
            m.fabric_copy_batch_staged(stream, &[op], 0, &vec![None])
        };
        let most = super::MAX_REMOTE_HOST_BYTES - super::HOST_WRITE_OVERHEAD;
        get(most).unwrap();
        // Full: one byte more is refused until the stream hands bytes back.
        assert_eq!(get(1), Err(crate::driver::Code::OUT_OF_MEMORY));
        // Unbound while in flight: the op faults (F4) and writes nothing.
        let d = Device(0);
        // SAFETY: as in `put_setup`.
        unsafe { m.unbind(id, d, 0, size).unwrap() };
        let (r, writes) = m.stream_call_staged(Call::StreamSynchronize, stream);
        assert_eq!(r, Err(crate::driver::Code::ILLEGAL_ADDRESS));
        assert!(writes.is_empty());
        let req = AllocationRequest {
            location: Location::Device(d),
            handle_types: 0,
        };
        // SAFETY: as in `put_setup`.
        unsafe {
            let owner = m.mem_create(size, req).unwrap();
            m.bind_mem(id, d, 0, owner, 0, size, 0).unwrap();
        }
        // Its share is free again: the whole bound once more.
        get(most).unwrap();
        let (r, writes) = m.stream_call_staged(Call::StreamSynchronize, stream);
        assert_eq!((r, writes.len()), (Ok(true), 1));
    }

    #[test]
    fn f3_a_hundred_thousand_ops_with_one_dependent_pair_are_refused_with_one_f3_violation() {
        let (m, id, va, stream) = put_setup(8 << 20);
        let mut ops = puts(id, va, 100_000, 64);
        // The last op writes where the first does.
        if let Some(last) = ops.last_mut() {
            last.dst = Operand::LogicalEndpoint { id, offset: 32 };
            last.src = Operand::Pointer(Pointer::device(va + (7 << 20)));
        }
        // SAFETY: as in `put_setup`; no host operand.
        let r = unsafe { m.fabric_copy_batch(stream, ops, 0) };
        assert_eq!(r, Err(crate::driver::Code::INVALID_VALUE));
        let rules: Vec<_> = m.violations().iter().map(|v| v.rule).collect();
        assert_eq!(rules, ["F3"]);
    }
}

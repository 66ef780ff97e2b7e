//! Graphs of copies (SPEC F8): a [`CopyBatch`] captured once on a
//! [`Stream`] (`cuStreamBeginCapture`, `cuFabricCpyBatchAsync` recorded,
//! `cuStreamEndCapture`, `cuGraphInstantiateWithFlags`) and launched as
//! often as wanted (`cuGraphLaunch`).
//!
//! What this file owns:
//! - [`CopyGraph`]: the graph and its executable form, the host buffers
//!   its copy nodes read and write (owned, so their addresses stay), and
//!   what each launch keeps alive (as an enqueued batch does, F4);
//! - F8: a copy node "needs every id valid and bound for as long as the
//!   graph may run", and the graph may run for its whole life. In the
//!   types: the graph borrows the endpoints and the memory of its batch
//!   for its whole life (`'a`), so destroying an endpoint, unbinding
//!   through a binding it was lent by ([`crate::Binding::copy_through`])
//!   or freeing memory while the graph lives does not compile. At run time:
//!   a binding the graph does not borrow (the batch named `&ep`) cannot be
//!   unbound while the graph lives either: the graph pins its ids in the
//!   holds of their ranges (`ledger::holds::pin_for_graph`), and the unbind answers
//!   [`Error::UnbindUnderGraph`] before the driver, the memory still bound
//!   (from a `Binding`'s `Drop`, the error is kept on the context and the
//!   endpoint keeps the memory until it is destroyed). Peers' bindings
//!   are not pinned: a launch after a close or a new agreement on a
//!   bring-up's endpoint checks the graph's ops on it against what the
//!   peers bound then ([`Error::CopyPeerNotBound`], R13.5). A launch's
//!   [`InFlight`] token borrows the graph mutably, so a second launch or a
//!   look at the host buffers waits for the first. Dropping the graph
//!   synchronizes its stream first, then destroys the executable graph and
//!   the graph and unpins its ids; a panic inside one of those destroys (a
//!   `tracing` layer, a user backend) still destroys what is left and
//!   unpins them while it unwinds;
//! - the capture on a stream of its own: `Stream` is `Sync`, and another
//!   thread's batch enqueued on the graph's stream between the begin and
//!   the end of a capture would be captured (its token then completes with
//!   nothing done, and the graph's launches write into its buffers). The
//!   capture stream is made and destroyed inside [`Stream::capture`], where
//!   no other code can reach it.
//!
//! Graphs run on the fabric path only (a copy node is
//! `CU_GRAPH_NODE_TYPE_FABRIC_CPY_BATCH`); on the portable path
//! [`Stream::capture`] answers [`Error::Unsupported`].

use std::marker::PhantomData;

use crate::copy::{CopyBatch, FabricList, HostBufs, InFlight, fabric_copy_error, outside_peers};
use crate::driver::{Call, CopyOp, Operand};
use crate::error::{Error, Feature, Result};
use crate::ledger::holds::Keep;
use crate::stream::Stream;
use crate::unwind::OnUnwind;

/// A captured [`CopyBatch`], launched with [`CopyGraph::launch`] (F8).
///
/// `'a` is how long it borrows the endpoints and memory its copies name:
/// its whole life, since any launch may run them.
pub struct CopyGraph<'a> {
    stream: &'a Stream,
    graph: u64,
    exec: u64,
    /// Its number in its ranges' holds, which pins its ids (F8).
    pin: u64,
    keep: Keep,
    /// Its host buffers, at the addresses captured (none without host ops).
    host: Option<Box<HostBufs>>,
    /// The stream record of the last launch: until the stream passed it,
    /// the launch may still write the received buffers.
    last: Option<u64>,
    /// The endpoints whose peers' bindings an agreement recorded
    /// ([`Watched`]): checked again at a launch after that record changed.
    watched: Vec<Watched>,
    _borrow: PhantomData<&'a ()>,
}

/// An endpoint of the graph that reaches peers (a bring-up's), its ops, and
/// the generation they were last checked at: a close or a new agreement
/// since may say the peers bound less (R13.5), which a launch checks before
/// the driver, as an enqueue does (F8: every id bound for as long as the
/// graph may run; this process's own bindings are pinned instead).
struct Watched {
    /// Its index in the graph's `keep.endpoints`.
    at: usize,
    generation: u64,
    /// `(op, offset, size)` of each op on it.
    ops: Vec<(usize, u64, u64)>,
}

/// The ops of `list` on endpoint `id`.
fn ops_on(list: &[CopyOp], id: u32) -> Vec<(usize, u64, u64)> {
    list.iter()
        .enumerate()
        .filter_map(|(op, o)| match (o.src, o.dst) {
            (Operand::LogicalEndpoint { id: i, offset }, _)
            | (_, Operand::LogicalEndpoint { id: i, offset })
                if i == id =>
            {
                Some((op, offset, o.size))
            }
            _ => None,
        })
        .collect()
}

impl std::fmt::Debug for CopyGraph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyGraph")
            .field("stream", self.stream)
            .field("graph", &format_args!("{:#x}", self.graph))
            .finish()
    }
}

impl Stream {
    /// Captures `batch` into a graph of copies on this stream (F8), after
    /// every check of [`Stream::enqueue`]; nothing runs until
    /// [`CopyGraph::launch`].
    ///
    /// # Errors
    /// The checks of [`Stream::enqueue`]; [`Error::Unsupported`]
    /// ([`Feature::FabricCopy`]) on the portable path or a driver without
    /// the fabric copy (F7); [`Error::Driver`] from the capture calls, with
    /// the capture ended and its graph destroyed.
    ///
    /// The capture runs on a stream of its own (`cuStreamCreate`, destroyed
    /// before this returns), so that what other threads enqueue on `self`
    /// meanwhile is never captured; the graph launches on `self`. While the
    /// graph lives, no binding on an endpoint it names can be unbound
    /// ([`Error::UnbindUnderGraph`], F8).
    pub fn capture<'a>(&'a self, mut batch: CopyBatch<'a>) -> Result<CopyGraph<'a>> {
        let ctx = &self.inner.ctx;
        // A deferred first put's endpoint in the batch's list before the
        // gate is entered on that list (`copy/one.rs`).
        batch.materialize();
        // No unbind on these ranges from another thread between the checks
        // and the pin of the graph's ids (F8), as for an enqueue (F4).
        let _gate = loop {
            // SAFETY: the ranges are those of the endpoints the batch
            // borrows for 'a, past this call, where the gate ends.
            let gate =
                unsafe { crate::ledger::gate::EnqueueGate::enter(&batch.inner.keep.endpoints) }?;
            batch.check_for(self)?;
            if gate.clear() {
                break gate;
            }
            gate.wait_for_changes()?;
        };
        if ctx.copy_path() == crate::CopyPath::Portable {
            return Err(Error::unsupported(
                Feature::FabricCopy,
                ctx.driver_version(),
                "a graph of copies captures the fabric copy; on the portable path enqueue each batch",
            ));
        }
        let FabricList { list, keep, host } = batch.into_list();
        // Under the gate, with the checks just made: the generation they
        // were made at.
        let watched = keep
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, (range, id))| range.slot(*id).peers().next().is_some())
            .map(|(at, (range, id))| Watched {
                at,
                generation: range.bindings_gen(),
                ops: ops_on(&list, *id),
            })
            .collect();
        let d = ctx.driver();
        // The capture runs on a stream of its own, made here and destroyed
        // below, that no other code can reach: `Stream` is `Sync`, so on
        // `self` another thread could enqueue (its batch would land in this
        // graph, and its token complete with nothing done) or synchronize
        // between the begin and the end of the capture. The graph is
        // launched on `self`, of the same device (F2 was checked for it).
        let handle = ctx.check(
            Call::StreamCreate,
            ctx.queries().stream_create(self.inner.dev),
        )?;
        if handle == 0 {
            // Never the legacy NULL stream (F6), whatever a backend says.
            return Err(Error::driver(Call::StreamCreate, crate::Code::UNKNOWN));
        }
        let destroy_stream = || {
            // SAFETY: the capture stream is ours, its capture ended (or
            // never began) and nothing ran on it; not used again.
            let r = unsafe { d.stream_destroy(handle) };
            if let Err(e) = ctx.check(Call::StreamDestroy, r) {
                ctx.record_teardown(e);
            }
        };
        // A panic inside a call below (a `tracing` layer, a user backend)
        // still destroys the capture stream: nothing ran on it.
        let stream_guard = OnUnwind::new(destroy_stream);
        // SAFETY: the capture stream is ours, live, not capturing and
        // reached by no one else (the capture ends below on every path).
        let r = unsafe { d.stream_begin_capture(handle) };
        if let Err(e) = ctx.check(Call::StreamBeginCapture, r) {
            stream_guard.disarm();
            destroy_stream();
            return Err(e);
        }
        // SAFETY: as `Stream::enqueue`: the batch was checked (F2, F3, F9),
        // and what it names is borrowed for 'a by the graph and owned host
        // buffers stay with it; captured, it does not run now.
        let copied = unsafe { d.fabric_copy_batch(handle, list, 0) };
        // SAFETY: this stream is capturing (begun above).
        let ended = unsafe { d.stream_end_capture(handle) };
        stream_guard.disarm();
        // The graph is ours from here: a panic inside the stream's destroy
        // or the instantiate below destroys it (never launched).
        let graph = ended.ok();
        let destroy_graph = || {
            if let Some(graph) = graph {
                // SAFETY: the graph is ours and not used again.
                let r = unsafe { d.graph_destroy(graph) };
                if let Err(e) = ctx.check(Call::GraphDestroy, r) {
                    ctx.record_teardown(e);
                }
            }
        };
        let graph_guard = OnUnwind::new(destroy_graph);
        destroy_stream();
        let graph = match ctx.check(Call::StreamEndCapture, ended) {
            Ok(g) => g,
            Err(e) => {
                graph_guard.disarm();
                return Err(e);
            }
        };
        if let Err(code) = copied {
            graph_guard.disarm();
            destroy_graph();
            return Err(fabric_copy_error(ctx, code));
        }
        // SAFETY: the graph is ours and live.
        let exec = match ctx.check(Call::GraphInstantiate, unsafe {
            d.graph_instantiate(graph)
        }) {
            Ok(e) => e,
            Err(e) => {
                graph_guard.disarm();
                destroy_graph();
                return Err(e);
            }
        };
        graph_guard.disarm();
        // F8: from now until the graph is dropped, its ids stay bound (an
        // unbind is refused before the driver, `Error::UnbindUnderGraph`).
        let pin = crate::ledger::holds::pin_for_graph(&keep.endpoints);
        Ok(CopyGraph {
            stream: self,
            graph,
            exec,
            pin,
            keep,
            host,
            last: None,
            watched,
            _borrow: PhantomData,
        })
    }
}

impl CopyGraph<'_> {
    /// Launches the graph on its stream (`cuGraphLaunch`): its copies run
    /// when the stream reaches them, as an enqueued batch's do. The token
    /// borrows the graph until it is waited or dropped.
    ///
    /// # Errors
    /// [`Error::CopyPeerNotBound`] for an op into a peer outside what the
    /// ranks' last agreement said it bound (a close or a new agreement
    /// since the capture, R13.5), before the driver; [`Error::Driver`] from
    /// the launch; nothing was enqueued then.
    pub fn launch(&mut self) -> Result<InFlight<'_>> {
        self.check_peers()?;
        let (stream, keep, last) = (self.stream, &self.keep, &mut self.last);
        let ctx = &stream.inner.ctx;
        // A panic inside the launch (a `tracing` layer) comes after the
        // driver took it: recorded all the same, so `received`, an unbind's
        // settle and the drop wait for it (F4).
        let taken = OnUnwind::new(|| *last = Some(stream.inner.record(keep.clone())));
        // SAFETY: F8: every endpoint the copy nodes name is borrowed by the
        // graph for its life, ready and bound (checked at capture, F9); the
        // host buffers are the graph's, at the addresses captured; the
        // record made below keeps the memory and ids in flight (F4).
        let r = unsafe { ctx.driver().graph_launch(self.exec, stream.inner.handle) };
        taken.disarm();
        ctx.check(Call::GraphLaunch, r)?;
        let seq = self.stream.inner.record(self.keep.clone());
        self.last = Some(seq);
        Ok(InFlight::new(self.stream, None, seq))
    }

    /// The graph's ops on endpoints that reach peers, checked again where
    /// what the peers bound was recorded anew since (a close, another
    /// agreement): [`Error::CopyPeerNotBound`] for an op outside it (R13.5).
    fn check_peers(&mut self) -> Result<()> {
        for w in &mut self.watched {
            let Some((range, id)) = self.keep.endpoints.get(w.at) else {
                continue;
            };
            let now = range.bindings_gen();
            if now == w.generation {
                continue;
            }
            let slot = range.slot(*id);
            for &(op, offset, size) in &w.ops {
                if let Some(p) = outside_peers(&slot, offset, size) {
                    return Err(Error::CopyPeerNotBound {
                        op,
                        id: *id,
                        offset,
                        size,
                        peer: Box::new(p.clone()),
                    });
                }
            }
            w.generation = now;
        }
        Ok(())
    }

    /// The host buffers given to [`CopyBatch::put_host`], in order.
    pub fn sent(&self) -> &[Vec<u8>] {
        self.host.as_deref().map_or(&[], |h| &h.sent)
    }

    /// The buffers [`CopyBatch::get_host`] fills, in order, as the last
    /// launch left them. A launch whose token was forgotten rather than
    /// waited may still write them: the stream is synchronized first then,
    /// so the bytes lent never change while they are borrowed.
    ///
    /// # Errors
    /// [`Error::Driver`] from that synchronization (an asynchronous fault);
    /// nothing is lent then.
    pub fn received(&self) -> Result<Vec<&[u8]>> {
        if let Some(seq) = self.last
            && !self.stream.inner.has_passed(seq)
        {
            self.stream.synchronize()?;
        }
        let received = self.host.as_deref().map_or(&[][..], |h| &h.received);
        Ok(received.iter().map(|(_, b)| b.as_slice()).collect())
    }
}

impl Drop for CopyGraph<'_> {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let ctx = &self.stream.inner.ctx;
            let end = crate::unwind::completing(|| self.stream.synchronize());
            if !end.done {
                // A launch may still run: its host buffers stay, for good.
                std::mem::forget(self.host.take());
            }
            let d = ctx.driver();
            let (graph, pin, eps) = (self.graph, self.pin, &self.keep.endpoints);
            // A panic inside a destroy below (a `tracing` layer, a user
            // backend) comes after the driver destroyed: what is left is
            // still destroyed, and the ids unpinned (F8: else every later
            // unbind of them is refused), while it unwinds.
            let unpin = OnUnwind::new(|| crate::ledger::holds::unpin_graph(eps, pin));
            let destroy_graph = || {
                // SAFETY: the graph is this one's own; its executable form
                // is destroyed (or its destroy was made); not used again.
                let r = unsafe { d.graph_destroy(graph) };
                if let Err(e) = ctx.check(Call::GraphDestroy, r) {
                    ctx.record_teardown(e);
                }
            };
            let graph_guard = OnUnwind::new(destroy_graph);
            // SAFETY: the executable graph is this one's own; nothing
            // launches it after.
            let r = unsafe { d.graph_exec_destroy(self.exec) };
            if let Err(e) = ctx.check(Call::GraphExecDestroy, r) {
                ctx.record_teardown(e);
            }
            graph_guard.disarm();
            destroy_graph();
            unpin.disarm();
            // Nothing launches it again: its ids may be unbound.
            crate::ledger::holds::unpin_graph(eps, pin);
            if let Err(e) = end.resume() {
                ctx.record_teardown(e);
            }
        });
    }
}

static_assertions::assert_impl_all!(CopyGraph<'static>: Send, Sync);

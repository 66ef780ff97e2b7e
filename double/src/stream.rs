//! Streams, `cuMemcpyAsync` and `cuMemcpyBatchAsync_v2` (every version the
//! double pretends; the batch `NOT_SUPPORTED` before 12.8): the model's
//! streams behind `CUstream` values, the copies in stream order.
//! Each needs a current context, as on a real driver; `cuStreamCreate`
//! makes its stream on the current context's device. The copies, the
//! query and the synchronize, which a backend may make with no context
//! current (the stream names its own), run in the stream's context then,
//! as CCCL reports of recent drivers (NVIDIA/cccl#9615), or, switched to
//! a stricter driver (`cuDoubleStrictStreams`), answer `INVALID_CONTEXT`;
//! either is counted on the calling thread (`cuDoubleThreadCounts`), not
//! logged.
//!
//! `cuMemcpyAsync` carries no hint of where a pointer lives: the double
//! decides as unified addressing does ([`pointer`]). An address in a virtual
//! range this process reserved is CUDA's (device or mapped host-NUMA
//! memory), whatever the model then says of it; any other is host memory
//! of this process, which the caller vouched for (`cuda.h`: both ranges
//! valid for `ByteCount` bytes until the stream passed the copy), and
//! which the model reads or writes when the stream reaches the copy
//! (`MemHint::Host`). The double itself never dereferences either.

use std::ffi::{c_uint, c_ulonglong};

use cuda_endpoints::Device;
use cuda_endpoints::driver::{MemcpyOp, MemcpyOps, Pointer};

use crate::abi::*;
use crate::ffi::{
    CU_EVENT_DISABLE_TIMING, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CUevent, CUgraph, CUgraphExec, CUmemcpyAttributes,
    CUstreamCaptureMode,
};
use crate::state::{self, INVALID_VALUE, NOT_READY};
use crate::{model, out, read};

/// `CU_STREAM_DEFAULT`, `CU_STREAM_NON_BLOCKING`.
const STREAM_FLAGS: c_uint = 1;

fn ctx(call: &str) -> Result<i32, CUresult> {
    state::with(|d| d.current_device(call))
}

/// [`ctx`] for the calls a backend may make with no context current: the
/// copies (`copy`), the stream's query and synchronize.
fn stream_ctx(call: &str, stream: CUstream, copy: bool) -> Result<(), CUresult> {
    state::with(|d| d.stream_context(call, handle(stream), copy))
}

/// A `CUstream` as the model's handle (its address value; never dereferenced).
pub(crate) fn handle(stream: CUstream) -> u64 {
    stream.addr() as u64
}

/// A model handle (graph, executable graph, event) as the opaque pointer
/// the C API hands out (never dereferenced).
fn opaque(h: u64) -> Result<*mut std::ffi::c_void, CUresult> {
    Ok(std::ptr::without_provenance_mut(
        usize::try_from(h).map_err(|_| state::UNKNOWN)?,
    ))
}

/// `ptr` for `len` bytes as unified addressing sees it: device memory (no
/// hint: the model resolves it, or refuses it) inside a range this process
/// reserved, else host memory of this process; a null host pointer with
/// bytes to move is `INVALID_VALUE`.
fn pointer(ptr: CUdeviceptr, len: u64) -> Result<Pointer, CUresult> {
    if state::with(|d| d.in_device_va(ptr, len)) {
        Ok(Pointer::device(ptr))
    } else if ptr == 0 && len > 0 {
        Err(INVALID_VALUE)
    } else {
        Ok(Pointer::host(ptr))
    }
}

/// The most copies of one `cuMemcpyBatchAsync` the double reads (a
/// longer list is refused rather than allocated for).
const MAX_BATCH: usize = 1 << 20;

/// The arrays of a `cuMemcpyBatchAsync` as the model's copies, checked as
/// cuda.h states: `count` copies; `numAttrs` (at least 1, at most `count`)
/// attributes, each with a valid `srcAccessOrder` (the double takes only
/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`, the one the backend sends), applied
/// from `attrsIdxs[k]`, which starts at 0 and rises below `count`.
#[allow(clippy::too_many_arguments)]
fn batch(
    dsts: *mut CUdeviceptr,
    srcs: *mut CUdeviceptr,
    sizes: *mut size_t,
    count: size_t,
    attrs: *mut CUmemcpyAttributes,
    attrs_idxs: *mut size_t,
    num_attrs: size_t,
) -> Result<MemcpyOps, CUresult> {
    if count == 0 || count > MAX_BATCH || num_attrs == 0 || num_attrs > count {
        return Err(INVALID_VALUE);
    }
    let mut last = None;
    for k in 0..num_attrs {
        // `cuda.h`: `attrs` and `attrsIdxs` hold `numAttrs` entries (read only).
        let a = read(attrs.cast_const().wrapping_add(k))?;
        let at = read(attrs_idxs.cast_const().wrapping_add(k))?;
        let rising = match last {
            None => at == 0,
            Some(l) => at > l,
        };
        if a.srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || !rising || at >= count {
            return Err(INVALID_VALUE);
        }
        last = Some(at);
    }
    let mut copies = MemcpyOps::with_capacity(count);
    for i in 0..count {
        // `cuda.h`: `dsts`, `srcs` and `sizes` hold `count` entries (read only).
        let size = read(sizes.cast_const().wrapping_add(i))? as u64;
        let dst = pointer(read(dsts.cast_const().wrapping_add(i))?, size)?;
        let src = pointer(read(srcs.cast_const().wrapping_add(i))?, size)?;
        copies.push(MemcpyOp { dst, src, size });
    }
    Ok(copies)
}

crate::abi::exports! {
    [13000] fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) {
        let dev = ctx("cuStreamCreate")?;
        if flags & !STREAM_FLAGS != 0 || ph_stream.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the model only simulates; the double is its sole user.
        let s = model(|m| unsafe { m.stream_create(Device(dev)) })?;
        state::with(|d| d.streams.insert(s, dev));
        let s = usize::try_from(s).map_err(|_| state::UNKNOWN)?;
        out(ph_stream, std::ptr::without_provenance_mut(s))
    }
    [13000] fn cuStreamDestroy_v2(h_stream: CUstream) {
        ctx("cuStreamDestroy")?;
        // SAFETY: as above; work still pending runs now, host operands as the
        // caller of the copy vouched.
        model(|m| unsafe { m.stream_destroy(handle(h_stream)) })?;
        state::with(|d| d.streams.remove(&handle(h_stream)));
        Ok(())
    }
    // Needs no current context: the stream names its own.
    [13000] fn cuStreamGetCtx(h_stream: CUstream, pctx: *mut CUcontext) {
        let dev = state::with(|d| d.streams.get(&handle(h_stream)).copied())
            .ok_or(state::INVALID_HANDLE)?;
        out(pctx, state::context_handle(dev) as CUcontext)
    }
    [13000] fn cuStreamSynchronize(h_stream: CUstream) {
        stream_ctx("cuStreamSynchronize", h_stream, false)?;
        // SAFETY: as above.
        model(|m| unsafe { m.stream_synchronize(handle(h_stream)) })
    }
    [13000] fn cuStreamQuery(h_stream: CUstream) {
        stream_ctx("cuStreamQuery", h_stream, false)?;
        // SAFETY: as above.
        if model(|m| unsafe { m.stream_query(handle(h_stream)) })? {
            Ok(())
        } else {
            Err(NOT_READY)
        }
    }
    [13000] fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, byte_count: size_t, h_stream: CUstream) {
        stream_ctx("cuMemcpyAsync", h_stream, true)?;
        let size = byte_count as u64;
        let (dst, src) = (pointer(dst, size)?, pointer(src, size)?);
        // SAFETY: as above; a host pointer is the caller's word (`cuda.h`:
        // both ranges valid until the stream passed the copy).
        model(|m| unsafe { m.memcpy_async(dst, src, size, handle(h_stream)) })
    }
    // The 13.0 prototype (cuda.h maps `cuMemcpyBatchAsync` to it); 12.8's
    // `cuMemcpyBatchAsync` (with `failIdx`) is not exported: the backend
    // never resolves it. One attribute entry per batch is what the backend
    // sends; the double accepts any valid list.
    [13000] fn cuMemcpyBatchAsync_v2(
        dsts: *mut CUdeviceptr,
        srcs: *mut CUdeviceptr,
        sizes: *mut size_t,
        count: size_t,
        attrs: *mut CUmemcpyAttributes,
        attrs_idxs: *mut size_t,
        num_attrs: size_t,
        h_stream: CUstream,
    ) {
        stream_ctx("cuMemcpyBatchAsync", h_stream, true)?;
        if state::with(|d| d.version) < 12080 {
            return Err(state::NOT_SUPPORTED);
        }
        let copies = batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs)?;
        // SAFETY: as `cuMemcpyAsync`, for every copy.
        model(|m| unsafe { m.memcpy_batch_async(copies, handle(h_stream)) })
    }
    [13000] fn cuStreamBeginCapture_v2(h_stream: CUstream, mode: CUstreamCaptureMode) {
        ctx("cuStreamBeginCapture")?;
        // The backend captures thread-locally; other modes are not simulated.
        if mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL {
            return Err(state::NOT_SUPPORTED);
        }
        // SAFETY: as above.
        model(|m| unsafe { m.stream_begin_capture(handle(h_stream)) })
    }
    [13000] fn cuStreamEndCapture(h_stream: CUstream, ph_graph: *mut CUgraph) {
        ctx("cuStreamEndCapture")?;
        if ph_graph.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let g = model(|m| unsafe { m.stream_end_capture(handle(h_stream)) })?;
        out(ph_graph, opaque(g)?)
    }
    [13000] fn cuGraphInstantiateWithFlags(ph_graph_exec: *mut CUgraphExec, h_graph: CUgraph, flags: c_ulonglong) {
        ctx("cuGraphInstantiateWithFlags")?;
        if flags != 0 || ph_graph_exec.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let e = model(|m| unsafe { m.graph_instantiate(handle(h_graph)) })?;
        out(ph_graph_exec, opaque(e)?)
    }
    [13000] fn cuGraphLaunch(h_graph_exec: CUgraphExec, h_stream: CUstream) {
        ctx("cuGraphLaunch")?;
        // SAFETY: as above; the copy nodes' host operands as the caller of
        // the launch vouched (F8).
        model(|m| unsafe { m.graph_launch(handle(h_graph_exec), handle(h_stream)) })
    }
    [13000] fn cuGraphExecDestroy(h_graph_exec: CUgraphExec) {
        ctx("cuGraphExecDestroy")?;
        // SAFETY: as above.
        model(|m| unsafe { m.graph_exec_destroy(handle(h_graph_exec)) })
    }
    [13000] fn cuGraphDestroy(h_graph: CUgraph) {
        ctx("cuGraphDestroy")?;
        // SAFETY: as above.
        model(|m| unsafe { m.graph_destroy(handle(h_graph)) })
    }
    [13000] fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint) {
        let dev = ctx("cuEventCreate")?;
        if flags & !CU_EVENT_DISABLE_TIMING != 0 || ph_event.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let e = model(|m| unsafe { m.event_create(Device(dev)) })?;
        out(ph_event, opaque(e)?)
    }
    [13000] fn cuEventRecord(h_event: CUevent, h_stream: CUstream) {
        ctx("cuEventRecord")?;
        // SAFETY: as above.
        model(|m| unsafe { m.event_record(handle(h_event), handle(h_stream)) })
    }
    [13000] fn cuEventQuery(h_event: CUevent) {
        ctx("cuEventQuery")?;
        // SAFETY: as above; work the event waits for may run now.
        if model(|m| unsafe { m.event_query(handle(h_event)) })? {
            Ok(())
        } else {
            Err(NOT_READY)
        }
    }
    [13000] fn cuEventSynchronize(h_event: CUevent) {
        ctx("cuEventSynchronize")?;
        // SAFETY: as above.
        model(|m| unsafe { m.event_synchronize(handle(h_event)) })
    }
    [13000] fn cuEventDestroy_v2(h_event: CUevent) {
        ctx("cuEventDestroy")?;
        // SAFETY: as above.
        model(|m| unsafe { m.event_destroy(handle(h_event)) })
    }
}

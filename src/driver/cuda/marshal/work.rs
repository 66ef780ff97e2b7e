//! The calls on streams and what runs on them, marshalled (SPEC F1-F9):
//! streams, the fabric copy, `cuMemcpyAsync` and `cuMemcpyBatchAsync`,
//! captures and graphs, events. A child of `marshal` (the endpoint and
//! memory calls, and the conversions both use), whose conventions it
//! follows.

use std::ffi::c_void;

use smallvec::SmallVec;

use super::super::Cuda;
use super::super::context::Cx;
use super::super::ffi::*;
use super::{location, sz};
use crate::driver::{
    Call, Code, CopyOps, Device, DriverResult, Location, MemHint, MemcpyOps, Operand, Pointer,
};

// ---- streams and the data path (SPEC F1-F9) ----

/// A `CUstream` as the boundary's `u64`, and back: the address the driver
/// gave, with its provenance exposed (the pointer is never dereferenced here).
fn stream_of(stream: u64) -> CUstream {
    std::ptr::with_exposed_provenance_mut(sz(stream))
}

/// `locHint` of a pointer operand.
fn hint(h: MemHint) -> CUmemLocation {
    match h {
        MemHint::None => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_INVALID,
            id: 0,
        },
        MemHint::Device(d) => location(Location::Device(d)),
        MemHint::Host => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        MemHint::HostNuma(n) => location(Location::HostNuma(n)),
    }
}

/// `CUfabricCpyOperand`: every byte of the union member in use set.
pub(in crate::driver::cuda) fn operand(o: &Operand) -> CUfabricCpyOperand {
    match *o {
        Operand::Pointer(Pointer { ptr, hint: h }) => CUfabricCpyOperand {
            type_: CU_FABRIC_COPY_OPERAND_TYPE_POINTER,
            op: CUfabricCpyOperandOp {
                ptr: CUfabricCpyOperandPtr {
                    ptr,
                    locHint: hint(h),
                },
            },
        },
        Operand::LogicalEndpoint { id, offset } => CUfabricCpyOperand {
            type_: CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT,
            op: CUfabricCpyOperandOp {
                le: CUfabricCpyOperandLe { id, offset },
            },
        },
    }
}

pub(in crate::driver::cuda) unsafe fn stream_create(c: &Cuda, dev: Device) -> DriverResult<u64> {
    // SAFETY: `cuStreamCreate` as declared in `ffi`; `out` is a live
    // out-pointer; the flag asks for a non-blocking stream.
    let s = unsafe {
        make(
            c,
            Call::StreamCreate,
            c.sym.cuStreamCreate,
            Cx::On(dev),
            stream_destroy,
            |f, out| f(out, CU_STREAM_NON_BLOCKING),
        )
    }?;
    if s.is_null() {
        // Never hand out the legacy NULL stream (F6), whatever a driver says.
        return Err(Code::UNKNOWN);
    }
    Ok(s.expose_provenance() as u64)
}

/// Runs a call that writes a new handle (stream, event, graph, executable
/// graph) into its out-pointer, the caller's alone to destroy. `run`
/// traces the success before it returns: a `tracing` layer that panics
/// there would lose the handle, so one written is destroyed by `destroy`
/// while that panic unwinds (`OnUnwind`: a panic of the destroy is
/// caught, the first goes on).
///
/// # Safety
/// `f` is the entry point `body` calls as its C prototype says; `destroy`
/// destroys what it made.
unsafe fn make<F: Copy>(
    c: &Cuda,
    call: Call,
    f: Option<F>,
    cx: Cx,
    destroy: unsafe fn(&Cuda, u64) -> DriverResult<()>,
    mut body: impl FnMut(F, *mut *mut c_void) -> CUresult,
) -> DriverResult<*mut c_void> {
    let made = std::cell::Cell::new(std::ptr::null_mut::<c_void>());
    let undo = crate::unwind::OnUnwind::new(|| {
        if let Ok(h) = handle_of(made.get()) {
            // SAFETY: `h` was just made by this call and never reached the
            // caller (the panic came before the return): no one else holds
            // it, and it is not used again.
            let _ = unsafe { destroy(c, h) };
        }
    });
    let r = c.run(call, f, cx, |f| {
        let mut out = std::ptr::null_mut();
        let rc = body(f, &mut out);
        if rc == CUDA_SUCCESS {
            made.set(out);
        }
        rc
    });
    undo.disarm();
    r.map(|()| made.get())
}

pub(in crate::driver::cuda) unsafe fn stream_destroy(c: &Cuda, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuStreamDestroy_v2;
    // SAFETY: `f` is `cuStreamDestroy_v2`; the caller's contract says the
    // stream is its own and live.
    c.run(Call::StreamDestroy, f, Cx::Current, |f| unsafe {
        f(stream_of(stream))
    })
}

pub(in crate::driver::cuda) unsafe fn stream_synchronize(
    c: &Cuda,
    stream: u64,
) -> DriverResult<()> {
    let (f, s) = (c.sym.cuStreamSynchronize, stream_of(stream));
    // SAFETY: `f` is `cuStreamSynchronize`; the stream is live (contract).
    c.run(Call::StreamSynchronize, f, Cx::Stream(s), |f| unsafe {
        f(s)
    })
}

pub(in crate::driver::cuda) unsafe fn stream_query(c: &Cuda, stream: u64) -> DriverResult<bool> {
    let (f, s) = (c.sym.cuStreamQuery, stream_of(stream));
    // SAFETY: `f` is `cuStreamQuery`; the stream is live (contract).
    match c.run(Call::StreamQuery, f, Cx::Stream(s), |f| unsafe { f(s) }) {
        Ok(()) => Ok(true),
        Err(code) if code == Code::NOT_READY => Ok(false),
        Err(code) => Err(code),
    }
}

pub(in crate::driver::cuda) unsafe fn fabric_copy_batch(
    c: &Cuda,
    stream: u64,
    ops: CopyOps,
    flags: u64,
) -> DriverResult<()> {
    // The C list beside the typed one: as many ops inline as `CopyOps`
    // holds, so a batch of a few copies allocates nothing here either.
    let mut list: SmallVec<[CUDA_FABRIC_COPY_BATCH_OP; CopyOps::INLINE]> = ops
        .iter()
        .map(|op| CUDA_FABRIC_COPY_BATCH_OP {
            src: operand(&op.src),
            dst: operand(&op.dst),
            size: sz(op.size),
            flags: 0,
        })
        .collect();
    let (n, buf) = (list.len(), list.as_mut_ptr());
    let (f, s) = (c.sym.cuFabricCpyBatchAsync, stream_of(stream));
    // SAFETY: `f` is `cuFabricCpyBatchAsync` (absent before 13.5: `run`
    // answers NOT_SUPPORTED without a call); `buf` holds `n` initialised
    // ops and lives until the call returned (the driver copies the list
    // before it returns: cuda.h); the operands are the caller's contract.
    c.run(Call::FabricCpyBatchAsync, f, Cx::Stream(s), |f| unsafe {
        f(n, buf, flags, s)
    })
}

pub(in crate::driver::cuda) unsafe fn memcpy_async(
    c: &Cuda,
    dst: Pointer,
    src: Pointer,
    size: u64,
    stream: u64,
) -> DriverResult<()> {
    let (f, s) = (c.sym.cuMemcpyAsync, stream_of(stream));
    // SAFETY: `f` is `cuMemcpyAsync`; the addresses are passed on, never
    // dereferenced here; their validity is the caller's contract.
    c.run(Call::MemcpyAsync, f, Cx::Stream(s), |f| unsafe {
        f(dst.ptr, src.ptr, sz(size), s)
    })
}

/// The one attribute of every copy of a `cuMemcpyBatchAsync`: the source
/// read in stream order (as `cuMemcpyAsync` reads it: the portable path's
/// sources may be written by work enqueued before), no location hints
/// (`CU_MEM_LOCATION_TYPE_INVALID`: the driver reads them only for managed
/// or pageable memory, which the batch never names), no flags.
const STREAM_ORDERED: CUmemcpyAttributes = CUmemcpyAttributes {
    srcAccessOrder: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
    srcLocHint: CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_INVALID,
        id: 0,
    },
    dstLocHint: CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_INVALID,
        id: 0,
    },
    flags: CU_MEMCPY_FLAG_DEFAULT,
};

/// One C array of a `cuMemcpyBatchAsync`.
type Inline<T> = SmallVec<[T; MemcpyOps::INLINE]>;

pub(in crate::driver::cuda) unsafe fn memcpy_batch_async(
    c: &Cuda,
    copies: MemcpyOps,
    stream: u64,
) -> DriverResult<()> {
    if copies.is_empty() {
        // `numAttrs` (1) may not exceed `count`: the driver's answer, without the call.
        return Err(Code::INVALID_VALUE);
    }
    // The three C arrays inline up to `MemcpyOps::INLINE` copies, as the
    // list they come from: a batch of a few copies allocates nothing.
    let mut dsts: Inline<CUdeviceptr> = copies.iter().map(|o| o.dst.ptr).collect();
    let mut srcs: Inline<CUdeviceptr> = copies.iter().map(|o| o.src.ptr).collect();
    let mut sizes: Inline<usize> = copies.iter().map(|o| sz(o.size)).collect();
    let mut attrs = [STREAM_ORDERED];
    let mut attrs_idxs = [0usize];
    let (f, s) = (c.sym.cuMemcpyBatchAsync_v2, stream_of(stream));
    // SAFETY: `f` is `cuMemcpyBatchAsync_v2` (the 13.0 prototype, which
    // `ffi` declares and the ABI check compares with cuda.h; absent before
    // 13.0: `run` answers NOT_SUPPORTED without a call). `dsts`, `srcs` and
    // `sizes` hold `count` entries, `attrs` and `attrs_idxs` one each
    // (`attrsIdxs[0]` is 0, as cuda.h requires), all alive until the call
    // returned (the driver reads them during the call; none is written);
    // the addresses are passed on, never dereferenced here, and their
    // validity is the caller's contract.
    c.run(Call::MemcpyBatchAsync, f, Cx::Stream(s), |f| unsafe {
        f(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            copies.len(),
            attrs.as_mut_ptr(),
            attrs_idxs.as_mut_ptr(),
            attrs.len(),
            s,
        )
    })
}

/// A handle (`CUgraph`, `CUgraphExec`, `CUevent`) as the pointer the C
/// API takes back (its address value; never dereferenced here).
fn opaque(h: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(sz(h))
}

/// A handle the driver wrote, as an integer; null is `UNKNOWN` (a driver
/// that answered success must have made one).
fn handle_of(p: *mut c_void) -> DriverResult<u64> {
    if p.is_null() {
        return Err(Code::UNKNOWN);
    }
    Ok(p.expose_provenance() as u64)
}

pub(in crate::driver::cuda) unsafe fn stream_begin_capture(
    c: &Cuda,
    stream: u64,
) -> DriverResult<()> {
    let f = c.sym.cuStreamBeginCapture_v2;
    // SAFETY: `f` is `cuStreamBeginCapture_v2`; the stream is live (contract).
    c.run(Call::StreamBeginCapture, f, Cx::Current, |f| unsafe {
        f(stream_of(stream), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    })
}

pub(in crate::driver::cuda) unsafe fn stream_end_capture(
    c: &Cuda,
    stream: u64,
) -> DriverResult<u64> {
    // SAFETY: `cuStreamEndCapture`; `out` is a live out-pointer; the
    // stream is live and capturing (contract).
    let g = unsafe {
        make(
            c,
            Call::StreamEndCapture,
            c.sym.cuStreamEndCapture,
            Cx::Current,
            graph_destroy,
            |f, out| f(stream_of(stream), out),
        )
    }?;
    handle_of(g)
}

pub(in crate::driver::cuda) unsafe fn graph_instantiate(c: &Cuda, graph: u64) -> DriverResult<u64> {
    // SAFETY: `cuGraphInstantiateWithFlags`; `out` is a live out-pointer;
    // the graph is live (contract); flags 0.
    let e = unsafe {
        make(
            c,
            Call::GraphInstantiate,
            c.sym.cuGraphInstantiateWithFlags,
            Cx::Current,
            graph_exec_destroy,
            |f, out| f(out, opaque(graph), 0),
        )
    }?;
    handle_of(e)
}

pub(in crate::driver::cuda) unsafe fn graph_launch(
    c: &Cuda,
    exec: u64,
    stream: u64,
) -> DriverResult<()> {
    let f = c.sym.cuGraphLaunch;
    // SAFETY: `f` is `cuGraphLaunch`; both handles are live and the
    // operands of its copies stay valid (contract, F8).
    c.run(Call::GraphLaunch, f, Cx::Current, |f| unsafe {
        f(opaque(exec), stream_of(stream))
    })
}

pub(in crate::driver::cuda) unsafe fn graph_exec_destroy(c: &Cuda, exec: u64) -> DriverResult<()> {
    let f = c.sym.cuGraphExecDestroy;
    // SAFETY: `f` is `cuGraphExecDestroy`; the handle is the caller's own.
    c.run(Call::GraphExecDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(exec))
    })
}

pub(in crate::driver::cuda) unsafe fn graph_destroy(c: &Cuda, graph: u64) -> DriverResult<()> {
    let f = c.sym.cuGraphDestroy;
    // SAFETY: `f` is `cuGraphDestroy`; the handle is the caller's own.
    c.run(Call::GraphDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(graph))
    })
}

pub(in crate::driver::cuda) unsafe fn event_create(c: &Cuda, dev: Device) -> DriverResult<u64> {
    // SAFETY: `cuEventCreate`; `out` is a live out-pointer.
    let e = unsafe {
        make(
            c,
            Call::EventCreate,
            c.sym.cuEventCreate,
            Cx::On(dev),
            event_destroy,
            |f, out| f(out, CU_EVENT_DISABLE_TIMING),
        )
    }?;
    handle_of(e)
}

pub(in crate::driver::cuda) unsafe fn event_record(
    c: &Cuda,
    event: u64,
    stream: u64,
) -> DriverResult<()> {
    let f = c.sym.cuEventRecord;
    // SAFETY: `f` is `cuEventRecord`; both handles are live (contract).
    c.run(Call::EventRecord, f, Cx::Current, |f| unsafe {
        f(opaque(event), stream_of(stream))
    })
}

pub(in crate::driver::cuda) unsafe fn event_query(c: &Cuda, event: u64) -> DriverResult<bool> {
    let f = c.sym.cuEventQuery;
    // SAFETY: `f` is `cuEventQuery`; the event is live (contract).
    match c.run(Call::EventQuery, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    }) {
        Ok(()) => Ok(true),
        Err(code) if code == Code::NOT_READY => Ok(false),
        Err(code) => Err(code),
    }
}

pub(in crate::driver::cuda) unsafe fn event_synchronize(c: &Cuda, event: u64) -> DriverResult<()> {
    let f = c.sym.cuEventSynchronize;
    // SAFETY: `f` is `cuEventSynchronize`; the event is live (contract).
    c.run(Call::EventSynchronize, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    })
}

pub(in crate::driver::cuda) unsafe fn event_destroy(c: &Cuda, event: u64) -> DriverResult<()> {
    let f = c.sym.cuEventDestroy_v2;
    // SAFETY: `f` is `cuEventDestroy_v2`; the event is the caller's own.
    c.run(Call::EventDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    })
}

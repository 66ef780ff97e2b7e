//! The data path across OS processes: how `cuFabricCpyBatchAsync`,
//! `cuMemcpyAsync`, `cuMemcpyBatchAsync` and the stream calls that complete
//! them cross the wire with their host bytes.
//!
//! A host pointer of a client means nothing in the server's OS process, so
//! the generic call path refuses these calls (`calls::client_side_only`)
//! and they go as [`Request::HostCopy`] / [`Request::HostSync`] instead:
//! - at enqueue, the client snapshots the bytes of every host source (a
//!   pointer hinted `MemHint::Host`) into the request — the caller of the
//!   raw call vouched that they are readable (the row's contract); the model
//!   keeps them with the op and uses them when the stream reaches it;
//! - a host destination is remembered by address in the model's stream;
//!   when a synchronize, query or destroy completes the op, its bytes come
//!   back in [`Reply::HostDone`] and the client writes them to the address
//!   — writable until then by the same contract — before the call returns.
//!
//! Both directions are bounded by one frame, and the client refuses what
//! would not fit before it sends anything (`CUDA_ERROR_INVALID_VALUE`, the
//! connection stays): at most [`MAX_BATCH_OPS`] ops per batch and
//! [`MAX_MEMORY_IO`] host bytes each way per call. The model refuses to
//! keep more host-destination bytes in flight per stream than one reply
//! carries, counting each write's address and length
//! (`copy::MAX_REMOTE_HOST_BYTES`: `OUT_OF_MEMORY` until a synchronize
//! hands bytes back).

use super::Remote;
use super::calls::WireCall;
use super::wire::{MAX_BATCH_OPS, MAX_MEMORY_IO, Reply, Request};
use crate::Model;
use crate::copy::{MAX_REMOTE_HOST_BYTES, host_write_charge};
use crate::driver::{Call, Code, CopyOps, DriverResult, MemHint, MemcpyOps, Operand, Pointer};

/// The bytes of host memory at `ptr`.
///
/// # Safety
/// `[ptr, ptr+len)` is readable host memory of this process.
unsafe fn snapshot(ptr: u64, len: u64) -> DriverResult<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| Code::INVALID_VALUE)?;
    let mut out = vec![0u8; len];
    // SAFETY: the caller's contract; `out` is a fresh buffer of `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::with_exposed_provenance::<u8>(usize::try_from(ptr).unwrap_or(usize::MAX)),
            out.as_mut_ptr(),
            len,
        );
    }
    Ok(out)
}

fn is_host(p: &Pointer) -> bool {
    p.hint == MemHint::Host
}

impl Remote {
    /// Sends a copy with its host source bytes.
    fn host_copy(&self, call: WireCall, staged: Vec<Option<Vec<u8>>>) -> DriverResult<()> {
        let total: usize = staged.iter().flatten().map(Vec::len).sum();
        if total > MAX_MEMORY_IO {
            // Model's choice: one frame's worth of host bytes per call.
            return Err(Code::INVALID_VALUE);
        }
        match self.request(&Request::HostCopy { call, staged }) {
            Ok(Reply::Done(r)) => r,
            Ok(other) => {
                tracing::error!(reply = ?other, "unexpected answer from the fabric");
                Err(Code::UNKNOWN)
            }
            Err(e) => Err(e.code()),
        }
    }

    /// A copy the fabric cannot carry, refused here before anything is
    /// sent (model's choice: the header is silent on limits;
    /// `INVALID_VALUE`, as for any argument the driver cannot take).
    fn too_large(what: &str, have: u64, max: u64) -> DriverResult<()> {
        tracing::warn!(
            "the model fabric refuses a copy of {have} {what}: at most {max} per call; split the batch"
        );
        Err(Code::INVALID_VALUE)
    }

    /// `cuFabricCpyBatchAsync` from this OS process.
    ///
    /// # Safety
    /// The row's contract: every pointer hinted `MemHint::Host` is host
    /// memory of this process, readable (source) or writable (destination)
    /// for `size` bytes until the stream passed the op.
    pub(super) unsafe fn fabric_copy_here(
        &self,
        stream: u64,
        ops: CopyOps,
        flags: u64,
    ) -> DriverResult<()> {
        if ops.len() > MAX_BATCH_OPS {
            return Remote::too_large("ops", ops.len() as u64, MAX_BATCH_OPS as u64);
        }
        // The bytes its host destinations send back must fit one reply,
        // even on an idle stream.
        let back: u64 = ops
            .iter()
            .filter(|op| matches!(op.dst, Operand::Pointer(p) if is_host(&p)))
            .fold(0, |n, op| n.saturating_add(host_write_charge(op.size)));
        if back > MAX_REMOTE_HOST_BYTES {
            return Remote::too_large(
                "host-destination bytes (with 16 per op)",
                back,
                MAX_REMOTE_HOST_BYTES,
            );
        }
        let mut staged = Vec::with_capacity(ops.len());
        let mut total = 0u64;
        for op in &ops {
            staged.push(match op.src {
                Operand::Pointer(p) if is_host(&p) => {
                    total = total.saturating_add(op.size);
                    if total > MAX_MEMORY_IO as u64 {
                        return Remote::too_large("host-source bytes", total, MAX_MEMORY_IO as u64);
                    }
                    // SAFETY: the caller's contract (a readable host source).
                    Some(unsafe { snapshot(p.ptr, op.size) }?)
                }
                _ => None,
            });
        }
        self.host_copy(WireCall::FabricCpyBatchAsync { stream, ops, flags }, staged)
    }

    /// `cuMemcpyAsync` from this OS process.
    ///
    /// # Safety
    /// As [`Remote::fabric_copy_here`], for `src` and `dst`.
    pub(super) unsafe fn memcpy_here(
        &self,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
    ) -> DriverResult<()> {
        if is_host(&dst) && host_write_charge(size) > MAX_REMOTE_HOST_BYTES {
            return Remote::too_large("host-destination bytes", size, MAX_REMOTE_HOST_BYTES);
        }
        let staged = if is_host(&src) {
            if size > MAX_MEMORY_IO as u64 {
                return Remote::too_large("host-source bytes", size, MAX_MEMORY_IO as u64);
            }
            // SAFETY: the caller's contract (a readable host source).
            vec![Some(unsafe { snapshot(src.ptr, size) }?)]
        } else {
            vec![None]
        };
        self.host_copy(
            WireCall::MemcpyAsync {
                dst,
                src,
                size,
                stream,
            },
            staged,
        )
    }

    /// `cuMemcpyBatchAsync` from this OS process.
    ///
    /// # Safety
    /// As [`Remote::fabric_copy_here`], for every copy's `src` and `dst`.
    pub(super) unsafe fn memcpy_batch_here(
        &self,
        copies: MemcpyOps,
        stream: u64,
    ) -> DriverResult<()> {
        if copies.len() > MAX_BATCH_OPS {
            return Remote::too_large("copies", copies.len() as u64, MAX_BATCH_OPS as u64);
        }
        let back: u64 = copies
            .iter()
            .filter(|c| is_host(&c.dst))
            .fold(0, |n, c| n.saturating_add(host_write_charge(c.size)));
        if back > MAX_REMOTE_HOST_BYTES {
            return Remote::too_large(
                "host-destination bytes (with 16 per copy)",
                back,
                MAX_REMOTE_HOST_BYTES,
            );
        }
        let mut staged = Vec::with_capacity(copies.len());
        let mut total = 0u64;
        for c in &copies {
            staged.push(if is_host(&c.src) {
                total = total.saturating_add(c.size);
                if total > MAX_MEMORY_IO as u64 {
                    return Remote::too_large("host-source bytes", total, MAX_MEMORY_IO as u64);
                }
                // SAFETY: the caller's contract (a readable host source).
                Some(unsafe { snapshot(c.src.ptr, c.size) }?)
            } else {
                None
            });
        }
        self.host_copy(WireCall::MemcpyBatchAsync { copies, stream }, staged)
    }

    /// `cuStreamSynchronize` / `cuStreamQuery` / `cuStreamDestroy` from
    /// this OS process: the host-destination bytes the stream completed are
    /// written here before the call returns.
    ///
    /// # Safety
    /// The contract of the copies enqueued on `stream`: their host
    /// destinations are writable until the stream passed them.
    pub(super) unsafe fn stream_here(&self, call: WireCall) -> DriverResult<bool> {
        match self.request(&Request::HostSync { call }) {
            Ok(Reply::HostDone { result, writes }) => {
                for (addr, bytes) in writes {
                    // SAFETY: the address is a host destination this
                    // process enqueued (the server hands back only those of
                    // this connection's streams), writable until the stream
                    // passed the op (the caller's contract); `bytes` is at
                    // most the op's size.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            std::ptr::with_exposed_provenance_mut::<u8>(
                                usize::try_from(addr).unwrap_or(usize::MAX),
                            ),
                            bytes.len(),
                        );
                    }
                }
                result
            }
            Ok(other) => {
                tracing::error!(reply = ?other, "unexpected answer from the fabric");
                Err(Code::UNKNOWN)
            }
            Err(e) => Err(e.code()),
        }
    }
}

/// The server's answer to [`Request::HostCopy`].
pub(super) fn answer_copy(me: &Model, call: WireCall, staged: Vec<Option<Vec<u8>>>) -> Reply {
    Reply::Done(match call {
        // What an honest client refuses to send, refused from any client.
        WireCall::FabricCpyBatchAsync { ops, .. } if ops.len() > MAX_BATCH_OPS => {
            Err(Code::INVALID_VALUE)
        }
        WireCall::FabricCpyBatchAsync { stream, ops, flags } => {
            me.fabric_copy_batch_staged(stream, &ops, flags, &staged)
        }
        WireCall::MemcpyAsync {
            dst,
            src,
            size,
            stream,
        } => me.memcpy_async_staged(dst, src, size, stream, &staged),
        WireCall::MemcpyBatchAsync { copies, .. } if copies.len() > MAX_BATCH_OPS => {
            Err(Code::INVALID_VALUE)
        }
        WireCall::MemcpyBatchAsync { copies, stream } => {
            me.memcpy_batch_async_staged(&copies, stream, &staged)
        }
        _ => Err(Code::NOT_SUPPORTED),
    })
}

/// The server's answer to [`Request::HostSync`].
pub(super) fn answer_sync(me: &Model, call: WireCall) -> Reply {
    let (which, stream) = match call {
        WireCall::StreamSynchronize { stream } => (Call::StreamSynchronize, stream),
        WireCall::StreamQuery { stream } => (Call::StreamQuery, stream),
        WireCall::StreamDestroy { stream } => (Call::StreamDestroy, stream),
        WireCall::EventSynchronize { event } => (Call::EventSynchronize, event),
        WireCall::EventQuery { event } => (Call::EventQuery, event),
        _ => {
            return Reply::HostDone {
                result: Err(Code::NOT_SUPPORTED),
                writes: Vec::new(),
            };
        }
    };
    let (result, writes) = me.stream_call_staged(which, stream);
    Reply::HostDone { result, writes }
}

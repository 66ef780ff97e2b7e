//! The wire: length-prefixed `postcard` frames, the requests a client sends
//! and the replies the server gives. One request, one reply, in order.
//!
//! A frame is a little-endian `u32` length followed by that many bytes of
//! `postcard`. Frames are bounded ([`MAX_FRAME`]) on both sides before any
//! byte is allocated; bytes that do not decode are a protocol error that
//! ends the connection, never a panic.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::calls::WireCall;
use crate::driver::{Code, Device};
use crate::{FabricLive, Live, ShareableKind, faults::FaultPlan};

/// The protocol version a client and server must agree on in [`Request::Hello`]
/// (3: frames of up to [`MAX_FRAME`], 2 MiB and 4 KiB).
pub const PROTOCOL: u32 = 3;

/// The largest frame either side reads or writes, bytes: room for the
/// largest request an honest client makes (a batch of [`MAX_BATCH_OPS`]
/// ops with [`MAX_MEMORY_IO`] host bytes) and the largest reply (the
/// host-destination bytes a stream may have in flight); the tests below
/// encode both.
pub const MAX_FRAME: usize = (2 << 20) + 4096;

/// The most bytes one [`Request::Read`] or [`Request::Write`] moves, and the
/// most host bytes one copy moves each way (sources sent with the request,
/// destinations handed back at the synchronize).
pub const MAX_MEMORY_IO: usize = 1 << 20;

/// The most ops of one `cuFabricCpyBatchAsync` a client sends (model's
/// choice, the header is silent): a larger batch is refused by the client
/// with `CUDA_ERROR_INVALID_VALUE` before anything is sent, and the
/// connection stays; split it.
pub const MAX_BATCH_OPS: usize = crate::copy::MAX_REMOTE_BATCH_OPS;

/// What a client asks.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// The first request of a connection: join the fabric as a new process.
    Hello {
        /// [`PROTOCOL`].
        protocol: u32,
        /// The node to run on; `None`: from `rank`, else node 0.
        node: Option<u32>,
        /// The job rank, to place the process on a node (ranks fill nodes in
        /// order, one per device).
        rank: Option<u32>,
        /// Whether the process has an IMEX channel; `None`: the fabric's default.
        imex_channel: Option<bool>,
        /// The client's OS process id, for reports.
        os_pid: u32,
    },
    /// A driver call, as the boundary's table declares it.
    Call(WireCall),
    /// This process's leak counters.
    Live,
    /// The whole fabric's leak counters.
    LiveFabric,
    /// Every rule violation on the fabric so far.
    Violations,
    /// Reads device memory mapped in this process.
    Read {
        /// Device address.
        ptr: u64,
        /// Bytes, at most [`MAX_MEMORY_IO`].
        len: u32,
    },
    /// Writes device memory mapped in this process.
    Write {
        /// Device address.
        ptr: u64,
        /// At most [`MAX_MEMORY_IO`] bytes.
        bytes: Vec<u8>,
    },
    /// Replaces the fabric's fault plan.
    SetFaults(FaultPlan),
    /// Grants or takes this process's IMEX channel.
    SetImexChannel(bool),
    /// `cuMemExportToShareableHandle` (C5).
    ExportShareable {
        /// The allocation or classic multicast handle.
        handle: u64,
        /// The handle kind.
        kind: ShareableKind,
    },
    /// `cuFabricCpyBatchAsync`, `cuMemcpyAsync` or `cuMemcpyBatchAsync`
    /// with the bytes of its host sources, snapshotted at enqueue (`data.rs`).
    HostCopy {
        /// The call (`FabricCpyBatchAsync`, `MemcpyAsync` or `MemcpyBatchAsync`).
        call: WireCall,
        /// Per op, the bytes of a host source (`None` for any other source).
        staged: Vec<Option<Vec<u8>>>,
    },
    /// `cuStreamSynchronize`, `cuStreamQuery` or `cuStreamDestroy`, whose
    /// answer carries the bytes completed for host destinations (`data.rs`).
    HostSync {
        /// The call.
        call: WireCall,
    },
    /// `cuMemImportFromShareableHandle` (C5).
    ImportShareable {
        /// The token [`Request::ExportShareable`] gave.
        token: u64,
        /// The handle kind.
        kind: ShareableKind,
    },
}

/// What the fabric answered [`Request::Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// This process's number on the fabric.
    pub pid: u64,
    /// Its node.
    pub node: u32,
    /// How many nodes the fabric has.
    pub nodes: u32,
    /// How many devices its node has.
    pub devices: u32,
    /// The device a rank placed by rank should use (its index on the node).
    pub device: Option<Device>,
    /// Whether it has an IMEX channel.
    pub imex_channel: bool,
    /// The fabric's tag, which every descriptor and fabric handle string
    /// of this fabric carries (strings of another fabric are refused).
    pub fabric: u64,
}

/// A rule violation as it crosses the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireViolation {
    /// The C name of the call.
    pub call: String,
    /// The SPEC rule.
    pub rule: String,
    /// The code answered.
    pub code: Code,
}

/// What the server answers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// Answer to [`Request::Hello`].
    Welcome(Welcome),
    /// A driver call's result: the `postcard` bytes of the call's return
    /// value, or the code.
    Call(Result<Vec<u8>, Code>),
    /// Leak counters of this process.
    Live(Live),
    /// Leak counters of the fabric.
    LiveFabric(FabricLive),
    /// Violations: the most recent ones the model keeps, and how many
    /// older ones it dropped (the log is bounded, so that this reply always
    /// fits a frame).
    Violations {
        /// The violations kept, in order.
        kept: Vec<WireViolation>,
        /// How many older ones were dropped.
        dropped: u64,
    },
    /// Bytes read, or the code.
    Bytes(Result<Vec<u8>, Code>),
    /// A handle or token, or the code.
    Handle(Result<u64, Code>),
    /// Done, or the code.
    Done(Result<(), Code>),
    /// Answer to [`Request::HostSync`]: the call's answer (`true` for
    /// done), and the host-destination bytes to write, by address.
    HostDone {
        /// The call's answer.
        result: Result<bool, Code>,
        /// `(address, bytes)` for the client to write, whatever `result`.
        writes: Vec<(u64, Vec<u8>)>,
    },
    /// The request was not understood or not allowed; the connection ends.
    Refused(String),
    /// The request could not be answered (its answer would not fit a
    /// frame); the connection stays.
    Failed(String),
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection at a frame boundary.
    Closed,
    /// The transport failed (including a timeout).
    Io(io::Error),
    /// A length above [`MAX_FRAME`].
    TooLarge(u64),
    /// Bytes that do not decode as the expected message.
    Decode(postcard::Error),
    /// A message that does not encode (a bug, not the peer's).
    Encode(postcard::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::Io(e) => write!(f, "transport: {e}"),
            FrameError::TooLarge(n) => write!(f, "frame of {n} bytes, more than {MAX_FRAME}"),
            FrameError::Decode(e) => write!(f, "undecodable frame: {e}"),
            FrameError::Encode(e) => write!(f, "unencodable message: {e}"),
        }
    }
}

/// Encodes `msg` as the body of one frame, refusing one larger than
/// [`MAX_FRAME`]; nothing is written, so a refusal leaves a connection as it was.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let bytes = postcard::to_stdvec(msg).map_err(FrameError::Encode)?;
    if bytes.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Writes `msg` as one frame.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    send_encoded(w, &encode(msg)?)
}

/// Writes a body [`encode`] made as one frame.
pub fn send_encoded(w: &mut impl Write, bytes: &[u8]) -> Result<(), FrameError> {
    if bytes.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(bytes.len() as u64));
    }
    // Checked above: the length fits a u32.
    let len = u32::try_from(bytes.len()).map_err(|_| FrameError::TooLarge(bytes.len() as u64))?;
    let mut frame = Vec::with_capacity(bytes.len() + 4);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(bytes);
    w.write_all(&frame).map_err(FrameError::Io)?;
    w.flush().map_err(FrameError::Io)
}

/// Reads one frame and decodes it as `T`.
pub fn recv<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let len = u32::from_le_bytes(len);
    let n = usize::try_from(len).unwrap_or(usize::MAX);
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(u64::from(len)));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf).map_err(FrameError::Io)?;
    postcard::from_bytes(&buf).map_err(FrameError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{CopyOp, MemHint, Operand, Pointer};

    /// The widest encoding of an op: every number at its longest varint.
    fn widest_op() -> CopyOp {
        let p = Operand::Pointer(Pointer {
            ptr: u64::MAX,
            hint: MemHint::Device(Device(i32::MIN)),
        });
        CopyOp {
            src: p,
            dst: p,
            size: u64::MAX,
        }
    }

    #[test]
    fn the_largest_batch_a_client_sends_fits_one_frame() {
        // MAX_BATCH_OPS ops at their widest, MAX_MEMORY_IO host source
        // bytes spread over all of them (each length a varint too).
        let each = MAX_MEMORY_IO / MAX_BATCH_OPS;
        let req = Request::HostCopy {
            call: WireCall::FabricCpyBatchAsync {
                stream: u64::MAX,
                ops: vec![widest_op(); MAX_BATCH_OPS].into(),
                flags: u64::MAX,
            },
            staged: vec![Some(vec![0xff; each]); MAX_BATCH_OPS],
        };
        let n = encode(&req).expect("fits a frame").len();
        assert!(n <= MAX_FRAME, "{n}");
        // One op more is what the client refuses (`MAX_BATCH_OPS`).
    }

    #[test]
    fn an_op_list_is_encoded_as_the_vec_of_its_ops_byte_for_byte() {
        use crate::driver::{CopyOps, MemcpyOp, MemcpyOps};
        // Inline (a few ops) and spilled (more): the same bytes as a `Vec`.
        for n in [0, 1, 4, 5, 64] {
            let v = vec![widest_op(); n];
            let bytes = postcard::to_stdvec(&v).unwrap();
            let ops = CopyOps::from(v);
            assert_eq!(postcard::to_stdvec(&ops).unwrap(), bytes);
            assert_eq!(postcard::from_bytes::<CopyOps>(&bytes).unwrap(), ops);
            let c = MemcpyOp {
                dst: Pointer::host(u64::MAX),
                src: Pointer::device(1),
                size: u64::MAX,
            };
            let v = vec![c; n];
            let bytes = postcard::to_stdvec(&v).unwrap();
            assert_eq!(postcard::to_stdvec(&MemcpyOps::from(v)).unwrap(), bytes);
        }
        // A length claim past the bytes that follow is an error, not a
        // reservation of that many ops.
        let claim = postcard::to_stdvec(&u64::MAX).unwrap();
        assert!(postcard::from_bytes::<CopyOps>(&claim).is_err());
    }

    #[test]
    fn the_largest_reply_of_host_bytes_fits_one_frame() {
        use crate::copy::{HOST_WRITE_OVERHEAD, MAX_REMOTE_HOST_BYTES};
        // The in-flight bound charges each write its bytes and
        // HOST_WRITE_OVERHEAD: the most writes (one byte each) and the most
        // bytes (one write) both fit, at the widest address.
        let many = (MAX_REMOTE_HOST_BYTES / (1 + HOST_WRITE_OVERHEAD)) as usize;
        let one = (MAX_REMOTE_HOST_BYTES - HOST_WRITE_OVERHEAD) as usize;
        for writes in [
            vec![(u64::MAX, vec![0xff]); many],
            vec![(u64::MAX, vec![0xff; one])],
        ] {
            let reply = Reply::HostDone {
                result: Err(Code::from_raw(u32::MAX).expect("not success")),
                writes,
            };
            let n = encode(&reply).expect("fits a frame").len();
            assert!(n <= MAX_FRAME, "{n}");
        }
        // Each write's address and length take at most the overhead charged.
        let w = postcard::to_stdvec(&(u64::MAX, vec![0u8; one])).unwrap();
        assert!(w.len() as u64 <= one as u64 + HOST_WRITE_OVERHEAD);
    }

    #[test]
    fn a_message_larger_than_a_frame_is_refused_before_a_byte_is_written() {
        let req = Request::Write {
            ptr: 0,
            bytes: vec![0; MAX_FRAME],
        };
        assert!(matches!(encode(&req), Err(FrameError::TooLarge(_))));
        let mut out = Vec::new();
        assert!(matches!(send(&mut out, &req), Err(FrameError::TooLarge(_))));
        assert!(out.is_empty());
    }

    #[test]
    fn frames_round_trip_and_bounds_hold() {
        let mut buf = Vec::new();
        send(&mut buf, &Request::Live).unwrap();
        let back: Request = recv(&mut buf.as_slice()).unwrap();
        assert!(matches!(back, Request::Live));
        // A length past the bound is refused before allocating.
        let huge = (u32::MAX).to_le_bytes();
        assert!(matches!(
            recv::<Request>(&mut huge.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        // Garbage that fits is a decode error, not a panic.
        let mut junk = 3u32.to_le_bytes().to_vec();
        junk.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(
            recv::<Request>(&mut junk.as_slice()),
            Err(FrameError::Decode(_))
        ));
        assert!(matches!(
            recv::<Request>(&mut [].as_slice()),
            Err(FrameError::Closed)
        ));
    }
}

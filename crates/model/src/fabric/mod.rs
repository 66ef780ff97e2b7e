//! The model fabric: one simulated fabric — nodes, their GPUs, processes
//! with or without an IMEX channel — that separate OS processes share, as
//! the ranks of a job share a real cluster (feature `fabric`).
//!
//! A [`FabricServer`] owns the reference model's world and listens on a Unix
//! socket in a fresh temporary directory. Every connection is one process of
//! the fabric, on the node it asked for; its driver is a [`Remote`], whose
//! calls are the driver boundary's table
//! ([`for_each_driver_call!`](cuda_endpoints_driver::for_each_driver_call)) serialised with
//! `postcard`. Closing the connection — exiting, crashing, being killed —
//! is the process's exit: the model destroys its endpoint references
//! (unbinding what it bound), releases its ids and frees its memory (SPEC
//! R12.2); endpoints other processes reference live on (R12.3).
//!
//! Three ways to start one:
//! - **a job**: `cuda-endpoints-fabric --nodes 2 --gpus 4 -- mpirun -n 8 ./app`
//!   starts the server, exports [`FABRIC_ENV`], runs the command, waits, prints
//!   the fabric's leak counters and exits non-zero if anything leaked;
//! - **a test**: [`FabricServer::start`] hosts it on threads of the test,
//!   and children get [`FabricServer::env_value`] in [`FABRIC_ENV`];
//! - **a process** joins with [`open_env`] (or [`open`] with a
//!   [`Join`]), which returns its [`Process`] handle (leak counters,
//!   violations, device memory; `cuda_endpoints::fabric::connect` wraps its
//!   driver in a `Context`).
//!
//! What the fabric simulates, beyond one node's model (SPEC R12, the model's
//! choices, see [the crate docs](crate)): nodes with their own devices (ordinals
//! are per node), one IMEX domain, an IMEX channel per process (fabric
//! handles import only with one: `NOT_PERMITTED`, R9.1), POSIX descriptors
//! that reach only their node ([`Process::export_fd`], R12.4), and refusals
//! that only the driver can know — a device another process enrolled, a team
//! that others filled, a handle whose endpoint was freed — answered with the
//! driver's code and not logged as violations (R12.5).
//!
//! The protocol ([`wire`]): one request, one reply, in `postcard` frames
//! bounded at [`wire::MAX_FRAME`] bytes; the first request is
//! [`wire::Request::Hello`] (protocol version, node or rank, IMEX channel);
//! then driver calls ([`WireCall`], one variant per row of the table) and
//! model requests (leak counters of the process and of the fabric,
//! violations, device memory, faults, shareable handles). Bytes that do not
//! decode end that connection (its process exits) and nothing else.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use cuda_endpoints::fabric;
//! // In every rank of `cuda-endpoints-fabric --nodes 2 --gpus 4 -- mpirun -n 8 app`:
//! let (ctx, me) = fabric::connect_env()?.expect("run under cuda-endpoints-fabric");
//! let dev = me.device().unwrap_or(cuda_endpoints::Device(0)); // rank 5: node 1, device 1
//! # let _ = (ctx, dev);
//! # Ok(()) }
//! ```

mod calls;
mod client;
mod data;
mod join;
pub mod launcher;
mod server;
pub mod wire;

use std::path::PathBuf;

pub use calls::WireCall;
pub use client::{Process, Remote, open, open_env};
pub use join::{DEFAULT_TIMEOUT, FABRIC_ENV, Join, RANK_VARS};
pub use server::{FabricServer, MAX_CONNECTIONS, ProcessExit};
pub use wire::WireViolation;

use crate::driver::Code;

/// Why joining, starting or asking a fabric failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// A [`FABRIC_ENV`] value with a part that does not read.
    #[error("{FABRIC_ENV}={spec:?}: `{part}`: {why}")]
    BadJoin {
        /// The whole value.
        spec: String,
        /// The part that does not read.
        part: String,
        /// Why.
        why: &'static str,
    },
    /// Nothing accepted a connection at the socket.
    #[error("cannot reach the fabric at {}: {source} (is the fabric server running?)", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server could not be started at the socket.
    #[error("cannot start a fabric at {}: {source}", socket.display())]
    Start {
        /// The socket.
        socket: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The fabric refused the request (no such node, another protocol).
    #[error("the fabric refused: {reason}")]
    Refused {
        /// The server's words.
        reason: String,
    },
    /// The handshake failed on the wire.
    #[error("fabric handshake failed: {0}")]
    Protocol(wire::FrameError),
    /// The connection was lost during a request.
    #[error("fabric connection lost during {request}: {detail}")]
    Lost {
        /// The request.
        request: &'static str,
        /// What the transport said.
        detail: String,
    },
    /// The server answered a request with something else.
    #[error("the fabric answered {request} with {reply}")]
    Unexpected {
        /// The request.
        request: &'static str,
        /// The reply.
        reply: String,
    },
    /// The model answered a request with a driver code.
    #[error("fabric {request} failed with {code}")]
    Driver {
        /// The request.
        request: &'static str,
        /// The code.
        code: Code,
    },
    /// A shareable-handle descriptor could not be made or read.
    #[error("shareable-handle descriptor: {0}")]
    Descriptor(std::io::Error),
    /// More bytes than one memory request moves.
    #[error("{len} bytes in one request, more than {max}")]
    TooLarge {
        /// Asked for.
        len: usize,
        /// The bound.
        max: usize,
    },
}

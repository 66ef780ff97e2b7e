//! Bootstrap: exchanging bytes among the ranks of a job, before and beside
//! the endpoints themselves.
//!
//! Endpoints exist to be shared: one rank creates and exports, every rank
//! imports, and every step of that bring-up needs the ranks to exchange a
//! few bytes (fabric handles, readiness votes), bounded in time, from the
//! right communicator. This module owns that exchange:
//!
//! - [`Bootstrap`], the object-safe trait: `rank`, `size`, and `allgather`,
//!   `broadcast`, `barrier`, each bounded by a timeout, each failing with a
//!   [`BootstrapError`] that names the rank, the [`Exchange`] and the peer.
//!   Every message carries the job id, the step's sequence number, the
//!   communicator size and the sender, so bytes from another communicator
//!   or another step are refused.
//! - Backends: [`Threads`] (in-process, for tests), [`Tcp`] (a unique id as
//!   NCCL's: rank 0 listens, the id travels by environment or file),
//!   `Mpi` (feature `mpi`), and [`Callbacks`] for a communicator the user
//!   already has.
//! - [`codec`]: the `serde`/`postcard` encoding of the bootstrap's own
//!   frames, for the layers above that send their own messages over it.
//! - [`FdExchange`]: POSIX file descriptors between ranks of one node
//!   (`SCM_RIGHTS`), refused across nodes ([`NodeId`]).
//!
//! # What the TCP bootstrap and `FdExchange` trust
//!
//! - [`Tcp`]: whoever knows the [`UniqueId`]'s secret. A joining rank and
//!   rank 0 each prove they know it (HMAC-SHA-256 over fresh nonces of
//!   both sides), so neither a process that knows only the port nor one
//!   that squats rank 0's address can join or pass as rank 0
//!   ([`BootstrapError::Impostor`]). The traffic is not encrypted: anyone
//!   who can read the loopback traffic or the id can read the job's bytes.
//!   Rank 0 bounds the connections that have not finished their join, gives
//!   each one deadline, and survives running out of descriptors. The ring
//!   its allgather runs on (three ranks or more) is authenticated the same
//!   way: each rank's ring listener admits only its previous rank, once it
//!   proved the secret, and proves it in turn to the next rank; it bounds
//!   the other connections the same way and closes once the ring stands.
//! - [`UniqueId::read_file`]: only a file this user owns, writable by no
//!   one else, in a directory only this user can write (not `/tmp` itself);
//!   [`UniqueId::write_file`] writes 0600.
//! - [`FdExchange`]: the ranks of one node, as this user: the root's
//!   abstract socket is visible to every local user, so it closes
//!   connections of other users (`SO_PEERCRED`) and serves only the random
//!   token of the exchange.
//!
//! # The pattern
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_endpoints_bootstrap::{Bootstrap, Tcp, UniqueId};
//!
//! # fn main() -> Result<(), cuda_endpoints_bootstrap::BootstrapError> {
//! let t = Duration::from_secs(10);
//! let (rank, size): (usize, usize) = (0, 4); // from the launcher
//! let boot = if rank == 0 {
//!     let (id, root) = Tcp::root("127.0.0.1:0".parse().expect("an address"))?;
//!     // Publish the id: export CUDA_ENDPOINTS_BOOTSTRAP_ID to the other
//!     // ranks' environment, or `id.write_file(path)`.
//!     println!("{id}");
//!     root.accept(size, t)?
//! } else {
//!     Tcp::join(&UniqueId::from_env()?, rank, size, t)?
//! };
//! let handle = [0u8; 64]; // e.g. rank 0's exported fabric handle
//! let got = boot.broadcast(0, &handle, t)?;
//! let all = boot.allgather(&(rank as u32).to_le_bytes(), t)?;
//! boot.barrier(t)?;
//! # let _ = (got, all);
//! # Ok(())
//! # }
//! ```

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod api;
mod callbacks;
pub mod codec;
mod error;
#[cfg(target_os = "linux")]
mod fd;
#[cfg(feature = "mpi")]
mod mpi;
mod node;
mod ring;
mod tcp;
mod threads;
mod unique_id;
mod wire;

pub use api::{Bootstrap, Deadline, Traffic};
pub use callbacks::{CallbackResult, Callbacks};
pub use error::{
    AbortReason, Argument, BootstrapError, Exchange, FrameMismatch, IdProblem, Malformed, Op,
    Refusal,
};
#[cfg(target_os = "linux")]
pub use fd::FdExchange;
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
pub use node::NodeId;
pub use tcp::{Tcp, TcpRoot};
pub use threads::{ThreadRank, Threads};
pub use unique_id::{LISTEN_FD_ENV, NODE_ENV, RANK_ENV, SIZE_ENV, UNIQUE_ID_ENV, UniqueId};
pub use wire::MAX_PAYLOAD;

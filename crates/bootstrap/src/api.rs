//! The [`Bootstrap`] trait: rank, size and three bounded collectives over
//! bytes, object-safe so that `&dyn Bootstrap` reaches every layer above;
//! [`Traffic`], the counters of what a rank sent and received; and the
//! deadline arithmetic every backend shares.

use std::time::{Duration, Instant};

use super::error::BootstrapError;

/// Exchanges bytes among the ranks `0..size()` of one job.
///
/// Every rank calls the same collectives in the same order (SPMD). Every
/// call returns within about its `timeout`: a peer that never answers gives
/// [`BootstrapError::Timeout`] naming the ranks waited for. Each message
/// carries the communicator's job id, the step's sequence number and the
/// sender's rank, so bytes from another communicator or another step are
/// refused ([`BootstrapError::Mismatch`]) or, when stale, skipped.
///
/// Implement it for a communicator you already have, or wrap closures with
/// [`Callbacks`](super::Callbacks).
pub trait Bootstrap {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// Every rank contributes `mine`; every rank gets all contributions,
    /// indexed by rank (its own included).
    ///
    /// # Errors
    /// [`BootstrapError`], naming this rank, the step and the peer to blame.
    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError>;

    /// Rank `root` sends `bytes_if_root`; every rank gets it. Other ranks'
    /// `bytes_if_root` is ignored (pass `&[]`).
    ///
    /// # Errors
    /// As [`Bootstrap::allgather`]; [`BootstrapError::InvalidArgument`] for a
    /// root out of range.
    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError>;

    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    /// As [`Bootstrap::allgather`].
    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError>;

    /// What this rank sent and received so far (zeros where a backend does
    /// not count).
    fn traffic(&self) -> Traffic {
        Traffic::default()
    }
}

/// Counters of one rank's bootstrap traffic, to see how messages grow with
/// the number of ranks. A message is one frame (TCP), one contribution
/// (threads) or one MPI collective call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages sent.
    pub messages_sent: u64,
    /// Bytes sent, headers included.
    pub bytes_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Bytes received, headers included.
    pub bytes_received: u64,
    /// Stale messages (of an earlier, timed-out step) skipped.
    pub stale_skipped: u64,
    /// Connections refused before they joined (wrong secret, garbage).
    pub refused_connections: u64,
}

impl Traffic {
    pub(crate) fn sent(&mut self, bytes: usize) {
        self.messages_sent = self.messages_sent.saturating_add(1);
        self.bytes_sent = self.bytes_sent.saturating_add(bytes as u64);
    }
    pub(crate) fn received(&mut self, bytes: usize) {
        self.messages_received = self.messages_received.saturating_add(1);
        self.bytes_received = self.bytes_received.saturating_add(bytes as u64);
    }
}

/// The end of an operation's time budget: every bootstrap operation and
/// wait below it gets what is left. One definition for the transports here
/// and the team bring-up above them.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now. A timeout too large for `Instant` (such as
    /// `Duration::MAX`) is no deadline at all.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(timeout),
            timeout,
        }
    }

    /// Time left: zero once passed, `Duration::MAX` without a deadline
    /// (every wait takes it as a timeout and adds it checked).
    pub fn remaining(&self) -> Duration {
        self.at.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// Whether the deadline has passed (never, without one).
    pub fn passed(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    /// The whole budget it was made with, as errors report it.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// `&B` and `Box<B>` are bootstraps wherever `B` is.
macro_rules! forward_bootstrap {
    ($($ptr:ty),*) => {$(
        impl<B: Bootstrap + ?Sized> Bootstrap for $ptr {
            fn rank(&self) -> usize {
                (**self).rank()
            }
            fn size(&self) -> usize {
                (**self).size()
            }
            fn allgather(
                &self,
                mine: &[u8],
                timeout: Duration,
            ) -> Result<Vec<Vec<u8>>, BootstrapError> {
                (**self).allgather(mine, timeout)
            }
            fn broadcast(
                &self,
                root: usize,
                bytes_if_root: &[u8],
                timeout: Duration,
            ) -> Result<Vec<u8>, BootstrapError> {
                (**self).broadcast(root, bytes_if_root, timeout)
            }
            fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
                (**self).barrier(timeout)
            }
            fn traffic(&self) -> Traffic {
                (**self).traffic()
            }
        }
    )*};
}
forward_bootstrap!(&B, Box<B>);

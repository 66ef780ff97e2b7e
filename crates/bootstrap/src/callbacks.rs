//! [`Callbacks`]: plugs a communicator the user already has (an MPI
//! communicator of their own, a process group, a key-value store) into
//! [`Bootstrap`] through closures, as TensorRT-LLM's allgather callback.
//!
//! Only an allgather closure is required; broadcast and barrier default to
//! allgathers. Every contribution travels in an envelope carrying the job
//! id, communicator size, sequence number and sender, and every entry that
//! comes back is checked against them: bytes exchanged over the wrong
//! communicator (another size, another job, ranks in another order) or at
//! another step are refused with [`BootstrapError::Mismatch`].
//!
//! The adapter passes each call's timeout to the closure; it cannot bound
//! code it does not own, so the closures must honour it.

use std::sync::Mutex;
use std::time::Duration;

use super::api::{Bootstrap, Traffic};
use super::error::{Argument, BootstrapError, Exchange, Op};
use super::tcp::refused;
use super::wire::{self, Expect, Kind};

/// What a callback returns: its own error type, boxed.
pub type CallbackResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

type AllgatherFn = dyn Fn(&[u8], Duration) -> CallbackResult<Vec<Vec<u8>>> + Send + Sync;
type BroadcastFn = dyn Fn(usize, &[u8], Duration) -> CallbackResult<Vec<u8>> + Send + Sync;
type BarrierFn = dyn Fn(Duration) -> CallbackResult<()> + Send + Sync;

/// A [`Bootstrap`] made of closures over a communicator the user owns.
pub struct Callbacks {
    rank: usize,
    size: usize,
    job: u64,
    allgather: Box<AllgatherFn>,
    broadcast: Option<Box<BroadcastFn>>,
    barrier: Option<Box<BarrierFn>>,
    state: Mutex<(u64, Traffic)>,
}

impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callbacks")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job", &self.job)
            .finish_non_exhaustive()
    }
}

impl Callbacks {
    /// `rank` of `size` ranks of communicator `job`: any value every rank of
    /// this communicator passes and no other communicator of the program
    /// uses (e.g. a hash of its name). `allgather(mine, timeout)` must
    /// return every rank's bytes, indexed by rank.
    ///
    /// # Errors
    /// [`BootstrapError::InvalidArgument`] for `size == 0` or `rank >= size`.
    pub fn new(
        rank: usize,
        size: usize,
        job: u64,
        allgather: impl Fn(&[u8], Duration) -> CallbackResult<Vec<Vec<u8>>> + Send + Sync + 'static,
    ) -> Result<Callbacks, BootstrapError> {
        let step = Exchange {
            op: Op::Rendezvous,
            seq: 0,
        };
        if size == 0 || u32::try_from(size).is_err() {
            return Err(BootstrapError::InvalidArgument {
                rank,
                step,
                what: Argument::ZeroSize,
            });
        }
        if rank >= size {
            return Err(BootstrapError::InvalidArgument {
                rank,
                step,
                what: Argument::RankOutOfRange { rank, size },
            });
        }
        Ok(Callbacks {
            rank,
            size,
            job,
            allgather: Box::new(allgather),
            broadcast: None,
            barrier: None,
            state: Mutex::new((0, Traffic::default())),
        })
    }

    /// A native broadcast: `broadcast(root, bytes_if_root, timeout)` returns
    /// the root's bytes on every rank (non-roots pass `&[]`).
    #[must_use]
    pub fn with_broadcast(
        mut self,
        f: impl Fn(usize, &[u8], Duration) -> CallbackResult<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        self.broadcast = Some(Box::new(f));
        self
    }

    /// A native barrier. It carries no bytes, so no identity check is made
    /// on it; without it the barrier is a checked allgather of nothing.
    #[must_use]
    pub fn with_barrier(
        mut self,
        f: impl Fn(Duration) -> CallbackResult<()> + Send + Sync + 'static,
    ) -> Self {
        self.barrier = Some(Box::new(f));
        self
    }

    fn next(&self, op: Op) -> Exchange {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = st.0;
        st.0 = st.0.wrapping_add(1);
        Exchange { op, seq }
    }

    fn count(&self, sent: usize, received: usize) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.1.sent(sent);
        st.1.received(received);
    }

    fn seal(&self, step: Exchange, kind: Kind, payload: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        wire::seal(self.job, self.rank, self.size, step, kind, payload)
    }

    fn expect(&self, step: Exchange, kind: Kind, from: usize) -> Expect {
        wire::expect(self.job, self.size, step, kind, from)
    }

    fn gather(
        &self,
        step: Exchange,
        kind: Kind,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let sealed = self.seal(step, kind, mine)?;
        let got =
            (self.allgather)(&sealed, timeout).map_err(|source| BootstrapError::Callback {
                rank: self.rank,
                step,
                source,
            })?;
        if got.len() != self.size {
            return Err(BootstrapError::Mismatch {
                rank: self.rank,
                step,
                peer: self.rank,
                what: super::error::FrameMismatch::Count {
                    expected: self.size,
                    got: got.len(),
                },
            });
        }
        let received = got.iter().fold(0usize, |a, b| a.saturating_add(b.len()));
        self.count(sealed.len(), received);
        got.iter()
            .enumerate()
            .map(|(peer, bytes)| {
                wire::open(bytes, &self.expect(step, kind, peer))
                    .map_err(|r| refused(self.rank, step, peer, r))
            })
            .collect()
    }
}

impl Bootstrap for Callbacks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let step = self.next(Op::Allgather);
        self.gather(step, Kind::Allgather, mine, timeout)
    }

    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        let step = self.next(Op::Broadcast);
        if root >= self.size {
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::RankOutOfRange {
                    rank: root,
                    size: self.size,
                },
            });
        }
        let mine = if root == self.rank {
            bytes_if_root
        } else {
            &[]
        };
        let Some(f) = &self.broadcast else {
            let mut all = self.gather(step, Kind::Broadcast, mine, timeout)?;
            return Ok(std::mem::take(&mut all[root]));
        };
        let sealed = if root == self.rank {
            self.seal(step, Kind::Broadcast, mine)?
        } else {
            Vec::new()
        };
        let got = f(root, &sealed, timeout).map_err(|source| BootstrapError::Callback {
            rank: self.rank,
            step,
            source,
        })?;
        self.count(sealed.len(), got.len());
        wire::open(&got, &self.expect(step, Kind::Broadcast, root))
            .map_err(|r| refused(self.rank, step, root, r))
    }

    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        let step = self.next(Op::Barrier);
        match &self.barrier {
            Some(f) => {
                f(timeout).map_err(|source| BootstrapError::Callback {
                    rank: self.rank,
                    step,
                    source,
                })?;
                self.count(0, 0);
                Ok(())
            }
            None => self.gather(step, Kind::Barrier, &[], timeout).map(|_| ()),
        }
    }

    fn traffic(&self) -> Traffic {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
    }
}

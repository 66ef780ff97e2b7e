//! [`Mpi`]: the MPI backend (feature `mpi`, the `mpi` crate 0.8 over the
//! system's MPI, e.g. Debian's Open MPI).
//!
//! MPI's blocking collectives cannot time out, so every collective here is
//! the non-blocking one (`MPI_Iallgather`, `MPI_Ibcast`, `MPI_Ibarrier`)
//! tested in a loop until it completes or the deadline passes. What cannot
//! be bounded: MPI offers no way to cancel a started collective. On a
//! timeout the request and its buffers are deliberately leaked (MPI may still
//! write into them), the call returns [`BootstrapError::Timeout`], and the
//! communicator is poisoned: every later call returns
//! [`BootstrapError::Poisoned`], since the ranks no longer agree on which
//! collective is which. The job should then abort (`MPI_Abort`, or exit and
//! let the launcher kill the rest). MPI errors themselves abort the job
//! (the default `MPI_ERRORS_ARE_FATAL`); a rank killed mid-collective is
//! seen as a timeout on the survivors, or the launcher kills them.
//!
//! Every contribution is sealed in the library's envelope (job id agreed at
//! construction, step, sender, size) and checked on arrival, as for
//! [`Callbacks`](super::Callbacks). Variable-length allgathers exchange the
//! lengths first, then fixed slots of the longest (bootstrap payloads are
//! handles of similar size).

use std::cell::RefCell;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::request::Request;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};

use super::api::{Bootstrap, Deadline, Traffic};
use super::error::{Argument, BootstrapError, Exchange, Op};
use super::tcp::refused;
use super::wire::{self, Expect, Kind, MAX_PAYLOAD};

/// A bootstrap over an MPI communicator.
pub struct Mpi<C: Communicator = SimpleCommunicator> {
    // Declared before `universe`: the communicator is dropped before MPI is finalized.
    comm: C,
    universe: Option<Universe>,
    rank: usize,
    size: usize,
    job: u64,
    state: RefCell<State>,
}

#[derive(Debug, Default)]
struct State {
    seq: u64,
    poisoned: Option<Exchange>,
    traffic: Traffic,
}

impl<C: Communicator> std::fmt::Debug for Mpi<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job", &format_args!("{:016x}", self.job))
            .field("owns_mpi", &self.universe.is_some())
            .finish_non_exhaustive()
    }
}

/// A buffer lent to a non-blocking MPI operation for `'static`: taken back
/// once the operation completed, leaked on purpose if it never does.
struct Lent<T: 'static> {
    raw: *mut [T],
}

impl<T: Copy + 'static> Lent<T> {
    fn new(v: Vec<T>) -> (Lent<T>, &'static mut [T]) {
        let raw = Box::into_raw(v.into_boxed_slice());
        // SAFETY: `raw` comes from `Box::into_raw`: valid, aligned and not
        // aliased. The reference goes to exactly one MPI operation; `Lent`
        // touches the memory again only in `take_back`, after it completed.
        let r = unsafe { &mut *raw };
        (Lent { raw }, r)
    }

    /// # Safety
    /// The MPI operation given the slice from [`Lent::new`] has completed,
    /// and no reference derived from that slice is used afterwards.
    unsafe fn take_back(self) -> Vec<T> {
        // SAFETY: `raw` came from `Box::into_raw` and MPI no longer uses it
        // (the caller's promise): ownership returns to a `Box` once.
        unsafe { Box::from_raw(self.raw) }.into_vec()
    }
}

/// Tests `req` until it completes (`true`) or the deadline passes (`false`;
/// the request is leaked, MPI keeps it).
fn wait<D: ?Sized>(mut req: Request<'static, D>, deadline: &Deadline) -> bool {
    let mut spins = 0u32;
    loop {
        match req.test() {
            Ok(_) => return true,
            Err(r) if deadline.passed() => {
                // No cancel for collectives: leave the request to MPI.
                std::mem::forget(r);
                return false;
            }
            Err(r) => {
                req = r;
                spins = spins.saturating_add(1);
                if spins < 256 {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }
}

impl Mpi<SimpleCommunicator> {
    /// Initializes MPI, and bootstraps over `MPI_COMM_WORLD`; MPI is
    /// finalized when the returned value drops. The ranks agree on a job id
    /// within `timeout`.
    ///
    /// # Errors
    /// [`Argument::MpiAlreadyInitialized`] when MPI is already initialized
    /// (use [`Mpi::from_communicator`]); [`BootstrapError::Timeout`].
    pub fn world(timeout: Duration) -> Result<Self, BootstrapError> {
        let Some(universe) = mpi::initialize() else {
            return Err(BootstrapError::InvalidArgument {
                rank: 0,
                step: Exchange {
                    op: Op::Rendezvous,
                    seq: 0,
                },
                what: Argument::MpiAlreadyInitialized,
            });
        };
        let comm = universe.world();
        let mut m = Mpi::from_communicator(comm, timeout)?;
        m.universe = Some(universe);
        Ok(m)
    }
}

impl<C: Communicator> Mpi<C> {
    /// Bootstraps over a communicator the caller owns (MPI initialized and
    /// finalized by the caller). The ranks agree on a job id within `timeout`.
    ///
    /// # Errors
    /// [`BootstrapError::Timeout`] when a rank does not take part in time.
    pub fn from_communicator(comm: C, timeout: Duration) -> Result<Self, BootstrapError> {
        let rank = usize::try_from(comm.rank()).unwrap_or(0);
        let size = usize::try_from(comm.size()).unwrap_or(0);
        let step = Exchange {
            op: Op::Rendezvous,
            seq: 0,
        };
        let deadline = Deadline::after(timeout);
        let mut job = [0u8; 8];
        if rank == 0 {
            getrandom::fill(&mut job).map_err(|e| BootstrapError::Io {
                rank,
                step,
                peer: None,
                source: std::io::Error::other(e.to_string()),
            })?;
        }
        let (lent, buf) = Lent::new(job.to_vec());
        let req = comm
            .process_at_rank(0)
            .immediate_broadcast_into(mpi::request::StaticScope, buf);
        if !wait(req, &deadline) {
            return Err(BootstrapError::Timeout {
                rank,
                step,
                waiting_for: vec![0],
                after: timeout,
            });
        }
        // SAFETY: the broadcast completed (`wait` returned true).
        let got = unsafe { lent.take_back() };
        job.copy_from_slice(&got);
        Ok(Mpi {
            comm,
            universe: None,
            rank,
            size,
            job: u64::from_le_bytes(job),
            state: RefCell::new(State::default()),
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &C {
        &self.comm
    }

    fn begin(&self, op: Op) -> Result<Exchange, BootstrapError> {
        let mut st = self.state.borrow_mut();
        let step = Exchange { op, seq: st.seq };
        st.seq = st.seq.wrapping_add(1);
        match st.poisoned {
            Some(first) => Err(BootstrapError::Poisoned {
                rank: self.rank,
                step,
                first,
            }),
            None => Ok(step),
        }
    }

    fn timed_out(
        &self,
        step: Exchange,
        deadline: &Deadline,
        waiting_for: Vec<usize>,
    ) -> BootstrapError {
        self.state.borrow_mut().poisoned = Some(step);
        BootstrapError::Timeout {
            rank: self.rank,
            step,
            waiting_for,
            after: deadline.timeout(),
        }
    }

    fn seal(&self, step: Exchange, kind: Kind, payload: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        wire::seal(self.job, self.rank, self.size, step, kind, payload)
    }

    fn expect(&self, step: Exchange, kind: Kind, from: usize) -> Expect {
        wire::expect(self.job, self.size, step, kind, from)
    }

    fn count(&self, sent: usize, received: usize) {
        let mut st = self.state.borrow_mut();
        st.traffic.sent(sent);
        st.traffic.received(received);
    }

    /// Allgathers sealed envelopes: lengths first, then fixed slots.
    fn gather(
        &self,
        step: Exchange,
        kind: Kind,
        mine: &[u8],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let sealed = self.seal(step, kind, mine)?;
        let everyone = || (0..self.size).collect::<Vec<_>>();
        let (send_lent, send) = Lent::new(vec![sealed.len() as u64]);
        let (recv_lent, recv) = Lent::new(vec![0u64; self.size]);
        let req = self
            .comm
            .immediate_all_gather_into(mpi::request::StaticScope, &*send, recv);
        if !wait(req, deadline) {
            return Err(self.timed_out(step, deadline, everyone()));
        }
        // SAFETY: the allgather completed; `send` and `recv` are not used again.
        let (_, lens) = unsafe { (send_lent.take_back(), recv_lent.take_back()) };
        let limit = (MAX_PAYLOAD + wire::HEADER_LEN) as u64;
        if let Some((peer, &len)) = lens.iter().enumerate().find(|(_, l)| **l > limit) {
            return Err(BootstrapError::Oversized {
                rank: self.rank,
                step,
                peer,
                len,
                max: limit,
            });
        }
        let slot = usize::try_from(lens.iter().copied().max().unwrap_or(0)).unwrap_or(usize::MAX);
        let total = slot
            .checked_mul(self.size)
            .filter(|t| *t <= MAX_PAYLOAD.saturating_mul(2))
            .ok_or(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::TooLarge {
                    len: slot.saturating_mul(self.size),
                    max: MAX_PAYLOAD,
                },
            })?;
        let mut padded = sealed;
        padded.resize(slot, 0);
        let (send_lent, send) = Lent::new(padded);
        let (recv_lent, recv) = Lent::new(vec![0u8; total]);
        let req = self
            .comm
            .immediate_all_gather_into(mpi::request::StaticScope, &*send, recv);
        if !wait(req, deadline) {
            return Err(self.timed_out(step, deadline, everyone()));
        }
        // SAFETY: as above.
        let (_, all) = unsafe { (send_lent.take_back(), recv_lent.take_back()) };
        self.count(8 + slot, 8 * self.size + total);
        lens.iter()
            .enumerate()
            .map(|(peer, &len)| {
                let start = peer.saturating_mul(slot);
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
                let bytes = all.get(start..end).unwrap_or_default();
                wire::open(bytes, &self.expect(step, kind, peer))
                    .map_err(|r| refused(self.rank, step, peer, r))
            })
            .collect()
    }
}

impl<C: Communicator> Bootstrap for Mpi<C> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let step = self.begin(Op::Allgather)?;
        self.gather(step, Kind::Allgather, mine, &deadline)
    }

    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let step = self.begin(Op::Broadcast)?;
        let Some(root32) = (root < self.size)
            .then(|| i32::try_from(root).ok())
            .flatten()
        else {
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::RankOutOfRange {
                    rank: root,
                    size: self.size,
                },
            });
        };
        let sealed = if root == self.rank {
            self.seal(step, Kind::Broadcast, bytes_if_root)?
        } else {
            Vec::new()
        };
        let process = self.comm.process_at_rank(root32);
        let (len_lent, len_buf) = Lent::new(vec![sealed.len() as u64]);
        let req = process.immediate_broadcast_into(mpi::request::StaticScope, len_buf);
        if !wait(req, &deadline) {
            return Err(self.timed_out(step, &deadline, vec![root]));
        }
        // SAFETY: the broadcast completed.
        let len = unsafe { len_lent.take_back() }
            .first()
            .copied()
            .unwrap_or(0);
        let limit = (MAX_PAYLOAD + wire::HEADER_LEN) as u64;
        if len > limit {
            return Err(BootstrapError::Oversized {
                rank: self.rank,
                step,
                peer: root,
                len,
                max: limit,
            });
        }
        let mut buf = sealed;
        buf.resize(usize::try_from(len).unwrap_or(0), 0);
        let n = buf.len();
        let (lent, b) = Lent::new(buf);
        let req = process.immediate_broadcast_into(mpi::request::StaticScope, b);
        if !wait(req, &deadline) {
            return Err(self.timed_out(step, &deadline, vec![root]));
        }
        // SAFETY: the broadcast completed.
        let got = unsafe { lent.take_back() };
        self.count(
            if root == self.rank { 8 + n } else { 0 },
            if root == self.rank { 0 } else { 8 + n },
        );
        wire::open(&got, &self.expect(step, Kind::Broadcast, root))
            .map_err(|r| refused(self.rank, step, root, r))
    }

    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        let deadline = Deadline::after(timeout);
        let step = self.begin(Op::Barrier)?;
        if !wait(self.comm.immediate_barrier(), &deadline) {
            return Err(self.timed_out(step, &deadline, (0..self.size).collect()));
        }
        self.count(0, 0);
        Ok(())
    }

    fn traffic(&self) -> Traffic {
        self.state.borrow().traffic
    }
}

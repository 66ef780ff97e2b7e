//! [`Threads`]: the in-process backend for tests and single-process runs.
//! The ranks are values on a shared board (a mutex and a condition
//! variable); each step is a round keyed by its sequence number, waits are
//! bounded by `Condvar::wait_timeout`, and a rank that is dropped counts as
//! a closed peer for the rounds that still need it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::api::{Bootstrap, Deadline, Traffic};
use super::error::{Argument, BootstrapError, Exchange, FrameMismatch, Op};

/// Makes the ranks of an in-process job.
#[derive(Debug)]
pub struct Threads;

impl Threads {
    /// `n` ranks of one job, rank `i` at index `i`; move each to its thread.
    /// `n == 0` gives no ranks.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(n: usize) -> Vec<ThreadRank> {
        let board = Arc::new(Board {
            state: Mutex::new(BoardState {
                rounds: BTreeMap::new(),
                departed: vec![false; n],
            }),
            cv: Condvar::new(),
        });
        (0..n)
            .map(|rank| ThreadRank {
                rank,
                size: n,
                board: Arc::clone(&board),
                seq: AtomicU64::new(0),
                traffic: Mutex::new(Traffic::default()),
            })
            .collect()
    }
}

/// One rank of a [`Threads`] job.
#[derive(Debug)]
pub struct ThreadRank {
    rank: usize,
    size: usize,
    board: Arc<Board>,
    seq: AtomicU64,
    traffic: Mutex<Traffic>,
}

#[derive(Debug)]
struct Board {
    state: Mutex<BoardState>,
    cv: Condvar,
}

#[derive(Debug)]
struct BoardState {
    rounds: BTreeMap<u64, Round>,
    departed: Vec<bool>,
}

#[derive(Debug)]
struct Round {
    op: Op,
    root: usize,
    opened_by: usize,
    slots: Vec<Option<Arc<Vec<u8>>>>,
    passed: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A rank that panicked holding the lock left consistent data (every
    // update is a single assignment): keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn op_code(op: Op) -> u8 {
    match op {
        Op::Allgather => 4,
        Op::Broadcast => 6,
        Op::Barrier => 7,
        _ => 0,
    }
}

impl ThreadRank {
    /// Runs one round: deposit `mine` (if this rank contributes), wait for
    /// the slots `needed`, return them.
    fn round(
        &self,
        op: Op,
        root: usize,
        mine: Option<&[u8]>,
        all_needed: bool,
        timeout: Duration,
    ) -> Result<Vec<Arc<Vec<u8>>>, BootstrapError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let step = Exchange { op, seq };
        let deadline = Deadline::after(timeout);
        let mut st = lock(&self.board.state);
        let size = self.size;
        let round = st.rounds.entry(seq).or_insert_with(|| Round {
            op,
            root,
            opened_by: self.rank,
            slots: vec![None; size],
            passed: 0,
        });
        if round.op != op || round.root != root {
            let peer = round.opened_by;
            let theirs = op_code(round.op);
            Self::pass(&mut st, seq, size);
            return Err(BootstrapError::Mismatch {
                rank: self.rank,
                step,
                peer,
                what: FrameMismatch::Operation { ours: op, theirs },
            });
        }
        if let Some(bytes) = mine {
            round.slots[self.rank] = Some(Arc::new(bytes.to_vec()));
            lock(&self.traffic).sent(bytes.len());
            self.board.cv.notify_all();
        }
        loop {
            let round = st.rounds.get(&seq);
            let missing: Vec<usize> = match round {
                Some(r) if all_needed => (0..size).filter(|&i| r.slots[i].is_none()).collect(),
                Some(r) => r.slots[root]
                    .is_none()
                    .then_some(vec![root])
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            if missing.is_empty() {
                let got: Vec<Arc<Vec<u8>>> = match round {
                    Some(r) if all_needed => r.slots.iter().flatten().cloned().collect(),
                    Some(r) => r.slots[root].iter().cloned().collect(),
                    None => Vec::new(),
                };
                Self::pass(&mut st, seq, size);
                let mut t = lock(&self.traffic);
                for g in &got {
                    t.received(g.len());
                }
                return Ok(got);
            }
            if let Some(&peer) = missing.iter().find(|&&i| st.departed[i]) {
                Self::pass(&mut st, seq, size);
                return Err(BootstrapError::PeerClosed {
                    rank: self.rank,
                    step,
                    peer,
                });
            }
            if deadline.passed() {
                Self::pass(&mut st, seq, size);
                return Err(BootstrapError::Timeout {
                    rank: self.rank,
                    step,
                    waiting_for: missing,
                    after: timeout,
                });
            }
            st = self
                .board
                .cv
                .wait_timeout(st, deadline.remaining())
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Marks this rank done with round `seq`; the last one removes it.
    fn pass(st: &mut BoardState, seq: u64, size: usize) {
        if let Some(r) = st.rounds.get_mut(&seq) {
            r.passed = r.passed.saturating_add(1);
            if r.passed >= size {
                st.rounds.remove(&seq);
            }
        }
    }
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        let mut st = lock(&self.board.state);
        if let Some(d) = st.departed.get_mut(self.rank) {
            *d = true;
        }
        self.board.cv.notify_all();
    }
}

impl Bootstrap for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let got = self.round(Op::Allgather, 0, Some(mine), true, timeout)?;
        Ok(got.iter().map(|b| b.as_ref().clone()).collect())
    }
    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        if root >= self.size {
            let seq = self.seq.load(Ordering::Relaxed);
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step: Exchange {
                    op: Op::Broadcast,
                    seq,
                },
                what: Argument::RankOutOfRange {
                    rank: root,
                    size: self.size,
                },
            });
        }
        let mine = (root == self.rank).then_some(bytes_if_root);
        let got = self.round(Op::Broadcast, root, mine, false, timeout)?;
        Ok(got.first().map(|b| b.as_ref().clone()).unwrap_or_default())
    }
    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        self.round(Op::Barrier, 0, Some(&[]), true, timeout)
            .map(|_| ())
    }
    fn traffic(&self) -> Traffic {
        *lock(&self.traffic)
    }
}

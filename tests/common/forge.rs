//! A bootstrap that forges one rank's peer-to-id table digest (R13.4) in
//! the final agreement of `unicast_peers` (its `Wait` step), as a rank
//! that imported peers under other ids (or a bootstrap that delivered other
//! handles to it) would report; every rank's wrapper also keeps the honest
//! digest it sent, so a test can name the digests the error must carry.
//! Used by the threads test (`tests/team/communicator.rs`) and by the
//! `communicator` example's `--forge-id-table` mode (OS processes over TCP
//! and under `mpirun`).
//!
//! Include with `#[path = "../common/forge.rs"] mod forge;` in an area's `main.rs` (from an example:
//! `#[path = "../tests/common/forge.rs"]`).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, BootstrapError, Traffic};

/// The wire tag of `Step::Wait`, where a status header (18 bytes) has it,
/// and where an `Ok` status's payload starts (after the variant and the
/// payload's one-byte length): `src/team/wire.rs`.
const WAIT_TAG: u8 = 6;
const STEP_AT: usize = 13;
const BODY_AT: usize = 18;
const PAYLOAD_AT: usize = BODY_AT + 2;

/// What the forger flips in the low byte of its digest (little-endian on
/// the wire): the digest the others hear is `honest ^ FLIP`.
pub const FLIP: u64 = 0x5a;

/// `inner`, except that rank `forger`'s id-table digest goes out with
/// [`FLIP`] applied.
pub struct ForgeIdTable<B> {
    pub inner: B,
    pub forger: usize,
    /// The last digest this rank sent, before any forging; 0 until one.
    honest: AtomicU64,
}

impl<B: Bootstrap> ForgeIdTable<B> {
    pub fn new(inner: B, forger: usize) -> Self {
        ForgeIdTable {
            inner,
            forger,
            honest: AtomicU64::new(0),
        }
    }

    /// This rank's own digest as it computed it (`None` before the `Wait`
    /// step's agreement ran).
    pub fn honest_digest(&self) -> Option<u64> {
        Some(self.honest.load(Ordering::Relaxed)).filter(|&d| d != 0)
    }
}

impl<B: Bootstrap> Bootstrap for ForgeIdTable<B> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let mut mine = mine.to_vec();
        let is_wait_ok = mine.get(STEP_AT) == Some(&WAIT_TAG) && mine.get(BODY_AT) == Some(&0);
        let digest = mine
            .get(PAYLOAD_AT..)
            .and_then(|d| <[u8; 8]>::try_from(d).ok())
            .map(u64::from_le_bytes);
        if let (true, Some(digest)) = (is_wait_ok, digest) {
            self.honest.store(digest, Ordering::Relaxed);
            if self.rank() == self.forger {
                mine[PAYLOAD_AT] ^= FLIP as u8;
            }
        }
        self.inner.allgather(&mine, timeout)
    }
    fn broadcast(
        &self,
        root: usize,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.inner.broadcast(root, mine, timeout)
    }
    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        self.inner.barrier(timeout)
    }
    fn traffic(&self) -> Traffic {
        self.inner.traffic()
    }
}

/// The wire tag of `Step::Grow` in a status header, and the length of one
/// memory share at the end of a grow report (`src/team/windows.rs`): its
/// 64 handle bytes end one byte (the descriptor flag) before the message.
const GROW_TAG: u8 = 8;
const SHARE_LEN: usize = 101;
const HANDLE_FROM_END: usize = 65;

/// The handle bytes of the one memory share that ends a grow status
/// `bytes` (an `Ok` status of `Step::Grow`), if it is one.
fn grow_share_handle(bytes: &[u8]) -> Option<std::ops::Range<usize>> {
    let ok_grow = bytes.get(STEP_AT) == Some(&GROW_TAG) && bytes.get(BODY_AT) == Some(&0);
    let n = bytes.len();
    (ok_grow && n >= BODY_AT + 2 + SHARE_LEN).then(|| n - HANDLE_FROM_END..n - 1)
}

/// `inner`, except that rank `forger`, at its second grow, sends as its new
/// chunk's fabric handle the one rank `victim` sent for its chunk at the
/// first grow: a peer that echoes known memory as its own window share
/// (issue 29, item 2). Every other message goes as it is.
pub struct EchoShare<B> {
    pub inner: B,
    pub forger: usize,
    pub victim: usize,
    grows: AtomicU64,
    echoed: std::sync::Mutex<Option<Vec<u8>>>,
}

impl<B: Bootstrap> EchoShare<B> {
    pub fn new(inner: B, forger: usize, victim: usize) -> Self {
        EchoShare {
            inner,
            forger,
            victim,
            grows: AtomicU64::new(0),
            echoed: std::sync::Mutex::new(None),
        }
    }

    /// Whether the forger sent the victim's handle as its own.
    pub fn forged(&self) -> bool {
        self.rank() == self.forger && self.grows.load(Ordering::Relaxed) >= 2
    }
}

impl<B: Bootstrap> Bootstrap for EchoShare<B> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let Some(at) = grow_share_handle(mine).filter(|_| self.rank() == self.forger) else {
            return self.inner.allgather(mine, timeout);
        };
        let mut mine = mine.to_vec();
        let grows = self.grows.fetch_add(1, Ordering::Relaxed) + 1;
        let echoed = self.echoed.lock().unwrap().clone();
        if let (2, Some(theirs)) = (grows, echoed) {
            mine[at].copy_from_slice(&theirs);
        }
        let all = self.inner.allgather(&mine, timeout)?;
        if grows == 1 {
            let theirs = all
                .get(self.victim)
                .and_then(|b| Some(b.get(grow_share_handle(b)?)?.to_vec()));
            *self.echoed.lock().unwrap() = theirs;
        }
        Ok(all)
    }
    fn broadcast(
        &self,
        root: usize,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.inner.broadcast(root, mine, timeout)
    }
    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        self.inner.barrier(timeout)
    }
    fn traffic(&self) -> Traffic {
        self.inner.traffic()
    }
}

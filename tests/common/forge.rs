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

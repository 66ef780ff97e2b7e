//! Fixtures for the bootstrap tests and the multi-process suites: the child
//! harness of `tests/common/children.rs` (re-exported), the standard
//! bootstrap exchange, a TCP job whose unique id travels in a file, and raw
//! wire frames for hostile peers.
#![allow(dead_code)]

#[path = "../common/children.rs"]
mod children;

use std::path::Path;
use std::time::Duration;

use cuda_endpoints::bootstrap::IdProblem;
use cuda_endpoints::{
    bootstrap::Bootstrap, bootstrap::BootstrapError, bootstrap::Tcp, bootstrap::UniqueId,
};

// Not every binary uses all of it.
#[allow(unused_imports)]
pub use children::*;

/// The body of a bootstrap test binary's `child_entry`: a no-op in a normal
/// test run; in a child, runs `child` with the role, reports its error, and
/// exits with its status.
pub fn run_child(child: impl FnOnce(&str) -> Result<(), String>) {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let code = match child(&role) {
        Ok(()) => 0,
        Err(e) => {
            report(&format!("ERR {e}"));
            1
        }
    };
    std::process::exit(code);
}

/// The environment variable selecting a child's role.
pub const ROLE: &str = "CEB_TEST_ROLE";
pub const RANK: &str = "CEB_TEST_RANK";
pub const SIZE: &str = "CEB_TEST_SIZE";
pub const ARG: &str = "CEB_TEST_ARG";

/// What rank `r` contributes in the standard suite (lengths differ per rank).
pub fn contribution(r: usize) -> Vec<u8> {
    format!("rank{r};").repeat(r + 1).into_bytes()
}

/// Allgather, broadcasts from three roots, barrier, empty allgather; checks
/// every answer.
pub fn suite(b: &dyn Bootstrap) -> Result<(), String> {
    let t = Duration::from_secs(20);
    let (n, r) = (b.size(), b.rank());
    let e = |e: BootstrapError| e.to_string();
    let all = b.allgather(&contribution(r), t).map_err(e)?;
    let want: Vec<Vec<u8>> = (0..n).map(contribution).collect();
    if all != want {
        return Err(format!("allgather gave {all:?}"));
    }
    for root in [0, n - 1, n / 2] {
        let payload = format!("from root {root}").into_bytes();
        let got = b
            .broadcast(root, if r == root { &payload } else { &[] }, t)
            .map_err(e)?;
        if got != payload {
            return Err(format!("broadcast from {root} gave {got:?}"));
        }
    }
    b.barrier(t).map_err(e)?;
    let empty = b.allgather(&[], t).map_err(e)?;
    if empty != vec![Vec::<u8>::new(); n] {
        return Err(format!("empty allgather gave {empty:?}"));
    }
    Ok(())
}

/// Rank `rank` of a TCP job of `size`: rank 0 roots it on loopback and
/// writes the unique id to `dir/bootstrap-id`; the others read it from
/// there (waiting at most `timeout`) and join. Every step is bounded by
/// `timeout`.
pub fn file_tcp(
    rank: usize,
    size: usize,
    dir: &Path,
    timeout: Duration,
) -> Result<Tcp, BootstrapError> {
    let id_file = dir.join("bootstrap-id");
    if rank == 0 {
        let (id, root) = Tcp::root("127.0.0.1:0".parse().expect("addr"))?;
        id.write_file(&id_file)
            .map_err(|e| BootstrapError::InvalidId {
                what: IdProblem::File {
                    path: id_file.clone(),
                    kind: e.kind(),
                },
            })?;
        root.accept(size, timeout)
    } else {
        let id = UniqueId::read_file(&id_file, timeout)?;
        Tcp::join(&id, rank, size, timeout)
    }
}

/// A raw frame in the documented wire format (for hostile peers).
pub fn raw_frame(kind: u8, job: u64, seq: u64, from: u32, size: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"CEbs");
    b.extend_from_slice(&2u16.to_le_bytes());
    b.push(kind);
    b.push(0);
    b.extend_from_slice(&job.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&from.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_le_bytes());
    b.extend_from_slice(payload);
    b
}

/// The join's HMAC-SHA-256 proof (`tcp.rs`): `label` is `b"rank"` for the
/// joining rank's, `b"root"` for rank 0's.
pub fn join_proof(
    secret: &[u8],
    label: &[u8],
    job: u64,
    rank: u32,
    size: u32,
    joiner: &[u8],
    root: &[u8],
) -> Vec<u8> {
    use hmac::Mac;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key");
    m.update(b"cuda-endpoints bootstrap join v2 ");
    m.update(label);
    m.update(&job.to_le_bytes());
    m.update(&rank.to_le_bytes());
    m.update(&size.to_le_bytes());
    m.update(joiner);
    m.update(root);
    m.finalize().into_bytes().to_vec()
}

/// The secret bytes of a unique-id string.
pub fn secret_of(id: &str) -> Vec<u8> {
    let hex = id.rsplit('/').next().expect("secret part");
    (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Abstract sockets of this library still bound anywhere on the machine.
pub fn library_sockets() -> usize {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("@cuda-endpoints/"))
        .count()
}

/// This process's effective uid (`/proc/self/status`).
pub fn euid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Uid:"))?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

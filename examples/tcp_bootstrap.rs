//! The TCP bootstrap across plain OS processes on loopback: rank 0 binds,
//! starts `n-1` copies of this program with the unique id in
//! `CUDA_ENDPOINTS_BOOTSTRAP_ID`, and all ranks time allgathers of 64 bytes
//! and report how many messages the job sent.
//!
//! ```text
//! cargo run --release --example tcp_bootstrap -- 8
//! ```

#[path = "common/ranks.rs"]
mod ranks;

use std::process::Command;
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::UNIQUE_ID_ENV;
use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::Tcp, bootstrap::UniqueId};
use ranks::Ranks;

const RANK: &str = "CEB_EXAMPLE_RANK";
const SIZE: &str = "CEB_EXAMPLE_SIZE";
const ITERS: u32 = 200;

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let t = Duration::from_secs(60);
    if let Ok(rank) = std::env::var(RANK) {
        let (rank, size): (usize, usize) = (rank.parse()?, std::env::var(SIZE)?.parse()?);
        let boot = Tcp::join(&UniqueId::from_env()?, rank, size, t)?;
        return exercise(&boot, t).map(|_| ());
    }
    let size: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(4);
    let start = Instant::now();
    let (id, root) = Tcp::root("127.0.0.1:0".parse()?)?;
    let mut ranks = Ranks(Vec::new());
    for r in 1..size {
        let child = Command::new(std::env::current_exe()?)
            .env(UNIQUE_ID_ENV, id.to_string())
            .env(RANK, r.to_string())
            .env(SIZE, size.to_string())
            .spawn()?;
        ranks.0.push(child);
    }
    let boot = root.accept(size, t)?;
    let joined = start.elapsed();
    let (per_call, traffic) = exercise(&boot, t)?;
    let deadline = Instant::now() + t;
    for c in &mut ranks.0 {
        while c.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    println!(
        "{size} ranks: started and joined in {joined:?}; allgather of 64 bytes: {per_call:?} per call ({ITERS} calls); \
         per allgather the job sent {} messages (2(n-1) = {}) and {} bytes",
        traffic[0],
        2 * (size - 1),
        traffic[1],
    );
    Ok(())
}

/// Warm-up, `ITERS` timed allgathers of 64 bytes, then an allgather of every
/// rank's traffic counters (rank 0 sums them).
fn exercise(boot: &Tcp, t: Duration) -> Result<(Duration, [u64; 2]), Box<dyn std::error::Error>> {
    let mine = [boot.rank() as u8; 64];
    for _ in 0..10 {
        boot.allgather(&mine, t)?;
    }
    boot.barrier(t)?;
    let before = boot.traffic();
    let start = Instant::now();
    for _ in 0..ITERS {
        boot.allgather(&mine, t)?;
    }
    let per_call = start.elapsed() / ITERS;
    let after = boot.traffic();
    let msgs = after.messages_sent - before.messages_sent;
    let bytes = after.bytes_sent - before.bytes_sent;
    let mut counters = Vec::new();
    counters.extend_from_slice(&msgs.to_le_bytes());
    counters.extend_from_slice(&bytes.to_le_bytes());
    let all = boot.allgather(&counters, t)?;
    let mut total = [0u64; 2];
    for c in all {
        let m = u64::from_le_bytes(c.get(..8).ok_or("short")?.try_into()?);
        let b = u64::from_le_bytes(c.get(8..16).ok_or("short")?.try_into()?);
        total[0] += m / u64::from(ITERS);
        total[1] += b / u64::from(ITERS);
    }
    Ok((per_call, total))
}

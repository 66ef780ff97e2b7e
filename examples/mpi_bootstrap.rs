//! The MPI bootstrap on `MPI_COMM_WORLD`: allgather, broadcast from every
//! root, barrier, checked on every rank; then the time of a 64-byte
//! allgather. With the argument `timeout`, the last rank arrives late and the
//! others must return `Timeout` within their bound, then `Poisoned`.
//!
//! ```text
//! cargo build --features mpi --example mpi_bootstrap
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/debug/examples/mpi_bootstrap
//! ```

use std::time::{Duration, Instant};

use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::BootstrapError, bootstrap::Mpi};

fn main() {
    let timeout_case = std::env::args().any(|a| a == "timeout");
    let code = match run(timeout_case) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mpi_bootstrap: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run(timeout_case: bool) -> Result<(), String> {
    let t = Duration::from_secs(20);
    let boot = Mpi::world(t).map_err(|e| e.to_string())?;
    let (rank, size) = (boot.rank(), boot.size());
    if timeout_case {
        return late_rank(&boot);
    }
    let mine = format!("rank {rank}").repeat(rank + 1).into_bytes();
    let all = boot.allgather(&mine, t).map_err(|e| e.to_string())?;
    for (r, got) in all.iter().enumerate() {
        if *got != format!("rank {r}").repeat(r + 1).into_bytes() {
            return Err(format!("rank {rank}: allgather entry {r} is {got:?}"));
        }
    }
    for root in 0..size {
        let payload = format!("from root {root}").into_bytes();
        let got = boot
            .broadcast(root, if rank == root { &payload } else { &[] }, t)
            .map_err(|e| e.to_string())?;
        if got != payload {
            return Err(format!("rank {rank}: broadcast from {root} gave {got:?}"));
        }
    }
    boot.barrier(t).map_err(|e| e.to_string())?;
    let iters = 200;
    let start = Instant::now();
    for _ in 0..iters {
        boot.allgather(&[rank as u8; 64], t)
            .map_err(|e| e.to_string())?;
    }
    let per = start.elapsed() / iters;
    boot.barrier(t).map_err(|e| e.to_string())?;
    if rank == 0 {
        println!(
            "mpi_bootstrap: {size} ranks ok; allgather of 64 bytes: {per:?} per call; traffic {:?}",
            boot.traffic()
        );
    }
    Ok(())
}

fn late_rank(boot: &Mpi) -> Result<(), String> {
    let (rank, size) = (boot.rank(), boot.size());
    if rank + 1 == size {
        std::thread::sleep(Duration::from_millis(1500));
        // The others gave up after the first half (the lengths) of their
        // allgather: the late rank gets through that half, then times out in
        // the second, within its own bound.
        let start = Instant::now();
        return match boot.allgather(b"late", Duration::from_millis(500)) {
            Err(BootstrapError::Timeout { .. })
                if start.elapsed() < Duration::from_millis(1500) =>
            {
                println!("mpi_bootstrap: rank {rank} arrived late and timed out within its bound");
                Ok(())
            }
            other => Err(format!(
                "rank {rank}: expected a bounded timeout, got {other:?}"
            )),
        };
    }
    let start = Instant::now();
    match boot.allgather(b"early", Duration::from_millis(300)) {
        Err(BootstrapError::Timeout { .. }) if start.elapsed() < Duration::from_millis(1000) => {}
        other => {
            return Err(format!(
                "rank {rank}: expected a bounded timeout, got {other:?} after {:?}",
                start.elapsed()
            ));
        }
    }
    match boot.barrier(Duration::from_millis(300)) {
        Err(BootstrapError::Poisoned { .. }) => {}
        other => return Err(format!("rank {rank}: expected Poisoned, got {other:?}")),
    }
    println!("mpi_bootstrap: rank {rank} timed out within its bound, then refused further use");
    Ok(())
}

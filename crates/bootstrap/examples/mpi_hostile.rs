//! Hostile ranks of an MPI job (issue 21): run under `mpirun -n 4` by
//! `tests/mpi_hostile.rs` as `mpi_hostile CASE DIR`. The last rank
//! misbehaves as CASE says; every other rank runs an allgather and writes
//! one line, `HONEST <rank> <error>`, with the error it got (or `OK`), to
//! `DIR/honest-<rank>` and to stdout.
//!
//! - `silent`: the last rank never enters a collective. The others must get
//!   [`BootstrapError::Timeout`] within their bound, then `Poisoned`.
//! - `huge`: it announces a length beyond the frame limit. The others must
//!   get [`BootstrapError::Oversized`] naming it, before any payload.
//! - `short`: it announces 10 bytes (the envelope's magic, then less than
//!   a header) and sends a full slot. The others must get
//!   [`BootstrapError::Malformed`] (truncated) naming it.
//! - `garbage`: it announces and sends 200 bytes that are no envelope. The
//!   others must get [`BootstrapError::Malformed`] (magic) naming it.
//!
//! Every rank leaves with `process::exit`, not through `MPI_Finalize`: a
//! collective the hostile rank never completed may be pending, and
//! finalizing with it could block. So `mpirun`'s status is not the verdict;
//! the written lines are (every rank waits for all of them before it
//! leaves).
//!
//! ```text
//! cargo build -p cuda-endpoints-bootstrap --features mpi --example mpi_hostile
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/debug/examples/mpi_hostile silent /tmp/d
//! ```

use std::time::Duration;

use cuda_endpoints_bootstrap::{Bootstrap, BootstrapError, Mpi};
use mpi::traits::{Communicator, CommunicatorCollectives};

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_default();
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| ".".into()));
    let boot = match Mpi::world(Duration::from_secs(60)) {
        Ok(b) => b,
        Err(e) => {
            println!("SETUP {e}");
            std::process::exit(2);
        }
    };
    let (rank, size) = (boot.rank(), boot.size());
    if rank + 1 == size {
        hostile(&boot, &case);
        leave(&dir, size);
    }
    // Only the silent case waits out its bound; in the others an error
    // comes as soon as the hostile rank's bytes do, so the bound is far
    // longer than any start-up skew on a loaded machine.
    let bound = Duration::from_secs(if case == "silent" { 3 } else { 30 });
    let line = match boot.allgather(format!("rank {rank}").as_bytes(), bound) {
        Ok(_) => "OK".to_owned(),
        Err(e) => {
            // After a timeout the communicator must refuse further use.
            let after = match &e {
                BootstrapError::Timeout { .. } => match boot.barrier(bound) {
                    Err(BootstrapError::Poisoned { .. }) => " then Poisoned",
                    _ => " then usable",
                },
                _ => "",
            };
            format!("{e:?}{after}")
        }
    };
    let said = format!("HONEST {rank} {line}");
    println!("{said}");
    // Written under another name, then renamed: the others count the
    // `honest-` files to leave, and a rank ended by `mpirun` while it still
    // wrote would leave an empty one (a flake of the harness, seen once in
    // CI: two answers read back of three printed).
    let (part, whole) = (
        dir.join(format!("part-{rank}")),
        dir.join(format!("honest-{rank}")),
    );
    if std::fs::write(&part, said).is_err() || std::fs::rename(&part, &whole).is_err() {
        std::process::exit(3);
    }
    leave(&dir, size);
}

/// Exits once every honest rank wrote its line into `dir` (at most a
/// minute): the first rank to leave without `MPI_Finalize` makes `mpirun`
/// end the others, so none leaves before all have answered.
fn leave(dir: &std::path::Path, size: usize) -> ! {
    let all = |d: &std::path::Path| {
        std::fs::read_dir(d).map_or(0, |e| {
            e.flatten()
                .filter(|f| f.file_name().to_string_lossy().starts_with("honest-"))
                .count()
        })
    };
    for _ in 0..6000 {
        if all(dir) + 1 >= size {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::process::exit(0);
}

/// The last rank's misbehaviour, with raw MPI calls on the same
/// communicator.
fn hostile(boot: &Mpi, case: &str) {
    let comm = boot.communicator();
    let size = usize::try_from(comm.size()).unwrap_or(0);
    let (announce, send): (u64, Option<Vec<u8>>) = match case {
        "silent" => return,
        "huge" => (u64::MAX, None),
        // An envelope's magic, then less than a header.
        "short" => (10, Some(b"CEbs".to_vec())),
        "garbage" => (200, Some(vec![0xAB; 200])),
        _ => return,
    };
    // Non-blocking, as the honest ranks' (a blocking collective does not
    // match a non-blocking one).
    let mut lens = vec![0u64; size];
    let mine = [announce];
    mpi::request::scope(|scope| {
        comm.immediate_all_gather_into(scope, &mine[..], &mut lens[..])
            .wait();
    });
    let Some(mut bytes) = send else { return };
    // The slot every rank uses: the longest announced length.
    let slot = usize::try_from(lens.iter().copied().max().unwrap_or(0)).unwrap_or(0);
    bytes.resize(slot, 0x5A);
    let mut all = vec![0u8; slot * size];
    mpi::request::scope(|scope| {
        comm.immediate_all_gather_into(scope, &bytes[..], &mut all[..])
            .wait();
    });
}

//! The MPI bootstrap under `mpirun -n 4` (feature `mpi`): collectives
//! correct on every rank, and a late rank gives the others a bounded
//! timeout, then `Poisoned`. Runs `examples/mpi_bootstrap.rs`, which
//! `cargo test --features mpi` builds; when `mpirun` is missing each test
//! prints `skipped: mpirun not found`, and fails if
//! `CUDA_ENDPOINTS_REQUIRE_MPI=1`.
#![cfg(feature = "mpi")]

use crate::bootstrap_support;

use std::time::Duration;

use bootstrap_support::Children;

fn mpirun(args: &[&str]) -> Option<bootstrap_support::Done> {
    // Its pipes would upset the descriptor counts of the binary's other tests.
    let _serial = bootstrap_support::serial();
    if !bootstrap_support::mpirun_found() {
        return None;
    }
    let mut kids = Children::default();
    let exe = bootstrap_support::example("mpi_bootstrap");
    let mut full = [&bootstrap_support::MPIRUN[..], &["-n", "4"]].concat();
    full.push(exe.to_str().expect("utf-8 path"));
    full.extend_from_slice(args);
    kids.spawn_command("mpirun", "mpirun", &full);
    kids.wait_all(Duration::from_secs(120)).pop()
}

#[test]
fn mpi_collectives_are_correct_on_4_ranks() {
    let Some(d) = mpirun(&[]) else { return };
    assert_eq!(d.code, Some(0), "{}\n{}", d.stdout, d.stderr);
    assert!(d.stdout.contains("4 ranks ok"), "{}", d.stdout);
}

#[test]
fn a_late_mpi_rank_gives_the_others_a_bounded_timeout_then_poisoned() {
    let Some(d) = mpirun(&["timeout"]) else {
        return;
    };
    assert_eq!(d.code, Some(0), "{}\n{}", d.stdout, d.stderr);
    assert_eq!(
        d.stdout.matches("timed out within its bound").count(),
        4,
        "{}",
        d.stdout
    );
}

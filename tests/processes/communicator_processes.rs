//! The communicator across real OS processes (issue 20): the example
//! `communicator` (built by `cargo test`) run as a job of 4 processes over
//! TCP on a model fabric (it is the launcher and rank 0), and under
//! `mpirun` with the fabric's launcher (feature `mpi`). Each rank keeps
//! three owned communicators in a `HashMap`, retries its first bring-up
//! together with every rank (rank 1's driver is not ready for its first two
//! creates; every rank counts the failed attempts in its trace), moves
//! bytes through every heap, grows one heap and shrinks it by agreement,
//! and drops its communicators in its own order; the job ends with every
//! byte and count right, every process gone, and the fabric empty and free
//! of broken rules (the example's exit code 0; `examples/common/job.rs`).
//!
//! The example's other modes, as jobs of OS processes: `--eight` (item 7:
//! eight communicators per process brought up at once, over one shared TCP
//! bootstrap; under `mpirun`, over eight TCP bootstraps rooted through MPI)
//! and `--forge-id-table` (item 5, R13.4: one rank's forged
//! peer-to-id table digest fails every rank; over TCP and under `mpirun`).
//! Every wait is bounded; the children are killed and reaped on every path.
#![cfg(feature = "fabric")]

use crate::children;
use crate::forge;

use std::time::Duration;

use children::{Children, Done};

/// The whole job ends within this (its own waits are bounded by 20 s each).
const JOB: Duration = Duration::from_secs(180);

fn run(program: &str, args: &[&str]) -> Done {
    let _serial = children::serial();
    let mut kids = Children::default();
    kids.spawn_command("job", program, args);
    kids.wait_all(JOB).pop().expect("the job")
}

#[track_caller]
fn every_byte_right(d: &Done) {
    assert_eq!(d.code, Some(0), "{}\n{}", d.stdout, d.stderr);
    assert_eq!(
        d.stdout.matches("bytes checked, all right").count(),
        4,
        "{}\n{}",
        d.stdout,
        d.stderr
    );
}

#[test]
fn communicators_over_tcp_between_four_processes_retry_grow_shrink_and_drop_in_any_order() {
    let exe = children::example("communicator");
    let d = run(exe.to_str().expect("utf-8 path"), &["4", "1"]);
    every_byte_right(&d);
    assert!(
        d.stdout
            .contains("every byte right on every rank, nothing left"),
        "{}",
        d.stdout
    );
}

#[cfg(feature = "mpi")]
#[test]
fn communicators_between_four_mpi_ranks_under_mpirun_retry_grow_shrink_and_drop_in_any_order() {
    if !children::mpirun_found() {
        return;
    }
    let exe = children::example("communicator");
    let launcher = env!("CARGO_BIN_EXE_cuda-endpoints-fabric");
    let d = run(
        launcher,
        &[
            "--nodes",
            "1",
            "--gpus",
            "4",
            "--driver-version",
            "13050",
            "--",
            "mpirun",
            children::MPIRUN[0],
            children::MPIRUN[1],
            "-n",
            "4",
            exe.to_str().expect("utf-8 path"),
            "--mpi",
        ],
    );
    every_byte_right(&d);
}

/// The example's mode `mode` as a job of 4 processes over TCP (the example
/// is the launcher and rank 0).
fn tcp_job(mode: &str) -> Done {
    let exe = children::example("communicator");
    run(exe.to_str().expect("utf-8 path"), &["4", "1", mode])
}

/// The example's mode `mode` as 4 MPI ranks under `mpirun`, on a fabric of
/// the fabric's launcher (which exits 3 on a leak or a broken rule).
#[cfg(feature = "mpi")]
fn mpi_job(mode: &str) -> Done {
    let exe = children::example("communicator");
    let launcher = env!("CARGO_BIN_EXE_cuda-endpoints-fabric");
    run(
        launcher,
        &[
            "--nodes",
            "1",
            "--gpus",
            "4",
            "--driver-version",
            "13050",
            "--",
            "mpirun",
            children::MPIRUN[0],
            children::MPIRUN[1],
            "-n",
            "4",
            exe.to_str().expect("utf-8 path"),
            "--mpi",
            mode,
        ],
    )
}

/// Every rank's R13.4 line names rank 1's forged digest and rank 0's honest
/// one, the same on all 4: the forged one is the honest one with the
/// forger's flip (`common/forge.rs`).
#[track_caller]
fn every_rank_named_both_digests(d: &Done) {
    let named: Vec<(u64, u64)> = d
        .stdout
        .lines()
        .filter_map(|l| l.split_once("R13.4 refused: rank 1's peer-to-id table "))
        .map(|(_, rest)| {
            let (reported, expected) = rest.split_once(" is not rank 0's ").expect("both digests");
            let hex = |h: &str| u64::from_str_radix(h.trim_start_matches("0x"), 16).expect("hex");
            (hex(reported), hex(expected))
        })
        .collect();
    assert_eq!(named.len(), 4, "{}\n{}", d.stdout, d.stderr);
    let (reported, expected) = named[0];
    assert_eq!(reported, expected ^ forge::FLIP, "{}", d.stdout);
    assert!(named.iter().all(|n| *n == named[0]), "{named:x?}");
}

#[test]
fn r13_4_a_forged_peer_to_id_table_fails_every_process_over_tcp_naming_rank_1_and_both_digests_with_nothing_left()
 {
    // Each rank also checks that it holds nothing after the failure, then
    // brings the peers up honestly and moves bytes; the launcher checks
    // that the fabric holds nothing and saw no broken rule.
    let d = tcp_job("--forge-id-table");
    every_byte_right(&d);
    every_rank_named_both_digests(&d);
    assert!(
        d.stdout
            .contains("every byte right on every rank, nothing left"),
        "{}",
        d.stdout
    );
}

#[cfg(feature = "mpi")]
#[test]
fn r13_4_a_forged_peer_to_id_table_fails_every_mpi_rank_under_mpirun_naming_rank_1_and_both_digests_with_nothing_left()
 {
    if !children::mpirun_found() {
        return;
    }
    let d = mpi_job("--forge-id-table");
    every_byte_right(&d);
    every_rank_named_both_digests(&d);
    assert!(d.stderr.contains("nothing leaked"), "{}", d.stderr);
}

#[test]
fn eight_communicators_per_process_over_one_shared_tcp_bootstrap_come_up_at_once_between_four_processes_and_none_crosses()
 {
    // Each process brings up eight tagged communicators at once, each on
    // its own thread and channel of its one TCP bootstrap; each moves bytes
    // with every peer and checks every byte (a crossed message would be
    // another tag's, refused, or another communicator's bytes, wrong);
    // every wait is bounded by the bring-ups' timeout.
    let d = tcp_job("--eight");
    every_byte_right(&d);
    assert_eq!(
        d.stdout
            .matches("8 communicators came up at once over one shared bootstrap, none crossed")
            .count(),
        4,
        "{}",
        d.stdout
    );
    assert!(
        d.stdout
            .contains("every byte right on every rank, nothing left"),
        "{}",
        d.stdout
    );
}

#[cfg(feature = "mpi")]
#[test]
fn eight_communicators_per_mpi_rank_under_mpirun_come_up_at_once_each_over_its_own_bootstrap_and_none_crosses()
 {
    // An MPI communicator is not shared by threads: each of the eight has
    // a TCP bootstrap of its own, rooted by rank 0 with its id sent over
    // MPI (as the threads test's eight bootstrap groups); the fabric's
    // launcher exits 3 on a leak or a broken rule.
    if !children::mpirun_found() {
        return;
    }
    let d = mpi_job("--eight");
    every_byte_right(&d);
    assert_eq!(
        d.stdout
            .matches("8 communicators came up at once over eight TCP bootstraps, none crossed")
            .count(),
        4,
        "{}",
        d.stdout
    );
    assert!(d.stderr.contains("nothing leaked"), "{}", d.stderr);
}

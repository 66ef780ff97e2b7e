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
//! Every wait is bounded; the children are killed and reaped on every path.
#![cfg(feature = "fabric")]

#[path = "common/children.rs"]
mod children;

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

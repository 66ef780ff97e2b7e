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

use std::path::PathBuf;
use std::time::Duration;

use children::{Children, Done};

/// The whole job ends within this (its own waits are bounded by 20 s each).
const JOB: Duration = Duration::from_secs(180);

fn example() -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/communicator
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("examples")
        .join("communicator")
}

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
    let exe = example();
    assert!(exe.exists(), "{} not built", exe.display());
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
    use std::io::Write;
    const REQUIRE: &str = "CUDA_ENDPOINTS_REQUIRE_MPI";
    if std::process::Command::new("mpirun")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os(REQUIRE).is_none_or(|v| v != "1"),
            "mpirun not found but {REQUIRE}=1: the MPI tests must run"
        );
        let _ = writeln!(
            std::io::stderr(),
            "skipped: mpirun not found ({REQUIRE}=1 makes this a failure)"
        );
        return;
    }
    let exe = example();
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
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "4",
            exe.to_str().expect("utf-8 path"),
            "--mpi",
        ],
    );
    every_byte_right(&d);
}

//! Hostile ranks of an MPI job (issue 21): a rank that never enters a
//! collective, and ranks that announce a wrong length (beyond the limit,
//! shorter than what they send, garbage), under `mpirun -n 4` with the
//! example `mpi_hostile`. Every honest rank gets a typed error naming what
//! happened within its bound: no hang (each run is bounded and killed past
//! it) and no panic. When `mpirun` is missing each test prints `skipped:
//! mpirun not found`, and fails if `CUDA_ENDPOINTS_REQUIRE_MPI=1`.
#![cfg(feature = "mpi")]

// The root crate's child harness (std only): the MPI tests of both crates
// find their example and `mpirun` alike, and skip or fail alike.
#[path = "../../../tests/common/children.rs"]
mod children;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Far beyond any bound under test: only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

/// The honest ranks' lines, by rank, of `mpirun -n 4 mpi_hostile <case> <dir>`;
/// `None` when `mpirun` is missing (skipped).
fn run(case: &str) -> Option<Vec<String>> {
    // One job at a time: four ranks each, on a small machine.
    let _one = children::serial();
    if !children::mpirun_found() {
        return None;
    }
    let exe = children::example("mpi_hostile");
    let dir = std::env::temp_dir().join(format!("mpi-hostile-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the answers");
    let mut child = Command::new("mpirun")
        .args(children::MPIRUN)
        .args(["-n", "4"])
        .arg(&exe)
        .arg(case)
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + HANG;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mpirun {case}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stdout = reader.join().expect("reader");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(
        !stdout.contains("panicked") && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    // The files, not stdout: `mpirun` may end a rank before its output
    // is forwarded.
    let mut lines: Vec<String> = (0..3)
        .filter_map(|r| std::fs::read_to_string(dir.join(format!("honest-{r}"))).ok())
        .filter_map(|l| l.strip_prefix("HONEST ").map(str::to_owned))
        .collect();
    lines.sort();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        lines.len(),
        3,
        "three honest ranks answer:\n{stdout}\n{stderr}"
    );
    Some(lines)
}

#[test]
fn a_rank_that_never_enters_a_collective_times_the_others_out_then_poisons() {
    let Some(lines) = run("silent") else { return };
    for (r, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(&format!("{r} Timeout")) && l.ends_with("then Poisoned"),
            "{lines:?}"
        );
    }
}

#[test]
fn a_rank_announcing_a_length_beyond_the_limit_is_oversized_before_any_payload() {
    let Some(lines) = run("huge") else { return };
    for l in &lines {
        assert!(
            l.contains("Oversized") && l.contains("peer: 3") && l.contains("18446744073709551615"),
            "{lines:?}"
        );
    }
}

#[test]
fn a_rank_announcing_fewer_bytes_than_it_sends_is_malformed_truncated() {
    let Some(lines) = run("short") else { return };
    for l in &lines {
        assert!(
            l.contains("Malformed") && l.contains("peer: 3") && l.contains("Truncated"),
            "{lines:?}"
        );
    }
}

#[test]
fn a_rank_sending_garbage_of_the_length_it_announced_is_malformed() {
    let Some(lines) = run("garbage") else { return };
    for l in &lines {
        assert!(
            l.contains("Malformed") && l.contains("peer: 3") && l.contains("Magic"),
            "{lines:?}"
        );
    }
}

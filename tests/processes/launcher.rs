//! The launcher `cuda-endpoints-fabric` as a user runs it, with real OS
//! processes: `-n 4` starts four ranks that find each other through
//! `Tcp::from_env()` (issue 20 item 8); a launcher killed by SIGKILL or
//! SIGTERM leaves no process of its job and no temporary directory behind
//! (issue 21 item 9).

use crate::bootstrap_support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bootstrap_support::*;
use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::Tcp};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_cuda-endpoints-fabric");
const ENTRY: &str = "launcher::child_entry";

/// A rank started by the launcher: `Tcp::from_env()`, then an allgather of
/// its rank and node, reported.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let t = Duration::from_secs(60);
    // Held until this rank is done, when it could bind rank 0's port.
    let mut _squatted = None;
    match role.as_str() {
        "from_env" => {}
        "squat_then_from_env" => {
            let rank = env_usize("CUDA_ENDPOINTS_RANK");
            let dir = PathBuf::from(std::env::var(ARG).expect("marker dir"));
            if rank == 0 {
                // Rank 0 starts last: after every other rank tried its port.
                let size = env_usize("CUDA_ENDPOINTS_SIZE");
                let deadline = Instant::now() + t;
                while (1..size).any(|r| !dir.join(format!("tried{r}")).exists()) {
                    assert!(Instant::now() < deadline, "the other ranks never tried");
                    std::thread::sleep(Duration::from_millis(10));
                }
            } else {
                let id: cuda_endpoints::bootstrap::UniqueId =
                    std::env::var("CUDA_ENDPOINTS_BOOTSTRAP_ID")
                        .expect("id")
                        .parse()
                        .expect("id parses");
                match std::net::TcpListener::bind(id.addr()) {
                    Ok(l) => {
                        report(&format!("SQUAT {rank} took rank 0's port"));
                        _squatted = Some(l);
                    }
                    Err(e) => report(&format!("SQUAT {rank} refused: {:?}", e.kind())),
                }
                std::fs::write(dir.join(format!("tried{rank}")), b"").expect("marker");
            }
        }
        other => panic!("unknown role {other}"),
    }
    let boot = Tcp::from_env(t).expect("Tcp::from_env");
    let node = std::env::var("CUDA_ENDPOINTS_NODE").expect("node");
    let mine = format!("{}@{node}", boot.rank());
    let all = boot.allgather(mine.as_bytes(), t).expect("allgather");
    let all: Vec<String> = all
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf8"))
        .collect();
    report(&format!("{} {}", boot.rank(), all.join(",")));
    boot.barrier(t).expect("barrier");
    std::process::exit(0);
}

#[test]
fn the_launcher_starts_4_ranks_that_allgather_through_tcp_from_env() {
    let _s = serial();
    let exe = std::env::current_exe().expect("exe");
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(["-n", "4", "--nodes", "2", "--gpus", "2", "--"])
        .arg(exe)
        .args([ENTRY, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, "from_env")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let done = Guard::spawn("launcher", &mut cmd).finish(Instant::now() + Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{}\n{}", done.stdout, done.stderr);
    let mut lines = done.results();
    lines.sort();
    let all = "0@0,1@0,2@1,3@1";
    assert_eq!(
        lines,
        (0..4).map(|r| format!("{r} {all}")).collect::<Vec<_>>(),
        "{}",
        done.stderr
    );
}

/// The `-n` port race (issue 21): the launcher used to pick rank 0's port
/// by binding and closing it, so another process could bind it before rank
/// 0 did. Now the launcher hands rank 0 the bound listener itself: ranks
/// 1..3 try to bind the port before rank 0 even starts, are refused, and
/// the job forms.
#[test]
fn no_process_can_take_rank_0s_port_between_the_launcher_and_rank_0() {
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("exe");
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(["-n", "4", "--"])
        .arg(exe)
        .args([ENTRY, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, "squat_then_from_env")
        .env(ARG, dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let done = Guard::spawn("launcher", &mut cmd).finish(Instant::now() + Duration::from_secs(120));
    let mut squats: Vec<String> = done
        .results()
        .into_iter()
        .filter(|l| l.starts_with("SQUAT"))
        .collect();
    squats.sort();
    assert_eq!(
        squats,
        (1..4)
            .map(|r| format!("SQUAT {r} refused: AddrInUse"))
            .collect::<Vec<_>>(),
        "{}",
        done.stderr
    );
    assert_eq!(done.code, Some(0), "{}\n{}", done.stdout, done.stderr);
    let formed = done
        .results()
        .iter()
        .filter(|l| l.ends_with("0@0,1@0,2@0,3@0"))
        .count();
    assert_eq!(formed, 4, "{}\n{}", done.stdout, done.stderr);
}

#[test]
fn the_launchers_help_describes_n() {
    let out = Command::new(LAUNCHER)
        .arg("--help")
        .output()
        .expect("launcher --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(help.contains("-n, --ranks <N>"), "{help}");
    assert!(help.contains("CUDA_ENDPOINTS_RANK"), "{help}");
}

/// Whether `pid` is gone (or a zombie nobody reaps yet: it runs no more).
fn gone(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn killed_launcher_leaves_nothing(signal: &str) {
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(["--", "/bin/sh", "-c", "echo $$ > \"$0\"; exec sleep 600"])
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut launcher = Guard::spawn("launcher", &mut cmd);
    // "cuda-endpoints-fabric: 1 node(s) x 4 GPU(s) at /tmp/.../socket"
    let stderr = launcher.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).expect("line");
    let socket = PathBuf::from(line.trim().rsplit(" at ").next().expect("socket"));
    let tmp = socket.parent().expect("temp dir").to_owned();
    assert!(tmp.exists(), "{line}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&pidfile)
            && !p.trim().is_empty()
        {
            break p.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    let status = Command::new("kill")
        .args([signal, &launcher.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert!(launcher.wait_until(deadline).is_some(), "the launcher died");
    while !gone(&pid) || tmp.exists() {
        assert!(
            Instant::now() < deadline,
            "left behind: job {pid} running: {}, {} exists: {}",
            !gone(&pid),
            tmp.display(),
            tmp.exists()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_launcher_killed_by_sigkill_leaves_no_job_and_no_temp_dir() {
    killed_launcher_leaves_nothing("-KILL");
}

#[test]
fn a_launcher_killed_by_sigterm_leaves_no_job_and_no_temp_dir() {
    killed_launcher_leaves_nothing("-TERM");
}

/// Killed as soon as it names its fabric, before or while it starts the job:
/// the watchdog exists from then on, so the directory still goes.
#[test]
fn a_launcher_killed_as_soon_as_it_names_its_fabric_leaves_no_temp_dir() {
    let _s = serial();
    for signal in ["-KILL", "-TERM"] {
        let mut cmd = Command::new(LAUNCHER);
        cmd.args(["-n", "4", "--", "/bin/sh", "-c", "exec sleep 600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut launcher = Guard::spawn("launcher", &mut cmd);
        let stderr = launcher.stderr.take().expect("stderr");
        let mut line = String::new();
        BufReader::new(stderr).read_line(&mut line).expect("line");
        let socket = PathBuf::from(line.trim().rsplit(" at ").next().expect("socket"));
        let tmp = socket.parent().expect("temp dir").to_owned();
        let status = Command::new("kill")
            .args([signal, &launcher.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        assert!(launcher.wait_until(deadline).is_some(), "the launcher died");
        while tmp.exists() {
            assert!(
                Instant::now() < deadline,
                "{signal}: {} left behind",
                tmp.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `--tag-output` (with `-n`, as `mpirun --tag-output`): every line a rank
/// prints, on stdout and on stderr, starts with `[rank R] `, a last line
/// without a newline too, each whole.
#[test]
fn tag_output_starts_every_line_a_rank_prints_with_its_rank() {
    let _s = serial();
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(["-n", "3", "--tag-output", "--", "/bin/sh", "-c"])
        .arg(r#"r=$CUDA_ENDPOINTS_RANK; echo "out $r"; echo "err $r" >&2; echo "two $r"; printf "last $r""#)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let done = Guard::spawn("launcher", &mut cmd).finish(Instant::now() + Duration::from_secs(60));
    assert_eq!(done.code, Some(0), "{}\n{}", done.stdout, done.stderr);
    let mut out: Vec<&str> = done.stdout.lines().collect();
    out.sort_unstable();
    let want: Vec<String> = ["last", "out", "two"]
        .iter()
        .flat_map(|w| (0..3).map(move |r| (r, w)))
        .map(|(r, w)| format!("[rank {r}] {w} {r}"))
        .collect();
    let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(out, want, "{}", done.stdout);
    for r in 0..3 {
        let line = format!("[rank {r}] err {r}");
        assert!(done.stderr.lines().any(|l| l == line), "{}", done.stderr);
    }
    // Rank 0's lines in the order it printed them.
    let zero: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.starts_with("[rank 0]"))
        .collect();
    assert_eq!(
        zero,
        ["[rank 0] out 0", "[rank 0] two 0", "[rank 0] last 0"]
    );
}

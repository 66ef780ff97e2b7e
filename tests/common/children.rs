//! The one child-process harness of the multi-process tests: re-executing
//! the test binary as a child (one test as its entry point, a role chosen
//! by environment variable), a guard that kills and reaps a child on every
//! path ([`Guard`]), bounded waits ([`Guard::wait_until`],
//! [`Children::wait_all`]), result lines ([`report`], [`Done::results`])
//! and `@@ key value` message lines read as they come ([`Lines`]); the
//! examples that `cargo test` builds ([`example`]) and the check for
//! `mpirun` that the MPI tests skip or fail by ([`mpirun_found`]).
//!
//! Included by an area's `main.rs` as `#[path = "../common/children.rs"] mod children;`
//! (or through
//! `tests/bootstrap_support`, which re-exports it; the bootstrap crate's
//! `tests/mpi_hostile.rs` includes it by path too, so it uses std only).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Tests of one binary run one at a time: they count fds, sockets and
/// processes of this process. One binary holds several modules (an area):
/// every test of it that opens descriptors or starts processes while
/// another counts them must hold this lock too.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The example `name`, which `cargo test` builds next to the test
/// binaries: target/<profile>/deps/<test> -> target/<profile>/examples/<name>.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let path = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} not built (cargo test builds it)",
        path.display()
    );
    path
}

/// Set to `1` (CI does), a missing `mpirun` fails the MPI tests instead of
/// skipping them.
pub const REQUIRE_MPI: &str = "CUDA_ENDPOINTS_REQUIRE_MPI";

/// `mpirun`'s arguments before the program: as root too, and more ranks
/// than cores.
pub const MPIRUN: [&str; 2] = ["--allow-run-as-root", "--oversubscribe"];

/// Whether `mpirun` runs here. When it does not, the test is skipped, said
/// on the process's stderr (libtest captures `eprintln!`, and a skip must
/// show in the test run, not pass as a silent "ok"), or fails under
/// [`REQUIRE_MPI`]`=1`.
pub fn mpirun_found() -> bool {
    if Command::new("mpirun").arg("--version").output().is_ok() {
        return true;
    }
    let fix = "apt-get install -y openmpi-bin libopenmpi-dev libclang-dev";
    assert!(
        std::env::var_os(REQUIRE_MPI).is_none_or(|v| v != "1"),
        "mpirun not found but {REQUIRE_MPI}=1: the MPI tests must run ({fix})"
    );
    let _ = writeln!(
        std::io::stderr(),
        "{}: skipped: mpirun not found ({fix}; {REQUIRE_MPI}=1 makes this a failure)",
        std::thread::current().name().unwrap_or("an MPI test")
    );
    false
}

/// This test binary, to run only the test `entry` (its libtest name, module
/// first: `bootstrap_tcp::child_entry`; the one that dispatches
/// on the child's role), output not captured, stdin closed, stdout and
/// stderr piped.
pub fn test_binary(entry: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([entry, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A child process that is killed (SIGKILL) and reaped when dropped,
/// whatever happened; derefs to the [`Child`].
#[derive(Debug)]
pub struct Guard {
    pub name: String,
    child: Child,
}

impl Guard {
    /// Spawns `cmd` under a guard.
    pub fn spawn(name: &str, cmd: &mut Command) -> Guard {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Guard {
            name: name.to_owned(),
            child,
        }
    }

    /// Waits for the exit until `deadline`; past it, kills the child and
    /// answers `None`.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }

    /// Waits as [`Guard::wait_until`], then reads what the child printed.
    pub fn finish(mut self, deadline: Instant) -> Done {
        let status = self.wait_until(deadline);
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut stdout);
        }
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut stderr);
        }
        Done {
            name: std::mem::take(&mut self.name),
            code: status.and_then(|s| s.code()),
            stdout,
            stderr,
        }
    }
}

impl Deref for Guard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// One finished child.
#[derive(Debug)]
pub struct Done {
    pub name: String,
    /// The exit code; `None` when killed (by a signal, or past the bound).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Done {
    /// Lines the child printed with [`report`].
    pub fn results(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("CEB-RESULT "))
            .map(str::to_owned)
            .collect()
    }
}

/// Prints a result line for the parent ([`Done::results`]).
pub fn report(line: &str) {
    println!("CEB-RESULT {line}");
}

/// A child's environment variable as a number.
pub fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("child env")
}

/// Children that are killed and reaped when the guard drops.
#[derive(Default)]
pub struct Children {
    kids: Vec<Guard>,
}

impl Children {
    /// Re-executes this test binary running only `entry` (the test that
    /// dispatches on the role), with `envs`.
    pub fn spawn(&mut self, name: &str, entry: &str, envs: &[(&str, String)]) -> u32 {
        let mut cmd = test_binary(entry);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        self.push(Guard::spawn(name, &mut cmd))
    }

    /// Runs `program` with `args` under the guard.
    pub fn spawn_command(&mut self, name: &str, program: &str, args: &[&str]) -> u32 {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.push(Guard::spawn(name, &mut cmd))
    }

    fn push(&mut self, g: Guard) -> u32 {
        let pid = g.id();
        self.kids.push(g);
        pid
    }

    /// Removes the child `name` from the set; it stays guarded (killed
    /// when the returned guard drops).
    pub fn take(&mut self, name: &str) -> Option<Guard> {
        let i = self.kids.iter().position(|g| g.name == name)?;
        Some(self.kids.remove(i))
    }

    /// Waits for every child, at most `bound` in all; kills the rest.
    pub fn wait_all(&mut self, bound: Duration) -> Vec<Done> {
        let deadline = Instant::now() + bound;
        self.kids.drain(..).map(|g| g.finish(deadline)).collect()
    }
}

/// The `@@ key value` lines of a child's stdout, read by a thread as they
/// come (anything else, e.g. libtest's own lines, is skipped).
pub struct Lines {
    name: String,
    rx: Receiver<String>,
}

impl Lines {
    /// Reads `stdout` of the child `name`.
    pub fn read(name: &str, stdout: ChildStdout) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may have written "test child_role ... " first.
                if let Some(at) = line.find("@@ ")
                    && tx.send(line[at + 3..].to_string()).is_err()
                {
                    break;
                }
            }
        });
        Lines {
            name: name.to_owned(),
            rx,
        }
    }

    /// The value of the next message `key`, within `bound`; an `error`
    /// message on the way fails the test.
    pub fn expect(&self, key: &str, bound: Duration) -> String {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(msg) => {
                    let (k, v) = msg.split_once(' ').unwrap_or((&msg, ""));
                    if k == key {
                        return v.to_string();
                    }
                    assert!(k != "error", "{}: {v}", self.name);
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no `{key}` within {bound:?}", self.name)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: exited before saying `{key}`", self.name)
                }
            }
        }
    }
}

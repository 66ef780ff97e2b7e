//! Fixtures for the bootstrap tests: re-executing the test binary as child
//! ranks (a role chosen by environment variable), a guard that kills and
//! reaps every child on every path, bounded waits, and raw wire frames for
//! hostile peers.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_endpoints::{Bootstrap, BootstrapError};

/// The environment variable selecting a child's role.
pub const ROLE: &str = "CEB_TEST_ROLE";
pub const RANK: &str = "CEB_TEST_RANK";
pub const SIZE: &str = "CEB_TEST_SIZE";
pub const ARG: &str = "CEB_TEST_ARG";

/// Tests of one binary run one at a time: they count fds, sockets and
/// processes of this process.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One finished child.
#[derive(Debug)]
pub struct Done {
    pub name: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Done {
    /// Lines the child printed with `report`.
    pub fn results(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("CEB-RESULT "))
            .map(str::to_owned)
            .collect()
    }
}

/// Children that are killed and reaped when the guard drops.
#[derive(Default)]
pub struct Children {
    kids: Vec<(String, Child)>,
}

impl Children {
    /// Re-executes this test binary running only `entry` (the test that
    /// dispatches on [`ROLE`]), with `envs`.
    pub fn spawn(&mut self, name: &str, entry: &str, envs: &[(&str, String)]) -> u32 {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args([entry, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn child rank");
        let pid = child.id();
        self.kids.push((name.to_owned(), child));
        pid
    }

    /// Runs `program` with `args` under the guard.
    pub fn spawn_command(&mut self, name: &str, program: &str, args: &[&str]) -> u32 {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let pid = child.id();
        self.kids.push((name.to_owned(), child));
        pid
    }

    /// Removes the child `name` from the guard (the caller kills it).
    pub fn take(&mut self, name: &str) -> Option<Child> {
        let i = self.kids.iter().position(|(n, _)| n == name)?;
        Some(self.kids.remove(i).1)
    }

    /// Waits for every child, at most `bound` in all; kills the rest.
    pub fn wait_all(&mut self, bound: Duration) -> Vec<Done> {
        let deadline = Instant::now() + bound;
        let mut out = Vec::new();
        for (name, mut child) in self.kids.drain(..) {
            let code = loop {
                match child.try_wait() {
                    Ok(Some(st)) => break st.code(),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                }
            };
            let mut stdout = String::new();
            let mut stderr = String::new();
            if let Some(mut s) = child.stdout.take() {
                let _ = s.read_to_string(&mut stdout);
            }
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut stderr);
            }
            out.push(Done {
                name,
                code,
                stdout,
                stderr,
            });
        }
        out
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.kids {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Prints a result line for the parent.
pub fn report(line: &str) {
    println!("CEB-RESULT {line}");
}

pub fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("child env")
}

/// What rank `r` contributes in the standard suite (lengths differ per rank).
pub fn contribution(r: usize) -> Vec<u8> {
    format!("rank{r};").repeat(r + 1).into_bytes()
}

/// Allgather, broadcasts from three roots, barrier, empty allgather; checks
/// every answer.
pub fn suite(b: &dyn Bootstrap) -> Result<(), String> {
    let t = Duration::from_secs(20);
    let (n, r) = (b.size(), b.rank());
    let e = |e: BootstrapError| e.to_string();
    let all = b.allgather(&contribution(r), t).map_err(e)?;
    let want: Vec<Vec<u8>> = (0..n).map(contribution).collect();
    if all != want {
        return Err(format!("allgather gave {all:?}"));
    }
    for root in [0, n - 1, n / 2] {
        let payload = format!("from root {root}").into_bytes();
        let got = b
            .broadcast(root, if r == root { &payload } else { &[] }, t)
            .map_err(e)?;
        if got != payload {
            return Err(format!("broadcast from {root} gave {got:?}"));
        }
    }
    b.barrier(t).map_err(e)?;
    let empty = b.allgather(&[], t).map_err(e)?;
    if empty != vec![Vec::<u8>::new(); n] {
        return Err(format!("empty allgather gave {empty:?}"));
    }
    Ok(())
}

/// A raw frame in the documented wire format (for hostile peers).
pub fn raw_frame(kind: u8, job: u64, seq: u64, from: u32, size: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"CEbs");
    b.extend_from_slice(&1u16.to_le_bytes());
    b.push(kind);
    b.push(0);
    b.extend_from_slice(&job.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&from.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_le_bytes());
    b.extend_from_slice(payload);
    b
}

/// The secret bytes of a unique-id string.
pub fn secret_of(id: &str) -> Vec<u8> {
    let hex = id.rsplit('/').next().expect("secret part");
    (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Abstract sockets of this library still bound anywhere on the machine.
pub fn library_sockets() -> usize {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("@cuda-endpoints/"))
        .count()
}

//! The data examples' job (`allgather`, `broadcast`): this program as the
//! launcher and rank 0 of `n` OS processes over TCP on a model fabric of
//! 13.5 nodes (the fabric copy, `cuFabricCpyBatchAsync`, is 13.5+), or as
//! one of the ranks it starts; under `mpirun` and `cuda-endpoints-fabric`
//! (`--mpi`, feature `mpi`), one MPI rank. Each rank's work is a function
//! that checks bytes and says how many were wrong.
//!
//! Exit codes, distinct on every path: [`OK`], [`WRONG_BYTES`] (a byte
//! check failed on some rank), [`COULD_NOT_RUN`] (an error before or
//! outside the checks: fabric, bootstrap, bring-up, driver), [`LEFT_BEHIND`]
//! (a rank did not finish in time, or the fabric saw a leak or a broken
//! rule). Every wait is bounded; the ranks are killed and reaped on every
//! path, the socket's directory removed.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::UNIQUE_ID_ENV;
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::{Context, bootstrap::Bootstrap, bootstrap::Tcp, bootstrap::UniqueId};

use super::Me;

pub const OK: u8 = 0;
pub const WRONG_BYTES: u8 = 1;
pub const COULD_NOT_RUN: u8 = 2;
pub const LEFT_BEHIND: u8 = 3;

/// The driver version of every node: the fabric copy exists from 13.5 (F7).
pub const DRIVER_VERSION: i32 = 13050;

const RANK: &str = "CUDA_ENDPOINTS_RANK";
const SIZE: &str = "DATA_JOB_SIZE";
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// What a rank checked.
#[derive(Default)]
pub struct Checked {
    /// Bytes compared with what they should be.
    pub bytes: u64,
    /// The first few wrong ones, described.
    pub wrong: Vec<String>,
}

impl Checked {
    /// Compares `got` with `want`, naming the first wrong byte as `what`.
    pub fn compare(&mut self, what: &str, got: &[u8], want: &[u8]) {
        self.bytes += want.len() as u64;
        if got.len() != want.len() {
            self.wrong.push(format!(
                "{what}: {} bytes, {} expected",
                got.len(),
                want.len()
            ));
        } else if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            self.wrong.push(format!(
                "{what}: byte {i} is {:#04x}, {:#04x} expected",
                got[i], want[i]
            ));
        }
    }
}

/// One rank's work: bring up, move bytes, check them, tear down.
pub type RankFn = fn(&Context, &Me, &dyn Bootstrap) -> Result<Checked, Box<dyn std::error::Error>>;

/// Kills and reaps the child ranks on every path.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The exit code of one rank's outcome, printed with the rank's name.
fn outcome(name: &str, rank: usize, r: Result<Checked, Box<dyn std::error::Error>>) -> u8 {
    match r {
        Ok(c) if c.wrong.is_empty() => {
            println!("{name} rank {rank}: {} bytes checked, all right", c.bytes);
            OK
        }
        Ok(c) => {
            eprintln!("{name} rank {rank}: wrong bytes: {}", c.wrong.join("; "));
            WRONG_BYTES
        }
        Err(e) => {
            eprintln!("{name} rank {rank}: could not run: {e}");
            COULD_NOT_RUN
        }
    }
}

/// The worst of two exit codes: wrong bytes over could-not-run over
/// left-behind.
fn worst(a: u8, b: u8) -> u8 {
    let rank = |c| match c {
        WRONG_BYTES => 3,
        COULD_NOT_RUN => 2,
        LEFT_BEHIND => 1,
        _ => 0,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// The whole program: a child rank, an MPI rank, or the launcher.
pub fn main(name: &str, work: RankFn) -> ExitCode {
    ExitCode::from(run(name, work))
}

fn run(name: &str, work: RankFn) -> u8 {
    if let Ok(rank) = std::env::var(RANK) {
        let joined = (|| -> Result<_, Box<dyn std::error::Error>> {
            let rank: usize = rank.parse()?;
            let size: usize = std::env::var(SIZE)?.parse()?;
            let (ctx, me) = super::join(rank)?;
            let boot = Tcp::join(&UniqueId::from_env()?, rank, size, TIMEOUT)?;
            Ok((rank, ctx, me, boot))
        })();
        return match joined {
            Ok((rank, ctx, me, boot)) => outcome(name, rank, work(&ctx, &me, &boot)),
            Err(e) => outcome(name, usize::MAX, Err(e)),
        };
    }
    if std::env::args().any(|a| a == "--mpi") {
        return mpi_rank(name, work);
    }
    match launch(name, work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: could not run: {e}");
            COULD_NOT_RUN
        }
    }
}

#[cfg(feature = "mpi")]
fn mpi_rank(name: &str, work: RankFn) -> u8 {
    if std::env::var_os(fabric::FABRIC_ENV).is_none() {
        eprintln!(
            "{name} --mpi: run me under cuda-endpoints-fabric (CUDA_ENDPOINTS_FABRIC is not set)"
        );
        return COULD_NOT_RUN;
    }
    let joined = (|| -> Result<_, Box<dyn std::error::Error>> {
        let boot = cuda_endpoints::bootstrap::Mpi::world(TIMEOUT)?;
        let (ctx, me) = super::join(boot.rank())?;
        Ok((ctx, me, boot))
    })();
    match joined {
        Ok((ctx, me, boot)) => outcome(name, boot.rank(), work(&ctx, &me, &boot)),
        Err(e) => outcome(name, usize::MAX, Err(e)),
    }
}

#[cfg(not(feature = "mpi"))]
fn mpi_rank(name: &str, _work: RankFn) -> u8 {
    eprintln!("{name} --mpi: built without the feature `mpi`");
    COULD_NOT_RUN
}

/// The launcher and rank 0: a fabric of 13.5 nodes, `n - 1` children, the
/// job checked.
fn launch(name: &str, work: RankFn) -> Result<u8, Box<dyn std::error::Error>> {
    let cuda = super::wants_cuda();
    let mut args = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--driver") && a != "cuda");
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    if size == 0 || nodes == 0 {
        return Err("ranks and nodes must be at least 1".into());
    }
    let gpus = size.div_ceil(nodes);
    let dir = tempfile::Builder::new().prefix("data-job-").tempdir()?;
    let socket: PathBuf = dir.path().join("fabric.sock");
    if cuda {
        // SAFETY: no thread has been started yet: nothing else reads or
        // writes the environment now.
        unsafe { std::env::set_var(fabric::FABRIC_ENV, format!("{},rank=0", socket.display())) };
    }
    let mut config = FabricConfig::nodes(nodes, gpus);
    for n in &mut config.nodes {
        n.driver_version = DRIVER_VERSION;
    }
    let server = FabricServer::start_at(config, &socket)?;
    let (id, root) = Tcp::root("127.0.0.1:0".parse()?)?;
    let start = Instant::now();
    let mut ranks = Ranks(Vec::new());
    for r in 1..size {
        let mut cmd = Command::new(std::env::current_exe()?);
        if cuda {
            cmd.args(["--driver", "cuda"]);
        }
        let child = cmd
            .env(
                fabric::FABRIC_ENV,
                format!("{},rank={r}", server.socket().display()),
            )
            .env(UNIQUE_ID_ENV, id.to_string())
            .env(RANK, r.to_string())
            .env(SIZE, size.to_string())
            .spawn()?;
        ranks.0.push(child);
    }
    let mut code = {
        let joined = (|| -> Result<_, Box<dyn std::error::Error>> {
            let (ctx, me) = if cuda {
                super::join(0)?
            } else {
                let (ctx, me) = fabric::connect(&fabric::Join::new(server.socket()).rank(0))?;
                (ctx, Me::Fabric(me))
            };
            let boot = root.accept(size, TIMEOUT)?;
            Ok((ctx, me, boot))
        })();
        match joined {
            Ok((ctx, me, boot)) => outcome(name, 0, work(&ctx, &me, &boot)),
            Err(e) => outcome(name, 0, Err(e)),
        }
    };
    let deadline = Instant::now() + TIMEOUT;
    for (i, c) in ranks.0.iter_mut().enumerate() {
        let status = loop {
            if let Some(st) = c.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let rank_code = match status.and_then(|s| s.code()) {
            Some(c) => u8::try_from(c).unwrap_or(COULD_NOT_RUN),
            None => {
                eprintln!("{name}: rank {} did not finish in time", i + 1);
                LEFT_BEHIND
            }
        };
        code = worst(code, rank_code);
    }
    drop(ranks);
    if cuda {
        // This process's driver (libcuda) stays on the fabric until it
        // exits, as a real driver's state does.
        server.wait_exits(size - 1, TIMEOUT);
    } else {
        server.wait_idle(TIMEOUT);
    }
    let (live, leaks, violations) = (server.live(), server.leaks(), server.violations());
    if !live.is_empty() || !leaks.is_empty() || !violations.is_empty() {
        eprintln!(
            "{name}: the fabric holds {live:?}; processes that left holding something: {leaks:?}; rules broken: {violations:?}"
        );
        code = worst(code, LEFT_BEHIND);
    }
    println!(
        "{name}: {size} ranks on {nodes} node(s){}, job {:?}: {}",
        if cuda { " through libcuda" } else { "" },
        start.elapsed(),
        match code {
            OK => "every byte right on every rank, nothing left",
            WRONG_BYTES => "WRONG BYTES",
            COULD_NOT_RUN => "a rank could not run",
            _ => "something left behind",
        }
    );
    drop(server);
    dir.close()?;
    Ok(code)
}

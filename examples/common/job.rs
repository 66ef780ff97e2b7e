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

use std::process::ExitCode;

#[cfg(feature = "mpi")]
use cuda_endpoints::fabric;
use cuda_endpoints::{Context, Report, bootstrap::Bootstrap};

use super::Me;
use super::launch::{self, Launch};

pub const OK: u8 = 0;
pub const WRONG_BYTES: u8 = 1;
pub const COULD_NOT_RUN: u8 = 2;
pub const LEFT_BEHIND: u8 = 3;

/// The driver version of every node: the fabric copy exists from 13.5 (F7).
pub const DRIVER_VERSION: i32 = 13050;

// Each example compiles this module as its own: `tcp_team` without `mpi`
// uses no `TIMEOUT`, the others do.
#[allow(unused_imports)]
pub use launch::TIMEOUT;

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

/// One rank's work on a bootstrap that its threads share (bring-ups at
/// once over `team::Tagged`): TCP's is; an MPI communicator is not.
pub type SharedRankFn =
    fn(&Context, &Me, &(dyn Bootstrap + Sync)) -> Result<Checked, Box<dyn std::error::Error>>;

#[derive(Clone, Copy)]
enum Work {
    Any(RankFn),
    Shared(SharedRankFn),
}

impl Work {
    fn on_tcp(
        self,
        ctx: &Context,
        me: &Me,
        boot: &cuda_endpoints::bootstrap::Tcp,
    ) -> Result<Checked, Box<dyn std::error::Error>> {
        match self {
            Work::Any(f) => f(ctx, me, boot),
            Work::Shared(f) => f(ctx, me, boot),
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
            eprintln!(
                "{name} rank {rank}: could not run: {:?}",
                Report::from_boxed(e)
            );
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
    ExitCode::from(run(name, Work::Any(work)))
}

/// As [`main`], for work whose threads share the bootstrap: over TCP only
/// (`--mpi` could not run).
pub fn main_shared(name: &str, work: SharedRankFn) -> ExitCode {
    ExitCode::from(run(name, Work::Shared(work)))
}

fn run(name: &str, work: Work) -> u8 {
    if let Some(joined) = launch::child() {
        return match joined {
            Ok(j) => outcome(name, j.rank, work.on_tcp(&j.ctx, &j.me, &j.boot)),
            Err(e) => outcome(name, usize::MAX, Err(e)),
        };
    }
    if std::env::args().any(|a| a == "--mpi") {
        return mpi_rank(name, work);
    }
    match launch(name, work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: could not run: {:?}", Report::from_boxed(e));
            COULD_NOT_RUN
        }
    }
}

#[cfg(feature = "mpi")]
fn mpi_rank(name: &str, work: Work) -> u8 {
    let Work::Any(work) = work else {
        eprintln!(
            "{name} --mpi: this mode shares the bootstrap among threads, which an MPI communicator is not: run it over TCP"
        );
        return COULD_NOT_RUN;
    };
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
fn mpi_rank(name: &str, _work: Work) -> u8 {
    eprintln!("{name} --mpi: built without the feature `mpi`");
    COULD_NOT_RUN
}

/// The launcher and rank 0: a fabric of 13.5 nodes, `n - 1` children, the
/// job checked.
fn launch(name: &str, work: Work) -> Result<u8, Box<dyn std::error::Error>> {
    let mut job = Launch::start("data-job-", Some(DRIVER_VERSION))?;
    let mut code = match job.join0() {
        Ok((ctx, me, boot)) => outcome(name, 0, work.on_tcp(&ctx, &me, &boot)),
        Err(e) => outcome(name, 0, Err(e)),
    };
    for (i, status) in job.wait_ranks()?.into_iter().enumerate() {
        let rank_code = match status.and_then(|s| s.code()) {
            Some(c) => u8::try_from(c).unwrap_or(COULD_NOT_RUN),
            None => {
                eprintln!("{name}: rank {} did not finish in time", i + 1);
                LEFT_BEHIND
            }
        };
        code = worst(code, rank_code);
    }
    let server = job.settled();
    let (live, leaks, violations) = (server.live(), server.leaks(), server.violations());
    if !live.is_empty() || !leaks.is_empty() || !violations.is_empty() {
        eprintln!(
            "{name}: the fabric holds {live:?}; processes that left holding something: {leaks:?}; rules broken: {violations:?}"
        );
        code = worst(code, LEFT_BEHIND);
    }
    println!(
        "{name}: {} ranks on {} node(s){}, job {:?}: {}",
        job.size,
        job.nodes,
        if job.cuda { " through libcuda" } else { "" },
        job.start.elapsed(),
        match code {
            OK => "every byte right on every rank, nothing left",
            WRONG_BYTES => "WRONG BYTES",
            COULD_NOT_RUN => "a rank could not run",
            _ => "something left behind",
        }
    );
    job.close()?;
    Ok(code)
}

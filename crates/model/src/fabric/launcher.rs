//! `cuda-endpoints-fabric`: runs a command (a job: `mpirun -n 8 ./app`, or
//! one program) on a model fabric that its processes share.
//!
//! ```text
//! cuda-endpoints-fabric [--nodes N] [--gpus G] [--no-imex] [--queries Q] [--driver-version V] [--timeout SECS] -- COMMAND [ARGS...]
//! ```
//!
//! (`cuda-endpoints-fabric --help` says what each flag does and the exit
//! statuses; the arguments are parsed by `clap`.)
//!
//! Starts a fabric server of `N` nodes with `G` GPUs each (default 1 × 4) on
//! a socket in a fresh temporary directory, exports `CUDA_ENDPOINTS_FABRIC`
//! to the command (its processes join with `cuda_endpoints::fabric::connect_env()`, placed
//! on nodes by rank), waits for it, waits for every process to leave, and
//! reports what each one left behind. Exits with the command's status if
//! it failed, 1 if it could not be waited for or ran past `--timeout`, 2 on
//! bad arguments or a fabric or command that could not start, 3 if any
//! process leaked or any rule was violated, else 0.
//!
//! `--driver-version V` makes every node a driver of that version (e.g.
//! `13000`: driver 580, no logical endpoints, as `ModelConfig::cuda_13_0`).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use super::{FABRIC_ENV, FabricServer};
use crate::driver::LOGICAL_ENDPOINT_MIN_VERSION;
use crate::{FabricConfig, ModelConfig};

/// Runs COMMAND (a job: `mpirun -n 8 ./app`, or one program) on a model
/// fabric that its processes share, and reports what each process left
/// behind.
#[derive(Debug, clap::Parser)]
#[command(
    name = "cuda-endpoints-fabric",
    version,
    after_help = "The command's processes find the fabric in CUDA_ENDPOINTS_FABRIC \
(cuda_endpoints::fabric::connect_env()) and are placed on nodes by rank.

Exit status:
  0    the command succeeded and nothing leaked
  1    the command could not be waited for or ran past --timeout (killed)
  2    bad arguments, or the fabric or the command could not be started
  3    the command succeeded, but a process leaked, a rule was violated or
       a process was still connected
  N    the command failed with status N (1 if it had none)"
)]
struct Args {
    /// Nodes of the fabric (1 to 1024).
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    nodes: u16,
    /// GPUs on each node (1 to 1024).
    #[arg(long, default_value_t = 4, value_name = "G",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    gpus: u16,
    /// The nodes have no IMEX channel: fabric handles cannot be shared.
    #[arg(long)]
    no_imex: bool,
    /// Queries before an endpoint reports ready (the model's default if not given).
    #[arg(long, value_name = "Q")]
    queries: Option<u32>,
    /// Every node's driver version, e.g. 13000 (driver 580, no logical
    /// endpoints, as `ModelConfig::cuda_13_0`).
    #[arg(long, value_name = "V", value_parser = clap::value_parser!(i32).range(0..))]
    driver_version: Option<i32>,
    /// Kill the command after this many seconds and exit 1.
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// The command to run, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The launcher's `main`: reads the process's arguments, runs the job,
/// and answers the exit status described in the module docs.
pub fn main() -> ExitCode {
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(a) => a,
        Err(e) => {
            // `--help` and `--version` print to stdout and exit 0; a bad
            // argument prints why and the usage, and exits 2.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let (nodes, gpus) = (usize::from(args.nodes), usize::from(args.gpus));
    let timeout = args.timeout.map(Duration::from_secs);
    let mut config = FabricConfig::nodes(nodes, gpus).imex_channel(!args.no_imex);
    if let Some(v) = args.driver_version {
        config = config.with_nodes(|_, n| {
            if v < LOGICAL_ENDPOINT_MIN_VERSION {
                *n = ModelConfig::cuda_13_0(n.devices.len());
            }
            n.driver_version = v;
        });
    }
    if let Some(q) = args.queries {
        config = config.with_nodes(|_, n| n.queries_to_ready = q);
    }
    let server = match FabricServer::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cuda-endpoints-fabric: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "cuda-endpoints-fabric: {} node(s) x {} GPU(s) at {}",
        nodes,
        gpus,
        server.socket().display()
    );
    let mut child = match Command::new(&args.command[0])
        .args(&args.command[1..])
        .env(FABRIC_ENV, server.env_value())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cuda-endpoints-fabric: cannot run {}: {e}", args.command[0]);
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(e) => {
                eprintln!("cuda-endpoints-fabric: waiting for the command: {e}");
                break None;
            }
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            eprintln!("cuda-endpoints-fabric: the command ran past --timeout; killed");
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Processes of the job may outlive the command by a moment (their
    // connections close as they exit).
    let idle = server.wait_idle(Duration::from_secs(10));
    let exits = server.exits();
    let leaks = server.leaks();
    let live = server.live();
    let violations = server.violations();
    eprintln!(
        "cuda-endpoints-fabric: {} process(es) joined, {} left; fabric holds {:?}",
        server.joined(),
        exits.len(),
        live
    );
    for l in &leaks {
        eprintln!(
            "cuda-endpoints-fabric: process {} (OS pid {}, node {}) left holding {:?}",
            l.pid, l.os_pid, l.node, l.held
        );
    }
    for v in &violations {
        eprintln!(
            "cuda-endpoints-fabric: rule {} broken by {} ({})",
            v.rule, v.call, v.code
        );
    }
    if !idle {
        eprintln!(
            "cuda-endpoints-fabric: {} process(es) still connected",
            server.running()
        );
    }
    drop(server);
    match status {
        Some(s) if !s.success() => {
            eprintln!("cuda-endpoints-fabric: the command failed: {s}");
            ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1))
        }
        None => ExitCode::from(1),
        Some(_) if !leaks.is_empty() || !violations.is_empty() || !live.is_empty() || !idle => {
            ExitCode::from(3)
        }
        Some(_) => {
            eprintln!("cuda-endpoints-fabric: nothing leaked");
            ExitCode::SUCCESS
        }
    }
}

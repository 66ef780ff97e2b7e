//! `cuda-endpoints-fabric`: runs a command (a job: `mpirun -n 8 ./app`, or
//! one program) on a model fabric that its processes share.
//!
//! ```text
//! cuda-endpoints-fabric [--nodes N] [--gpus G] [--no-imex] [--queries Q] [--driver-version V] [--timeout SECS] -- COMMAND [ARGS...]
//! ```
//!
//! Starts a fabric server of `N` nodes with `G` GPUs each (default 1 × 4) on
//! a socket in a fresh temporary directory, exports `CUDA_ENDPOINTS_FABRIC`
//! to the command (its processes join with `cuda_endpoints::fabric::connect_env()`, placed
//! on nodes by rank), waits for it, waits for every process to leave, and
//! reports what each one left behind. Exits with the command's status if
//! it failed, 3 if any process leaked or any rule was violated, else 0.
//!
//! `--driver-version V` makes every node a driver of that version (e.g.
//! `13000`: driver 580, no logical endpoints, as `ModelConfig::cuda_13_0`).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use super::{FABRIC_ENV, FabricServer};
use crate::driver::LOGICAL_ENDPOINT_MIN_VERSION;
use crate::{FabricConfig, ModelConfig};

const USAGE: &str = "usage: cuda-endpoints-fabric [--nodes N] [--gpus G] [--no-imex] [--queries Q] [--driver-version V] [--timeout SECS] -- COMMAND [ARGS...]";

struct Args {
    nodes: usize,
    gpus: usize,
    imex: bool,
    queries: Option<u32>,
    driver_version: Option<i32>,
    timeout: Option<Duration>,
    command: Vec<String>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        nodes: 1,
        gpus: 4,
        imex: true,
        queries: None,
        driver_version: None,
        timeout: None,
        command: Vec::new(),
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .and_then(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("{name} {v}: not a number"))
                })
        };
        match arg.as_str() {
            "--nodes" => a.nodes = usize::try_from(value("--nodes")?).map_err(|e| e.to_string())?,
            "--gpus" => a.gpus = usize::try_from(value("--gpus")?).map_err(|e| e.to_string())?,
            "--queries" => {
                a.queries = Some(u32::try_from(value("--queries")?).map_err(|e| e.to_string())?)
            }
            "--driver-version" => {
                a.driver_version =
                    Some(i32::try_from(value("--driver-version")?).map_err(|e| e.to_string())?)
            }
            "--timeout" => a.timeout = Some(Duration::from_secs(value("--timeout")?)),
            "--no-imex" => a.imex = false,
            "-h" | "--help" => return Err(USAGE.into()),
            "--" => {
                a.command = args.collect();
                break;
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if a.command.is_empty() {
        return Err(format!("no command given\n{USAGE}"));
    }
    if a.nodes == 0 || a.gpus == 0 || a.nodes > 1024 || a.gpus > 1024 {
        return Err("--nodes and --gpus are 1 to 1024".into());
    }
    Ok(a)
}

/// The launcher's `main`: reads the process's arguments, runs the job,
/// and answers the exit status described in the module docs.
pub fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuda-endpoints-fabric: {e}");
            return ExitCode::from(2);
        }
    };
    let mut config = FabricConfig::nodes(args.nodes, args.gpus).imex_channel(args.imex);
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
        args.nodes,
        args.gpus,
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
        if args.timeout.is_some_and(|t| start.elapsed() > t) {
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

//! A team of plain OS processes on the model fabric, bootstrapped over TCP
//! with a unique id (as NCCL's): this program is the launcher and rank 0;
//! it starts a fabric, then `n - 1` copies of itself as the other ranks.
//! Every rank brings a multicast team up in one call, binds its memory,
//! reads back what rank 0 wrote through its own memory, and tears down.
//!
//! ```text
//! cargo run --features fabric --example tcp_team             # 4 ranks, 1 node
//! cargo run --features fabric --example tcp_team -- 8 2      # 8 ranks, 2 nodes of 4
//! cargo run --features fabric --example tcp_team -- 4 1 --driver cuda
//! ```
//!
//! With `--driver cuda` every rank runs the real driver instead of the
//! fabric's `Remote`; on the libcuda test double (`ci/double.sh`) the
//! double of each process joins this program's fabric, named to it by
//! `CUDA_ENDPOINTS_FABRIC`, so the job is the same, through the C ABI.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::UNIQUE_ID_ENV;
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::{bootstrap::Tcp, bootstrap::UniqueId};

const RANK: &str = "CUDA_ENDPOINTS_RANK";
const SIZE: &str = "TCP_TEAM_SIZE";
const TIMEOUT: Duration = Duration::from_secs(20);

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(rank) = std::env::var(RANK) {
        // A child rank: the fabric and the bootstrap id come by environment.
        let (rank, size): (usize, usize) = (rank.parse()?, std::env::var(SIZE)?.parse()?);
        let (ctx, me) = common::join(rank)?;
        let boot = Tcp::join(&UniqueId::from_env()?, rank, size, TIMEOUT)?;
        let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
        println!(
            "rank {rank} ({}, {:?}): bring-up {:?}, {} bootstrap messages in all; read back {}",
            me.node_label(),
            me.device(),
            s.bring_up,
            s.messages,
            s.read_back
        );
        return Ok(());
    }
    let cuda = common::wants_cuda();
    let mut args = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--driver") && a != "cuda");
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let gpus = size.div_ceil(nodes);
    // The socket's path is chosen first: with the real driver, this process
    // (rank 0) reaches the fabric through libcuda, which reads the path
    // from the environment.
    let dir = tempfile::Builder::new().prefix("tcp-team-").tempdir()?;
    let socket: PathBuf = dir.path().join("fabric.sock");
    if cuda {
        // SAFETY: no thread has been started yet: nothing else reads or
        // writes the environment now.
        unsafe { std::env::set_var(fabric::FABRIC_ENV, format!("{},rank=0", socket.display())) };
    }
    let server = FabricServer::start_at(FabricConfig::nodes(nodes, gpus), &socket)?;
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
    let (ctx, me) = if cuda {
        common::join(0)?
    } else {
        let (ctx, me) = fabric::connect(&fabric::Join::new(server.socket()).rank(0))?;
        (ctx, common::Me::Fabric(me))
    };
    let boot = root.accept(size, TIMEOUT)?;
    let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
    println!(
        "rank 0 ({}, {:?}): bring-up {:?}, {} bootstrap messages in all; read back {}",
        me.node_label(),
        me.device(),
        s.bring_up,
        s.messages,
        s.read_back
    );
    // Rank 0 is the star's centre: its traffic is every message of the job.
    // The bring-up alone is 7 (n - 1) (three allgathers and a broadcast);
    // the join before it, a hello and a welcome per other rank, 2 (n - 1).
    let (join_messages, bring_up_messages) = (s.join_messages, s.bring_up_messages);
    let deadline = Instant::now() + TIMEOUT;
    let mut failed = 0;
    for c in &mut ranks.0 {
        let status = loop {
            if let Some(st) = c.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if !status.is_some_and(|s| s.success()) {
            failed += 1;
        }
    }
    drop((boot, ctx, me));
    if cuda {
        // The driver of this process (libcuda) stays on the fabric until
        // the process exits, as a real driver's state does: every other
        // rank has left, and this one holds nothing (checked below).
        server.wait_exits(size - 1, TIMEOUT);
    } else {
        server.wait_idle(TIMEOUT);
    }
    let live = server.live();
    let leaks = server.leaks();
    println!(
        "{size} ranks on {nodes} node(s): bring-up {:?} on rank 0, {bring_up_messages} bootstrap messages (after {join_messages} to join); job {:?}; fabric left {}; {failed} rank(s) failed",
        s.bring_up,
        start.elapsed(),
        if live.is_empty() {
            "nothing".to_owned()
        } else {
            format!("{live:?}")
        }
    );
    if !leaks.is_empty() {
        println!("processes that left holding something: {leaks:?}");
    }
    let violations = server.violations();
    if !violations.is_empty() {
        println!("rules broken: {violations:?}");
    }
    if failed > 0 || !live.is_empty() || !leaks.is_empty() || !violations.is_empty() {
        return Err("the job failed".into());
    }
    drop(server);
    dir.close()?;
    Ok(())
}

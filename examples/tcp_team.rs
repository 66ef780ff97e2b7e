//! A team of plain OS processes on the model fabric, bootstrapped over TCP
//! with a unique id (as NCCL's): this program is the launcher and rank 0;
//! it starts a fabric, then `n - 1` copies of itself as the other ranks.
//! Every rank brings a multicast team up in one call, binds its memory,
//! reads back what rank 0 wrote through its own memory, and tears down.
//!
//! ```text
//! cargo run --features fabric --example tcp_team             # 4 ranks, 1 node
//! cargo run --features fabric --example tcp_team -- 8 2      # 8 ranks, 2 nodes of 4
//! ```

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::ENV_VAR;
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::{Tcp, UniqueId};

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
        let (ctx, me) = fabric::connect_env()?.ok_or("no fabric")?;
        let boot = Tcp::join(&UniqueId::from_env()?, rank, size, TIMEOUT)?;
        let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
        println!(
            "rank {rank} (node {}, {:?}): bring-up {:?}, {} messages; read back {}",
            me.node(),
            me.device(),
            s.bring_up,
            s.messages,
            s.read_back
        );
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let gpus = size.div_ceil(nodes);
    let server = FabricServer::start(FabricConfig::nodes(nodes, gpus))?;
    let (id, root) = Tcp::root("127.0.0.1:0".parse()?)?;
    let start = Instant::now();
    let mut ranks = Ranks(Vec::new());
    for r in 1..size {
        let child = Command::new(std::env::current_exe()?)
            .env(
                fabric::ENV_VAR,
                format!("{},rank={r}", server.socket().display()),
            )
            .env(ENV_VAR, id.to_string())
            .env(RANK, r.to_string())
            .env(SIZE, size.to_string())
            .spawn()?;
        ranks.0.push(child);
    }
    let join = fabric::Join::new(server.socket()).rank(0);
    let (ctx, me) = fabric::connect(&join)?;
    let boot = root.accept(size, TIMEOUT)?;
    let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
    println!(
        "rank 0 (node 0, {:?}): bring-up {:?}, {} messages; read back {}",
        me.device(),
        s.bring_up,
        s.messages,
        s.read_back
    );
    // Rank 0 is the star's centre: its traffic is every message of the job.
    let bring_up_messages = s.bring_up_messages;
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
    server.wait_idle(TIMEOUT);
    let live = server.live();
    println!(
        "{size} ranks on {nodes} node(s): bring-up {:?} on rank 0, {bring_up_messages} bootstrap messages; job {:?}; fabric left {}; {failed} rank(s) failed",
        s.bring_up,
        start.elapsed(),
        if live.is_empty() {
            "nothing".to_owned()
        } else {
            format!("{live:?}")
        }
    );
    if failed > 0 || !live.is_empty() || !server.violations().is_empty() {
        return Err("the job failed".into());
    }
    Ok(())
}

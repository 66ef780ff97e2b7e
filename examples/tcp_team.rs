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

use common::launch::{self, Launch, TIMEOUT};

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(joined) = launch::child() {
        // A child rank: the fabric and the bootstrap id come by environment.
        let launch::Joined {
            rank,
            ctx,
            me,
            boot,
        } = joined?;
        let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
        println!(
            "rank {rank} ({}, {:?}): bring-up {:?}; {} bootstrap messages through this rank in all (the join, the bring-up and the steps after it); read back: {}",
            me.node_label(),
            me.device(),
            s.bring_up,
            s.messages,
            s.read_back
        );
        return Ok(());
    }
    let mut job = Launch::start("tcp-team-", None)?;
    let (ctx, me, boot) = job.join0()?;
    let s = common::rank(&ctx, &me, &boot, TIMEOUT)?;
    println!(
        "rank 0 ({}, {:?}): bring-up {:?}; {} bootstrap messages through this rank in all (the join, the bring-up and the steps after it); read back: {}",
        me.node_label(),
        me.device(),
        s.bring_up,
        s.messages,
        s.read_back
    );
    // Rank 0's traffic: broadcasts go through it, allgathers of three ranks
    // or more run on a ring (every rank sends and receives n - 1 blocks), and
    // the first allgather sets the ring up through it, 2 (n - 1) messages.
    // The join before, a hello, challenge, proof and welcome per other rank.
    let (join_messages, bring_up_messages) = (s.join_messages, s.bring_up_messages);
    let failed = job
        .wait_ranks()?
        .iter()
        .filter(|st| !st.is_some_and(|s| s.success()))
        .count();
    drop((boot, ctx, me));
    // This rank holds nothing now (checked below).
    let server = job.settled();
    let live = server.live();
    let leaks = server.leaks();
    println!(
        "{} ranks on {} node(s): bring-up {:?} on rank 0, which took {bring_up_messages} of its bootstrap messages (after {join_messages} to join); job {:?}; fabric left {}; {failed} rank(s) failed",
        job.size,
        job.nodes,
        s.bring_up,
        job.start.elapsed(),
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
    job.close()?;
    Ok(())
}

//! Bring-up of teams across ranks (README "Sharing across processes"),
//! measured per rank: time and bootstrap traffic of one `team::multicast`
//! (the NCCL multicast pattern) and one `team::unicast_peers` (one id per
//! rank, each peer imported at its index) for 4, 8 and 32 ranks, over the
//! `Threads` bootstrap and over `Tcp` on loopback.
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench bring_up
//! ```
//!
//! Each rank is a thread with its own model process, four GPUs per model
//! node (so 8 ranks span 2 nodes and 32 ranks 8, handles crossing nodes as
//! fabric handles); every rank starts each bring-up at a barrier. Printed
//! per case: the median over the repetitions of rank 0's time and of the
//! slowest rank's, and the bootstrap messages and bytes (sent + received,
//! headers included) of one bring-up on rank 0 (the TCP star's centre) and
//! on the busiest other rank. A message is one frame (TCP) or one
//! contribution (threads). Without `--bench` (`cargo test --benches`) one
//! small case runs, as a check.
//!
//! Last, what exporting pending saves (R13.1, issue 20 item 6):
//! `unicast_peers` without the probe, each rank exporting its endpoint
//! while the driver builds it, against each rank waiting for its endpoint
//! before exporting (`PeerSpec::overlap(false)`); `-- overlap` runs only
//! that comparison:
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench bring_up -- overlap
//! ```

use std::sync::Barrier;
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::Traffic;
use cuda_endpoints::model::{FabricConfig, Model};
use cuda_endpoints::team::{self, PeerSpec, TeamSpec};
use cuda_endpoints::{
    Call, Context, Device, bootstrap::Bootstrap, bootstrap::Tcp, bootstrap::Threads,
};

const BYTES: u64 = 2 << 20;
const GPUS_PER_NODE: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    Multicast,
    UnicastPeers,
    /// `unicast_peers` without the probe, exporting pending (R13.1) or,
    /// `false`, waiting for its own endpoint first: the overlap's saving.
    Overlap(bool),
}

#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Threads,
    Tcp,
}

/// One rank's bring-up.
#[derive(Clone, Copy)]
struct Sample {
    time: Duration,
    messages: u64,
    bytes: u64,
}

impl Sample {
    /// One bring-up started at `t` with the traffic `a`, ended with `b`.
    fn since(t: Instant, a: Traffic, b: Traffic) -> Sample {
        Sample {
            time: t.elapsed(),
            messages: (b.messages_sent + b.messages_received)
                - (a.messages_sent + a.messages_received),
            bytes: (b.bytes_sent + b.bytes_received) - (a.bytes_sent + a.bytes_received),
        }
    }
}

/// Rank `rank`'s repetitions of one bring-up.
fn rank_loop(
    ctx: &Context,
    boot: &dyn Bootstrap,
    pattern: Pattern,
    reps: usize,
    start: &Barrier,
) -> Vec<Sample> {
    let dev = Device((boot.rank() % GPUS_PER_NODE) as i32);
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        start.wait();
        let before = boot.traffic();
        let t = Instant::now();
        match pattern {
            Pattern::Multicast => {
                let spec = TeamSpec::new([dev], BYTES).timeout(TIMEOUT);
                let team = team::multicast(ctx, boot, &spec).expect("team::multicast");
                samples.push(Sample::since(t, before, boot.traffic()));
                drop(team);
            }
            Pattern::UnicastPeers => {
                let spec = PeerSpec::new(dev, BYTES).timeout(TIMEOUT);
                let peers = team::unicast_peers(ctx, boot, &spec).expect("team::unicast_peers");
                samples.push(Sample::since(t, before, boot.traffic()));
                drop(peers);
            }
            Pattern::Overlap(overlap) => {
                let spec = PeerSpec::new(dev, BYTES)
                    .timeout(TIMEOUT)
                    .probe(false)
                    .overlap(overlap);
                let peers = team::unicast_peers(ctx, boot, &spec).expect("team::unicast_peers");
                samples.push(Sample::since(t, before, boot.traffic()));
                drop(peers);
            }
        }
        // Everyone's teardown done before the next bring-up starts.
        boot.barrier(TIMEOUT).expect("barrier");
    }
    samples
}

/// The model processes of `n` ranks, four per node.
fn processes(n: usize) -> Vec<Model> {
    let first = Model::fabric(FabricConfig::nodes(
        n.div_ceil(GPUS_PER_NODE),
        GPUS_PER_NODE,
    ));
    let mut models = vec![first.clone()];
    for r in 1..n {
        models.push(
            first
                .spawn_process_on(r / GPUS_PER_NODE)
                .expect("a node of the fabric"),
        );
    }
    models
}

/// Every rank's samples, by rank, and the `cuLogicalEndpointQuery` calls
/// of the whole job.
fn run(n: usize, transport: Transport, pattern: Pattern, reps: usize) -> (Vec<Vec<Sample>>, u64) {
    let models = processes(n);
    let contexts: Vec<Context> = models.iter().map(|m| Context::new(m.clone())).collect();
    let start = Barrier::new(n);
    let samples = std::thread::scope(|s| {
        let (start, contexts) = (&start, &contexts);
        let handles: Vec<_> = match transport {
            Transport::Threads => Threads::new(n)
                .into_iter()
                .enumerate()
                .map(|(r, boot)| {
                    s.spawn(move || rank_loop(&contexts[r], &boot, pattern, reps, start))
                })
                .collect(),
            Transport::Tcp => {
                let (id, root) =
                    Tcp::root("127.0.0.1:0".parse().expect("address")).expect("tcp root");
                let mut handles = vec![s.spawn(move || {
                    let boot = root.accept(n, TIMEOUT).expect("tcp accept");
                    rank_loop(&contexts[0], &boot, pattern, reps, start)
                })];
                for (r, ctx) in contexts.iter().enumerate().skip(1) {
                    let id = id.clone();
                    handles.push(s.spawn(move || {
                        let boot = Tcp::join(&id, r, n, TIMEOUT).expect("tcp join");
                        rank_loop(ctx, &boot, pattern, reps, start)
                    }));
                }
                handles
            }
        };
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    drop(contexts);
    // Every rank left nothing and broke no rule.
    for m in &models {
        assert!(m.live().is_empty(), "leaked: {:?}", m.live());
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }
    (samples, models[0].calls(Call::Query))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let cases: &[(usize, usize)] = if measuring {
        &[(4, 30), (8, 20), (32, 10)]
    } else {
        &[(4, 1)]
    };
    // `-- overlap`: only the export-overlap comparison.
    if std::env::args().any(|a| a == "overlap") {
        overlap(cases);
        return;
    }
    println!(
        "team bring-up per rank, model, {GPUS_PER_NODE} GPUs per node; median of the repetitions"
    );
    println!(
        "{:<14} {:<8} {:>5} {:>6} {:>12} {:>13} {:>10} {:>10} {:>11} {:>11} {:>10}",
        "bring-up",
        "over",
        "ranks",
        "nodes",
        "rank 0",
        "slowest rank",
        "msgs r0",
        "msgs other",
        "bytes r0",
        "bytes other",
        "msgs job"
    );
    for pattern in [Pattern::Multicast, Pattern::UnicastPeers] {
        for transport in [Transport::Threads, Transport::Tcp] {
            for &(n, reps) in cases {
                let (samples, _) = run(n, transport, pattern, reps);
                let rank0 = median(samples[0].iter().map(|s| s.time).collect());
                let slowest = median(
                    (0..reps)
                        .map(|i| samples.iter().map(|r| r[i].time).max().unwrap_or_default())
                        .collect(),
                );
                // Traffic of one bring-up is the same in every repetition.
                let last = |r: &Vec<Sample>| r[reps - 1];
                let other = samples[1..]
                    .iter()
                    .map(last)
                    .max_by_key(|s| s.messages)
                    .expect("two ranks or more");
                let job: u64 = samples.iter().map(|r| last(r).messages).sum::<u64>() / 2;
                println!(
                    "{:<14} {:<8} {:>5} {:>6} {:>12.2?} {:>13.2?} {:>10} {:>10} {:>11} {:>11} {:>10}",
                    match pattern {
                        Pattern::Multicast => "multicast",
                        _ => "unicast_peers",
                    },
                    match transport {
                        Transport::Threads => "threads",
                        Transport::Tcp => "tcp",
                    },
                    n,
                    n.div_ceil(GPUS_PER_NODE),
                    rank0,
                    slowest,
                    last(&samples[0]).messages,
                    other.messages,
                    last(&samples[0]).bytes,
                    other.bytes,
                    job,
                );
            }
        }
    }
    overlap(cases);
}

/// What exporting pending saves (R13.1): `unicast_peers` (no probe) with
/// each rank's export overlapping its endpoint's construction, and with
/// each rank waiting for its endpoint before exporting. On the model
/// construction takes `queries_to_ready` queries, so the saving is the
/// separate wait's polls and back-off pauses.
fn overlap(cases: &[(usize, usize)]) {
    println!();
    println!(
        "export while pending (R13.1): unicast_peers without the probe, threads; median of the repetitions"
    );
    println!(
        "{:<22} {:>5} {:>12} {:>13} {:>16}",
        "export", "ranks", "rank 0", "slowest rank", "queries per rank"
    );
    for &(n, reps) in cases {
        let mut medians = Vec::new();
        for overlap in [true, false] {
            let (samples, queries) = run(n, Transport::Threads, Pattern::Overlap(overlap), reps);
            let slowest = median(
                (0..reps)
                    .map(|i| samples.iter().map(|r| r[i].time).max().unwrap_or_default())
                    .collect(),
            );
            println!(
                "{:<22} {:>5} {:>12.2?} {:>13.2?} {:>16.1}",
                if overlap {
                    "pending (overlap)"
                } else {
                    "after its own wait"
                },
                n,
                median(samples[0].iter().map(|s| s.time).collect()),
                slowest,
                queries as f64 / (n * reps) as f64,
            );
            medians.push(slowest);
        }
        let (with, without) = (medians[0], medians[1]);
        println!(
            "{:<22} {:>5} {:>12} {:>13.2?} ({:.0}% of the bring-up without it)",
            "saved by the overlap",
            n,
            "",
            without.saturating_sub(with),
            100.0 * without.saturating_sub(with).as_secs_f64() / without.as_secs_f64().max(1e-9),
        );
    }
}

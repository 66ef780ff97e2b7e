//! Bring-up of teams across ranks (README "Sharing across processes"),
//! measured per rank: time and bootstrap traffic of one `team::multicast`
//! (the NCCL multicast pattern) and one `team::unicast_peers` (one id per
//! rank, each peer imported at its index) for 4, 32, 72, 144 and 576 ranks
//! (a 72- and a 576-GPU NVLink domain), over the `Threads` bootstrap and
//! over `Tcp` on loopback with every rank a thread, and over `Tcp` with
//! every rank an OS process on the model fabric (up to `PROCESSES_UP_TO`).
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench bring_up
//! ```
//!
//! As threads, each rank has its own model process, four GPUs per model
//! node (so 32 ranks span 8 nodes and 576 ranks 144, handles crossing
//! nodes as fabric handles). As processes, each rank is a copy of this
//! bench joined to one fabric server (every driver call a round trip over
//! its Unix socket). Every rank starts each bring-up at a barrier, after
//! one allgather that sets the TCP ring up, so every repetition's traffic
//! is the same. Printed per case: the median over the repetitions of rank
//! 0's time and of the slowest rank's, and the bootstrap messages and bytes
//! (sent + received, headers included) of one bring-up on rank 0 and on the
//! busiest other rank; then, per bring-up and transport, a line fitted
//! through the cases (least squares against the number of ranks: per-rank
//! slope and intercept of each figure, the worst R² of the four traffic
//! figures and the R² of the slowest rank's time). A message is one frame
//! (TCP) or one contribution (threads). Without `--bench` (`cargo test
//! --benches`) one small case runs, as a check.
//!
//! Last, what exporting pending saves (R13.1, issue 20 item 6):
//! `unicast_peers` without the probe, each rank exporting its endpoint
//! while the driver builds it, against each rank waiting for its endpoint
//! before exporting (`PeerSpec::overlap(false)`), up to 32 ranks, as
//! threads; `-- overlap` runs only that comparison:
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench bring_up -- overlap
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use cuda_endpoints::bootstrap::{Traffic, UNIQUE_ID_ENV, UniqueId};
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::{FabricConfig, Model};
use cuda_endpoints::team::{self, PeerSpec, TeamSpec};
use cuda_endpoints::{
    Context, Device, bootstrap::Bootstrap, bootstrap::Tcp, bootstrap::Threads, driver::Call,
};

const BYTES: u64 = 2 << 20;
const GPUS_PER_NODE: usize = 4;
/// Generous: 576 ranks on two cores join and set up their ring in turn.
const TIMEOUT: Duration = Duration::from_secs(300);
/// The largest job run as OS processes: each is a copy of this bench with
/// its fabric connection and sockets. 576 of them run on a 2-core machine
/// (about 20 s a bring-up at a load average of 20: the time is the
/// machine's, the traffic the algorithm's); lower it on a smaller one.
const PROCESSES_UP_TO: usize = 576;
/// The environment of a child rank (OS processes).
const CHILD: &str = "BRING_UP_BENCH_CHILD";

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
    /// Tcp, every rank an OS process on the model fabric.
    Processes,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Threads => "threads",
            Transport::Tcp => "tcp",
            Transport::Processes => "tcp-procs",
        }
    }
}

impl Pattern {
    fn label(self) -> &'static str {
        match self {
            Pattern::Multicast => "multicast",
            Pattern::UnicastPeers | Pattern::Overlap(_) => "unicast_peers",
        }
    }

    fn parse(s: &str) -> Pattern {
        if s == "multicast" {
            Pattern::Multicast
        } else {
            Pattern::UnicastPeers
        }
    }
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
    start: &dyn Fn(),
) -> Vec<Sample> {
    let dev = Device((boot.rank() % GPUS_PER_NODE) as i32);
    // The TCP ring is set up by the first allgather: before the first
    // bring-up, so every repetition's traffic is the same.
    boot.allgather(&[], TIMEOUT).expect("warm-up allgather");
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        start();
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
/// of the whole job (counted on threads only: 0 for processes).
fn run(n: usize, transport: Transport, pattern: Pattern, reps: usize) -> (Vec<Vec<Sample>>, u64) {
    if transport == Transport::Processes {
        return (run_processes(n, pattern, reps), 0);
    }
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
                    s.spawn(move || {
                        rank_loop(&contexts[r], &boot, pattern, reps, &|| {
                            start.wait();
                        })
                    })
                })
                .collect(),
            Transport::Processes => Vec::new(),
            Transport::Tcp => {
                let (id, root) =
                    Tcp::root("127.0.0.1:0".parse().expect("address")).expect("tcp root");
                let mut handles = vec![s.spawn(move || {
                    let boot = root.accept(n, TIMEOUT).expect("tcp accept");
                    rank_loop(&contexts[0], &boot, pattern, reps, &|| {
                        start.wait();
                    })
                })];
                for (r, ctx) in contexts.iter().enumerate().skip(1) {
                    let id = id.clone();
                    handles.push(s.spawn(move || {
                        let boot = Tcp::join(&id, r, n, TIMEOUT).expect("tcp join");
                        rank_loop(ctx, &boot, pattern, reps, &|| {
                            start.wait();
                        })
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

/// Kills and reaps the child ranks on every path.
struct Ranks(Vec<std::process::Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every rank's samples, by rank: this process is rank 0, the others are
/// copies of this bench, all on one model fabric of `n / 4` nodes.
fn run_processes(n: usize, pattern: Pattern, reps: usize) -> Vec<Vec<Sample>> {
    let dir = std::env::temp_dir().join(format!("bring-up-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let socket = dir.join("fabric.sock");
    let server = FabricServer::start_at(
        FabricConfig::nodes(n.div_ceil(GPUS_PER_NODE), GPUS_PER_NODE),
        &socket,
    )
    .expect("fabric");
    let (id, root) = Tcp::root("127.0.0.1:0".parse().expect("address")).expect("tcp root");
    let exe = std::env::current_exe().expect("this bench");
    let mut ranks = Ranks(Vec::new());
    for r in 1..n {
        let child = Command::new(&exe)
            .env(CHILD, format!("{r} {n} {} {reps}", pattern.label()))
            .env(fabric::FABRIC_ENV, socket.display().to_string())
            .env(UNIQUE_ID_ENV, id.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a child rank");
        ranks.0.push(child);
    }
    let (ctx, me) = fabric::connect(&fabric::Join::new(&socket).node(0)).expect("rank 0 joins");
    let boot = root.accept(n, TIMEOUT).expect("tcp accept");
    let mine = rank_loop(&ctx, &boot, pattern, reps, &|| {
        boot.barrier(TIMEOUT).expect("start");
    });
    let mut all = vec![mine];
    for c in &mut ranks.0 {
        let out = c.stdout.take().expect("piped");
        let mut samples = Vec::new();
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let f: Vec<u64> = line
                .strip_prefix("SAMPLE ")
                .map(|l| l.split(' ').filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_default();
            if let [ns, messages, bytes] = f[..] {
                samples.push(Sample {
                    time: Duration::from_nanos(ns),
                    messages,
                    bytes,
                });
            }
        }
        assert!(c.wait().expect("child").success(), "a child rank failed");
        assert_eq!(samples.len(), reps, "a child rank's samples");
        all.push(samples);
    }
    drop((boot, ctx, me));
    assert!(
        server.wait_idle(Duration::from_secs(30)),
        "every rank left the fabric"
    );
    assert!(server.live().is_empty(), "leaked: {:?}", server.live());
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    all
}

/// A child rank (OS processes): joins the fabric and the TCP job, runs the
/// repetitions and prints its samples.
fn child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let (rank, n, pattern, reps): (usize, usize, Pattern, usize) = (
        f[0].parse().expect("rank"),
        f[1].parse().expect("size"),
        Pattern::parse(f[2]),
        f[3].parse().expect("reps"),
    );
    let socket = std::env::var(fabric::FABRIC_ENV).expect("fabric socket");
    let node = u32::try_from(rank / GPUS_PER_NODE).expect("node");
    let (ctx, _me) = fabric::connect(&fabric::Join::new(socket).node(node)).expect("joins");
    let id = UniqueId::from_env().expect("unique id");
    let boot = Tcp::join(&id, rank, n, TIMEOUT).expect("tcp join");
    let samples = rank_loop(&ctx, &boot, pattern, reps, &|| {
        boot.barrier(TIMEOUT).expect("start");
    });
    for s in samples {
        println!("SAMPLE {} {} {}", s.time.as_nanos(), s.messages, s.bytes);
    }
}

/// Least squares `y = a n + b` through `(n, y)`, with R².
fn fit(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let k = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / k, sy / k);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let a = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let b = my - a * mx;
    let ss_tot: f64 = points.iter().map(|(_, y)| (y - my) * (y - my)).sum();
    let ss_res: f64 = points
        .iter()
        .map(|(x, y)| (y - (a * x + b)) * (y - (a * x + b)))
        .sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        1.0
    };
    (a, b, r2)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One case's printed figures.
struct Row {
    n: usize,
    slowest: Duration,
    msgs0: u64,
    msgs_other: u64,
    bytes0: u64,
    bytes_other: u64,
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let measuring = std::env::args().any(|a| a == "--bench");
    let cases: &[(usize, usize)] = if measuring {
        &[(4, 20), (32, 5), (72, 3), (144, 2), (576, 1)]
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
        "{:<14} {:<9} {:>5} {:>6} {:>12} {:>13} {:>10} {:>10} {:>11} {:>11} {:>10}",
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
    let mut fits = Vec::new();
    for pattern in [Pattern::Multicast, Pattern::UnicastPeers] {
        for transport in [Transport::Threads, Transport::Tcp, Transport::Processes] {
            let mut rows = Vec::new();
            for &(n, reps) in cases {
                if transport == Transport::Processes && n > PROCESSES_UP_TO {
                    continue;
                }
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
                    .max_by_key(|s| (s.messages, s.bytes))
                    .expect("two ranks or more");
                let job: u64 = samples.iter().map(|r| last(r).messages).sum::<u64>() / 2;
                println!(
                    "{:<14} {:<9} {:>5} {:>6} {:>12.2?} {:>13.2?} {:>10} {:>10} {:>11} {:>11} {:>10}",
                    pattern.label(),
                    transport.label(),
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
                rows.push(Row {
                    n,
                    slowest,
                    msgs0: last(&samples[0]).messages,
                    msgs_other: other.messages,
                    bytes0: last(&samples[0]).bytes,
                    bytes_other: other.bytes,
                });
            }
            if rows.len() >= 2 {
                fits.push((pattern, transport, rows));
            }
        }
    }
    // Per bring-up and transport: slope (per rank) and intercept of each
    // figure against n, and the worst R²; a quadratic growth would show as
    // an R² well below 1 and a slope that depends on the range of n.
    println!("fitted per rank: figure = a n + b, least squares over the cases");
    println!(
        "{:<14} {:<9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>8} {:>8}",
        "fit",
        "over",
        "msgs r0 a",
        "b",
        "msgs o a",
        "b",
        "bytes r0 a",
        "b",
        "bytes o a",
        "b",
        "slowest a",
        "b",
        "R2 msgs",
        "R2 time"
    );
    for (pattern, transport, rows) in fits {
        let pts = |f: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
            rows.iter().map(|r| (r.n as f64, f(r))).collect()
        };
        let m0 = fit(&pts(&|r| r.msgs0 as f64));
        let mo = fit(&pts(&|r| r.msgs_other as f64));
        let b0 = fit(&pts(&|r| r.bytes0 as f64));
        let bo = fit(&pts(&|r| r.bytes_other as f64));
        // Microseconds per rank.
        let t = fit(&pts(&|r| r.slowest.as_secs_f64() * 1e6));
        // The traffic's worst fit; the time's, apart (the scheduler's).
        let r2 = [m0.2, mo.2, b0.2, bo.2]
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        println!(
            "fit {:<10} {:<9} {:>9.2} {:>9.1} {:>9.2} {:>9.1} {:>10.1} {:>10.0} {:>10.1} {:>10.0} {:>9.1}us {:>9.0}us {:>8.4} {:>8.4}",
            pattern.label(),
            transport.label(),
            m0.0,
            m0.1,
            mo.0,
            mo.1,
            b0.0,
            b0.1,
            bo.0,
            bo.1,
            t.0,
            t.1,
            r2,
            t.2
        );
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
    for &(n, reps) in cases.iter().filter(|(n, _)| *n <= 32) {
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

//! The communicator pattern across OS processes (issue 20): `n` processes
//! over TCP on a model fabric (this program is the launcher and rank 0), or
//! MPI ranks under `mpirun` (`--mpi`). Every rank keeps three communicators
//! (a multicast team and unicast peers with a symmetric heap, both owned,
//! no lifetime) in a `HashMap`, each brought up with its own tag; the first
//! bring-up is retried on every rank because rank 1's driver is not ready
//! for its first two creates (a fault it sets on the fabric for itself);
//! every rank puts into its own heap and gets every peer's; one heap grows
//! by a chunk that peers reach without re-importing, then shrinks by
//! agreement (R13.5, R13.7); every rank closes its communicators by
//! agreement (R13.7: a close is collective, so in the same order on every
//! rank), one through the erased form.
//!
//! ```text
//! cargo run --features fabric --example communicator              # 4 ranks, 1 node
//! cargo run --features fabric --example communicator -- 8 2        # 8 ranks, 2 nodes of 4
//! cargo build --features fabric,mpi --example communicator --bin cuda-endpoints-fabric
//! target/debug/cuda-endpoints-fabric --nodes 1 --gpus 4 --driver-version 13050 -- \
//!     mpirun -n 4 --oversubscribe target/debug/examples/communicator --mpi
//! ```
//!
//! Two more modes, each a flag that the launcher passes to every rank:
//!
//! - `--eight` (issue 20, item 7): eight communicators over the
//!   same ranks and devices come up at once, each on its own thread over
//!   its own tagged channel of the rank's one TCP bootstrap
//!   (`team::Tagged`); each moves bytes between every pair of ranks, and
//!   every byte is checked, so none crosses into another. Under `mpirun`
//!   (`--mpi --eight`), whose communicator threads cannot share, each
//!   communicator has a TCP bootstrap of its own, rooted by rank 0 and its
//!   id sent over MPI.
//! - `--forge-id-table` (R13.4): rank 1 reports a forged digest of its
//!   peer-to-id table at the end of `unicast_peers`; every rank fails with
//!   the same error naming rank 1, its digest and rank 0's, leaving nothing
//!   behind; then the same bring-up without the forgery moves bytes. Also
//!   under `mpirun` (`--mpi --forge-id-table`).
//!
//! Exit codes: 0 every byte and every count right; 1 a byte or a count was
//! wrong; 2 could not run; 3 a rank hung or the fabric saw a leak or a
//! broken rule (`common/job.rs`).

#[allow(dead_code)]
mod common;
// The forging bootstrap the threads test uses too.
#[path = "../tests/common/forge.rs"]
mod forge;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::Me;
use common::job::{self, Checked, TIMEOUT};
use cuda_endpoints::model::faults::{Fault, FaultPlan};
use cuda_endpoints::team::{
    self, Cause, Mismatch, OwnedPeers, OwnedTeam, PeerSpec, Retry, Step, Tagged, TeamSpec,
};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, Mapped, PosixFd, Stream,
    bootstrap::{Bootstrap, Tcp, UniqueId},
    driver::{Call, Code},
};
use forge::ForgeIdTable;
use tracing_subscriber::layer::SubscriberExt;

const CHUNK: u64 = common::BYTES;
/// The heap's maximum: the unicast endpoints' size.
const MAX: u64 = 2 * CHUNK;
const LEN: u64 = 4096;

/// A communicator as a user keeps it: no lifetime anywhere.
struct Comm {
    team: OwnedTeam<Mapped<PosixFd>>,
    peers: OwnedPeers<Mapped<PosixFd>>,
}

fn chunk(
    ctx: &Context,
    dev: cuda_endpoints::Device,
) -> Result<Mapped<PosixFd>, cuda_endpoints::Error> {
    Allocation::<PosixFd>::on_device(ctx, dev, CHUNK)?
        .map(&[dev])
        .map_err(|f| f.error)
}

impl Comm {
    fn new(
        ctx: &Context,
        boot: &dyn Bootstrap,
        dev: cuda_endpoints::Device,
        tag: u64,
    ) -> Result<Comm, Box<dyn std::error::Error>> {
        // A short back-off: the attempts are counted, not timed.
        let retry = Retry::new(4, std::time::Duration::from_millis(5));
        let spec = TeamSpec::new([dev], CHUNK)
            .timeout(TIMEOUT)
            .tag(tag)
            .retry(retry);
        // Bound on every rank, agreed (R13.3), owned.
        let team = team::multicast(ctx, boot, &spec)?.into_bound(
            [(dev, 0, chunk(ctx, dev)?)],
            boot,
            TIMEOUT,
        )?;
        let spec = PeerSpec::new(dev, MAX)
            .timeout(TIMEOUT)
            .tag(tag)
            .retry(retry);
        let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned();
        // The first chunk: the every-rank-bound agreement (R13.3).
        peers.grow(boot, chunk(ctx, dev)?, TIMEOUT)?;
        Ok(Comm { team, peers })
    }

    /// Tears both down on every rank, once every rank completed its copies
    /// (R13.7); call it on every rank, communicators in the same order.
    fn close(self, boot: &dyn Bootstrap) -> Result<(), team::TeamError> {
        self.team.close(boot, TIMEOUT)?;
        self.peers.close(boot, TIMEOUT)
    }
}

/// Counts this process's failed bring-up attempts (`tracing` target
/// `cuda_endpoints::team`).
struct Attempts(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Attempts {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if e.metadata().target() == "cuda_endpoints::team" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Byte `i` of what rank `r` puts at `offset` of communicator `c`.
fn mark(r: usize, c: usize, offset: u64) -> Vec<u8> {
    vec![(r * 16 + c + 1) as u8 ^ (offset / CHUNK) as u8; LEN as usize]
}

fn rank(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, dev) = (boot.rank(), me.device());
    let mut checked = Checked::default();
    // Rank 1's first two creates (its probe's trial endpoint) are not ready:
    // every rank probes again, twice. Only the fabric's model takes faults.
    let faulted = match me {
        Me::Fabric(p) if r == 1 && boot.size() > 1 => {
            let pid = usize::try_from(p.pid())?;
            p.set_faults(
                FaultPlan::none().with(
                    Fault::nth(Call::Create, 1, Code::FABRIC_NOT_READY)
                        .times(2)
                        .on_process(pid),
                ),
            )?;
            true
        }
        _ => false,
    };
    let faulted = boot
        .allgather(&[u8::from(faulted)], TIMEOUT)?
        .iter()
        .any(|f| f == &[1]);
    let attempts = Arc::new(AtomicUsize::new(0));
    let sub = tracing_subscriber::registry().with(Attempts(attempts.clone()));
    let mut comms: HashMap<&str, Comm> = HashMap::new();
    tracing::subscriber::with_default(sub, || -> Result<(), Box<dyn std::error::Error>> {
        for (tag, name) in ["a", "b", "c"].into_iter().enumerate() {
            comms.insert(name, Comm::new(ctx, boot, dev, tag as u64)?);
        }
        Ok(())
    })?;
    let want = if faulted { 2 } else { 0 };
    let got = attempts.load(Ordering::Relaxed);
    if got != want {
        checked.wrong.push(format!(
            "rank {r}: {got} failed attempts in the trace, {want} expected"
        ));
    }

    // Every rank puts into its own heap, then gets every peer's.
    let stream = Stream::new(ctx, dev)?;
    for (c, name) in ["a", "b", "c"].into_iter().enumerate() {
        let own = comms[name].peers.own();
        stream
            .enqueue(CopyBatch::new().put_host(mark(r, c, 0), own, 0))?
            .wait()?;
    }
    boot.barrier(TIMEOUT)?;
    for (c, name) in ["a", "b", "c"].into_iter().enumerate() {
        let peers = &comms[name].peers;
        for p in (0..peers.ranks()).filter(|&p| p != r) {
            let ep = peers.peer(p).ok_or("no peer")?;
            let got = stream
                .enqueue(CopyBatch::new().get_host(ep, 0, LEN))?
                .wait()?;
            let got = got.received.into_iter().next().unwrap_or_default();
            checked.compare(&format!("{name}: rank {p}'s heap"), &got, &mark(p, c, 0));
        }
    }

    // Heap "a" grows by a chunk at the next offset on every rank; peers
    // reach it through the endpoints they imported (R13.5).
    let a = comms.get_mut("a").ok_or("no communicator a")?;
    let at = a.peers.grow(boot, chunk(ctx, dev)?, TIMEOUT)?;
    stream
        .enqueue(CopyBatch::new().put_host(mark(r, 0, at), a.peers.own(), at))?
        .wait()?;
    boot.barrier(TIMEOUT)?;
    for p in (0..a.peers.ranks()).filter(|&p| p != r) {
        let ep = a.peers.peer(p).ok_or("no peer")?;
        let got = stream
            .enqueue(CopyBatch::new().get_host(ep, at, LEN))?
            .wait()?;
        let got = got.received.into_iter().next().unwrap_or_default();
        checked.compare(&format!("a: rank {p}'s grown chunk"), &got, &mark(p, 0, at));
    }
    // Every rank stopped using the top chunk (R13.7): it shrinks.
    boot.barrier(TIMEOUT)?;
    drop(stream);
    let freed = a.peers.shrink(boot, TIMEOUT)?;
    if freed.is_none() || a.peers.top() != CHUNK {
        checked
            .wrong
            .push(format!("rank {r}: the heap did not shrink to one chunk"));
    }
    drop(freed);

    // Every rank closes its communicators, in the same order (a close is
    // collective, R13.7); rank 1 one of them through the erased form.
    for name in ["c", "a", "b"] {
        let Comm { team, peers } = comms.remove(name).ok_or("no communicator")?;
        if r % 3 == 1 {
            let erased = peers.into_dyn();
            team.close(boot, TIMEOUT)?;
            erased.close(boot, TIMEOUT)?;
        } else {
            team.close(boot, TIMEOUT)?;
            peers.close(boot, TIMEOUT)?;
        }
    }
    let teardown = ctx.take_teardown_errors();
    if !teardown.is_empty() {
        return Err(format!("rank {r}: teardown errors {teardown:?}").into());
    }
    me.holds_nothing(r)?;
    Ok(checked)
}

/// Every peer's heap of `peers` read back at offset 0: what rank `p` put
/// there as communicator `c` (after every rank put its own, `boot`'s
/// barrier).
fn put_and_get_every_peer(
    ctx: &Context,
    boot: &dyn Bootstrap,
    dev: cuda_endpoints::Device,
    peers: &OwnedPeers<Mapped<PosixFd>>,
    c: usize,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let r = boot.rank();
    let mut checked = Checked::default();
    let stream = Stream::new(ctx, dev)?;
    stream
        .enqueue(CopyBatch::new().put_host(mark(r, c, 0), peers.own(), 0))?
        .wait()?;
    boot.barrier(TIMEOUT)?;
    for p in (0..peers.ranks()).filter(|&p| p != r) {
        let ep = peers.peer(p).ok_or("no peer")?;
        let got = stream
            .enqueue(CopyBatch::new().get_host(ep, 0, LEN))?
            .wait()?;
        let got = got.received.into_iter().next().unwrap_or_default();
        checked.compare(&format!("{c}: rank {p}'s heap"), &got, &mark(p, c, 0));
    }
    // No barrier before the teardown: the close agrees that every rank
    // completed its copies (R13.7).
    Ok(checked)
}

/// Communicators brought up at once in `--eight` mode.
const AT_ONCE: u64 = 8;

/// `--eight`'s bring-ups on this rank, one per thread, all started
/// together: each gets its bootstrap from `boot_of(tag)` (on its thread),
/// brings its communicator up with that tag and moves bytes with every
/// peer. Returns every communicator with its bootstrap (kept until every
/// rank is done) and what they checked, one endpoint per communicator.
fn eight<B: Bootstrap + Send>(
    ctx: &Context,
    r: usize,
    dev: cuda_endpoints::Device,
    boot_of: impl Fn(u64) -> Result<B, String> + Sync,
) -> Result<(Vec<(Comm, B)>, Checked), String> {
    // Every bring-up starts together: none is done before another began.
    // (Before anything that can fail, so that no thread waits for one that
    // ended.)
    let start = std::sync::Barrier::new(AT_ONCE as usize);
    let made: Vec<Result<(Comm, Checked, B), String>> = std::thread::scope(|s| {
        let all: Vec<_> = (0..AT_ONCE)
            .map(|tag| {
                let (start, boot_of) = (&start, &boot_of);
                s.spawn(move || {
                    start.wait();
                    let fail = |e: Box<dyn std::error::Error>| format!("communicator {tag}: {e}");
                    let boot = boot_of(tag)?;
                    let c = usize::try_from(tag).map_err(|e| fail(e.into()))?;
                    let comm = Comm::new(ctx, &boot, dev, tag).map_err(fail)?;
                    let checked =
                        put_and_get_every_peer(ctx, &boot, dev, &comm.peers, c).map_err(fail)?;
                    Ok((comm, checked, boot))
                })
            })
            .collect();
        all.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let mut checked = Checked::default();
    let mut kept = Vec::with_capacity(made.len());
    for m in made {
        let (comm, c, boot) = m?;
        checked.bytes += c.bytes;
        checked.wrong.extend(c.wrong);
        kept.push((comm, boot));
    }
    // One endpoint per communicator, on the same device.
    let mut ids: Vec<u32> = kept.iter().map(|(c, _)| c.peers.own().id()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != kept.len() {
        checked.wrong.push(format!(
            "rank {r}: {} distinct endpoints for {} communicators",
            ids.len(),
            kept.len()
        ));
    }
    Ok((kept, checked))
}

/// The end of `--eight` on this rank, once every rank is done and this
/// rank dropped its communicators: no teardown error, nothing held.
fn eight_done(
    ctx: &Context,
    me: &Me,
    r: usize,
    how: &str,
    checked: Checked,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let teardown = ctx.take_teardown_errors();
    if !teardown.is_empty() {
        return Err(format!("rank {r}: teardown errors {teardown:?}").into());
    }
    me.holds_nothing(r)?;
    println!("communicator rank {r}: {AT_ONCE} communicators came up at once {how}, none crossed");
    Ok(checked)
}

/// `--eight` over TCP: the communicators share this rank's one bootstrap,
/// each over its own channel (its tag).
fn eight_at_once(
    ctx: &Context,
    me: &Me,
    boot: &(dyn Bootstrap + Sync),
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, dev) = (boot.rank(), me.device());
    let shared = Tagged::new(boot);
    let (comms, checked) = eight(ctx, r, dev, |tag| Ok(shared.channel(tag)))?;
    // Each communicator closes over its own channel, every rank in the
    // same order (R13.7).
    for (comm, channel) in comms {
        comm.close(&channel)?;
    }
    eight_done(ctx, me, r, "over one shared bootstrap", checked)
}

/// `--eight --mpi`: an MPI communicator is not shared by threads, so each
/// communicator has a TCP bootstrap of its own, rooted by rank 0 on
/// loopback (`mpirun`'s ranks on one node) and its id sent over MPI.
fn eight_over_mpi(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, n, dev) = (boot.rank(), boot.size(), me.device());
    let mut roots = Vec::new();
    let mut ids = String::new();
    if r == 0 {
        for _ in 0..AT_ONCE {
            let (id, root) = Tcp::root("127.0.0.1:0".parse()?)?;
            ids.push_str(&format!("{id}\n"));
            roots.push(Mutex::new(Some(root)));
        }
    }
    let ids = String::from_utf8(boot.broadcast(0, ids.as_bytes(), TIMEOUT)?)?;
    let ids: Vec<UniqueId> = ids.lines().map(str::parse).collect::<Result<_, _>>()?;
    let (comms, checked) = eight(ctx, r, dev, |tag| {
        let t = usize::try_from(tag).map_err(|e| e.to_string())?;
        let joined = if r == 0 {
            let root = roots.get(t).and_then(|m| m.lock().ok()?.take());
            root.ok_or("no root")?.accept(n, TIMEOUT)
        } else {
            Tcp::join(ids.get(t).ok_or("no id")?, r, n, TIMEOUT)
        };
        joined.map_err(|e| e.to_string())
    })?;
    for (comm, own) in comms {
        comm.close(&own)?;
    }
    eight_done(ctx, me, r, "over eight TCP bootstraps", checked)
}

/// The tag of `--forge-id-table`'s bring-ups.
const FORGED_TAG: u64 = 13;

/// `--forge-id-table`: rank 1 forges its peer-to-id table digest; every
/// rank must fail naming rank 1, its forged digest and rank 0's honest one,
/// with nothing left; then the bring-up without the forgery moves bytes.
fn forged_id_table(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, dev) = (boot.rank(), me.device());
    if boot.size() < 2 {
        return Err("--forge-id-table needs two ranks or more".into());
    }
    let spec = PeerSpec::new(dev, MAX).timeout(TIMEOUT).tag(FORGED_TAG);
    let forging = ForgeIdTable::new(boot, 1);
    let outcome = team::unicast_peers(ctx, &forging, &spec).map(drop);
    // Every rank's digest as it computed it: the honest tables agree.
    let honest = boot.allgather(&forging.honest_digest().unwrap_or(0).to_le_bytes(), TIMEOUT)?;
    let honest: Vec<u64> = honest
        .iter()
        .map(|d| <[u8; 8]>::try_from(d.as_slice()).map(u64::from_le_bytes))
        .collect::<Result<_, _>>()?;
    let mut checked = Checked::default();
    let reference = honest.first().copied().unwrap_or(0);
    if reference == 0 || honest.iter().any(|&d| d != reference) {
        checked
            .wrong
            .push(format!("rank {r}: the honest digests differ: {honest:x?}"));
    }
    let want = Mismatch::IdTable {
        reported: reference ^ forge::FLIP,
        expected: reference,
    };
    match outcome {
        Ok(()) => checked
            .wrong
            .push(format!("rank {r}: the forged table was not refused")),
        Err(e)
            if (e.rank, e.step) == (1, Step::Wait)
                && matches!(&e.cause, Cause::Mismatch(m) if *m == want) =>
        {
            println!(
                "communicator rank {r}: R13.4 refused: rank 1's peer-to-id table {:#018x} is not rank 0's {reference:#018x}",
                reference ^ forge::FLIP
            );
        }
        Err(e) => checked
            .wrong
            .push(format!("rank {r}: refused, but not as R13.4 names it: {e}")),
    }
    // The failed bring-up undid everything it made on this rank.
    me.holds_nothing(r)?;
    // The same bring-up, honest, moves bytes.
    let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned();
    peers.grow(boot, chunk(ctx, dev)?, TIMEOUT)?;
    let c = put_and_get_every_peer(ctx, boot, dev, &peers, 0)?;
    checked.bytes += c.bytes;
    checked.wrong.extend(c.wrong);
    peers.close(boot, TIMEOUT)?;
    let teardown = ctx.take_teardown_errors();
    if !teardown.is_empty() {
        return Err(format!("rank {r}: teardown errors {teardown:?}").into());
    }
    me.holds_nothing(r)?;
    Ok(checked)
}

fn main() -> ExitCode {
    let flag = |f: &str| std::env::args().any(|a| a == f);
    if flag("--eight") && flag("--mpi") {
        job::main("communicator", eight_over_mpi)
    } else if flag("--eight") {
        job::main_shared("communicator", eight_at_once)
    } else if flag("--forge-id-table") {
        job::main("communicator", forged_id_table)
    } else {
        job::main("communicator", rank)
    }
}

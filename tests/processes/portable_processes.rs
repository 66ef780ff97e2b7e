//! The portable path after a bring-up between real OS processes on a model
//! fabric (issue 19, item 4): `agree_bound` registers every peer's memory
//! as a window itself, so each rank gets every peer's bytes and puts into
//! the next rank's memory with no `add_peer_window` call —
//! `FabricShareable` memory across two nodes (its handle rides in the
//! agreement), `PosixFd` memory within one node (`agree_bound_fds`, its
//! descriptors passed with `SCM_RIGHTS`). A heap grown on owned peers
//! (`OwnedPeers::grow`, `grow_fds`) gets the peers' windows over each new
//! chunk from the grow agreement, so every peer reads the new chunk's bytes
//! at the grown offset, and loses them with the shrink (R13.5, R13.7).
//! Every byte is checked; every process ends with zero leak counters, and
//! so does the fabric.
#![cfg(feature = "fabric")]

use crate::job;
use crate::rank;
use crate::support;

use std::path::Path;
use std::time::Duration;

use cuda_endpoints::bootstrap::Bootstrap;
use cuda_endpoints::bounds::MemShare;
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::team::{self, PeerSpec};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, CopyPath, Device, Error, Exportable, FabricShareable, Mapped,
    PosixFd, Stream, Unicast, bounds::Accepts,
};

use job::{DIR, RANK, ROLE, SCENARIO, SIZE};
const BYTES: u64 = 2 << 20;
const LEN: usize = 4096;
const T: Duration = Duration::from_secs(10);

/// `LEN` bytes that differ from their neighbours and from other seeds'.
fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

#[test]
fn child_rank() {
    if std::env::var(ROLE).as_deref() != Ok("rank") {
        return; // not a child
    }
    let (r, n) = (support::env_usize(RANK), support::env_usize(SIZE));
    let dir = std::env::var(DIR).expect("dir");
    let (ctx, me) = rank::join();
    let boot = support::file_tcp(r, n, Path::new(&dir), T).expect("bootstrap");
    let dev = me.device().unwrap_or(Device(0));
    let scenario = std::env::var(SCENARIO).unwrap_or_default();
    let fds = scenario == "fd";
    if scenario == "fd-across" {
        return job::report_end(fd_across_rank(&ctx, &me, &boot, dev), boot, ctx, &me);
    }
    ctx.set_copy_path(CopyPath::Portable); // as on a driver before 13.5
    if let Some(how) = scenario.strip_prefix("grow-") {
        let outcome = match how {
            "fd" => grow_rank::<PosixFd>(r, n, &ctx, &me, &boot, dev, true),
            _ => grow_rank::<FabricShareable>(r, n, &ctx, &me, &boot, dev, false),
        };
        return job::report_end(outcome, boot, ctx, &me);
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let peers = team::unicast_peers(&ctx, &boot, &PeerSpec::new(dev, BYTES).timeout(T))?;
        let mut fd_mem: Option<Mapped<PosixFd>> = None;
        let mut fabric_mem: Option<Mapped<FabricShareable>> = None;
        let ptr;
        let binding = if fds {
            let m = fd_mem.insert(Allocation::<PosixFd>::on_device(&ctx, dev, BYTES)?.map(&[dev])?);
            ptr = m.device_ptr();
            peers.own().bind(dev, 0, &*m)?
        } else {
            let m = fabric_mem
                .insert(Allocation::<FabricShareable>::on_device(&ctx, dev, BYTES)?.map(&[dev])?);
            ptr = m.device_ptr();
            peers.own().bind(dev, 0, &*m)?
        };
        me.write(ptr, &pattern(r as u8))?;
        let bound = match fds {
            true => peers.agree_bound_fds(&boot, &me.node_id(), T)?,
            false => peers.agree_bound(&boot, T)?,
        };
        let stream = Stream::new(&ctx, dev)?;
        for p in (0..n).filter(|&p| p != r) {
            let ep = bound.peer(p).ok_or("no peer")?;
            let got = stream
                .enqueue(CopyBatch::new().get_host(ep, 0, LEN as u64))?
                .wait()?;
            if got.received != [pattern(p as u8)] {
                return Err(format!("rank {p}'s bytes are wrong here").into());
            }
        }
        let next = bound.peer((r + 1) % n).ok_or("no peer")?;
        let at = 65536 + (r * LEN) as u64;
        let put = CopyBatch::new().put_host(pattern(100 + r as u8), next, at);
        stream.enqueue(put)?.wait()?;
        boot.barrier(T)?;
        let prev = (r + n - 1) % n;
        if me.read(ptr + 65536 + (prev * LEN) as u64, LEN)? != pattern(100 + prev as u8) {
            return Err(format!("rank {prev}'s put is wrong in this rank's memory").into());
        }
        boot.barrier(T)?; // every rank stopped copying (R13.7)
        drop(stream);
        drop(binding);
        drop(peers);
        if !ctx.take_teardown_errors().is_empty() {
            return Err("teardown errors".into());
        }
        Ok(())
    };
    job::report_end(run(), boot, ctx, &me);
}

/// A rank of a job on two model nodes that binds `PosixFd` memory and calls
/// `agree_bound_fds` with its model node (`Process::node_id`): descriptors
/// cannot cross nodes, so every rank fails before the driver, saying so,
/// with nothing left.
fn fd_across_rank(
    ctx: &Context,
    me: &rank::Me,
    boot: &dyn Bootstrap,
    dev: Device,
) -> Result<(), Box<dyn std::error::Error>> {
    let peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, BYTES).timeout(T))?;
    let mem = Allocation::<PosixFd>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
    let binding = peers.own().bind(dev, 0, &mem)?;
    let outcome = peers.agree_bound_fds(boot, &me.node_id(), T).map(|_| ());
    let Err(e) = outcome else {
        return Err("descriptors crossed two model nodes".into());
    };
    if !e.to_string().contains("pass only within a node") {
        return Err(format!("not the node error: {e}").into());
    }
    drop(binding);
    drop(peers);
    Ok(())
}

/// A rank of the grow scenarios: owned peers with a heap of two chunks of
/// `H` memory (the second through `grow_fds` with `fds`); every peer's
/// bytes read at the grown offset and every rank's put into the next rank's
/// grown chunk checked; after the shrink the grown offset has no window.
fn grow_rank<H: MemShare>(
    r: usize,
    n: usize,
    ctx: &Context,
    me: &rank::Me,
    boot: &dyn Bootstrap,
    dev: Device,
    fds: bool,
) -> Result<(), Box<dyn std::error::Error>>
where
    Unicast<Exportable>: Accepts<H>,
{
    let spec = PeerSpec::new(dev, 2 * BYTES).timeout(T);
    let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned::<Mapped<H>>();
    let node = me.node_id();
    for want in [0, BYTES] {
        let chunk = Allocation::<H>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
        let at = match fds {
            true => peers.grow_fds(boot, &node, chunk, T)?,
            false => peers.grow(boot, chunk, T)?,
        };
        if at != want {
            return Err(format!("grown at {at}, not {want}").into());
        }
    }
    let grown = peers.memory().get(1).ok_or("no second chunk")?.device_ptr();
    me.write(grown, &pattern(r as u8))?;
    boot.barrier(T)?;
    let stream = Stream::new(ctx, dev)?;
    for p in (0..n).filter(|&p| p != r) {
        let ep = peers.peer(p).ok_or("no peer")?;
        let got = stream
            .enqueue(CopyBatch::new().get_host(ep, BYTES, LEN as u64))?
            .wait()?;
        if got.received != [pattern(p as u8)] {
            return Err(format!("rank {p}'s grown chunk is wrong here").into());
        }
    }
    let next = peers.peer((r + 1) % n).ok_or("no peer")?;
    let at = BYTES + 65536 + (r * LEN) as u64;
    let put = CopyBatch::new().put_host(pattern(100 + r as u8), next, at);
    stream.enqueue(put)?.wait()?;
    boot.barrier(T)?;
    let prev = (r + n - 1) % n;
    if me.read(grown + 65536 + (prev * LEN) as u64, LEN)? != pattern(100 + prev as u8) {
        return Err(format!("rank {prev}'s put is wrong in this rank's grown chunk").into());
    }
    boot.barrier(T)?; // every rank stopped copying (R13.7)
    drop(peers.shrink(boot, T)?.ok_or("no chunk to shrink")?);
    let next = peers.peer((r + 1) % n).ok_or("no peer")?;
    let after = stream.enqueue(CopyBatch::new().get_host(next, BYTES, 64));
    // Past the agreed top after the shrink: refused before any window is
    // looked for (R13.3).
    if !matches!(
        after.map(|_| ()),
        Err(Error::CopyNotAgreed { agreed: BYTES, .. })
    ) {
        return Err("a copy past the shrunk heap's top was not refused".into());
    }
    drop(stream);
    drop(peers);
    if !ctx.take_teardown_errors().is_empty() {
        return Err("teardown errors".into());
    }
    Ok(())
}

/// Runs `nodes` x `gpus` ranks of `scenario` on a fresh fabric; checks that
/// each rank ended "ok" with nothing left, and the fabric too.
fn job(scenario: &str, nodes: usize, gpus: usize) {
    let n = nodes * gpus;
    let config = FabricConfig::nodes(nodes, gpus);
    let bound = Duration::from_secs(60);
    let (done, server) = job::run(
        "portable_processes::child_rank",
        scenario,
        config,
        (n, n),
        |_| "",
        bound,
    );
    for d in &done {
        let res = d.results();
        for want in ["ok", "leaks=0", "double-violations=[]"] {
            assert!(
                res.contains(&want.to_owned()),
                "{}: {res:?}\n{}",
                d.name,
                d.stderr
            );
        }
    }
    assert!(server.live().is_empty(), "fabric left: {:?}", server.live());
    assert!(server.violations().is_empty(), "{:?}", server.violations());
}

#[test]
fn fabric_shareable_peers_across_two_nodes_copy_every_byte_after_agree_bound_alone() {
    job("fabric", 2, 2);
}

#[test]
fn posix_fd_peers_of_one_node_copy_every_byte_after_agree_bound_fds_alone() {
    job("fd", 1, 3);
}

#[test]
fn agree_bound_fds_on_two_model_nodes_fails_every_rank_before_the_driver_naming_the_node_rule() {
    job("fd-across", 2, 2);
}

#[test]
fn r13_5_fabric_shareable_heap_grown_across_two_nodes_gives_every_peer_the_new_chunks_bytes() {
    job("grow-fabric", 2, 2);
}

#[test]
fn r13_5_posix_fd_heap_grown_with_grow_fds_on_one_node_gives_every_peer_the_new_chunks_bytes() {
    job("grow-fd", 1, 3);
}

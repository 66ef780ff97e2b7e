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
//! Issue 29: four ranks of four devices each bind 1,024 chunks (the most
//! bindings a device may have, `team::MAX_BINDINGS_PER_DEVICE`, on every
//! device), agree over TCP and grow a heap, and every byte moves; one
//! binding past the limit fails every rank with one error naming its
//! sender and the limit; a rank that echoes rank 0's own chunk handle as
//! its window share at a grow is refused at import on every rank, and
//! nothing lands in rank 0's memory.
//! Every byte is checked; every process ends with zero leak counters, and
//! so does the fabric.
#![cfg(feature = "fabric")]

use crate::forge;
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
    match scenario.as_str() {
        "many" | "many-past" => {
            let past = scenario == "many-past";
            return job::report_end(many_rank(r, n, &ctx, &me, &boot, past), boot, ctx, &me);
        }
        "echo" => {
            let boot = forge::EchoShare::new(boot, 1, 0);
            return job::report_end(echo_rank(r, &ctx, &me, &boot, dev), boot, ctx, &me);
        }
        _ => {}
    }
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
    peers.close(boot, T)?; // every rank completed its copies (R13.7)
    if !ctx.take_teardown_errors().is_empty() {
        return Err("teardown errors".into());
    }
    Ok(())
}

/// Runs `nodes` x `gpus` ranks of `scenario` on a fresh fabric; checks that
/// each rank ended "ok" with nothing left, and the fabric too.
fn job(scenario: &str, nodes: usize, gpus: usize) {
    let config = FabricConfig::nodes(nodes, gpus);
    job_of(
        scenario,
        config,
        nodes * gpus,
        |_| "",
        Duration::from_secs(60),
    );
}

/// As [`job`], `n` ranks on the fabric of `config`, rank `r` joining it
/// with `extra(r)`, every wait within `bound`.
fn job_of(
    scenario: &str,
    config: FabricConfig,
    n: usize,
    extra: impl Fn(usize) -> &'static str,
    bound: Duration,
) {
    let (done, server) = job::run(
        "portable_processes::child_rank",
        scenario,
        config,
        (n, n),
        extra,
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

/// Devices per rank of the `many` scenarios, and chunks per device.
const DEVICES: i32 = 4;
const AT_LIMIT: u64 = team::MAX_BINDINGS_PER_DEVICE;
/// Bounds of the `many` scenarios: 4,096 chunks shared over TCP and
/// imported by three peers each, on a busy 2-core machine.
const T_MANY: Duration = Duration::from_secs(150);

/// A rank of the `many` scenarios, alone on its node of `DEVICES` GPUs: a
/// multicast team of every rank's devices on the portable path, each rank
/// binding `AT_LIMIT` chunks of `BYTES` on every device (1,024 memory
/// shares in its report, 120 KB, in two frames); the agreement passes; rank
/// 0's put across the last two chunks reaches every member's memory; then
/// unicast peers grow a heap of one chunk and every rank gets every peer's
/// bytes. `past`: rank 1 binds one chunk more than `AT_LIMIT` on its last
/// device (the others one chunk each), and every rank must fail with the
/// same error naming rank 1, the bind step and the limit.
fn many_rank(
    r: usize,
    n: usize,
    ctx: &Context,
    me: &rank::Me,
    boot: &dyn Bootstrap,
    past: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let devs: Vec<Device> = (0..DEVICES).map(Device).collect();
    let chunks = |d: i32| match (past, r == 1 && d == DEVICES - 1) {
        (false, _) => AT_LIMIT,
        (true, true) => AT_LIMIT + 1,
        (true, false) => 1,
    };
    let size = (AT_LIMIT + u64::from(past)) * BYTES;
    let spec = team::TeamSpec::new(devs.clone(), size).timeout(T_MANY);
    let shared = team::multicast(ctx, boot, &spec)?;
    let mut mem: Vec<Vec<Mapped<FabricShareable>>> = Vec::new();
    for &d in &devs {
        let mut mine = Vec::new();
        for _ in 0..chunks(d.0) {
            mine.push(Allocation::<FabricShareable>::on_device(ctx, d, BYTES)?.map(&[d])?);
        }
        mem.push(mine);
    }
    let mut bindings = Vec::new();
    for (&d, mine) in devs.iter().zip(&mem) {
        for (i, m) in mine.iter().enumerate() {
            bindings.push(shared.endpoint().bind(d, i as u64 * BYTES, m)?);
        }
    }
    let bound = shared.agree_bound(boot, T_MANY);
    if past {
        let e = bound
            .map(|_| ())
            .err()
            .ok_or("a report past the limit went through")?;
        let said = e.to_string();
        let want = matches!(
            e.cause,
            team::Cause::TooLarge {
                len: 257,
                limit: 256,
                ..
            }
        );
        if (e.rank, e.step, want) != (1, team::Step::Bind, true)
            || !said.contains("past the limit of 256")
        {
            return Err(format!("not the limit's error: {said}").into());
        }
        drop(bindings);
        drop(shared);
        return Ok(());
    }
    let bound = bound?;
    let stream = Stream::new(ctx, devs[0])?;
    let at = size - BYTES - (LEN / 2) as u64;
    if r == 0 {
        let put = CopyBatch::new().put_host(pattern(9), bound.endpoint(), at);
        stream.enqueue(put)?.wait()?;
    }
    boot.barrier(T_MANY)?;
    for (d, mine) in mem.iter().enumerate() {
        let (a, b) = (&mine[mine.len() - 2], &mine[mine.len() - 1]);
        let half = LEN / 2;
        let mut got = me.read(a.device_ptr() + BYTES - half as u64, half)?;
        got.extend(me.read(b.device_ptr(), LEN - half)?);
        if got != pattern(9) {
            return Err(format!("rank 0's put is wrong on device {d} here").into());
        }
    }
    boot.barrier(T_MANY)?; // every rank stopped copying (R13.7)
    drop(stream);
    // A heap grown over the same bootstrap after the large agreement.
    let spec = PeerSpec::new(devs[0], BYTES).timeout(T_MANY);
    let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned::<Mapped<FabricShareable>>();
    let chunk = Allocation::<FabricShareable>::on_device(ctx, devs[0], BYTES)?.map(&[devs[0]])?;
    me.write(chunk.device_ptr(), &pattern(r as u8))?;
    peers.grow(boot, chunk, T_MANY)?;
    let stream = Stream::new(ctx, devs[0])?;
    for p in (0..n).filter(|&p| p != r) {
        let ep = peers.peer(p).ok_or("no peer")?;
        let got = stream
            .enqueue(CopyBatch::new().get_host(ep, 0, LEN as u64))?
            .wait()?;
        if got.received != [pattern(p as u8)] {
            return Err(format!("rank {p}'s grown chunk is wrong here").into());
        }
    }
    drop(stream);
    peers.close(boot, T_MANY)?; // every rank stopped copying (R13.7)
    drop(bindings);
    drop(shared);
    if !ctx.take_teardown_errors().is_empty() {
        return Err("teardown errors".into());
    }
    Ok(())
}

/// A rank of the `echo` scenario: owned peers grow a heap by one chunk;
/// at the second grow rank 1 (`forge::EchoShare`) sends rank 0's first
/// chunk handle as its own share. Every rank must fail that grow at import
/// with one error naming rank 1 (seen by rank 0: its own memory), with the
/// heap as it was; rank 0's put to rank 1 then lands in rank 1's memory,
/// and rank 0's own chunk keeps its bytes.
fn echo_rank(
    r: usize,
    ctx: &Context,
    me: &rank::Me,
    boot: &forge::EchoShare<impl Bootstrap>,
    dev: Device,
) -> Result<(), Box<dyn std::error::Error>> {
    let spec = PeerSpec::new(dev, 2 * BYTES).timeout(T);
    let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned::<Mapped<FabricShareable>>();
    let chunk = || -> Result<_, Error> {
        Allocation::<FabricShareable>::on_device(ctx, dev, BYTES)?
            .map(&[dev])
            .map_err(|f| f.error)
    };
    peers.grow(boot, chunk()?, T)?;
    let first = peers.memory().first().ok_or("no chunk")?.device_ptr();
    me.write(first, &pattern(r as u8))?;
    boot.barrier(T)?;
    let e = peers
        .grow(boot, chunk()?, T)
        .err()
        .ok_or("the echoed share was taken")?;
    let aliased = matches!(
        e.cause,
        team::Cause::Aliased {
            seen_by: 0,
            owner: 0
        }
    );
    if (e.rank, e.step, aliased) != (1, team::Step::Import, true) || boot.forged() != (r == 1) {
        return Err(format!("not the alias error: {e}").into());
    }
    if peers.top() != BYTES {
        return Err("the heap changed".into());
    }
    let stream = Stream::new(ctx, dev)?;
    if r == 0 {
        let ep = peers.peer(1).ok_or("no peer")?;
        stream
            .enqueue(CopyBatch::new().put_host(pattern(200), ep, 0))?
            .wait()?;
    }
    boot.barrier(T)?;
    let want = if r == 1 {
        pattern(200)
    } else {
        pattern(r as u8)
    };
    if me.read(first, LEN)? != want {
        return Err(format!("rank {r}'s first chunk has other bytes").into());
    }
    drop(stream);
    peers.close(boot, T)?; // every rank stopped copying (R13.7)
    if !ctx.take_teardown_errors().is_empty() {
        return Err("teardown errors".into());
    }
    Ok(())
}

/// Four nodes of four GPUs whose endpoints may be one chunk larger than
/// `AT_LIMIT` chunks (the model's H200 allows exactly `AT_LIMIT`).
fn four_by_four() -> FabricConfig {
    let mut config = FabricConfig::nodes(4, DEVICES as usize);
    for d in config.nodes.iter_mut().flat_map(|n| n.devices.iter_mut()) {
        d.max_size = (AT_LIMIT + 1) * BYTES;
    }
    config
}

/// Rank `r` alone on node `r` of [`four_by_four`], with all its GPUs.
fn alone(r: usize) -> &'static str {
    [",node=0", ",node=1", ",node=2", ",node=3"][r]
}

#[test]
fn four_ranks_of_1024_chunks_on_four_devices_bring_up_grow_and_move_every_byte_over_tcp() {
    job_of("many", four_by_four(), 4, alone, Duration::from_secs(500));
}

#[test]
fn one_binding_past_the_limit_fails_every_rank_with_one_error_naming_the_sender_and_the_limit() {
    job_of(
        "many-past",
        four_by_four(),
        4,
        alone,
        Duration::from_secs(200),
    );
}

#[test]
fn a_rank_echoing_rank_0s_chunk_handle_at_a_grow_is_refused_at_import_on_every_rank() {
    job("echo", 1, 3);
}

//! The portable path after a bring-up (issue 19, item 4): `agree_bound`
//! registers every peer's `FabricShareable` memory as a window itself, so a
//! put or get between ranks works with no `add_peer_window` call; a failed
//! import fails every rank alike and leaves nothing behind. A heap grown
//! on owned peers (`OwnedPeers::grow`, `grow_fds`) gets its peers' windows
//! over each new chunk from the grow agreement, and loses them with the
//! shrink (R13.5, R13.7). A bind report of every binding a device may
//! have travels in pieces, and one binding past the limit fails every rank
//! with the same error naming its sender; a peer that echoes known memory
//! as its own window share is refused at import on every rank (issue 29).
//! Ranks are threads, each its own process of one model node on a 13.5
//! driver forced onto the portable path (`set_copy_path`), as on drivers
//! before 13.5.

use crate::common;
use crate::forge;

use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, NodeId, Threads};
use cuda_endpoints::bounds::{Accepts, MemShare};
use cuda_endpoints::driver::{Call, Code};
use cuda_endpoints::model::faults::{Fault, FaultPlan};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::team::{self, Cause, OwnedPeers, PeerSpec, Peers, Step, TeamSpec};
use cuda_endpoints::{
    Context, CopyBatch, CopyPath, Error, Exportable, FabricShareable, Mapped, PosixFd, Stream,
    Unicast,
};

use common::portable::pattern;
use common::{node_processes, on_every_rank};

const BYTES: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);
const N: usize = 3;
/// Bytes each copy moves.
const LEN: usize = 4096;

/// Every context of `ranks` on the portable path, as a driver before 13.5.
fn portable(ranks: &[(Context, Model)]) {
    for (ctx, _) in ranks {
        ctx.set_copy_path(CopyPath::Portable);
    }
}

/// Each rank puts its pattern into its own endpoint, gets every peer's,
/// puts into the next rank's endpoint, and finds the previous rank's put in
/// the memory it bound at `mem_ptr`: every byte checked.
fn exchange(
    r: usize,
    me: &Model,
    boot: &dyn Bootstrap,
    bound: &team::BoundPeers<'_>,
    mem_ptr: u64,
) {
    let dev = r as i32;
    let stream = Stream::new(me_ctx(bound), dev).unwrap();
    stream
        .enqueue(CopyBatch::new().put_host(pattern(r as u8, LEN), bound.own(), 0))
        .unwrap()
        .wait()
        .unwrap();
    boot.barrier(T).unwrap();
    for p in (0..N).filter(|&p| p != r) {
        let got = stream
            .enqueue(CopyBatch::new().get_host(bound.peer(p).unwrap(), 0, LEN as u64))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got.received, [pattern(p as u8, LEN)], "rank {r} from {p}");
    }
    let next = (r + 1) % N;
    let at = 65536 + (r * LEN) as u64;
    let put = CopyBatch::new().put_host(pattern(100 + r as u8, LEN), bound.peer(next).unwrap(), at);
    stream.enqueue(put).unwrap().wait().unwrap();
    boot.barrier(T).unwrap();
    // The owner sees the previous rank's put in the memory it bound.
    let prev = (r + N - 1) % N;
    let at = 65536 + (prev * LEN) as u64;
    assert_eq!(
        me.read(mem_ptr + at, LEN).unwrap(),
        pattern(100 + prev as u8, LEN),
        "rank {r}: rank {prev}'s put"
    );
    boot.barrier(T).unwrap(); // every rank stopped copying (R13.7)
}

/// Rank `r` brings up its unicast peers on its device, binds `H` memory of
/// that device to its own endpoint, runs `f` with the peers and the
/// memory's address, then tears both down, keeping no teardown error.
fn with_bound_peers<H: MemShare, R>(
    r: usize,
    ctx: &Context,
    boot: &dyn Bootstrap,
    f: impl FnOnce(&Peers, u64) -> R,
) -> R
where
    Unicast<Exportable>: Accepts<H>,
{
    let dev = r as i32;
    let peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, BYTES).timeout(T)).unwrap();
    let mem = common::mapped::<H>(ctx, dev, BYTES);
    let binding = peers.own().bind(dev, 0, &mem).unwrap();
    let out = f(&peers, mem.device_ptr());
    drop(binding);
    drop(peers);
    assert!(ctx.take_teardown_errors().is_empty());
    out
}

fn me_ctx<'b>(bound: &'b team::BoundPeers<'_>) -> &'b Context {
    bound.own().context()
}

#[test]
fn after_agree_bound_unicast_peers_put_and_get_every_byte_with_no_add_peer_window() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    on_every_rank(&ranks, Threads::new(N), |r, ctx, me, boot| {
        with_bound_peers::<FabricShareable, _>(r, ctx, boot, |peers, mem_ptr| {
            let bound = peers.agree_bound(boot, T).unwrap();
            exchange(r, me, boot, &bound, mem_ptr);
        })
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn after_agree_bound_fds_posix_fd_peers_put_and_get_every_byte_with_no_add_peer_window() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let node = NodeId::current().unwrap();
    on_every_rank(&ranks, Threads::new(N), |r, ctx, me, boot| {
        with_bound_peers::<PosixFd, _>(r, ctx, boot, |peers, mem_ptr| {
            let bound = peers.agree_bound_fds(boot, &node, T).unwrap();
            exchange(r, me, boot, &bound, mem_ptr);
        })
    });
    common::clean(&ranks[0].0, &model);
}

/// `PosixFd` memory under the plain agreement on the portable path: peers
/// could get no window onto it, so the agreement fails on every rank alike
/// (at `Step::Bind`, naming the rank that bound it), with the fix named,
/// rather than a peer's first copy there; nothing is left behind.
#[test]
fn posix_fd_memory_under_plain_agree_bound_fails_every_rank_naming_agree_bound_fds() {
    let (ranks, model) = node_processes(2);
    portable(&ranks);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, _, boot| {
        // Rank 0 binds `FabricShareable`, rank 1 `PosixFd`.
        let e = if r == 0 {
            with_bound_peers::<FabricShareable, _>(r, ctx, boot, |peers, _| {
                peers.agree_bound(boot, T).map(|_| ()).unwrap_err()
            })
        } else {
            with_bound_peers::<PosixFd, _>(r, ctx, boot, |peers, _| {
                peers.agree_bound(boot, T).map(|_| ()).unwrap_err()
            })
        };
        assert_eq!((e.rank, e.step), (1, Step::Bind), "rank {r}: {e}");
        assert!(
            matches!(
                e.cause,
                Cause::Local(Error::PosixFdWithoutFds {
                    offset: 0,
                    size: BYTES,
                    ..
                }) | Cause::Peer(_)
            ),
            "rank {r}: {e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("agree_bound_fds"), "rank {r}: {msg}");
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn after_agree_bound_a_portable_multicast_put_lands_in_every_members_memory() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let got = on_every_rank(&ranks, Threads::new(N), |r, ctx, me, boot| {
        let dev = r as i32;
        let team = team::multicast(ctx, boot, &TeamSpec::new([dev], BYTES).timeout(T)).unwrap();
        let mem = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        let binding = team.endpoint().bind(dev, 0, &mem).unwrap();
        let bound = team.agree_bound(boot, T).unwrap();
        let stream = Stream::new(ctx, dev).unwrap();
        if r == 0 {
            stream
                .enqueue(CopyBatch::new().put_host(pattern(7, LEN), bound.endpoint(), 8192))
                .unwrap()
                .wait()
                .unwrap();
        }
        boot.barrier(T).unwrap();
        let mine = me.read(mem.device_ptr() + 8192, LEN).unwrap();
        boot.barrier(T).unwrap();
        drop(stream);
        drop(binding);
        drop(team);
        assert!(ctx.take_teardown_errors().is_empty());
        mine
    });
    for (r, bytes) in got.into_iter().enumerate() {
        assert_eq!(bytes, pattern(7, LEN), "rank {r}");
    }
    common::clean(&ranks[0].0, &model);
}

#[test]
fn an_import_that_fails_on_one_rank_fails_every_rank_alike_and_leaks_nothing() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let errors = on_every_rank(&ranks, Threads::new(N), |r, ctx, _, boot| {
        with_bound_peers::<FabricShareable, _>(r, ctx, boot, |peers, _| {
            boot.barrier(T).unwrap();
            if r == 0 {
                // One import of memory in the whole node fails, after another
                // succeeded: its mapping must be undone too.
                model.set_faults(FaultPlan::none().with(Fault::nth(
                    Call::MemImportFromShareableHandle,
                    2,
                    Code::OUT_OF_MEMORY,
                )));
            }
            boot.barrier(T).unwrap();
            let e = peers.agree_bound(boot, T).map(|_| ()).unwrap_err();
            (r, e)
        })
    });
    assert_eq!(model.faults_fired(), 1);
    let failed = errors[0].1.rank;
    for (r, e) in &errors {
        assert_eq!((e.rank, e.step), (failed, Step::Import), "rank {r}: {e}");
        if *r == failed {
            assert!(
                matches!(
                    &e.cause,
                    Cause::Local(Error::Driver {
                        call: Call::MemImportFromShareableHandle,
                        ..
                    })
                ),
                "{e}"
            );
        }
    }
    common::clean(&ranks[0].0, &model);
}

#[test]
fn agree_bound_fds_with_ranks_on_another_node_fails_every_rank_at_import_naming_one_and_leaks_nothing()
 {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let errors = on_every_rank(&ranks, Threads::new(N), |r, ctx, _, boot| {
        with_bound_peers::<PosixFd, _>(r, ctx, boot, |peers, _| {
            // Ranks 1 and 2 say they are on another node than rank 0's: a
            // descriptor cannot reach them (R12.4).
            let node = NodeId::from_parts(if r == 0 { "a" } else { "b" }, "boot", 1);
            peers
                .agree_bound_fds(boot, &node, T)
                .map(|_| ())
                .unwrap_err()
        })
    });
    for (r, e) in errors.iter().enumerate() {
        assert_eq!(e.step, Step::Import, "rank {r}: {e}");
        assert!(matches!(e.cause, Cause::Bootstrap(_)), "rank {r}: {e}");
        // Every rank names the same one: the first off the root's node.
        assert_eq!(e.rank, 1, "rank {r}: {e}");
    }
    common::clean(&ranks[0].0, &model);
}

/// Rank `r`'s owned peers with a heap of up to three `BYTES` chunks.
fn owned_peers<H: MemShare>(
    r: usize,
    ctx: &Context,
    boot: &dyn Bootstrap,
) -> OwnedPeers<Mapped<H>> {
    let spec = PeerSpec::new(r as i32, 3 * BYTES).timeout(T);
    team::unicast_peers(ctx, boot, &spec).unwrap().into_owned()
}

/// Grows the heap by two chunks (through `grow_fds` with `node`), writes a
/// pattern into each chunk's memory, gets every peer's at the grown offset
/// and at the first chunk, puts into the next rank's grown chunk; then
/// shrinks, after which the grown offset is past the agreed top, and tears
/// down. Every byte checked.
fn grow_get_shrink<H: MemShare>(
    r: usize,
    ctx: &Context,
    me: &Model,
    boot: &dyn Bootstrap,
    node: Option<&NodeId>,
) where
    Unicast<Exportable>: Accepts<H>,
{
    let dev = r as i32;
    let mut peers = owned_peers::<H>(r, ctx, boot);
    for want in [0, BYTES] {
        let chunk = common::mapped::<H>(ctx, dev, BYTES);
        let at = match node {
            Some(node) => peers.grow_fds(boot, node, chunk, T),
            None => peers.grow(boot, chunk, T),
        };
        assert_eq!(at.unwrap(), want);
    }
    for (i, m) in peers.memory().iter().enumerate() {
        me.write(m.device_ptr() + 8192, &pattern((16 * i + r) as u8, LEN))
            .unwrap();
    }
    boot.barrier(T).unwrap();
    let stream = Stream::new(ctx, dev).unwrap();
    for p in (0..N).filter(|&p| p != r) {
        for (i, at) in [(1, BYTES + 8192), (0, 8192)] {
            let get = CopyBatch::new().get_host(peers.peer(p).unwrap(), at, LEN as u64);
            let got = stream.enqueue(get).unwrap().wait().unwrap();
            let want = pattern((16 * i + p) as u8, LEN);
            assert_eq!(got.received, [want], "rank {r} from {p} at {at}");
        }
    }
    let next = peers.peer((r + 1) % N).unwrap();
    let at = BYTES + 65536 + (r * LEN) as u64;
    let put = CopyBatch::new().put_host(pattern(100 + r as u8, LEN), next, at);
    stream.enqueue(put).unwrap().wait().unwrap();
    boot.barrier(T).unwrap();
    let prev = (r + N - 1) % N;
    let at = 65536 + (prev * LEN) as u64;
    assert_eq!(
        me.read(peers.memory()[1].device_ptr() + at, LEN).unwrap(),
        pattern(100 + prev as u8, LEN),
        "rank {r}: rank {prev}'s put into the grown chunk"
    );
    boot.barrier(T).unwrap(); // every rank stopped copying (R13.7)
    drop(peers.shrink(boot, T).unwrap().expect("the grown chunk"));
    let peer = peers.peer((r + 1) % N).unwrap();
    let e = stream
        .enqueue(CopyBatch::new().get_host(peer, BYTES + 8192, 64))
        .map(|_| ())
        .unwrap_err();
    // Past the agreed top after the shrink: refused before any window is
    // looked for (R13.3).
    assert!(
        matches!(e, Error::CopyNotAgreed { agreed: BYTES, .. }),
        "{e}"
    );
    let got = stream
        .enqueue(CopyBatch::new().get_host(peer, 8192, LEN as u64))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got.received, [pattern(((r + 1) % N) as u8, LEN)]);
    drop(stream);
    peers.close(boot, T).unwrap(); // every rank completed its copies (R13.7)
    assert!(ctx.take_teardown_errors().is_empty());
}

#[test]
fn r13_5_a_get_at_the_grown_offset_from_every_peer_returns_the_new_chunks_bytes_on_the_portable_path()
 {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    on_every_rank(&ranks, Threads::new(N), |r, ctx, me, boot| {
        grow_get_shrink::<FabricShareable>(r, ctx, me, boot, None);
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn r13_5_grow_fds_gives_posix_fd_chunks_their_windows_at_the_grown_offset_on_the_portable_path() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let node = NodeId::current().unwrap();
    on_every_rank(&ranks, Threads::new(N), |r, ctx, me, boot| {
        grow_get_shrink::<PosixFd>(r, ctx, me, boot, Some(&node));
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn a_grown_chunk_that_fails_to_import_on_one_rank_fails_every_rank_and_leaves_the_heap_as_it_was() {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let errors = on_every_rank(&ranks, Threads::new(N), |r, ctx, _, boot| {
        let dev = r as i32;
        let mut peers = owned_peers::<FabricShareable>(r, ctx, boot);
        let first = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        peers.grow(boot, first, T).unwrap();
        boot.barrier(T).unwrap();
        if r == 0 {
            // One import of the second chunk in the whole node fails, after
            // another succeeded: its mapping must be undone too.
            model.set_faults(FaultPlan::none().with(Fault::nth(
                Call::MemImportFromShareableHandle,
                2,
                Code::OUT_OF_MEMORY,
            )));
        }
        boot.barrier(T).unwrap();
        let second = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        let e = peers.grow(boot, second, T).unwrap_err();
        assert_eq!(peers.top(), BYTES, "rank {r}: the heap as it was");
        peers.close(boot, T).unwrap();
        assert!(ctx.take_teardown_errors().is_empty());
        e
    });
    assert_eq!(model.faults_fired(), 1);
    let failed = errors[0].rank;
    for (r, e) in errors.iter().enumerate() {
        assert_eq!((e.rank, e.step), (failed, Step::Import), "rank {r}: {e}");
    }
    common::clean(&ranks[0].0, &model);
}

/// An imported unicast endpoint has one target, the owner: a peer window
/// added by hand under another rank number than the bring-up's makes two
/// targets after `agree_bound` registers the owner's. A copy through it is
/// refused naming the extra window (not a missing one), and a third
/// `(rank, device)` is refused when added.
#[test]
fn windows_for_more_targets_than_an_imported_unicast_has_are_named_as_extra() {
    const RANKS: usize = 2;
    let (ranks, model) = node_processes(RANKS);
    portable(&ranks);
    on_every_rank(&ranks, Threads::new(RANKS), |r, ctx, _me, boot| {
        with_bound_peers::<FabricShareable, _>(r, ctx, boot, |peers, _| {
            let other = 1 - r;
            let ep = peers.peer(other).unwrap();
            let stray = common::mapped::<FabricShareable>(ctx, r as i32, BYTES);
            ep.add_peer_window(7, other as i32, 0, &stray).unwrap();
            let bound = peers.agree_bound(boot, T).unwrap();
            let stream = Stream::new(ctx, r as i32).unwrap();
            let e = stream
                .enqueue(CopyBatch::new().get_host(bound.peer(other).unwrap(), 0, 64))
                .map(|_| ())
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::CopyWindowsPastTargets {
                        op: 0,
                        members: 2,
                        targets: 1,
                        ..
                    }
                ),
                "{e:?}"
            );
            assert!(!e.to_string().contains("reachable here"), "{e}");
            let e = ep.add_peer_window(8, other as i32, 0, &stray).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::PeerWindowNoTarget {
                        rank: 8,
                        targets: 1,
                        here: 0,
                        peers: 2,
                        ..
                    }
                ),
                "{e:?}"
            );
            drop(stream);
            boot.barrier(T).unwrap(); // every rank stopped copying (R13.7)
        })
    });
    common::clean(&ranks[0].0, &model);
}

/// Bindings per device at the limit (`team::MAX_BINDINGS_PER_DEVICE`).
const AT_LIMIT: u64 = team::MAX_BINDINGS_PER_DEVICE;

/// Two ranks of a multicast team of eight devices on the portable path,
/// each binding `chunks(r, d)` chunks of `BYTES` on each of its four devices
/// in an endpoint of `size` bytes per device, then agreeing that every rank
/// bound; `then` gets the rank, its model, the bound team (or the error) and
/// every chunk's memory per device.
fn many_chunks<R: Send>(
    size: u64,
    chunks: impl Fn(usize, i32) -> u64 + Sync,
    then: impl Fn(
        usize,
        &Model,
        &Context,
        &dyn Bootstrap,
        Result<team::BoundTeam<'_>, team::TeamError>,
        &[Vec<Mapped<FabricShareable>>],
    ) -> R
    + Sync,
) -> Vec<R> {
    const RANKS: usize = 2;
    // Endpoints of more than `MAX_BINDINGS_PER_DEVICE` chunks (the model's
    // H200 allows exactly that many: 512 MiB at 2 MiB).
    let mut config = ModelConfig::node(4 * RANKS);
    config.driver_version = 13050;
    for d in &mut config.devices {
        d.max_size = 2 * AT_LIMIT * BYTES;
    }
    let (ctx0, model) = Context::model(config);
    let p1 = model.spawn_process();
    let ranks = [(ctx0, model.clone()), (Context::new(p1.clone()), p1)];
    portable(&ranks);
    let out = on_every_rank(&ranks, Threads::new(RANKS), |r, ctx, me, boot| {
        let devs: Vec<i32> = (0..4).map(|d| 4 * r as i32 + d).collect();
        let spec = TeamSpec::new(devs.clone(), size).timeout(T);
        let team = team::multicast(ctx, boot, &spec).unwrap();
        let mem: Vec<Vec<_>> = devs
            .iter()
            .map(|&d| {
                (0..chunks(r, d))
                    .map(|_| common::mapped::<FabricShareable>(ctx, d, BYTES))
                    .collect()
            })
            .collect();
        let mut bindings = Vec::new();
        for (&d, mine) in devs.iter().zip(&mem) {
            for (i, m) in mine.iter().enumerate() {
                bindings.push(team.endpoint().bind(d, i as u64 * BYTES, m).unwrap());
            }
        }
        let bound = team.agree_bound(boot, T);
        let out = then(r, me, ctx, boot, bound, &mem);
        drop(bindings);
        drop(team);
        assert!(ctx.take_teardown_errors().is_empty());
        out
    });
    common::clean(&ranks[0].0, &model);
    out
}

/// Issue 29, item 1: every rank binds `MAX_BINDINGS_PER_DEVICE` chunks on
/// each of its four devices, the largest report a rank may send (1,024
/// memory shares on the portable path, 120 KB: two frames); the
/// agreement passes, and a put that spans two chunks lands in every
/// member's memory, every byte.
#[test]
fn a_bind_report_at_the_limit_of_bindings_per_device_passes_and_every_byte_moves() {
    let size = AT_LIMIT * BYTES;
    // Across the boundary of the last two chunks.
    let at = size - BYTES - (LEN as u64) / 2;
    let got = many_chunks(
        size,
        |_, _| AT_LIMIT,
        |r, me, ctx, boot, bound, mem| {
            let bound = bound.unwrap();
            let stream = Stream::new(ctx, 4 * r as i32).unwrap();
            if r == 0 {
                let put = CopyBatch::new().put_host(pattern(9, LEN), bound.endpoint(), at);
                stream.enqueue(put).unwrap().wait().unwrap();
            }
            boot.barrier(T).unwrap();
            let mut seen = Vec::new();
            for chunks in mem {
                let (a, b) = (&chunks[chunks.len() - 2], &chunks[chunks.len() - 1]);
                let half = LEN / 2;
                let mut bytes = me.read(a.device_ptr() + BYTES - half as u64, half).unwrap();
                bytes.extend(me.read(b.device_ptr(), LEN - half).unwrap());
                seen.push(bytes);
            }
            boot.barrier(T).unwrap(); // every rank stopped copying (R13.7)
            seen
        },
    );
    for (r, seen) in got.iter().enumerate() {
        for bytes in seen {
            assert_eq!(*bytes, pattern(9, LEN), "rank {r}");
        }
    }
}

/// Issue 29, item 1: one binding past `MAX_BINDINGS_PER_DEVICE` on one
/// device of rank 1: rank 1 refuses to send its report, and every rank
/// fails with the same error naming rank 1, the bind step and the limit,
/// with nothing left behind.
#[test]
fn one_binding_past_the_limit_per_device_fails_every_rank_with_one_error_naming_the_sender() {
    let size = (AT_LIMIT + 1) * BYTES;
    let errors = many_chunks(
        size,
        |r, d| if r == 1 && d == 6 { AT_LIMIT + 1 } else { 1 },
        |_, _, _, _, bound, _| bound.map(|_| ()).unwrap_err(),
    );
    for (r, e) in errors.iter().enumerate() {
        assert_eq!((e.rank, e.step), (1, Step::Bind), "rank {r}: {e}");
        assert!(
            matches!(e.cause, Cause::TooLarge { len, limit, .. } if len == AT_LIMIT + 1 && limit == AT_LIMIT),
            "rank {r}: {e}"
        );
        assert!(e.to_string().contains("past the limit of 256"), "{e}");
    }
}

/// Issue 29, item 2: rank 1 sends, as its second chunk's share at a grow,
/// the fabric handle rank `victim` sent for its first chunk. Every rank
/// fails the grow at import with one error naming rank 1 (rank 0 saw it
/// first: its own memory, or rank `victim`'s window); the heap is as it
/// was, and rank 0's put to rank 1 lands in rank 1's memory, not in rank
/// 0's or the victim's.
fn an_echoed_share_is_refused_at_import(victim: usize) {
    let (ranks, model) = node_processes(N);
    portable(&ranks);
    let boots: Vec<_> = Threads::new(N)
        .into_iter()
        .map(|b| forge::EchoShare::new(b, 1, victim))
        .collect();
    let errors = on_every_rank(&ranks, boots, |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = owned_peers::<FabricShareable>(r, ctx, boot);
        peers
            .grow(boot, common::mapped(ctx, dev, BYTES), T)
            .unwrap();
        let first = peers.memory()[0].device_ptr();
        me.write(first, &pattern(r as u8, LEN)).unwrap();
        boot.barrier(T).unwrap();
        let e = peers
            .grow(boot, common::mapped(ctx, dev, BYTES), T)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(r == 1, boot.forged(), "rank {r}");
        assert_eq!(peers.top(), BYTES, "rank {r}: the heap as it was");
        let stream = Stream::new(ctx, dev).unwrap();
        let to_1 = peers.peer(1).map(|ep| {
            let past = CopyBatch::new().put_host(pattern(77, LEN), ep, BYTES);
            assert!(matches!(
                stream.enqueue(past).map(|_| ()),
                Err(Error::CopyNotAgreed { .. })
            ));
            CopyBatch::new().put_host(pattern(200, LEN), ep, 0)
        });
        if let (0, Some(put)) = (r, to_1) {
            stream.enqueue(put).unwrap().wait().unwrap();
        }
        boot.barrier(T).unwrap();
        let want = if r == 1 {
            pattern(200, LEN)
        } else {
            pattern(r as u8, LEN)
        };
        assert_eq!(me.read(first, LEN).unwrap(), want, "rank {r}'s first chunk");
        drop(stream);
        peers.close(boot, T).unwrap(); // every rank stopped copying (R13.7)
        assert!(ctx.take_teardown_errors().is_empty());
        e
    });
    for (r, e) in errors.iter().enumerate() {
        assert_eq!((e.rank, e.step), (1, Step::Import), "rank {r}: {e}");
        assert!(
            matches!(e.cause, Cause::Aliased { seen_by: 0, owner } if owner == victim),
            "rank {r}: {e}"
        );
    }
    common::clean(&ranks[0].0, &model);
}

#[test]
fn a_peer_that_echoes_this_ranks_own_chunk_handle_as_its_share_is_refused_at_import_on_every_rank()
{
    an_echoed_share_is_refused_at_import(0);
}

#[test]
fn a_peer_that_echoes_another_peers_chunk_handle_as_its_share_is_refused_at_import_on_every_rank() {
    an_echoed_share_is_refused_at_import(2);
}

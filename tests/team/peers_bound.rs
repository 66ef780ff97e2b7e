//! What peers bound, as the ranks last agreed, bounds every copy through a
//! bring-up's endpoints (R13.5: a copy outside the bound range is undefined
//! behaviour; F9): a copy made before a new agreement that says a peer bound
//! less (a batch built, a route, a captured graph) is checked again when it
//! goes, a close stops copies through every bound form of the bring-up
//! until the next agreement (R13.7), and copies inside what every peer
//! bound go (found by a hostile review of round 27; each case was a call
//! the model logged as F9 or F8, or bytes written into a peer's unbound
//! memory). Ranks are threads, each its own process of one model node.

use crate::common;

use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, Threads};
use cuda_endpoints::driver::Call;
use cuda_endpoints::model::Model;
use cuda_endpoints::team::{self, PeerSpec, Peers, SharedTeam, TeamSpec};
use cuda_endpoints::{
    Binding, Context, CopyBatch, CopyPath, Error, FabricShareable, Mapped, Stream,
};

use common::{node_processes, on_every_rank};

const BYTES: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

/// The driver's copy calls so far, either path (the node's: every rank's).
fn copy_calls(me: &Model) -> u64 {
    me.calls(Call::MemcpyAsync)
        + me.calls(Call::MemcpyBatchAsync)
        + me.calls(Call::FabricCpyBatchAsync)
}

/// `n` ranks of one node (a 13.5 driver) on copy path `path`.
fn ranks_on(path: CopyPath, n: usize) -> (Vec<(Context, Model)>, Model) {
    let (ranks, model) = node_processes(n);
    for (ctx, _) in &ranks {
        ctx.set_copy_path(path);
    }
    (ranks, model)
}

/// Rank `r`'s unicast peers on its device, a `2 BYTES` endpoint whose two
/// halves it binds (the high half's binding lent to `f`, which may drop
/// it), a stream and a source of `BYTES`; torn down after `f`, keeping no
/// teardown error.
fn with_halves<R>(
    r: usize,
    ctx: &Context,
    boot: &dyn Bootstrap,
    f: impl FnOnce(&Peers, &Stream, &Mapped<FabricShareable>, &mut Option<Binding<'_>>) -> R,
) -> R {
    let dev = r as i32;
    let peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, 2 * BYTES).timeout(T)).unwrap();
    let low = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let high = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let b_low = peers.own().bind(dev, 0, &low).unwrap();
    let mut b_high = Some(peers.own().bind(dev, BYTES, &high).unwrap());
    let stream = Stream::new(ctx, dev).unwrap();
    let src = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let out = f(&peers, &stream, &src, &mut b_high);
    drop(b_high);
    drop(b_low);
    drop((stream, src, low, high, peers));
    assert!(ctx.take_teardown_errors().is_empty());
    out
}

/// Unicast peers: every rank binds [0,B) and [B,2B) of its own 2B
/// endpoint; agreement 1. Rank 0 makes a copy into rank 1's [B+4096, +64)
/// and does not enqueue it yet. Rank 1 unbinds [B,2B) (rank 0 has nothing
/// in flight there); agreement 2 says rank 1 bound only [0,B). Rank 0's
/// copy then goes: refused before the driver (`CopyPeerNotBound`). `mode`
/// picks how the op is made: 0 batch put, 1 put_host, 2 graph captured
/// after agreement 1 and launched after agreement 2, 3 route made after
/// agreement 1, 4 get_host.
fn stale_unicast(mode: u32) {
    stale_unicast_on(mode, CopyPath::Fabric);
}

fn stale_unicast_on(mode: u32, path: CopyPath) {
    let (ranks, model) = ranks_on(path, 2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        with_halves(r, ctx, boot, |peers, stream, src, b_high| {
            let bound1 = peers.agree_bound(boot, T).unwrap();
            let peer = bound1.peer(1 - r).unwrap();
            // Made after agreement 1, used after agreement 2.
            let mut batch = None;
            let mut graph = None;
            let mut route = None;
            if r == 0 {
                match mode {
                    0 => batch = Some(CopyBatch::new().put(src, 0, peer, BYTES + 4096, 64)),
                    1 => batch = Some(CopyBatch::new().put_host(vec![7; 64], peer, BYTES + 4096)),
                    2 => {
                        let mut g = stream
                            .capture(CopyBatch::new().put(src, 0, peer, BYTES + 4096, 64))
                            .unwrap();
                        g.launch().unwrap().wait().unwrap();
                        graph = Some(g);
                    }
                    3 => {
                        let mut rt = stream.route(&src, peer);
                        rt.put(0, BYTES + 4096, 64).unwrap().wait().unwrap();
                        route = Some(rt);
                    }
                    4 => batch = Some(CopyBatch::new().get_host(peer, BYTES + 4096, 64)),
                    _ => unreachable!(),
                }
                stream.synchronize().unwrap();
            }
            boot.barrier(T).unwrap();
            if r == 1 {
                drop(b_high.take()); // rank 1 shrinks what it bound
            }
            let bound2 = peers.agree_bound(boot, T).unwrap();
            if r == 0 {
                let calls = copy_calls(me);
                let res: Result<(), Error> = match mode {
                    2 => graph
                        .as_mut()
                        .unwrap()
                        .launch()
                        .and_then(|f| f.wait().map(|_| ())),
                    3 => route
                        .as_mut()
                        .unwrap()
                        .put(0, BYTES + 4096, 64)
                        .and_then(|f| f.wait().map(|_| ())),
                    _ => stream
                        .enqueue(batch.take().unwrap())
                        .and_then(|f| f.wait().map(|_| ())),
                };
                let _ = stream.synchronize();
                assert!(
                    matches!(&res, Err(Error::CopyPeerNotBound { peer, .. }) if peer.covered == [(0, BYTES)]),
                    "mode {mode} on {path:?}: {res:?}"
                );
                assert_eq!(
                    copy_calls(me),
                    calls,
                    "mode {mode}: nothing reached the driver"
                );
            }
            drop(graph);
            drop(route);
            boot.barrier(T).unwrap();
            bound2.close(boot, T).unwrap();
        });
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn r13_5_f9_a_copy_made_before_an_agreement_that_says_a_peer_bound_less_is_refused_when_it_goes() {
    // A batch's put, `put_host`, a captured graph's launch (F8), a route's
    // put and `get_host`, on the fabric path; a batch on the portable path.
    for mode in 0..5 {
        stale_unicast(mode);
    }
    stale_unicast_on(0, CopyPath::Portable);
}

/// As [`with_halves`], for a multicast team of one device per rank.
fn with_team_halves<R>(
    r: usize,
    ctx: &Context,
    boot: &dyn Bootstrap,
    f: impl FnOnce(&SharedTeam, &Stream, &Mapped<FabricShareable>, &mut Option<Binding<'_>>) -> R,
) -> R {
    let dev = r as i32;
    let team = team::multicast(ctx, boot, &TeamSpec::new([dev], 2 * BYTES).timeout(T)).unwrap();
    let low = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let high = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let b_low = team.endpoint().bind(dev, 0, &low).unwrap();
    let mut b_high = Some(team.endpoint().bind(dev, BYTES, &high).unwrap());
    let stream = Stream::new(ctx, dev).unwrap();
    let src = common::mapped::<FabricShareable>(ctx, dev, BYTES);
    let out = f(&team, &stream, &src, &mut b_high);
    drop(b_high);
    drop(b_low);
    drop((stream, src, low, high, team));
    assert!(ctx.take_teardown_errors().is_empty());
    out
}

/// Multicast on the fabric path: both ranks bind [0,B) and [B,2B) of a 2B
/// team; agreement 1; rank 0 warms the memo with one put, then builds a
/// batch (mode 0: one deferred put; 1: 64 puts through the cursor) into
/// [B, 2B); rank 1 unbinds [B,2B); agreement 2; rank 0 enqueues.
fn stale_multicast(mode: u32) {
    let (ranks, model) = node_processes(2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        with_team_halves(r, ctx, boot, |team, stream, src, b_high| {
            let bound1 = team.agree_bound(boot, T).unwrap();
            let ep = bound1.endpoint();
            let mut batch = None;
            if r == 0 {
                stream
                    .enqueue(CopyBatch::new().put(src, 0, ep, 0, 64))
                    .unwrap()
                    .wait()
                    .unwrap();
                let mut b = CopyBatch::new();
                let n = if mode == 0 { 1 } else { 64 };
                for i in 0..n {
                    b = b.put(src, i * 64, ep, BYTES + i * 64, 64);
                }
                batch = Some(b);
            }
            boot.barrier(T).unwrap();
            if r == 1 {
                drop(b_high.take());
            }
            let bound2 = team.agree_bound(boot, T).unwrap();
            if r == 0 {
                let calls = copy_calls(me);
                let res = stream
                    .enqueue(batch.take().unwrap())
                    .and_then(|f| f.wait().map(|_| ()));
                assert!(
                    matches!(&res, Err(Error::CopyPeerNotBound { op: 0, peer, .. }) if peer.rank == 1 && peer.covered == [(0, BYTES)]),
                    "mode {mode}: {res:?}"
                );
                assert_eq!(
                    copy_calls(me),
                    calls,
                    "mode {mode}: nothing reached the driver"
                );
            }
            boot.barrier(T).unwrap();
            bound2.close(boot, T).unwrap();
        });
    });
    common::clean(&ranks[0].0, &model);
}

/// The one-put lane (a deferred put read against the memo of the batch
/// before) and the cursor of 64 puts, on a multicast team's endpoint.
#[test]
fn r13_5_f9_a_multicast_batch_built_before_an_agreement_that_says_a_member_bound_less_is_refused_at_enqueue()
 {
    stale_multicast(0);
    stale_multicast(1);
}

/// Every rank calls `close` before rank 1 unbinds (the documented order),
/// but rank 0 holds a second `BoundPeers` from an earlier agreement of the
/// same `Peers` (both borrow `&Peers`). `again`: the ranks agree a third
/// time after rank 1's unbind (so rank 0 records that rank 1 bound only
/// [0,B)) before rank 0's copy. `stale`: rank 0's batch was built before
/// the close; else it is built fresh after it.
fn closed_then_copied(stale: bool, again: bool, path: CopyPath) {
    let (ranks, model) = ranks_on(path, 2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        with_halves(r, ctx, boot, |peers, stream, src, b_high| {
            let first = peers.agree_bound(boot, T).unwrap();
            let mut batch = (r == 0 && stale)
                .then(|| CopyBatch::new().put(src, 0, first.peer(1).unwrap(), BYTES + 4096, 64));
            let second = peers.agree_bound(boot, T).unwrap();
            // Every rank closes (R13.7) before rank 1 unbinds.
            second.close(boot, T).unwrap();
            if r == 1 {
                drop(b_high.take());
            }
            let third = if again {
                Some(peers.agree_bound(boot, T).unwrap())
            } else {
                boot.barrier(T).unwrap();
                None
            };
            if r == 0 {
                let calls = copy_calls(me);
                let b = batch.take().unwrap_or_else(|| {
                    CopyBatch::new().put(src, 0, first.peer(1).unwrap(), BYTES + 4096, 64)
                });
                let res = stream.enqueue(b).and_then(|f| f.wait().map(|_| ()));
                // After the close alone nothing is known to be bound; after a
                // new agreement, what it said.
                let known: &[(u64, u64)] = if again { &[(0, BYTES)] } else { &[] };
                assert!(
                    matches!(&res, Err(Error::CopyPeerNotBound { peer, .. }) if peer.covered == known),
                    "stale {stale}, again {again}, {path:?}: {res:?}"
                );
                assert_eq!(copy_calls(me), calls, "nothing reached the driver");
            }
            boot.barrier(T).unwrap();
            if let Some(t) = third {
                t.close(boot, T).unwrap();
            }
        });
    });
    common::clean(&ranks[0].0, &model);
}

/// A close agrees that every rank stopped copying (R13.7): afterwards no
/// copy goes through another `BoundPeers` of the same peers (a second
/// agreement's borrow), built before the close or after it, until the next
/// agreement, whose record then holds, on both paths.
#[test]
fn r13_7_after_a_close_no_copy_goes_through_another_bound_form_until_the_ranks_agree_again() {
    closed_then_copied(true, true, CopyPath::Fabric);
    closed_then_copied(false, true, CopyPath::Fabric);
    closed_then_copied(false, false, CopyPath::Fabric);
    closed_then_copied(true, true, CopyPath::Portable);
    closed_then_copied(false, false, CopyPath::Portable);
}

/// Copies inside what every peer bound go, on `path`: a peer that bound
/// three adjacent chunks out of order (an op across both joins, one over
/// all of it, a get of it, 96 puts through the cursor, a 0-byte put at its
/// end, a route across a join), and an owned heap made after that
/// agreement, grown, shrunk and grown again.
fn unicast_inside_what_peers_bound(path: CopyPath) {
    let (ranks, model) = ranks_on(path, 3);
    let outs = on_every_rank(&ranks, Threads::new(3), |r, ctx, me, boot| {
        let dev = r as i32;
        let peers =
            team::unicast_peers(ctx, boot, &PeerSpec::new(dev, 4 * BYTES).timeout(T)).unwrap();
        let chunks: Vec<_> = (0..3)
            .map(|_| common::mapped::<FabricShareable>(ctx, dev, BYTES))
            .collect();
        // Bound out of order, adjacent: [2B,3B), [0,B), [B,2B).
        let bs = vec![
            peers.own().bind(dev, 2 * BYTES, &chunks[0]).unwrap(),
            peers.own().bind(dev, 0, &chunks[1]).unwrap(),
            peers.own().bind(dev, BYTES, &chunks[2]).unwrap(),
        ];
        let stream = Stream::new(ctx, dev).unwrap();
        let src = common::mapped::<FabricShareable>(ctx, dev, 3 * BYTES);
        let mut errs = Vec::new();
        {
            let bound = peers.agree_bound(boot, T).unwrap();
            for p in (0..3).filter(|&p| p != r) {
                let peer = bound.peer(p).unwrap();
                // Straddling both joins, one op.
                let res =
                    stream.enqueue(CopyBatch::new().put(&src, 0, peer, BYTES - 32, BYTES + 64));
                if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("straddle {e}"));
                }
                // The whole bound range in one op, and a get of it.
                let res = stream.enqueue(CopyBatch::new().put(&src, 0, peer, 0, 3 * BYTES));
                if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("whole {e}"));
                }
                let res = stream.enqueue(CopyBatch::new().get(peer, 0, &src, 0, 3 * BYTES));
                if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("get whole {e}"));
                }
                // Many puts through the cursor, crossing the joins.
                let mut b = CopyBatch::new();
                for i in 0..96u64 {
                    b = b.put(&src, i * 65536, peer, i * 65536, 65536);
                }
                if let Err(e) = stream.enqueue(b).and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("cursor {e}"));
                }
                // A 0-byte put at the end of what it bound, and just past (refused is fine).
                let res = stream.enqueue(CopyBatch::new().put(&src, 0, peer, 3 * BYTES, 0));
                if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("zero at end {e}"));
                }
                // A route across the joins.
                let mut rt = stream.route(&src, peer);
                if let Err(e) = rt.put(0, BYTES - 8, 16).and_then(|f| f.wait().map(|_| ())) {
                    errs.push(format!("route {e}"));
                }
            }
            boot.barrier(T).unwrap();
            bound.close(boot, T).unwrap();
        }
        drop(bs);
        // The owned heap after an agreement: into_owned, grow x2, shrink, grow.
        let mut heap = peers.into_owned::<cuda_endpoints::Mapped<FabricShareable>>();
        for _ in 0..2 {
            heap.grow(boot, common::mapped::<FabricShareable>(ctx, dev, BYTES), T)
                .unwrap();
        }
        heap.shrink(boot, T).unwrap();
        heap.grow(boot, common::mapped::<FabricShareable>(ctx, dev, BYTES), T)
            .unwrap();
        for p in (0..3).filter(|&p| p != r) {
            let peer = heap.peer(p).unwrap();
            let res = stream.enqueue(CopyBatch::new().put(&src, 0, peer, BYTES - 32, 64));
            if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                errs.push(format!("heap {e}"));
            }
        }
        boot.barrier(T).unwrap();
        heap.close(boot, T).unwrap();
        drop((stream, src, chunks));
        let _ = me;
        errs
    });
    assert!(outs.iter().all(Vec::is_empty), "{path:?}: {outs:?}");
    common::clean(&ranks[0].0, &model);
}

#[test]
fn r13_5_copies_inside_what_every_peer_bound_go_on_both_paths() {
    unicast_inside_what_peers_bound(CopyPath::Fabric);
    unicast_inside_what_peers_bound(CopyPath::Portable);
    multicast_inside_what_members_bound(CopyPath::Fabric);
}

/// Multicast: rank 0 enrolls device 0, rank 1 devices 1 and 2; each device
/// binds a different but overlapping range of a 4B team: puts inside what
/// every member bound go, one across either edge is refused.
fn multicast_inside_what_members_bound(path: CopyPath) {
    let (all, model) = ranks_on(path, 3);
    // Rank 0 and rank 1 (three devices); the third process joins nothing.
    let ranks = &all[..2];
    let outs = on_every_rank(ranks, Threads::new(2), |r, ctx, me, boot| {
        let devs: Vec<i32> = if r == 0 { vec![0] } else { vec![1, 2] };
        let team = team::multicast(
            ctx,
            boot,
            &TeamSpec::new(devs.clone(), 4 * BYTES).timeout(T),
        )
        .unwrap();
        // dev0: [0,3B); dev1: [B,3B) as two chunks; dev2: [0,2B) ∪ [2B, 4B).
        let plan: Vec<(i32, u64)> = if r == 0 {
            vec![(0, 0), (0, BYTES), (0, 2 * BYTES)]
        } else {
            vec![
                (1, BYTES),
                (1, 2 * BYTES),
                (2, 0),
                (2, BYTES),
                (2, 2 * BYTES),
                (2, 3 * BYTES),
            ]
        };
        let mems: Vec<_> = plan
            .iter()
            .map(|&(d, _)| common::mapped::<FabricShareable>(ctx, d, BYTES))
            .collect();
        let bs: Vec<_> = plan
            .iter()
            .zip(&mems)
            .map(|(&(d, o), m)| team.endpoint().bind(d, o, m).unwrap())
            .collect();
        let stream = Stream::new(ctx, devs[0]).unwrap();
        let src = common::mapped::<FabricShareable>(ctx, devs[0], 2 * BYTES);
        let bound = team.agree_bound(boot, T).unwrap();
        let mut errs = Vec::new();
        // Every member bound [B, 3B).
        for (o, s) in [
            (BYTES, 2 * BYTES),
            (2 * BYTES - 32, 64),
            (BYTES, 64),
            (3 * BYTES - 64, 64),
        ] {
            let res = stream.enqueue(CopyBatch::new().put(&src, 0, bound.endpoint(), o, s));
            if let Err(e) = res.and_then(|f| f.wait().map(|_| ())) {
                errs.push(format!("{o}+{s}: {e}"));
            }
        }
        // And one across each edge, refused.
        for (o, s) in [(BYTES - 64, 128), (3 * BYTES - 64, 128)] {
            if stream
                .enqueue(CopyBatch::new().put(&src, 0, bound.endpoint(), o, s))
                .is_ok()
            {
                errs.push(format!("{o}+{s}: not refused"));
            }
        }
        boot.barrier(T).unwrap();
        bound.close(boot, T).unwrap();
        drop(bs);
        drop((stream, src, mems, team));
        let _ = me;
        errs
    });
    assert!(outs.iter().all(Vec::is_empty), "{path:?}: {outs:?}");
    common::clean(&all[0].0, &model);
}

/// On every rank one thread copies through the first `BoundPeers` (batches
/// and a route) while the rank's main thread agrees again 300 times
/// (nothing changes what anyone bound): no deadlock, no refusal, no
/// violation.
#[test]
fn r13_5_copies_through_one_agreement_while_the_ranks_agree_again_are_never_refused() {
    let (ranks, model) = node_processes(2);
    let outs = on_every_rank(&ranks, Threads::new(2), |r, ctx, _me, boot| {
        let dev = r as i32;
        let peers =
            team::unicast_peers(ctx, boot, &PeerSpec::new(dev, 2 * BYTES).timeout(T)).unwrap();
        let mem = common::mapped::<FabricShareable>(ctx, dev, 2 * BYTES);
        let b = peers.own().bind(dev, 0, &mem).unwrap();
        let bound1 = peers.agree_bound(boot, T).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let errs = std::thread::scope(|s| {
            let copier = s.spawn(|| {
                let stream = Stream::new(ctx, dev).unwrap();
                let src = common::mapped::<FabricShareable>(ctx, dev, BYTES);
                let peer = bound1.peer(1 - r).unwrap();
                let mut errs = Vec::new();
                let mut route = stream.route(&src, peer);
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 300 {
                    n += 1;
                    let o = (n % 64) * 4096;
                    let built =
                        CopyBatch::new()
                            .put(&src, 0, peer, o, 64)
                            .put(&src, 64, peer, o + 64, 64);
                    std::thread::yield_now();
                    if let Err(e) = stream.enqueue(built).and_then(|f| f.wait().map(|_| ())) {
                        errs.push(format!("batch {e}"));
                    }
                    if let Err(e) = route.put(0, o + 128, 64).and_then(|f| f.wait().map(|_| ())) {
                        errs.push(format!("route {e}"));
                    }
                }
                (n, errs)
            });
            for _ in 0..300 {
                peers.agree_bound(boot, T).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            copier.join().unwrap()
        });
        boot.barrier(T).unwrap();
        bound1.close(boot, T).unwrap();
        drop(b);
        drop((mem, peers));
        errs
    });
    assert!(outs.iter().all(|(_, e)| e.is_empty()), "{outs:?}");
    common::clean(&ranks[0].0, &model);
}

/// A 0-byte op (F5: a no-op, its operands validated) past what a peer
/// bound but inside the endpoint goes, as into a gap of what this process
/// bound (a device that bound something).
#[test]
fn f5_a_zero_byte_op_past_what_a_peer_bound_goes_as_past_what_this_process_bound() {
    let (ranks, model) = node_processes(2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, _me, boot| {
        let dev = r as i32;
        let peers =
            team::unicast_peers(ctx, boot, &PeerSpec::new(dev, 2 * BYTES).timeout(T)).unwrap();
        let mem = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        let b = peers.own().bind(dev, 0, &mem).unwrap();
        let bound = peers.agree_bound(boot, T).unwrap();
        let stream = Stream::new(ctx, dev).unwrap();
        let src = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        let own = stream
            .enqueue(CopyBatch::new().put(&src, 0, bound.own(), BYTES + BYTES / 2, 0))
            .map(|f| {
                let _ = f.wait();
            });
        let peer = stream
            .enqueue(CopyBatch::new().put(
                &src,
                0,
                bound.peer(1 - r).unwrap(),
                BYTES + BYTES / 2,
                0,
            ))
            .map(|f| {
                let _ = f.wait();
            });
        boot.barrier(T).unwrap();
        bound.close(boot, T).unwrap();
        drop(b);
        drop((stream, src, mem, peers));
        assert!(own.is_ok() && peer.is_ok(), "own: {own:?}; peer: {peer:?}");
    });
    common::clean(&ranks[0].0, &model);
}

/// Multicast: every rank closes its second `BoundTeam`, rank 1 unbinds
/// its high half, and rank 0's put through the first `BoundTeam` (never
/// closed) is refused before the driver (R13.7).
#[test]
fn r13_7_after_a_close_no_multicast_put_goes_through_another_bound_team() {
    let (ranks, model) = node_processes(2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        with_team_halves(r, ctx, boot, |team, stream, src, b_high| {
            let first = team.agree_bound(boot, T).unwrap();
            let second = team.agree_bound(boot, T).unwrap();
            second.close(boot, T).unwrap();
            if r == 1 {
                drop(b_high.take());
            }
            boot.barrier(T).unwrap();
            if r == 0 {
                let calls = copy_calls(me);
                let res = stream
                    .enqueue(CopyBatch::new().put(src, 0, first.endpoint(), BYTES + 4096, 64))
                    .and_then(|f| f.wait().map(|_| ()));
                assert!(
                    matches!(&res, Err(Error::CopyPeerNotBound { peer, .. }) if peer.covered.is_empty()),
                    "{res:?}"
                );
                assert_eq!(copy_calls(me), calls, "nothing reached the driver");
            }
            boot.barrier(T).unwrap();
        });
    });
    common::clean(&ranks[0].0, &model);
}

/// What a peer bound, as the agreement said: its one binding of `BYTES`.
fn bound_by(r: usize) -> cuda_endpoints::error::PeerBound {
    cuda_endpoints::error::PeerBound {
        rank: r as u32,
        device: (r as i32).into(),
        covered: vec![(0, BYTES)],
    }
}

/// Each rank binds `BYTES` of a `2 BYTES` unicast endpoint and agrees;
/// a put (by a batch, by a route, from host bytes) and a get past what the peer bound
/// are refused before the driver, naming the peer and what it bound
/// (R13.5: a copy outside the bound range is undefined behaviour), on
/// `path`; inside, they move every byte.
fn copy_past_what_a_peer_bound(path: CopyPath) {
    let (ranks, model) = ranks_on(path, 2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let spec = PeerSpec::new(dev, 2 * BYTES).timeout(T);
        let peers = team::unicast_peers(ctx, boot, &spec).unwrap();
        let mem = common::mapped::<FabricShareable>(ctx, dev, BYTES);
        let binding = peers.own().bind(dev, 0, &mem).unwrap();
        let bound = peers.agree_bound(boot, T).unwrap();
        let (stream, src) = (
            Stream::new(ctx, dev).unwrap(),
            common::mapped::<FabricShareable>(ctx, dev, BYTES),
        );
        let peer = bound.peer(1 - r).unwrap();
        let calls = copy_calls(me);
        let by_batch = stream
            .enqueue(CopyBatch::new().put(&src, 0, peer, BYTES + 4096, 64))
            .map(|_| ())
            .unwrap_err();
        let by_route = stream
            .route(&src, peer)
            .put(0, BYTES + 4096, 64)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(by_route, by_batch);
        let by_get = stream
            .enqueue(CopyBatch::new().get_host(peer, BYTES - 32, 64))
            .map(|_| ())
            .unwrap_err();
        let by_put_host = stream
            .enqueue(CopyBatch::new().put_host(vec![1; 64], peer, BYTES + 4096))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&by_put_host, Error::CopyPeerNotBound { peer: p, .. } if **p == bound_by(1 - r)),
            "{by_put_host:?}"
        );
        let Error::CopyPeerNotBound { op: 0, peer: p, .. } = &by_batch else {
            panic!("{by_batch:?}");
        };
        assert_eq!(**p, bound_by(1 - r));
        assert!(
            matches!(&by_get, Error::CopyPeerNotBound { offset, size: 64, peer: p, .. } if *offset == BYTES - 32 && **p == bound_by(1 - r)),
            "{by_get:?}"
        );
        let msg = by_batch.to_string();
        assert!(
            msg.contains(&format!(
                "are outside what rank {} bound on its device {} when the ranks last agreed (F9, R13.5",
                1 - r,
                1 - r
            )) && msg.contains(&format!("it bound bytes 0..{BYTES} there: copy inside those bytes")),
            "{msg}"
        );
        assert_eq!(copy_calls(me), calls, "nothing reached the driver");
        // (The count is the node's: the other rank's refusals are done.)
        boot.barrier(T).unwrap();
        // Inside what the peer bound, the same put goes.
        stream
            .enqueue(CopyBatch::new().put(&src, 0, peer, BYTES - 64, 64))
            .unwrap()
            .wait()
            .unwrap();
        boot.barrier(T).unwrap();
        drop(stream);
        bound.close(boot, T).unwrap();
        drop(binding);
        drop((src, mem, peers));
        assert!(ctx.take_teardown_errors().is_empty());
    });
    common::clean(&ranks[0].0, &model);
}

#[test]
fn r13_5_f9_a_copy_past_what_a_peer_bound_is_refused_naming_the_peer_on_the_portable_path() {
    copy_past_what_a_peer_bound(CopyPath::Portable);
}

/// Found by a new user's run in round 27: on the fabric path (13.5) such a
/// put reached the driver (the model logged F9).
#[test]
fn r13_5_f9_a_copy_past_what_a_peer_bound_is_refused_before_the_driver_on_the_fabric_path() {
    copy_past_what_a_peer_bound(CopyPath::Fabric);
}

/// A multicast put writes every member's memory (F1): on the fabric path a
/// put into bytes one member did not bind is refused before the driver,
/// naming that rank, on every other rank; after that rank binds them and
/// the ranks agree again, the same put goes (R13.5).
#[test]
fn r13_5_f9_a_multicast_put_past_what_one_member_bound_is_refused_until_it_binds_and_all_agree_again()
 {
    let (ranks, model) = node_processes(2);
    on_every_rank(&ranks, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let team = team::multicast(ctx, boot, &TeamSpec::new([dev], 2 * BYTES).timeout(T)).unwrap();
        let (low, high) = (
            common::mapped::<FabricShareable>(ctx, dev, BYTES),
            common::mapped::<FabricShareable>(ctx, dev, BYTES),
        );
        // Rank 1 binds only the low half at first.
        let mut bindings = vec![team.endpoint().bind(dev, 0, &low).unwrap()];
        if r == 0 {
            bindings.push(team.endpoint().bind(dev, BYTES, &high).unwrap());
        }
        let (stream, src) = (
            Stream::new(ctx, dev).unwrap(),
            common::mapped::<FabricShareable>(ctx, dev, BYTES),
        );
        {
            let bound = team.agree_bound(boot, T).unwrap();
            if r == 0 {
                let calls = copy_calls(me);
                let e = stream
                    .enqueue(CopyBatch::new().put(&src, 0, bound.endpoint(), BYTES + 64, 64))
                    .map(|_| ())
                    .unwrap_err();
                assert!(
                    matches!(&e, Error::CopyPeerNotBound { peer, .. } if **peer == bound_by(1)),
                    "{e:?}"
                );
                assert_eq!(copy_calls(me), calls, "nothing reached the driver");
            }
            boot.barrier(T).unwrap();
            bound.close(boot, T).unwrap();
        }
        if r == 1 {
            bindings.push(team.endpoint().bind(dev, BYTES, &high).unwrap());
        }
        let bound = team.agree_bound(boot, T).unwrap();
        if r == 0 {
            stream
                .enqueue(CopyBatch::new().put(&src, 0, bound.endpoint(), BYTES + 64, 64))
                .unwrap()
                .wait()
                .unwrap();
        }
        boot.barrier(T).unwrap();
        bound.close(boot, T).unwrap();
        drop(stream);
        drop(bindings);
        drop((src, low, high, team));
        assert!(ctx.take_teardown_errors().is_empty());
    });
    common::clean(&ranks[0].0, &model);
}

//! The communicator production users build (issue 20): owned unicast peers
//! (`Peers::into_owned`, `OwnedPeers`, `DynPeers`) next to a multicast team
//! in a struct kept in a `HashMap`, closed by agreement with zero leaks;
//! teardown every rank agrees on (R13.7: a close waits until every rank
//! completed its copies; a drop without it keeps what peers may write);
//! the symmetric heap that grows and shrinks by agreement (R13.5, R13.7),
//! proved with the data path; the peer-to-id table agreed (R13.4); export
//! without readiness (R13.1); concurrent bring-ups over one shared
//! bootstrap per rank (`team::Tagged`), each tagged. Ranks are threads, each its own process of one
//! model on a 13.5 driver (the fabric copy exists).

use crate::common;
use crate::forge;
use crate::watchdog;

use std::collections::HashMap;
use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, BootstrapError, Tcp, ThreadRank, Threads};
use cuda_endpoints::model::Model;
use cuda_endpoints::team::{
    self, Cause, Mismatch, OwnedPeers, OwnedTeam, PeerSpec, Step, Tagged, TeamError, TeamSpec,
};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, Error, Mapped, PosixFd, Stream, driver::Call,
};
use forge::ForgeIdTable;

const CHUNK: u64 = 2 << 20;
const MAX: u64 = 4 * CHUNK;
const T: Duration = Duration::from_secs(10);

use common::node_processes as processes;
use common::on_every_rank;

fn chunk(ctx: &Context, dev: i32) -> Mapped<PosixFd> {
    Allocation::<PosixFd>::on_device(ctx, dev, CHUNK)
        .unwrap()
        .map(&[dev])
        .unwrap()
}

/// Owned peers of this rank's device, grown by two chunks on every rank.
fn two_chunk_heap(ctx: &Context, boot: &ThreadRank, dev: i32) -> OwnedPeers<Mapped<PosixFd>> {
    let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
        .unwrap()
        .into_owned::<Mapped<PosixFd>>();
    peers.grow(boot, chunk(ctx, dev), T).unwrap();
    peers.grow(boot, chunk(ctx, dev), T).unwrap();
    peers
}

/// Rank 0's unbinds fail as `fault` says (`None`: not at all), set while
/// every rank waits.
fn unbinds_on_rank_0(
    r: usize,
    me: &Model,
    boot: &ThreadRank,
    fault: Option<cuda_endpoints::model::faults::Fault>,
) {
    use cuda_endpoints::model::faults::FaultPlan;
    boot.barrier(T).unwrap();
    if r == 0 {
        let plan = FaultPlan::none();
        me.set_faults(match fault {
            Some(f) => plan.with(f.on_process(me.pid())),
            None => plan,
        });
    }
    boot.barrier(T).unwrap();
}

/// A shrink whose first unbind fails on rank 0: rank 0 reports it at the
/// shrink step, rank 1 shrank; the heap is one chunk lower on both.
fn shrink_with_rank_0_unbind_failing(
    r: usize,
    me: &Model,
    boot: &ThreadRank,
    peers: &mut OwnedPeers<Mapped<PosixFd>>,
) {
    use cuda_endpoints::driver::Code;
    use cuda_endpoints::model::faults::Fault;
    unbinds_on_rank_0(
        r,
        me,
        boot,
        Some(Fault::nth(Call::Unbind, 1, Code::UNKNOWN)),
    );
    let shrunk = peers.shrink(boot, T);
    match (r, &shrunk) {
        (0, Err(e)) => assert_eq!(e.step, Step::Shrink, "{e}"),
        (1, Ok(Some(_))) => {}
        _ => panic!("rank {r}: {shrunk:?}"),
    }
}

/// A communicator as a user keeps it: no lifetime anywhere.
struct Comm {
    team: OwnedTeam<Mapped<PosixFd>>,
    peers: OwnedPeers<Mapped<PosixFd>>,
}

impl Comm {
    fn new(
        ctx: &Context,
        boot: &dyn Bootstrap,
        dev: i32,
    ) -> Result<Comm, Box<dyn std::error::Error>> {
        Comm::tagged(ctx, boot, dev, 0)
    }

    /// A communicator whose bring-ups carry `tag` (its channel's, when it
    /// shares a bootstrap with others).
    fn tagged(
        ctx: &Context,
        boot: &dyn Bootstrap,
        dev: i32,
        tag: u64,
    ) -> Result<Comm, Box<dyn std::error::Error>> {
        let spec = TeamSpec::new([dev], CHUNK).timeout(T).tag(tag);
        let t = team::multicast(ctx, boot, &spec)?;
        let team = t.into_bound([(dev.into(), 0, chunk(ctx, dev))], boot, T)?;
        let spec = PeerSpec::new(dev, MAX).timeout(T).tag(tag);
        let mut peers = team::unicast_peers(ctx, boot, &spec)?.into_owned();
        peers.grow(boot, chunk(ctx, dev), T)?; // the every-rank-bound agreement
        Ok(Comm { team, peers })
    }

    /// Tears both down once every rank completed its copies (R13.7): on
    /// every rank, communicators in the same order.
    fn close(self, boot: &dyn Bootstrap) {
        self.team.close(boot, T).unwrap();
        self.peers.close(boot, T).unwrap();
    }
}

#[test]
fn communicators_in_a_hashmap_move_data_and_close_with_zero_leaks() {
    let (contexts, model) = processes(3);
    on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        let dev = r as i32;
        let mut comms: HashMap<&str, Comm> = HashMap::new();
        for name in ["a", "b", "c"] {
            comms.insert(name, Comm::new(ctx, boot, dev).unwrap());
        }
        let stream = Stream::new(ctx, dev).unwrap();
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            let c = &comms[name];
            let mark = (r * 16 + i + 1) as u8;
            stream
                .enqueue(CopyBatch::new().put_host(vec![mark; 512], c.peers.own(), 0))
                .unwrap()
                .wait()
                .unwrap();
        }
        boot.barrier(T).unwrap();
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            let c = &comms[name];
            for p in (0..c.peers.ranks()).filter(|&p| p != r) {
                let got = stream
                    .enqueue(CopyBatch::new().get_host(c.peers.peer(p).unwrap(), 0, 512))
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(
                    got.received,
                    [vec![(p * 16 + i + 1) as u8; 512]],
                    "{name}: rank {r} from {p}"
                );
            }
            assert_eq!(c.team.devices(), [dev.into()]);
        }
        drop(stream);
        // Every rank closes its communicators (a close is collective: the
        // same order on every rank, R13.7); one goes through the erased
        // form, field by field.
        for name in ["c", "a", "b"] {
            let Comm { team, peers } = comms.remove(name).unwrap();
            if r == 1 {
                let erased = peers.into_dyn();
                assert!(erased.is::<Mapped<PosixFd>>());
                team.close(boot, T).unwrap();
                erased.close(boot, T).unwrap();
            } else {
                peers.close(boot, T).unwrap();
                team.close(boot, T).unwrap();
            }
        }
        let teardown = ctx.take_teardown_errors();
        assert!(teardown.is_empty(), "rank {r}: {teardown:?}");
    });
    let live = model.live_node();
    assert!(live.is_empty(), "leak: {live:?}");
    common::no_violations(&model.violations());
}

/// Where the last put reached the driver and where the first unbind did,
/// in the node's trace: every unbind must come after every put (R13.7).
fn last_put_and_first_unbind(model: &Model) -> (usize, usize) {
    let trace = model.trace();
    let put = trace.iter().rposition(|c| *c == Call::FabricCpyBatchAsync);
    (put.expect("a put"), first(&trace, Call::Unbind))
}

/// R13.7 at the owned peers' teardown: rank 0 closes first, and rank 1
/// puts into rank 0's heap only after rank 0 entered its close (a put left
/// in flight, its token forgotten). Rank 0's close waits in the agreement
/// until rank 1 completed that put and joined: no unbind reaches the driver
/// before the put, and the model logs no rule broken (before the close, a
/// drop on rank 0 here freed the memory under rank 1's put: F4 and R13.3
/// in the log, `ILLEGAL_ADDRESS`).
#[test]
fn r13_7_a_rank_closing_its_owned_peers_waits_until_every_rank_completed_its_copies() {
    let _hang = watchdog::guard("the close of owned peers");
    let (contexts, model) = processes(2);
    let entered = std::sync::Barrier::new(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, _, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        peers.grow(boot, chunk(ctx, dev), T).unwrap();
        let stream = Stream::new(ctx, dev).unwrap();
        entered.wait();
        if r == 1 {
            let copy = stream
                .enqueue(CopyBatch::new().put_host(vec![7; 4096], peers.peer(0).unwrap(), 0))
                .unwrap();
            std::mem::forget(copy); // in flight: the close completes it
        }
        peers.close(boot, T).unwrap();
        drop(stream);
        assert!(ctx.take_teardown_errors().is_empty(), "rank {r}");
    });
    let (put, unbind) = last_put_and_first_unbind(&model);
    assert!(
        put < unbind,
        "an unbind before the put: {:?}",
        model.trace()
    );
    common::no_violations(&model.violations());
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
}

/// R13.7 at an owned team's teardown: the same as for owned peers, with a
/// multicast put (it writes every member's memory, rank 0's too). One
/// member's teardown alone is not offered: `OwnedTeam` has no `unbind_all`
/// (the ui-test `team_unbind_all_of_one_member_alone`), and its close
/// waits for every member.
#[test]
fn r13_7_a_rank_closing_its_owned_team_waits_until_every_member_completed_its_puts() {
    let _hang = watchdog::guard("the close of an owned team");
    let (contexts, model) = processes(2);
    let entered = std::sync::Barrier::new(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, _, boot| {
        let dev = r as i32;
        let t = team::multicast(ctx, boot, &TeamSpec::new([dev], CHUNK).timeout(T)).unwrap();
        let owned = t
            .into_bound([(dev.into(), 0, chunk(ctx, dev))], boot, T)
            .unwrap();
        let stream = Stream::new(ctx, dev).unwrap();
        entered.wait();
        if r == 1 {
            let copy = stream
                .enqueue(CopyBatch::new().put_host(vec![7; 4096], owned.endpoint(), 0))
                .unwrap();
            std::mem::forget(copy); // in flight: the close completes it
        }
        owned.close(boot, T).unwrap();
        drop(stream);
        assert!(ctx.take_teardown_errors().is_empty(), "rank {r}");
    });
    let (put, unbind) = last_put_and_first_unbind(&model);
    assert!(
        put < unbind,
        "an unbind before the put: {:?}",
        model.trace()
    );
    common::no_violations(&model.violations());
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
}

/// R13.7 when a rank drops its communicator without the close: rank 0
/// drops its owned team and owned peers, then rank 1 puts into both. The
/// drop freed nothing rank 1 may write: both puts land in rank 0's memory,
/// still bound and allocated, and no rule is broken. Rank 0's context
/// keeps `CloseNotAgreed` for each; the memory goes when the process exits
/// (R12.2), and nothing is left after that.
#[test]
fn r13_7_a_drop_without_close_keeps_what_peers_may_write() {
    let (contexts, model) = processes(2);
    let dropped = std::sync::Barrier::new(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let comm = Comm::new(ctx, boot, dev).unwrap();
        let team_mem = comm.team.memory()[0].device_ptr();
        let heap_mem = comm.peers.memory()[0].device_ptr();
        if r == 0 {
            drop(comm);
            dropped.wait();
            dropped.wait(); // rank 1 put
            assert_eq!(me.read(team_mem + 8192, 64).unwrap(), vec![0x5a; 64]);
            assert_eq!(me.read(heap_mem + 8192, 64).unwrap(), vec![0xa5; 64]);
            let kept = ctx.take_teardown_errors();
            let what: Vec<_> = kept
                .iter()
                .map(|e| match e {
                    Error::CloseNotAgreed { what, ranks: 2 } => *what,
                    other => panic!("rank 0: {other}"),
                })
                .collect();
            assert_eq!(what, ["an OwnedTeam", "an OwnedPeers"]);
            assert!(
                kept[0].to_string().contains("close(&boot, timeout)"),
                "{}",
                kept[0]
            );
        } else {
            dropped.wait();
            let stream = Stream::new(ctx, dev).unwrap();
            let team_put = CopyBatch::new().put_host(vec![0x5a; 64], comm.team.endpoint(), 8192);
            stream.enqueue(team_put).unwrap().wait().unwrap();
            let heap_put =
                CopyBatch::new().put_host(vec![0xa5; 64], comm.peers.peer(0).unwrap(), 8192);
            stream.enqueue(heap_put).unwrap().wait().unwrap();
            drop(stream);
            dropped.wait();
            drop(comm); // rank 0 is gone: no close can be agreed
            assert_eq!(ctx.take_teardown_errors().len(), 2);
        }
        common::no_violations(&me.violations());
        me.exit(); // the driver reclaims what was kept (R12.2)
    });
    common::no_violations(&model.violations());
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
}

/// R13.7 when a rank never joins the close: ranks 0 and 1 close, rank 2
/// keeps its peers and stays silent. Both closing ranks get the same
/// error within the close's bound (rank 2, `Step::Close`, the bootstrap's
/// timeout) and keep their memory, since rank 2 may still write there.
#[test]
fn r13_7_a_rank_that_never_joins_the_close_fails_every_closing_rank_alike() {
    let _hang = watchdog::guard("a close that a rank never joins");
    let (contexts, model) = processes(3);
    let closed = std::sync::Barrier::new(3);
    let errors = on_every_rank(&contexts, Threads::new(3), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        peers.grow(boot, chunk(ctx, dev), T).unwrap();
        let outcome = if r == 2 {
            closed.wait(); // silent until the others gave up
            drop(peers);
            None
        } else {
            let e = peers.close(boot, Duration::from_secs(1)).unwrap_err();
            closed.wait();
            Some(e)
        };
        let kept = ctx.take_teardown_errors();
        assert!(
            matches!(
                kept[..],
                [Error::CloseNotAgreed {
                    what: "an OwnedPeers",
                    ranks: 3
                }]
            ),
            "rank {r}: {kept:?}"
        );
        me.exit(); // the driver reclaims what was kept (R12.2)
        outcome
    });
    for (r, e) in errors.iter().take(2).enumerate() {
        let e = e.as_ref().expect("an error");
        assert_eq!((e.rank, e.step), (2, Step::Close), "rank {r}: {e}");
        assert!(e.is_timeout(), "rank {r}: {e}");
    }
    common::no_violations(&model.violations());
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
}

#[test]
fn r13_5_a_grown_heap_moves_the_new_chunks_bytes_without_reimport_and_shrinks_by_agreement() {
    let (contexts, model) = processes(3);
    on_every_rank(&contexts, Threads::new(3), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        let ids: Vec<_> = (0..3).map(|p| peers.id_of(p)).collect();
        assert_eq!(peers.grow(boot, chunk(ctx, dev), T).unwrap(), 0);
        let imports = me.calls(Call::Import);
        assert_eq!(peers.grow(boot, chunk(ctx, dev), T).unwrap(), CHUNK);
        assert_eq!((peers.top(), peers.max()), (2 * CHUNK, MAX));
        let stream = Stream::new(ctx, dev).unwrap();
        // Each owner writes into its new chunk; every peer gets it at the new
        // offset through the endpoint it imported at the bring-up.
        stream
            .enqueue(CopyBatch::new().put_host(
                vec![0x40 + r as u8; 4096],
                peers.own(),
                CHUNK + 8192,
            ))
            .unwrap()
            .wait()
            .unwrap();
        boot.barrier(T).unwrap();
        for p in (0..3).filter(|&p| p != r) {
            let got = stream
                .enqueue(CopyBatch::new().get_host(peers.peer(p).unwrap(), CHUNK + 8192, 4096))
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(
                got.received,
                [vec![0x40 + p as u8; 4096]],
                "rank {r} from {p}"
            );
        }
        // The new chunk's bytes are in the new chunk's memory.
        let second = &peers.memory()[1];
        assert_eq!(
            me.read(second.device_ptr() + 8192, 4096).unwrap(),
            vec![0x40 + r as u8; 4096]
        );
        assert_eq!(me.calls(Call::Import), imports, "no re-import");
        assert_eq!((0..3).map(|p| peers.id_of(p)).collect::<Vec<_>>(), ids);
        drop(stream);
        boot.barrier(T).unwrap();
        // Shrink: agreed, then the top chunk comes back unbound.
        let top = peers.shrink(boot, T).unwrap().expect("a chunk");
        assert_eq!(peers.top(), CHUNK);
        drop(top); // unbound: freeing it is fine
        assert!(peers.shrink(boot, T).unwrap().is_some());
        assert!(peers.shrink(boot, T).unwrap().is_none(), "empty heap");
        peers.close(boot, T).unwrap();
        let teardown = ctx.take_teardown_errors();
        assert!(teardown.is_empty(), "rank {r}: {teardown:?}");
    });
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

#[test]
fn r13_3_a_copy_through_owned_peers_past_the_agreed_top_is_refused_before_the_driver() {
    let (contexts, model) = processes(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        let stream = Stream::new(ctx, dev).unwrap();
        let peer = 1 - r;
        // An empty heap: no rank agreed it bound anything, so neither a get
        // from a peer nor a put into this rank's own endpoint reaches the
        // driver.
        let before_grow = stream
            .enqueue(CopyBatch::new().get_host(peers.peer(peer).unwrap(), 0, 64))
            .unwrap_err();
        assert!(
            matches!(
                before_grow,
                Error::CopyNotAgreed {
                    op: 0,
                    offset: 0,
                    size: 64,
                    agreed: 0,
                    ..
                }
            ),
            "rank {r}: {before_grow:?}"
        );
        assert!(
            before_grow.to_string().contains("OwnedPeers::grow"),
            "{before_grow}"
        );
        peers.grow(boot, chunk(ctx, dev), T).unwrap();
        // The count is the node's: read by every rank before any copies,
        // checked once every rank copied (barriers on both sides).
        let copies = me.calls(Call::FabricCpyBatchAsync);
        boot.barrier(T).unwrap();
        // Below the top: through. Past it (the endpoint is MAX bytes, the
        // heap one chunk): refused, naming the top.
        let got = stream
            .enqueue(CopyBatch::new().get_host(peers.peer(peer).unwrap(), CHUNK - 64, 64))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got.received, [vec![0u8; 64]]);
        let past = stream
            .enqueue(CopyBatch::new().get_host(peers.peer(peer).unwrap(), CHUNK - 32, 64))
            .unwrap_err();
        assert!(
            matches!(past, Error::CopyNotAgreed { offset, agreed: CHUNK, .. } if offset == CHUNK - 32),
            "rank {r}: {past:?}"
        );
        // The same through a route into the peer's imported endpoint (its
        // facts read once, the top among them): below the top through,
        // past it refused the same. (Zeros: the bytes the peer reads.)
        let src = chunk(ctx, dev);
        let mut route = stream.route(&src, peers.peer(peer).unwrap());
        route.put(0, CHUNK - 64, 64).unwrap().wait().unwrap();
        let past_routed = route.put(0, CHUNK - 32, 64).map(drop).unwrap_err();
        assert_eq!(format!("{past_routed:?}"), format!("{past:?}"), "rank {r}");
        drop(route);
        boot.barrier(T).unwrap();
        assert_eq!(
            me.calls(Call::FabricCpyBatchAsync),
            copies + 4,
            "two copies per rank reached the driver"
        );
        boot.barrier(T).unwrap();
        // After an agreed shrink the top is 0 again.
        drop(peers.shrink(boot, T).unwrap());
        let after_shrink = stream
            .enqueue(CopyBatch::new().get_host(peers.peer(peer).unwrap(), 0, 64))
            .unwrap_err();
        assert!(
            matches!(after_shrink, Error::CopyNotAgreed { agreed: 0, .. }),
            "rank {r}: {after_shrink:?}"
        );
        drop(stream);
        drop(src);
        peers.close(boot, T).unwrap();
        assert!(ctx.take_teardown_errors().is_empty());
    });
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

/// R13.3 across batches: a batch's endpoint facts (a heap's agreed top
/// among them) are kept for the next batch on the same endpoint, and a
/// shrink moves the top even when its unbind failed and the chunk stays
/// bound (only the top changed): the batch after it is refused past the
/// new top, before the driver.
#[test]
fn r13_3_a_shrink_whose_unbind_failed_lowers_the_top_for_a_batch_after_batches_past_it() {
    let (contexts, model) = common::node_processes(2);
    common::on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = two_chunk_heap(ctx, boot, dev);
        let src = chunk(ctx, dev);
        let stream = Stream::new(ctx, dev).unwrap();
        boot.barrier(T).unwrap();
        if r == 0 {
            for _ in 0..3 {
                stream
                    .enqueue(CopyBatch::new().put(&src, 0, peers.own(), CHUNK, 64))
                    .unwrap()
                    .wait()
                    .unwrap();
            }
        }
        shrink_with_rank_0_unbind_failing(r, me, boot, &mut peers);
        assert_eq!(peers.top(), CHUNK);
        unbinds_on_rank_0(r, me, boot, None);
        if r == 0 {
            let copies = me.calls(Call::FabricCpyBatchAsync);
            let past = stream
                .enqueue(CopyBatch::new().put(&src, 0, peers.own(), CHUNK, 64))
                .map(|t| drop(t.wait()));
            assert!(
                matches!(past, Err(Error::CopyNotAgreed { agreed: CHUNK, .. })),
                "rank 0 past the agreed top: {past:?}"
            );
            assert_eq!(me.calls(Call::FabricCpyBatchAsync), copies);
        }
        boot.barrier(T).unwrap();
        drop(stream);
        drop(src);
        peers.close(boot, T).unwrap();
        let _ = ctx.take_teardown_errors();
    });
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

#[test]
fn r13_7_a_shrink_completes_this_ranks_forgotten_copy_into_a_peers_top_chunk_before_any_rank_unbinds()
 {
    let (contexts, model) = processes(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = two_chunk_heap(ctx, boot, dev);
        let stream = Stream::new(ctx, dev).unwrap();
        if r == 1 {
            // A put into rank 0's top chunk whose token is forgotten: no
            // borrow is left for `&mut self` to exclude.
            let copy = stream
                .enqueue(CopyBatch::new().put_host(vec![9; 64], peers.peer(0).unwrap(), CHUNK))
                .unwrap();
            std::mem::forget(copy);
        }
        let top = peers.shrink(boot, T).unwrap().expect("the top chunk");
        if r == 0 {
            // The put landed before rank 0 unbound its top chunk.
            assert_eq!(me.read(top.device_ptr(), 64).unwrap(), vec![9u8; 64]);
        }
        drop(top);
        stream.synchronize().unwrap();
        drop(stream);
        peers.close(boot, T).unwrap();
        assert!(ctx.take_teardown_errors().is_empty());
    });
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

/// R7.2 ("memory that may still be bound is never freed") at a shrink
/// whose unbind fails on one rank: the chunk leaves the heap on every rank
/// (the top they agreed on), the failing rank keeps it aside, bound, with
/// its memory; the next grow unbinds it first and binds there; and a chunk
/// whose unbind fails again at drop is let go only after the endpoint's
/// destroy unbound it. Nothing leaks, no rule is broken.
#[test]
fn r7_2_a_chunk_whose_unbind_failed_at_a_shrink_is_kept_aside_until_unbound_on_every_rank_the_heap_agrees()
 {
    use cuda_endpoints::driver::Code;
    use cuda_endpoints::model::faults::Fault;
    let (contexts, model) = processes(2);
    on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = two_chunk_heap(ctx, boot, dev);
        shrink_with_rank_0_unbind_failing(r, me, boot, &mut peers);
        // One chunk lower on every rank, one memory per chunk.
        assert_eq!((peers.top(), peers.memory().len()), (CHUNK, 1), "rank {r}");
        unbinds_on_rank_0(r, me, boot, None);
        // The next grow unbinds the chunk kept aside, then binds there.
        assert_eq!(peers.grow(boot, chunk(ctx, dev), T).unwrap(), CHUNK);
        assert_eq!((peers.top(), peers.memory().len()), (2 * CHUNK, 2));
        // Again, and this time every unbind fails, at drop too: the
        // destroy unbinds, and the memory goes after it.
        unbinds_on_rank_0(
            r,
            me,
            boot,
            Some(Fault::always(Call::Unbind, Code::UNKNOWN)),
        );
        let shrunk = peers.shrink(boot, T);
        assert_eq!(shrunk.is_err(), r == 0, "rank {r}: {shrunk:?}");
        drop(shrunk);
        peers.close(boot, T).unwrap();
        let teardown = ctx.take_teardown_errors();
        assert_eq!(teardown.is_empty(), r == 1, "rank {r}: {teardown:?}");
        unbinds_on_rank_0(r, me, boot, None);
    });
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

#[test]
fn growing_past_the_reserved_maximum_is_refused_on_every_rank_before_the_driver() {
    let (contexts, model) = processes(2);
    let errors: Vec<TeamError> = on_every_rank(&contexts, Threads::new(2), |r, ctx, me, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, CHUNK).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        peers.grow(boot, chunk(ctx, dev), T).unwrap();
        let binds = me.calls(Call::BindMem);
        let e = peers.grow(boot, chunk(ctx, dev), T).unwrap_err();
        assert_eq!(me.calls(Call::BindMem), binds, "refused before the driver");
        assert_eq!(peers.top(), CHUNK, "the heap is as it was");
        peers.close(boot, T).unwrap();
        e
    });
    // Every rank refused its own chunk, and says so.
    for (r, e) in errors.iter().enumerate() {
        assert_eq!((e.rank, e.step), (r, Step::Grow), "{e}");
        assert!(
            matches!(e.cause, Cause::Local(Error::OutOfRange { .. })),
            "{e}"
        );
    }
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn a_heap_grown_by_another_chunk_size_on_one_rank_fails_every_rank_and_unbinds_it() {
    let (contexts, model) = processes(3);
    let errors: Vec<TeamError> = on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        let dev = r as i32;
        let mut peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, MAX).timeout(T))
            .unwrap()
            .into_owned::<Mapped<PosixFd>>();
        let bytes = if r == 2 { 2 * CHUNK } else { CHUNK };
        let mem = Allocation::<PosixFd>::on_device(ctx, dev, bytes)
            .unwrap()
            .map(&[dev])
            .unwrap();
        let e = peers.grow(boot, mem, T).unwrap_err();
        assert_eq!(peers.top(), 0);
        peers.close(boot, T).unwrap();
        e
    });
    for e in &errors {
        assert_eq!(e.rank, 2, "{e}");
        assert_eq!(e.step, Step::Grow, "{e}");
        assert!(
            matches!(
                e.cause,
                Cause::Mismatch(Mismatch::Heap {
                    field: "chunk size",
                    ..
                })
            ),
            "{e}"
        );
    }
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn r13_4_a_forged_peer_to_id_table_fails_every_rank_naming_that_rank_and_both_digests() {
    let (contexts, model) = processes(3);
    let boots = Threads::new(3)
        .into_iter()
        .map(|b| ForgeIdTable::new(b, 1))
        .collect();
    let errors: Vec<(TeamError, Option<u64>)> =
        on_every_rank(&contexts, boots, |r, ctx, _, boot| {
            let spec = PeerSpec::new(r as i32, CHUNK).timeout(T);
            let e = team::unicast_peers(ctx, boot, &spec).unwrap_err();
            (e, boot.honest_digest())
        });
    // The honest tables agree; the error names rank 1's forged digest and
    // rank 0's, the reference.
    let honest = errors[0].1.expect("rank 0's digest");
    for (e, own) in &errors {
        assert_eq!(*own, Some(honest), "{e}");
        assert_eq!((e.rank, e.step), (1, Step::Wait), "{e}");
        let want = Mismatch::IdTable {
            reported: honest ^ forge::FLIP,
            expected: honest,
        };
        assert!(matches!(&e.cause, Cause::Mismatch(m) if *m == want), "{e}");
    }
    assert!(model.live_node().is_empty(), "undone on every rank");
    common::no_violations(&model.violations());
}

/// Every bring-up's communicator, in order; the test fails if one
/// panicked or failed.
fn joined<T>(all: Vec<std::thread::ScopedJoinHandle<'_, Result<T, String>>>) -> Vec<T> {
    let one = |h: std::thread::ScopedJoinHandle<'_, Result<T, String>>| {
        h.join()
            .expect("a bring-up panicked")
            .expect("a bring-up failed")
    };
    all.into_iter().map(one).collect()
}

/// Where `call` first stands in `trace`; the test fails if nowhere.
#[track_caller]
fn first(trace: &[Call], call: Call) -> usize {
    let at = trace.iter().position(|c| *c == call);
    at.unwrap_or_else(|| panic!("no {call:?} in {trace:?}"))
}

#[test]
fn r13_1_unicast_peers_export_before_any_rank_waits_for_readiness() {
    // Every rank exports its endpoint pending; the waits (queries) come
    // after the handle exchange, so construction overlaps it. (Without the
    // probe, whose trial endpoints are exported too.)
    let (contexts, model) = processes(3);
    on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        let spec = PeerSpec::new(r as i32, CHUNK).timeout(T).probe(false);
        let peers = team::unicast_peers(ctx, boot, &spec).unwrap();
        boot.barrier(T).unwrap();
        drop(peers);
    });
    let trace = model.trace();
    let last_export = trace.iter().rposition(|c| *c == Call::Export);
    let first_query = first(&trace, Call::Query);
    assert_eq!(trace.iter().filter(|c| **c == Call::Export).count(), 3);
    assert!(last_export.expect("exports") < first_query, "{trace:?}");
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn r13_1_without_the_overlap_each_rank_readies_its_endpoint_before_exporting_with_the_same_outcome()
{
    // `PeerSpec::overlap(false)`, the bench's baseline: each rank's own
    // endpoint is queried ready before its export; the peers come up alike.
    let (contexts, model) = processes(3);
    let ids = on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        let spec = PeerSpec::new(r as i32, CHUNK)
            .timeout(T)
            .probe(false)
            .overlap(false);
        let peers = team::unicast_peers(ctx, boot, &spec).unwrap();
        let ids: Vec<Option<u32>> = (0..3).map(|p| peers.id_of(p)).collect();
        boot.barrier(T).unwrap();
        drop(peers);
        ids
    });
    for ids in &ids {
        assert!(ids.iter().all(Option::is_some), "{ids:?}");
    }
    let trace = model.trace();
    let first_export = first(&trace, Call::Export);
    let first_query = first(&trace, Call::Query);
    assert!(first_query < first_export, "{trace:?}");
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn eight_communicators_over_the_same_ranks_and_devices_come_up_at_once_and_none_crosses() {
    // Each communicator has its own bootstrap group (its tag: no message of
    // one reaches another); all eight bring-ups of a rank run at once on
    // the same process and device.
    const COMMS: usize = 8;
    let (contexts, model) = processes(2);
    let mut groups: Vec<Vec<ThreadRank>> = (0..COMMS).map(|_| Threads::new(2)).collect();
    let per_rank: Vec<Vec<ThreadRank>> = (0..2)
        .map(|_| groups.iter_mut().map(|g| g.remove(0)).collect())
        .collect();
    let ids: Vec<Vec<u32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = contexts
            .iter()
            .zip(per_rank)
            .enumerate()
            .map(|(r, ((ctx, _), boots))| {
                s.spawn(move || {
                    let dev = r as i32;
                    let comms: Vec<Comm> = std::thread::scope(|s| {
                        let all: Vec<_> = boots
                            .iter()
                            .map(|boot| {
                                s.spawn(move || {
                                    Comm::new(ctx, boot, dev).map_err(|e| e.to_string())
                                })
                            })
                            .collect();
                        joined(all)
                    });
                    let ids: Vec<u32> = comms.iter().map(|c| c.peers.own().id()).collect();
                    for (comm, boot) in comms.into_iter().zip(&boots) {
                        comm.close(boot);
                    }
                    ids
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    for (r, ids) in ids.iter().enumerate() {
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            COMMS,
            "rank {r}: one endpoint per communicator: {ids:?}"
        );
    }
    assert!(
        model.live_node().is_empty(),
        "leak: {:?}",
        model.live_node()
    );
    common::no_violations(&model.violations());
}

#[test]
fn the_reachability_probe_gives_every_rank_the_same_answer_and_names_a_rank_without_fabric_access()
{
    let (contexts, model) = processes(3);
    let reach = on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        team::probe(ctx, boot, r as i32, T).unwrap()
    });
    assert!(
        reach.iter().all(|x| *x == reach[0]),
        "the same on every rank"
    );
    assert!(reach[0].one_fabric_domain(), "{:?}", reach[0]);
    assert_eq!(reach[0].bring_up(), team::BringUp::Multicast);
    assert_eq!(reach[0].ranks[1].driver_version, Some(13050));
    assert!(model.live_node().is_empty(), "the trial endpoints are gone");

    // Rank 2 has no IMEX channel: its imports fail, which every rank learns.
    contexts[2].1.set_fabric_access(false);
    let reach = on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        team::probe(ctx, boot, r as i32, T).unwrap()
    });
    assert!(
        reach.iter().all(|x| *x == reach[0]),
        "the same on every rank"
    );
    let unreachable = reach[0].unreachable();
    assert!(
        !unreachable.is_empty() && unreachable.iter().all(|&(i, _, _)| i == 2),
        "{unreachable:?}"
    );
    match reach[0].bring_up() {
        team::BringUp::None { why } => assert!(why.contains("rank 2"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(model.live_node().is_empty(), "the trial endpoints are gone");
    common::no_violations(&model.violations());
}

/// `n` TCP bootstraps on loopback, rank 0's first (made on threads: the
/// joins wait for rank 0's accept).
fn tcp(n: usize) -> Vec<Tcp> {
    let (id, root) = Tcp::root("127.0.0.1:0".parse().unwrap()).unwrap();
    std::thread::scope(|s| {
        let joins: Vec<_> = (1..n)
            .map(|r| {
                let id = id.clone();
                s.spawn(move || Tcp::join(&id, r, n, T).unwrap())
            })
            .collect();
        let mut all = vec![root.accept(n, T).unwrap()];
        all.extend(joins.into_iter().map(|h| h.join().unwrap()));
        all
    })
}

/// On every rank, `comms` communicators come up at once, each on its own
/// thread over its own channel of the rank's one shared bootstrap; returns
/// each rank's endpoint ids, one per communicator, after every rank dropped
/// them.
fn concurrent_over_one_bootstrap<B: Bootstrap + Send>(
    contexts: &[(Context, Model)],
    boots: Vec<B>,
    comms: u64,
) -> Vec<Vec<u32>> {
    std::thread::scope(|s| {
        let ranks: Vec<_> = contexts
            .iter()
            .zip(boots)
            .enumerate()
            .map(|(r, ((ctx, _), boot))| {
                s.spawn(move || {
                    let shared = Tagged::new(boot);
                    let dev = r as i32;
                    let start = std::sync::Barrier::new(comms as usize);
                    let made: Vec<Comm> = std::thread::scope(|s| {
                        let all: Vec<_> = (0..comms)
                            .map(|tag| {
                                let (shared, start) = (&shared, &start);
                                s.spawn(move || {
                                    start.wait();
                                    Comm::tagged(ctx, &shared.channel(tag), dev, tag)
                                        .map_err(|e| e.to_string())
                                })
                            })
                            .collect();
                        joined(all)
                    });
                    let ids = made.iter().map(|c| c.peers.own().id()).collect();
                    // Each closes over its own channel, in tag order on
                    // every rank (R13.7).
                    for (tag, comm) in (0..comms).zip(made) {
                        comm.close(&shared.channel(tag));
                    }
                    ids
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

#[test]
fn concurrent_bring_ups_over_one_shared_bootstrap_take_only_their_own_tagged_messages() {
    const COMMS: u64 = 6;
    let (contexts, model) = processes(2);
    let threads = concurrent_over_one_bootstrap(&contexts, Threads::new(2), COMMS);
    let (contexts3, model3) = processes(3);
    let tcp = concurrent_over_one_bootstrap(&contexts3, tcp(3), COMMS);
    for (r, ids) in threads.iter().chain(&tcp).enumerate() {
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), COMMS as usize, "{r}: {ids:?}");
    }
    for m in [&model, &model3] {
        assert!(m.live_node().is_empty(), "leak: {:?}", m.live_node());
        common::no_violations(&m.violations());
    }
}

#[test]
fn a_rank_whose_bring_up_carries_another_tag_is_refused_by_every_rank() {
    let (contexts, model) = processes(3);
    let errors: Vec<TeamError> = on_every_rank(&contexts, Threads::new(3), |r, ctx, _, boot| {
        let tag = if r == 1 { 7 } else { 3 };
        let spec = PeerSpec::new(r as i32, CHUNK).timeout(T).tag(tag);
        team::unicast_peers(ctx, boot, &spec).unwrap_err()
    });
    for (r, e) in errors.iter().enumerate() {
        assert_eq!(e.step, Step::Hello, "rank {r}: {e}");
        match (r, &e.cause) {
            // Rank 1 hears every other rank's tag 3; the others hear its 7.
            (1, Cause::Mismatch(Mismatch::Tag { theirs: 3, ours: 7 })) => assert_eq!(e.rank, 0),
            (_, Cause::Mismatch(Mismatch::Tag { theirs: 7, ours: 3 })) => assert_eq!(e.rank, 1),
            _ => panic!("rank {r}: {e}"),
        }
    }
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

/// Issue 21: a channel's message larger than one round of the shared
/// bootstrap carries (one frame shared among the ranks) is refused by its
/// sender before anything is sent, naming the size and the limit; the
/// other ranks' collective fails naming that rank's refusal, not bytes they
/// call malformed; and the shared bootstrap still works for every channel.
/// Three TCP ranks on loopback (threads of this process: the ring).
#[test]
fn a_tagged_round_larger_than_one_frame_is_refused_by_its_sender_naming_the_limit() {
    type Outcome = (
        Result<Vec<Vec<u8>>, BootstrapError>,
        Result<(), BootstrapError>,
    );
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let ranks: Vec<_> = tcp(3)
            .into_iter()
            .map(|boot| {
                s.spawn(move || {
                    let shared = Tagged::new(boot);
                    let max = shared.max_message();
                    let mine = if shared.channel(5).rank() == 1 {
                        vec![1u8; max + 1]
                    } else {
                        vec![2u8; 16]
                    };
                    let big = shared.channel(5).allgather(&mine, T);
                    let after = shared.channel(6).barrier(T);
                    (big, after)
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let max = (cuda_endpoints::bootstrap::MAX_PAYLOAD / 3) as u64;
    for (r, (big, after)) in outcomes.iter().enumerate() {
        match (r, big) {
            (
                1,
                Err(
                    e @ BootstrapError::InvalidArgument {
                        rank: 1,
                        what: cuda_endpoints::bootstrap::Argument::RoundTooLarge { len, max: limit },
                        ..
                    },
                ),
            ) => {
                assert_eq!(*len, *limit + 1);
                assert!((*limit as u64) < max, "{e}");
                let text = e.to_string();
                assert!(text.contains(&len.to_string()), "{text}");
                assert!(text.contains(&limit.to_string()), "{text}");
                assert!(text.contains("split the collective"), "{text}");
            }
            (
                0 | 2,
                Err(
                    e @ BootstrapError::ContributionTooLarge {
                        peer: 1, len, max, ..
                    },
                ),
            ) => {
                assert_eq!(*len, *max + 1, "{e}");
                assert!(e.to_string().contains("refused to send it"), "{e}");
            }
            _ => panic!("rank {r}: {big:?}"),
        }
        assert!(
            after.is_ok(),
            "rank {r}: the shared bootstrap broke: {after:?}"
        );
    }
}

/// Issue 21: over TCP with three ranks the shared bootstrap's rounds run on
/// the ring, and a ring step cannot be abandoned half-way: a channel whose
/// collective times out while its round is in flight ends the shared
/// bootstrap. By design, then, every other channel fails at once (never at
/// its own deadline, never hanging) and, on the rank where it happened,
/// names the channel that timed out. Three TCP ranks on loopback (threads of
/// this process); ranks 1 and 2 enter no round until rank 0's channel 1 gave
/// up, so its round is in flight at its deadline whatever the machine's load.
#[test]
fn a_channel_that_times_out_mid_round_fails_every_other_channel_at_once_naming_it() {
    const SHORT: Duration = Duration::from_millis(200);
    let (gave_up, done) = (std::sync::Barrier::new(3), std::sync::Barrier::new(3));
    let outcomes: Vec<(Option<BootstrapError>, BootstrapError)> = std::thread::scope(|s| {
        let ranks: Vec<_> = tcp(3)
            .into_iter()
            .map(|boot| {
                let (gave_up, done) = (&gave_up, &done);
                s.spawn(move || {
                    let shared = Tagged::new(boot);
                    let rank = shared.channel(0).rank();
                    // Every rank once: the ring stands.
                    shared.channel(0).barrier(T).unwrap();
                    let timed_out = (rank == 0).then(|| {
                        shared
                            .channel(1)
                            .allgather(b"only rank 0 calls this", SHORT)
                            .unwrap_err()
                    });
                    gave_up.wait();
                    let other = shared.channel(2).allgather(b"every rank", T).unwrap_err();
                    // No rank closes its links before every rank failed.
                    done.wait();
                    (timed_out, other)
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (timed_out, other) = &outcomes[0];
    assert!(
        matches!(timed_out, Some(BootstrapError::Timeout { rank: 0, .. })),
        "{timed_out:?}"
    );
    match other {
        BootstrapError::SharedBroken {
            rank: 0,
            tag: 1,
            seq: 0,
            cause,
            ..
        } => assert!(cause.contains("timed out"), "{other}"),
        e => panic!("rank 0, channel 2: {e}"),
    }
    assert!(other.to_string().contains("channel 1"), "{other}");
    for (r, (_, other)) in outcomes.iter().enumerate().skip(1) {
        // Told by the ring at once (the abort rank 0 sent on, or rank 0's
        // closed ring links, whichever comes first), not at its own deadline.
        assert!(
            matches!(
                other,
                BootstrapError::Aborted { .. }
                    | BootstrapError::PeerClosed { peer: 0, .. }
                    | BootstrapError::SharedBroken { .. }
            ),
            "rank {r}, channel 2: {other}"
        );
    }
}

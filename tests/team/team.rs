//! Team bring-up across ranks (threads as ranks, one simulated process per
//! rank on one model node): the multicast and unicast-peer patterns, the
//! same type on every rank, and failures reaching every rank as a typed
//! error naming the rank and the step, with nothing left behind.

use std::time::Duration;

use crate::common;
use crate::watchdog;

use common::on_every_rank;

use cuda_endpoints::bootstrap::{Bootstrap, ThreadRank, Threads};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::team::{self, Cause, Mismatch, PeerSpec, Step, TeamError, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, PosixFd,
    driver::{Call, Code},
};

const MIB2: u64 = 2 << 20;

/// One model node of `n` devices and one simulated process per rank.
fn job(config: ModelConfig, n: usize) -> (Model, Vec<(Context, Model)>, Vec<ThreadRank>) {
    let root = Model::new(config);
    let procs = (0..n)
        .map(|i| {
            let p = if i == 0 {
                root.clone()
            } else {
                root.spawn_process()
            };
            (Context::new(p.clone()), p)
        })
        .collect();
    (root, procs, Threads::new(n))
}

fn assert_clean(model: &Model) {
    assert!(
        model.live_node().is_empty(),
        "left behind: {:?}",
        model.live_node()
    );
    assert!(
        model.violations().is_empty(),
        "violations: {:?}",
        model.violations()
    );
}

#[test]
fn multicast_team_comes_up_on_every_rank_and_binds_on_own_devices() {
    let (model, procs, boots) = job(ModelConfig::node(4), 4);
    let out = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let spec = TeamSpec::new([rank as i32], MIB2).timeout(Duration::from_secs(10));
        let team = team::multicast(ctx, boot, &spec).expect("bring-up");
        assert_eq!((team.rank(), team.ranks(), team.team_size()), (rank, 4, 4));
        // The same type on every rank: one code path, no `if rank == 0`.
        let ep = team.endpoint();
        assert_eq!(ep.devices(), vec![cuda_endpoints::Device(rank as i32)]);
        let mem = Allocation::<PosixFd>::on_device(ctx, rank as i32, MIB2).expect("alloc");
        let b = ep.bind(rank as i32, 0, &mem).expect("bind on own device");
        boot.barrier(Duration::from_secs(10))
            .expect("barrier before first use");
        b.unbind().expect("unbind");
        drop(team);
        drop(mem);
        boot.barrier(Duration::from_secs(10))
            .expect("barrier after teardown");
    });
    assert_eq!(out.len(), 4);
    assert_clean(&model);
}

#[test]
fn unicast_peers_import_every_peer_at_its_index_and_ready_the_range() {
    let (model, procs, boots) = job(ModelConfig::node(4), 4);
    on_every_rank(&procs, boots, |rank, ctx, m, boot| {
        let before = m.calls(cuda_endpoints::driver::Call::Query);
        let peers =
            team::unicast_peers(ctx, boot, &PeerSpec::new(rank as i32, MIB2)).expect("bring-up");
        assert_eq!((peers.rank(), peers.ranks()), (rank, 4));
        for r in 0..4 {
            assert!(peers.id_of(r).is_some());
            assert_eq!(peers.peer(r).is_some(), r != rank);
        }
        let own = peers.own();
        let ids: Vec<u32> = (0..4).filter_map(|r| peers.id_of(r)).collect();
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "one contiguous range: {ids:?}"
        );
        let mem = Allocation::<PosixFd>::on_device(ctx, rank as i32, MIB2).expect("alloc");
        let b = own.bind(rank as i32, 0, &mem).expect("bind own");
        drop(b);
        assert!(m.calls(cuda_endpoints::driver::Call::Query) > before);
        boot.barrier(Duration::from_secs(10)).expect("barrier");
    });
    assert_clean(&model);
}

/// Every rank's error, checked to name `rank` and `step`.
fn all_name(errors: &[Result<(), TeamError>], rank: usize, step: Step) {
    for (me, e) in errors.iter().enumerate() {
        let e = e.as_ref().expect_err("bring-up must fail on every rank");
        assert_eq!((e.rank, e.step), (rank, step), "rank {me} got: {e}");
    }
}

#[test]
fn a_refused_import_fails_every_rank_naming_the_rank_and_undoes_everything() {
    let (model, procs, boots) = job(ModelConfig::node(4), 4);
    procs[2].1.set_fabric_access(false); // no IMEX channel on rank 2 (R9.1)
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        // Without the probe, the bring-up's own import is refused.
        let spec = TeamSpec::new([rank as i32], MIB2)
            .timeout(Duration::from_secs(10))
            .probe(false);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    all_name(&errors, 2, Step::Import);
    assert_eq!(
        errors[2].as_ref().err().and_then(TeamError::code),
        Some(Code::NOT_PERMITTED)
    );
    assert!(matches!(
        errors[0].as_ref().err().map(|e| &e.cause),
        Some(Cause::Peer(_))
    ));
    assert_clean(&model);
}

#[test]
fn the_probe_runs_first_and_a_rank_without_fabric_access_fails_every_rank_naming_it_before_anything_is_made()
 {
    for multicast in [true, false] {
        let (model, procs, boots) = job(ModelConfig::node(4), 4);
        procs[2].1.set_fabric_access(false); // no IMEX channel on rank 2 (R9.1)
        let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
            let t = Duration::from_secs(10);
            if multicast {
                team::multicast(ctx, boot, &TeamSpec::new([rank as i32], MIB2).timeout(t)).map(drop)
            } else {
                team::unicast_peers(ctx, boot, &PeerSpec::new(rank as i32, MIB2).timeout(t))
                    .map(drop)
            }
        });
        all_name(&errors, 2, Step::Probe);
        for e in &errors {
            let e = e.as_ref().expect_err("every rank fails");
            assert!(
                matches!(
                    e.cause,
                    Cause::Unreachable {
                        importer: 2,
                        exporter: 0,
                        code
                    } if code == Code::NOT_PERMITTED
                ),
                "the same verdict on every rank, naming the unreachable peer: {e}"
            );
            assert!(e.to_string().contains("rank 2 cannot import rank 0"), "{e}");
        }
        // Only the trial endpoints were made: no team, no enrollment.
        assert_eq!(model.calls(Call::Create), 4, "multicast {multicast}");
        assert_eq!(model.calls(Call::AddDevice), 0);
        assert_clean(&model);
    }
}

#[test]
fn a_device_outside_the_clique_fails_at_join_on_every_rank_before_the_driver() {
    let config = ModelConfig::node(4).with_devices(|i, d| d.clique = u32::from(i == 3));
    let (model, procs, boots) = job(config, 4);
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let spec = TeamSpec::new([rank as i32], MIB2).timeout(Duration::from_secs(10));
        team::multicast(ctx, boot, &spec).map(drop)
    });
    // Read from cuDeviceGetCliqueInfo in every rank's hello: refused before
    // anything is created, so no AddDevice reaches the driver to fail.
    all_name(&errors, 3, Step::Hello);
    assert!(matches!(
        errors[0].as_ref().err().map(|e| &e.cause),
        Some(Cause::Mismatch(Mismatch::Clique {
            device: 3,
            clique: 1,
            expected: 0
        }))
    ));
    assert_eq!(model.calls(cuda_endpoints::driver::Call::AddDevice), 0);
    assert_clean(&model);
}

#[test]
fn a_team_declared_for_4_with_3_devices_fails_at_join_on_every_rank() {
    let (model, procs, boots) = job(ModelConfig::node(4), 3);
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let spec = TeamSpec::new([rank as i32], MIB2).team_size(4);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (rank, e) in errors.iter().enumerate() {
        let e = e.as_ref().expect_err("must fail");
        assert_eq!((e.rank, e.step), (rank, Step::Hello));
        assert!(matches!(
            &e.cause,
            Cause::Mismatch(Mismatch::TeamSize {
                declared: 4,
                arriving: 3,
                brought,
            }) if brought == &[1, 1, 1]
        ));
        let msg = e.to_string();
        assert!(
            msg.contains("1 missing; start one rank per missing device"),
            "{msg}"
        );
    }
    assert_clean(&model);
}

#[test]
fn a_team_declared_for_4_with_16_devices_names_the_ranks_that_brought_them_and_the_fix() {
    let (model, procs, boots) = job(ModelConfig::node(16), 4);
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let first = 4 * rank as i32;
        let spec = TeamSpec::new(first..first + 4, MIB2).team_size(4);
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for (rank, e) in errors.iter().enumerate() {
        let e = e.as_ref().expect_err("must fail");
        assert_eq!((e.rank, e.step), (rank, Step::Hello));
        let msg = e.to_string();
        for part in [
            "declared for 4 devices but the ranks that joined bring 16",
            "rank 0: 4, rank 1: 4, rank 2: 4, rank 3: 4",
            "12 too many; bring 4 in all",
            ".team_size(16)",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        assert!(!msg.contains("missing"), "{msg}");
    }
    assert_clean(&model);
}

#[test]
fn ranks_that_disagree_on_the_size_fail_at_join_naming_the_odd_rank() {
    let (model, procs, boots) = job(ModelConfig::node(2), 2);
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let bytes = if rank == 1 { 2 * MIB2 } else { MIB2 };
        team::multicast(ctx, boot, &TeamSpec::new([rank as i32], bytes)).map(drop)
    });
    all_name(&errors, 1, Step::Hello);
    assert_clean(&model);
}

/// Every other rank ends with its own timeout at the hello (not a hang:
/// the watchdog fires only minutes later; no wall-clock assertion).
#[test]
fn a_rank_that_never_comes_times_out_every_other_rank_at_the_hello() {
    let (model, procs, mut boots) = job(ModelConfig::node(3), 3);
    let _absent = boots.pop(); // rank 2 never calls
    let _hang = watchdog::guard("a rank that never comes");
    let errors = on_every_rank(&procs[..2], boots, |rank, ctx, _, boot| {
        let spec = TeamSpec::new([rank as i32], MIB2).timeout(Duration::from_millis(300));
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for e in &errors {
        let e = e.as_ref().expect_err("must time out");
        assert!(e.is_timeout(), "{e}");
        assert_eq!(e.step, Step::Hello);
    }
    assert_clean(&model);
}

#[test]
fn a_timeout_waiting_for_construction_is_agreed_and_undone() {
    // Construction takes more queries than the budget allows.
    let (model, procs, boots) = job(ModelConfig::node(2).queries_to_ready(u32::MAX), 2);
    let errors = on_every_rank(&procs, boots, |rank, ctx, _, boot| {
        let spec = TeamSpec::new([rank as i32], MIB2).timeout(Duration::from_millis(500));
        team::multicast(ctx, boot, &spec).map(drop)
    });
    for e in &errors {
        let e = e.as_ref().expect_err("must fail");
        assert_eq!(e.step, Step::Wait, "{e}");
    }
    assert_clean(&model);
}

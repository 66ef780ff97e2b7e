//! R13.3 through the bring-ups: after binding, the ranks agree that every
//! rank bound before anyone copies (`agree_bound`), and a rank that bound
//! nothing fails every rank with the same error. Ranks are threads, each
//! its own process of one model on a 13.5 driver (the fabric copy exists).

use crate::common;

use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, Threads};
use cuda_endpoints::team::{
    self, Cause, Mismatch, PeerSpec, SharedTeam, Step, TeamError, TeamSpec,
};
use cuda_endpoints::{Allocation, Context, CopyBatch, Mapped, PosixFd, Stream};

const BYTES: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

use common::node_processes as processes;
use common::on_every_rank;

/// The multicast team of one device per rank, brought up on rank `dev`,
/// and `PosixFd` memory mapped on its device to bind.
fn team_and_memory(ctx: &Context, boot: &dyn Bootstrap, dev: i32) -> (SharedTeam, Mapped<PosixFd>) {
    let team = team::multicast(ctx, boot, &TeamSpec::new([dev], BYTES).timeout(T)).unwrap();
    let mem = Allocation::<PosixFd>::on_device(ctx, dev, BYTES)
        .unwrap()
        .map(&[dev])
        .unwrap();
    (team, mem)
}

#[test]
fn r13_3_a_multicast_put_after_agree_bound_lands_in_every_members_memory() {
    let (contexts, model) = processes(3);
    let got = on_every_rank(
        &contexts,
        Threads::new(contexts.len()),
        |r, ctx, me, boot| {
            let dev = r as i32;
            let (team, mem) = team_and_memory(ctx, boot, dev);
            let binding = team.endpoint().bind(dev, 0, &mem).unwrap();
            let bound = team.agree_bound(boot, T).unwrap();
            let stream = Stream::new(ctx, dev).unwrap();
            if r == 0 {
                stream
                    .enqueue(CopyBatch::new().put_host(vec![0xb5; 4096], bound.endpoint(), 8192))
                    .unwrap()
                    .wait()
                    .unwrap();
            }
            boot.barrier(T).unwrap();
            let mine = me.read(mem.device_ptr() + 8192, 4096).unwrap();
            boot.barrier(T).unwrap();
            drop(stream);
            drop(binding);
            drop(team);
            mine
        },
    );
    for (r, bytes) in got.into_iter().enumerate() {
        assert_eq!(bytes, vec![0xb5; 4096], "rank {r}");
    }
    common::no_violations(&model.violations());
}

#[test]
fn r13_3_each_rank_gets_every_peers_slice_after_agree_bound() {
    let (contexts, model) = processes(3);
    on_every_rank(
        &contexts,
        Threads::new(contexts.len()),
        |r, ctx, _, boot| {
            let dev = r as i32;
            let peers =
                team::unicast_peers(ctx, boot, &PeerSpec::new(dev, BYTES).timeout(T)).unwrap();
            let mem = Allocation::<PosixFd>::on_device(ctx, dev, BYTES)
                .unwrap()
                .map(&[dev])
                .unwrap();
            let binding = peers.own().bind(dev, 0, &mem).unwrap();
            let bound = peers.agree_bound(boot, T).unwrap();
            let stream = Stream::new(ctx, dev).unwrap();
            stream
                .enqueue(CopyBatch::new().put_host(vec![r as u8 + 1; 512], bound.own(), 0))
                .unwrap()
                .wait()
                .unwrap();
            boot.barrier(T).unwrap();
            for p in (0..peers.ranks()).filter(|&p| p != r) {
                let ep = bound.peer(p).unwrap();
                let done = stream
                    .enqueue(CopyBatch::new().get_host(ep, 0, 512))
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(done.received, [vec![p as u8 + 1; 512]], "rank {r} from {p}");
            }
            boot.barrier(T).unwrap();
            drop(stream);
            drop(binding);
            drop(peers);
        },
    );
    common::no_violations(&model.violations());
}

#[test]
fn r13_3_a_rank_that_bound_nothing_fails_every_rank_identically_at_the_bind_step() {
    let (contexts, _model) = processes(3);
    let errors: Vec<TeamError> = on_every_rank(
        &contexts,
        Threads::new(contexts.len()),
        |r, ctx, _, boot| {
            let dev = r as i32;
            let (team, mem) = team_and_memory(ctx, boot, dev);
            // Rank 1 forgets to bind.
            let binding = (r != 1).then(|| team.endpoint().bind(dev, 0, &mem).unwrap());
            let e = team.agree_bound(boot, T).map(|_| ()).unwrap_err();
            drop(binding);
            e
        },
    );
    for e in &errors {
        assert_eq!((e.rank, e.step), (1, Step::Bind), "{e}");
        assert!(
            matches!(
                e.cause,
                Cause::Mismatch(Mismatch::NotBound { device: Some(1) })
            ),
            "{e}"
        );
    }
}

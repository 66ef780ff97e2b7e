//! Team bring-up on the classic fallback (C1–C6) behind the same call as
//! logical endpoints, in one OS process with a simulated process per rank
//! (`Model::spawn_process`): the root's classic multicast object is shared
//! as a POSIX descriptor within a node (`FdExchange`) or as fabric bytes
//! across nodes (C5, R12.4); no bind reaches the driver before every
//! rank's devices are added (C3: the model's violation log stays empty).
//! OS processes on the model fabric are in `tests/shareable_processes.rs`.

use crate::common;
use crate::watchdog;

use std::sync::Arc;
use std::time::Duration;

use cuda_endpoints::bootstrap::Threads;
use cuda_endpoints::driver::{Classic, ShareableKind};
use cuda_endpoints::model::{FabricConfig, Model};
use cuda_endpoints::team::{self, Step, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, Device, PosixFd,
    bootstrap::Bootstrap,
    driver::{Call, Code},
};

const MIB2: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

/// One simulated process per rank, `per_node` ranks per node, each on the
/// classic fallback over its model process; rank r uses device r % per_node.
fn ranks(model: &Model, n: usize, per_node: usize) -> Vec<(Model, Context, Device)> {
    (0..n)
        .map(|r| {
            let m = if r == 0 {
                model.clone()
            } else {
                model.spawn_process_on(r / per_node).unwrap()
            };
            let ctx = Context::new(Classic::new(Arc::new(m.clone())));
            (m, ctx, Device((r % per_node) as i32))
        })
        .collect()
}

/// Every rank brings its team up, binds, writes through its own memory
/// and tears down; returns each rank's outcome.
fn bring_up(
    ranks: &[(Model, Context, Device)],
    kind: ShareableKind,
) -> Vec<Result<(), team::TeamError>> {
    let boots = Threads::new(ranks.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .zip(boots)
            .map(|((m, ctx, dev), boot)| {
                s.spawn(move || {
                    let spec = TeamSpec::new([*dev], MIB2).timeout(T).classic_handles(kind);
                    let team = team::multicast(ctx, &boot, &spec)?;
                    let mem = Allocation::<PosixFd>::on_device(ctx, *dev, MIB2)
                        .unwrap()
                        .map(&[*dev])
                        .unwrap();
                    let binding = team
                        .endpoint()
                        .bind(*dev, 0, &mem)
                        .expect("bind after bring-up");
                    m.write(mem.device_ptr(), b"bound").unwrap();
                    boot.barrier(T).unwrap();
                    binding.unbind().unwrap();
                    boot.barrier(T).unwrap();
                    drop(team);
                    drop(mem);
                    assert!(ctx.take_teardown_errors().is_empty());
                    assert!(m.live().is_empty(), "rank leaked {:?}", m.live());
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

#[test]
fn c5_classic_team_of_four_processes_shares_a_posix_fd_and_binds_only_when_complete() {
    let model = Model::fabric(FabricConfig::nodes(1, 4));
    let ranks = ranks(&model, 4, 4);
    for r in bring_up(&ranks, ShareableKind::PosixFd) {
        r.unwrap();
    }
    // One object for the team, made by the root; C3 never logged.
    assert_eq!(model.calls(Call::MulticastCreate), 1);
    assert_eq!(model.calls(Call::MulticastAddDevice), 4);
    assert_eq!(model.calls(Call::MulticastBindAddr), 4);
    common::fabric_idle(&model);
}

#[test]
fn c5_r12_4_classic_team_across_nodes_shares_fabric_bytes() {
    let model = Model::fabric(FabricConfig::nodes(2, 2));
    let ranks = ranks(&model, 4, 2);
    for r in bring_up(&ranks, ShareableKind::Fabric) {
        r.unwrap();
    }
    assert_eq!(model.calls(Call::MulticastCreate), 1);
    common::fabric_idle(&model);
}

#[test]
fn r12_4_a_classic_posix_fd_team_across_nodes_fails_every_rank_at_import() {
    let model = Model::fabric(FabricConfig::nodes(2, 2));
    let ranks = ranks(&model, 4, 2);
    for r in bring_up(&ranks, ShareableKind::PosixFd) {
        let e = r.expect_err("a descriptor means nothing on another node");
        assert_eq!(e.step, Step::Import, "{e}");
        assert!(e.rank >= 2, "a rank of the other node failed first: {e}");
    }
    for (m, ctx, _) in &ranks {
        assert!(m.live().is_empty(), "{:?}", m.live());
        assert!(ctx.take_teardown_errors().is_empty());
    }
    common::fabric_idle(&model);
}

#[test]
fn c3_a_shared_classic_object_refuses_binds_until_the_team_is_complete() {
    // The typed API without the bring-up: an exportable classic team whose
    // other devices belong to other processes is never ready here, so it
    // cannot bind: the wait times out with a typed error instead of a bind
    // that would block in the driver.
    let model = Model::fabric(FabricConfig::nodes(1, 2));
    let ctx = Context::new(Classic::new(Arc::new(model.clone())));
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(cuda_endpoints::Spec::spread(2, MIB2).exportable())
        .unwrap()
        .add_device(0)
        .unwrap();
    let e = ep.wait(Duration::from_millis(20)).unwrap_err();
    assert!(
        matches!(e.error, cuda_endpoints::Error::Timeout { .. }),
        "{}",
        e.error
    );
    drop(e);
    assert_eq!(model.calls(Call::MulticastBindMem), 0);
    common::fabric_idle(&model);
}

#[test]
fn c3_the_model_logs_a_bind_before_every_device_was_added() {
    // What the bring-up never lets happen, done by hand: the model logs it.
    let model = Model::fabric(FabricConfig::nodes(1, 2));
    let d: &dyn cuda_endpoints::driver::Driver = &model;
    // SAFETY: the test owns every handle it names; the bind it makes on an
    // incomplete object is the point (the model refuses instead of blocking).
    unsafe {
        let mc = d.multicast_create(2, MIB2, 1).unwrap();
        d.multicast_add_device(mc, Device(0)).unwrap();
        let req = cuda_endpoints::driver::AllocationRequest {
            location: cuda_endpoints::Location::Device(Device(0)),
            handle_types: 1,
        };
        let mem = d.mem_create(MIB2, req).unwrap();
        assert_eq!(
            d.multicast_bind_mem(mc, 0, mem, 0, MIB2),
            Err(Code::ILLEGAL_STATE)
        );
        d.mem_release(mc).unwrap();
        d.mem_release(mem).unwrap();
    }
    let v = model.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].rule, "C3");
}

/// A bootstrap that damages the last byte of the root's first large
/// broadcast (the handle envelope) as the other ranks receive it.
struct Hostile<B>(B, std::cell::Cell<bool>);

impl<B: Bootstrap> Bootstrap for Hostile<B> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn allgather(
        &self,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, cuda_endpoints::bootstrap::BootstrapError> {
        self.0.allgather(mine, timeout)
    }
    fn broadcast(
        &self,
        root: usize,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, cuda_endpoints::bootstrap::BootstrapError> {
        let mut got = self.0.broadcast(root, bytes, timeout)?;
        if self.0.rank() != root && got.len() > 64 && !self.1.replace(true) {
            let last = got.len() - 1;
            got[last] ^= 0x5a;
        }
        Ok(got)
    }
    fn barrier(&self, timeout: Duration) -> Result<(), cuda_endpoints::bootstrap::BootstrapError> {
        self.0.barrier(timeout)
    }
}

#[test]
fn r9_4_damaged_classic_fabric_bytes_fail_every_rank_and_leave_nothing() {
    let model = Model::fabric(FabricConfig::nodes(2, 1));
    let ranks = ranks(&model, 2, 1);
    let boots = Threads::new(2);
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .zip(boots)
            .map(|((_, ctx, dev), boot)| {
                s.spawn(move || {
                    let boot = Hostile(boot, std::cell::Cell::new(false));
                    let spec = TeamSpec::new([*dev], MIB2)
                        .timeout(T)
                        .classic_handles(ShareableKind::Fabric);
                    team::multicast(ctx, &boot, &spec).map(drop)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in outcomes {
        let e = o.expect_err("damaged bytes never import");
        assert_eq!((e.rank, e.step), (1, Step::Import), "{e}");
    }
    // Refused by the driver as bytes it did not make: not a rule broken.
    common::fabric_idle(&model);
}

/// A bootstrap whose first allgather (the Join) sends `replace` instead of
/// what this rank says, and records what it said.
struct Lying<B> {
    inner: B,
    first: std::sync::Mutex<bool>,
    replace: Option<Vec<u8>>,
    record: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl<B: Bootstrap> Bootstrap for Lying<B> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn allgather(
        &self,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, cuda_endpoints::bootstrap::BootstrapError> {
        let mut bytes = mine.to_vec();
        if std::mem::take(&mut *self.first.lock().unwrap()) {
            *self.record.lock().unwrap() = Some(mine.to_vec());
            if let Some(r) = &self.replace {
                bytes = r.clone();
            }
        }
        self.inner.allgather(&bytes, timeout)
    }
    fn broadcast(
        &self,
        root: usize,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, cuda_endpoints::bootstrap::BootstrapError> {
        self.inner.broadcast(root, bytes, timeout)
    }
    fn barrier(&self, timeout: Duration) -> Result<(), cuda_endpoints::bootstrap::BootstrapError> {
        self.inner.barrier(timeout)
    }
}

/// The Join an honest one-rank bring-up bringing `devices` sends, as rank 1
/// would send it: the status header names its sender (bytes 14..18), which
/// every receiver checks against the slot it came in.
fn join_of(devices: &[i32]) -> Vec<u8> {
    let model = Model::fabric(FabricConfig::nodes(1, 4));
    let ctx = Context::new(Classic::new(Arc::new(model.clone())));
    let record = Arc::new(std::sync::Mutex::new(None));
    let boot = Lying {
        inner: Threads::new(1).pop().unwrap(),
        first: std::sync::Mutex::new(true),
        replace: None,
        record: record.clone(),
    };
    let spec = TeamSpec::new(devices.iter().map(|&d| Device(d)), MIB2).timeout(T);
    let _ = team::multicast(&ctx, &boot, &spec);
    let mut join = record.lock().unwrap().take().expect("a Join");
    join[14..18].copy_from_slice(&1u32.to_le_bytes());
    join
}

/// Two ranks (two processes of one node), each bringing its own device;
/// rank 1's Join says `lie` instead. Returns each rank's outcome, which
/// is not a timeout on any rank (the bound is far longer than the bring-up).
fn bring_up_with_a_lie(
    model: &Model,
    classic: bool,
    lie: Vec<u8>,
) -> Vec<Result<team::SharedTeam, team::TeamError>> {
    let ms = [model.clone(), model.spawn_process_on(0).unwrap()];
    // Far longer than the bring-up: every rank must fail by an error that
    // is not this timeout, which proves "in time" at any load (issue 21,
    // item 13); the watchdog catches a real hang.
    let timeout = Duration::from_secs(60);
    let _hang = watchdog::guard("a bring-up on a lie");
    std::thread::scope(|s| {
        let hs: Vec<_> = ms
            .iter()
            .zip(Threads::new(2))
            .enumerate()
            .map(|(rank, (m, b))| {
                let lie = lie.clone();
                s.spawn(move || {
                    let ctx = if classic {
                        Context::new(Classic::new(Arc::new(m.clone())))
                    } else {
                        Context::new(m.clone())
                    };
                    let boot = Lying {
                        inner: b,
                        first: std::sync::Mutex::new(true),
                        replace: (rank == 1).then_some(lie),
                        record: Arc::new(std::sync::Mutex::new(None)),
                    };
                    let spec = TeamSpec::new([Device(rank as i32)], MIB2).timeout(timeout);
                    let r = team::multicast(&ctx, &boot, &spec);
                    if let Err(e) = &r {
                        assert!(!e.is_timeout(), "rank {rank} waited out its bound: {e}");
                        drop(ctx);
                        assert!(m.live().is_empty(), "rank {rank}: {:?}", m.live());
                    }
                    r.map(|t| {
                        // Not bound: a bind here is the C3 hang under test.
                        drop(t);
                        unreachable!("rank {rank}: the team came up on a lie");
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn c3_a_peer_whose_join_claims_a_device_it_never_enrolls_fails_every_rank_before_any_bind() {
    // Rank 1 says it brings devices 1 and 2; it enrolls device 1 only. The
    // ranks then disagree on the team size (3 and 2): no rank may call the
    // team complete on that word.
    let lie = join_of(&[1, 2]);
    let model = Model::fabric(FabricConfig::nodes(1, 4));
    for r in bring_up_with_a_lie(&model, true, lie) {
        let e = r.expect_err("a TeamError on every rank");
        assert_eq!(e.step, Step::Enroll, "{e}");
        assert!(
            matches!(
                e.cause,
                team::Cause::Mismatch(team::Mismatch::Report { .. })
            ),
            "{e}"
        );
        assert_eq!(e.rank, 1, "{e}");
    }
    assert_eq!(model.calls(Call::MulticastBindMem), 0);
    common::fabric_clean(&model);
}

#[test]
fn on_logical_endpoints_the_same_lie_fails_every_rank_before_its_timeout_with_nothing_left() {
    let lie = join_of(&[1, 2]);
    let model = Model::fabric(FabricConfig::nodes(1, 4));
    for r in bring_up_with_a_lie(&model, false, lie) {
        r.expect_err("a TeamError on every rank");
    }
    common::fabric_clean(&model);
}

#[test]
fn r4_2_two_ranks_of_a_node_bringing_one_device_fail_at_join_before_the_driver() {
    for classic in [true, false] {
        let model = Model::fabric(FabricConfig::nodes(1, 4));
        let ms = [model.clone(), model.spawn_process_on(0).unwrap()];
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ms
                .iter()
                .zip(Threads::new(2))
                .map(|(m, boot)| {
                    s.spawn(move || {
                        let ctx = if classic {
                            Context::new(Classic::new(Arc::new(m.clone())))
                        } else {
                            Context::new(m.clone())
                        };
                        let spec = TeamSpec::new([Device(0)], MIB2).timeout(T);
                        team::multicast(&ctx, &boot, &spec).map(drop)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in out {
            let e = r.expect_err("a TeamError on every rank");
            assert_eq!(e.step, Step::Hello, "{e}");
            assert_eq!(e.rank, 1, "{e}");
            assert!(
                matches!(
                    e.cause,
                    team::Cause::Mismatch(team::Mismatch::SameDevice {
                        device: 0,
                        other_rank: 0
                    })
                ),
                "{e}"
            );
        }
        // Before the driver: nothing was created.
        assert_eq!(model.calls(Call::MulticastCreate), 0);
        assert_eq!(model.calls(Call::Create), 0);
        common::fabric_clean(&model);
    }
}

#[test]
fn r12_5_a_device_another_process_added_to_a_shared_classic_object_is_the_drivers_refusal() {
    // As on logical endpoints: this process cannot know another's
    // enrollment, so the model answers as the driver does, no violation; a
    // device this process added twice is a rule broken (C3/R4.2).
    let model = Model::fabric(FabricConfig::nodes(1, 2));
    let p2 = model.spawn_process_on(0).unwrap();
    let (d1, d2): (
        &dyn cuda_endpoints::driver::Driver,
        &dyn cuda_endpoints::driver::Driver,
    ) = (&model, &p2);
    // SAFETY: the test owns every handle it names; the last add breaks a
    // rule on purpose.
    unsafe {
        let mc = d1.multicast_create(2, MIB2, 1).unwrap();
        let shared = d1.mem_export(mc, ShareableKind::PosixFd).unwrap();
        let mc2 = d2.mem_import(shared).unwrap();
        d1.multicast_add_device(mc, Device(0)).unwrap();
        assert_eq!(
            d2.multicast_add_device(mc2, Device(0)),
            Err(Code::INVALID_VALUE)
        );
        assert!(model.violations().is_empty(), "{:?}", model.violations());
        assert_eq!(
            d1.multicast_add_device(mc, Device(0)),
            Err(Code::INVALID_VALUE)
        );
        d2.mem_release(mc2).unwrap();
        d1.mem_release(mc).unwrap();
        if let cuda_endpoints::driver::ShareableHandle::PosixFd(fd) = shared {
            drop(<std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd));
        }
    }
    let v = model.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].rule, "C3");
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

//! Unicast endpoints on the classic fallback (`driver::Classic`) for the
//! portable data path (issue 19, item 7's setting: a 13.0 driver whose
//! devices do *not* report `MULTICAST_SUPPORTED`, as the lent H200): they
//! are process-local bookkeeping, so the whole unicast lifecycle, export and
//! import included, makes no `cuLogicalEndpoint*` call and no `cuMulticast*`
//! call at all, and the bytes move only by `cuMemcpyAsync` through windows.
//! Every byte is checked, the model's violation log stays empty and nothing
//! leaks, in one process and across two model processes sharing memory by
//! POSIX descriptor.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use cuda_endpoints::bootstrap::Threads;
use cuda_endpoints::driver::{Classic, Family, Traced};
use cuda_endpoints::model::{FabricConfig, Model, ModelConfig};
use cuda_endpoints::team::{self, PeerSpec};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, CopyPath, Error, Mapped, PosixFd, Spec, Stream, driver::Call,
    error::Feature,
};

use common::portable::pattern;

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// The lent H200's driver on the model: 13.0, no logical endpoints, no
/// classic multicast (attribute 132 = 0).
fn h200_like(devices: usize) -> ModelConfig {
    let mut c = ModelConfig::cuda_13_0(devices);
    c.driver_version = 13000;
    c
}

/// The classic fallback over a traced `model`: the context and the trace of
/// what reached the model.
fn classic_over(model: &Model) -> (Context, Arc<Traced<Model>>) {
    let traced = Arc::new(Traced::new(model.clone()));
    (Context::new(Classic::new(traced.clone())), traced)
}

/// Nothing but VMM, base and stream calls reached the driver: no
/// `cuLogicalEndpoint*`, no `cuMulticast*` (in particular no
/// `cuMulticastCreate`), no fabric copy.
#[track_caller]
fn only_portable_calls(t: &Traced<Model>) {
    let calls = t.calls();
    assert!(!calls.is_empty());
    for c in &calls {
        assert_ne!(
            c.family(),
            Family::LogicalEndpoint,
            "{c} reached the driver"
        );
        assert!(
            !c.name().starts_with("cuMulticast"),
            "{c} reached the driver"
        );
        assert_ne!(*c, Call::FabricCpyBatchAsync);
    }
    assert!(!t.reached(Call::MulticastCreate));
}

fn mapped_fd(ctx: &Context, dev: i32) -> Mapped<PosixFd> {
    common::mapped(ctx, dev, ALIGN)
}

#[test]
fn classic_unicast_put_and_get_in_one_process_move_every_byte_through_cu_memcpy_async() {
    let model = Model::new(h200_like(1));
    let (ctx, trace) = classic_over(&model);
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(ep.bind_alignment(), ALIGN); // the VMM granularity
    let owner = mapped_fd(&ctx, 0);
    let bound = ep.bind(0, ALIGN, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let bytes = pattern(1, 65536);
    let offset = ALIGN + 4096;
    stream
        .enqueue(CopyBatch::new().put_host(bytes.clone(), &ep, offset))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(owner.device_ptr() + 4096, 65536).unwrap(), bytes);
    let got = stream
        .enqueue(CopyBatch::new().get_host(&ep, offset + 3, 1000))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got.received, vec![bytes[3..1003].to_vec()]);
    assert_eq!(trace.count(Call::MemcpyAsync), 2);
    // Nothing bound below ALIGN: no window, refused before the driver.
    let e = stream
        .enqueue(CopyBatch::new().put_host(vec![1; 64], &ep, 0))
        .unwrap_err();
    assert!(
        matches!(e, Error::CopyNotBound { .. } | Error::CopyNoWindow { .. }),
        "{e}"
    );
    // The fabric copy stays refused on this backend, before the driver.
    ctx.set_copy_path(CopyPath::Fabric);
    let e = stream
        .enqueue(CopyBatch::new().put_host(vec![1; 64], &ep, offset))
        .unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    ctx.set_copy_path(CopyPath::Portable);
    drop(stream);
    bound.unbind().unwrap();
    ep.destroy().unwrap().release().unwrap();
    drop(owner);
    only_portable_calls(&trace);
    common::clean(&ctx, &model);
}

#[test]
fn classic_unicast_refuses_counted_ops_and_memory_on_another_device() {
    let model = Model::new(h200_like(2));
    let (ctx, trace) = classic_over(&model);
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN).counted_ops())
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::FeatureMissing { attribute: 155, .. }
                | Error::Unsupported {
                    feature: Feature::UnicastOnClassic,
                    ..
                }
        ),
        "{}",
        e.error
    );
    let ep = e
        .value
        .create(Spec::unicast(1, ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    // R5.5: memory of device 0 on an endpoint owned by device 1.
    let elsewhere = Allocation::<PosixFd>::on_device(&ctx, 0, ALIGN).unwrap();
    let e = ep.bind(1, 0, &elsewhere).unwrap_err();
    assert!(matches!(e, Error::MemoryOnWrongDevice { .. }), "{e}");
    // R5.2: only the owner binds.
    let e = ep.bind(0, 0, &elsewhere).unwrap_err();
    assert!(matches!(e, Error::WrongDevice { .. }), "{e}");
    // By handle, the record is the binding; dropped with the endpoint.
    let mine = Allocation::<PosixFd>::on_device(&ctx, 1, ALIGN).unwrap();
    std::mem::forget(ep.bind(1, 0, &mine).unwrap());
    drop(mine); // kept alive by the endpoint (R7.2)
    assert_eq!(model.live().allocations, 2);
    ep.destroy().unwrap().release().unwrap();
    drop(elsewhere);
    only_portable_calls(&trace);
    common::clean(&ctx, &model);
}

#[test]
fn two_classic_processes_put_into_and_get_from_each_other_through_posix_fd_windows() {
    let a = Model::fabric(FabricConfig::single(h200_like(1)));
    let b = a.spawn_process();
    // Both processes on GPU 0, as on the lent H200.
    let (ca, ta) = classic_over(&a);
    let (cb, tb) = classic_over(&b);
    common::portable::put_and_get_through_posix_fd_windows([&a, &b], [(&ca, 0), (&cb, 0)]);
    for (ctx, trace) in [(ca, ta), (cb, tb)] {
        assert!(ctx.take_teardown_errors().is_empty());
        assert!(trace.count(Call::MemcpyAsync) >= 2);
        only_portable_calls(&trace);
    }
    assert!(a.live().is_empty() && b.live().is_empty());
    common::fabric_idle(&a);
}

#[test]
fn unicast_peers_come_up_on_the_classic_fallback_and_copy_through_windows() {
    let root = Model::new(h200_like(2));
    let procs = [root.clone(), root.spawn_process()];
    // The bring-up on every rank (a thread each, one simulated process each).
    let ranks: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = procs
            .iter()
            .zip(Threads::new(2))
            .enumerate()
            .map(|(rank, (m, boot))| {
                s.spawn(move || {
                    let (ctx, trace) = classic_over(m);
                    let spec = PeerSpec::new(rank as i32, ALIGN).timeout(T);
                    let peers = team::unicast_peers(&ctx, &boot, &spec)
                        .expect("bring-up on the classic fallback");
                    (ctx, trace, peers, boot)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    let mems: Vec<_> = ranks
        .iter()
        .enumerate()
        .map(|(r, (ctx, _, _, _))| mapped_fd(ctx, r as i32))
        .collect();
    let bindings: Vec<_> = ranks
        .iter()
        .zip(&mems)
        .enumerate()
        .map(|(r, ((_, _, p, _), m))| p.own().bind(r as i32, 0, m).unwrap())
        .collect();
    // Every rank bound: the ranks agree on it (R13.3) before any copy, and
    // pass their `PosixFd` memory's descriptors (one node), which makes
    // every peer's window here: no `add_peer_window`.
    let node = cuda_endpoints::bootstrap::NodeId::current().unwrap();
    let agreed: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|(_, _, peers, boot)| {
                let node = &node;
                s.spawn(move || {
                    peers
                        .agree_bound_fds(boot, node, T)
                        .expect("every rank bound")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    for (me, ((ctx, _, _, _), peers)) in ranks.iter().zip(&agreed).enumerate() {
        let other = 1 - me;
        let ep = peers.peer(other).expect("the peer's endpoint");
        let stream = Stream::new(ctx, me as i32).unwrap();
        let bytes = pattern(20 + me as u8, 8192);
        let got = stream
            .enqueue(CopyBatch::new().put_host(bytes.clone(), ep, 512))
            .unwrap()
            .wait()
            .unwrap();
        drop(got);
        assert_eq!(
            procs[other]
                .read(mems[other].device_ptr() + 512, 8192)
                .unwrap(),
            bytes
        );
        let got = stream
            .enqueue(CopyBatch::new().get_host(ep, 512, 8192))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got.received, vec![bytes]);
    }
    drop(agreed);
    drop(bindings);
    drop(mems);
    for (ctx, trace, peers, _) in ranks {
        drop(peers);
        only_portable_calls(&trace);
        assert!(ctx.take_teardown_errors().is_empty());
    }
    assert!(root.live_node().is_empty(), "{:?}", root.live_node());
    assert!(root.violations().is_empty(), "{:?}", root.violations());
}

/// The two-GPU H200's driver on the model: 13.0, and every device reports
/// classic multicast (attribute 132 = 1), so that only the policy stands
/// between `Context::auto` and `cuMulticastCreate`.
fn h200_pair_like(devices: usize) -> ModelConfig {
    h200_like(devices).with_devices(|_, d| d.classic_multicast = true)
}

/// `Context::auto` over a traced `model` with the default policy (classic
/// multicast not opted in) for a team on `team`: the context, the trace,
/// and the decision, checked to be the classic emulation without multicast.
fn auto_over(model: &Model, team: &[i32]) -> (Context, Arc<Traced<Model>>) {
    use cuda_endpoints::backend::{BackendChoice, Policy};
    let traced = Arc::new(Traced::new(model.clone()));
    let team: Vec<_> = team.iter().map(|&d| d.into()).collect();
    let (ctx, d) = Context::auto(traced.clone(), &team, &Policy::new()).unwrap();
    assert_eq!(d.unicast, BackendChoice::Classic, "{d}");
    assert!(
        matches!(&d.choice, BackendChoice::Unsupported(why) if why.contains("13.3") && why.contains("switched off")),
        "{d}"
    );
    assert!(d.to_string().contains("13.0 (13000)"), "{d}");
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
    assert!(ctx.backend_name().starts_with("classic"), "{ctx:?}");
    (ctx, traced)
}

/// Issue 28, item 1: on a 13.0 driver, `Context::auto` alone gives two
/// processes unicast endpoints and copies that work (each puts into and
/// gets from the other's endpoint through `PosixFd` windows), with no
/// `cuMulticast*` call, although every device reports classic multicast.
#[test]
fn context_auto_on_a_13_0_driver_gives_two_processes_unicast_endpoints_and_copies() {
    let a = Model::fabric(FabricConfig::single(h200_pair_like(2)));
    let b = a.spawn_process();
    let (ca, ta) = auto_over(&a, &[0, 1]);
    let (cb, tb) = auto_over(&b, &[]);
    common::portable::put_and_get_through_posix_fd_windows([&a, &b], [(&ca, 0), (&cb, 1)]);
    for (ctx, trace) in [(ca, ta), (cb, tb)] {
        assert!(ctx.take_teardown_errors().is_empty());
        assert!(trace.count(Call::MemcpyAsync) >= 2);
        only_portable_calls(&trace);
    }
    assert!(a.live().is_empty() && b.live().is_empty());
    common::fabric_idle(&a);
}

/// Issue 28, item 1: on a 13.0 driver a multicast team fails on every rank
/// with one error naming 13.3 and the driver's version, before any
/// `cuMulticast*` call — on `Context::auto`'s context (classic multicast not
/// opted in; in one process too) and on the bare driver (the bring-up's
/// probe: before, "rank 0 cannot export a trial logical endpoint (unknown
/// CUresult …)").
#[test]
fn a_team_on_a_13_0_driver_fails_every_rank_with_one_error_naming_13_3_and_the_version() {
    let root = Model::new(h200_pair_like(2));
    let procs = [root.clone(), root.spawn_process()];
    for how in ["auto", "bare"] {
        let errors: Vec<(String, Arc<Traced<Model>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = procs
                .iter()
                .zip(Threads::new(2))
                .enumerate()
                .map(|(rank, (m, boot))| {
                    s.spawn(move || {
                        let dev = rank as i32;
                        let (ctx, trace) = match how {
                            "auto" => auto_over(m, &[dev]),
                            _ => {
                                let t = Arc::new(Traced::new(m.clone()));
                                (Context::new(t.clone()), t)
                            }
                        };
                        let spec = team::TeamSpec::new([dev], ALIGN).timeout(T);
                        let e = team::multicast(&ctx, &boot, &spec)
                            .expect_err("no multicast team on a 13.0 driver by default");
                        assert!(ctx.take_teardown_errors().is_empty());
                        (e.to_string(), trace)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread panicked"))
                .collect()
        });
        let first = &errors[0].0;
        for (text, trace) in &errors {
            assert_eq!(text, first, "{how}: every rank, one error");
            assert!(!trace.reached(Call::MulticastCreate), "{how}");
            assert_eq!(trace.count(Call::MulticastCreate), 0, "{how}");
        }
        assert!(
            first.contains("13.3") && first.contains("13000"),
            "{how}: {first}"
        );
        println!("{how}: {first}");
    }
    // One process: a team on `Context::auto`'s context is refused at create.
    let (ctx, trace) = auto_over(&root, &[0, 1]);
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[0.into(), 1.into()], ALIGN))
        .unwrap_err();
    let text = f.error.to_string();
    assert!(
        matches!(
            f.error,
            Error::Unsupported {
                feature: Feature::MulticastTeam,
                driver_version: Some(13000),
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains("13.3") && text.contains("opt"), "{text}");
    f.value.release().unwrap();
    assert!(!trace.reached(Call::MulticastCreate));
    drop(ctx);
    assert!(root.live_node().is_empty(), "{:?}", root.live_node());
    assert!(root.violations().is_empty(), "{:?}", root.violations());
}

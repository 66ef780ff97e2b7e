//! Concurrency: one thread per device binding and unbinding on the same
//! ready multicast endpoint, threads racing for overlapping ranges of one
//! device, many threads creating endpoints from one split range, bindings
//! made on one thread and unbound on another, teardown errors recorded from
//! many threads at once. The model is thread-safe (one mutex), the typed
//! API serialises binds of one endpoint on its bookkeeping lock, so the
//! model never sees a rule violation and nothing leaks.
//!
//! The thread-safety facts these tests rely on are asserted at compile time.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the threads call
//! the real backend, which switches each thread's current context in the
//! libcuda test double; the many-importers test (several simulated
//! processes) stays on the model.

use crate::backend;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use backend::{F, Inspect};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::typenum::{U0, U2};
use cuda_endpoints::{
    Allocation, Binding, Context, Device, Endpoint, Error, Exportable, FabricHandle, Failed,
    IdRange, ImportedMulticast, Mapped, Multicast, NoKind, Pending, PosixFd, Private, Readiness,
    Ready, Reserved, Spec, SpreadTeam, Team, Unicast,
    driver::{Call, Code},
};
use static_assertions::{assert_impl_all, assert_not_impl_any};

// What crosses threads, and what does not.
assert_impl_all!(Context: Send, Sync, Clone);
assert_impl_all!(Model: Send, Sync, Clone);
assert_impl_all!(IdRange: Send, Sync);
assert_impl_all!(Endpoint<Reserved, NoKind>: Send, Sync);
assert_impl_all!(Endpoint<Pending, Team<U2, U0>>: Send, Sync);
assert_impl_all!(Endpoint<Pending, SpreadTeam>: Send, Sync);
assert_impl_all!(Endpoint<Ready, Multicast>: Send, Sync);
assert_impl_all!(Endpoint<Ready, Multicast<Exportable>>: Send, Sync);
assert_impl_all!(Endpoint<Ready, ImportedMulticast>: Send, Sync);
assert_impl_all!(Endpoint<Ready, Unicast>: Send, Sync);
assert_impl_all!(Binding<'static>: Send, Sync);
assert_impl_all!(Allocation<Private>: Send, Sync);
assert_impl_all!(Mapped<PosixFd>: Send, Sync);
assert_impl_all!(FabricHandle<Multicast<Exportable>>: Send, Sync, Clone);
assert_impl_all!(Readiness<Unicast>: Send, Sync);
assert_impl_all!(Error: Send, Sync, Clone, std::error::Error);
assert_impl_all!(Failed<Endpoint<Pending, Multicast>>: Send, Sync, std::error::Error);
assert_not_impl_any!(Endpoint<Ready, Multicast>: Clone, Copy);
assert_not_impl_any!(Binding<'static>: Clone, Copy);
assert_not_impl_any!(Allocation<Private>: Clone, Copy);
assert_not_impl_any!(Mapped<Private>: Clone, Copy);
assert_not_impl_any!(IdRange: Clone, Copy);

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

fn clean(ctx: &Context, model: &impl Inspect) {
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

fn team(ctx: &Context, n: i32, per_device: u64) -> Endpoint<Ready, Multicast> {
    let devs: Vec<Device> = (0..n).map(Device).collect();
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs, per_device))
        .unwrap()
        .wait(T)
        .unwrap()
}

/// One thread per team device, each binding and unbinding its own memory
/// at every offset of the endpoint, many times, all at once.
#[test]
fn one_thread_per_device_binds_and_unbinds_on_one_endpoint() {
    let (ctx, model) = backend::context(ModelConfig::node(4));
    let ep = team(&ctx, 4, 8 * ALIGN);
    let mems: Vec<_> = (0..4)
        .map(|d| Allocation::<Private>::on_device(&ctx, Device(d), 2 * ALIGN).unwrap())
        .collect();
    let done = AtomicU64::new(0);
    let go = Barrier::new(4);
    std::thread::scope(|s| {
        for (d, mem) in mems.iter().enumerate() {
            let (ep, done, go) = (&ep, &done, &go);
            s.spawn(move || {
                go.wait();
                for round in 0..200u64 {
                    let off = (round % 4) * 2 * ALIGN;
                    let b = ep.bind(d as i32, off, mem).unwrap();
                    assert_eq!((b.device(), b.offset()), (Device(d as i32), off));
                    if round % 2 == 0 {
                        b.unbind().unwrap();
                    } else {
                        drop(b);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(done.load(Ordering::Relaxed), 800);
    assert_eq!(model.calls(Call::BindMem), 800);
    assert_eq!(model.calls(Call::Unbind), 800);
    drop((ep, mems));
    clean(&ctx, &model);
}

/// Threads race for overlapping ranges of one device: the pre-driver
/// overlap check (R5.9) sees every live binding, so each race has winners
/// and typed `Overlap` losers, never a violation in the driver.
#[test]
fn threads_racing_for_overlapping_ranges_of_one_device() {
    let (ctx, model) = backend::context(ModelConfig::node(2));
    let ep = team(&ctx, 2, 4 * ALIGN);
    let mems: Vec<_> = (0..8)
        .map(|_| Allocation::<Private>::on_device(&ctx, Device(0), 2 * ALIGN).unwrap())
        .collect();
    let (won, lost) = (AtomicU64::new(0), AtomicU64::new(0));
    let go = Barrier::new(mems.len());
    std::thread::scope(|s| {
        for (t, mem) in mems.iter().enumerate() {
            let (ep, won, lost, go) = (&ep, &won, &lost, &go);
            s.spawn(move || {
                go.wait();
                for round in 0..150u64 {
                    // Offsets 0, ALIGN, 2*ALIGN: 2-ALIGN bindings overlap.
                    let off = ((t as u64 + round) % 3) * ALIGN;
                    match ep.bind(0, off, mem) {
                        Ok(b) => {
                            won.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                            drop(b);
                        }
                        Err(Error::Overlap { .. }) => {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    let (won, lost) = (won.into_inner(), lost.into_inner());
    assert_eq!(won + lost, 8 * 150);
    assert!(won > 0);
    assert_eq!(
        model.calls(Call::BindMem),
        won,
        "losers never reached the driver"
    );
    drop((ep, mems));
    clean(&ctx, &model);
}

/// A range of 64 ids split over 8 threads; each makes its endpoints ready,
/// binds, unbinds, destroys and releases or drops them. The range is
/// released once, by whichever thread lets go of its last id.
#[test]
fn many_threads_create_endpoints_from_one_split_range() {
    let (ctx, model) = backend::context(ModelConfig::node(4).queries_to_ready(3));
    let mut eps = ctx.reserve(64).unwrap().into_endpoints();
    let chunks: Vec<Vec<Endpoint<Reserved>>> = (0..8).map(|_| eps.drain(..8).collect()).collect();
    std::thread::scope(|s| {
        for (t, chunk) in chunks.into_iter().enumerate() {
            let ctx = ctx.clone();
            s.spawn(move || {
                let dev = Device(t as i32 % 4);
                let mem = Allocation::<Private>::on_device(&ctx, dev, ALIGN).unwrap();
                for (i, ep) in chunk.into_iter().enumerate() {
                    if i % 2 == 0 {
                        let ready = ep
                            .create(Spec::unicast(dev, ALIGN))
                            .unwrap()
                            .wait(T)
                            .unwrap();
                        ready.bind(dev, 0, &mem).unwrap().unbind().unwrap();
                        let id = ready.destroy().unwrap();
                        if i % 4 == 0 {
                            id.release().unwrap();
                        }
                    } else {
                        let mut p = ep
                            .create(Spec::team(U2::new(), ALIGN))
                            .unwrap()
                            .add_device(dev)
                            .unwrap()
                            .add_device(Device((dev.0 + 1) % 4))
                            .unwrap();
                        let ready = loop {
                            match p.poll().unwrap() {
                                Readiness::Ready(r) => break r,
                                Readiness::Pending(q) => p = q,
                            }
                        };
                        let b = ready.bind(dev, 0, &mem).unwrap();
                        std::mem::forget(b); // destroy (on drop) unbinds it
                    }
                }
            });
        }
    });
    assert_eq!(model.calls(Call::IdRelease), 1);
    clean(&ctx, &model);
}

/// Pending endpoints waited for together from one thread while other
/// threads create and destroy on other ids of the same range.
#[test]
fn wait_all_while_other_threads_use_the_same_range() {
    let (ctx, model) = backend::context(ModelConfig::node(4).queries_to_ready(2));
    let mut eps = ctx.reserve(32).unwrap().into_endpoints();
    let mine: Vec<_> = eps
        .drain(..16)
        .map(|e| e.create(Spec::unicast(0, ALIGN)).unwrap())
        .collect();
    std::thread::scope(|s| {
        s.spawn(move || {
            let ready = cuda_endpoints::wait_all(mine, T).unwrap();
            assert_eq!(ready.len(), 16);
        });
        let others: Vec<Vec<_>> = (0..4).map(|_| eps.drain(..4).collect()).collect();
        for chunk in others {
            s.spawn(move || {
                for e in chunk {
                    let r = e.create(Spec::multicast(&[Device(1)], ALIGN)).unwrap();
                    r.wait(T).unwrap().destroy().unwrap().release().unwrap();
                }
            });
        }
    });
    clean(&ctx, &model);
}

/// A binding is `Send`: made on one thread, unbound on another.
#[test]
fn a_binding_made_on_one_thread_is_unbound_on_another() {
    let (ctx, model) = backend::context(ModelConfig::node(2));
    let ep = team(&ctx, 2, 2 * ALIGN);
    let mem = Allocation::<Private>::on_device(&ctx, Device(1), ALIGN).unwrap();
    let b = ep.bind(1, ALIGN, &mem).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || b.unbind().unwrap()).join().unwrap();
    });
    assert_eq!(model.live().bindings, 0);
    drop((ep, mem));
    clean(&ctx, &model);
}

/// Exporting on one thread, importing in another process on others.
#[test]
fn importers_on_many_threads() {
    let (ctx, model) = Context::model(ModelConfig::node(2));
    let x = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let wire = x.export().unwrap().to_bytes();
    // One process per thread (one attachment per process at a time, R9),
    // plus threads sharing one process, of which one attaches at a time.
    let peers: Vec<Arc<Context>> = (0..6)
        .map(|_| Arc::new(Context::new(model.spawn_process())))
        .collect();
    let shared = Arc::new(Context::new(model.spawn_process()));
    std::thread::scope(|s| {
        for peer in &peers {
            let peer = peer.clone();
            s.spawn(move || {
                let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire).unwrap();
                for _ in 0..20 {
                    let imp = peer.reserve_one().unwrap().import(&h).unwrap();
                    drop(imp.wait(T).unwrap());
                }
            });
        }
        for _ in 0..3 {
            let shared = shared.clone();
            s.spawn(move || {
                let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire).unwrap();
                for _ in 0..20 {
                    match shared.reserve_one().unwrap().import(&h) {
                        Ok(imp) => drop(imp.wait(T).unwrap()),
                        Err(f) => assert!(matches!(f.error, Error::AlreadyAttached { .. })),
                    }
                }
            });
        }
    });
    drop(x);
    for peer in &peers {
        assert!(peer.take_teardown_errors().is_empty());
    }
    assert!(shared.take_teardown_errors().is_empty());
    clean(&ctx, &model);
}

/// Teardown errors from many threads at once are all recorded.
#[test]
fn teardown_errors_from_many_threads_are_all_recorded() {
    let (ctx, model) = backend::context(ModelConfig::node(4));
    let ep = team(&ctx, 4, 4 * ALIGN);
    let mems: Vec<_> = (0..4)
        .map(|d| Allocation::<Private>::on_device(&ctx, Device(d), ALIGN).unwrap())
        .collect();
    model.set_faults(&[F::always(Call::Unbind, Code::NOT_PERMITTED)]);
    std::thread::scope(|s| {
        for (d, mem) in mems.iter().enumerate() {
            let ep = &ep;
            s.spawn(move || {
                for k in 0..4 {
                    drop(ep.bind(d as i32, k * ALIGN, mem).unwrap());
                }
            });
        }
    });
    let errors = ctx.take_teardown_errors();
    assert_eq!(errors.len(), 16);
    assert!(
        errors
            .iter()
            .all(|e| *e == Error::driver(Call::Unbind, Code::NOT_PERMITTED))
    );
    // Still bound, so kept; destroy unbinds all of them and frees the memory.
    assert_eq!(model.live().bindings, 16);
    model.set_faults(&[]);
    drop(ep);
    drop(mems);
    clean(&ctx, &model);
}

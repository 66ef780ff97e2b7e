//! Locks held across user code (issue 11, item 2): a `tracing` layer runs
//! inside every driver call of `Traced`, and may call back into the crate.
//! Neither the typed layer nor the classic fallback (its team export and
//! import included) may hold a lock of theirs across the driver call: each
//! test fails on a deadlock instead of hanging (`common::layer::within`,
//! or a `watchdog` guard).

use crate::common;
use crate::watchdog;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::layer::{EventFields, OnEvent, within};
use cuda_endpoints::driver::{Classic, Traced};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Allocation, Context, Device, Private, Spec, driver::Call};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// One scoped subscriber at a time in this binary: two on concurrent test
/// threads race on `tracing`'s per-callsite interest cache, and a layer
/// could miss the events it waits for.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn bind_holds_no_lock_across_the_driver_call_a_reentrant_layer_binds_the_same_endpoint() {
    let _serial = serial();
    within(20, || {
        let model = Model::new(ModelConfig::node(2));
        let ctx = Context::new(Traced::new(model.clone()));
        let team = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::multicast(&[Device(0), Device(1)], 2 * ALIGN))
            .unwrap()
            .wait(T)
            .unwrap();
        let team = Arc::new(team);
        let m0 = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
        let m1 = Arc::new(Allocation::<Private>::on_device(&ctx, Device(1), ALIGN).unwrap());
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = {
            let (team, m1, seen) = (team.clone(), m1.clone(), seen.clone());
            OnEvent(move |e: &EventFields| {
                if e.succeeded() == Some(Call::BindMem) && seen.fetch_add(1, Ordering::SeqCst) == 0
                {
                    // Inside the first bind's driver call: read the endpoint,
                    // and bind (then unbind) another device of it.
                    assert_eq!(team.size(), 2 * ALIGN);
                    let b = team.bind(1, ALIGN, &*m1).unwrap();
                    assert_eq!(b.size(), ALIGN);
                }
            })
        };
        tracing::subscriber::with_default(layer, || {
            team.bind(0, 0, &m0).unwrap().unbind().unwrap();
        });
        assert!(seen.load(Ordering::SeqCst) >= 1);
        let team = Arc::into_inner(team).expect("the layer's clone is gone");
        team.destroy().unwrap().release().unwrap();
        drop((m0, m1));
        common::clean(&ctx, &model);
    });
}

#[test]
fn classic_holds_no_table_lock_across_inner_calls_a_reentrant_layer_reads_it() {
    let _serial = serial();
    within(20, || {
        let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
        let model = Model::new(cfg);
        let classic = Arc::new(Classic::new(Arc::new(Traced::new(model.clone()))));
        let ctx = Context::new(classic.clone());
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = {
            let (classic, seen) = (classic.clone(), seen.clone());
            OnEvent(move |e: &EventFields| {
                if e.call
                    .as_deref()
                    .is_some_and(|c| c.starts_with("cuMulticast"))
                {
                    // Takes the table lock: a deadlock if it is held.
                    let _ = classic.live_multicast_objects();
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        tracing::subscriber::with_default(layer, || {
            let team = ctx
                .reserve_one()
                .unwrap()
                .create(Spec::multicast(&[Device(0), Device(1)], 2 * ALIGN))
                .unwrap()
                .wait(T)
                .unwrap();
            let m0 = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
            let m1 = Allocation::<Private>::on_device(&ctx, Device(1), ALIGN).unwrap();
            let b0 = team.bind(0, 0, &m0).unwrap();
            let _b1 = team.bind(1, ALIGN, &m1).unwrap();
            b0.unbind().unwrap();
            // `_b1` is unbound by the destroy below (R7), through the table.
            std::mem::forget(_b1);
            team.destroy().unwrap().release().unwrap();
        });
        // Create, two adds, two binds, unbinds: all seen from the layer.
        assert!(seen.load(Ordering::SeqCst) >= 6, "{seen:?}");
        drop(ctx);
        assert_eq!(classic.live_multicast_objects(), 0);
        assert!(model.live().is_empty(), "{:?}", model.live());
        assert!(model.violations().is_empty(), "{:?}", model.violations());
    });
}

/// The classic export and import of the team bring-up (C5) record what they
/// do under the table lock and call the inner driver without it: a layer
/// that reads the table from inside `cuMemExportToShareableHandle` and
/// `cuMemImportFromShareableHandle` does not deadlock.
#[test]
fn classic_export_and_import_of_the_bring_up_hold_no_table_lock_across_inner_calls() {
    use cuda_endpoints::bootstrap::Bootstrap;
    use cuda_endpoints::bootstrap::Threads;
    use cuda_endpoints::driver::ShareableKind;
    use cuda_endpoints::model::FabricConfig;
    use cuda_endpoints::team::{self, TeamSpec};
    let _serial = serial();
    within(30, || {
        let model = Model::fabric(FabricConfig::nodes(1, 2));
        let ranks: Vec<(Model, Arc<Classic>)> = (0..2)
            .map(|r| {
                let m = if r == 0 {
                    model.clone()
                } else {
                    model.spawn_process_on(0).unwrap()
                };
                let classic = Arc::new(Classic::new(Arc::new(Traced::new(m.clone()))));
                (m, classic)
            })
            .collect();
        let seen = Arc::new(AtomicUsize::new(0));
        let boots = Threads::new(2);
        std::thread::scope(|s| {
            for (r, ((m, classic), boot)) in ranks.iter().zip(boots).enumerate() {
                let seen = seen.clone();
                s.spawn(move || {
                    let layer = {
                        let classic = classic.clone();
                        OnEvent(move |e: &EventFields| {
                            if matches!(
                                e.succeeded(),
                                Some(
                                    Call::MemExportToShareableHandle
                                        | Call::MemImportFromShareableHandle
                                )
                            ) {
                                // Takes the table lock: a deadlock if it is held.
                                let _ = classic.live_multicast_objects();
                                seen.fetch_add(1, Ordering::SeqCst);
                            }
                        })
                    };
                    let ctx = Context::new(classic.clone());
                    let dev = Device(r as i32);
                    let spec = TeamSpec::new([dev], ALIGN)
                        .timeout(T)
                        .classic_handles(ShareableKind::PosixFd);
                    let team = tracing::subscriber::with_default(layer, || {
                        team::multicast(&ctx, &boot, &spec)
                    })
                    .unwrap();
                    boot.barrier(T).unwrap();
                    drop(team);
                    assert!(ctx.take_teardown_errors().is_empty());
                    assert!(m.live().is_empty(), "rank {r} leaked {:?}", m.live());
                });
            }
        });
        // The root's export and the other rank's import, both seen.
        assert!(seen.load(Ordering::SeqCst) >= 2, "{seen:?}");
        common::fabric_idle(&model);
    });
}

/// F4 through an event: an event completes the batches enqueued before its
/// record, never one another thread enqueued while `Event::record` was in
/// its driver call. Here a layer holds the record's call until another
/// thread enqueued a copy from `src` (its token forgotten) and dropped
/// `src`; observing the event must not let the stream's hold on `src` go,
/// so the copy still reads live memory and lands.
#[test]
fn an_event_never_completes_a_batch_enqueued_during_its_record() {
    let _serial = serial();
    within(30, || {
        a_batch_enqueued_during(
            Call::EventRecord,
            |ctx, stream| {
                let mut event = cuda_endpoints::Event::new(ctx, 0).unwrap();
                event.record(stream).unwrap();
                event
            },
            |event| event.synchronize().unwrap(),
        );
    });
}

/// The stream-wide form of the rule above: `Stream::synchronize` and a
/// `Stream::query` that answers `true` let go of what the batches enqueued
/// before the call use, never of a batch another thread enqueued while
/// the call was in the driver (its memory must outlive its copy).
#[test]
fn a_stream_synchronize_or_query_never_completes_a_batch_enqueued_during_it() {
    let _serial = serial();
    for (call, observe) in [
        (
            Call::StreamSynchronize,
            (|s: &cuda_endpoints::Stream| s.synchronize().map(drop)) as fn(&_) -> _,
        ),
        (Call::StreamQuery, |s: &cuda_endpoints::Stream| {
            s.query().map(|done| assert!(done, "an empty stream"))
        }),
    ] {
        within(30, move || {
            a_batch_enqueued_during(call, |_, stream| observe(stream).unwrap(), |()| {});
        });
    }
}

/// The two tests above: a layer holds `call`, made by `observe` on a
/// stream, until another thread enqueued a copy from `src` on that stream
/// (its token forgotten); then `settle` waits on what `observe` answered,
/// `src` is dropped, and the copy must still read live memory and land.
fn a_batch_enqueued_during<R>(
    call: Call,
    observe: impl FnOnce(&Context, &cuda_endpoints::Stream) -> R,
    settle: impl FnOnce(&R),
) {
    let mut config = ModelConfig::node(1);
    config.driver_version = 13050;
    let model = Model::new(config);
    let ctx = Context::new(Traced::new(model.clone()));
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let owner = common::mapped::<Private>(&ctx, 0, ALIGN);
    let src = common::mapped::<Private>(&ctx, 0, ALIGN);
    model.write(src.device_ptr(), &[6; 64]).unwrap();
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = cuda_endpoints::Stream::new(&ctx, 0).unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, ack_rx) = (std::sync::Mutex::new(go_tx), std::sync::Mutex::new(ack_rx));
    let layer = OnEvent(move |e: &EventFields| {
        if e.succeeded() == Some(call) {
            let _ = go_tx.lock().unwrap().send(());
            let _ = ack_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
        }
    });
    let observed = std::thread::scope(|s| {
        let (b, ep, on, src) = (&b, &ep, &stream, &src);
        s.spawn(move || {
            go_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let through = b.copy_through(ep).unwrap();
            let t = on
                .enqueue(cuda_endpoints::CopyBatch::new().put(src, 0, through, 0, 64))
                .unwrap();
            std::mem::forget(t);
            ack_tx.send(()).unwrap();
        });
        tracing::subscriber::with_default(layer, || observe(&ctx, &stream))
    });
    settle(&observed);
    drop(src);
    stream.synchronize().unwrap();
    assert_eq!(model.read(owner.device_ptr(), 64).unwrap(), vec![6; 64]);
    drop((observed, stream, b));
    drop((ep, owner));
    common::clean(&ctx, &model);
}

/// A 13.5 node of two devices behind `Traced`, a ready unicast endpoint on
/// device 0 with memory bound, and a source: leaked, so that a layer (which
/// must be `'static`) can hold the binding or name the endpoint.
#[allow(clippy::type_complexity)]
fn leaked_bound_endpoint() -> (
    Model,
    Context,
    &'static cuda_endpoints::Endpoint<cuda_endpoints::Ready, cuda_endpoints::Unicast>,
    &'static cuda_endpoints::Mapped<Private>,
    cuda_endpoints::Binding<'static>,
) {
    let model = Model::new(ModelConfig {
        driver_version: 13050,
        ..ModelConfig::node(2)
    });
    let ctx = Context::new(Traced::new(model.clone()));
    let mapped = |ctx: &Context| -> &'static cuda_endpoints::Mapped<Private> {
        Box::leak(Box::new(
            Allocation::<Private>::on_device(ctx, Device(0), ALIGN)
                .unwrap()
                .map(&[Device(0)])
                .unwrap(),
        ))
    };
    let ep = Box::leak(Box::new(
        ctx.reserve_one()
            .unwrap()
            .create(Spec::unicast(0, ALIGN))
            .unwrap()
            .wait(T)
            .unwrap(),
    ));
    let (owner, src) = (mapped(&ctx), mapped(&ctx));
    let b = ep.bind(Device(0), 0, owner).unwrap();
    (model, ctx, ep, src, b)
}

#[test]
fn f4_an_unbind_from_another_thread_during_a_copys_enqueue_waits_for_it_and_settles_the_copy() {
    // The copy's driver call holds (a layer waits in it) while another
    // thread unbinds the memory the copy writes: the unbind must not reach
    // the driver before the copy is recorded in flight, and then completes
    // the copy before it unbinds.
    let _serial = serial();
    within(30, || {
        let (model, ctx, ep, src, b) = leaked_bound_endpoint();
        let stream = cuda_endpoints::Stream::new(&ctx, 0).unwrap();
        let inside = Arc::new(std::sync::Barrier::new(2));
        let unbound = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let unbinder = {
            let (inside, unbound) = (inside.clone(), unbound.clone());
            std::thread::spawn(move || {
                inside.wait();
                let r = b.unbind();
                unbound.store(true, Ordering::SeqCst);
                r
            })
        };
        let layer = OnEvent(move |e: &EventFields| {
            if e.succeeded() == Some(Call::FabricCpyBatchAsync) {
                inside.wait();
                // Long enough for an unbind that does not wait to finish.
                for _ in 0..50 {
                    if unbound.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        });
        let copy = tracing::subscriber::with_default(layer, || {
            stream.enqueue(cuda_endpoints::CopyBatch::new().put(src, 0, ep, 0, 4096))
        })
        .unwrap();
        unbinder.join().unwrap().unwrap();
        copy.wait().unwrap();
        assert!(model.violations().is_empty(), "{:?}", model.violations());
        assert!(ctx.take_teardown_errors().is_empty());
    });
}

#[test]
fn f4_a_layer_that_unbinds_inside_a_copys_enqueue_on_the_same_range_is_refused_not_deadlocked() {
    let _serial = serial();
    within(30, || {
        let (model, ctx, ep, src, b) = leaked_bound_endpoint();
        let stream = cuda_endpoints::Stream::new(&ctx, 0).unwrap();
        let held = std::sync::Mutex::new(Some(b));
        let got = Arc::new(std::sync::Mutex::new(None));
        let layer = {
            let got = got.clone();
            OnEvent(move |e: &EventFields| {
                if e.succeeded() == Some(Call::FabricCpyBatchAsync)
                    && let Some(b) = held.lock().unwrap().take()
                {
                    *got.lock().unwrap() = Some(b.unbind());
                }
            })
        };
        let copy = tracing::subscriber::with_default(layer, || {
            stream.enqueue(cuda_endpoints::CopyBatch::new().put(src, 0, ep, 0, 4096))
        })
        .unwrap();
        copy.wait().unwrap();
        let r = got.lock().unwrap().take().expect("the layer ran");
        match r {
            Err(e @ cuda_endpoints::Error::CopyUnbindReentered { .. }) => {
                assert!(e.to_string().contains("F4"), "{e}");
            }
            other => panic!("expected CopyUnbindReentered: {other:?}"),
        }
        assert!(model.violations().is_empty(), "{:?}", model.violations());
    });
}

#[test]
fn f4_a_layer_that_enqueues_a_copy_inside_an_unbind_on_the_same_range_is_refused_not_deadlocked() {
    let _serial = serial();
    within(30, || {
        let (model, ctx, ep, src, b) = leaked_bound_endpoint();
        let stream: &'static cuda_endpoints::Stream =
            Box::leak(Box::new(cuda_endpoints::Stream::new(&ctx, 0).unwrap()));
        let got = Arc::new(std::sync::Mutex::new(None));
        let layer = {
            let got = got.clone();
            OnEvent(move |e: &EventFields| {
                if e.succeeded() == Some(Call::Unbind) {
                    let r = stream
                        .enqueue(cuda_endpoints::CopyBatch::new().put(src, 0, ep, 0, 4096))
                        .map(|t| t.wait());
                    *got.lock().unwrap() = Some(r.map(|_| ()));
                }
            })
        };
        tracing::subscriber::with_default(layer, || b.unbind()).unwrap();
        let r = got.lock().unwrap().take().expect("the layer ran");
        assert!(
            matches!(r, Err(cuda_endpoints::Error::CopyUnbindReentered { .. })),
            "expected CopyUnbindReentered: {r:?}"
        );
        assert!(model.violations().is_empty(), "{:?}", model.violations());
    });
}

/// A layer inside a copy's driver call waits for another thread's bind on
/// the same endpoint range (the copy gate, issue 27 item 5): a bind waits
/// for nothing at the gate (a copy whose checks could have passed on its
/// record looks again before its driver call, R13.3), so the bind, then the
/// layer, then the copy complete. At 5d1fff7 the bind waited for the copy
/// inside the gate, and the copy's layer for the bind: a deadlock (the
/// watchdog fires; nothing here is timed).
#[test]
fn r13_3_a_layer_inside_a_copys_enqueue_may_wait_for_another_threads_bind_on_the_range() {
    use std::sync::Mutex;
    use std::sync::mpsc::channel;
    let _serial = serial();
    let _hang = watchdog::guard("a layer in a copy's enqueue waiting for a bind");
    let model = Model::new(ModelConfig {
        driver_version: 13050,
        ..ModelConfig::node(2)
    });
    let ctx = Context::new(Traced::new(model.clone()));
    let mapped = || {
        Allocation::<Private>::on_device(&ctx, Device(0), ALIGN)
            .unwrap()
            .map(&[Device(0)])
            .unwrap()
    };
    let (owner, other, src) = (mapped(), mapped(), mapped());
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = cuda_endpoints::Stream::new(&ctx, 0).unwrap();
    let (go_tx, go_rx) = channel::<()>();
    let (bound_tx, bound_rx) = channel::<bool>();
    let waited = Arc::new(Mutex::new(None));
    let layer = {
        let (go_tx, bound_rx) = (Mutex::new(go_tx), Mutex::new(bound_rx));
        let waited = waited.clone();
        OnEvent(move |e: &EventFields| {
            if e.succeeded() == Some(Call::FabricCpyBatchAsync) {
                // Inside the copy's enqueue: the bind on the other thread,
                // waited for with no bound (the watchdog is the bound).
                go_tx.lock().unwrap().send(()).unwrap();
                *waited.lock().unwrap() = Some(bound_rx.lock().unwrap().recv().unwrap());
            }
        })
    };
    std::thread::scope(|s| {
        let (ep, other) = (&ep, &other);
        let binder = s.spawn(move || {
            go_rx.recv().unwrap();
            let r = ep.bind(Device(0), ALIGN, other);
            bound_tx.send(r.is_ok()).unwrap();
            // Unbound once the copy left the gate (an unbind waits for it).
            r.and_then(|b| b.unbind())
        });
        let copy = tracing::subscriber::with_default(layer, || {
            stream.enqueue(cuda_endpoints::CopyBatch::new().put(&src, 0, ep, 0, 4096))
        })
        .unwrap();
        copy.wait().unwrap();
        binder.join().unwrap().unwrap();
    });
    assert_eq!(
        *waited.lock().unwrap(),
        Some(true),
        "the layer saw the bind"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    b.unbind().unwrap();
    drop(stream);
    ep.destroy().unwrap().release().unwrap();
    drop((owner, other, src));
    common::clean(&ctx, &model);
}

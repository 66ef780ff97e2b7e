//! What the libcuda test double catches in the real backend: each test makes
//! one kind of boundary bug happen on purpose (the double reads an argument
//! swapped or narrowed, writes a wrong out-parameter, answers an unknown
//! code, pretends to be driver 580, or hides behind the stub library's
//! name) and shows that the suite notices; and how the double joins a
//! model fabric (double/src/node.rs) when it cannot.
//!
//! These run only with `CUDA_ENDPOINTS_TEST_BACKEND=cuda` on the double
//! (`ci/double.sh`); on the model they return at once. The tests that need
//! another `libcuda` run the test binary again as a child process with that
//! library's directory on `LD_LIBRARY_PATH` (`CUDA_DOUBLE_DIR`, by default
//! `target/double`, holds the directories `ci/double.sh` made).

use crate::backend;

use std::process::Command;
use std::time::Duration;

use backend::{DoubleLib, F, Probe};
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{
    Allocation, Context, Device, Error, Private, Spec,
    driver::{Call, Code},
};

const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(1);

/// The context and probe on the double, or `None` on the model.
fn on_double(config: ModelConfig) -> Option<(Context, Probe, &'static DoubleLib)> {
    if !backend::is_cuda() {
        eprintln!(
            "skipped: needs {}=cuda (ci/double.sh)",
            backend::BACKEND_ENV
        );
        return None;
    }
    let (ctx, probe) = backend::context(config);
    let lib = probe.double()?;
    Some((ctx, probe, lib))
}

/// Switches a misbehaviour on until dropped (even when the test fails).
struct Misbehaving(&'static DoubleLib);

impl Misbehaving {
    fn on(lib: &'static DoubleLib, what: &str) -> Misbehaving {
        lib.misbehave(what);
        Misbehaving(lib)
    }
}

impl Drop for Misbehaving {
    fn drop(&mut self) {
        self.0.misbehave("none");
    }
}

/// A unicast lifecycle on `dev` that binds 2 MiB at offset 4 MiB: reserve,
/// create, wait, allocate, map, bind, unbind, destroy, release.
fn lifecycle(ctx: &Context, dev: i32) -> Result<(), Error> {
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(dev, 8 * MIB))?
        .wait(T)?;
    let mem = Allocation::<Private>::on_device(ctx, Device(dev), 2 * MIB)?;
    let mapped = mem.map(&[Device(dev)])?;
    ep.bind(dev, 4 * MIB, &mapped)?.unbind()?;
    drop(mapped);
    ep.destroy()?.release()?;
    Ok(())
}

fn assert_clean(probe: &Probe) {
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    assert!(probe.live().is_empty(), "{:?}", probe.live());
}

#[test]
fn a_correct_backend_passes_the_lifecycle_cleanly() {
    let Some((ctx, probe, _)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    lifecycle(&ctx, 0).unwrap();
    assert_clean(&probe);
    assert!(ctx.take_teardown_errors().is_empty());
}

#[test]
fn argument_order_bind_offset_and_size_swapped_is_caught() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(1)) else {
        return;
    };
    let _m = Misbehaving::on(lib, "swap-bind-offset-size");
    let e = lifecycle(&ctx, 0).unwrap_err();
    assert!(
        e.to_string().contains("cuLogicalEndpointBindMem")
            || e.to_string().contains("cuLogicalEndpointBindAddr"),
        "{e}"
    );
    assert!(
        !probe.violations().is_empty(),
        "the model logged the bad bind"
    );
}

#[test]
fn argument_width_pointer_narrowed_to_32_bits_is_caught() {
    let Some((ctx, _probe, lib)) = on_double(ModelConfig::node(1)) else {
        return;
    };
    let _m = Misbehaving::on(lib, "narrow-map-ptr");
    let e = lifecycle(&ctx, 0).unwrap_err();
    assert_eq!(e.code(), Some(Code::INVALID_VALUE), "{e}");
    assert!(e.to_string().contains("cuMemMap"), "{e}");
}

#[test]
fn wrong_out_parameter_from_reserve_is_caught() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(1)) else {
        return;
    };
    let _m = Misbehaving::on(lib, "wrong-reserve-out");
    let e = lifecycle(&ctx, 0).unwrap_err();
    assert!(e.to_string().contains("cuLogicalEndpointCreate"), "{e}");
    let rules: Vec<&str> = probe.violations().iter().map(|v| v.rule).collect();
    assert!(
        rules.contains(&"R2.1"),
        "create on an id that was not reserved: {rules:?}"
    );
}

#[test]
fn result_code_outside_the_known_set_stays_a_number() {
    let Some((ctx, probe, _)) = on_double(ModelConfig::node(1)) else {
        return;
    };
    let odd = Code::from_raw(4242).expect("non-zero");
    probe.set_faults(&[F::nth(Call::Create, 1, odd)]);
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * MIB))
        .unwrap_err();
    assert_eq!(f.error.code(), Some(odd));
    assert_eq!(f.error.code().map(Code::raw), Some(4242));
    assert!(f.error.to_string().contains("4242"), "{}", f.error);
    // The id came back and still works.
    f.value.create(Spec::unicast(0, 2 * MIB)).unwrap();
    assert_eq!(probe.faults_fired(), 1);
}

#[test]
fn codes_new_in_13_5_cross_the_abi_with_their_meaning() {
    let mut cfg = ModelConfig::node(1);
    cfg.driver_version = 13050;
    let Some((ctx, probe, _)) = on_double(cfg) else {
        return;
    };
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB).unwrap();
    probe.set_faults(&[
        F::nth(Call::BindMem, 1, Code::FABRIC_NOT_READY),
        F::nth(Call::BindMem, 2, Code::MULTICAST_RESOURCE_FULL),
    ]);
    let e = ep.bind(0, 0, &mem).unwrap_err();
    assert_eq!(e.code(), Some(Code::FABRIC_NOT_READY));
    // (`Error::is_retryable` does not count 919 yet: reported, not this suite's to change.)
    assert!(
        e.code().is_some_and(Code::is_retryable),
        "919 is retry-after-a-delay: {e}"
    );
    let e = ep.bind(0, 0, &mem).unwrap_err();
    assert_eq!(e.code().map(Code::raw), Some(47));
    assert!(e.code().is_some_and(Code::is_resource_exhausted), "{e}");
    // The endpoint stays usable (R5.10).
    ep.bind(0, 0, &mem).unwrap().unbind().unwrap();
}

#[test]
fn attribute_158_only_on_13_5() {
    for (version, want) in [(13050, Ok(1)), (13040, Err(Code::INVALID_VALUE))] {
        let mut cfg = ModelConfig::node(1);
        cfg.driver_version = version;
        let Some((ctx, _probe, _)) = on_double(cfg) else {
            return;
        };
        let got = ctx
            .attribute(Device(0), 158)
            .map_err(|e| e.code().unwrap_or(Code::UNKNOWN));
        assert_eq!(got, want, "driver {version}");
    }
}

/// Attribute 158 crosses the ABI and is read before an exportable create:
/// on 13.5 a device whose bitmask lacks FABRIC is refused before
/// `cuLogicalEndpointCreate`, naming the device, the attribute and its
/// value; on 13.3 (`INVALID_VALUE`) the create goes ahead.
#[test]
fn attribute_158_without_fabric_refuses_an_exportable_create_before_the_driver() {
    use cuda_endpoints::error::Feature;
    for version in [13050, 13030] {
        let mut cfg = ModelConfig::node(2).with_devices(|i, d| d.le_fabric_handles = i != 1);
        cfg.driver_version = version;
        let Some((ctx, probe, lib)) = on_double(cfg) else {
            return;
        };
        let before = lib.trace().len();
        let r = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::unicast(1, 2 * MIB).exportable());
        if version == 13050 {
            let f = r.map(drop).unwrap_err();
            assert!(
                matches!(
                    f.error,
                    Error::FeatureMissing {
                        device: Device(1),
                        feature: Feature::FabricHandles,
                        attribute: 158,
                        value: 0,
                    }
                ),
                "{}",
                f.error
            );
            assert!(
                f.error.to_string().contains("attribute 158 = 0"),
                "{}",
                f.error
            );
            assert!(
                !lib.trace()[before..].contains(&Call::Create),
                "refused before cuLogicalEndpointCreate"
            );
        } else {
            let ep = r.unwrap().wait(T).unwrap();
            ep.destroy().unwrap().release().unwrap();
        }
        assert_clean(&probe);
    }
}

/// The 64 handle bytes survive the ABI both ways: exported into the
/// caller's buffer, imported from it (raw calls: in one process the typed API
/// refuses a second attachment, and a second process needs the model).
#[test]
fn export_then_import_round_trips_the_handle_bytes() {
    use cuda_endpoints::driver::Driver;
    use cuda_endpoints::driver::{EndpointProps, Shape};
    let Some((_ctx, probe, _)) = on_double(ModelConfig::node(1).queries_to_ready(0)) else {
        return;
    };
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id.
    unsafe {
        let base = probe.id_reserve(2).unwrap();
        let props = EndpointProps {
            ipc_fabric: true,
            ..EndpointProps::new(Shape::Unicast { owner: Device(0) }, 2 * MIB)
        };
        probe.create(base, props).unwrap();
        assert!(probe.query(base, 1).unwrap());
        let h = probe.export(base).unwrap();
        assert_ne!(h.0, [0; 64], "the export wrote the handle");
        probe.import(base + 1, h).unwrap();
        assert!(probe.query(base + 1, 1).unwrap());
        probe.destroy(base + 1).unwrap();
        probe.destroy(base).unwrap();
        probe.id_release(base, 2).unwrap();
    }
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    assert!(probe.live().is_empty(), "{:?}", probe.live());
}

/// Bit `d` for each device in `devs`.
fn mask(devs: &[i32]) -> u64 {
    devs.iter().fold(0, |m, &d| m | 1 << d)
}

#[test]
fn contexts_only_on_the_device_the_program_uses() {
    let Some((ctx, _probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    lifecycle(&ctx, 0).unwrap();
    let (retained, current) = lib.contexts();
    assert_eq!(retained & !mask(&[0]), 0, "retained {retained:#b}");
    assert_eq!(current & !mask(&[0]), 0, "made current {current:#b}");
}

#[test]
fn a_context_switched_into_an_unused_device_is_caught() {
    let Some((ctx, _probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    lifecycle(&ctx, 0).unwrap();
    // What a broken backend would do: make device 3's context current.
    lib.emulate_context_switch(3);
    let (_, current) = lib.contexts();
    assert_ne!(
        current & !mask(&[0]),
        0,
        "the double saw device 3 made current"
    );
}

#[test]
fn primary_contexts_are_released_and_the_current_one_restored() {
    let Some((_ctx, _probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let held = lib.live().1;
    let ctx = Context::cuda().unwrap();
    lifecycle(&ctx, 1).unwrap();
    lifecycle(&ctx, 0).unwrap();
    assert!(lib.live().1 > held, "the backend retained primary contexts");
    assert_eq!(
        lib.current_context(),
        0,
        "the thread's current context was restored"
    );
    drop(ctx);
    assert_eq!(lib.live().1, held, "every retain released with the backend");
}

/// A `tracing` layer that panics on the backend's event of a primary
/// context's retain (found by a breaker): the retain was traced before the
/// backend's table held it, so the unwind lost it and the context stayed
/// retained for the process's life. It is traced once held now: the panic
/// unwinds, and the retain goes with the backend. Likewise the releases at
/// the backend's drop are all made before the first is traced.
#[test]
fn a_panic_in_a_tracing_layer_on_a_primary_context_retain_or_release_leaks_no_retain() {
    use crate::common::layer::{EventFields, OnEvent};
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some((_ctx, _probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let held = lib.live().1;
    let ctx = Context::cuda().unwrap();
    let fired = AtomicBool::new(false);
    let layer = OnEvent(move |e: &EventFields| {
        if e.message.contains("cuDevicePrimaryCtxRetain") && !fired.swap(true, Ordering::SeqCst) {
            panic!("a layer's panic");
        }
    });
    let r = tracing::subscriber::with_default(layer, || {
        catch_unwind(AssertUnwindSafe(|| {
            Allocation::<Private>::on_device(&ctx, Device(1), 2 * MIB).map(drop)
        }))
    });
    assert!(r.is_err(), "the layer panicked inside the retain");
    drop(ctx);
    assert_eq!(lib.live().1, held, "every retain released with the backend");
    // And on the first release's event as the backend drops: the other
    // device's retain is released too.
    let ctx = Context::cuda().unwrap();
    for dev in [0, 1] {
        drop(Allocation::<Private>::on_device(&ctx, Device(dev), 2 * MIB).unwrap());
    }
    let fired = AtomicBool::new(false);
    let layer = OnEvent(move |e: &EventFields| {
        if e.message.contains("cuDevicePrimaryCtxRelease") && !fired.swap(true, Ordering::SeqCst) {
            panic!("a layer's panic");
        }
    });
    let r =
        tracing::subscriber::with_default(layer, || catch_unwind(AssertUnwindSafe(|| drop(ctx))));
    assert!(r.is_err(), "the layer panicked inside the backend's drop");
    assert_eq!(lib.live().1, held, "both retains released");
    // And while a panic unwinds: the drop's panic is caught there (one
    // escaping a destructor then would abort the process).
    let ctx = Context::cuda().unwrap();
    drop(Allocation::<Private>::on_device(&ctx, Device(1), 2 * MIB).unwrap());
    let fired = AtomicBool::new(false);
    let layer = OnEvent(move |e: &EventFields| {
        if e.message.contains("cuDevicePrimaryCtxRelease") && !fired.swap(true, Ordering::SeqCst) {
            panic!("a layer's panic");
        }
    });
    let r = tracing::subscriber::with_default(layer, || {
        catch_unwind(AssertUnwindSafe(move || {
            let _dropped_while_unwinding = ctx;
            panic!("the program's panic");
        }))
    });
    assert!(r.is_err());
    assert_eq!(lib.live().1, held, "released while unwinding");
}

/// The retry in the stream's context is speculative: a copy the driver
/// refuses for itself (a null source: `INVALID_VALUE`) keeps that answer.
/// From a thread with no context, or in the stream's own, it is made once
/// (no retry: the context was not the cause); from another device's
/// context, once more in the stream's, and the first answer stands when
/// that fails too; the thread's context is put back.
#[test]
fn a_copy_the_driver_refuses_for_itself_keeps_its_answer_in_any_context() {
    use cuda_endpoints::driver::{Driver, Pointer};
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let dst = Allocation::<Private>::on_device(&ctx, Device(1), 2 * MIB)
        .unwrap()
        .map(&[Device(1)])
        .unwrap();
    // SAFETY: the test's own stream, destroyed below.
    let s = unsafe { probe.stream_create(Device(1)) }.unwrap();
    let counts = || {
        (
            lib.call_count("cuMemcpyAsync"),
            lib.call_count("cuStreamGetCtx"),
        )
    };
    let (probe, dst) = (&probe, &dst);
    let bad = move || {
        // SAFETY: refused before any byte moves (a null source).
        unsafe { probe.memcpy_async(Pointer::device(dst.device_ptr()), Pointer::device(0), 64, s) }
    };
    // `copy` on a new thread, in `within`'s context (or none): its answer,
    // the calls it made (copies, `cuStreamGetCtx`), the context after.
    let on_a_thread = |within: Option<i32>, copy: &(dyn Fn() -> Result<(), Code> + Sync)| {
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let before = counts();
                let (r, current) = match within {
                    Some(dev) => lib.in_context(dev, || (copy(), lib.current_context())),
                    None => (copy(), lib.current_context()),
                };
                let after = counts();
                (r, (after.0 - before.0, after.1 - before.1), current)
            })
            .join()
            .unwrap()
        })
    };
    let ctx_of = |dev| lib.in_context(dev, || lib.current_context());
    assert_eq!(
        on_a_thread(None, &bad),
        (Err(Code::INVALID_VALUE), (1, 0), 0)
    );
    assert_eq!(
        on_a_thread(Some(1), &bad),
        (Err(Code::INVALID_VALUE), (1, 1), ctx_of(1)),
        "(answer, (copies, cuStreamGetCtx), current after) in the stream's context"
    );
    assert_eq!(
        on_a_thread(Some(0), &bad),
        (Err(Code::INVALID_VALUE), (2, 1), ctx_of(0)),
        "(answer, (copies, cuStreamGetCtx), current after) in another device's"
    );
    // A good copy refused in another device's context whose retry fails
    // for a reason of its own (a fault the model injects into the retry,
    // the first copy to reach it): the driver's first answer stands.
    probe.set_faults(&[F::nth(Call::MemcpyAsync, 1, Code::OUT_OF_MEMORY)]);
    let good = move || {
        let at = dst.device_ptr();
        // SAFETY: both ranges inside `dst`, disjoint; waited below.
        unsafe { probe.memcpy_async(Pointer::device(at + 4096), Pointer::device(at), 64, s) }
    };
    let (r, counted, _) = on_a_thread(Some(0), &good);
    assert_eq!((r, counted), (Err(Code::INVALID_VALUE), (2, 1)));
    probe.set_faults(&[]);
    // SAFETY: the stream made above; nothing is in flight on it.
    unsafe { probe.stream_destroy(s) }.unwrap();
    drop(ctx);
}

/// Found by the double: device-less calls (`cuLogicalEndpointIdReserve`,
/// `Create`, `Query`...) ran in "any" context, device 0's until another
/// device was used, so a program on device 2 only retained and switched
/// into device 0's primary context (on a real GPU: a context created, with
/// its memory, on a device the program does not use). Now they need no
/// context (cuda.h states none for them) and the VMM calls that name no
/// device use the device the program used last.
#[test]
fn contexts_only_on_a_nonzero_device_the_program_uses() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    lifecycle(&ctx, 2).unwrap();
    let (retained, current) = lib.contexts();
    assert_eq!(retained & !mask(&[2]), 0, "retained {retained:#b}");
    assert_eq!(current & !mask(&[2]), 0, "made current {current:#b}");
    assert_clean(&probe);
}

/// A VMM call that names no device (the map of a host-NUMA allocation, the
/// program's first) before the backend used any device goes to the device
/// whose primary context the program already holds (device 3 here, as the
/// CUDA runtime would leave it), not to device 0.
#[test]
fn a_call_naming_no_device_before_any_device_is_used_goes_to_the_one_the_program_holds() {
    use cuda_endpoints::Location;
    use cuda_endpoints::driver::Granularity;
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    lib.retain_primary(3);
    struct Give(&'static DoubleLib);
    impl Drop for Give {
        fn drop(&mut self) {
            self.0.release_primary(3);
        }
    }
    let _give = Give(lib);
    let host =
        Allocation::<Private>::new(&ctx, Location::HostNuma(0), 2 * MIB, Granularity::Minimum)
            .unwrap();
    drop(host);
    let (retained, current) = lib.contexts();
    assert_eq!(retained & !mask(&[3]), 0, "retained {retained:#b}");
    assert_eq!(current & !mask(&[3]), 0, "made current {current:#b}");
    assert_ne!(current, 0, "the calls ran in device 3's context");
    drop(ctx);
    assert_clean(&probe);
}

/// The device-less logical-endpoint calls leave the thread's context alone:
/// a program with device 1's context current (as the CUDA runtime leaves
/// it) reserves, creates a multicast endpoint, queries, destroys and
/// releases without a retain or a switch.
#[test]
fn device_less_logical_endpoint_calls_retain_and_switch_nothing() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(4).queries_to_ready(0)) else {
        return;
    };
    let held = lib.live().1;
    let range = ctx.reserve(2).unwrap();
    let (retained, current) = lib.contexts();
    assert_eq!((retained, current), (0, 0), "reserve touched a context");
    let Ok([a, b]) = range.into_array() else {
        panic!("two ids");
    };
    let team = a
        .create(Spec::team(cuda_endpoints::typenum::U2::new(), 2 * MIB))
        .unwrap();
    let b = b.create(Spec::unicast(3, 2 * MIB)).unwrap();
    assert_eq!(lib.contexts(), (0, 0), "create touched a context");
    assert_eq!(lib.live().1, held, "no primary context retained");
    b.destroy().unwrap().release().unwrap();
    drop(team);
    assert_eq!(
        lib.contexts(),
        (0, 0),
        "destroy or release touched a context"
    );
    assert_clean(&probe);
}

/// cuda.h lists no `CUDA_ERROR_INVALID_CONTEXT` for the device-less
/// logical-endpoint calls; a driver that answers it anyway (no context
/// current) gets the call once more in the context of the device the
/// program used, and never in another.
#[test]
fn invalid_context_on_a_device_less_call_is_retried_on_a_device_the_program_uses() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    lifecycle(&ctx, 2).unwrap();
    probe.set_faults(&[F::nth(Call::IdReserve, 1, Code::INVALID_CONTEXT)]);
    let range = ctx.reserve_one().unwrap();
    assert_eq!(probe.faults_fired(), 1);
    drop(range);
    let (retained, current) = lib.contexts();
    assert_eq!(retained & !mask(&[2]), 0, "retained {retained:#b}");
    assert_eq!(current & !mask(&[2]), 0, "made current {current:#b}");
    assert_eq!(
        lib.current_context(),
        0,
        "the thread's context was restored"
    );
    assert_clean(&probe);
}

/// A primary context that cannot be retained is its own error, naming
/// `cuDevicePrimaryCtxRetain` and the device; the call that needed it was
/// never made.
#[test]
fn a_failed_primary_context_retain_is_reported_as_its_own_error() {
    use cuda_endpoints::driver::ContextStep;
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(4)) else {
        return;
    };
    struct Off(&'static DoubleLib);
    impl Drop for Off {
        fn drop(&mut self) {
            self.0.fail_retain(1, 0);
        }
    }
    let _off = Off(lib);
    lib.fail_retain(1, Code::INVALID_DEVICE.raw());
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(cuda_endpoints::typenum::U1::new(), 2 * MIB))
        .unwrap();
    let before = lib.trace().len();
    let f = ep.add_device(1).unwrap_err();
    match &f.error {
        Error::Context {
            call,
            step,
            device,
            code,
        } => {
            assert_eq!(*call, Call::AddDevice);
            assert_eq!(*step, ContextStep::PrimaryCtxRetain);
            assert_eq!(*device, Some(Device(1)));
            assert_eq!(*code, Code::INVALID_DEVICE);
        }
        other => panic!("expected Error::Context, got {other:?}"),
    }
    let text = f.error.to_string();
    assert!(
        text.contains("cuDevicePrimaryCtxRetain") && text.contains("device 1"),
        "{text}"
    );
    assert!(
        !lib.trace()[before..].contains(&Call::AddDevice),
        "cuLogicalEndpointAddDevice was never made"
    );
    // The device is fine again: the same endpoint enrolls it.
    lib.fail_retain(1, 0);
    let team = f.value.add_device(1).unwrap();
    drop(team);
    assert_clean(&probe);
}

#[test]
fn data_written_through_a_mapping_is_there() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(1)) else {
        return;
    };
    let mapped = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    let ptr = mapped.device_ptr();
    lib.memset_d8(0, ptr, 0xab, 4096).unwrap();
    lib.memcpy_htod(0, ptr + 16, b"endpoint").unwrap();
    let back = lib.memcpy_dtoh(0, ptr + 8, 24).unwrap();
    assert_eq!(&back[..8], &[0xab; 8]);
    assert_eq!(&back[8..16], b"endpoint");
    assert_eq!(probe.read(ptr + 4095, 2).unwrap(), vec![0xab, 0]);
}

// ---------------------------------------------------------------- the data path

/// Where a copy's pointer lives, as the double decides it (unified
/// addressing): an address in a range the process reserved is CUDA's even
/// unmapped, and the model refuses it instead of the double reading it as
/// host memory; a stream is made on the device whose context the backend
/// made current (`Cx::On`), so a pointer on another device is F2.
#[test]
fn reserved_but_unmapped_addresses_are_never_host_memory() {
    use cuda_endpoints::driver::Driver;
    use cuda_endpoints::driver::{CopyOp, Operand, Pointer};
    let mut cfg = ModelConfig::node(2);
    cfg.driver_version = 13050;
    let Some((ctx, probe, _)) = on_double(cfg) else {
        return;
    };
    let on1 = Allocation::<Private>::on_device(&ctx, Device(1), 2 * MIB)
        .unwrap()
        .map(&[Device(1)])
        .unwrap();
    let on0 = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    let host = vec![7u8; 64];
    // SAFETY: the test's own stream, range and host buffer; every copy
    // below is refused at enqueue or completes before they go.
    unsafe {
        let s = probe.stream_create(Device(1)).unwrap();
        let va = probe.mem_address_reserve(2 * MIB, 0).unwrap();
        // Host-to-nothing: refused by the model, not written through `va`.
        assert_eq!(
            probe.memcpy_async(
                Pointer::device(va),
                Pointer::host(host.as_ptr() as u64),
                64,
                s
            ),
            Err(Code::INVALID_VALUE)
        );
        // A fabric-copy operand hinted host inside the reserved range: still CUDA's.
        let op = CopyOp {
            src: Operand::Pointer(Pointer::host(va)),
            dst: Operand::Pointer(Pointer::device(on1.device_ptr())),
            size: 64,
        };
        assert_eq!(
            probe.fabric_copy_batch(s, [op].into(), 0),
            Err(Code::INVALID_VALUE)
        );
        // The stream is on device 1: a copy between device-0 addresses is
        // local to neither end of it (F2).
        let op = CopyOp {
            src: Operand::Pointer(Pointer::device(on0.device_ptr())),
            dst: Operand::Pointer(Pointer::device(on0.device_ptr() + MIB)),
            size: 64,
        };
        assert_eq!(
            probe.fabric_copy_batch(s, [op].into(), 0),
            Err(Code::INVALID_VALUE)
        );
        // Its own device's memory and host memory move.
        probe
            .memcpy_async(
                Pointer::device(on1.device_ptr()),
                Pointer::host(host.as_ptr() as u64),
                64,
                s,
            )
            .unwrap();
        probe.stream_synchronize(s).unwrap();
        probe.stream_destroy(s).unwrap();
        probe.mem_address_free(va, 2 * MIB).unwrap();
    }
    assert_eq!(probe.read(on1.device_ptr(), 64).unwrap(), host);
    let rules: Vec<&str> = probe.violations().iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["cuMemcpyAsync address", "F2", "F2"]);
    drop((on0, on1));
    assert!(probe.live().is_empty(), "{:?}", probe.live());
}

/// Puts 64 bytes `n` times through a bound endpoint on `dev`, each waited,
/// on a thread of its own (`within` wraps the puts: a context made current
/// around them, or none), and returns what that thread saw of the double
/// around the puts alone: its stream calls refused for want of a context,
/// those made with none current, its `cuCtxGetCurrent` calls, and its
/// current context after them.
fn puts_on_a_thread(
    ctx: &Context,
    lib: &'static DoubleLib,
    dev: i32,
    n: usize,
    within: fn(&Context, &'static DoubleLib, i32, &mut dyn FnMut()),
) -> ([u64; 4], usize) {
    use cuda_endpoints::{CopyBatch, Stream};
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(dev, 8 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let dst = Allocation::<Private>::on_device(ctx, Device(dev), 2 * MIB)
        .unwrap()
        .map(&[Device(dev)])
        .unwrap();
    let src = Allocation::<Private>::on_device(ctx, Device(dev), 2 * MIB)
        .unwrap()
        .map(&[Device(dev)])
        .unwrap();
    lib.memcpy_htod(dev, src.device_ptr(), b"stream-ordered")
        .unwrap();
    let b = ep.bind(dev, 0, &dst).unwrap();
    let stream = Stream::new(ctx, dev).unwrap();
    let seen = std::thread::scope(|s| {
        s.spawn(|| {
            let mut seen = ([0; 4], 0);
            within(ctx, lib, dev, &mut || {
                let before = lib.thread_counts();
                for i in 0..n as u64 {
                    let batch = CopyBatch::new().put(&src, 0, &ep, 64 * i, 64);
                    stream.enqueue(batch).unwrap().wait().unwrap();
                }
                let after = lib.thread_counts();
                // Read after the counts: it asks the double too.
                let current = lib.current_context();
                seen = ([0, 1, 2, 3].map(|k| after[k] - before[k]), current);
            });
            seen
        })
        .join()
        .unwrap()
    });
    for i in 0..n as u64 {
        let back = lib.memcpy_dtoh(dev, dst.device_ptr() + 64 * i, 14);
        assert_eq!(back.unwrap(), b"stream-ordered", "put {i}");
    }
    drop(stream);
    b.unbind().unwrap();
    drop((dst, src));
    ep.destroy().unwrap().release().unwrap();
    seen
}

/// A copy, a query or a synchronize on a stream is made as it is, with no
/// `cuCtxGetCurrent` before it: the thread's context is the one it runs
/// in. With device 1's context current (as the CUDA runtime or cudarc
/// leaves it), ten puts and waits ask the driver nothing about contexts.
#[test]
fn a_stream_call_in_the_threads_own_context_asks_nothing_first() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let ([refused, without, asked, foreign], current) =
        puts_on_a_thread(&ctx, lib, 1, 10, |_, lib, dev, f| lib.in_context(dev, f));
    assert_eq!(
        (refused, without, foreign),
        (0, 0, 0),
        "(refused, made with no context, refused in another)"
    );
    assert_eq!(asked, 0, "cuCtxGetCurrent calls");
    assert_ne!(current, 0, "the thread's own context is left current");
    drop(ctx);
    assert_clean(&probe);
}

/// On a thread with no context current, a stream call is made as it is
/// too, and the driver runs it in the stream's context (what CCCL reports
/// of recent drivers, NVIDIA/cccl#9615, and the double does by default):
/// ten puts and their waits (twenty stream calls) ask nothing, make no
/// context current, and the bytes land. A `Cx::Current` call that found
/// no context current before them (a map) does not make the backend ask.
#[test]
fn a_stream_call_on_a_thread_without_a_context_runs_as_it_is_in_the_streams() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let ([refused, without, asked, _], current) =
        puts_on_a_thread(&ctx, lib, 1, 10, |ctx, _, dev, f| {
            let mem = Allocation::<Private>::on_device(ctx, Device(dev), 2 * MIB).unwrap();
            drop(mem.map(&[Device(dev)]).unwrap());
            f()
        });
    assert_eq!(
        (refused, without, asked),
        (0, 20, 0),
        "(refused, made with no context, cuCtxGetCurrent)"
    );
    assert_eq!(current, 0, "no context made current");
    drop(ctx);
    assert_clean(&probe);
}

/// A driver stricter than that (`cuDoubleStrictStreams`) refuses a stream
/// call on a thread with no context current (`INVALID_CONTEXT`: no copy
/// made). The call is made again with the stream's own context current
/// (`cuStreamGetCtx`), not the device used last's (device 0 here, whose
/// context the double refuses a copy on device 1's stream in), and the
/// backend remembers the driver as one that refuses: its later stream
/// calls ask first and make the stream's context current themselves. Ten
/// puts and their waits (twenty stream calls) are refused once, none in
/// device 0's context, the bytes land, and the thread is left with no
/// context.
#[test]
fn a_stream_call_a_driver_refuses_for_want_of_a_context_is_made_again_in_the_streams_context() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    lib.strict_streams();
    let ([refused, without, asked, foreign], current) =
        puts_on_a_thread(&ctx, lib, 1, 10, |ctx, _, _, f| {
            // Device 0 is the device used last when the puts begin.
            drop(Allocation::<Private>::on_device(ctx, Device(0), 2 * MIB).unwrap());
            f()
        });
    assert_eq!(
        (refused, without, foreign),
        (1, 0, 0),
        "(refused, made with no context, refused in another)"
    );
    // One a call: whether one is current (the stream's is then made
    // current, and none again after).
    assert_eq!(asked, 20, "cuCtxGetCurrent calls");
    assert_eq!(current, 0, "the thread's context was restored");
    drop(ctx);
    assert_clean(&probe);
}

/// A copy made on a thread whose current context is another device's (as
/// a program that works on several GPUs leaves it) is refused by a driver
/// that checks the copy's pointers against the current context
/// (`INVALID_VALUE`, as NVIDIA/cccl#9615 and #9997 report, and the double
/// does). It is made again with the stream's own context current, then the
/// thread's is put back; nothing is remembered, so a thread in the
/// stream's context or in none pays nothing (the tests above). Ten puts
/// on device 1's stream from device 0's context: each refused once, the
/// bytes land, device 0's context is current after.
#[test]
fn a_copy_a_driver_refuses_in_another_devices_context_is_made_again_in_the_streams() {
    let Some((ctx, probe, lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    let in_zero = lib.in_context(0, || lib.current_context());
    let streams_ctx = lib.call_count("cuStreamGetCtx");
    let ([refused, without, asked, foreign], current) =
        puts_on_a_thread(&ctx, lib, 1, 10, |_, lib, _, f| lib.in_context(0, f));
    assert_eq!(
        (refused, without, foreign),
        (0, 0, 10),
        "(refused, made with no context, refused in another)"
    );
    // One a refusal: which context is current (then the stream's asked).
    assert_eq!(asked, 10, "cuCtxGetCurrent calls");
    let streams_ctx = lib.call_count("cuStreamGetCtx") - streams_ctx;
    assert_eq!(streams_ctx, 10, "cuStreamGetCtx calls");
    assert_ne!(in_zero, 0);
    assert_eq!(current, in_zero, "device 0's context is current again");
    drop(ctx);
    assert_clean(&probe);
}

// ---------------------------------------------------------------- other libcudas

/// Runs the test `name` of this binary in a child process whose
/// `LD_LIBRARY_PATH` is `dirs` (under `CUDA_DOUBLE_DIR`), with `env` set;
/// asserts it passed.
fn child(name: &str, dirs: &[&str], env: &[(&str, &str)]) -> bool {
    if !backend::is_cuda() {
        eprintln!(
            "skipped: needs {}=cuda (ci/double.sh)",
            backend::BACKEND_ENV
        );
        return false;
    }
    let base = std::env::var("CUDA_DOUBLE_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/double").to_owned());
    let path: Vec<String> = dirs.iter().map(|d| format!("{base}/{d}")).collect();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &format!("double::{name}"),
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", path.join(":"))
        .env("CUDA_DOUBLE_CHILD", name)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} did not run:\n{text}"
    );
    true
}

/// Whether this process is the child that runs `name`.
fn is_child(name: &str) -> bool {
    std::env::var("CUDA_DOUBLE_CHILD").is_ok_and(|c| c == name)
}

#[test]
fn missing_symbols_on_driver_580_are_unsupported_with_the_version() {
    child("child_driver_580", &["13.0"], &[]);
}

#[test]
#[ignore = "run by missing_symbols_on_driver_580_are_unsupported_with_the_version"]
fn child_driver_580() {
    if !is_child("child_driver_580") {
        return;
    }
    let lib = DoubleLib::load().unwrap();
    assert!(
        !lib.exports("cuLogicalEndpointCreate"),
        "the 13.0 build has no such symbol"
    );
    assert!(
        !lib.exports("cuFabricCpyBatchAsync"),
        "the fabric copy is 13.5+"
    );
    for s in [
        "cuStreamCreate",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuMemcpyAsync",
    ] {
        assert!(lib.exports(s), "{s} is on every driver");
    }
    assert_eq!(
        lib.proc_address("cuLogicalEndpointCreate", 13000),
        Err((500, 1)),
        "not found"
    );
    assert_eq!(
        lib.proc_address("cuLogicalEndpointCreate", 13030),
        Err((1, 0)),
        "version past the driver's"
    );
    assert_eq!(lib.proc_address("cuMemCreate", 13000), Ok(()));
    let ctx = Context::cuda().unwrap();
    assert_eq!(ctx.driver_version(), Some(13000));
    match ctx.reserve(1).unwrap_err() {
        Error::Unsupported {
            driver_version: Some(13000),
            ..
        } => {}
        other => panic!("{other}"),
    }
    // VMM still works there.
    drop(Allocation::<Private>::on_device(&ctx, Device(0), 1).unwrap());
    assert!(lib.violations().is_empty(), "{:?}", lib.violations());
}

/// Issue 28, item 1, through the C ABI: on the 13.0 build whose devices
/// report classic multicast (the two-GPU H200's driver), `Context::auto`
/// gives the classic emulation: a unicast endpoint takes a put and a get
/// through `cuMemcpyAsync`, every byte checked; a multicast team is refused
/// naming 13.3 and 13000, and `cuMulticastCreate` is never called.
#[test]
fn context_auto_on_driver_580_has_unicast_endpoints_and_copies_and_refuses_multicast() {
    let config = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    child(
        "child_driver_580_auto",
        &["13.0"],
        &[("CUDA_DOUBLE_CONFIG", &backend::encode(&config))],
    );
}

#[test]
#[ignore = "run by context_auto_on_driver_580_has_unicast_endpoints_and_copies_and_refuses_multicast"]
fn child_driver_580_auto() {
    use cuda_endpoints::backend::{BackendChoice, Policy};
    use cuda_endpoints::driver::cuda::Cuda;
    use cuda_endpoints::{CopyBatch, CopyPath, Stream};
    if !is_child("child_driver_580_auto") {
        return;
    }
    let lib = DoubleLib::load().unwrap();
    let team = [Device(0), Device(1)];
    let (ctx, d) = Context::auto(Cuda::open().unwrap(), &team, &Policy::new()).unwrap();
    assert_eq!(d.driver_version, Some(13000));
    assert_eq!(d.unicast, BackendChoice::Classic, "{d}");
    assert!(d.classic_available, "{d}");
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 * MIB)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    let bound = ep.bind(0, 0, &mem).unwrap();
    let bytes: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
    let stream = Stream::new(&ctx, 0).unwrap();
    stream
        .enqueue(CopyBatch::new().put_host(bytes.clone(), &ep, 4096))
        .unwrap()
        .wait()
        .unwrap();
    let got = stream
        .enqueue(CopyBatch::new().get_host(&ep, 4096, 8192))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got.received, vec![bytes]);
    drop(stream);
    bound.unbind().unwrap();
    ep.destroy().unwrap().release().unwrap();
    drop(mem);
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&team, 2 * MIB))
        .unwrap_err();
    let text = f.error.to_string();
    assert!(
        matches!(
            f.error,
            Error::Unsupported {
                driver_version: Some(13000),
                ..
            }
        ) && text.contains("13.3"),
        "{text}"
    );
    f.value.release().unwrap();
    assert!(lib.call_count("cuMemcpyAsync") >= 2);
    assert_eq!(lib.call_count("cuMulticastCreate"), 0);
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(lib.violations().is_empty(), "{:?}", lib.violations());
}

#[test]
fn driver_13_3_has_no_clique_query() {
    child(
        "child_driver_13_3",
        &["13.5"],
        &[("CUDA_DOUBLE_VERSION", "13030")],
    );
}

#[test]
#[ignore = "run by driver_13_3_has_no_clique_query"]
fn child_driver_13_3() {
    if !is_child("child_driver_13_3") {
        return;
    }
    let ctx = Context::cuda().unwrap();
    assert_eq!(ctx.driver_version(), Some(13030));
    let lib = DoubleLib::load().unwrap();
    assert_eq!(
        lib.proc_address("cuDeviceGetCliqueInfo", 13030),
        Err((500, 1))
    );
    assert_eq!(
        lib.proc_address("cuFabricCpyBatchAsync", 13030),
        Err((500, 1))
    );
    assert_eq!(lib.proc_address("cuStreamDestroy", 13030), Ok(()));
    // Logical endpoints work; a team is not checked against cliques.
    lifecycle(&ctx, 0).unwrap();
    assert!(lib.violations().is_empty(), "{:?}", lib.violations());
}

#[test]
fn libcuda_is_found_as_libcuda_so_1_not_the_stub() {
    child("child_stub_first_on_the_path", &["stub", "13.5"], &[]);
}

#[test]
#[ignore = "run by libcuda_is_found_as_libcuda_so_1_not_the_stub"]
fn child_stub_first_on_the_path() {
    if !is_child("child_stub_first_on_the_path") {
        return;
    }
    // The stub is really there, first on the path, and answers as a stub...
    assert_eq!(DoubleLib::stub_init("libcuda.so"), Some(34));
    // ...and the backend does not pick it.
    let ctx = Context::cuda().unwrap_or_else(|e| panic!("the backend loaded the stub: {e}"));
    let lib = DoubleLib::load().unwrap();
    assert!(
        lib.loaded_as().ends_with("/13.5/libcuda.so.1"),
        "{}",
        lib.loaded_as()
    );
    lifecycle(&ctx, 0).unwrap();
}

/// A model fabric named in the environment (`CUDA_ENDPOINTS_FABRIC`) that
/// cannot be joined: the double's `cuInit` answers `NOT_INITIALIZED` and
/// says why in its log, so the backend reports no driver; it never runs on
/// a model of its own in the fabric's place.
#[test]
fn a_fabric_that_cannot_be_joined_is_no_driver() {
    child(
        "child_unreachable_fabric",
        &["13.5"],
        &[("CUDA_ENDPOINTS_FABRIC", "/nonexistent/fabric.sock,rank=0")],
    );
}

#[test]
#[ignore = "run by a_fabric_that_cannot_be_joined_is_no_driver"]
fn child_unreachable_fabric() {
    if !is_child("child_unreachable_fabric") {
        return;
    }
    match Context::cuda() {
        Err(Error::NoDriver { reason }) => assert!(reason.contains("NOT_INITIALIZED"), "{reason}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("the double ran without the fabric it was told to join"),
    }
    let lib = DoubleLib::load().unwrap();
    assert!(lib.fabric_place().is_none());
    let v = lib.violations();
    assert!(
        v.iter()
            .any(|(_, rule, code)| rule.contains("/nonexistent/fabric.sock") && *code == 3),
        "{v:?}"
    );
}

/// `CUDA_DOUBLE_FABRIC=0`: the double keeps a model of its own even where
/// a fabric is named.
#[test]
fn the_fabric_can_be_switched_off() {
    child(
        "child_fabric_switched_off",
        &["13.5"],
        &[
            ("CUDA_ENDPOINTS_FABRIC", "/nonexistent/fabric.sock"),
            ("CUDA_DOUBLE_FABRIC", "0"),
        ],
    );
}

#[test]
#[ignore = "run by the_fabric_can_be_switched_off"]
fn child_fabric_switched_off() {
    if !is_child("child_fabric_switched_off") {
        return;
    }
    let ctx = Context::cuda().unwrap();
    let lib = DoubleLib::load().unwrap();
    assert!(lib.fabric_place().is_none());
    lifecycle(&ctx, 0).unwrap();
    assert!(lib.violations().is_empty(), "{:?}", lib.violations());
}

#[test]
fn memory_shared_by_descriptor_and_fabric_bytes_crosses_the_abi() {
    use cuda_endpoints::{FabricShareable, PosixFd};
    let Some((ctx, probe, _lib)) = on_double(ModelConfig::node(2)) else {
        return;
    };
    // A POSIX descriptor out of cuMemExportToShareableHandle, back in through
    // cuMemImportFromShareableHandle (the descriptor as the pointer's value).
    let mem = Allocation::<PosixFd>::on_device(&ctx, 1, 2 * MIB).unwrap();
    let fd = mem.export_fd().unwrap();
    let again = Allocation::<PosixFd>::import_fd(&ctx, &fd, mem.size()).unwrap();
    assert_eq!(again.location(), mem.location());
    // Fabric handles: 64 bytes through the out-parameter and back.
    let fab = Allocation::<FabricShareable>::on_device(&ctx, 0, 2 * MIB).unwrap();
    let bytes = fab.export_fabric().unwrap();
    let back = Allocation::<FabricShareable>::import_fabric(&ctx, &bytes, fab.size()).unwrap();
    assert_eq!(back.size(), fab.size());
    drop((again, fd, mem, back, fab));
    assert_clean(&probe);
}

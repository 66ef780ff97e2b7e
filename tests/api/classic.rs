//! The classic multicast fallback ([`Classic`], rules C1–C6) under the typed
//! API, over the reference model: the whole lifecycle leaves nothing behind
//! and breaks no rule — in particular no bind before the team is complete
//! (C3, logged by the model) and no unbind that does not match a bind (C4).
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the classic
//! fallback sits over the real backend on the libcuda test double.

use crate::backend;

use std::time::Duration;

use backend::{Inspect, Probe};
use cuda_endpoints::driver::{Classic, Granularity};
use cuda_endpoints::error::Feature;
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::typenum::{U2, U4};
use cuda_endpoints::{
    Allocation, Context, Device, Error, PosixFd, Private, Spec,
    driver::{Call, Code, Driver},
    wait_all,
};

const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(1);

/// A 4-GPU node on driver 13.0 whose devices have classic multicast, with
/// the classic backend over it.
fn classic_node(n: usize) -> (Context, Probe) {
    let cfg = ModelConfig::cuda_13_0(n).with_devices(|_, d| d.classic_multicast = true);
    classic_over(cfg)
}

/// The classic backend over the raw backend (the model, or the real one on
/// the double) of a node made as `cfg` says.
fn classic_over(cfg: ModelConfig) -> (Context, Probe) {
    backend::context_over(cfg, |raw| Context::new(Classic::new(raw)))
}

fn clean(ctx: &Context, model: &impl Inspect) {
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.live().is_empty(), "leak: {:?}", model.live());
    assert!(
        model.violations().is_empty(),
        "rule broken: {:?}",
        model.violations()
    );
}

fn devs(n: i32) -> Vec<Device> {
    (0..n).map(Device).collect()
}

#[test]
fn runtime_team_lifecycle() {
    let (ctx, model) = classic_node(4);
    assert_eq!(ctx.backend_name(), format!("classic({})", model.name()));
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(4), 4 * MIB))
        .unwrap();
    // Created synchronously once every device is in (C1): one object.
    assert_eq!(model.calls(Call::MulticastCreate), 1);
    assert_eq!(model.calls(Call::MulticastAddDevice), 4);
    assert_eq!(model.live().multicast_objects, 1);
    let team = team.wait(T).unwrap();
    assert_eq!(team.bind_alignment(), 2 * MIB);
    let mems: Vec<_> = devs(4)
        .into_iter()
        .map(|d| Allocation::<Private>::on_device(&ctx, d, 4 * MIB).unwrap())
        .collect();
    let binds: Vec<_> = devs(4)
        .into_iter()
        .zip(&mems)
        .map(|(d, m)| team.bind(d, 0, m).unwrap())
        .collect();
    assert_eq!(model.calls(Call::MulticastBindMem), 4);
    assert_eq!(model.live().bindings, 4);
    for b in binds {
        b.unbind().unwrap();
    }
    assert_eq!(model.calls(Call::MulticastUnbind), 4);
    team.destroy().unwrap().release().unwrap();
    assert_eq!(model.live().multicast_objects, 0);
    drop(mems);
    clean(&ctx, &model);
}

#[test]
fn compile_time_team_creates_only_when_complete() {
    let (ctx, model) = classic_node(4);
    let t = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(U4::new(), 2 * MIB))
        .unwrap();
    let t = t.add_device(0).unwrap();
    let t = t.add_device(1).unwrap();
    let t = t.add_device(2).unwrap();
    // Three of four: no classic object yet, so no bind could block (C3).
    assert_eq!(model.calls(Call::MulticastCreate), 0);
    let t = t.add_device(3).unwrap();
    assert_eq!(model.calls(Call::MulticastCreate), 1);
    let t = t.wait(T).unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(2), 2 * MIB).unwrap();
    let b = t.bind(2, 0, &mem).unwrap();
    drop(b); // unbinds through the token
    t.destroy().unwrap().release().unwrap();
    drop(mem);
    clean(&ctx, &model);
}

#[test]
fn bind_by_address_and_partial_binds() {
    let (ctx, model) = classic_node(2);
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(U2::new(), 8 * MIB))
        .unwrap()
        .add_device(0)
        .unwrap()
        .add_device(1)
        .unwrap()
        .wait(T)
        .unwrap();
    let mapped = Allocation::<PosixFd>::on_device(&ctx, Device(1), 4 * MIB)
        .unwrap()
        .map(&[Device(1)])
        .unwrap();
    let whole = Allocation::<Private>::on_device(&ctx, Device(0), 8 * MIB).unwrap();
    let a = team.bind(1, 4 * MIB, &mapped).unwrap();
    let lo = team.bind_part(0, 0, &whole, 0, 2 * MIB).unwrap();
    let hi = team
        .bind_part(0, 2 * MIB, &whole, 2 * MIB, 2 * MIB)
        .unwrap();
    assert_eq!(model.calls(Call::MulticastBindAddr), 1);
    assert_eq!(model.calls(Call::MulticastBindMem), 2);
    // Overlap is refused before the driver (R5.9).
    assert!(matches!(
        team.bind_part(0, MIB * 2, &whole, 0, 2 * MIB),
        Err(Error::Overlap { .. })
    ));
    a.unbind().unwrap();
    hi.unbind().unwrap();
    lo.unbind().unwrap();
    team.destroy().unwrap().release().unwrap();
    drop((mapped, whole));
    clean(&ctx, &model);
}

#[test]
fn destroy_unbinds_what_a_forgotten_token_left_bound() {
    let (ctx, model) = classic_node(2);
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(2), 2 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB).unwrap();
    std::mem::forget(team.bind(0, 0, &mem).unwrap());
    drop(mem); // still bound: the endpoint keeps the memory (R7.2)
    assert_eq!(model.live().allocations, 1);
    // Destroy unbinds (R7), then releases the object before the memory (C5).
    team.destroy().unwrap().release().unwrap();
    assert_eq!(model.calls(Call::MulticastUnbind), 1);
    let trace = model.trace();
    let release_mc = trace
        .iter()
        .rposition(|&c| c == Call::MulticastUnbind)
        .unwrap();
    assert_eq!(trace[release_mc + 1], Call::MemRelease);
    clean(&ctx, &model);
}

#[test]
fn dropping_everything_in_any_order_leaves_nothing() {
    let (ctx, model) = classic_node(4);
    {
        let range = ctx.reserve(3).unwrap();
        let pending: Vec<_> = range
            .into_endpoints()
            .into_iter()
            .map(|e| e.create(Spec::multicast(&devs(4), 2 * MIB)).unwrap())
            .collect();
        let ready = wait_all(pending, T).unwrap();
        let mem = Allocation::<Private>::on_device(&ctx, Device(3), 2 * MIB).unwrap();
        let _b = ready[1].bind(3, 0, &mem).unwrap();
        assert_eq!(model.live().multicast_objects, 3);
        // Everything dropped here: binding, endpoints, range, memory.
    }
    clean(&ctx, &model);
}

/// A classic unicast endpoint is bookkeeping for the portable path
/// (`tests/classic_unicast.rs`): created, ready and bound with no
/// `cuMulticast*` call; counted operations on it stay refused.
#[test]
fn unicast_is_bookkeeping_without_a_multicast_call() {
    let (ctx, model) = classic_node(1);
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB).unwrap();
    let b = ep.bind(0, 0, &mem).unwrap();
    b.unbind().unwrap();
    ep.destroy().unwrap().release().unwrap();
    for call in [
        Call::MulticastGetGranularity,
        Call::MulticastCreate,
        Call::MulticastBindMem,
        Call::MulticastUnbind,
    ] {
        assert_eq!(model.calls(call), 0, "{call} reached the driver");
    }
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 2 * MIB).counted_ops())
        .unwrap_err();
    assert!(
        matches!(e.error, Error::FeatureMissing { attribute: 155, .. }),
        "{}",
        e.error
    );
    e.value.release().unwrap();
    drop(mem);
    clean(&ctx, &model);
}

#[test]
fn no_multicast_supported_means_no_multicast_call() {
    // The GPU test machine: driver 13.0, MULTICAST_SUPPORTED = 0 (C6).
    let (ctx, model) = classic_over(ModelConfig::cuda_13_0(1));
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], 2 * MIB))
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::Unsupported {
                feature: Feature::MulticastTeam,
                driver_version: Some(13000),
                ..
            }
        ),
        "{}",
        e.error
    );
    e.value.release().unwrap();
    for call in [
        Call::MulticastGetGranularity,
        Call::MulticastCreate,
        Call::MulticastAddDevice,
    ] {
        assert_eq!(model.calls(call), 0, "{call} reached the driver");
    }
    clean(&ctx, &model);
}

#[test]
fn a_team_device_without_multicast_is_refused_before_create() {
    // Device 1 says no; the machine still has two capable devices, so the
    // limits are granted and the refusal comes at enrollment (C6).
    let cfg = ModelConfig::cuda_13_0(3).with_devices(|i, d| d.classic_multicast = i != 1);
    let mut classic = None;
    let (_ctx, model) = backend::context_over(cfg, |raw| {
        classic = Some(Classic::new(raw.clone()));
        Context::new(raw)
    });
    let classic = classic.unwrap();
    let prop = Spec::multicast(&[Device(0), Device(1)], 2 * MIB).props();
    // SAFETY: raw calls on a backend no typed object uses; the test owns the id.
    unsafe {
        let id = classic.id_reserve(1).unwrap();
        classic.create(id, prop).unwrap();
        classic.add_device(id, Device(0)).unwrap();
        assert_eq!(classic.add_device(id, Device(1)), Err(Code::NOT_SUPPORTED));
        assert_eq!(model.calls(Call::MulticastCreate), 0);
        assert!(!classic.query(id, 1).unwrap());
        classic.destroy(id).unwrap();
        classic.id_release(id, 1).unwrap();
    }
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[test]
fn recommended_granularity_is_the_bind_alignment_when_asked() {
    let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| {
        d.classic_multicast = true;
        d.recommended_granularity = 8 * MIB;
    });
    let (ctx, model) = backend::context_over(cfg, |raw| {
        Context::new(Classic::new(raw).with_granularity(Granularity::Recommended))
    });
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(2), 2 * MIB))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::Misaligned { alignment, suggested, .. } if alignment == 8 * MIB && suggested == 8 * MIB),
        "{}",
        e.error
    );
    let team = e
        .value
        .create(Spec::multicast(&devs(2), 8 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(team.bind_alignment(), 8 * MIB);
    team.destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
}

/// An exportable classic team exists from create on (C5: the object must
/// exist to be exported), but it is shared only through the team bring-up
/// (`tests/classic_team.rs`): the logical-endpoint fabric handle is not
/// emulated.
#[test]
fn fabric_handle_export_is_not_emulated() {
    let (ctx, model) = classic_node(2);
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(2), 2 * MIB).exportable())
        .unwrap();
    assert_eq!(model.calls(Call::MulticastCreate), 1);
    let e = ep.export().unwrap_err();
    // The code the typed API maps: on a 13.0 driver, `Unsupported`.
    assert!(e.is_unsupported(), "{e}");
    assert!(
        matches!(
            e,
            Error::Unsupported {
                feature: Feature::FabricOnClassic,
                ..
            }
        ),
        "{e}"
    );
    ep.wait(T).unwrap().destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
}

#[test]
fn attributes_describe_the_emulation() {
    let (ctx, _model) = classic_node(1);
    // SAFETY: attribute queries only.
    let d = unsafe { ctx.driver_arc() };
    // SAFETY: attribute queries touch nothing anyone owns.
    unsafe {
        assert_eq!(d.device_attribute(Device(0), 154), Ok(1)); // multicast: attribute 132
        assert_eq!(d.device_attribute(Device(0), 153), Ok(1)); // unicast: bookkeeping
        assert_eq!(d.device_attribute(Device(0), 155), Ok(0)); // no counted ops
        assert_eq!(
            d.device_attribute(Device(7), 154),
            Err(Code::INVALID_DEVICE)
        );
    }
    // Counted operations are refused before the driver with the attribute.
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], 2 * MIB).counted_ops())
        .unwrap_err();
    assert!(
        matches!(e.error, Error::FeatureMissing { attribute: 155, .. }),
        "{}",
        e.error
    );
    assert!(_model.violations().is_empty(), "{:?}", _model.violations());
}

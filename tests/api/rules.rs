//! The driver contract (`src/contract.md`, rules R1–R12 and C1–C6) against
//! the reference model, rule by rule: R1–R10 here (the R11 codes are in
//! `tests/faults.rs`, R12 in the multi-process tests, C1–C6 in
//! `tests/classic.rs`). For each rule: the
//! typed API refuses the violation before the driver (no call reached the
//! model, no violation logged) or cannot express it (see `ui-tests/`), and a
//! raw call shows that the model itself answers the contract's code.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the same tests run
//! through the real backend on the libcuda test double; the few that need two
//! simulated processes or two nodes at once stay on the model.

use crate::backend;

use crate::common;

use std::time::Duration;

use backend::{Inspect, Probe};
use cuda_endpoints::bounds::Creatable;
use cuda_endpoints::driver::{EndpointProps, Shape};
use cuda_endpoints::error::{Arg, ContextPair, Extent, Feature, Rule};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{
    Allocation, Context, Device, Endpoint, Error, Location, Mapped, Multicast, Pending, PosixFd,
    Private, Ready, Spec, SpreadTeam, Unicast,
    driver::{Call, Code, Driver},
};

const MIB: u64 = 1 << 20;
const ALIGN: u64 = 2 * MIB;
const T: Duration = Duration::from_secs(1);

fn node() -> (Context, Probe) {
    backend::context(ModelConfig::node(4))
}

/// Two simulated processes (or two nodes) at once: the model only.
fn model_node() -> (Context, Model) {
    Context::model(ModelConfig::node(4))
}

/// A spread team of two, created, with device 0 enrolled.
fn spread_with_device_0(ctx: &Context) -> Endpoint<Pending, SpreadTeam> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::spread(2, ALIGN))
        .unwrap()
        .add_device(0)
        .unwrap()
}

/// `create(spec)` is refused before the driver with an error `check` accepts.
fn create_refused<K: Creatable>(
    ctx: &Context,
    model: &impl Inspect,
    spec: Spec<K>,
    check: impl Fn(&Error) -> bool,
) {
    refused_before(
        model,
        Call::Create,
        || ctx.reserve_one().unwrap().create(spec).map_err(Error::from),
        check,
    );
}

/// Asserts that `f` fails with an error matching `check` and that the model
/// saw no call of `call` and logged no violation.
fn refused_before<T>(
    model: &impl Inspect,
    call: Call,
    f: impl FnOnce() -> Result<T, Error>,
    check: impl Fn(&Error) -> bool,
) {
    let before = model.calls(call);
    match f() {
        Ok(_) => panic!("expected an error"),
        Err(e) => assert!(check(&e), "unexpected error: {e}"),
    }
    assert_eq!(model.calls(call), before, "{call} reached the driver");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

fn unicast(ctx: &Context, dev: i32, size: u64) -> Endpoint<Ready, Unicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::unicast(dev, size))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn team(ctx: &Context, devs: &[i32], size: u64) -> Endpoint<Ready, Multicast> {
    let devs: Vec<Device> = devs.iter().map(|&d| Device(d)).collect();
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs, size))
        .unwrap()
        .wait(T)
        .unwrap()
}

/// A ready, exportable multicast endpoint of one device (device 0), 2 MiB.
fn exportable_team(ctx: &Context) -> Endpoint<Ready, Multicast<cuda_endpoints::Exportable>> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap()
}

fn raw_prop(shape: Shape, size: u64) -> EndpointProps {
    EndpointProps::new(shape, size)
}

// ---------------------------------------------------------------- R1 ids

#[test]
fn r1_reserve_split_release() {
    let (ctx, model) = node();
    let range = ctx.reserve(4).unwrap();
    assert_eq!(model.live().ids, 4);
    let eps = range.into_endpoints();
    assert_eq!(eps.len(), 4);
    let ids: Vec<u32> = eps.iter().map(|e| e.id()).collect();
    assert_eq!(ids, (ids[0]..ids[0] + 4).collect::<Vec<_>>());
    let mut it = eps.into_iter();
    it.next().unwrap().release().unwrap();
    assert_eq!(
        model.live().ids,
        4,
        "the range is released when its last id goes"
    );
    drop(it);
    assert_eq!(model.live().ids, 0);
    assert_eq!(
        model.calls(Call::IdRelease),
        1,
        "one release for the whole range"
    );
    common::no_violations(&model.violations());
}

#[test]
fn r1_3_zero_count_refused_before_driver() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let (ctx, model) = node();
        refused_before(
            &model,
            Call::IdReserve,
            || ctx.reserve(0),
            |e| {
                matches!(
                    e,
                    Error::ZeroSize {
                        rule: Some(Rule::R1_3),
                        ..
                    }
                )
            },
        );
        assert_eq!(model.id_reserve(0), Err(Code::INVALID_VALUE));
        common::broke(&model.violations(), &["R1.3"]);
    }
}

#[test]
fn r1_raw_release_rules() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let model = backend::raw(ModelConfig::node(1));
        let base = model.id_reserve(2).unwrap();
        assert_eq!(
            model.id_release(base + 5, 1),
            Err(Code::INVALID_VALUE),
            "R1.1"
        );
        model
            .create(base, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        assert_eq!(model.id_release(base, 2), Err(Code::INVALID_VALUE), "R1.2");
        model.destroy(base).unwrap();
        model.id_release(base, 2).unwrap();
        assert!(model.live().is_empty());
        common::broke(&model.violations(), &["R1.1", "R1.2"]);
    }
}

// ---------------------------------------------------------------- R2 create

#[test]
fn r2_3_size_checked_before_create_with_nearest_valid_size() {
    let (ctx, model) = node();
    let ep = ctx.reserve_one().unwrap();
    let f = ep.create(Spec::unicast(0, 3 * MIB)).unwrap_err();
    assert!(
        matches!(f.error, Error::Misaligned { suggested, alignment: ALIGN, .. } if suggested == 4 * MIB)
    );
    let f = f.value.create(Spec::unicast(0, 0)).unwrap_err();
    assert!(matches!(
        f.error,
        Error::ZeroSize {
            suggested: ALIGN,
            ..
        }
    ));
    let f = f.value.create(Spec::unicast(0, 1 << 40)).unwrap_err();
    assert!(matches!(f.error, Error::SizeTooLarge { suggested, .. } if suggested == 512 * MIB));
    assert!(f.error.to_string().contains("use at most"), "{}", f.error);
    assert_eq!(model.calls(Call::Create), 0);
    assert!(model.violations().is_empty());
    // The id came back each time and still works.
    let ok = f.value.create(Spec::unicast(0, 4 * MIB)).unwrap();
    assert_eq!(ok.size(), 4 * MIB);
}

#[test]
fn r2_2_devices_checked_before_create() {
    let (ctx, model) = node();
    create_refused(&ctx, &model, Spec::unicast(9, ALIGN), |e| {
        matches!(e, Error::NoSuchDevice { .. })
    });
    let twice = [Device(1), Device(1)];
    create_refused(&ctx, &model, Spec::multicast(&twice, ALIGN), |e| {
        matches!(e, Error::AlreadyEnrolled { .. })
    });
    create_refused(&ctx, &model, Spec::multicast(&[], ALIGN), |e| {
        matches!(e, Error::EmptyTeam)
    });
    common::no_violations(&model.violations());
}

#[test]
fn r2_4_counted_ops_needs_attribute_155() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let cfg = ModelConfig::node(2).with_devices(|i, d| d.counted_ops = i == 0);
        let (ctx, model) = backend::context(cfg);
        let ok = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::unicast(0, ALIGN).counted_ops());
        assert!(ok.is_ok());
        create_refused(&ctx, &model, Spec::unicast(1, ALIGN).counted_ops(), |e| {
            matches!(
                e,
                Error::FeatureMissing {
                    feature: Feature::CountedOps,
                    ..
                }
            )
        });
        // Raw: counted ops without support. (Unknown flag or IPC bits cannot be
        // asked for: `EndpointProps` has one boolean for each.)
        // The same node, raw.
        let raw = &model;
        let id = raw.id_reserve(1).unwrap();
        let mut p = EndpointProps {
            counted_ops: true,
            ..raw_prop(Shape::Unicast { owner: Device(1) }, ALIGN)
        };
        assert_eq!(raw.create(id, p), Err(Code::NOT_SUPPORTED));
        p.counted_ops = false;
        p.ipc_fabric = true;
        assert_eq!(raw.create(id, p), Ok(()));
        common::broke(&raw.violations(), &["R2.4"]);
    }
}

#[test]
fn r2_raw_create_codes() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let model = backend::raw(ModelConfig::node(2));
        let id = model.id_reserve(1).unwrap();
        assert_eq!(
            model.create(id + 1, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN)),
            Err(Code::INVALID_VALUE),
            "R2.1 not reserved"
        );
        assert_eq!(
            model.create(id, raw_prop(Shape::Unicast { owner: Device(0) }, MIB)),
            Err(Code::INVALID_VALUE),
            "R2.3 misaligned"
        );
        assert_eq!(
            model.create(id, raw_prop(Shape::Multicast { num_devices: 0 }, ALIGN)),
            Err(Code::INVALID_VALUE),
            "R2.2"
        );
        model
            .create(id, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        assert_eq!(
            model.create(id, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN)),
            Err(Code::INVALID_VALUE),
            "R2.1 holds one"
        );
        assert!(!model.violations().is_empty());
    }
}

// ---------------------------------------------------------------- R3 readiness

#[test]
fn r3_construction_is_asynchronous_and_wait_polls_at_least_once() {
    let (ctx, model) = backend::context(ModelConfig::node(1).queries_to_ready(3));
    let p = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN))
        .unwrap();
    let f = p.wait(Duration::ZERO).unwrap_err();
    assert!(
        matches!(f.error, Error::Timeout { polls: 1, .. }),
        "{}",
        f.error
    );
    assert_eq!(model.calls(Call::Query), 1);
    // Worded for a unicast endpoint, in the singular.
    let msg = f.error.to_string();
    assert!(
        msg.contains("unicast endpoint") && msg.contains("1 query (R3)"),
        "{msg}"
    );
    assert!(
        !msg.contains("multicast") && !msg.contains("queries"),
        "{msg}"
    );
    let ready = f.value.wait(T).unwrap();
    assert_eq!(model.calls(Call::Query), 4);
    drop(ready);
    assert!(model.live().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn r3_2_team_waits_for_every_device() {
    let (ctx, model) = backend::context(ModelConfig::node(2).queries_to_ready(0));
    let spread = spread_with_device_0(&ctx);
    // One device of two: the driver keeps it pending, however long we wait.
    let f = spread.wait(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(f.error, Error::Timeout { .. }));
    let msg = f.error.to_string();
    assert!(
        msg.starts_with("multicast endpoint") && msg.contains("queries"),
        "{msg}"
    );
    assert!(
        msg.contains("every device of every process is enrolled (R3.2)"),
        "{msg}"
    );
    let ready = f.value.add_device(1).unwrap().wait(T).unwrap();
    assert_eq!(ready.devices(), vec![Device(0), Device(1)]);
    assert!(model.violations().is_empty());
}

#[test]
fn r3_5_one_query_per_range() {
    let (ctx, model) = backend::context(ModelConfig::node(1).queries_to_ready(0));
    let eps = ctx.reserve(16).unwrap().into_endpoints();
    let pending: Vec<_> = eps
        .into_iter()
        .map(|e| e.create(Spec::unicast(0, ALIGN)).unwrap())
        .collect();
    let ready = cuda_endpoints::wait_all(pending, T).unwrap();
    assert_eq!(ready.len(), 16);
    assert_eq!(
        model.calls(Call::Query),
        1,
        "one query covers the whole range"
    );
    common::no_violations(&model.violations());
}

#[test]
fn r3_1_raw_bind_before_ready_is_invalid_value() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let (ctx, model) = backend::context(ModelConfig::node(1));
        let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
        let id = model.id_reserve(1).unwrap();
        model
            .create(id, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        assert_eq!(
            model.bind_mem(id, Device(0), 0, mem.handle(), 0, ALIGN, 0),
            Err(Code::INVALID_VALUE)
        );
        assert_eq!(model.violations()[0].rule, "R3.1");
        model.destroy(id).unwrap();
        model.id_release(id, 1).unwrap();
    }
}

// ---------------------------------------------------------------- R4 teams

#[test]
fn r4_enrollment_checked_before_driver() {
    let (ctx, model) = node();
    let spread = spread_with_device_0(&ctx);
    let before = model.calls(Call::AddDevice);
    let f = spread.add_device(0).unwrap_err();
    assert!(matches!(f.error, Error::AlreadyEnrolled { .. }), "R4.2");
    let spread = f.value.add_device(1).unwrap();
    let f = spread.add_device(2).unwrap_err();
    assert!(matches!(f.error, Error::TeamFull { team_size: 2 }), "R4.2");
    let f = f.value.add_device(7).unwrap_err();
    assert!(matches!(f.error, Error::NoSuchDevice { .. }));
    assert_eq!(model.calls(Call::AddDevice), before + 1);
    assert!(model.violations().is_empty());
}

#[test]
fn r4_compile_time_team() {
    let (ctx, model) = node();
    let t = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(U2::new(), ALIGN))
        .unwrap();
    let t = t.add_device(2).unwrap().add_device(3).unwrap();
    let t = t.wait(T).unwrap();
    assert_eq!(t.devices(), vec![Device(2), Device(3)]);
    drop(t);
    assert!(model.live().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn r4_raw_codes_and_cliques() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let model =
            backend::raw(ModelConfig::node(3).with_devices(|i, d| d.clique = (i == 2) as u32));
        let u = model.id_reserve(2).unwrap();
        model
            .create(u, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        assert_eq!(
            model.add_device(u, Device(0)),
            Err(Code::INVALID_VALUE),
            "R4.1"
        );
        let m = u + 1;
        model
            .create(m, raw_prop(Shape::Multicast { num_devices: 2 }, ALIGN))
            .unwrap();
        model.add_device(m, Device(0)).unwrap();
        assert_eq!(
            model.add_device(m, Device(0)),
            Err(Code::INVALID_VALUE),
            "R4.2"
        );
        assert_eq!(
            model.add_device(m, Device(2)),
            Err(Code::INVALID_DEVICE),
            "R4.5 clique"
        );
        model.add_device(m, Device(1)).unwrap();
        assert_eq!(
            model.add_device(m, Device(2)),
            Err(Code::INVALID_VALUE),
            "R4.2 full"
        );
        common::broke(&model.violations(), &["R4.1", "R4.2", "R4.5", "R4.2"]);
    }
}

#[test]
fn r4_5_clique_error_is_typed() {
    let (ctx, _model) =
        backend::context(ModelConfig::node(2).with_devices(|i, d| d.clique = i as u32));
    let t = spread_with_device_0(&ctx);
    let f = t.add_device(1).unwrap_err();
    // Known before the driver (cuDeviceGetCliqueInfo), so refused before it.
    assert!(
        matches!(
            f.error,
            Error::OtherClique {
                device: Device(1),
                clique: 1,
                team_device: Device(0),
                team_clique: 0,
            }
        ),
        "{}",
        f.error
    );
    assert!(f.error.to_string().contains("R4.5"), "{}", f.error);
    drop(f);
    common::no_violations(&_model.violations());
}

// ---------------------------------------------------------------- R5 bind

#[test]
fn r5_checks_before_driver() {
    let (ctx, model) = node();
    let ep = team(&ctx, &[0, 1], 8 * MIB);
    let mem0 = Allocation::<Private>::on_device(&ctx, Device(0), 4 * MIB).unwrap();
    let mem2 = Allocation::<Private>::on_device(&ctx, Device(2), 4 * MIB).unwrap();
    let bind = Call::BindMem;
    refused_before(
        &model,
        bind,
        || ep.bind(2, 0, &mem2),
        |e| {
            matches!(
                e,
                Error::WrongDevice {
                    rule: Rule::R5_2,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind(1, 0, &mem0),
        |e| matches!(e, Error::MemoryOnWrongDevice { .. }),
    );
    refused_before(
        &model,
        bind,
        || ep.bind(0, MIB, &mem0),
        |e| {
            matches!(
                e,
                Error::Misaligned {
                    what: Arg::BindOffset,
                    rule: Rule::R5_3,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, 0, &mem0, MIB, ALIGN),
        |e| {
            matches!(
                e,
                Error::Misaligned {
                    what: Arg::MemoryOffset,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, 0, &mem0, 0, 3 * MIB),
        |e| {
            matches!(
                e,
                Error::Misaligned {
                    what: Arg::BindSize,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, 0, &mem0, 2 * MIB, 4 * MIB),
        |e| {
            matches!(
                e,
                Error::OutOfRange {
                    what: Extent::Allocation,
                    rule: Rule::R5_4,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind(0, 6 * MIB, &mem0),
        |e| {
            matches!(
                e,
                Error::OutOfRange {
                    what: Extent::EndpointRange,
                    ..
                }
            )
        },
    );
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, u64::MAX - MIB + 1, &mem0, 0, ALIGN),
        |e| matches!(e, Error::Misaligned { .. } | Error::OutOfRange { .. }),
    );
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, 0, &mem0, 0, 0),
        |e| matches!(e, Error::ZeroSize { .. }),
    );
    let b = ep.bind(0, 0, &mem0).unwrap();
    refused_before(
        &model,
        bind,
        || ep.bind_part(0, 2 * MIB, &mem0, 0, ALIGN),
        |e| matches!(e, Error::Overlap { .. }),
    );
    let other = Allocation::<Private>::on_device(&ctx, Device(0), 4 * MIB).unwrap();
    let b2 = ep.bind(0, 4 * MIB, &other).unwrap();
    drop((b, b2));
    assert_eq!(model.live().bindings, 0);
    common::no_violations(&model.violations());
}

#[test]
fn a_failed_transition_displays_its_cause_and_debug_names_the_value_that_came_back() {
    let (ctx, _model) = node();
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 3 * MIB + 1))
        .unwrap_err();
    let cause = f.error.to_string();
    assert!(
        cause.contains("use endpoint size = 4194304 bytes"),
        "{cause}"
    );
    assert_eq!(f.to_string(), cause);
    let debug = format!("{f:?}");
    assert!(debug.starts_with("Failed { error: Misaligned {"), "{debug}");
    // `Endpoint` alone is `Endpoint<Reserved, NoKind>`: rustc leaves out
    // type parameters that are their defaults.
    assert!(
        debug.ends_with("suggested: 4194304, rule: R2_3 }, value: Endpoint }"),
        "{debug}"
    );
    // What `main` prints after `?` into `Box<dyn Error>`: the wording, once.
    let boxed: Box<dyn std::error::Error> = f.into();
    assert_eq!(boxed.to_string(), cause);
    assert!(boxed.source().is_none());
}

#[test]
fn map_takes_the_device_numbers_that_on_device_and_bind_take() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 1, 4 * MIB);
    let numbers: Mapped<Private> = Allocation::<Private>::on_device(&ctx, 1, 2 * MIB)
        .unwrap()
        .map(&[0, 1])
        .unwrap();
    let devices = vec![Device(0)];
    let typed = Allocation::<Private>::on_device(&ctx, 1, 2 * MIB)
        .unwrap()
        .map_aligned(&devices, 2 * MIB)
        .unwrap();
    let b = ep.bind(1, 0, &numbers).unwrap();
    let b2 = ep.bind(1, 2 * MIB, &typed).unwrap();
    drop((b, b2));
    drop((numbers, typed));
    assert_eq!(model.live().bindings, 0);
    common::no_violations(&model.violations());
}

#[test]
fn r5_bind_addr_and_host_numa() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 1, 8 * MIB);
    let mapped: Mapped<Private> = Allocation::<Private>::on_device(&ctx, Device(1), 4 * MIB)
        .unwrap()
        .map::<Device>(&[])
        .unwrap();
    let b = ep.bind_part(1, 2 * MIB, &mapped, 2 * MIB, 2 * MIB).unwrap();
    assert_eq!(model.calls(Call::BindAddr), 1);
    drop(b);
    let host = Allocation::<Private>::new(
        &ctx,
        Location::HostNuma(0),
        2 * MIB,
        cuda_endpoints::driver::Granularity::Minimum,
    )
    .unwrap();
    let b = ep.bind(1, 0, &host).unwrap();
    drop(b);
    let far = Allocation::<Private>::new(
        &ctx,
        Location::HostNuma(0),
        2 * MIB,
        cuda_endpoints::driver::Granularity::Minimum,
    )
    .unwrap();
    let cfg_other = ModelConfig::node(2).with_devices(|i, d| d.host_numa_id = i as i32);
    let (ctx2, model2) = Context::model(cfg_other);
    let ep2 = unicast(&ctx2, 1, 4 * MIB);
    let far2 = Allocation::<Private>::new(
        &ctx2,
        Location::HostNuma(0),
        2 * MIB,
        cuda_endpoints::driver::Granularity::Minimum,
    )
    .unwrap();
    refused_before(
        &model2,
        Call::BindMem,
        || ep2.bind(1, 0, &far2),
        |e| {
            matches!(
                e,
                Error::MemoryOnWrongDevice {
                    host_numa: Some(1),
                    ..
                }
            )
        },
    );
    // Memory from another context is refused too.
    refused_before(
        &model,
        Call::BindMem,
        || ep.bind(1, 0, &far2),
        |e| {
            matches!(
                e,
                Error::WrongContext {
                    pair: ContextPair::MemoryForEndpoint
                }
            )
        },
    );
    drop(far);
    assert!(model.violations().is_empty());
}

#[test]
fn r5_6_exportable_takes_shareable_memory() {
    let (ctx, model) = node();
    let ep = exportable_team(&ctx);
    let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
    let b = ep.bind(0, 0, &mem).unwrap();
    drop(b);
    assert!(model.violations().is_empty());
}

#[test]
fn r5_raw_codes() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let (ctx, model) = backend::context(ModelConfig::node(2));
        let mem = Allocation::<Private>::on_device(&ctx, Device(0), 4 * MIB).unwrap();
        let id = model.id_reserve(1).unwrap();
        let mut p = raw_prop(Shape::Unicast { owner: Device(0) }, 8 * MIB);
        p.ipc_fabric = true;
        model.create(id, p).unwrap();
        while !model.query(id, 1).unwrap() {}
        let h = mem.handle();
        let cases: [(u64, u64, u64, u64, Device, &str); 6] = [
            (0, 0, ALIGN, 1, Device(0), "R5.8"),
            (0, 0, ALIGN, 0, Device(1), "R5.2"),
            (MIB, 0, ALIGN, 0, Device(0), "R5.3"),
            (0, 2 * MIB, 4 * MIB, 0, Device(0), "R5.4"),
            (8 * MIB, 0, ALIGN, 0, Device(0), "R5.4"),
            (0, 0, ALIGN, 0, Device(0), "R5.6"),
        ];
        for (off, moff, size, flags, dev, rule) in cases {
            assert!(
                model.bind_mem(id, dev, off, h, moff, size, flags).is_err(),
                "{rule}"
            );
            assert_eq!(model.violations().last().unwrap().rule, rule);
        }
        model.destroy(id).unwrap();
        model.id_release(id, 1).unwrap();
    }
}

// ---------------------------------------------------------------- R6 unbind

#[test]
fn r6_unbind_through_token_only() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, 8 * MIB);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 8 * MIB).unwrap();
    let a = ep.bind_part(0, 0, &mem, 0, 2 * MIB).unwrap();
    let b = ep.bind_part(0, 2 * MIB, &mem, 2 * MIB, 4 * MIB).unwrap();
    b.unbind().unwrap();
    a.unbind().unwrap();
    assert_eq!(model.calls(Call::Unbind), 2);
    assert!(model.violations().is_empty());
}

#[test]
fn r6_raw_unbind_must_match_binds() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let (ctx, model) = backend::context(ModelConfig::node(1).queries_to_ready(0));
        let mem = Allocation::<Private>::on_device(&ctx, Device(0), 8 * MIB).unwrap();
        let id = model.id_reserve(1).unwrap();
        model
            .create(id, raw_prop(Shape::Unicast { owner: Device(0) }, 8 * MIB))
            .unwrap();
        assert!(model.query(id, 1).unwrap());
        model
            .bind_mem(id, Device(0), 0, mem.handle(), 0, ALIGN, 0)
            .unwrap();
        model
            .bind_mem(id, Device(0), ALIGN, mem.handle(), ALIGN, 2 * ALIGN, 0)
            .unwrap();
        assert_eq!(
            model.unbind(id, Device(0), ALIGN / 2, ALIGN),
            Err(Code::INVALID_VALUE),
            "R6.3"
        );
        assert_eq!(
            model.unbind(id, Device(0), 3 * ALIGN, ALIGN),
            Err(Code::INVALID_VALUE),
            "R6.1"
        );
        assert_eq!(
            model.unbind(id, Device(0), 0, 2 * ALIGN),
            Err(Code::INVALID_VALUE),
            "R6.2 partial"
        );
        model.unbind(id, Device(0), 0, 3 * ALIGN).unwrap(); // two back-to-back binds at once
        assert_eq!(model.live().bindings, 0);
        model.destroy(id).unwrap();
        model.id_release(id, 1).unwrap();
        common::broke(&model.violations(), &["R6.3", "R6.1", "R6.2"]);
    }
}

// ---------------------------------------------------------------- R7 destroy

#[test]
fn r7_destroy_keeps_id_and_forgotten_binding_keeps_memory() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, 4 * MIB);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 4 * MIB).unwrap();
    std::mem::forget(ep.bind(0, 0, &mem).unwrap());
    drop(mem);
    // Still bound: the endpoint keeps the memory alive (R7.2).
    assert_eq!(model.live().allocations, 1);
    let id = ep.destroy().unwrap();
    assert_eq!(
        model.live().allocations,
        0,
        "destroy unbinds, then the memory goes"
    );
    assert_eq!(model.live().ids, 1, "R7.1: the id stays reserved");
    let again = id.create(Spec::unicast(0, ALIGN)).unwrap();
    drop(again);
    assert!(model.live().is_empty());
    assert!(model.violations().is_empty());
}

// ---------------------------------------------------------------- R8/R9 sharing

#[test]
fn r8_r9_export_import_between_processes() {
    let (ctx, model) = model_node();
    let ep = exportable_team(&ctx);
    let handle = ep.export().unwrap();
    let wire = handle.to_bytes();
    let peer = model.spawn_process();
    let pctx = Context::new(peer.clone());
    let back =
        cuda_endpoints::FabricHandle::<Multicast<cuda_endpoints::Exportable>>::from_bytes(&wire)
            .unwrap();
    let imported = pctx.reserve_one().unwrap().import(&back).unwrap();
    let imported = imported.wait(T).unwrap();
    assert_eq!(imported.size(), ALIGN);
    drop(imported);
    drop(ep);
    assert!(model.live_node().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn r9_refusals() {
    let (ctx, model) = model_node();
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let handle = ep.export().unwrap();
    let peer = model.spawn_process();
    peer.set_fabric_access(false);
    let pctx = Context::new(peer.clone());
    let f = pctx.reserve_one().unwrap().import(&handle).unwrap_err();
    assert_eq!(f.error.code(), Some(Code::NOT_PERMITTED), "R9.1");
    // Damaged bytes are refused by the wire checksum (R9.4).
    let mut wire = handle.to_bytes();
    wire[40] ^= 0xff;
    let e = cuda_endpoints::FabricHandle::<Unicast<cuda_endpoints::Exportable>>::from_bytes(&wire)
        .unwrap_err();
    assert!(matches!(e, Error::BadHandle { .. }), "{e}");
    // With access, the import goes through.
    drop(f);
    peer.set_fabric_access(true);
    let imported = pctx.reserve_one().unwrap().import(&handle).unwrap();
    drop(imported);
    assert!(
        cuda_endpoints::FabricHandle::<Multicast<cuda_endpoints::Exportable>>::from_bytes(
            &handle.to_bytes()
        )
        .is_err(),
        "kind checked"
    );
    assert!(
        cuda_endpoints::FabricHandle::<Unicast<cuda_endpoints::Exportable>>::from_bytes(&[0; 7])
            .is_err()
    );
    common::no_violations(&model.violations());
}

#[test]
fn r8_1_raw_export_of_non_fabric_endpoint() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let model = backend::raw(ModelConfig::node(1));
        let id = model.id_reserve(1).unwrap();
        model
            .create(id, raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        assert_eq!(model.export(id), Err(Code::INVALID_VALUE));
        assert_eq!(model.violations()[0].rule, "R8.1");
    }
}

// ---------------------------------------------------------------- R10 limits

#[test]
fn r10_limits_depend_on_properties() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let cfg = ModelConfig::node(2).with_devices(|i, d| {
            d.bind_alignment = if i == 0 { 2 * MIB } else { 4 * MIB };
            d.max_size = if i == 0 { 64 * MIB } else { 32 * MIB };
        });
        let (ctx, model) = backend::context(cfg);
        let l0 = model
            .get_limits(raw_prop(Shape::Unicast { owner: Device(0) }, ALIGN))
            .unwrap();
        let l1 = model
            .get_limits(raw_prop(Shape::Unicast { owner: Device(1) }, ALIGN))
            .unwrap();
        let lm = model
            .get_limits(raw_prop(Shape::Multicast { num_devices: 2 }, ALIGN))
            .unwrap();
        assert_eq!((l0.bind_alignment, l0.max_size), (2 * MIB, 64 * MIB));
        assert_eq!((l1.bind_alignment, l1.max_size), (4 * MIB, 32 * MIB));
        assert_eq!((lm.bind_alignment, lm.max_size), (4 * MIB, 32 * MIB));
        let f = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::unicast(1, 6 * MIB))
            .unwrap_err();
        assert!(
            matches!(f.error, Error::Misaligned { suggested, alignment, .. } if suggested == 8 * MIB && alignment == 4 * MIB)
        );
        common::no_violations(&model.violations());
    }
}

// ---------------------------------------------------------------- R11 / old drivers

#[test]
fn old_driver_reports_unsupported_with_version() {
    let (ctx, model) = backend::context(ModelConfig::cuda_13_0(1));
    let e = ctx.reserve(1).unwrap_err();
    match &e {
        Error::Unsupported {
            feature: Feature::LogicalEndpoints,
            driver_version: Some(13000),
            detail,
        } => assert!(detail.contains("cuLogicalEndpointIdReserve")),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("13000"), "{e}");
    // VMM still works there.
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 1).unwrap();
    assert_eq!(mem.size(), ALIGN);
    drop(mem);
    let f =
        Allocation::<cuda_endpoints::FabricShareable>::on_device(&ctx, Device(0), 1).unwrap_err();
    assert!(matches!(f, Error::FabricNotPermitted { .. }), "{f}");
    assert!(model.live().is_empty());
    common::no_violations(&model.violations());
}

#[cfg(feature = "serde")]
#[test]
fn fabric_handles_travel_with_serde() {
    use cuda_endpoints::{Exportable, FabricHandle};
    let (ctx, model) = model_node();
    let ep = exportable_team(&ctx);
    let json = serde_json::to_string(&ep.export().unwrap()).unwrap();
    let back: FabricHandle<Multicast<Exportable>> = serde_json::from_str(&json).unwrap();
    let peer = Context::new(model.spawn_process());
    let imported = peer
        .reserve_one()
        .unwrap()
        .import(&back)
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(imported.size(), ALIGN);
    assert!(serde_json::from_str::<FabricHandle<Unicast<Exportable>>>(&json).is_err());
    common::no_violations(&model.violations());
}

#[test]
fn r9_3_spread_team_over_two_processes() {
    use cuda_endpoints::{Exportable, FabricHandle};
    let (ctx, model) = Context::model(ModelConfig::node(2));
    // Rank 0 creates a team of 2 spread over two processes, enrolls its
    // device and exports the pending endpoint.
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, ALIGN).exportable())
        .unwrap()
        .add_device(0)
        .unwrap();
    let wire = ep.export().unwrap().to_bytes();
    // Rank 1 imports, enrolls its own device.
    let peer = model.spawn_process();
    let pctx = Context::new(peer.clone());
    let handle = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire).unwrap();
    let imported = pctx.reserve_one().unwrap().import(&handle).unwrap();
    let imported = imported.add_device(1).unwrap();
    // Every rank waits (R3.2: only now is the team complete), then binds
    // shareable memory on its own device (R5.6).
    let imported = imported.wait(T).unwrap();
    let ep = ep.wait(T).unwrap();
    let mem1 = Allocation::<PosixFd>::on_device(&pctx, Device(1), ALIGN).unwrap();
    let mem0 = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
    let b1 = imported.bind(1, 0, &mem1).unwrap();
    let b0 = ep.bind(0, 0, &mem0).unwrap();
    // A rank binds only the devices it enrolled.
    let e = imported.bind(0, 0, &mem1).unwrap_err();
    assert!(matches!(e, Error::WrongDevice { .. }), "{e}");
    drop((b0, b1));
    drop((imported, mem1));
    drop((ep, mem0));
    assert!(model.live_node().is_empty());
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[test]
fn suggestions_are_valid_values() {
    let (ctx, _model) = node();
    let ep = unicast(&ctx, 0, 8 * MIB);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), 2 * MIB).unwrap();
    // Rounding the offset up would not fit: the suggestion rounds down.
    let e = ep.bind(0, 7 * MIB, &mem).unwrap_err();
    assert!(
        matches!(e, Error::Misaligned { suggested, .. } if suggested == 6 * MIB),
        "{e}"
    );
    // Rounding up would overflow: round down instead.
    let e = ep.bind(0, u64::MAX, &mem).unwrap_err();
    assert!(
        matches!(e, Error::Misaligned { suggested, .. } if suggested.is_multiple_of(ALIGN)),
        "{e}"
    );
    let e = Allocation::<Private>::on_device(&ctx, Device(0), u64::MAX).unwrap_err();
    assert!(matches!(e, Error::AllocationTooLarge { .. }), "{e}");
    let e = ctx.reserve(0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ZeroSize {
                what: Arg::IdCount,
                suggested: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().ends_with("1 id"), "{e}");
    common::no_violations(&_model.violations());
}

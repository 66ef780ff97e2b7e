//! The run-time bookkeeping of issue 11, items 3-7: facts kept per process,
//! hostile driver answers, forged handles, errors lost or mislabelled, and
//! the checks made before the driver. Each test is named after its sentence.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::clean;
use cuda_endpoints::driver::Driver;
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Context, Device, Endpoint, Error, Exportable, FabricHandle, Mapped, Multicast,
    PosixFd, Ready, Spec,
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// A ready multicast team of device 0 and mapped memory to bind to it,
/// both `2 * ALIGN` long.
fn team_and_mapped(ctx: &Context) -> (Endpoint<Ready, Multicast>, Mapped<PosixFd>) {
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], 2 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    let mapped = Allocation::<PosixFd>::on_device(ctx, Device(0), 2 * ALIGN)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    (team, mapped)
}

/// Item 3: a handle exported through context A is attached in the process;
/// importing it through context B of the same process is refused.
#[test]
fn one_attachment_per_process_not_per_context() {
    let model = Model::new(ModelConfig::node(2));
    // Two contexts over two handles on one simulated process, as
    // `Context::cuda()` twice is on hardware; and two over one `Arc`.
    let a = Context::new(model.clone());
    let b = Context::new(model.clone());
    let shared: Arc<dyn Driver> = Arc::new(model.clone());
    let c = Context::new(shared.clone());
    let d = Context::new(shared);
    let x = a
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let h =
        FabricHandle::<Multicast<Exportable>>::from_bytes(&x.export().unwrap().to_bytes()).unwrap();
    for other in [&b, &c, &d] {
        let f = other.reserve_one().unwrap().import(&h).unwrap_err();
        assert!(
            matches!(f.error, Error::AlreadyAttached { id } if id == x.id()),
            "{}",
            f.error
        );
        f.value.release().unwrap();
    }
    // Another process may import it.
    let peer = Context::new(model.spawn_process());
    let y = peer.reserve_one().unwrap().import(&h).unwrap();
    drop(y);
    // Once destroyed in A, the handle is free in the process again.
    let id = x.destroy().unwrap();
    id.release().unwrap();
    for ctx in [&a, &b, &c, &d, &peer] {
        assert!(ctx.take_teardown_errors().is_empty());
    }
    clean(&a, &model);
}

/// A backend whose answers no driver may give: an id range that runs past
/// `u32::MAX`, an address range at the very end of the address space. It
/// keeps the model's books for the calls it answers itself.
#[derive(Debug)]
struct Hostile {
    inner: Model,
}

const HOSTILE_BASE: u32 = u32::MAX - 1;
const HOSTILE_VA: u64 = u64::MAX - ALIGN + 1;

impl cuda_endpoints::driver::Forward for Hostile {
    type Inner = Model;
    fn inner(&self) -> &Model {
        &self.inner
    }
    unsafe fn id_reserve(&self, count: u32) -> cuda_endpoints::driver::DriverResult<u32> {
        if count > 2 {
            return Ok(HOSTILE_BASE);
        }
        // SAFETY: forwarded unchanged.
        unsafe { self.inner.id_reserve(count) }
    }
    unsafe fn id_release(&self, base: u32, count: u32) -> cuda_endpoints::driver::DriverResult<()> {
        if base == HOSTILE_BASE {
            return Ok(());
        }
        // SAFETY: forwarded unchanged.
        unsafe { self.inner.id_release(base, count) }
    }
    unsafe fn mem_address_reserve(
        &self,
        _size: u64,
        _alignment: u64,
    ) -> cuda_endpoints::driver::DriverResult<u64> {
        Ok(HOSTILE_VA)
    }
    unsafe fn mem_map(
        &self,
        _ptr: u64,
        _size: u64,
        _offset: u64,
        _handle: u64,
    ) -> cuda_endpoints::driver::DriverResult<()> {
        Ok(())
    }
    unsafe fn mem_set_access(
        &self,
        _ptr: u64,
        _size: u64,
        _devices: Vec<Device>,
    ) -> cuda_endpoints::driver::DriverResult<()> {
        Ok(())
    }
    unsafe fn mem_unmap(&self, _ptr: u64, _size: u64) -> cuda_endpoints::driver::DriverResult<()> {
        Ok(())
    }
    unsafe fn mem_address_free(
        &self,
        _ptr: u64,
        _size: u64,
    ) -> cuda_endpoints::driver::DriverResult<()> {
        Ok(())
    }
}

/// Item 5: checked arithmetic on every `base + count` and `ptr + offset`
/// from the driver; no panic anywhere, in particular in no `Drop`.
#[test]
fn hostile_driver_answers_give_typed_errors_not_panics() {
    use cuda_endpoints::{driver::Call, error::Answer};
    let model = Model::new(ModelConfig::node(2));
    let ctx = Context::new(Hostile {
        inner: model.clone(),
    });
    // An id range whose last id would be past u32::MAX.
    let e = ctx.reserve(4).unwrap_err();
    assert_eq!(
        e,
        Error::BadAnswer {
            call: Call::IdReserve,
            what: Answer::IdBase,
            value: u64::from(HOSTILE_BASE),
        },
        "{e}"
    );
    assert!(e.to_string().contains("cuLogicalEndpointIdReserve"), "{e}");
    // A mapping at the end of the address space: `ptr + mem_offset` overflows.
    let (team, mapped) = team_and_mapped(&ctx);
    let e = team.bind_part(0, 0, &mapped, ALIGN, ALIGN).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadAnswer {
                call: Call::MemAddressReserve,
                what: Answer::MappedAddress,
                ..
            }
        ),
        "{e}"
    );
    drop(mapped);
    team.destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
}

/// A handle's wire bytes with the metadata rewritten and the checksum
/// recomputed, as anyone holding the bytes can.
fn forge(wire: &[u8], kind: u8, size: u64, align: u64, team: u32) -> Vec<u8> {
    let mut b = wire.to_vec();
    b[5] = kind;
    b[6..14].copy_from_slice(&size.to_le_bytes());
    b[14..22].copy_from_slice(&align.to_le_bytes());
    b[22..26].copy_from_slice(&team.to_le_bytes());
    let at = b.len() - 8;
    let sum = cuda_endpoints::driver::fnv1a(&b[..at]);
    b[at..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Item 4: forged metadata (kind, size, alignment, team size, with a valid
/// checksum) never makes the crate send a call that breaks R4.1, R4.2, R5.3
/// or R5.4: what the driver can confirm is checked before the import
/// (GetLimits: the bind alignment), what only the driver knows comes back as
/// the driver's error; the model logs no violation either way.
#[test]
fn forged_handle_metadata_is_checked_against_the_driver() {
    use cuda_endpoints::{
        Allocation, PosixFd, Unicast,
        driver::{Call, Code},
    };
    let model = Model::new(ModelConfig::node(4));
    let a = Context::new(model.clone());
    let b = Context::new(model.spawn_process());

    // A unicast export claimed as a team: the kind is the driver's to know
    // (R4.1): AddDevice is refused by the driver, not by a broken rule.
    let uni = a
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let wire = uni.export().unwrap().to_bytes();
    assert!(FabricHandle::<Unicast<Exportable>>::from_bytes(&wire).is_ok());
    let forged = forge(&wire, 2, ALIGN, ALIGN, 2);
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&forged).unwrap();
    let imp = b.reserve_one().unwrap().import(&h).unwrap();
    let f = imp.add_device(1).unwrap_err();
    assert!(
        matches!(
            f.error,
            Error::Driver {
                call: Call::AddDevice,
                code
            } if code == Code::INVALID_VALUE
        ),
        "{}",
        f.error
    );
    drop(f);

    // A team whose alignment is forged: refused before the import (R5.3).
    let team = a
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, 2 * ALIGN).exportable())
        .unwrap();
    let wire = team.export().unwrap().to_bytes();
    let imports = model.calls(Call::Import);
    let forged = forge(&wire, 2, 2 * ALIGN, 4096, 2);
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&forged).unwrap();
    let f = b.reserve_one().unwrap().import(&h).unwrap_err();
    assert!(
        matches!(&f.error, Error::BadHandle { reason, .. } if reason.contains("alignment 4096")),
        "{}",
        f.error
    );
    assert_eq!(
        model.calls(Call::Import),
        imports,
        "refused before the driver"
    );
    drop(f);

    // A team whose size and team size are forged up: one device too many
    // (R4.2) and a bind past the real end (R5.4) are the driver's refusals.
    let forged = forge(&wire, 2, 4 * ALIGN, ALIGN, 3);
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&forged).unwrap();
    let imp = b.reserve_one().unwrap().import(&h).unwrap();
    let imp = imp.add_device(0).unwrap().add_device(1).unwrap();
    let f = imp.add_device(2).unwrap_err();
    assert!(
        matches!(
            f.error,
            Error::Driver {
                call: Call::AddDevice,
                ..
            }
        ),
        "{}",
        f.error
    );
    let imp = f.value.wait(T).unwrap();
    let mem = Allocation::<PosixFd>::on_device(&b, Device(0), ALIGN).unwrap();
    let e = imp.bind(0, 2 * ALIGN, &mem).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Driver {
                call: Call::BindMem,
                ..
            }
        ),
        "{e}"
    );
    drop(imp);
    drop(mem);
    drop((team, uni));
    assert!(b.take_teardown_errors().is_empty());
    clean(&a, &model);
}

/// A `get_host` buffer this process cannot allocate (here an honest
/// endpoint of 2^63 bytes, more than any allocation may be) is refused at
/// enqueue, naming the op, not a panic or an abort in the builder.
#[test]
fn a_get_host_buffer_this_process_cannot_allocate_is_refused_at_enqueue() {
    use cuda_endpoints::{CopyBatch, Stream, Unicast};
    let config = ModelConfig {
        driver_version: 13050,
        ..ModelConfig::node(1)
    }
    .with_devices(|_, d| d.max_size = u64::MAX);
    let model = Model::new(config);
    let a = Context::new(model.clone());
    let b = Context::new(model.spawn_process());
    let size = 1u64 << 63;
    let ep = a
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, size).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let h =
        FabricHandle::<Unicast<Exportable>>::from_bytes(&ep.export().unwrap().to_bytes()).unwrap();
    let imp = b
        .reserve_one()
        .unwrap()
        .import(&h)
        .unwrap()
        .wait(T)
        .unwrap();
    let stream = Stream::new(&b, 0).unwrap();
    let r = stream
        .enqueue(
            CopyBatch::new()
                .put_host(vec![1; 8], &imp, 0)
                .get_host(&imp, 0, size),
        )
        .map(|_| ());
    let e = r.unwrap_err();
    assert_eq!(e, Error::CopyHostBufferUnavailable { op: 1, size }, "{e}");
    assert!(e.is_resource_exhausted());
    drop((stream, imp, ep));
    assert!(b.take_teardown_errors().is_empty());
    clean(&a, &model);
}

/// Fails the first `cuDriverGetVersion`, then answers.
#[derive(Debug)]
struct FlakyVersion {
    inner: Model,
    failed: std::sync::atomic::AtomicBool,
}

impl cuda_endpoints::driver::Forward for FlakyVersion {
    type Inner = Model;
    fn inner(&self) -> &Model {
        &self.inner
    }
    unsafe fn driver_version(&self) -> cuda_endpoints::driver::DriverResult<i32> {
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(cuda_endpoints::driver::Code::NOT_INITIALIZED);
        }
        // SAFETY: forwarded unchanged.
        unsafe { self.inner.driver_version() }
    }
}

/// Item 6: a failed first `cuDriverGetVersion` is not cached as "unknown":
/// the next error of an old driver is still `Unsupported`, naming the version.
#[test]
fn a_failed_first_driver_version_is_asked_again() {
    let model = Model::new(ModelConfig::cuda_13_0(1));
    let ctx = Context::new(FlakyVersion {
        inner: model.clone(),
        failed: Default::default(),
    });
    assert_eq!(ctx.driver_version(), None);
    assert_eq!(ctx.driver_version(), Some(13000));
    let e = ctx.reserve_one().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                driver_version: Some(13000),
                ..
            }
        ),
        "{e}"
    );
    clean(&ctx, &model);
}

/// Item 6: the classic fallback's failures name the `cuMulticast*` call
/// that failed, not the logical-endpoint call it emulates.
#[test]
fn classic_reports_multicast_failures_under_their_own_call() {
    use cuda_endpoints::driver::{Classic, Traced};
    use cuda_endpoints::{
        Allocation, Private,
        driver::{Call, Code},
    };
    let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    let team = [Device(0), Device(1)];
    for (denied, call) in [
        (Call::MulticastCreate, Call::MulticastCreate),
        (Call::MulticastAddDevice, Call::MulticastAddDevice),
        (Call::MulticastBindMem, Call::MulticastBindMem),
    ] {
        let model = Model::new(cfg.clone());
        let traced = Traced::new(model.clone()).deny([denied]);
        let ctx = Context::new(Classic::new(Arc::new(traced)));
        let created = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::multicast(&team, ALIGN));
        let e = match created {
            Err(f) => f.error,
            Ok(ep) => {
                let ep = ep.wait(T).unwrap();
                let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
                let e = ep.bind(0, 0, &mem).unwrap_err();
                drop(ep);
                e
            }
        };
        assert_eq!(
            e,
            Error::Driver {
                call,
                code: Code::NOT_PERMITTED
            },
            "{e}"
        );
        clean(&ctx, &model);
    }
}

/// Item 6: `Traced`'s log and the teardown list are bounded, with a count
/// of what they let go.
#[test]
fn the_trace_log_and_the_teardown_list_are_bounded() {
    use cuda_endpoints::driver::Traced;
    use cuda_endpoints::{Allocation, Private, driver::Call};
    let model = Model::new(ModelConfig::node(1).queries_to_ready(50));
    let traced = Arc::new(Traced::with_capacity(model.clone(), 8));
    let ctx = Context::new(traced.clone());
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN))
        .unwrap();
    // A wait that polls: one log entry per query.
    let f = ep.wait(Duration::from_millis(20));
    let ep = match f {
        Ok(ep) => ep,
        Err(f) => f.value.wait(T).unwrap(),
    };
    assert_eq!(traced.log().len(), 8);
    let before = traced.dropped();
    assert!(before > 0);
    drop(ep);
    assert_eq!(traced.log().len(), 8);
    assert!(traced.dropped() > before);

    // Teardown errors: more than the context keeps.
    let denied = Context::new(Traced::new(model.clone()).deny([Call::MemRelease]));
    let n = Context::TEARDOWN_CAPACITY + 3;
    for _ in 0..n {
        drop(Allocation::<Private>::on_device(&denied, Device(0), 1).unwrap());
    }
    assert_eq!(denied.teardown_errors_dropped(), 3);
    assert_eq!(
        denied.take_teardown_errors().len(),
        Context::TEARDOWN_CAPACITY
    );
    assert!(ctx.take_teardown_errors().is_empty());
    common::no_violations(&model.violations());
}

/// Item 7: a device whose attribute 154 is 0 is refused before the driver,
/// at creation and at enrollment, with the device, attribute and value.
#[test]
fn attribute_154_zero_refuses_creation_and_enrollment_before_the_driver() {
    use cuda_endpoints::typenum::U2;
    use cuda_endpoints::{driver::Call, error::Feature};
    let model = Model::new(ModelConfig::node(3).with_devices(|i, d| d.multicast = i != 2));
    let ctx = Context::new(model.clone());
    let missing = |e: &Error| feature_missing(e, 2, Feature::MulticastEndpoints, 154);
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(2)], ALIGN))
        .unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(model.calls(Call::Create), 0, "refused before the driver");
    let team = f.value.create(Spec::team(U2::new(), ALIGN)).unwrap();
    let team = team.add_device(0).unwrap();
    let f = team.add_device(2).unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(model.calls(Call::AddDevice), 1, "refused before the driver");
    drop(f);
    clean(&ctx, &model);
}

/// R13.1: Export needs no readiness: a pending unicast endpoint is exported
/// (the handle exchange overlaps construction), as a spread team is.
#[test]
fn r13_1_a_pending_unicast_endpoint_exports_without_readiness() {
    let model = Model::new(ModelConfig::node(2));
    let ctx = Context::new(model.clone());
    let uni = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN).exportable())
        .unwrap();
    let pending = uni.export().unwrap();
    let uni = uni.wait(T).unwrap();
    assert_eq!(uni.export().unwrap().to_bytes(), pending.to_bytes());
    let spread = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, ALIGN).exportable())
        .unwrap();
    assert!(spread.export().is_ok(), "a spread team is exported pending");
    drop((uni, spread));
    clean(&ctx, &model);
}

/// Item 7: the fallback decision and the classic backend read attribute 132
/// of the team's devices only, and agree; a refusal names device and value.
#[test]
fn decide_and_classic_agree_on_attribute_132_of_the_team_devices_only() {
    use cuda_endpoints::driver::Classic;
    use cuda_endpoints::{
        Allocation, Private,
        backend::{BackendChoice, Policy},
        error::Feature,
    };
    let cfg = ModelConfig::cuda_13_0(3).with_devices(|i, d| d.classic_multicast = i != 2);
    let model = Model::new(cfg);
    let team = [Device(0), Device(1)];
    let (ctx, decision) =
        Context::auto(model.clone(), &team, &Policy::new().classic(true)).unwrap();
    assert_eq!(decision.choice, BackendChoice::Classic, "{decision}");
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&team, ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(1), ALIGN).unwrap();
    ep.bind(1, 0, &mem).unwrap().unbind().unwrap();
    drop(ep);
    drop(mem);

    let bad = [Device(0), Device(2)];
    let d = cuda_endpoints::backend::decide(&model, &bad, &Policy::new().classic(true));
    let BackendChoice::Unsupported(why) = &d.choice else {
        panic!("{d}")
    };
    assert!(
        why.contains("device 2 (MULTICAST_SUPPORTED, attribute 132 = 0)"),
        "{why}"
    );
    // The classic backend, forced on that team, refuses it the same way.
    let forced = Context::new(Classic::new(Arc::new(model.clone())));
    let f = forced
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&bad, ALIGN))
        .unwrap_err();
    let text = f.error.to_string();
    assert!(
        matches!(
            f.error,
            Error::Unsupported {
                feature: Feature::ClassicMulticastDevice,
                ..
            }
        ) && text.contains("device 2 reports MULTICAST_SUPPORTED (attribute 132) = 0"),
        "{text}"
    );
    drop(f);
    assert!(forced.take_teardown_errors().is_empty());
    clean(&ctx, &model);
}

/// Item 9 (the part in the typed layer): a mapping can be reserved to the
/// bind alignment an endpoint needs, when that exceeds the driver's default
/// address alignment, so that `BindAddr` gets an address it accepts (R5.3).
#[test]
fn a_mapping_can_be_aligned_to_the_bind_alignment() {
    use cuda_endpoints::{Allocation, PosixFd};
    const BIG: u64 = 8 << 20;
    let model = Model::new(ModelConfig::node(1).with_devices(|_, d| d.bind_alignment = BIG));
    let ctx = Context::new(model.clone());
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], BIG))
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(team.bind_alignment(), BIG);
    for _ in 0..3 {
        let mapped = Allocation::<PosixFd>::on_device(&ctx, Device(0), BIG)
            .unwrap()
            .map_aligned(&[Device(0)], team.bind_alignment())
            .unwrap();
        assert_eq!(mapped.device_ptr() % BIG, 0);
        team.bind(0, 0, &mapped).unwrap().unbind().unwrap();
    }
    drop(team);
    clean(&ctx, &model);
}

/// Item 7: attribute 155 is a device's ("Device supports counted operations
/// via logical endpoints", cuda.h), so `COUNTED_OPS` needs it on the devices
/// that take part — the unicast owner, each team device — and the typed
/// layer and the model agree on that: a node with one device without it
/// still makes counted teams of the others; that device is refused before
/// the driver, at creation or at enrollment, with the attribute and value.
#[test]
fn attribute_155_is_needed_on_the_devices_that_take_part_not_on_every_device_of_the_node() {
    use cuda_endpoints::typenum::U2;
    use cuda_endpoints::{driver::Call, error::Feature};
    let model = Model::new(ModelConfig::node(3).with_devices(|i, d| d.counted_ops = i != 2));
    let ctx = Context::new(model.clone());
    let missing = |e: &Error| feature_missing(e, 2, Feature::CountedOps, 155);
    // A team of devices 0 and 1: the model does not look at device 2.
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN).counted_ops())
        .unwrap()
        .wait(T)
        .unwrap();
    team.destroy().unwrap().release().unwrap();
    // A team enrolled later: nothing refused at creation, device 2 at enrollment.
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(U2::new(), ALIGN).counted_ops())
        .unwrap()
        .add_device(0)
        .unwrap();
    let adds = model.calls(Call::AddDevice);
    let f = team.add_device(2).unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(
        model.calls(Call::AddDevice),
        adds,
        "refused before the driver"
    );
    let team = f.value.add_device(1).unwrap().wait(T).unwrap();
    team.destroy().unwrap().release().unwrap();
    // Device 2 as owner or named team device: refused before the create.
    let creates = model.calls(Call::Create);
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(2, ALIGN).counted_ops())
        .unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    let f = f
        .value
        .create(Spec::multicast(&[Device(0), Device(2)], ALIGN).counted_ops())
        .unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(
        model.calls(Call::Create),
        creates,
        "refused before the driver"
    );
    drop(f);
    clean(&ctx, &model);
}

/// Item 7: attribute 158 (`LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES`, 13.5) is
/// read before an exportable endpoint is made: a device whose bitmask lacks
/// FABRIC is refused before the driver, as owner, named team device or
/// device enrolled later, with the device, the attribute and its value. A
/// 13.3 driver does not know the attribute (`INVALID_VALUE`): the crate
/// falls back to creating, and the driver decides.
#[test]
fn attribute_158_without_fabric_refuses_an_exportable_endpoint_before_the_driver() {
    use cuda_endpoints::{driver::Call, error::Feature};
    let no_fabric_on_1 = |version| {
        let mut cfg = ModelConfig::node(2).with_devices(|i, d| d.le_fabric_handles = i != 1);
        cfg.driver_version = version;
        Model::new(cfg)
    };
    let model = no_fabric_on_1(13050);
    let ctx = Context::new(model.clone());
    let missing = |e: &Error| feature_missing(e, 1, Feature::FabricHandles, 158);
    assert_eq!(ctx.attribute(Device(0), 158).unwrap(), 1, "FABRIC");
    let r = ctx.reserve_one().unwrap();
    let f = r.create(Spec::unicast(1, ALIGN).exportable()).unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    let f = f
        .value
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN).exportable())
        .unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(model.calls(Call::Create), 0, "refused before the driver");
    // A spread team: device 1 refused at enrollment, device 0 fine.
    let spread = f
        .value
        .create(Spec::spread(2, ALIGN).exportable())
        .unwrap()
        .add_device(0)
        .unwrap();
    let f = spread.add_device(1).unwrap_err();
    assert!(missing(&f.error), "{}", f.error);
    assert_eq!(model.calls(Call::AddDevice), 1, "refused before the driver");
    drop(f);
    // The owner with FABRIC: made and exported.
    let uni = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    uni.export().unwrap();
    uni.destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
    // 13.3: attribute 158 is INVALID_VALUE; the crate creates anyway.
    let model = no_fabric_on_1(13030);
    let ctx = Context::new(model.clone());
    assert_eq!(
        ctx.attribute(Device(1), 158).map_err(|e| e.code()),
        Err(Some(cuda_endpoints::driver::Code::INVALID_VALUE))
    );
    let uni = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(1, ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    uni.export().unwrap();
    uni.destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
}

/// Issue 13: the range a one-id lifecycle releases is kept for the next
/// `reserve_one` of its context, reset (no facts, no binding, no fabric
/// handle, no orphan flag carried over), and freed with the context: the
/// spare holds no reference to its context, so nothing keeps the driver alive.
#[test]
fn a_released_one_id_range_is_reused_reset_and_freed_with_its_context() {
    let model = Model::new(ModelConfig::default());
    let driver: Arc<dyn Driver> = Arc::new(model.clone());
    let ctx = Context::new(driver.clone());
    let mem =
        cuda_endpoints::Allocation::<cuda_endpoints::Private>::on_device(&ctx, Device(0), ALIGN)
            .unwrap();
    for round in 0..3 {
        let ep = ctx.reserve_one().unwrap();
        assert_eq!(
            (ep.size(), ep.bind_alignment(), ep.devices()),
            (0, 0, &[][..]),
            "round {round}: a reused record starts empty"
        );
        let ep = ep
            .create(Spec::unicast(Device(0), ALIGN))
            .unwrap()
            .wait(T)
            .unwrap();
        let b = ep.bind(Device(0), 0, &mem).unwrap();
        if round == 1 {
            // Forgotten: the endpoint keeps the memory until destroy.
            std::mem::forget(b);
        } else {
            b.unbind().unwrap();
        }
        ep.destroy().unwrap().release().unwrap();
    }
    // A multi-id range is not kept; a one-id range dropped without
    // `release` is released by its `Drop`.
    let range = ctx.reserve(3).unwrap();
    drop(range.into_endpoints());
    drop(ctx.reserve_one().unwrap());
    drop(mem);
    clean(&ctx, &model);
    drop(ctx);
    assert_eq!(
        Arc::strong_count(&driver),
        1,
        "the context's spare range must not keep the context (and its driver) alive"
    );
}

/// `e` is the pre-driver refusal of `device` for lacking `feature`
/// (attribute `attribute` = 0), and its message names both.
fn feature_missing(
    e: &Error,
    device: i32,
    feature: cuda_endpoints::error::Feature,
    attribute: i32,
) -> bool {
    let text = e.to_string();
    matches!(
        e,
        Error::FeatureMissing { device: d, feature: f, attribute: a, value: 0 }
            if *d == Device(device) && *f == feature && *a == attribute
    ) && text.contains(&format!("device {device}"))
        && text.contains(&format!("attribute {attribute} = 0"))
}

/// Issue 21, item 11: a caller's hostile `mem_offset` to `bind_part` on
/// mapped memory is the caller's error (`OutOfRange`, R5.4), not an answer
/// of `cuMemAddressReserve` the crate blames on the driver.
#[test]
fn a_hostile_mem_offset_on_mapped_memory_is_out_of_range_not_a_bad_driver_answer() {
    let model = Model::new(ModelConfig::node(1));
    let ctx = Context::new(model.clone());
    let (team, mapped) = team_and_mapped(&ctx);
    // Aligned, and past the end of the address space from any mapping.
    let hostile = u64::MAX - ALIGN + 1;
    let e = team.bind_part(0, 0, &mapped, hostile, ALIGN).unwrap_err();
    assert!(
        matches!(e, Error::OutOfRange { offset, .. } if offset == hostile),
        "{e}"
    );
    drop(mapped);
    team.destroy().unwrap().release().unwrap();
    clean(&ctx, &model);
}

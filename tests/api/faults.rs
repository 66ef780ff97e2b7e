//! Driver errors, injected one at a time with the model's fault plans:
//!
//! - how each reads (rule R5.10: out of memory on a multicast call means
//!   exhausted fabric resources; SYSTEM_NOT_READY is fabric software down and
//!   retryable; ILLEGAL_STATE is a misconfigured system), and that the
//!   endpoint stays usable after a failed bind;
//! - teardown errors are never swallowed: an unbind, destroy, unmap, release
//!   that fails in `Drop` is recorded on the context, and memory that may
//!   still be bound is kept alive (leaked) rather than released;
//! - a sweep that fails the n-th driver call of a whole lifecycle, for every
//!   n: each fault surfaces exactly once, naming its call, nothing breaks a
//!   rule, and nothing leaks unless a teardown call failed.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the faults fire
//! in the libcuda test double, behind the real backend; the sweep over a
//! two-process lifecycle stays on the model.

use crate::backend;

use std::time::Duration;

use backend::{F, Probe};
use cuda_endpoints::model::{
    Live, ModelConfig,
    faults::{self, Fault, FaultPlan},
};
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{
    Allocation, Context, Device, Endpoint, Error, Exportable, FabricHandle, Multicast, PosixFd,
    Private, Ready, Spec, Unicast,
    driver::{Call, Code},
};

const MIB: u64 = 1 << 20;
const ALIGN: u64 = 2 * MIB;
const T: Duration = Duration::from_secs(5);

fn node() -> (Context, Probe) {
    backend::context(ModelConfig::node(4))
}

fn team(ctx: &Context, devs: &[i32]) -> Endpoint<Ready, Multicast> {
    let devs: Vec<Device> = devs.iter().map(|&d| Device(d)).collect();
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs, 4 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn unicast(ctx: &Context) -> Endpoint<Ready, Unicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 4 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn only(call: Call, code: Code) -> Vec<F> {
    vec![F::nth(call, 1, code)]
}

fn clean(ctx: &Context, model: &Probe) {
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

fn clean_model(ctx: &Context, model: &cuda_endpoints::model::Model) {
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

// ------------------------------------------------------------ error mapping

#[test]
fn out_of_memory_on_multicast_create_reads_as_exhausted_fabric_resources() {
    let (ctx, model) = node();
    model.set_faults(&only(Call::Create, Code::OUT_OF_MEMORY));
    let f = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
        .unwrap_err();
    assert_eq!(
        f.error,
        Error::Driver {
            call: Call::Create,
            code: Code::OUT_OF_MEMORY
        }
    );
    let msg = f.error.to_string();
    assert!(msg.contains("cuLogicalEndpointCreate"), "{msg}");
    assert!(
        msg.contains("multicast groups") && msg.contains("exhausted"),
        "{msg}"
    );
    assert!(f.error.is_resource_exhausted() && !f.error.is_retryable());
    // The id came back reserved; the same create succeeds now.
    let ep = f
        .value
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
        .unwrap();
    drop(ep);
    clean(&ctx, &model);
}

#[test]
fn out_of_memory_on_multicast_bind_reads_as_exhausted_and_the_endpoint_stays_usable() {
    let (ctx, model) = node();
    let mc = team(&ctx, &[0, 1]);
    let mem = Allocation::<Private>::on_device(&ctx, Device(1), ALIGN).unwrap();
    let mapped = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN)
        .unwrap()
        .map::<Device>(&[])
        .unwrap();
    for (call, bind) in [
        (Call::BindMem, &mut || {
            mc.bind(1, 0, &mem).map(drop) as Result<(), Error>
        }),
        (Call::BindAddr, &mut || mc.bind(0, 0, &mapped).map(drop)),
    ] as [(Call, &mut dyn FnMut() -> Result<(), Error>); 2]
    {
        model.set_faults(&only(call, Code::OUT_OF_MEMORY));
        let e = bind().unwrap_err();
        assert_eq!(e, Error::driver(call, Code::OUT_OF_MEMORY));
        assert!(e.to_string().contains("multicast groups"), "{e}");
        assert!(e.is_resource_exhausted() && !e.is_retryable());
        assert_eq!(
            model.live().bindings,
            0,
            "the binding did not happen (R5.10)"
        );
        bind().unwrap(); // the endpoint stays usable: bind again, unbind on drop
    }
    drop((mc, mem, mapped));
    clean(&ctx, &model);
}

#[test]
fn fabric_down_and_misconfigured_read_as_such() {
    let (ctx, model) = node();
    let mc = team(&ctx, &[0, 1]);
    let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();

    model.set_faults(&only(Call::BindMem, Code::SYSTEM_NOT_READY));
    let e = mc.bind(0, 0, &mem).unwrap_err();
    assert_eq!(e.code(), Some(Code::SYSTEM_NOT_READY));
    let msg = e.to_string();
    assert!(
        msg.contains("fabric software") && msg.contains("not running"),
        "{msg}"
    );
    assert!(e.is_retryable(), "SYSTEM_NOT_READY is retryable");

    model.set_faults(&only(Call::BindMem, Code::ILLEGAL_STATE));
    let e = mc.bind(0, 0, &mem).unwrap_err();
    assert_eq!(e.code(), Some(Code::ILLEGAL_STATE));
    assert!(e.to_string().contains("misconfigured"), "{e}");
    assert!(
        !e.is_retryable(),
        "a misconfigured system needs fixing, not retrying"
    );

    // The endpoint stays usable after both (R5.10).
    let b = mc.bind(0, 0, &mem).unwrap();
    b.unbind().unwrap();
    drop((mc, mem));
    clean(&ctx, &model);
}

#[test]
fn a_retry_loop_outlasts_a_transient_fabric_outage() {
    let (ctx, model) = node();
    let mc = team(&ctx, &[0]);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    // The fabric manager comes up after three refusals.
    model.set_faults(&[F::nth(Call::BindMem, 1, Code::SYSTEM_NOT_READY).times(3)]);
    let mut tries = 0;
    let b = loop {
        tries += 1;
        match mc.bind(0, 0, &mem) {
            Ok(b) => break b,
            Err(e) if e.is_retryable() && tries < 10 => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(tries, 4);
    assert_eq!(model.faults_fired(), 3);
    drop(b);
    drop((mc, mem));
    clean(&ctx, &model);
}

/// Every code the contract allows a bind (R11, R5.10) reads as a driver error
/// naming the call, binds nothing, and leaves the endpoint usable.
#[test]
fn every_bind_code_leaves_the_endpoint_usable() {
    let (ctx, model) = node();
    let uc = unicast(&ctx);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    for &code in faults::allowed_codes(Call::BindMem) {
        model.set_faults(&only(Call::BindMem, code));
        let e = uc.bind(0, ALIGN, &mem).unwrap_err();
        assert_eq!(e, Error::driver(Call::BindMem, code));
        assert!(
            e.to_string()
                .starts_with("cuLogicalEndpointBindMem failed with"),
            "{e}"
        );
        assert_eq!(model.live().bindings, 0);
        let b = uc.bind(0, ALIGN, &mem).unwrap();
        assert_eq!(model.live().bindings, 1);
        drop(b);
    }
    drop((uc, mem));
    clean(&ctx, &model);
}

#[test]
fn a_failing_query_ends_a_wait_at_once_with_the_endpoint_back() {
    let (ctx, model) = node();
    let p = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(U2::new(), ALIGN))
        .unwrap()
        .add_device(0)
        .unwrap()
        .add_device(1)
        .unwrap();
    model.set_faults(&[F::always(Call::Query, Code::NOT_INITIALIZED)]);
    // At once: the first failing query ends the wait (one query, its error,
    // not a timeout), whatever the machine's load.
    let before = model.calls(Call::Query);
    let f = p.wait(Duration::from_secs(60)).unwrap_err();
    assert_eq!(f.error, Error::driver(Call::Query, Code::NOT_INITIALIZED));
    assert_eq!(
        model.calls(Call::Query) - before,
        1,
        "one query, then the error"
    );
    model.set_faults(&[]);
    let ready = f.value.wait(T).unwrap();
    drop(ready);
    clean(&ctx, &model);
}

#[test]
fn add_device_failing_inside_create_undoes_the_create() {
    let (ctx, model) = node();
    let spec = || Spec::multicast(&[Device(0), Device(1), Device(2)], ALIGN);
    model.set_faults(&[F::nth(Call::AddDevice, 2, Code::INVALID_DEVICE)]);
    let f = ctx.reserve_one().unwrap().create(spec()).unwrap_err();
    assert_eq!(
        f.error,
        Error::driver(Call::AddDevice, Code::INVALID_DEVICE)
    );
    assert_eq!(model.live().endpoints, 0, "create undone");
    let ep = f.value.create(spec()).unwrap().wait(T).unwrap();
    drop(ep);
    clean(&ctx, &model);
}

#[test]
fn add_device_failing_inside_create_whose_undo_fails_too_is_recorded_and_retried() {
    let (ctx, model) = node();
    let spec = || Spec::multicast(&[Device(0), Device(1)], ALIGN);
    model.set_faults(&[
        F::nth(Call::AddDevice, 2, Code::INVALID_DEVICE),
        F::nth(Call::Destroy, 1, Code::NOT_PERMITTED),
    ]);
    let f = ctx.reserve_one().unwrap().create(spec()).unwrap_err();
    assert_eq!(
        f.error,
        Error::driver(Call::AddDevice, Code::INVALID_DEVICE)
    );
    // The failed undo is not swallowed.
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::Destroy, Code::NOT_PERMITTED)]
    );
    assert_eq!(model.live().endpoints, 1, "still attached to the id");
    // The next create on the id destroys the orphan first.
    let ep = f.value.create(spec()).unwrap();
    assert_eq!(model.live().endpoints, 1);
    drop(ep);
    clean(&ctx, &model);
}

// ---------------------------------------------------- teardown not swallowed

#[test]
fn unbind_failing_in_drop_is_recorded_and_memory_stays_until_destroy() {
    let (ctx, model) = node();
    let mc = team(&ctx, &[0, 1]);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    let b = mc.bind(0, 0, &mem).unwrap();
    model.set_faults(&only(Call::Unbind, Code::NOT_PERMITTED));
    drop(b);
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::Unbind, Code::NOT_PERMITTED)]
    );
    // Still bound: dropping the allocation must not release it.
    drop(mem);
    let live = model.live();
    assert_eq!((live.bindings, live.allocations), (1, 1), "{live:?}");
    assert_eq!(model.calls(Call::MemRelease), 0, "not released while bound");
    // Destroy unbinds everything (R7), and only then is the memory released.
    let id = mc.destroy().unwrap();
    assert_eq!(model.live().allocations, 0);
    assert_eq!(model.calls(Call::MemRelease), 1);
    id.release().unwrap();
    clean(&ctx, &model);
}

#[test]
fn explicit_unbind_failure_is_returned_and_memory_stays_until_destroy() {
    let (ctx, model) = node();
    let uc = unicast(&ctx);
    let mapped = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    let b = uc.bind(0, 0, &mapped).unwrap();
    model.set_faults(&only(Call::Unbind, Code::DEINITIALIZED));
    let e = b.unbind().unwrap_err();
    assert_eq!(e, Error::driver(Call::Unbind, Code::DEINITIALIZED));
    assert!(e.to_string().contains("shutting down"), "{e}");
    drop(mapped);
    let live = model.live();
    assert_eq!(
        (
            live.bindings,
            live.allocations,
            live.mappings,
            live.address_ranges
        ),
        (1, 1, 1, 1),
        "bound through its address: the mapping stays too"
    );
    drop(uc);
    assert!(ctx.take_teardown_errors().is_empty());
    clean(&ctx, &model);
}

#[test]
fn destroy_failing_in_drop_is_recorded_memory_kept_and_retried_at_release() {
    let (ctx, model) = node();
    let [a, b] = ctx.reserve(2).unwrap().into_array::<2>().unwrap();
    let a = a.create(Spec::unicast(0, ALIGN)).unwrap().wait(T).unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    std::mem::forget(a.bind(0, 0, &mem).unwrap());
    drop(mem);
    model.set_faults(&only(Call::Destroy, Code::NOT_PERMITTED));
    drop(a);
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::Destroy, Code::NOT_PERMITTED)]
    );
    let live = model.live();
    assert_eq!(
        (live.ids, live.endpoints, live.bindings, live.allocations),
        (2, 1, 1, 1),
        "{live:?}"
    );
    // The range outlives the failed destroy; releasing it destroys first
    // (R1.2), and only then frees the memory the binding kept.
    b.release().unwrap();
    clean(&ctx, &model);
}

#[test]
fn destroy_failing_again_at_release_leaks_rather_than_frees_bound_memory() {
    let (ctx, model) = node();
    let a = unicast(&ctx);
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    std::mem::forget(a.bind(0, 0, &mem).unwrap());
    drop(mem);
    model.set_faults(&[F::always(Call::Destroy, Code::NOT_PERMITTED)]);
    drop(a); // destroy fails in Drop, then again when the range is released
    assert_eq!(
        ctx.take_teardown_errors(),
        [
            Error::driver(Call::Destroy, Code::NOT_PERMITTED),
            Error::driver(Call::Destroy, Code::NOT_PERMITTED)
        ]
    );
    let live = model.live();
    assert_eq!((live.ids, live.bindings, live.allocations), (1, 1, 1));
    assert_eq!(
        model.calls(Call::MemRelease),
        0,
        "never released while bound"
    );
    assert_eq!(
        model.calls(Call::IdRelease),
        0,
        "ids kept while they hold an endpoint"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[test]
fn unmap_release_and_id_release_failures_are_recorded() {
    let (ctx, model) = node();
    let mapped = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN)
        .unwrap()
        .map::<Device>(&[])
        .unwrap();
    model.set_faults(&only(Call::MemUnmap, Code::NOT_PERMITTED));
    drop(mapped);
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::MemUnmap, Code::NOT_PERMITTED)]
    );
    // Still mapped: nothing behind it was released or freed.
    assert_eq!(
        model.live(),
        Live {
            allocations: 1,
            mappings: 1,
            address_ranges: 1,
            ..Live::default()
        }
    );
    assert_eq!(model.calls(Call::MemRelease), 0);

    drop((ctx, model)); // one node at a time (the double has one)
    let (ctx, model) = node();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    model.set_faults(&only(Call::MemRelease, Code::NOT_INITIALIZED));
    drop(mem);
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::MemRelease, Code::NOT_INITIALIZED)]
    );

    drop((ctx, model)); // one node at a time (the double has one)
    let (ctx, model) = node();
    let mem = Allocation::<Private>::on_device(&ctx, Device(0), ALIGN).unwrap();
    model.set_faults(&[
        F::nth(Call::MemAddressFree, 1, Code::NOT_PERMITTED),
        F::nth(Call::MemMap, 1, Code::OUT_OF_MEMORY),
    ]);
    // A failed map undoes its address reservation; that failing is recorded.
    let f = mem.map::<Device>(&[]).unwrap_err();
    assert_eq!(f.error, Error::driver(Call::MemMap, Code::OUT_OF_MEMORY));
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::MemAddressFree, Code::NOT_PERMITTED)]
    );
    drop(f);

    drop((ctx, model)); // one node at a time (the double has one)
    let (ctx, model) = node();
    model.set_faults(&only(Call::IdRelease, Code::NOT_PERMITTED));
    drop(ctx.reserve(3).unwrap());
    assert_eq!(
        ctx.take_teardown_errors(),
        [Error::driver(Call::IdRelease, Code::NOT_PERMITTED)]
    );
    model.set_faults(&only(Call::IdRelease, Code::NOT_PERMITTED));
    let e = ctx.reserve_one().unwrap().release().unwrap_err();
    assert_eq!(e, Error::driver(Call::IdRelease, Code::NOT_PERMITTED));
    assert!(
        ctx.take_teardown_errors().is_empty(),
        "returned, not also recorded"
    );
    assert!(model.violations().is_empty());
}

// ------------------------------------------------------------- the sweep

/// A whole lifecycle over two processes: reserve, create (unicast, a
/// compile-time team, an exportable multicast), enroll, wait, allocate and
/// map, bind by handle and by address, export and import, unbind, destroy,
/// release. Errors go up with `?`; whatever is live then is dropped.
fn lifecycle(ctx: &Context, peer: &Context) -> Result<(), Error> {
    let [u, t, x] = ctx
        .reserve(3)?
        .into_array::<3>()
        .map_err(|_| Error::EmptyTeam)?;
    let u = u.create(Spec::unicast(0, 4 * ALIGN))?.wait(T)?;
    let t = t
        .create(Spec::team(U2::new(), 2 * ALIGN))?
        .add_device(0)?
        .add_device(1)?
        .wait(T)?;
    let x = x
        .create(Spec::multicast(&[Device(2)], ALIGN).exportable())?
        .wait(T)?;
    let m0 = Allocation::<Private>::on_device(ctx, Device(0), ALIGN)?;
    let m1 = Allocation::<Private>::on_device(ctx, Device(1), 2 * ALIGN)?.map(&[Device(0)])?;
    let m2 = Allocation::<PosixFd>::on_device(ctx, Device(2), ALIGN)?;
    let b0 = u.bind(0, ALIGN, &m0)?;
    let b1 = t.bind_part(1, 0, &m1, ALIGN, ALIGN)?;
    let b2 = x.bind(2, 0, &m2)?;
    let wire = x.export()?.to_bytes();
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire)?;
    let imported = peer.reserve_one()?.import(&h)?.wait(T)?;
    b0.unbind()?;
    drop(b1);
    b2.unbind()?;
    imported.destroy()?.release()?;
    u.destroy()?.release()?;
    t.destroy()?;
    drop(x);
    drop((m0, m1, m2));
    Ok(())
}

/// Fails the n-th driver call of [`lifecycle`], for every n, with a code
/// the contract allows that call.
#[test]
fn failing_each_call_of_a_lifecycle_in_turn() {
    let make = || {
        let (ctx, model) = Context::model(ModelConfig::node(4).queries_to_ready(1));
        let peer = Context::new(model.spawn_process());
        // Cached up front, as any program that asked once would have it.
        ctx.driver_version();
        peer.driver_version();
        (ctx, peer, model)
    };
    let (ctx, peer, model) = make();
    let before = model.trace().len();
    lifecycle(&ctx, &peer).unwrap();
    clean_model(&ctx, &model);
    let calls: Vec<Call> = model.trace()[before..].to_vec();
    assert!(calls.len() > 40, "{}", calls.len());
    let mut leaked_after_teardown_fault = 0;
    for (n, &call) in calls.iter().enumerate() {
        let codes = faults::allowed_codes(call);
        let code = codes[n % codes.len()];
        let (ctx, peer, model) = make();
        model.set_faults(FaultPlan::none().with(Fault::nth_any(n as u64 + 1, code)));
        let r = lifecycle(&ctx, &peer);
        assert_eq!(model.faults().history().collect::<Vec<_>>(), [(call, code)]);
        let want = Error::driver(call, code);
        let mut surfaced: Vec<Error> = r.err().into_iter().collect();
        surfaced.extend(ctx.take_teardown_errors());
        surfaced.extend(peer.take_teardown_errors());
        assert_eq!(surfaced, [want], "call {n} ({call}) surfaces exactly once");
        assert!(
            model.violations().is_empty(),
            "call {n} ({call}): {:?}",
            model.violations()
        );
        if faults::is_teardown(call) {
            leaked_after_teardown_fault += !model.live_node().is_empty() as u32;
        } else {
            assert!(
                model.live_node().is_empty(),
                "call {n} ({call}) leaked {:?}",
                model.live_node()
            );
        }
    }
    // Some teardown faults keep memory alive on purpose; not all of them.
    assert!(leaked_after_teardown_fault > 0);
}

/// The model flags what the typed API must never do: release the handle of
/// memory that is still bound (R7.2). Mapped but unbound is fine.
#[test]
fn the_model_refuses_to_release_bound_memory() {
    use cuda_endpoints::Location;
    use cuda_endpoints::driver::Driver;
    use cuda_endpoints::driver::{AllocationRequest, EndpointProps, Shape};
    let m = backend::raw(ModelConfig::node(1).queries_to_ready(0));
    // SAFETY: raw calls on a model no typed object uses; the test owns
    // everything it names (and breaks R7.2 on purpose, which the model refuses).
    unsafe {
        let id = m.id_reserve(1).unwrap();
        let prop = EndpointProps::new(Shape::Unicast { owner: Device(0) }, ALIGN);
        m.create(id, prop).unwrap();
        assert!(m.query(id, 1).unwrap());
        let req = AllocationRequest {
            location: Location::Device(Device(0)),
            handle_types: 0,
        };
        let h = m.mem_create(ALIGN, req).unwrap();
        m.bind_mem(id, Device(0), 0, h, 0, ALIGN, 0).unwrap();
        assert_eq!(m.mem_release(h), Err(Code::INVALID_VALUE));
        assert_eq!(m.violations()[0].rule, "R7.2");
        m.unbind(id, Device(0), 0, ALIGN).unwrap();
        m.mem_release(h).unwrap();
        m.destroy(id).unwrap();
        m.id_release(id, 1).unwrap();
    }
    assert!(m.live().is_empty());
}

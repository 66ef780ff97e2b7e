//! The erased twin (`DynEndpoint`) and the owning form (`BoundEndpoint`):
//! run-time-checked typing back, and teardown in the only safe order with
//! nothing left behind.

use std::time::Duration;

use cuda_endpoints::{
    Allocation, BoundEndpoint, Context, DynEndpoint, Multicast, NoKind, Pending, Private, Ready,
    Reserved, Spec, Unicast,
};

#[test]
fn into_dyn_keeps_state_and_kind_and_types_back_only_when_they_match() {
    let (ctx, model) = Context::model(Default::default());
    let mut all: Vec<DynEndpoint> = Vec::new();
    let mut ids = ctx
        .reserve(3)
        .expect("reserve")
        .into_endpoints()
        .into_iter();
    let a = ids.next().expect("id");
    let b = ids.next().expect("id");
    all.push(ids.next().expect("id").into_dyn());
    all.push(
        a.create(Spec::unicast(0, 2 << 20))
            .expect("create")
            .into_dyn(),
    );
    let ready = b
        .create(Spec::multicast(&[0.into(), 1.into()], 2 << 20))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    all.push(ready.into_dyn());
    assert_eq!(
        all.iter()
            .map(|d| (d.state_name(), d.kind_name()))
            .collect::<Vec<_>>(),
        [
            ("Reserved", "no kind"),
            ("Pending", "unicast"),
            ("Ready", "multicast")
        ]
    );
    let reserved = all.remove(0);
    assert!(reserved.is::<Reserved, NoKind>());
    let reserved = reserved
        .try_into_typed::<Pending, Unicast>()
        .expect_err("wrong state");
    let _r: cuda_endpoints::Endpoint<Reserved> = reserved.try_into_typed().expect("typed back");
    let team = all.pop().expect("team");
    let team = team
        .try_into_typed::<Ready, Multicast>()
        .expect("typed back");
    let mem = Allocation::<Private>::on_device(&ctx, 1, 2 << 20).expect("alloc");
    drop(team.bind(1, 0, &mem).expect("bind"));
    drop((team, mem, all, _r));
    assert!(model.live().is_empty(), "{:?}", model.live());
    assert!(model.violations().is_empty());
}

/// A struct that lives as long as a communicator: no lifetime parameter.
struct Communicator {
    window: BoundEndpoint<Multicast, Allocation<Private>>,
}

#[test]
fn bound_endpoint_owns_endpoint_and_memory_and_tears_down_in_order() {
    let (ctx, model) = Context::model(Default::default());
    let devices = [0.into(), 1.into()];
    let ep = ctx
        .reserve_one()
        .expect("reserve")
        .create(Spec::multicast(&devices, 4 << 20))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    let mut window = ep.into_bound();
    for d in 0..2 {
        let mem = Allocation::<Private>::on_device(&ctx, d, 4 << 20).expect("alloc");
        window.bind(d, 0, mem).expect("bind");
    }
    let bad = Allocation::<Private>::on_device(&ctx, 0, 2 << 20).expect("alloc");
    let back = window.bind(0, 0, bad).expect_err("overlap (R5.9)");
    drop(back.value); // the memory came back with the error
    let comm = Communicator { window };
    assert_eq!(comm.window.devices().len(), 2);
    assert_eq!(model.live().bindings, 2);
    drop(comm); // unbind, destroy, free
    assert!(model.live().is_empty(), "{:?}", model.live());
    assert!(model.violations().is_empty());

    // The explicit teardown hands endpoint and memory back.
    let ep = ctx
        .reserve_one()
        .expect("reserve")
        .create(Spec::multicast(&devices, 2 << 20))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    let mut w = ep.into_bound();
    w.bind(
        0,
        0,
        Allocation::<Private>::on_device(&ctx, 0, 2 << 20).expect("alloc"),
    )
    .expect("bind");
    let (ep, mem) = w.unbind_all().expect("unbind");
    assert_eq!(mem.len(), 1);
    ep.destroy().expect("destroy").release().expect("release");
    drop(mem);
    assert!(model.live().is_empty(), "{:?}", model.live());
}

/// Issue 21, item 10: when an unbind fails, `unbind_all` still hands the
/// endpoint and the memory back (with the error), as its docs promise.
#[test]
fn unbind_all_with_a_failing_unbind_hands_back_the_endpoint_and_the_memory() {
    use cuda_endpoints::driver::{Call, Code};
    use cuda_endpoints::model::faults::{Fault, FaultPlan};
    let (ctx, model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()
        .expect("reserve")
        .create(Spec::unicast(0, 2 << 20))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    let mut w = ep.into_bound();
    w.bind(
        0,
        0,
        Allocation::<Private>::on_device(&ctx, 0, 2 << 20).expect("alloc"),
    )
    .expect("bind");
    model.set_faults(FaultPlan::none().with(Fault::nth(Call::Unbind, 1, Code::NOT_PERMITTED)));
    let failed = w.unbind_all().expect_err("the planned unbind failure");
    assert_eq!(
        failed.error.code(),
        Some(Code::NOT_PERMITTED),
        "{}",
        failed.error
    );
    let (ep, mem) = failed.value;
    assert_eq!(mem.len(), 1);
    // The endpoint is still there to destroy, which unbinds what stayed.
    assert_eq!(model.live().endpoints, 1);
    ep.destroy().expect("destroy").release().expect("release");
    drop(mem);
    assert!(model.live().is_empty(), "{:?}", model.live());
}

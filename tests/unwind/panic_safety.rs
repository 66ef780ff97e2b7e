//! Panic safety: user code that panics anywhere between reserving ids and
//! releasing them leaves nothing behind. Each lifecycle below has numbered
//! checkpoints; it is run once per checkpoint with a panic there, caught
//! with `catch_unwind`, and the model must then hold nothing (every id,
//! endpoint, binding, allocation, mapping and address range given back), have
//! logged no rule violation, and the context no teardown error.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::time::Duration;

use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{
    Allocation, Context, Device, Exportable, FabricHandle, Multicast, PosixFd, Private, Readiness,
    Spec, wait_all,
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// Panics are the point here: keep the test output quiet.
fn quiet() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned = info.payload().is::<Checkpoint>()
                // `thread::scope` re-raises a thread's panic with this text.
                || info.payload().downcast_ref::<&str>() == Some(&"a scoped thread panicked");
            if !planned {
                default(info);
            }
        }));
    });
}

/// The payload of a planned panic.
struct Checkpoint(#[allow(dead_code)] u32);

/// Counts checkpoints and panics at the planned one.
struct Plan {
    at: u32,
    seen: u32,
}

impl Plan {
    fn step(&mut self) {
        if self.seen == self.at {
            std::panic::panic_any(Checkpoint(self.at));
        }
        self.seen += 1;
    }
}

/// Runs `f` with a panic at each checkpoint in turn, until a run has none;
/// after each, the node must be empty. Returns the number of checkpoints.
fn each_checkpoint(f: impl Fn(&Context, &Context, &mut Plan)) -> u32 {
    quiet();
    for at in 0.. {
        let (ctx, model) = Context::model(ModelConfig::node(4));
        let peer = Context::new(model.spawn_process());
        let mut plan = Plan { at, seen: 0 };
        let r = catch_unwind(AssertUnwindSafe(|| f(&ctx, &peer, &mut plan)));
        check(&ctx, &peer, &model, at);
        match r {
            Ok(()) => return at,
            Err(p) => assert!(p.is::<Checkpoint>(), "a real panic at checkpoint {at}"),
        }
    }
    unreachable!()
}

fn check(ctx: &Context, peer: &Context, model: &Model, at: u32) {
    assert!(
        model.live_node().is_empty(),
        "panic at checkpoint {at} leaked {:?}",
        model.live_node()
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(peer.take_teardown_errors().is_empty());
}

#[test]
fn a_panic_anywhere_in_a_multicast_lifecycle_leaks_nothing() {
    let n = each_checkpoint(|ctx, _, p| {
        p.step();
        let range = ctx.reserve(3).unwrap();
        p.step();
        let [a, b, c] = range.into_array::<3>().unwrap();
        p.step();
        let team = a.create(Spec::team(U2::new(), 4 * ALIGN)).unwrap();
        p.step();
        let team = team.add_device(0).unwrap();
        p.step();
        let team = team.add_device(1).unwrap();
        p.step();
        let uni = b.create(Spec::unicast(2, 2 * ALIGN)).unwrap();
        p.step();
        let uni = match uni.poll().unwrap() {
            Readiness::Ready(r) => r,
            Readiness::Pending(q) => {
                p.step();
                q.wait(T).unwrap()
            }
        };
        p.step();
        let team = team.wait(T).unwrap();
        p.step();
        let m0 = Allocation::<Private>::on_device(ctx, Device(0), 2 * ALIGN).unwrap();
        p.step();
        let m1 = Allocation::<PosixFd>::on_device(ctx, Device(1), ALIGN)
            .unwrap()
            .map(&[Device(1)])
            .unwrap();
        p.step();
        let m2 = Allocation::<Private>::on_device(ctx, Device(2), ALIGN).unwrap();
        p.step();
        let b0 = team.bind(0, 0, &m0).unwrap();
        p.step();
        let b1 = team.bind(1, 2 * ALIGN, &m1).unwrap();
        p.step();
        std::mem::forget(uni.bind(2, ALIGN, &m2).unwrap());
        p.step();
        b0.unbind().unwrap();
        p.step();
        drop(b1);
        p.step();
        let a = team.destroy().unwrap();
        p.step();
        drop(uni);
        p.step();
        a.release().unwrap();
        p.step();
        drop((m0, m1, m2));
        p.step();
        c.release().unwrap();
        p.step();
    });
    assert!(n >= 20, "{n} checkpoints");
}

#[test]
fn a_panic_anywhere_while_sharing_between_processes_leaks_nothing() {
    each_checkpoint(|ctx, peer, p| {
        let x = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::multicast(&[Device(0), Device(1)], ALIGN).exportable())
            .unwrap();
        p.step();
        let x = x.wait(T).unwrap();
        p.step();
        let mem = Allocation::<PosixFd>::on_device(ctx, Device(0), ALIGN).unwrap();
        let b = x.bind(0, 0, &mem).unwrap();
        p.step();
        let wire = x.export().unwrap().to_bytes();
        p.step();
        let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire).unwrap();
        let imported = peer.reserve_one().unwrap().import(&h).unwrap();
        p.step();
        drop(x_after(b, p));
        p.step();
        let imported = imported.wait(T).unwrap();
        p.step();
        drop(imported);
        p.step();
        drop(x);
        p.step();
    });

    // A checkpoint inside a helper that holds a binding.
    fn x_after<'a>(b: cuda_endpoints::Binding<'a>, p: &mut Plan) -> cuda_endpoints::Binding<'a> {
        p.step();
        b
    }
}

#[test]
fn a_panic_while_many_endpoints_wait_together_leaks_nothing() {
    each_checkpoint(|ctx, _, p| {
        let eps = ctx.reserve(8).unwrap().into_endpoints();
        p.step();
        let mut pending = Vec::new();
        for (i, ep) in eps.into_iter().enumerate() {
            pending.push(ep.create(Spec::unicast(i as i32 % 4, ALIGN)).unwrap());
            if i % 3 == 0 {
                p.step();
            }
        }
        let pending = match wait_all(pending, Duration::ZERO) {
            Ok(_) => unreachable!("construction takes more than one query"),
            Err(f) => f.value,
        };
        p.step();
        let ready = wait_all(pending, T).unwrap();
        p.step();
        let mems: Vec<_> = (0..4)
            .map(|d| Allocation::<Private>::on_device(ctx, Device(d), ALIGN).unwrap())
            .collect();
        p.step();
        let bindings: Vec<_> = ready
            .iter()
            .enumerate()
            .map(|(i, ep)| ep.bind(i as i32 % 4, 0, &mems[i % 4]).unwrap())
            .collect();
        p.step();
        drop(bindings);
        p.step();
        for ep in ready {
            ep.destroy().unwrap().release().unwrap();
            p.step();
        }
    });
}

/// A panic in another thread, with a binding alive there: the scope
/// propagates it, and everything unwinds in order.
#[test]
fn a_panic_in_a_binding_thread_leaks_nothing() {
    quiet();
    let (ctx, model) = Context::model(ModelConfig::node(4));
    let r = catch_unwind(AssertUnwindSafe(|| {
        let team = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
            .unwrap()
            .wait(T)
            .unwrap();
        let mems: Vec<_> = (0..2)
            .map(|d| Allocation::<Private>::on_device(&ctx, Device(d), ALIGN).unwrap())
            .collect();
        std::thread::scope(|s| {
            for (d, mem) in mems.iter().enumerate() {
                let team = &team;
                s.spawn(move || {
                    let _b = team.bind(d as i32, 0, mem).unwrap();
                    if d == 1 {
                        std::panic::panic_any(Checkpoint(1));
                    }
                });
            }
        });
    }));
    assert!(r.is_err());
    assert!(model.live().is_empty(), "{:?}", model.live());
    assert!(model.violations().is_empty());
    assert!(ctx.take_teardown_errors().is_empty());
}

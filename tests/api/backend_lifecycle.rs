//! Random lifecycles through the typed API, with random driver faults, on
//! whichever backend the fixture picks: the model directly, or (with
//! `CUDA_ENDPOINTS_TEST_BACKEND=cuda`, `ci/double.sh`) the real backend on the
//! libcuda test double, where every step crosses the C ABI. Whatever the
//! sequence and the faults: no call breaks a rule, no teardown fails, and
//! nothing is left once everything is dropped.
//!
//! (`tests/proptest_lifecycle.rs` explores more, with two simulated
//! processes and fault histories, on the model only.)

use crate::backend;
use crate::common;

use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{
    Allocation, Device, Endpoint, Error, Failed, Location, Mapped, Multicast, Pending, Private,
    Ready, Reserved, Spec, Unicast,
};
use proptest::prelude::*;

const ALIGN: u64 = 2 << 20;
const DEVICES: i32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Reserve(u32),
    Unicast {
        at: u8,
        dev: i32,
        units: u64,
    },
    Team {
        at: u8,
        devs: Vec<i32>,
        units: u64,
    },
    Wait {
        at: u8,
        long: bool,
    },
    Alloc {
        dev: i32,
        units: u64,
        map: bool,
    },
    /// Bind memory `mem` at `offset` units on the endpoint's first device,
    /// then end the binding: 0 unbind, 1 drop, 2 forget (the endpoint keeps
    /// the memory, R7.2).
    Bind {
        at: u8,
        mem: u8,
        offset: u64,
        end: u8,
    },
    Destroy {
        at: u8,
    },
    DropEp {
        at: u8,
    },
    DropMem {
        at: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let at = any::<u8>();
    prop_oneof![
        2 => (1u32..4).prop_map(Op::Reserve),
        3 => (at, 0..DEVICES, 1u64..4).prop_map(|(at, dev, units)| Op::Unicast { at, dev, units }),
        2 => (at, prop::sample::subsequence((0..DEVICES).collect::<Vec<_>>(), 1..=2), 1u64..4)
            .prop_map(|(at, devs, units)| Op::Team { at, devs, units }),
        3 => (at, prop::bool::weighted(0.8)).prop_map(|(at, long)| Op::Wait { at, long }),
        3 => (0..DEVICES, 1u64..3, any::<bool>()).prop_map(|(dev, units, map)| Op::Alloc { dev, units, map }),
        5 => (at, any::<u8>(), 0u64..3, 0u8..3).prop_map(|(at, mem, offset, end)| Op::Bind { at, mem, offset, end }),
        1 => at.prop_map(|at| Op::Destroy { at }),
        1 => at.prop_map(|at| Op::DropEp { at }),
        1 => at.prop_map(|at| Op::DropMem { at }),
    ]
}

enum Ep {
    Reserved(Endpoint<Reserved>),
    PendingU(Endpoint<Pending, Unicast>),
    PendingM(Endpoint<Pending, Multicast>),
    ReadyU(Endpoint<Ready, Unicast>),
    ReadyM(Endpoint<Ready, Multicast>),
}

enum Mem {
    Plain(Allocation<Private>),
    Mapped(Mapped<Private>),
}

/// Takes entry `at` (modulo the length) out of `v`.
fn take<T>(v: &mut Vec<T>, at: u8) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        let i = at as usize % v.len();
        Some(v.swap_remove(i))
    }
}

/// Takes the `at`-th (modulo their number) entry for which `want` holds.
fn take_where(v: &mut Vec<Ep>, at: u8, want: impl Fn(&Ep) -> bool) -> Option<Ep> {
    let idx: Vec<usize> = (0..v.len()).filter(|&i| want(&v[i])).collect();
    if idx.is_empty() {
        return None;
    }
    Some(v.swap_remove(idx[at as usize % idx.len()]))
}

fn is_reserved(e: &Ep) -> bool {
    matches!(e, Ep::Reserved(_))
}
fn is_pending(e: &Ep) -> bool {
    matches!(e, Ep::PendingU(_) | Ep::PendingM(_))
}
fn is_ready(e: &Ep) -> bool {
    matches!(e, Ep::ReadyU(_) | Ep::ReadyM(_))
}

/// An error from a step: a typed refusal or an injected driver fault, never
/// a panic. Both are fine here; what matters is what the driver saw.
fn ok_or_refused<T>(r: Result<T, Error>) -> Option<T> {
    r.ok()
}

fn back<T, U>(r: Result<U, Failed<T>>, keep: impl FnOnce(T) -> Ep) -> Result<U, Ep> {
    r.map_err(|f| keep(f.value))
}

fn run(ops: &[Op], seed: u64, per_mille: u32) -> Result<(), TestCaseError> {
    let (ctx, probe) = backend::context(ModelConfig::node(DEVICES as usize).queries_to_ready(1));
    // Faults on every call but teardown ones, so that nothing has to leak.
    probe.set_random_faults(seed, per_mille);
    let mut eps: Vec<Ep> = Vec::new();
    let mut mems: Vec<Mem> = Vec::new();
    let short = Duration::from_millis(5);
    for op in ops {
        match op.clone() {
            Op::Reserve(n) => {
                if let Ok(r) = ctx.reserve(n) {
                    eps.extend(r.into_endpoints().into_iter().map(Ep::Reserved));
                }
            }
            Op::Unicast { at, dev, units } => match take_where(&mut eps, at, is_reserved) {
                Some(Ep::Reserved(e)) => {
                    let r = back(e.create(Spec::unicast(dev, units * ALIGN)), Ep::Reserved);
                    eps.push(r.map_or_else(|e| e, Ep::PendingU));
                }
                Some(other) => eps.push(other),
                None => {}
            },
            Op::Team { at, devs, units } => match take_where(&mut eps, at, is_reserved) {
                Some(Ep::Reserved(e)) => {
                    let devs: Vec<Device> = devs.into_iter().map(Device).collect();
                    let r = back(
                        e.create(Spec::multicast(&devs, units * ALIGN)),
                        Ep::Reserved,
                    );
                    eps.push(r.map_or_else(|e| e, Ep::PendingM));
                }
                Some(other) => eps.push(other),
                None => {}
            },
            Op::Wait { at, long } => {
                let t = if long { Duration::from_secs(1) } else { short };
                match take_where(&mut eps, at, is_pending) {
                    Some(Ep::PendingU(e)) => {
                        eps.push(back(e.wait(t), Ep::PendingU).map_or_else(|e| e, Ep::ReadyU))
                    }
                    Some(Ep::PendingM(e)) => {
                        eps.push(back(e.wait(t), Ep::PendingM).map_or_else(|e| e, Ep::ReadyM))
                    }
                    Some(other) => eps.push(other),
                    None => {}
                }
            }
            Op::Alloc { dev, units, map } => {
                if let Some(a) = ok_or_refused(Allocation::<Private>::on_device(
                    &ctx,
                    Device(dev),
                    units * ALIGN,
                )) {
                    if map {
                        match a.map(&[Device(dev)]) {
                            Ok(m) => mems.push(Mem::Mapped(m)),
                            Err(f) => mems.push(Mem::Plain(f.value)),
                        }
                    } else {
                        mems.push(Mem::Plain(a));
                    }
                }
            }
            Op::Bind {
                at,
                mem,
                offset,
                end,
            } => {
                let ready: Vec<usize> = (0..eps.len()).filter(|&i| is_ready(&eps[i])).collect();
                if mems.is_empty() || ready.is_empty() {
                    continue;
                }
                let i = ready[at as usize % ready.len()];
                let devs = match &eps[i] {
                    Ep::ReadyU(e) => e.devices(),
                    Ep::ReadyM(e) => e.devices(),
                    _ => continue,
                };
                // A memory on one of the endpoint's devices (R5.5), if any.
                let on = |m: &Mem| match m {
                    Mem::Plain(a) => a.location(),
                    Mem::Mapped(a) => a.location(),
                };
                let fit: Vec<&Mem> = mems
                    .iter()
                    .filter(|m| devs.iter().any(|&d| on(m) == Location::Device(d)))
                    .collect();
                if fit.is_empty() {
                    continue;
                }
                let m = fit[mem as usize % fit.len()];
                let Location::Device(dev) = on(m) else {
                    continue;
                };
                let off = offset * ALIGN;
                let bound = match (&eps[i], m) {
                    (Ep::ReadyU(e), Mem::Plain(a)) => e.bind(dev, off, a),
                    (Ep::ReadyU(e), Mem::Mapped(a)) => e.bind(dev, off, a),
                    (Ep::ReadyM(e), Mem::Plain(a)) => e.bind(dev, off, a),
                    (Ep::ReadyM(e), Mem::Mapped(a)) => e.bind(dev, off, a),
                    _ => continue,
                };
                if let Ok(b) = bound {
                    match end {
                        0 => prop_assert!(b.unbind().is_ok(), "unbind without faults"),
                        1 => drop(b),
                        _ => std::mem::forget(b),
                    }
                }
            }
            Op::Destroy { at } => match take_where(&mut eps, at, is_ready) {
                Some(Ep::ReadyU(e)) => {
                    eps.push(back(e.destroy(), Ep::ReadyU).map_or_else(|e| e, Ep::Reserved))
                }
                Some(Ep::ReadyM(e)) => {
                    eps.push(back(e.destroy(), Ep::ReadyM).map_or_else(|e| e, Ep::Reserved))
                }
                Some(other) => eps.push(other),
                None => {}
            },
            Op::DropEp { at } => drop(take(&mut eps, at)),
            Op::DropMem { at } => drop(take(&mut mems, at)),
        }
        prop_assert!(
            probe.violations().is_empty(),
            "{:?} after {op:?}",
            probe.violations()
        );
    }
    drop(eps);
    drop(mems);
    prop_assert!(ctx.take_teardown_errors().is_empty());
    prop_assert!(probe.live().is_empty(), "{:?}", probe.live());
    prop_assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    Ok(())
}

proptest! {
    #![proptest_config(common::config(48, 0x00d0_0b1e, 64))]

    #[test]
    fn random_lifecycles_with_faults_break_no_rule_and_leave_nothing(
        ops in prop::collection::vec(op(), 8..48),
        seed in any::<u64>(),
        per_mille in prop_oneof![Just(0u32), 1u32..80],
    ) {
        run(&ops, seed, per_mille)?;
    }
}

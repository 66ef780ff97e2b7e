//! Long run: many full lifecycles in a loop, with flat memory. The model's
//! leak counters must be zero after every lifecycle, and the process's
//! resident memory (from `/proc/self/statm`) must not grow once warmed up.
//!
//! ```text
//! cargo test --release --test long_run -- --ignored --nocapture   # 100 000 lifecycles
//! ```
//!
//! A short run of the same loop is part of the ordinary `cargo test`.

use std::time::{Duration, Instant};

use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{
    Allocation, Context, Device, Exportable, FabricHandle, Multicast, PosixFd, Private, Readiness,
    Spec,
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

/// Resident set size in bytes (Linux), if readable.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// One lifecycle: a compile-time team and a unicast endpoint from one range,
/// readiness by poll and by wait, memory by handle and by address, a
/// forgotten binding, every `k`-th time an export/import to a peer process.
fn lifecycle(ctx: &Context, peer: &Context, k: u64) {
    let [a, b, c] = ctx.reserve(3).unwrap().into_array::<3>().unwrap();
    let team = a
        .create(Spec::team(U2::new(), 4 * ALIGN))
        .unwrap()
        .add_device(0)
        .unwrap()
        .add_device(1)
        .unwrap()
        .wait(T)
        .unwrap();
    let mut p = b.create(Spec::unicast(2, 2 * ALIGN)).unwrap();
    let uni = loop {
        match p.poll().unwrap() {
            Readiness::Ready(r) => break r,
            Readiness::Pending(q) => p = q,
        }
    };
    let m0 = Allocation::<Private>::on_device(ctx, Device(0), ALIGN).unwrap();
    let m1 = Allocation::<PosixFd>::on_device(ctx, Device(1), 2 * ALIGN)
        .unwrap()
        .map(&[Device(1)])
        .unwrap();
    let m2 = Allocation::<Private>::on_device(ctx, Device(2), ALIGN).unwrap();
    let b0 = team.bind(0, 0, &m0).unwrap();
    let b1 = team.bind_part(1, 2 * ALIGN, &m1, 0, ALIGN).unwrap();
    std::mem::forget(uni.bind(2, ALIGN, &m2).unwrap());
    if k.is_multiple_of(10) {
        let x = c
            .create(Spec::multicast(&[Device(3)], ALIGN).exportable())
            .unwrap()
            .wait(T)
            .unwrap();
        let wire = x.export().unwrap().to_bytes();
        let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&wire).unwrap();
        let imp = peer.reserve_one().unwrap().import(&h).unwrap();
        drop(imp.wait(T).unwrap());
    } else {
        c.release().unwrap();
    }
    b0.unbind().unwrap();
    drop(b1);
    team.destroy().unwrap().release().unwrap();
    drop((m0, m1, m2));
    drop(uni);
}

fn run(n: u64) -> Duration {
    let (ctx, model) = Context::model(ModelConfig::node(4));
    let peer_model = model.spawn_process();
    let peer = Context::new(peer_model.clone());
    let check = |i: u64, model: &Model| {
        assert!(
            model.live_node().is_empty(),
            "after {i}: {:?}",
            model.live_node()
        );
        assert!(model.violations().is_empty(), "{:?}", model.violations());
        assert!(ctx.take_teardown_errors().is_empty());
        assert!(peer.take_teardown_errors().is_empty());
    };
    let start = Instant::now();
    let warm = (n / 10).max(1);
    let mut base = None;
    let mut peak = 0;
    for i in 0..n {
        lifecycle(&ctx, &peer, i);
        if i % 1000 == 0 || i == n - 1 {
            check(i, &model);
        }
        if i + 1 == warm {
            base = rss();
        }
        if i >= warm
            && i % 1000 == 0
            && let Some(r) = rss()
        {
            peak = peak.max(r);
        }
    }
    check(n, &model);
    let elapsed = start.elapsed();
    if let (Some(base), Some(end)) = (base, rss()) {
        let peak = peak.max(end);
        eprintln!(
            "{n} lifecycles in {elapsed:.2?} ({:.1} µs each); RSS after warm-up {} KiB, peak {} KiB, end {} KiB",
            elapsed.as_secs_f64() * 1e6 / n as f64,
            base / 1024,
            peak / 1024,
            end / 1024
        );
        // Flat: no growth beyond allocator noise (the model backs each
        // 2 MiB allocation with host memory, freed each round).
        assert!(
            peak <= base + (16 << 20),
            "RSS grew from {base} to {peak} bytes"
        );
    }
    elapsed
}

#[test]
fn two_thousand_lifecycles_leak_nothing() {
    run(2_000);
}

#[test]
#[ignore = "long: run with `cargo test --release --test long_run -- --ignored`"]
fn a_hundred_thousand_lifecycles_keep_memory_flat() {
    run(100_000);
}

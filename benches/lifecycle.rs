//! Wall-clock cost of the typestate layer: one unicast lifecycle (reserve,
//! create, wait, bind, unbind, destroy, release) through the typed API next to
//! the same raw `Driver` calls, in one run, on the same driver:
//!
//! - `lifecycle_model/*`: the reference model, default 4-GPU node (as
//!   `Context::model(Default::default())` makes it);
//! - `lifecycle_null/*`: a driver that does nothing, so only the layers'
//!   own cost is left.
//!
//! Each group has `typed`, `raw` (the seven calls by hand) and
//! `raw+get_limits` (the raw calls plus the `get_limits` check that the typed
//! `create` also makes). After the run the ratios typed/raw are printed:
//! criterion's estimates, and an interleaved measurement that alternates
//! batches of typed and raw lifecycles and takes the median of the per-round
//! ratios, so that load on a shared machine, which drifts over criterion's
//! seconds per function, falls on both sides alike.
//!
//! ```sh
//! cargo bench --bench lifecycle                       # 2 s per function
//! cargo bench --bench lifecycle -- --measurement-time 5
//! ```

mod common;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Allocation, Context, driver::Driver};

use common::{Null, fixture, raw, raw_with_limits, typed};

fn group(c: &mut Criterion, name: &str, ctx: &Context, mem: &Allocation, d: &dyn Driver) {
    let handle = mem.handle();
    let mut g = c.benchmark_group(name);
    g.bench_function("typed", |b| {
        b.iter(|| typed(black_box(ctx), black_box(mem)))
    });
    g.bench_function("raw", |b| b.iter(|| raw(black_box(d), black_box(handle))));
    g.bench_function("raw+get_limits", |b| {
        b.iter(|| raw_with_limits(black_box(d), black_box(handle)))
    });
    g.finish();
}

fn model(c: &mut Criterion) {
    let model = Model::new(ModelConfig::default());
    let (ctx, mem, d) = fixture(model.clone());
    group(c, "lifecycle_model", &ctx, &mem, &*d);
    drop((mem, ctx, d));
    // Both sides left nothing behind and broke no rule.
    let live = model.live();
    assert!(live.is_empty(), "leaked: {live:?}");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

fn null(c: &mut Criterion) {
    let (ctx, mem, d) = fixture(Null);
    group(c, "lifecycle_null", &ctx, &mem, &*d);
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = model, null
}

/// Where criterion keeps its results (as criterion finds it, without asking
/// `cargo metadata`): under `cargo bench` the workspace's target directory
/// (this package is a member, its own folder has none), else this package's.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let workspace = here.join("../target/criterion");
    if workspace.is_dir() {
        workspace
    } else {
        here.join("target/criterion")
    }
}

/// The headline estimate of one function in nanoseconds (criterion's slope,
/// else its mean), from this run's `new/estimates.json`.
fn estimate(group: &str, function: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(function)
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let pick = |k: &str| json.get(k)?.get("point_estimate")?.as_f64();
    pick("slope").or_else(|| pick("mean"))
}

fn ratios() {
    println!("\ntyped / raw (same driver, same run):");
    for group in ["lifecycle_model", "lifecycle_null"] {
        let (Some(t), Some(r), Some(rl)) = (
            estimate(group, "typed"),
            estimate(group, "raw"),
            estimate(group, "raw+get_limits"),
        ) else {
            continue;
        };
        println!(
            "  {group:<16} typed {t:>9.1} ns   raw {r:>9.1} ns   raw+get_limits {rl:>9.1} ns   \
             typed/raw {:.2}x   typed/(raw+get_limits) {:.2}x   typed-raw {:+.1} ns",
            t / r,
            t / rl,
            t - r,
        );
    }
}

/// Lifecycles per batch and batches per side of [`interleaved`].
const BATCH: u32 = 200;
const ROUNDS: usize = 1_000;

/// Typed, raw and raw + `get_limits` batches in turn (the order rotated
/// every round): the median time per lifecycle of each side, and the medians
/// of typed/raw and typed/(raw + `get_limits`) over the rounds.
fn interleaved(ctx: &Context, mem: &Allocation, d: &dyn Driver) -> [f64; 5] {
    let handle = mem.handle();
    let time = |side: usize| {
        let t = Instant::now();
        for _ in 0..BATCH {
            match side {
                0 => typed(black_box(ctx), black_box(mem)),
                1 => raw(black_box(d), black_box(handle)),
                _ => raw_with_limits(black_box(d), black_box(handle)),
            }
        }
        t.elapsed().as_secs_f64() * 1e9 / f64::from(BATCH)
    };
    let mut sides: [Vec<f64>; 3] = Default::default();
    let (mut q, mut ql) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut ns = [0.0; 3];
        for k in 0..3 {
            let side = (round + k) % 3;
            ns[side] = time(side);
        }
        for (v, x) in sides.iter_mut().zip(ns) {
            v.push(x);
        }
        q.push(ns[0] / ns[1]);
        ql.push(ns[0] / ns[2]);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [t, r, rl] = sides.map(median);
    [t, r, rl, median(q), median(ql)]
}

fn interleaved_ratios() {
    println!("\ntyped / raw interleaved ({ROUNDS} rounds of {BATCH} lifecycles a side, medians):");
    let print = |group: &str, [t, r, rl, q, ql]: [f64; 5]| {
        println!(
            "  {group:<16} typed {t:>9.1} ns   raw {r:>9.1} ns   raw+get_limits {rl:>9.1} ns   \
             typed/raw {q:.2}x   typed/(raw+get_limits) {ql:.2}x"
        );
    };
    let model = Model::new(ModelConfig::default());
    let (ctx, mem, d) = fixture(model.clone());
    print("lifecycle_model", interleaved(&ctx, &mem, &*d));
    drop((mem, ctx, d));
    assert!(model.live().is_empty() && model.violations().is_empty());
    let (ctx, mem, d) = fixture(Null);
    print("lifecycle_null", interleaved(&ctx, &mem, &*d));
}

fn main() {
    benches();
    let c = Criterion::default().configure_from_args();
    c.final_summary();
    // Only after a real measurement (`cargo bench`), not in test mode.
    if std::env::args().any(|a| a == "--bench") {
        ratios();
        interleaved_ratios();
    }
}

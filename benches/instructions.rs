//! Instruction counts (Valgrind's Callgrind, through gungraun) of one unicast
//! lifecycle, typed vs raw, on the pass-through `Null` driver and on the
//! reference model. Exact and repeatable where wall-clock times are not.
//!
//! Needs Valgrind and the runner of the same version as the `gungraun` library:
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0
//! cargo bench --bench instructions
//! ```
//!
//! The setup (context, one allocation, and one warm-up lifecycle of each
//! kind, so that the allocator and the context's caches are warm) is not
//! counted; only the benchmark function is.

mod common;

use std::hint::black_box;

use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Allocation, Context};
use gungraun::prelude::*;

use common::{Null, fixture, raw, raw_with_limits, typed};

type Fixture = (Context, Allocation);

/// The fixture, warmed by one lifecycle of each kind.
fn warm(fx: Fixture) -> Fixture {
    typed(&fx.0, &fx.1);
    raw(fx.0.driver(), fx.1.handle());
    raw_with_limits(fx.0.driver(), fx.1.handle());
    fx
}

fn null() -> Fixture {
    warm(fixture(Null))
}

fn model() -> Fixture {
    warm(fixture(Model::new(ModelConfig::default())))
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_typed(fx: Fixture) -> Fixture {
    typed(black_box(&fx.0), black_box(&fx.1));
    fx
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_raw(fx: Fixture) -> Fixture {
    raw(black_box(fx.0.driver()), black_box(fx.1.handle()));
    fx
}

#[library_benchmark]
#[bench::null(setup = null)]
#[bench::model(setup = model)]
fn bench_raw_with_limits(fx: Fixture) -> Fixture {
    raw_with_limits(black_box(fx.0.driver()), black_box(fx.1.handle()));
    fx
}

library_benchmark_group!(
    name = lifecycle,
    benchmarks = [bench_typed, bench_raw, bench_raw_with_limits]
);

main!(library_benchmark_groups = lifecycle);

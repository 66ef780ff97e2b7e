//! The typed API on the reference model, in one process: the driver contract
//! rule by rule, lifecycles (random ones too), faults, hostile input,
//! concurrency, the classic fallback, the libcuda test double's catches, the
//! model's processes, and the examples' exit codes.
//!
//! One test binary for the area (one link of the crate, the fixtures
//! compiled once); each module is one former test file, its tests named
//! `module::test`.

// The shared fixtures, once for the whole binary.
#[path = "../common/backend.rs"]
mod backend;
#[path = "../common/children.rs"]
mod children;
#[path = "../common/mod.rs"]
mod common;

mod backend_lifecycle;
mod classic;
mod concurrency;
mod double;
mod erased_and_owned;
mod examples_exit;
mod faults;
mod hostile_input;
mod model_processes;
mod multicast_mapping;
mod proptest_lifecycle;
mod readiness_in_one_range;
mod rules;
mod run_time_bookkeeping;
mod shareable_memory;

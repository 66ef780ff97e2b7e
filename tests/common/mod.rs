//! Helpers shared by the property-test binaries.

use proptest::test_runner::{Config, RngAlgorithm, RngSeed};

/// `PROPTEST_CASES` overrides the case counts (e.g. fewer under valgrind).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A reproducible proptest configuration: fixed seed, no persistence files.
pub fn config(default_cases: u32, seed: u64, max_shrink_iters: u32) -> Config {
    Config {
        cases: cases(default_cases),
        rng_seed: RngSeed::Fixed(seed),
        // ChaCha in an unoptimised build costs more than the cases.
        rng_algorithm: RngAlgorithm::XorShift,
        max_shrink_iters,
        failure_persistence: None,
        ..Config::default()
    }
}

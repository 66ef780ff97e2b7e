//! What a panic or a re-entrant `tracing` layer inside a driver call leaves
//! behind: nothing leaked, no rule broken, no lock held (`src/unwind.rs`).
//!
//! One test binary for the area (one link of the crate, the fixtures
//! compiled once); each module is one former test file, its tests named
//! `module::test`.

// The shared fixtures, once for the whole binary.
#[path = "../common/mod.rs"]
mod common;
#[path = "../watchdog/mod.rs"]
mod watchdog;

mod panic_in_driver;
mod panic_safety;
mod reentrancy;

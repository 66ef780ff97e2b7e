//! Teams brought up in one process (ranks are threads): the bring-up, its
//! retries, the classic and portable teams, and the communicator.
//!
//! One test binary for the area (one link of the crate, the fixtures
//! compiled once); each module is one former test file, its tests named
//! `module::test`.

// The shared fixtures, once for the whole binary.
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/forge.rs"]
mod forge;
#[path = "../watchdog/mod.rs"]
mod watchdog;

mod bringup_retry;
mod classic_team;
mod communicator;
mod peers_bound;
mod portable_bring_up;
mod team;

//! Real OS processes on a model fabric (feature `fabric`): the fabric itself
//! and hostile clients of it, the launcher, teams, shareable memory, the
//! portable path and the communicator across processes. The children are this
//! binary run again with one test as their entry point (`module::child_...`).
//!
//! One test binary for the area (one link of the crate, the fixtures
//! compiled once); each module is one former test file, its tests named
//! `module::test`.

// The shared fixtures, once for the whole binary.
#[path = "../common/backend.rs"]
mod backend;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/forge.rs"]
mod forge;
#[path = "../common/job.rs"]
mod job;
#[path = "../common/rank.rs"]
mod rank;
#[path = "../bootstrap_support/mod.rs"]
mod support;
// One child harness and one `serial` lock for the whole binary, under
// the names the modules use.
use support as bootstrap_support;
use support as children;

mod communicator_processes;
mod fabric;
mod fabric_hostile;
mod launcher;
mod portable_processes;
mod shareable_processes;
mod team_processes;

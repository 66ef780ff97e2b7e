//! The data path: copies through endpoints (plain, strided, portable, classic
//! unicast), their edges and hostile callers, and the agreement that every
//! rank bound before anyone copies.
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

mod agree_bound;
mod classic_unicast;
mod copy_edges;
mod copy_hostile;
mod copy_strided;
mod data_path;
mod no_allocation;
mod portable_copy;

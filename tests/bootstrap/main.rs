//! The bootstrap backends: threads, TCP (hostile peers included), file
//! descriptors over `SCM_RIGHTS`, and MPI. The fd and socket counts of
//! `bootstrap_fd` and `bootstrap_tcp` hold because every test here that opens
//! descriptors or starts processes holds the one `serial` lock of
//! `bootstrap_support`.
//!
//! One test binary for the area (one link of the crate, the fixtures
//! compiled once); each module is one former test file, its tests named
//! `module::test`.

// The shared fixtures, once for the whole binary.
#[path = "../bootstrap_support/mod.rs"]
mod bootstrap_support;
#[path = "../watchdog/mod.rs"]
mod watchdog;

mod bootstrap_fd;
mod bootstrap_mpi;
mod bootstrap_tcp;
mod bootstrap_threads;

//! A team of MPI ranks on the model fabric: every rank joins the fabric the
//! launcher started, bootstraps over MPI, brings a multicast team up in one
//! call, binds its memory, reads back what rank 0 wrote through its own
//! memory, and tears down; the launcher fails the job if anything leaked.
//!
//! ```text
//! cargo build --features fabric,mpi --example mpi_team --bin cuda-endpoints-fabric
//! target/debug/cuda-endpoints-fabric --nodes 1 --gpus 4 -- \
//!     mpirun -n 4 --oversubscribe target/debug/examples/mpi_team
//! ```
//! (as root, add `--allow-run-as-root` to `mpirun`). With `--driver cuda`
//! after `mpi_team`, every rank runs the real driver; on the libcuda test
//! double (`ci/double.sh`) each rank's double joins the launcher's fabric
//! (`CUDA_ENDPOINTS_FABRIC`), so the job is the same, through the C ABI.

mod common;

use std::time::Duration;

use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::Mpi, fabric};

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let timeout = Duration::from_secs(20);
    if std::env::var_os(fabric::FABRIC_ENV).is_none() {
        eprintln!("run me under cuda-endpoints-fabric (CUDA_ENDPOINTS_FABRIC is not set)");
        std::process::exit(2);
    }
    let boot = Mpi::world(timeout)?;
    let (ctx, me) = common::join(boot.rank())?;
    let s = common::rank(&ctx, &me, &boot, timeout)?;
    println!(
        "rank {} of {} ({}, {:?}): bring-up {:?}, {} bootstrap calls ({} before it, {} in all); read back {}",
        boot.rank(),
        boot.size(),
        me.node_label(),
        me.device(),
        s.bring_up,
        s.bring_up_messages,
        s.join_messages,
        s.messages,
        s.read_back
    );
    Ok(())
}

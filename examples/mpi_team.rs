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
//! (as root, add `--allow-run-as-root` to `mpirun`).

mod common;

use std::time::Duration;

use cuda_endpoints::{Bootstrap, Mpi, fabric};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let timeout = Duration::from_secs(20);
    let Some((ctx, me)) = fabric::connect_env()? else {
        eprintln!("run me under cuda-endpoints-fabric (CUDA_ENDPOINTS_FABRIC is not set)");
        std::process::exit(2);
    };
    let boot = Mpi::world(timeout)?;
    let s = common::rank(&ctx, &me, &boot, timeout)?;
    println!(
        "rank {} of {} (node {}, {:?}): bring-up {:?}, {} bootstrap calls; read back {}",
        boot.rank(),
        boot.size(),
        me.node(),
        me.device(),
        s.bring_up,
        s.bring_up_messages + s.messages,
        s.read_back
    );
    Ok(())
}

//! One rank of a job on the model fabric: joins the fabric named by
//! `CUDA_ENDPOINTS_FABRIC`, runs on the node and device its rank gives it,
//! brings up a unicast endpoint bound to device memory, writes and reads
//! that memory through the model, tears down, and checks that it holds
//! nothing.
//!
//! ```text
//! cargo build --features fabric --example fabric_rank --bin cuda-endpoints-fabric
//! target/debug/cuda-endpoints-fabric --nodes 2 --gpus 4 -- \
//!     mpirun -n 8 --oversubscribe target/debug/examples/fabric_rank
//! ```

use std::time::Duration;

use cuda_endpoints::fabric;
use cuda_endpoints::{Allocation, Device, PosixFd, Spec};

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Some((ctx, me)) = fabric::connect_env()? else {
        eprintln!("run me under cuda-endpoints-fabric (CUDA_ENDPOINTS_FABRIC is not set)");
        std::process::exit(2);
    };
    let dev = me.device().unwrap_or(Device(0));
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(dev, 2 << 20))?
        .wait(Duration::from_secs(10))?;
    let mem = Allocation::<PosixFd>::on_device(&ctx, dev, 2 << 20)?;
    let binding = ep.bind(dev, 0, &mem)?;
    drop(binding);
    let mapped = mem.map(&[dev])?;
    let text = format!(
        "fabric process {} on node {} uses {dev}",
        me.pid(),
        me.node()
    );
    me.write(mapped.device_ptr(), text.as_bytes())?;
    let back = me.read(mapped.device_ptr(), text.len())?;
    println!("{}", String::from_utf8_lossy(&back));
    drop((ep, mapped));
    let live = me.live()?;
    assert!(live.is_empty(), "leaked {live:?}");
    Ok(())
}

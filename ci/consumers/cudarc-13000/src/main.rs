//! Uses both crates in one program: cudarc with `cuda-13000`, cuda-endpoints
//! on its reference model. CI only builds it; run it with
//! `CONSUMER_USE_GPU=1` on a machine with a driver to touch cudarc too.

use std::time::Duration;

use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "cudarc built for CUDA {}",
        cudarc::driver::sys::CUDA_VERSION
    );
    if std::env::var_os("CONSUMER_USE_GPU").is_some() {
        let cx = cudarc::driver::CudaContext::new(0)?;
        println!("cudarc context on device {}", cx.ordinal());
    }
    let (ctx, model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    ep.destroy()?.release()?;
    assert!(model.live().is_empty());
    println!("cuda-endpoints: one unicast lifecycle on the model, nothing leaked");
    Ok(())
}

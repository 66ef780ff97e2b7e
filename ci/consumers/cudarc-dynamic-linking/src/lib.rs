//! Uses both crates in one library: cudarc with `dynamic-linking`,
//! cuda-endpoints on its reference model. A library, so that CI builds it
//! without `libcuda.so` to link against.

use std::time::Duration;

use cuda_endpoints::{Context, Spec};

/// The CUDA version cudarc was built for.
pub fn cudarc_cuda_version() -> u32 {
    cudarc::driver::sys::CUDA_VERSION
}

/// A cudarc context on device 0 (needs a driver at run time).
pub fn cudarc_context()
-> Result<std::sync::Arc<cudarc::driver::CudaContext>, cudarc::driver::DriverError> {
    cudarc::driver::CudaContext::new(0)
}

/// One unicast lifecycle on the model.
pub fn lifecycle() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    ep.destroy()?.release()?;
    assert!(model.live().is_empty());
    Ok(())
}

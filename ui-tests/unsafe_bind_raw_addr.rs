//! Binding a raw device address without `unsafe` (R5, R7.2).
use std::time::Duration;

use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let ptr: u64 = 0x7f00_0000_0000; // from cudaMallocAsync, say
    let _b = ep.bind_raw_addr(0, 0, ptr, 2 << 20)?;
    Ok(())
}

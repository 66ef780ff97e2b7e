//! The `unsafe_*` case done right: `bind_raw_addr` inside `unsafe`, with the
//! caller vouching that the address stays mapped while bound (R5, R7.2).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    // Memory this crate did not hand to the endpoint: only its address.
    let mapped = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    // SAFETY: `mapped` is device memory of device 0 and outlives the binding.
    let b = unsafe { ep.bind_raw_addr(0, 0, mapped.device_ptr(), 2 << 20)? };
    b.unbind()?;
    ep.destroy()?.release()?;
    drop(mapped);
    assert!(model.live().is_empty(), "{:?}", model.live());
    Ok(())
}

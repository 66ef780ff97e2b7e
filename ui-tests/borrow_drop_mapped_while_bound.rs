//! Unmapping (dropping) a mapped allocation while it is bound by address (R7.2).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mapped = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let b = ep.bind(0, 0, &mapped)?;
    drop(mapped);
    b.unbind()?;
    Ok(())
}

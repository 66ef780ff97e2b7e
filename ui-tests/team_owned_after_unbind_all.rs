//! Using the owning form after its teardown: `unbind_all` consumes it and
//! hands the endpoint and memory back (R6, R7).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mut window = ep.into_bound();
    window.bind(0, 0, Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?)?;
    let (_ep, _memory) = window.unbind_all()?;
    window.bind(0, 0, Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?)?;
    Ok(())
}

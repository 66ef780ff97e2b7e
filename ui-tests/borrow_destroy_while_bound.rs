//! Destroying an endpoint while a `Binding` on it is alive (R6, R7).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let b = ep.bind(0, 0, &mem)?;
    let id = ep.destroy()?;
    b.unbind()?;
    id.release()?;
    Ok(())
}

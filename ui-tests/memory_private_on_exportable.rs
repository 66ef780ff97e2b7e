//! Binding process-private memory on an exportable endpoint (R5.6).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let devices = ctx.devices()?;
    let team = ctx
        .reserve_one()?
        .create(Spec::multicast(&devices, 2 << 20).exportable())?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&ctx, devices[0], 2 << 20)?;
    let _b = team.bind(devices[0], 0, &mem)?;
    Ok(())
}

//! Enrolling a device on a `Spec::multicast` team, which `create` already
//! enrolled in full (R4.2).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let devices = ctx.devices()?;
    let team = ctx
        .reserve_one()?
        .create(Spec::multicast(&devices[..2], 2 << 20))?;
    let _team = team.add_device(devices[2])?;
    Ok(())
}

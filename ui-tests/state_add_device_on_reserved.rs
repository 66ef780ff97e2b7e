//! Enrolling a device on an id before any endpoint was created on it (R4).
use cuda_endpoints::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let _team = id.add_device(0)?;
    Ok(())
}

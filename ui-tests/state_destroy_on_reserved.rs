//! Destroying an id that holds no endpoint (R7, R1).
use cuda_endpoints::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let _id = id.destroy()?;
    Ok(())
}

//! Exporting an id that holds no endpoint yet (R8).
use cuda_endpoints::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let _handle = id.export()?;
    Ok(())
}

//! Releasing a range whose ids were already split into endpoints (R1).
use cuda_endpoints::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let range = ctx.reserve(4)?;
    let _ids = range.into_endpoints();
    range.release()?;
    Ok(())
}

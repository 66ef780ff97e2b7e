//! Releasing the id of a created endpoint without destroying it (R1.2, R7.1).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    ep.release()?;
    Ok(())
}

//! Creating a second endpoint on an id that already holds one (R2.1).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    let _again = ep.create(Spec::unicast(1, 2 << 20))?;
    Ok(())
}

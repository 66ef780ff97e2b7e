//! Creating on an id that was already moved into an earlier `create` (R2.1).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let _a = id.create(Spec::unicast(0, 2 << 20))?;
    let _b = id.create(Spec::unicast(1, 2 << 20))?;
    Ok(())
}

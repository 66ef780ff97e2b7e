//! A compile-time team sized by a plain number: the size is a type (R2.2).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let _team = ctx.reserve_one()?.create(Spec::team(4, 2 << 20))?;
    Ok(())
}

//! A compile-time team of zero devices (R2.2).
use cuda_endpoints::typenum::U0;
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let _team = ctx.reserve_one()?.create(Spec::team(U0::new(), 2 << 20))?;
    Ok(())
}

//! Enrolling a device on a unicast endpoint (R4.1).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    let _ep = ep.add_device(1)?;
    Ok(())
}

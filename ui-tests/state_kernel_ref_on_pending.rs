//! Handing a kernel an endpoint whose construction may not be finished (R3.4).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    let _arg = ep.kernel_ref();
    Ok(())
}

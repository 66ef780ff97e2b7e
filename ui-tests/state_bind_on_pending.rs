//! Binding memory before a query reported the endpoint constructed (R3.1, R5.1).
use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let _b = ep.bind(0, 0, &mem)?;
    Ok(())
}

//! Binding memory on an id that holds no endpoint yet (R3.1, R5.1).
use cuda_endpoints::{Allocation, Context, Private};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let _b = id.bind(0, 0, &mem)?;
    Ok(())
}

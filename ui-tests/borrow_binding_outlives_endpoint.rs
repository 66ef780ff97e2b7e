//! Keeping a `Binding` after its endpoint went out of scope (R7).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let binding;
    {
        let ep = ctx
            .reserve_one()?
            .create(Spec::unicast(0, 2 << 20))?
            .wait(Duration::from_secs(1))?;
        binding = ep.bind(0, 0, &mem)?;
    }
    binding.unbind()?;
    Ok(())
}

//! Unbinding through the endpoint by offset and size: there is no such call;
//! only the `Binding` token a bind returned can unbind (R6, C4).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let _b = ep.bind(0, 0, &mem)?;
    ep.unbind(0, 0, 2 << 20)?;
    Ok(())
}

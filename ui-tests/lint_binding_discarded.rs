//! Discarding the `Binding` a bind returned: the memory is unbound at once.
#![deny(unused_must_use)]
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    ep.bind(0, 0, &mem)?;
    Ok(())
}

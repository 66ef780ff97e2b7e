//! Binding memory on an imported unicast endpoint (R5.7).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let owner = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20).exportable())?
        .wait(Duration::from_secs(1))?;
    let handle = owner.export()?;

    let peer = Context::new(model.spawn_process());
    let imported = peer
        .reserve_one()?
        .import(&handle)?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&peer, 0, 2 << 20)?;
    let _b = imported.bind(0, 0, &mem)?;
    Ok(())
}

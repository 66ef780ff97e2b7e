//! Exporting an imported endpoint again (R8.1).
use std::time::Duration;

use cuda_endpoints::{Context, Spec};

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
    let _again = imported.export()?;
    Ok(())
}

//! Binding process-private memory on an imported multicast endpoint (R5.6).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let owner = ctx
        .reserve_one()?
        .create(Spec::multicast(&[0.into(), 1.into()], 2 << 20).exportable())?
        .wait(Duration::from_secs(1))?;
    let handle = owner.export()?;

    let peer = Context::new(model.spawn_process());
    let team = peer
        .reserve_one()?
        .import(&handle)?
        .wait(Duration::from_secs(1))?;
    let mem = Allocation::<Private>::on_device(&peer, 1, 2 << 20)?;
    let _b = team.bind(1, 0, &mem)?;
    Ok(())
}

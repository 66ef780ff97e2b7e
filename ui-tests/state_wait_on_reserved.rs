//! Waiting for an id that holds no endpoint (R3).
use std::time::Duration;

use cuda_endpoints::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let id = ctx.reserve_one()?;
    let _ready = id.wait(Duration::from_secs(1))?;
    Ok(())
}

//! Exporting an endpoint created without `.exportable()` (R8.1).
use std::time::Duration;

use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let _handle = ep.export()?;
    Ok(())
}

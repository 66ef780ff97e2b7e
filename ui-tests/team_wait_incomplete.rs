//! Waiting on a team of 4 with only 3 devices enrolled (R3.2, R4.4).
use std::time::Duration;

use cuda_endpoints::typenum::U4;
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U4::new(), 2 << 20))?
        .add_device(0)?
        .add_device(1)?
        .add_device(2)?;
    let _team = team.wait(Duration::from_secs(1))?;
    Ok(())
}

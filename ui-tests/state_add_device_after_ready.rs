//! Enrolling a device in a team that is already ready (R4.3, R4.4).
use std::time::Duration;

use cuda_endpoints::typenum::U2;
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U2::new(), 2 << 20))?
        .add_device(0)?
        .add_device(1)?
        .wait(Duration::from_secs(1))?;
    let _team = team.add_device(2)?;
    Ok(())
}

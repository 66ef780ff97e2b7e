//! `wait_all` over teams that still have devices to enroll (R3.2, R4.4).
use std::time::Duration;

use cuda_endpoints::typenum::U2;
use cuda_endpoints::{Context, Spec, wait_all};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let mut teams = Vec::new();
    for id in ctx.reserve(2)?.into_endpoints() {
        let team = id.create(Spec::team(U2::new(), 2 << 20))?.add_device(0)?;
        teams.push(team);
    }
    let _ready = wait_all(teams, Duration::from_secs(1))?;
    Ok(())
}

//! The `team_*` cases done right: a compile-time team enrolled in full before
//! waiting, a run-time team enrolled by `create`, and `wait_all` over complete
//! teams (R2.2, R3.2, R3.5, R4).
use std::time::Duration;

use cuda_endpoints::typenum::{U2, U4};
use cuda_endpoints::{Context, Spec, wait_all};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let devices = ctx.devices()?;
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U4::new(), 2 << 20))?
        .add_device(devices[0])?
        .add_device(devices[1])?
        .add_device(devices[2])?
        .add_device(devices[3])?
        .wait(Duration::from_secs(1))?;
    team.destroy()?.release()?;

    let runtime = ctx
        .reserve_one()?
        .create(Spec::multicast(&devices, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    runtime.destroy()?.release()?;

    let unicast = ctx
        .reserve_one()?
        .create(Spec::unicast(devices[0], 2 << 20))?
        .wait(Duration::from_secs(1))?;
    unicast.destroy()?.release()?;

    let mut teams = Vec::new();
    for id in ctx.reserve(2)?.into_endpoints() {
        let team = id
            .create(Spec::team(U2::new(), 2 << 20))?
            .add_device(0)?
            .add_device(1)?;
        teams.push(team);
    }
    for team in wait_all(teams, Duration::from_secs(1))? {
        team.destroy()?.release()?;
    }
    assert!(model.live().is_empty(), "{:?}", model.live());
    Ok(())
}

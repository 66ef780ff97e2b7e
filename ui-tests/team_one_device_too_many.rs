//! Enrolling a third device in a team of 2 (R4.2): one error, at the third
//! `add_device`; the `wait` after it is not reported as well (the team
//! counts as complete past the refused call, as the first error says).
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U2::new(), 2 << 20))?
        .add_device(0)?
        .add_device(1)?;
    let _team = team.add_device(2)?.wait(std::time::Duration::from_secs(1))?;
    Ok(())
}

//! Exporting a team of 2, one device enrolled, created without
//! `.exportable()` (R8.1).
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U2::new(), 2 << 20))?
        .add_device(0)?;
    let _handle = team.export()?;
    Ok(())
}

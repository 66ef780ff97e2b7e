//! Binding part of an allocation on a team of 2 with one device enrolled
//! (R3.1, R3.2, R4.4).
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let team = ctx
        .reserve_one()?
        .create(Spec::team(U2::new(), 2 << 20))?
        .add_device(0)?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 4 << 20)?;
    let _b = team.bind_part(0, 0, &mem, 2 << 20, 2 << 20)?;
    Ok(())
}

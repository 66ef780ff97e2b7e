//! Exporting an endpoint before it is ready (R3.4, R8).
use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20).exportable())?;
    let _handle = ep.export()?;
    Ok(())
}

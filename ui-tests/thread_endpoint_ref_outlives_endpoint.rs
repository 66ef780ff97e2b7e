//! Keeping a kernel reference after its endpoint was destroyed (R3.4, R7).
use std::time::Duration;

use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let arg = ep.kernel_ref();
    ep.destroy()?.release()?;
    println!("launch with endpoint {}", arg.id());
    Ok(())
}

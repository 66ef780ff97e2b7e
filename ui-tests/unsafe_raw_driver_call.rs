//! A raw driver call from safe code: destroying the id under a typed, ready
//! endpoint would break SPEC R3.4, so every `Driver` method is `unsafe` and
//! the context hands its driver out only through `unsafe fn driver_arc`.
use std::time::Duration;

use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Context, Spec, driver::Driver};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::new(ModelConfig::node(1));
    let ctx = Context::new(model.clone());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let _ = model.destroy(ep.id());
    Ok(())
}

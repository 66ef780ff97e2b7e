//! Destroying an endpoint while a copy through it is in flight (F4).
use std::time::Duration;

use cuda_endpoints::{Context, CopyBatch, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let stream = Stream::new(&ctx, 0)?;
    let copy = stream.enqueue(CopyBatch::new().put_host(vec![1; 64], &ep, 0))?;
    let _ = ep.destroy();
    copy.wait()?;
    Ok(())
}

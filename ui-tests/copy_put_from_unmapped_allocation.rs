//! A copy from an allocation that is not mapped in this process: a copy
//! reads and writes addresses, and an allocation has none until `map`.
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 64))?.wait()?;
    Ok(())
}

//! A get written in `put`'s order (memory first): `get` takes the endpoint
//! first, as the direction of the copy reads.
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let dst = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().get(&dst, 0, &ep, 0, 64))?.wait()?;
    Ok(())
}

//! Unmapping (dropping) the source of a copy while it is in flight (F4).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    let copy = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 64))?;
    drop(src);
    copy.wait()?;
    Ok(())
}

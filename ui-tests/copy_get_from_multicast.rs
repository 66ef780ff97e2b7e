//! A get from a multicast endpoint (F1): a team has no one memory to read.
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, CopyBatch, Device, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::multicast(&[Device(0)], 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mine = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let _b = ep.bind(0, 0, &mine)?;
    let dst = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().get(&ep, 0, &dst, 0, 64))?.wait()?;
    Ok(())
}

//! A copy from host bytes through `put`: `put` reads device memory mapped
//! in this process; host bytes go through `put_host`.
use std::time::Duration;

use cuda_endpoints::{Context, CopyBatch, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let bytes = vec![7u8; 64];
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put(&bytes, 0, &ep, 0, 64))?.wait()?;
    Ok(())
}

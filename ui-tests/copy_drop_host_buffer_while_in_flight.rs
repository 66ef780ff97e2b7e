//! Dropping a host buffer while a copy from it is in flight (F4): the
//! batch owns it until the copy is waited.
use std::time::Duration;

use cuda_endpoints::{Context, CopyBatch, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let host = vec![7u8; 64];
    let stream = Stream::new(&ctx, 0)?;
    let copy = stream.enqueue(CopyBatch::new().put_host(host, &ep, 0))?;
    drop(host);
    copy.wait()?;
    Ok(())
}

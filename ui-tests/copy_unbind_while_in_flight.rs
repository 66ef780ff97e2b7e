//! Unbinding memory while a copy through its endpoint is in flight (F4):
//! the copy lends the endpoint through the binding (`Binding::copy_through`),
//! so the in-flight token borrows the binding that `unbind` consumes. What
//! to do instead: `copy.wait()?` (or synchronize the stream and drop the
//! token) first, then `b.unbind()?`.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, Mapped, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let mem: Mapped<Private> = Allocation::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let b = ep.bind(0, 0, &mem)?;
    let stream = Stream::new(&ctx, 0)?;
    let copy = stream.enqueue(CopyBatch::new().put_host(vec![1; 64], b.copy_through(&ep)?, 0))?;
    b.unbind()?;
    copy.wait()?;
    Ok(())
}

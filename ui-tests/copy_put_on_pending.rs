//! A copy through an endpoint before a query reported it constructed
//! (R3.1): the endpoint is `Pending`.
use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 64))?.wait()?;
    Ok(())
}

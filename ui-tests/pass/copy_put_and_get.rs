//! Data through endpoints, the right way: put, wait, get, wait; the host
//! buffers come back from `wait`, and teardown runs in the borrow order.
//! The put lends the endpoint through its binding (`copy_through`), so an
//! unbind before the copy's `wait` would not compile. A route
//! (`Stream::route`) makes the same put many times, each waited before its
//! memory is dropped.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = ModelConfig::node(1);
    config.driver_version = 13050; // cuFabricCpyBatchAsync is 13.5+ (F7)
    let (ctx, model) = Context::model(config);
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let owner = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let bound = ep.bind(0, 0, &owner)?;
    let stream = Stream::new(&ctx, 0)?;
    let sent = stream
        .enqueue(CopyBatch::new().put_host(vec![7u8; 64], bound.copy_through(&ep)?, 128))?
        .wait()?;
    let got = stream
        .enqueue(CopyBatch::new().get_host(&ep, 128, 64))?
        .wait()?;
    assert_eq!(got.received[0], sent.sent[0]);
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    {
        let mut route = stream.route(&src, &ep);
        for step in 0..4 {
            route.put(step * 64, step * 64, 64)?.wait()?;
        }
    }
    drop(src);
    drop(stream);
    bound.unbind()?;
    drop(owner);
    ep.destroy()?.release()?;
    assert!(model.violations().is_empty());
    Ok(())
}

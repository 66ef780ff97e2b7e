//! Unmapping (dropping) a route's memory while a put it made is in flight
//! (F4): the token borrows what the route borrows, past the route itself.
//! What to do instead: `copy.wait()?` first, then drop the memory.
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    let copy = {
        let mut route = stream.route(&src, &ep);
        route.put(0, 0, 64)?
    };
    drop(src);
    copy.wait()?;
    Ok(())
}

//! Growing the symmetric heap while a route into one of its endpoints
//! lives: the route read the endpoint's facts (the heap's agreed top among
//! them) and borrows it, so the heap cannot change under it. What to do
//! instead: drop the route, grow, and make a new one.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, Mapped, PosixFd, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let peers = team::unicast_peers(&ctx, &boot, &team::PeerSpec::new(0, 4 << 20))?;
    let mut heap = peers.into_owned::<Mapped<PosixFd>>();
    let src = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    let mut route = stream.route(&src, heap.own());
    let chunk = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    heap.grow(&boot, chunk, Duration::from_secs(10))?;
    route.put(0, 0, 64)?.wait()?;
    Ok(())
}

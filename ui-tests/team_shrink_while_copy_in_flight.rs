//! Shrinking the symmetric heap while a copy through its endpoint is still
//! in flight on this rank: every rank stops using the top chunk before any
//! rank unbinds it (R13.7).
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, Mapped, PosixFd, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let peers = team::unicast_peers(&ctx, &boot, &team::PeerSpec::new(0, 2 << 20))?;
    let mut heap = peers.into_owned::<Mapped<PosixFd>>();
    let chunk = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    heap.grow(&boot, chunk, Duration::from_secs(10))?;
    let stream = Stream::new(&ctx, 0)?;
    let copy = stream.enqueue(CopyBatch::new().put_host(vec![7; 64], heap.own(), 0))?;
    let _top = heap.shrink(&boot, Duration::from_secs(10))?;
    copy.wait()?;
    Ok(())
}

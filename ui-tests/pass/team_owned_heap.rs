//! The owning form of unicast peers as a symmetric heap, right: grow on
//! every rank, copy below the top, wait for the copy, then shrink (R13.5,
//! R13.7); the owned value is dropped last.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, Mapped, PosixFd, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let peers = team::unicast_peers(&ctx, &boot, &team::PeerSpec::new(0, 4 << 20))?;
    let mut heap = peers.into_owned::<Mapped<PosixFd>>();
    for _ in 0..2 {
        let chunk = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
        heap.grow(&boot, chunk, Duration::from_secs(10))?;
    }
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put_host(vec![7; 64], heap.own(), 2 << 20))?.wait()?;
    let top = heap.shrink(&boot, Duration::from_secs(10))?;
    drop((top, stream, heap));
    assert!(model.live().is_empty());
    Ok(())
}

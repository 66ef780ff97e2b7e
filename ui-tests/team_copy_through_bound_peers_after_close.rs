//! Keeping an endpoint from `BoundPeers` past its `close`: the close is
//! every rank's agreement that it stopped copying through the peers
//! (R13.7), after which each owner may unbind, so a copy after it could
//! reach memory no longer bound. The endpoints `BoundPeers` lends live
//! only as long as it does. What to do instead: make every copy before
//! `close`, or agree again (`agree_bound`) to copy after it.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, FabricShareable, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let t = Duration::from_secs(10);
    let peers = team::unicast_peers(&ctx, &boot, &team::PeerSpec::new(0, 2 << 20))?;
    let mem = Allocation::<FabricShareable>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let _b = peers.own().bind(0, 0, &mem)?;
    let bound = peers.agree_bound(&boot, t)?;
    let own = bound.own();
    bound.close(&boot, t)?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put_host(vec![1; 64], own, 0))?.wait()?;
    Ok(())
}

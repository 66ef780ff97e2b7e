//! Keeping a peer's endpoint after the communicator that owns it was torn
//! down: dropping `OwnedPeers` destroys every imported peer (R7, R13.7).
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, Mapped, PosixFd, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let peers = team::unicast_peers(&ctx, &boot, &team::PeerSpec::new(0, 2 << 20))?;
    let mut owned = peers.into_owned::<Mapped<PosixFd>>();
    let chunk = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    owned.grow(&boot, chunk, Duration::from_secs(10))?;
    let own = owned.own();
    drop(owned);
    println!("{}", own.id());
    Ok(())
}

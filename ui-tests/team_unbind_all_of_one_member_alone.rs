//! One member of an owned team tearing down alone: an `OwnedTeam` has no
//! `unbind_all`, since the others may still put into this rank's memory
//! (R13.7); `close` on every rank is the teardown.
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, PosixFd, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let boot = Threads::new(1).remove(0);
    let t = Duration::from_secs(10);
    let team = team::multicast(&ctx, &boot, &team::TeamSpec::new([0], 2 << 20))?;
    let mem = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?;
    let owned = team.into_bound([(0.into(), 0, mem)], &boot, t)?;
    owned.unbind_all();
    Ok(())
}

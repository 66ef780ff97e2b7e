//! The `state_*` and `move_*` cases done right: reserve, create, poll or wait,
//! bind, unbind through the token, destroy, release (R1-R7).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Endpoint, Private, Readiness, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let id: Endpoint = ctx.reserve_one()?;
    let mut pending = id.create(Spec::unicast(0, 2 << 20))?;
    let ep = loop {
        match pending.poll()? {
            Readiness::Ready(ready) => break ready,
            Readiness::Pending(p) => pending = p,
        }
    };
    let arg = ep.kernel_ref();
    assert_eq!(arg.id(), ep.id());
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let b = ep.bind(0, 0, &mem)?;
    b.unbind()?;
    // Destroy hands the id back, still reserved: create on it again.
    let id = ep.destroy()?;
    let ep = id
        .create(Spec::unicast(1, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    ep.destroy()?.release()?;
    // A range split into endpoints is released with its last endpoint.
    let ids = ctx.reserve(4)?.into_endpoints();
    for id in ids {
        id.release()?;
    }
    drop(mem);
    assert!(model.live().is_empty(), "{:?}", model.live());
    Ok(())
}

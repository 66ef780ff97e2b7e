//! The `thread_*` cases done right. `Endpoint<Ready, _>` is `Send + Sync`;
//! `Binding` and `EndpointRef` are `Send + Sync` but borrow the endpoint, so
//! they go to scoped threads, which end before the endpoint does. Here one
//! ready team is bound from one thread per device (R5).
use std::time::Duration;

use cuda_endpoints::typenum::U4;
use cuda_endpoints::{Allocation, Binding, Context, Endpoint, EndpointRef, Exportable, FabricShareable};
use cuda_endpoints::{FabricHandle, IdRange, Mapped, Multicast, Pending, Private, Ready, Spec};
use cuda_endpoints::{Team, Unicast};

fn send_sync<T: Send + Sync>() {}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    send_sync::<Endpoint<Ready, Multicast>>();
    send_sync::<Endpoint<Pending, Team<U4>>>();
    send_sync::<Endpoint>();
    send_sync::<Binding<'static>>();
    send_sync::<EndpointRef<'static>>();
    send_sync::<IdRange>();
    send_sync::<Context>();
    send_sync::<Allocation<Private>>();
    send_sync::<Mapped<FabricShareable>>();
    send_sync::<FabricHandle<Unicast<Exportable>>>();

    let (ctx, model) = Context::model(Default::default());
    let devices = ctx.devices()?;
    let team = ctx
        .reserve_one()?
        .create(Spec::multicast(&devices, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let mems = devices
        .iter()
        .map(|&d| Allocation::<Private>::on_device(&ctx, d, 2 << 20))
        .collect::<Result<Vec<_>, _>>()?;
    let arg = team.kernel_ref();
    std::thread::scope(|s| -> Result<(), cuda_endpoints::Error> {
        let workers: Vec<_> = devices
            .iter()
            .zip(&mems)
            .map(|(&dev, mem)| {
                let team = &team;
                s.spawn(move || {
                    let b = team.bind(dev, 0, mem)?;
                    assert_eq!(arg.id(), team.id()); // the kernel launch would go here
                    b.unbind()
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker panicked")?;
        }
        Ok(())
    })?;
    team.destroy()?.release()?;
    drop(mems);
    assert!(model.live().is_empty(), "{:?}", model.live());
    Ok(())
}

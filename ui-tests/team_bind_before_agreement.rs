//! Binding on an imported team by hand, before every rank enrolled and the
//! wait reported it constructed (R3.1, R3.2, R4.4; the agreement step of
//! `team::multicast` is what orders this across ranks).
use cuda_endpoints::{Allocation, Context, PosixFd, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let root = ctx.reserve_one()?.create(Spec::spread(2, 2 << 20).exportable())?;
    let handle = root.export()?;
    let peer = Context::new(model.spawn_process());
    let team = peer.reserve_one()?.import(&handle)?.add_device(1)?;
    let mem = Allocation::<PosixFd>::on_device(&peer, 1, 2 << 20)?;
    let _b = team.bind(1, 0, &mem)?;
    Ok(())
}

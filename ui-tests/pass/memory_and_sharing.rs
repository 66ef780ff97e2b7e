//! The `memory_*` and `share_*` cases done right: exportable and imported
//! multicast endpoints bind shareable memory, export needs `.exportable()`
//! and a ready endpoint, an imported unicast endpoint is only referenced
//! (R5.6, R5.7, R8, R9).
use std::time::Duration;

use cuda_endpoints::{Allocation, Binding, Context, Endpoint, FabricShareable, ImportedMulticast};
use cuda_endpoints::{PosixFd, Ready, Result, Spec};

/// What an importing process binds on an imported multicast endpoint:
/// shareable memory only (R5.6). Checked by the compiler here, not run: an
/// importer must first enroll its own devices, which the crate does not offer
/// for `ImportedMulticast` yet.
#[allow(dead_code)]
fn bind_on_imported<'a>(
    team: &'a Endpoint<Ready, ImportedMulticast>,
    mem: &'a Allocation<FabricShareable>,
) -> Result<Binding<'a>> {
    team.bind(1, 0, mem)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let t = Duration::from_secs(1);

    let owner = ctx
        .reserve_one()?
        .create(Spec::multicast(&[0.into(), 1.into()], 2 << 20).exportable())?
        .wait(t)?;
    let handle = owner.export()?;
    let mem0 = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?;
    let mem1 = Allocation::<FabricShareable>::on_device(&ctx, 1, 2 << 20)?;
    let b0 = owner.bind(0, 0, &mem0)?;
    let b1 = owner.bind(1, 0, &mem1)?;

    let unicast = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20).exportable())?
        .wait(t)?;
    let unicast_handle = unicast.export()?;

    let peer_model = model.spawn_process();
    let peer = Context::new(peer_model.clone());
    let team = peer.reserve_one()?.import(&handle)?.wait(t)?;
    let remote = peer.reserve_one()?.import(&unicast_handle)?.wait(t)?;
    let _arg = remote.kernel_ref(); // used from kernels, never bound (R5.7)

    team.destroy()?.release()?;
    remote.destroy()?.release()?;
    b0.unbind()?;
    b1.unbind()?;
    owner.destroy()?.release()?;
    unicast.destroy()?.release()?;
    drop((mem0, mem1));
    assert!(model.live().is_empty(), "{:?}", model.live());
    assert!(peer_model.live().is_empty(), "{:?}", peer_model.live());
    Ok(())
}

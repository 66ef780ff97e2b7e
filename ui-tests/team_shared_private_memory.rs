//! Private memory on the endpoint a team bring-up gives every rank: it is
//! shared with other processes, so it takes only shareable memory (R5.6).
use cuda_endpoints::{Allocation, Context, Private, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let boot = Threads::new(1).remove(0);
    let team = team::multicast(&ctx, &boot, &team::TeamSpec::new([0], 2 << 20))?;
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let _b = team.endpoint().bind(0, 0, &mem)?;
    Ok(())
}

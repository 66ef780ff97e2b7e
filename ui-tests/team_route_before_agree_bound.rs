//! A route into a bring-up's endpoint before the ranks agreed that every
//! rank bound its memory (R13.3): one error, at the route, none at its put.
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, PosixFd, Private, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let team = team::multicast(&ctx, &boot, &team::TeamSpec::new([0], 2 << 20))?;
    let mem = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let _b = team.endpoint().bind(0, 0, &mem)?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let stream = Stream::new(&ctx, 0)?;
    let mut route = stream.route(&src, team.endpoint());
    route.put(0, 0, 64)?.wait()?;
    Ok(())
}

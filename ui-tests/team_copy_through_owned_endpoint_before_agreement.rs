//! The team's endpoint owned outright before the every-rank-bound agreement
//! (R13.3): it stays `TeamReady`, so a copy through it does not compile.
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, PosixFd, Stream, bootstrap::Threads, team};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let boot = Threads::new(1).remove(0);
    let ep = team::multicast(&ctx, &boot, &team::TeamSpec::new([0], 2 << 20))?.into_endpoint();
    let mem = Allocation::<PosixFd>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let _b = ep.bind(0, 0, &mem)?;
    let stream = Stream::new(&ctx, 0)?;
    stream.enqueue(CopyBatch::new().put_host(vec![7; 64], &ep, 0))?.wait()?;
    Ok(())
}

//! Unbinding (and destroying) an endpoint's memory while a graph of copies
//! through it lives (F8: a copy node needs every id valid and bound for as
//! long as the graph may run). What to do instead: drop the graph first
//! (it synchronizes its stream), then unbind.
use std::time::Duration;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{Allocation, Context, CopyBatch, Mapped, Private, Spec, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(ModelConfig { driver_version: 13050, ..ModelConfig::node(1) });
    let mem: Mapped<Private> = Allocation::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let mut bound = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?
        .into_bound::<Mapped<Private>>();
    let _ = bound.bind(0, 0, mem);
    let stream = Stream::new(&ctx, 0)?;
    let mut graph = stream.capture(CopyBatch::new().put_host(vec![1; 64], bound.endpoint(), 0))?;
    graph.launch()?.wait()?;
    let _ = bound.unbind_all();
    graph.launch()?.wait()?;
    Ok(())
}

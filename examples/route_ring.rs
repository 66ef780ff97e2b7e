//! A ring of small messages through routes (`Stream::route`): each rank
//! sends its right neighbour the same kind of put, step after step, as a
//! halo exchange or a pipeline does. Ranks are threads over one model
//! node here; over TCP or MPI the code is the same.
//!
//! Every rank brings unicast peers up (`team::unicast_peers`), binds its
//! memory on its own endpoint, agrees with every rank that every rank bound
//! (`agree_bound`, R13.3), then makes one route from its send buffer into
//! its neighbour's endpoint and puts through it `STEPS` times, each put
//! waited. A route reads the endpoint's facts once, not per put; each put
//! is checked as a batch of that put would be. Then every rank reads back
//! what its left neighbour sent, closes (every rank stopped copying,
//! R13.7), and tears down.
//!
//! The model node reports driver 13.5 here, so the puts take the fabric
//! copy (`cuFabricCpyBatchAsync`, F7). With `portable` they take the path
//! of drivers before 13.5 instead (`cuMemcpyAsync` through the windows
//! onto each peer's memory that `agree_bound` registered): the code is the
//! same.
//!
//! ```text
//! cargo run --example route_ring --features model                  # 4 ranks
//! cargo run --example route_ring --features model -- 2             # 2 ranks
//! cargo run --example route_ring --features model -- 4 portable    # 13.4
//! ```

use std::time::Duration;

use cuda_endpoints::bootstrap::{Bootstrap, Threads};
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::team::{self, PeerSpec};
use cuda_endpoints::{Allocation, Context, CopyBatch, FabricShareable, Private, Stream};

/// Bytes of the endpoint and of the memory bound on it.
const BYTES: u64 = 2 << 20;
/// Bytes of one message.
const MSG: u64 = 4 << 10;
/// Messages each rank sends.
const STEPS: u64 = 100;
const T: Duration = Duration::from_secs(10);

/// The message rank `r` sends at `step`.
fn message(r: usize, step: u64) -> Vec<u8> {
    (0..MSG)
        .map(|i| (r as u64 * 31 + step * 7 + i) as u8)
        .collect()
}

fn rank(ctx: &Context, boot: &dyn Bootstrap) -> Result<(), Box<dyn std::error::Error>> {
    let (r, n) = (boot.rank(), boot.size());
    let dev = r as i32;
    let peers = team::unicast_peers(ctx, boot, &PeerSpec::new(dev, BYTES).timeout(T))?;
    let mem = Allocation::<FabricShareable>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
    let binding = peers.own().bind(dev, 0, &mem)?;
    let bound = peers.agree_bound(boot, T)?;
    let stream = Stream::new(ctx, dev)?;
    // The send buffer: every step's message, one after another. A real
    // code fills it with a kernel (or cudarc's `memcpy_htod`); the model
    // runs no kernels, so the bytes come from the host through this rank's
    // own endpoint: put there, then got into `send`.
    let send = Allocation::<Private>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
    let all: Vec<u8> = (0..STEPS).flat_map(|s| message(r, s)).collect();
    stream
        .enqueue(CopyBatch::new().put_host(all, bound.own(), 0))?
        .wait()?;
    stream
        .enqueue(CopyBatch::new().get(bound.own(), 0, &send, 0, STEPS * MSG))?
        .wait()?;
    boot.barrier(T)?; // every rank's own bytes read before any neighbour writes them
    let right = (r + 1) % n;
    if right != r {
        let to = bound
            .peer(right)
            .ok_or("no endpoint for the right neighbour")?;
        let mut route = stream.route(&send, to);
        for step in 0..STEPS {
            route.put(step * MSG, step * MSG, MSG)?.wait()?;
        }
    }
    boot.barrier(T)?; // every message landed
    let left = (r + n - 1) % n;
    let got = stream
        .enqueue(CopyBatch::new().get_host(bound.own(), 0, STEPS * MSG))?
        .wait()?;
    let want: Vec<u8> = (0..STEPS).flat_map(|s| message(left, s)).collect();
    if got.received.first() != Some(&want) {
        return Err(format!("rank {r}: the messages from rank {left} are wrong").into());
    }
    println!("rank {r}: {STEPS} messages of {MSG} bytes from rank {left}, every byte right");
    drop(stream);
    bound.close(boot, T)?; // every rank stopped copying (R13.7)
    binding.unbind()?;
    drop((send, mem, peers));
    Ok(())
}

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let portable = match std::env::args().nth(2).as_deref() {
        None => false,
        Some("portable") => true,
        Some(other) => return Err(format!("the path: `portable` or nothing, not {other:?}").into()),
    };
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .map_err(|_| format!("ranks: a number, not {a:?}"))?,
        None => 4,
    };
    if !(2..=8).contains(&n) {
        return Err("ranks: 2 to 8 (one device each)".into());
    }
    let mut config = ModelConfig::node(n);
    if !portable {
        config.driver_version = 13050; // cuFabricCpyBatchAsync (F7)
    }
    let (ctx, model) = Context::model(config);
    let contexts: Vec<Context> = std::iter::once(ctx)
        .chain((1..n).map(|_| Context::new(model.spawn_process())))
        .collect();
    std::thread::scope(|s| {
        let ranks: Vec<_> = contexts
            .iter()
            .zip(Threads::new(n))
            .map(|(ctx, boot)| s.spawn(move || rank(ctx, &boot).map_err(|e| e.to_string())))
            .collect();
        ranks
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a rank panicked".to_string())?)
    })?;
    drop(contexts);
    if !model.live_node().is_empty() || !model.violations().is_empty() {
        return Err(format!(
            "left on the node: {:?}; broken rules: {:?}",
            model.live_node(),
            model.violations()
        )
        .into());
    }
    let path = path_words(portable);
    println!("{n} ranks ({path}): nothing left, no rule broken");
    Ok(())
}

/// The copy path, in words.
fn path_words(portable: bool) -> &'static str {
    if portable {
        "portable path, driver 13.4"
    } else {
        "fabric copy, driver 13.5"
    }
}

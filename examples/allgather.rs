//! Allgather through unicast endpoints: `n` OS processes over TCP on a model
//! fabric (this program is the launcher and rank 0). Every rank brings
//! unicast peers up (`team::unicast_peers`), binds its memory on its own
//! endpoint and writes its slice there, agrees with every rank that every
//! rank bound (`agree_bound`, R13.3), then gets every rank's slice through
//! that rank's endpoint in one batch and checks every byte.
//!
//! ```text
//! cargo run --features fabric --example allgather              # 4 ranks, 1 node
//! cargo run --features fabric --example allgather -- 8 2        # 8 ranks, 2 nodes of 4
//! cargo run --features fabric --example allgather -- 4 1 --driver cuda
//! ```
//!
//! Exit codes: 0 every byte right; 1 a byte was wrong; 2 could not run;
//! 3 a rank hung or the fabric saw a leak or a broken rule
//! (`common/job.rs`). With `--driver cuda` every rank runs the real driver
//! (on the libcuda test double, `ci/double.sh`, the double joins this
//! program's fabric).

#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::Me;
use common::job::{self, Checked, TIMEOUT};
use cuda_endpoints::team::{self, PeerSpec};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, PosixFd, Private, Stream, bootstrap::Bootstrap,
};

/// Bytes of each rank's slice.
const SLICE: u64 = 64 << 10;

/// Byte `i` of rank `r`'s slice.
fn slice(r: usize) -> Vec<u8> {
    (0..SLICE as usize)
        .map(|i| (r.wrapping_mul(37) ^ i.wrapping_mul(7)).wrapping_add(1) as u8)
        .collect()
}

fn rank(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, n, dev) = (boot.rank(), boot.size(), me.device());
    let peers = team::unicast_peers(
        ctx,
        boot,
        &PeerSpec::new(dev, common::BYTES).timeout(TIMEOUT),
    )?;
    // This rank's memory on its own endpoint, its slice written there.
    let mem = Allocation::<PosixFd>::on_device(ctx, dev, common::BYTES)?.map(&[dev])?;
    let binding = peers.own().bind(dev, 0, &mem)?;
    me.write(mem.device_ptr(), &slice(r))?;
    // Nobody gets before every owner bound (R13.3): what agree_bound hands
    // back is the only way to copy through the peers' endpoints.
    let bound = peers.agree_bound(boot, TIMEOUT)?;

    // Every rank's slice, through its endpoint, into one local buffer.
    let gathered = Allocation::<Private>::on_device(ctx, dev, common::BYTES)?.map(&[dev])?;
    let stream = Stream::new(ctx, dev)?;
    let mut batch = CopyBatch::new();
    for p in 0..n {
        let at = u64::try_from(p)?
            .checked_mul(SLICE)
            .ok_or("too many ranks")?;
        batch = match bound.peer(p) {
            Some(ep) => batch.get(ep, 0, &gathered, at, SLICE),
            None => batch.get(bound.own(), 0, &gathered, at, SLICE),
        };
    }
    stream.enqueue(batch)?.wait()?;

    let mut checked = Checked::default();
    let got = me.read(gathered.device_ptr(), n * SLICE as usize)?;
    for (p, got) in got.chunks(SLICE as usize).enumerate() {
        checked.compare(&format!("rank {p}'s slice"), got, &slice(p));
    }
    // Nobody unbinds while a peer may still read: every rank completed its
    // copies, agreed (R13.7).
    bound.close(boot, TIMEOUT)?;
    drop(stream);
    drop(gathered);
    drop(binding);
    drop(peers);
    drop(mem);
    me.holds_nothing(r)?;
    Ok(checked)
}

fn main() -> ExitCode {
    job::main("allgather", rank)
}

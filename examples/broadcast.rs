//! Broadcast through a multicast endpoint: `n` OS processes over TCP on a
//! model fabric (this program is the launcher and rank 0), or MPI ranks
//! under `mpirun` (`--mpi`). Every rank brings a multicast team up
//! (`team::multicast`), binds its memory, and agrees with every rank that
//! every rank bound (`agree_bound`, R13.3); rank 0 puts once into the team
//! (one put lands in every member's bound memory); every rank checks its
//! own memory after its stream and a barrier.
//!
//! ```text
//! cargo run --features fabric --example broadcast              # 4 ranks, 1 node
//! cargo run --features fabric --example broadcast -- 8 2        # 8 ranks, 2 nodes of 4
//! cargo run --features fabric --example broadcast -- 4 1 --driver cuda
//! cargo build --features fabric,mpi --example broadcast --bin cuda-endpoints-fabric
//! target/debug/cuda-endpoints-fabric --nodes 1 --gpus 4 --driver-version 13050 -- \
//!     mpirun -n 4 --oversubscribe target/debug/examples/broadcast --mpi
//! ```
//!
//! Exit codes: 0 every byte right; 1 a byte was wrong; 2 could not run;
//! 3 a rank hung or the fabric saw a leak or a broken rule
//! (`common/job.rs`).

#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::Me;
use common::job::{self, Checked, TIMEOUT};
use cuda_endpoints::team::{self, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, PosixFd, Private, Stream, bootstrap::Bootstrap,
};

/// Where the message lands in every member's memory, and its length.
const AT: u64 = 4096;
const LEN: usize = 256 << 10;

fn message() -> Vec<u8> {
    (0..LEN)
        .map(|i| (i.wrapping_mul(13) ^ 0x5a) as u8)
        .collect()
}

fn rank(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
) -> Result<Checked, Box<dyn std::error::Error>> {
    let (r, dev) = (boot.rank(), me.device());
    let team = team::multicast(
        ctx,
        boot,
        &TeamSpec::new([dev], common::BYTES).timeout(TIMEOUT),
    )?;
    let mem = Allocation::<PosixFd>::on_device(ctx, dev, common::BYTES)?.map(&[dev])?;
    let binding = team.endpoint().bind(dev, 0, &mem)?;
    // Nobody puts before every member bound (R13.3).
    let bound = team.agree_bound(boot, TIMEOUT)?;
    let stream = Stream::new(ctx, dev)?;
    if r == 0 {
        let src = Allocation::<Private>::on_device(ctx, dev, common::BYTES)?.map(&[dev])?;
        me.write(src.device_ptr(), &message())?;
        stream
            .enqueue(CopyBatch::new().put(&src, 0, bound.endpoint(), AT, LEN as u64))?
            .wait()?;
    }
    stream.synchronize()?;
    boot.barrier(TIMEOUT)?;
    let mut checked = Checked::default();
    let got = me.read(mem.device_ptr() + AT, LEN)?;
    checked.compare("this rank's bound memory", &got, &message());
    // Nobody unbinds while the put may still be landing elsewhere: every
    // rank completed its copies, agreed (R13.7).
    bound.close(boot, TIMEOUT)?;
    drop(stream);
    drop(binding);
    drop(team);
    drop(mem);
    me.holds_nothing(r)?;
    Ok(checked)
}

fn main() -> ExitCode {
    job::main("broadcast", rank)
}

//! One rank of the team examples (`mpi_team`, `tcp_team`), whatever the
//! bootstrap and the driver: bring a multicast team up, bind this rank's
//! memory, share a message written through rank 0's memory with every
//! rank, tear down, and check that this process holds nothing.
//!
//! Two drivers ([`Me`]): the model fabric's `Remote` (the default), or the
//! real driver (`--driver cuda`). On a machine without a 13.3 GPU the real
//! driver is the libcuda test double (`ci/double.sh`), which is itself a
//! process of the fabric named by `CUDA_ENDPOINTS_FABRIC`: the same job,
//! every call through the C ABI.

mod copies;
// Only the data examples (`allgather`, `broadcast`) run a job.
#[allow(dead_code)]
pub mod job;
// `mpi_team` launches nothing.
#[allow(dead_code)]
pub mod launch;
#[allow(dead_code)]
mod ranks;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use cuda_endpoints::fabric::{self, Process};
use cuda_endpoints::team::{self, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, Device, FabricShareable, PosixFd, bootstrap::Bootstrap,
    bootstrap::FdExchange,
};

/// Whether the command line asks for the real driver (`--driver cuda`).
pub fn wants_cuda() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--driver=cuda")
        || args
            .windows(2)
            .any(|w| w[0] == "--driver" && w[1] == "cuda")
}

/// This rank's process.
pub enum Me {
    /// A process of the fabric through its `Remote` driver.
    Fabric(Process),
    /// The real driver; `device` is the rank's (its index on the node).
    Cuda {
        device: Device,
        copies: copies::Copies,
    },
}

/// This rank's context and process: the fabric named by
/// `CUDA_ENDPOINTS_FABRIC`, or the real driver with `--driver cuda` (rank
/// `rank` uses device `rank % devices`, as the fabric places ranks).
pub fn join(rank: usize) -> Result<(Context, Me), Box<dyn std::error::Error>> {
    if !wants_cuda() {
        let (ctx, me) =
            fabric::connect_env()?.ok_or("no fabric: CUDA_ENDPOINTS_FABRIC is not set")?;
        return Ok((ctx, Me::Fabric(me)));
    }
    let ctx = Context::cuda()?;
    let devices = ctx.devices()?.len().max(1);
    let device = Device(i32::try_from(rank % devices)?);
    Ok((
        ctx,
        Me::Cuda {
            device,
            copies: copies::Copies::load()?,
        },
    ))
}

impl Me {
    /// The device this rank uses.
    pub fn device(&self) -> Device {
        match self {
            Me::Fabric(p) => p.device().unwrap_or(Device(0)),
            Me::Cuda { device, .. } => *device,
        }
    }

    /// The node it runs on, when it knows.
    pub fn node(&self) -> Option<u32> {
        match self {
            Me::Fabric(p) => Some(p.node()),
            Me::Cuda { .. } => None,
        }
    }

    /// `node 0`, or `node ?` where the real driver does not say: printed
    /// the same way by every rank.
    pub fn node_label(&self) -> String {
        match self.node() {
            Some(n) => format!("node {n}"),
            None => "node ?".to_owned(),
        }
    }

    /// Writes `bytes` at device address `ptr` of this rank's device, as a
    /// kernel would (synchronously).
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Me::Fabric(p) => Ok(p.write(ptr, bytes)?),
            Me::Cuda { device, copies } => copies.write(device.0, ptr, bytes),
        }
    }

    /// Reads `len` bytes at device address `ptr` of this rank's device.
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        match self {
            Me::Fabric(p) => Ok(p.read(ptr, len)?),
            Me::Cuda { device, copies } => copies.read(device.0, ptr, len),
        }
    }

    /// Whether this process holds nothing. A real driver does not say (the
    /// fabric's launcher checks every process as it leaves): `Ok` then.
    pub fn holds_nothing(&self, rank: usize) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Me::Fabric(p) => {
                let live = p.live()?;
                if live.is_empty() {
                    Ok(())
                } else {
                    Err(format!("rank {rank} still holds {live:?}").into())
                }
            }
            Me::Cuda { .. } => Ok(()),
        }
    }
}

/// Bytes per device.
pub const BYTES: u64 = 2 << 20;

/// What one rank saw, for the launcher to print.
pub struct Summary {
    pub bring_up: Duration,
    /// Bootstrap messages this rank sent and received before the bring-up:
    /// the join handshake (over TCP, a hello in and a welcome out per other
    /// rank on rank 0, one of each on the others).
    pub join_messages: u64,
    /// Bootstrap messages this rank sent and received during the bring-up
    /// (`team::multicast`) alone.
    pub bring_up_messages: u64,
    pub read_back: String,
    pub messages: u64,
}

pub fn rank(
    ctx: &Context,
    me: &Me,
    boot: &dyn Bootstrap,
    timeout: Duration,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let r = boot.rank();
    let dev = me.device();

    // 1. Bring-up: one call on every rank, the same type on every rank.
    let before = boot.traffic();
    let join_messages = before.messages_sent + before.messages_received;
    let start = Instant::now();
    let spec = TeamSpec::new([dev], BYTES).timeout(timeout);
    let team = team::multicast(ctx, boot, &spec)?;
    let bring_up = start.elapsed();
    let t = boot.traffic();
    let bring_up_messages = (t.messages_sent + t.messages_received).saturating_sub(join_messages);

    // 2. Bind this rank's memory on its own device; a barrier before first use.
    let mem = Allocation::<PosixFd>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
    let binding = team.endpoint().bind(dev, 0, &mem)?;
    boot.barrier(timeout)?;

    // 3. Rank 0 writes through its memory; every rank reads it back through
    //    the model: a POSIX descriptor within rank 0's node (R12.4), a
    //    fabric handle across nodes.
    let text = format!("written by rank 0 into its {} bytes", mem.size());
    if r == 0 {
        me.write(mem.device_ptr(), text.as_bytes())?;
    }
    let fd = if r == 0 { Some(mem.export_fd()?) } else { None };
    let fd = FdExchange::broadcast_fd(boot, 0, fd.as_ref().map(AsFd::as_fd), timeout)?;
    let fabric_mem = match r {
        0 => {
            let m = Allocation::<FabricShareable>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
            me.write(m.device_ptr(), text.as_bytes())?;
            Some(m)
        }
        _ => None,
    };
    let handle = match &fabric_mem {
        Some(m) => m.export_fabric()?.to_vec(),
        None => Vec::new(),
    };
    let handle = boot.broadcast(0, &handle, timeout)?;
    // Imports are checked against the driver (size, location, handle type).
    let read_back = match Allocation::<PosixFd>::import_fd(ctx, &fd, BYTES) {
        Ok(peer) => {
            let peer = peer.map(&[dev])?;
            let bytes = me.read(peer.device_ptr(), text.len())?;
            format!("POSIX fd: {:?}", String::from_utf8_lossy(&bytes))
        }
        Err(e) => {
            // Another node: a descriptor means nothing there; use the fabric.
            let bytes: [u8; 64] = handle
                .as_slice()
                .try_into()
                .map_err(|_| "short fabric handle")?;
            let peer =
                Allocation::<FabricShareable>::import_fabric(ctx, &bytes, BYTES)?.map(&[dev])?;
            let bytes = me.read(peer.device_ptr(), text.len())?;
            format!(
                "across nodes a POSIX fd cannot be imported, as expected ({e}); through the fabric handle instead: {:?}",
                String::from_utf8_lossy(&bytes)
            )
        }
    };
    boot.barrier(timeout)?;

    // 4. Teardown: unbind, destroy, free; nothing left in this process.
    drop(binding);
    drop(fabric_mem);
    boot.barrier(timeout)?;
    drop(team);
    drop(mem);
    me.holds_nothing(r)?;
    let t = boot.traffic();
    Ok(Summary {
        bring_up,
        join_messages,
        bring_up_messages,
        read_back,
        messages: t.messages_sent + t.messages_received,
    })
}

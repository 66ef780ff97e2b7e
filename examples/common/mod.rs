//! One rank of the team examples (`mpi_team`, `tcp_team`), whatever the
//! bootstrap: bring a multicast team up, bind this rank's memory, share a
//! message written through rank 0's memory with every rank, tear down, and
//! check that this process holds nothing.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use cuda_endpoints::fabric::Process;
use cuda_endpoints::team::{self, TeamSpec};
use cuda_endpoints::{Allocation, Bootstrap, Context, Device, Fabric, FdExchange, PosixFd};

/// Bytes per device.
pub const BYTES: u64 = 2 << 20;

/// What one rank saw, for the launcher to print.
pub struct Summary {
    pub bring_up: Duration,
    /// Bootstrap messages this rank sent and received during the bring-up.
    pub bring_up_messages: u64,
    pub read_back: String,
    pub messages: u64,
}

pub fn rank(
    ctx: &Context,
    me: &Process,
    boot: &dyn Bootstrap,
    timeout: Duration,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let r = boot.rank();
    let dev = me.device().unwrap_or(Device(0));

    // 1. Bring-up: one call on every rank, the same type on every rank.
    let start = Instant::now();
    let spec = TeamSpec::new([dev], BYTES).timeout(timeout);
    let team = team::multicast(ctx, boot, &spec)?;
    let bring_up = start.elapsed();
    let t = boot.traffic();
    let bring_up_messages = t.messages_sent + t.messages_received;

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
            let m = Allocation::<Fabric>::on_device(ctx, dev, BYTES)?.map(&[dev])?;
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
            let peer = Allocation::<Fabric>::import_fabric(ctx, &bytes, BYTES)?.map(&[dev])?;
            let bytes = me.read(peer.device_ptr(), text.len())?;
            format!(
                "POSIX fd refused across nodes ({e}); fabric handle: {:?}",
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
    let live = me.live()?;
    if !live.is_empty() {
        return Err(format!("rank {r} still holds {live:?}").into());
    }
    let t = boot.traffic();
    Ok(Summary {
        bring_up,
        bring_up_messages,
        read_back,
        messages: t.messages_sent + t.messages_received,
    })
}

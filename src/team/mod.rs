//! Team bring-up across ranks, in one call per rank: the two patterns that
//! NCCL, TensorRT-LLM, DeepEP and NVSHMEM use in production.
//!
//! - [`multicast`]: the root creates an exportable team spread over the
//!   ranks and broadcasts its handle; every other rank imports it; every rank
//!   enrolls its own devices; all agree, each checking every rank's report
//!   (team size, a digest of the hellos, devices enrolled) against its own
//!   view; all wait (bounded); all agree again. Two ranks that bring one
//!   physical device (same boot id and PCI location) fail at the join.
//!   Every rank then holds the same type, [`SharedTeam`] with an
//!   `Endpoint<Ready, SharedMulticast>`, and binds its own memory.
//! - [`unicast_peers`]: each rank reserves one id per rank, creates its own
//!   endpoint at its own index and exports it while it is built (R13.1);
//!   all allgather the handles;
//!   each imports every peer at the peer's index and readies the whole range
//!   with one query per poll round (R3.5). Every rank holds [`Peers`].
//!
//! - [`Peers::into_owned`]: the owning form of unicast peers,
//!   [`OwnedPeers`] (and its erased twin [`DynPeers`]), whose memory is a
//!   symmetric heap that grows and shrinks by agreement (R13.5, R13.7).
//! - [`probe`]: which ranks reach which, proved peer to peer, and which
//!   bring-up will work ([`Reach`]). Both bring-ups run it as their first
//!   step after the hello, before anything is created (opt out with
//!   [`TeamSpec::probe`] / [`PeerSpec::probe`]): a rank that cannot reach
//!   another fails every rank at [`Step::Probe`], naming both
//!   ([`Cause::Unreachable`]).
//!
//! - [`Tagged`]: one bootstrap shared by bring-ups that run at once, each
//!   over its own [`Channel`] and with its own tag ([`TeamSpec::tag`],
//!   [`PeerSpec::tag`]), so that no message of one reaches another.
//!
//! A step that fails with a retryable code on any rank — any step of either
//! bring-up, the hello included — is retried by every rank together
//! ([`Retry`]); `unicast_peers` ends by agreeing on a digest
//! of every rank's peer-to-id table (R13.4).
//!
//! Both talk through a [`Bootstrap`](crate::bootstrap::Bootstrap) (threads,
//! TCP, MPI, or the caller's own communicator). After every step that can
//! fail, the ranks *agree*: each sends its outcome, each gets every outcome,
//! and all go on or all undo. So a failure on one rank reaches every rank as
//! a [`TeamError`] naming that rank and the step, within the timeout, with
//! everything undone on every rank; a rank that dies or goes silent is
//! reported by the bootstrap, within the timeout too. The root keeps its
//! reference until every rank has imported (R12.3).
//!
//! Handles travel in an envelope (protocol version, options, then the
//! handle's checksummed wire form). What an importer relies on — kind, size,
//! team size, counted operations — is checked against what the ranks agreed
//! on at the join step, and the bind alignment against what this driver's
//! `cuLogicalEndpointGetLimits` reports for those properties, before import;
//! the driver validates the handle itself on import (R9.4).
//!
//! ```
//! use std::time::Duration;
//! use cuda_endpoints::{Allocation, Context, PosixFd, bootstrap::Threads, team};
//!
//! let (ctx0, model) = Context::model(Default::default());
//! let contexts = [ctx0, Context::new(model.spawn_process())];
//! let boots = Threads::new(2);
//! std::thread::scope(|s| {
//!     for (rank, (ctx, boot)) in contexts.iter().zip(boots).enumerate() {
//!         s.spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!             let spec = team::TeamSpec::new([rank as i32], 2 << 20).timeout(Duration::from_secs(5));
//!             let team = team::multicast(ctx, &boot, &spec)?;
//!             let mem = Allocation::<PosixFd>::on_device(ctx, rank as i32, 2 << 20)?;
//!             let binding = team.endpoint().bind(rank as i32, 0, &mem)?;
//!             binding.unbind()?;
//!             Ok(())
//!         });
//!     }
//! });
//! assert!(model.live_node().is_empty());
//! ```

mod agree;
mod bound;
mod error;
mod known;
mod limits;
mod multicast;
mod owned;
mod peers;
mod probe;
mod retry;
mod shared;
mod tagged;
mod windows;
mod wire;

use std::time::Duration;

pub use bound::{BoundPeers, BoundTeam, CloseOnEveryRank, OwnedTeam};
pub use error::{Cause, Mismatch, PeerFailure, Step, TeamError};
pub use limits::MAX_BINDINGS_PER_DEVICE;
pub use multicast::{SharedTeam, TeamSpec, multicast};
pub use owned::{DynPeers, OwnedPeers};
pub use peers::{PeerSpec, Peers, unicast_peers};
pub use probe::{BringUp, RankFacts, Reach, probe};
pub use retry::Retry;
pub use shared::SharedMulticast;
pub use tagged::{Channel, Tagged};

use crate::context::Context;
use crate::driver::Device;
use crate::driver::EndpointProps as Props;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::{ImportedUnicast, Kind};
use crate::state::{Pending, Ready};

/// Rank `rank`'s hello asks for the same size and options as the reference
/// (the root's, or this rank's own): the same check on every rank, so every
/// rank names the same odd one out.
fn same_options(
    rank: usize,
    h: &wire::Hello,
    bytes: u64,
    counted_ops: bool,
) -> Result<(), TeamError> {
    let mismatch = |m| Err(TeamError::new(rank, Step::Hello, error::Cause::Mismatch(m)));
    if h.bytes != bytes {
        return mismatch(Mismatch::Bytes {
            root: bytes,
            this: h.bytes,
        });
    }
    if h.counted_ops != counted_ops {
        return mismatch(Mismatch::CountedOps);
    }
    Ok(())
}

/// A handle's claim `field = got` is what the ranks agreed on (`want`), or a
/// mismatch at the check step, before anything is imported.
fn expect_claim(field: &'static str, got: u64, want: u64) -> Result<(), (Step, error::Cause)> {
    if got == want {
        Ok(())
    } else {
        Err((
            Step::Check,
            error::Cause::Mismatch(Mismatch::Handle {
                field,
                handle: got,
                expected: want,
            }),
        ))
    }
}

/// This rank's devices exist and are distinct (checked before any rank
/// creates anything).
fn check_devices(ctx: &Context, devices: &[Device]) -> Result<(), error::Cause> {
    for (i, &dev) in devices.iter().enumerate() {
        ctx.check_device(dev).map_err(error::Cause::Local)?;
        if devices[..i].contains(&dev) {
            return Err(error::Cause::Local(Error::AlreadyEnrolled { device: dev }));
        }
    }
    Ok(())
}

/// Which physical device `dev` is, across the processes of the job: the
/// kernel's boot id (two hosts never share one; containers of one host do)
/// and the device's PCI location (attributes 50, 33, 34), whatever its
/// ordinal in this process (`CUDA_VISIBLE_DEVICES`). `None` where either
/// cannot be read: then no check is made on it.
fn place(ctx: &Context, dev: Device) -> Option<u64> {
    use crate::driver::attr;
    let boot_id = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let read = |a| ctx.attribute_or_none(dev, a);
    let pci = [
        read(attr::PCI_DOMAIN_ID)?,
        read(attr::PCI_BUS_ID)?,
        read(attr::PCI_DEVICE_ID)?,
    ];
    let mut bytes = boot_id;
    for v in pci {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    Some(wire::join_digest(&[bytes]))
}

/// The handle's bind alignment is what this driver reports for the same
/// properties, and its size fits (R10).
fn check_limits(ctx: &Context, props: &Props, handle_align: u64) -> Result<(), error::Cause> {
    let limits = ctx.limits(props).map_err(error::Cause::Local)?;
    if limits.bind_alignment != handle_align {
        return Err(error::Cause::Mismatch(Mismatch::Handle {
            field: "bind alignment",
            handle: handle_align,
            expected: limits.bind_alignment,
        }));
    }
    if props.size > limits.max_size {
        return Err(error::Cause::Mismatch(Mismatch::Handle {
            field: "size",
            handle: props.size,
            expected: limits.max_size,
        }));
    }
    Ok(())
}

/// Readies every imported peer with one query over the whole range a round:
/// `own` is already ready and shares the range with them (R3.5).
fn wait_range<K: Kind>(
    own: &Endpoint<Ready, K>,
    imported: &[Option<Endpoint<Pending, ImportedUnicast>>],
    timeout: Duration,
) -> Result<(), Error> {
    if imported.iter().all(Option::is_none) {
        return Ok(());
    }
    let range = own.range();
    crate::ready::wait_ids(range, range.base, range.count, timeout)
}

//! Unicast peers (the NCCL pattern): each rank reserves one id per rank,
//! creates its own endpoint at its own index, waits for it and exports it;
//! all ranks allgather the handles; each imports every peer at the peer's
//! index and readies the whole range with one query per poll round (R3.5);
//! the outcome is agreed.

use std::time::Duration;

use crate::bootstrap::Bootstrap;
use crate::context::Context;
use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::kind::{Exportable, ImportedUnicast, NoKind, Unicast};
use crate::sharing::FabricHandle;
use crate::spec::Spec;
use crate::state::{Pending, Ready, Reserved, TeamReady};

use super::agree::agree;
use super::error::{Cause, Step, TeamError};
use super::wire::{Hello, decode_envelope, encode_envelope};
use super::{check_devices, check_limits, wait_range};
use crate::bootstrap::Deadline;

/// What a rank asks of a unicast-peers bring-up: its own device and the
/// bytes of its endpoint (the same on every rank).
#[derive(Clone, Debug)]
pub struct PeerSpec {
    device: Device,
    bytes: u64,
    timeout: Duration,
    counted_ops: bool,
}

impl PeerSpec {
    /// This rank's endpoint is owned by `device`, `bytes` bytes. Default
    /// timeout: 10 s for the whole bring-up.
    pub fn new(device: impl Into<Device>, bytes: u64) -> PeerSpec {
        PeerSpec {
            device: device.into(),
            bytes,
            timeout: Duration::from_secs(10),
            counted_ops: false,
        }
    }

    /// The whole bring-up ends, on every rank, within `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> PeerSpec {
        self.timeout = timeout;
        self
    }

    /// Counted operations (`COUNTED_OPS`, R2.4).
    pub fn counted_ops(mut self) -> PeerSpec {
        self.counted_ops = true;
        self
    }
}

/// Unicast peers brought up on every rank: this rank's own endpoint (bind
/// its memory there) and every peer's, imported at the peer's index. The
/// same type on every rank.
#[derive(Debug)]
pub struct Peers {
    rank: usize,
    own: Endpoint<Ready, Unicast<Exportable>>,
    peers: Vec<Option<Endpoint<Ready, ImportedUnicast>>>,
}

impl Peers {
    /// This rank's number, and the index of its own endpoint.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.peers.len()
    }

    /// This rank's own endpoint: the one to bind this rank's memory on.
    /// No copy goes through the endpoints until every rank bound:
    /// [`Peers::agree_bound`] lends them as `Endpoint<Ready, _>` then (R13.3).
    pub fn own(&self) -> &Endpoint<TeamReady, Unicast<Exportable>> {
        self.own.as_state()
    }

    /// Rank `rank`'s endpoint as imported here; `None` for this rank's own
    /// index (use [`Peers::own`]) or past the last rank.
    pub fn peer(&self, rank: usize) -> Option<&Endpoint<TeamReady, ImportedUnicast>> {
        self.ready_peer(rank).map(Endpoint::as_state)
    }

    pub(crate) fn ready_own(&self) -> &Endpoint<Ready, Unicast<Exportable>> {
        &self.own
    }

    pub(crate) fn ready_peer(&self, rank: usize) -> Option<&Endpoint<Ready, ImportedUnicast>> {
        self.peers.get(rank).and_then(Option::as_ref)
    }

    /// The id at `rank`'s index, as kernels address it.
    pub fn id_of(&self, rank: usize) -> Option<u32> {
        if rank == self.rank {
            Some(self.own.id())
        } else {
            self.peer(rank).map(Endpoint::id)
        }
    }
}

/// Brings unicast peers up across the ranks of `boot`, in one call on every
/// rank; see the [module docs](crate::team).
///
/// # Errors
/// A [`TeamError`] on every rank, naming the rank and step that failed first,
/// within the spec's timeout; everything made on this rank is undone first.
pub fn unicast_peers(
    ctx: &Context,
    boot: &dyn Bootstrap,
    spec: &PeerSpec,
) -> Result<Peers, TeamError> {
    let deadline = Deadline::after(spec.timeout);
    let (me, ranks) = (boot.rank(), boot.size());

    let hello = Hello {
        bytes: spec.bytes,
        counted_ops: spec.counted_ops,
        devices: vec![spec.device],
        cliques: vec![None],
        places: vec![None],
    };
    let local = check_devices(ctx, &[spec.device])
        .map(|()| hello.encode())
        .map_err(|c| (Step::Hello, c));
    let hellos = agree(boot, Step::Hello, local, deadline)?;
    for (rank, bytes) in hellos.iter().enumerate() {
        let h = Hello::decode(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        super::same_options(rank, &h, spec.bytes, spec.counted_ops)?;
    }

    // One id per rank; this rank's own endpoint at its own index.
    let mut slots: Vec<Option<Endpoint<Reserved, NoKind>>> = Vec::new();
    let mut own = None;
    let local = (|| {
        let create = |c| (Step::Create, c);
        let count = u32::try_from(ranks).map_err(|_| {
            create(Cause::BadMessage {
                reason: "more ranks than ids",
            })
        })?;
        slots = ctx
            .reserve(count)
            .map_err(|e| create(Cause::Local(e)))?
            .into_endpoints()
            .into_iter()
            .map(Some)
            .collect();
        let mine = slots
            .get_mut(me)
            .and_then(Option::take)
            .ok_or(create(Cause::BadMessage {
                reason: "rank past the range",
            }))?;
        let mut s = Spec::unicast(spec.device, spec.bytes).exportable();
        if spec.counted_ops {
            s = s.counted_ops();
        }
        let ep = mine.create(s).map_err(|f| create(Cause::Local(f.error)))?;
        let ep = ep
            .wait(deadline.remaining())
            .map_err(|f| (Step::Wait, Cause::Local(f.error)))?;
        let handle = ep.export().map_err(|e| (Step::Export, Cause::Local(e)))?;
        own = Some(ep);
        Ok(encode_envelope(spec.counted_ops, &handle.to_bytes()))
    })();
    let envelopes = agree(boot, Step::Export, local, deadline)?;
    let Some(own) = own else {
        return Err(TeamError::new(
            me,
            Step::Export,
            Cause::BadMessage {
                reason: "no endpoint",
            },
        ));
    };

    // Import every peer at its index; ready them all with one query a round.
    let mut imported: Vec<Option<Endpoint<Pending, ImportedUnicast>>> = Vec::new();
    let local = (|| {
        for (rank, env) in envelopes.iter().enumerate() {
            let slot = slots.get_mut(rank).and_then(Option::take);
            let Some(id) = slot else {
                imported.push(None);
                continue;
            };
            let check = |c| (Step::Check, c);
            let (counted, handle) = decode_envelope(env).map_err(check)?;
            let handle = FabricHandle::<Unicast<Exportable>>::from_bytes(handle)
                .map_err(|e| check(Cause::Local(e)))?;
            let expect = super::expect_claim;
            expect("size", handle.size(), spec.bytes)?;
            expect("team size", u64::from(handle.team_size()), 1)?;
            expect(
                "counted operations",
                u64::from(counted),
                u64::from(spec.counted_ops),
            )?;
            // The owner is another rank's device: the bind alignment is
            // checked against this driver's answer for the same size.
            let props = Spec::unicast(
                own.devices().first().copied().unwrap_or(spec.device),
                spec.bytes,
            )
            .exportable();
            check_limits(ctx, &props.props(), handle.bind_alignment()).map_err(check)?;
            let ep = id
                .import(&handle)
                .map_err(|f| (Step::Import, Cause::Local(f.error)))?;
            imported.push(Some(ep));
        }
        wait_range(&own, &imported, deadline.remaining())
            .map_err(|e| (Step::Wait, Cause::Local(e)))?;
        Ok(Vec::new())
    })();
    agree(boot, Step::Wait, local, deadline)?;
    let peers = imported
        .into_iter()
        .map(|e| e.map(Endpoint::cast))
        .collect();
    Ok(Peers {
        rank: me,
        own,
        peers,
    })
}

//! Unicast peers (the NCCL pattern): each rank reserves one id per rank,
//! creates its own endpoint at its own index and exports it while the
//! driver still builds it (R13.1: export needs no readiness);
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
use super::retry::{Retry, agree_retrying};
use super::wire::{Carrier, Hello, decode_envelope, encode_envelope, from_bytes, to_bytes};
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
    retry: Retry,
    tag: u64,
    probe: bool,
    overlap: bool,
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
            retry: Retry::default(),
            tag: 0,
            probe: true,
            overlap: true,
        }
    }

    /// Whether this rank exports its endpoint while the driver still builds
    /// it, so that construction overlaps the handle exchange (R13.1; the
    /// default), or waits for it first (`false`: what a bring-up did before
    /// R13.1, kept to measure what the overlap saves, `benches/bring_up.rs`).
    /// Every rank may choose alike or not; the outcome is the same.
    pub fn overlap(mut self, overlap: bool) -> PeerSpec {
        self.overlap = overlap;
        self
    }

    /// Whether the bring-up first proves reachability peer to peer
    /// ([`probe`](super::probe); default on): a rank that cannot import
    /// another's trial endpoint fails every rank at
    /// [`Step::Probe`](super::Step::Probe), naming both
    /// ([`Cause::Unreachable`](super::Cause::Unreachable)), before anything
    /// is created. Every rank passes the same choice.
    pub fn probe(mut self, probe: bool) -> PeerSpec {
        self.probe = probe;
        self
    }

    /// The bring-up's tag (default 0), the same on every rank: every
    /// message carries it and a message of another tag is refused
    /// ([`Mismatch::Tag`](super::Mismatch::Tag)). Bring-ups that share one
    /// bootstrap at once each take their own, over
    /// [`Tagged`](super::Tagged) channels of that tag.
    pub fn tag(mut self, tag: u64) -> PeerSpec {
        self.tag = tag;
        self
    }

    /// The whole bring-up ends, on every rank, within `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> PeerSpec {
        self.timeout = timeout;
        self
    }

    /// How a step that failed with a retryable code on some rank is
    /// retried by every rank together (default [`Retry::default`]; cut to
    /// fit in the timeout, [`Retry::within`]): every step — the hello, the
    /// create-and-export step and the import-and-wait step (imports that
    /// succeeded are kept).
    pub fn retry(mut self, retry: Retry) -> PeerSpec {
        self.retry = retry;
        self
    }

    /// Counted operations (`COUNTED_OPS`, R2.4).
    pub fn counted_ops(mut self) -> PeerSpec {
        self.counted_ops = true;
        self
    }
}

/// This rank's own endpoint of a unicast-peers bring-up.
pub(crate) type OwnEndpoint = Endpoint<Ready, Unicast<Exportable>>;
/// A peer's endpoint as imported here.
pub(crate) type PeerEndpoint = Endpoint<Ready, ImportedUnicast>;

/// Unicast peers brought up on every rank: this rank's own endpoint (bind
/// its memory there) and every peer's, imported at the peer's index. The
/// same type on every rank.
#[derive(Debug)]
pub struct Peers {
    rank: usize,
    tag: u64,
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

    /// The bring-up's tag ([`PeerSpec::tag`]), which its later agreements
    /// (`agree_bound`, a heap's grow and shrink) carry too.
    pub fn tag(&self) -> u64 {
        self.tag
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

    pub(crate) fn into_parts(self) -> (usize, u64, OwnEndpoint, Vec<Option<PeerEndpoint>>) {
        (self.rank, self.tag, self.own, self.peers)
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
    let tag = spec.tag;
    let retry = spec.retry.within(spec.timeout);
    let hellos = agree_retrying(boot, tag, Step::Hello, retry, deadline, || {
        check_devices(ctx, &[spec.device])
            .map(|()| hello.encode())
            .map_err(|c| (Step::Hello, c))
    })?;
    for (rank, bytes) in hellos.iter().enumerate() {
        let h = Hello::decode(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        super::same_options(rank, &h, spec.bytes, spec.counted_ops)?;
    }
    if spec.probe {
        super::probe::probe_step(ctx, boot, tag, Some(spec.device), retry, deadline)?;
    }

    // One id per rank; this rank's own endpoint at its own index.
    let mut slots: Vec<Option<Endpoint<Reserved, NoKind>>> = Vec::new();
    let mut own = None;
    let mut ready_own = None;
    let envelopes = agree_retrying(boot, tag, Step::Export, retry, deadline, || {
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
        let export = |e| (Step::Export, Cause::Local(e));
        if !spec.overlap {
            // Without the overlap: ready before the handle travels.
            let ready = ep
                .wait(deadline.remaining())
                .map_err(|f| (Step::Wait, Cause::Local(f.error)))?;
            let handle = ready.export().map_err(export)?;
            ready_own = Some(ready);
            return Ok(encode_envelope(spec.counted_ops, &handle.to_bytes()));
        }
        // Exported pending (R13.1): the driver builds it while the handles
        // travel; it is waited for with the peers, below.
        let handle = ep.export().map_err(export)?;
        own = Some(ep);
        Ok(encode_envelope(spec.counted_ops, &handle.to_bytes()))
    })?;
    if own.is_none() && ready_own.is_none() {
        return Err(TeamError::new(
            me,
            Step::Export,
            Cause::BadMessage {
                reason: "no endpoint",
            },
        ));
    }

    // Import every peer at its index; ready them all with one query a round.
    // Retried as one step: what was imported stays imported, a failed
    // import gives its id back to its slot, and the own endpoint comes back
    // pending when its wait failed.
    let mut imported: Vec<Option<Endpoint<Pending, ImportedUnicast>>> =
        (0..ranks).map(|_| None).collect();
    let digests = agree_retrying(boot, tag, Step::Wait, retry, deadline, || {
        for (rank, env) in envelopes.iter().enumerate() {
            if imported.get(rank).is_some_and(Option::is_some) {
                continue;
            }
            let Some(id) = slots.get_mut(rank).and_then(Option::take) else {
                continue;
            };
            let checked = (|| {
                let check = |c| (Step::Check, c);
                let (counted, carrier) = decode_envelope(env).map_err(check)?;
                let Carrier::Fabric(handle) = carrier else {
                    return Err(check(Cause::Mismatch(super::Mismatch::Backend)));
                };
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
                let props = Spec::unicast(spec.device, spec.bytes).exportable();
                check_limits(ctx, &props.props(), handle.bind_alignment()).map_err(check)?;
                Ok(handle)
            })();
            let handle = match checked {
                Ok(h) => h,
                Err(e) => {
                    if let Some(slot) = slots.get_mut(rank) {
                        *slot = Some(id);
                    }
                    return Err(e);
                }
            };
            match id.import(&handle) {
                Ok(ep) => {
                    if let Some(slot) = imported.get_mut(rank) {
                        *slot = Some(ep);
                    }
                }
                Err(f) => {
                    if let Some(slot) = slots.get_mut(rank) {
                        *slot = Some(f.value);
                    }
                    return Err((Step::Import, Cause::Local(f.error)));
                }
            }
        }
        if ready_own.is_none() {
            let ep = own.take().ok_or((
                Step::Wait,
                Cause::BadMessage {
                    reason: "no endpoint",
                },
            ))?;
            match ep.wait(deadline.remaining()) {
                Ok(ep) => ready_own = Some(ep),
                Err(f) => {
                    own = Some(f.value);
                    return Err((Step::Wait, Cause::Local(f.error)));
                }
            }
        }
        let ep = ready_own.as_ref().ok_or((
            Step::Wait,
            Cause::BadMessage {
                reason: "no endpoint",
            },
        ))?;
        wait_range(ep, &imported, deadline.remaining())
            .map_err(|e| (Step::Wait, Cause::Local(e)))?;
        let base = ep.range().base;
        let ids = (0..ranks).map(|p| match imported.get(p).and_then(Option::as_ref) {
            Some(peer) => peer.id(),
            None => ep.id(),
        });
        Ok(to_bytes(
            &id_table_digest(base, ids, &envelopes).to_le_bytes(),
        ))
    })?;
    // Every rank's verdict on the tables goes round once more, so that a
    // rank whose own view differs (a bootstrap that delivered other bytes
    // to it) adopts the same verdict as every other rank.
    let verdict = encode_verdict(check_id_tables(&digests).err().as_ref());
    let verdicts = agree(boot, tag, Step::Wait, Ok(verdict), deadline)?;
    for (rank, v) in verdicts.iter().enumerate() {
        if let Some(e) = decode_verdict(rank, v, verdicts.len())? {
            return Err(e);
        }
    }
    let Some(own) = ready_own else {
        return Err(TeamError::new(
            me,
            Step::Wait,
            Cause::BadMessage {
                reason: "no endpoint",
            },
        ));
    };
    let peers = imported
        .into_iter()
        .map(|e| e.map(Endpoint::cast))
        .collect();
    Ok(Peers {
        rank: me,
        tag,
        own,
        peers,
    })
}

/// A digest of this rank's peer-to-id table (R13.4): for each index `p`, the
/// id (relative to the range's base) that names rank `p`'s endpoint here,
/// and a digest of the handle imported under it (this rank's own, exported,
/// at its own index).
pub(crate) fn id_table_digest(
    base: u32,
    ids: impl Iterator<Item = u32>,
    handles: &[Vec<u8>],
) -> u64 {
    let mut table = Vec::with_capacity(handles.len().saturating_mul(20));
    for (p, (id, handle)) in ids.zip(handles).enumerate() {
        table.extend_from_slice(&(p as u64).to_le_bytes());
        table.extend_from_slice(&id.wrapping_sub(base).to_le_bytes());
        table.extend_from_slice(&crate::driver::fnv1a(handle).to_le_bytes());
    }
    crate::driver::fnv1a(&table)
}

/// Every rank's table digest is rank 0's: the first rank (in rank order)
/// whose digest differs from rank 0's is named, the same on every rank.
pub(crate) fn check_id_tables(digests: &[Vec<u8>]) -> Result<(), TeamError> {
    let read = |rank: usize, bytes: &Vec<u8>| -> Result<u64, TeamError> {
        from_bytes::<[u8; 8]>(bytes)
            .map(u64::from_le_bytes)
            .map_err(|_| {
                TeamError::new(
                    rank,
                    Step::Wait,
                    Cause::BadMessage {
                        reason: "an id-table digest of the wrong length",
                    },
                )
            })
    };
    let Some(first) = digests.first() else {
        return Ok(());
    };
    let reference = read(0, first)?;
    for (rank, bytes) in digests.iter().enumerate().skip(1) {
        let theirs = read(rank, bytes)?;
        if theirs != reference {
            return Err(TeamError::new(
                rank,
                Step::Wait,
                Cause::Mismatch(super::error::Mismatch::IdTable {
                    reported: theirs,
                    expected: reference,
                }),
            ));
        }
    }
    Ok(())
}

/// A rank's verdict on the id tables: `None` when they all agree, else
/// the rank named, the digest it reported and the reference (zeros when
/// the named rank's digest could not be read).
type Verdict = Option<(u64, u64, u64)>;

fn encode_verdict(e: Option<&TeamError>) -> Vec<u8> {
    let v: Verdict = e.map(|e| match e.cause {
        Cause::Mismatch(super::error::Mismatch::IdTable { reported, expected }) => {
            (e.rank as u64, reported, expected)
        }
        _ => (e.rank as u64, 0, 0),
    });
    to_bytes(&v)
}

/// A peer's verdict, read checked (the rank it names is one of `ranks`).
fn decode_verdict(from: usize, bytes: &[u8], ranks: usize) -> Result<Option<TeamError>, TeamError> {
    let bad = || {
        TeamError::new(
            from,
            Step::Wait,
            Cause::BadMessage {
                reason: "an id-table verdict of the wrong form",
            },
        )
    };
    let Some((rank, reported, expected)) = from_bytes::<Verdict>(bytes).map_err(|_| bad())? else {
        return Ok(None);
    };
    let rank = usize::try_from(rank)
        .ok()
        .filter(|&r| r < ranks)
        .ok_or_else(bad)?;
    Ok(Some(TeamError::new(
        rank,
        Step::Wait,
        Cause::Mismatch(super::error::Mismatch::IdTable { reported, expected }),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r13_4_a_forged_id_table_names_the_same_rank_whatever_the_reader() {
        let handles = vec![vec![1u8; 8], vec![2; 8], vec![3; 8]];
        let good = to_bytes(&id_table_digest(10, [10, 11, 12].into_iter(), &handles).to_le_bytes());
        // Rank 1 imported rank 2's handle at index 1 (swapped ids).
        let forged =
            to_bytes(&id_table_digest(10, [10, 12, 11].into_iter(), &handles).to_le_bytes());
        assert_ne!(good, forged);
        assert!(check_id_tables(&[good.clone(), good.clone(), good.clone()]).is_ok());
        let e = check_id_tables(&[good.clone(), forged, good.clone()]).unwrap_err();
        assert_eq!((e.rank, e.step), (1, Step::Wait), "{e}");
        assert!(
            matches!(
                e.cause,
                Cause::Mismatch(super::super::Mismatch::IdTable { .. })
            ),
            "{e}"
        );
        let e = check_id_tables(&[good.clone(), vec![0; 7], good]).unwrap_err();
        assert!(matches!(e.cause, Cause::BadMessage { .. }), "{e}");
        let named = encode_verdict(Some(&e));
        assert_eq!(
            decode_verdict(0, &named, 3).map(|v| v.map(|e| e.rank)).ok(),
            Some(Some(1))
        );
        assert!(decode_verdict(0, &named, 1).is_err(), "a rank past the job");
        assert!(decode_verdict(0, &[2], 3).is_err());
        assert!(matches!(
            decode_verdict(0, &encode_verdict(None), 3),
            Ok(None)
        ));
    }
}

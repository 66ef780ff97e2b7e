//! The peer-verified reachability probe (issue 20, item 4), callable alone
//! before a bring-up.
//!
//! What this file owns: [`probe`] and what it returns, [`Reach`], and the
//! probe as the bring-ups' first step after the hello (`probe_step`,
//! opted out with `TeamSpec::probe(false)` / `PeerSpec::probe(false)`). Every rank
//! reports what its driver says about its device (driver version, multicast
//! clique, logical-endpoint handle types, attribute 158, and counted
//! operations, attribute 155) and exports a trial unicast endpoint (pending:
//! R13.1); every rank imports every other rank's trial endpoint and reports,
//! per exporter, whether the import worked. The reports go round, so every
//! rank holds the same [`Reach`]: which ranks share a fabric domain (an
//! import, not a self-import, proves it: a self-import proves only a local
//! channel), whether the ranks form one clique, and which bring-up will work
//! and why, naming the ranks. The trial endpoints are destroyed before it
//! returns. What the model cannot say (a classic fallback's own checks) is
//! not guessed.

use std::time::Duration;

use crate::bootstrap::{Bootstrap, Deadline};
use crate::context::Context;
use crate::driver::{Code, Device, attr};
use crate::kind::{Exportable, Unicast};
use crate::sharing::FabricHandle;
use crate::spec::Spec;

use serde::{Deserialize, Serialize};

use super::agree::agree;
use super::error::{Cause, Step, TeamError};
use super::retry::Retry;
use super::wire::{from_bytes, to_bytes};

/// The longest trial handle a rank may send.
const MAX_HANDLE: usize = 4096;

/// What one rank's driver says about its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFacts {
    /// `cuDriverGetVersion`, where it answered.
    pub driver_version: Option<i32>,
    /// The device's multicast clique (13.4+), where the driver tells.
    pub clique: Option<u32>,
    /// Attribute 158: the logical-endpoint handle types supported (13.5+).
    pub handle_types: Option<i32>,
    /// Attribute 155: counted operations supported.
    pub counted_ops: Option<i32>,
    /// The code its trial export failed with; `None` when it exported.
    pub export_failed: Option<Code>,
}

/// Which bring-up the probe says will work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BringUp {
    /// Every rank imported every other rank's endpoint and all devices are
    /// in one clique: [`multicast`](super::multicast) and
    /// [`unicast_peers`](super::unicast_peers) both work.
    Multicast,
    /// Every rank imported every other's, but the devices span cliques:
    /// [`unicast_peers`](super::unicast_peers) only.
    UnicastPeers,
    /// No logical-endpoint bring-up across these ranks: `why` names the
    /// ranks.
    None {
        /// Why, naming the ranks.
        why: String,
    },
}

/// What every rank learnt, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reach {
    /// Per rank, what its driver says.
    pub ranks: Vec<RankFacts>,
    /// `imports[i][j]`: rank `i`'s import of rank `j`'s trial endpoint —
    /// `None` when it worked (or `i == j`), else the code.
    pub imports: Vec<Vec<Option<Code>>>,
}

impl Reach {
    /// `(importer, exporter, code)` of every import that failed.
    pub fn unreachable(&self) -> Vec<(usize, usize, Code)> {
        let mut out = Vec::new();
        for (i, row) in self.imports.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                if let Some(c) = c {
                    out.push((i, j, *c));
                }
            }
        }
        out
    }

    /// `(importer, exporter, code)` of every failure in rank order: a
    /// rank's failed trial export as `(r, r, code)` before its imports.
    fn failures(&self) -> Vec<(usize, usize, Code)> {
        let mut out = Vec::new();
        for (i, f) in self.ranks.iter().enumerate() {
            if let Some(c) = f.export_failed {
                out.push((i, i, c));
            }
            for (j, c) in self.imports.get(i).into_iter().flatten().enumerate() {
                if let Some(c) = c {
                    out.push((i, j, *c));
                }
            }
        }
        out
    }

    /// Whether every rank imported every other rank's endpoint: the ranks
    /// share one fabric domain (IMEX), proved peer to peer.
    pub fn one_fabric_domain(&self) -> bool {
        self.unreachable().is_empty() && self.ranks.iter().all(|r| r.export_failed.is_none())
    }

    /// Whether every rank's device is in one multicast clique (unknown
    /// cliques count as different).
    pub fn one_clique(&self) -> bool {
        let first = self.ranks.first().and_then(|r| r.clique);
        first.is_some() && self.ranks.iter().all(|r| r.clique == first)
    }

    /// Which bring-up will work, and why not, naming the ranks.
    pub fn bring_up(&self) -> BringUp {
        if let Some((r, c)) = self
            .ranks
            .iter()
            .enumerate()
            .find_map(|(r, f)| f.export_failed.map(|c| (r, c)))
        {
            let why = match self.ranks.get(r).and_then(|f| f.driver_version) {
                Some(v) if v < crate::driver::LOGICAL_ENDPOINT_MIN_VERSION => format!(
                    "rank {r} cannot export a logical endpoint: its driver is {}.{} ({v}), logical endpoints need 13.3+",
                    v / 1000,
                    (v % 1000) / 10
                ),
                _ => format!("rank {r} cannot export a logical endpoint ({c})"),
            };
            return BringUp::None { why };
        }
        if let Some(&(i, j, c)) = self.unreachable().first() {
            return BringUp::None {
                why: format!(
                    "rank {i} cannot import rank {j}'s endpoint ({c}): the ranks do not share a fabric domain (IMEX channel, R9.1)"
                ),
            };
        }
        if self.one_clique() {
            BringUp::Multicast
        } else {
            BringUp::UnicastPeers
        }
    }
}

/// One rank's report as it travels: its facts and its trial handle.
#[derive(Serialize, Deserialize)]
struct Report<'a> {
    driver_version: Option<i32>,
    clique: Option<u32>,
    handle_types: Option<i32>,
    counted_ops: Option<i32>,
    export_failed: Option<u32>,
    #[serde(borrow)]
    handle: &'a [u8],
}

/// A peer's report, read checked.
fn decode_facts(bytes: &[u8]) -> Result<(RankFacts, Vec<u8>), Cause> {
    let r: Report<'_> = from_bytes(bytes)?;
    if r.handle.len() > MAX_HANDLE {
        return Err(Cause::BadMessage {
            reason: "probe handle too long",
        });
    }
    Ok((
        RankFacts {
            driver_version: r.driver_version,
            clique: r.clique,
            handle_types: r.handle_types,
            counted_ops: r.counted_ops,
            export_failed: r
                .export_failed
                .map(|c| Code::from_raw(c).unwrap_or(Code::UNKNOWN)),
        },
        r.handle.to_vec(),
    ))
}

/// Probes, on every rank of `boot` in one call, whether this rank's `device`
/// reaches every other rank's: every rank reports its driver version,
/// clique and attributes 158 and 155, exports a trial unicast endpoint
/// (pending, R13.1) that every other rank imports, and all exchange which
/// imports worked, so every rank returns the same [`Reach`]. The trial
/// endpoints are destroyed before it returns.
///
/// # Errors
/// A [`TeamError`] on every rank when the bootstrap fails within `timeout`
/// or a rank sends a malformed report; an unreachable rank is not an
/// error: [`Reach::bring_up`] names it.
pub fn probe(
    ctx: &Context,
    boot: &dyn Bootstrap,
    device: impl Into<Device>,
    timeout: Duration,
) -> Result<Reach, TeamError> {
    probe_tagged(ctx, boot, 0, Some(device.into()), Deadline::after(timeout))
}

/// The probe as a bring-up's first step after the hello, before anything
/// is created: every rank probes with its first device (`None`: it brings
/// none), and a rank that cannot export its trial endpoint or import
/// another's fails every rank alike ([`Cause::Unreachable`], the first in
/// rank order: every rank holds the same [`Reach`]). Failures whose codes
/// are all retryable are probed again by every rank together, as any
/// step ([`Retry`]). Skipped on the classic fallback, which shares no
/// logical endpoint.
pub(crate) fn probe_step(
    ctx: &Context,
    boot: &dyn Bootstrap,
    tag: u64,
    dev: Option<Device>,
    retry: Retry,
    deadline: Deadline,
) -> Result<(), TeamError> {
    if ctx.object_sharing().is_some() {
        return Ok(());
    }
    let mut attempt = 1u32;
    loop {
        let reach = probe_tagged(ctx, boot, tag, dev, deadline)?;
        if let Some(e) = old_driver(&reach, boot.rank()) {
            return Err(e);
        }
        let failures = reach.failures();
        let Some(&(importer, exporter, code)) = failures.first() else {
            return Ok(());
        };
        let again = attempt < retry.attempts() && failures.iter().all(|f| f.2.is_retryable());
        tracing::warn!(
            target: "cuda_endpoints::team",
            step = %Step::Probe,
            attempt,
            of = retry.attempts(),
            importer,
            exporter,
            code = ?code,
            retry = again,
            "reachability probe failed"
        );
        if !again {
            return Err(TeamError::new(
                importer,
                Step::Probe,
                Cause::Unreachable {
                    importer,
                    exporter,
                    code,
                },
            ));
        }
        std::thread::sleep(retry.backoff(attempt).min(deadline.remaining()));
        attempt += 1;
    }
}

/// The first rank (in rank order) whose driver is before 13.3 and whose
/// trial export failed: no logical-endpoint bring-up there. Every rank holds
/// the same [`Reach`], so every rank returns the same error (this rank's
/// own as [`Cause::Local`], another's as that rank would display it).
fn old_driver(reach: &Reach, me: usize) -> Option<TeamError> {
    let (rank, version) = reach.ranks.iter().enumerate().find_map(|(r, f)| {
        let v = f.driver_version?;
        (f.export_failed.is_some() && v < crate::driver::LOGICAL_ENDPOINT_MIN_VERSION)
            .then_some((r, v))
    })?;
    let e = crate::Error::unsupported(
        crate::error::Feature::LogicalEndpoints,
        Some(version),
        format!(
            "rank {rank}'s driver has none for a bring-up to share; on `Context::auto`'s classic emulation `team::unicast_peers` works, and `team::multicast` once classic multicast is opted in"
        ),
    );
    let cause = if rank == me {
        Cause::Local(e)
    } else {
        Cause::Peer(super::error::PeerFailure {
            call: None,
            code: None,
            message: e.to_string(),
        })
    };
    Some(TeamError::new(rank, Step::Probe, cause))
}

/// [`probe`] as a bring-up's step: its messages carry the bring-up's tag,
/// and a rank that brings no device (`None`) exports nothing and reports
/// nothing of a device, but still imports every other rank's trial
/// endpoint.
pub(crate) fn probe_tagged(
    ctx: &Context,
    boot: &dyn Bootstrap,
    tag: u64,
    dev: Option<Device>,
    deadline: Deadline,
) -> Result<Reach, TeamError> {
    let (me, ranks) = (boot.rank(), boot.size());
    let read = |a| dev.and_then(|dev| ctx.attribute_or_none(dev, a));

    // A trial endpoint at this rank's index of a range of one id per rank.
    let mut slots: Vec<Option<_>> = Vec::new();
    let mut own = None;
    let exported = (|| -> Result<Option<Vec<u8>>, crate::Error> {
        let count = u32::try_from(ranks).unwrap_or(u32::MAX);
        let mut ids: Vec<_> = ctx
            .reserve(count)?
            .into_endpoints()
            .into_iter()
            .map(Some)
            .collect();
        let mine = ids.get_mut(me).and_then(Option::take);
        slots = ids;
        let mine = mine.ok_or(crate::Error::Driver {
            call: crate::Call::IdReserve,
            code: Code::INVALID_VALUE,
        })?;
        let Some(dev) = dev else {
            // Nothing to export; the id goes back with the range.
            return Ok(None);
        };
        let props = Spec::unicast(dev, 1).exportable();
        let size = ctx.limits(&props.props())?.bind_alignment.max(1);
        let ep = mine
            .create(Spec::unicast(dev, size).exportable())
            .map_err(|f| f.error)?;
        let handle = ep.export()?.to_bytes().to_vec();
        own = Some(ep);
        Ok(Some(handle))
    })();
    let (export_failed, handle) = match &exported {
        Ok(h) => (None, h.as_deref().unwrap_or(&[])),
        Err(e) => (Some(e.code().map_or(u32::MAX, Code::raw)), &[][..]),
    };
    let report = to_bytes(&Report {
        driver_version: ctx.driver_version(),
        clique: dev.and_then(|d| ctx.clique(d)),
        handle_types: read(attr::LE_SUPPORTED_HANDLE_TYPES),
        counted_ops: read(attr::LE_COUNTED_OPS),
        export_failed,
        handle: handle.get(..MAX_HANDLE.min(handle.len())).unwrap_or(&[]),
    });
    let reports = agree(boot, tag, Step::Probe, Ok(report), deadline)?;
    let mut facts = Vec::with_capacity(ranks);
    let mut handles = Vec::with_capacity(ranks);
    for (rank, bytes) in reports.iter().enumerate() {
        let (f, h) = decode_facts(bytes).map_err(|c| TeamError::new(rank, Step::Probe, c))?;
        facts.push(f);
        handles.push(h);
    }

    // Import every other rank's trial endpoint; a failure is a fact, not
    // an error. Everything is destroyed (dropped) at once after.
    // Only the failures travel, as (exporter, code): a row of every rank
    // would make each rank receive n² bytes in the rows' allgather.
    let mut row: Vec<(u32, u32)> = Vec::new();
    let mut imported = Vec::new();
    for (rank, h) in handles.iter().enumerate() {
        let slot = slots.get_mut(rank).and_then(Option::take);
        let code = match (slot, facts.get(rank).and_then(|f| f.export_failed)) {
            // Its own, a rank that failed to export, or one that brings no
            // device (no handle): nothing to import.
            (_, Some(_)) | (None, _) => 0u32,
            (Some(_), None) if h.is_empty() => 0,
            (Some(id), None) => match FabricHandle::<Unicast<Exportable>>::from_bytes(h) {
                Err(e) => e.code().map_or(u32::MAX, Code::raw),
                Ok(handle) => match id.import(&handle) {
                    Ok(ep) => {
                        imported.push(ep);
                        0
                    }
                    Err(f) => f.error.code().map_or(u32::MAX, Code::raw),
                },
            },
        };
        if code != 0 {
            row.push((u32::try_from(rank).unwrap_or(u32::MAX), code));
        }
    }
    drop(imported);
    drop(slots);
    // This rank's trial endpoint lives until every rank imported it (the
    // rows' exchange), as the root's does in a bring-up (R12.3).
    let rows = agree(boot, tag, Step::Probe, Ok(to_bytes(&row)), deadline);
    drop(own);
    let rows = rows?;
    let mut imports = Vec::with_capacity(ranks);
    for (rank, r) in rows.iter().enumerate() {
        let bad = |reason| TeamError::new(rank, Step::Probe, Cause::BadMessage { reason });
        let failed: Vec<(u32, u32)> =
            from_bytes(r).map_err(|_| bad("a probe row of the wrong form"))?;
        if failed.len() > ranks {
            return Err(bad("a probe row of the wrong length"));
        }
        let mut codes: Vec<Option<Code>> = vec![None; ranks];
        for (exporter, raw) in failed {
            let slot = usize::try_from(exporter)
                .ok()
                .and_then(|e| codes.get_mut(e))
                .filter(|c| c.is_none() && raw != 0)
                .ok_or(bad(
                    "a probe row naming a rank twice, out of range, or no failure",
                ))?;
            *slot = Some(Code::from_raw(raw).unwrap_or(Code::UNKNOWN));
        }
        imports.push(codes);
    }
    Ok(Reach {
        ranks: facts,
        imports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_report_from_a_peer_is_read_checked_never_trusted() {
        let ok = to_bytes(&Report {
            driver_version: Some(13050),
            clique: Some(1),
            handle_types: None,
            counted_ops: Some(1),
            export_failed: None,
            handle: &[1, 2, 3],
        });
        let (f, h) = decode_facts(&ok).unwrap();
        assert_eq!(
            (f.driver_version, f.clique, f.handle_types, h),
            (Some(13050), Some(1), None, vec![1, 2, 3])
        );
        for cut in 0..ok.len() {
            assert!(decode_facts(&ok[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = ok.clone();
        long.push(0);
        assert!(decode_facts(&long).is_err());
        let big = to_bytes(&Report {
            driver_version: None,
            clique: None,
            handle_types: None,
            counted_ops: None,
            export_failed: None,
            handle: &[0; MAX_HANDLE + 1],
        });
        assert!(decode_facts(&big).is_err());
    }
}

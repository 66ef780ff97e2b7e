//! The peer-verified reachability probe (issue 20, item 4), callable alone
//! before a bring-up.
//!
//! What this file owns: [`probe`] and what it returns, [`Reach`]. Every rank
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

use super::agree::agree;
use super::error::{Cause, Step, TeamError};

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
            return BringUp::None {
                why: format!("rank {r} cannot export a logical endpoint ({c})"),
            };
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

fn opt_i32(v: Option<i32>, out: &mut Vec<u8>) {
    out.push(u8::from(v.is_some()));
    out.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
}

/// A peer's report, read checked.
fn decode_facts(bytes: &[u8]) -> Result<(RankFacts, Vec<u8>), Cause> {
    struct Reader<'a> {
        bytes: &'a [u8],
        at: usize,
    }
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], Cause> {
            let bad = || Cause::BadMessage {
                reason: "probe report cut short",
            };
            let end = self.at.checked_add(n).ok_or_else(bad)?;
            let s = self.bytes.get(self.at..end).ok_or_else(bad)?;
            self.at = end;
            Ok(s)
        }
        fn opt(&mut self) -> Result<Option<i32>, Cause> {
            let flag = self.take(1)?.first().copied();
            let w: [u8; 4] = self.take(4)?.try_into().map_err(|_| Cause::BadMessage {
                reason: "probe report cut short",
            })?;
            match flag {
                Some(0) => Ok(None),
                Some(1) => Ok(Some(i32::from_le_bytes(w))),
                _ => Err(Cause::BadMessage {
                    reason: "probe report flag",
                }),
            }
        }
    }
    let mut r = Reader { bytes, at: 0 };
    let driver_version = r.opt()?;
    let clique = r.opt()?.map(|c| c as u32);
    let handle_types = r.opt()?;
    let counted_ops = r.opt()?;
    let export_failed = r
        .opt()?
        .map(|c| Code::from_raw(c as u32).unwrap_or(Code::UNKNOWN));
    let n: [u8; 2] = r.take(2)?.try_into().map_err(|_| Cause::BadMessage {
        reason: "probe report cut short",
    })?;
    let n = usize::from(u16::from_le_bytes(n));
    if n > MAX_HANDLE {
        return Err(Cause::BadMessage {
            reason: "probe handle too long",
        });
    }
    let handle = r.take(n)?.to_vec();
    if r.at != bytes.len() {
        return Err(Cause::BadMessage {
            reason: "probe report too long",
        });
    }
    Ok((
        RankFacts {
            driver_version,
            clique,
            handle_types,
            counted_ops,
            export_failed,
        },
        handle,
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
    let deadline = Deadline::after(timeout);
    let dev = device.into();
    let (me, ranks) = (boot.rank(), boot.size());
    let read = |a| {
        // SAFETY: an attribute query touches nothing anyone owns.
        unsafe { ctx.driver().device_attribute(dev, a) }.ok()
    };

    // A trial endpoint at this rank's index of a range of one id per rank.
    let mut slots: Vec<Option<_>> = Vec::new();
    let mut own = None;
    let exported = (|| -> Result<Vec<u8>, crate::Error> {
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
        let props = Spec::unicast(dev, 1).exportable();
        let size = ctx.limits(&props.props())?.bind_alignment.max(1);
        let ep = mine
            .create(Spec::unicast(dev, size).exportable())
            .map_err(|f| f.error)?;
        let handle = ep.export()?.to_bytes().to_vec();
        own = Some(ep);
        Ok(handle)
    })();
    let mut report = Vec::new();
    opt_i32(ctx.driver_version(), &mut report);
    opt_i32(ctx.clique(dev).map(|c| c as i32), &mut report);
    opt_i32(read(attr::LE_SUPPORTED_HANDLE_TYPES), &mut report);
    opt_i32(read(attr::LE_COUNTED_OPS), &mut report);
    let (code, handle) = match &exported {
        Ok(h) => (None, h.as_slice()),
        Err(e) => (Some(e.code().map_or(-1, |c| c.raw() as i32)), &[][..]),
    };
    opt_i32(code, &mut report);
    let handle = handle.get(..MAX_HANDLE.min(handle.len())).unwrap_or(&[]);
    report.extend_from_slice(&(handle.len() as u16).to_le_bytes());
    report.extend_from_slice(handle);
    let reports = agree(boot, Step::Hello, Ok(report), deadline)?;
    let mut facts = Vec::with_capacity(ranks);
    let mut handles = Vec::with_capacity(ranks);
    for (rank, bytes) in reports.iter().enumerate() {
        let (f, h) = decode_facts(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        facts.push(f);
        handles.push(h);
    }

    // Import every other rank's trial endpoint; a failure is a fact, not
    // an error. Everything is destroyed (dropped) at once after.
    let mut row: Vec<u8> = Vec::with_capacity(ranks * 4);
    let mut imported = Vec::new();
    for (rank, h) in handles.iter().enumerate() {
        let slot = slots.get_mut(rank).and_then(Option::take);
        let code = match (slot, facts.get(rank).and_then(|f| f.export_failed)) {
            (_, Some(_)) | (None, _) => 0u32,
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
        row.extend_from_slice(&code.to_le_bytes());
    }
    drop(imported);
    drop(slots);
    // This rank's trial endpoint lives until every rank imported it (the
    // rows' exchange), as the root's does in a bring-up (R12.3).
    let rows = agree(boot, Step::Import, Ok(row), deadline);
    drop(own);
    let rows = rows?;
    let mut imports = Vec::with_capacity(ranks);
    for (rank, r) in rows.iter().enumerate() {
        if r.len() != ranks.saturating_mul(4) {
            return Err(TeamError::new(
                rank,
                Step::Import,
                Cause::BadMessage {
                    reason: "a probe row of the wrong length",
                },
            ));
        }
        imports.push(
            r.chunks_exact(4)
                .map(|w| {
                    let raw = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    (raw != 0).then(|| Code::from_raw(raw).unwrap_or(Code::UNKNOWN))
                })
                .collect(),
        );
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
        let mut ok = Vec::new();
        for v in [Some(13050), Some(1), None, Some(1), None] {
            opt_i32(v, &mut ok);
        }
        ok.extend_from_slice(&3u16.to_le_bytes());
        ok.extend_from_slice(&[1, 2, 3]);
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
    }
}

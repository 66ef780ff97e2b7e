//! The every-rank-bound agreement (R13.3) that stands between a team
//! bring-up and its first copy.
//!
//! What this file owns:
//! - [`SharedTeam::agree_bound`] and [`Peers::agree_bound`]: every rank
//!   reports, over the bootstrap, the memory it bound (per device of its own:
//!   the devices it enrolled in a multicast team, the owner device of its
//!   unicast endpoint), and every rank checks every report alike, so that a
//!   rank that bound nothing fails every rank with the same [`TeamError`]
//!   (that rank, [`Step::Bind`], [`Mismatch::NotBound`]).
//! - [`BoundTeam`] and [`BoundPeers`], what the agreement hands back: the
//!   team's endpoints as `Endpoint<Ready, _>`, the only form a
//!   [`CopyBatch`](crate::CopyBatch) accepts. Before the agreement the
//!   bring-up lends them as [`TeamReady`](crate::TeamReady), which binds,
//!   exports and makes kernel references but copies nothing
//!   ([`Agreed`](crate::bounds::Agreed)): a copy before every rank bound
//!   does not compile.
//!
//! Unicast: each importer copies only after the owner bound; multicast:
//! every member only after every member bound (R13.3). The agreement checks
//! that each rank bound *something* on each of its devices; whether a copy's
//! range is inside what was bound is checked per copy (F9, this process's
//! own bindings) and by the driver. Binding more later (R13.5) needs
//! another agreement (or the caller's own barrier) before peers copy into it.

use std::time::Duration;

use crate::bootstrap::Bootstrap;
use crate::endpoint::Endpoint;
use crate::kind::{Exportable, ImportedUnicast, Kind, Unicast};
use crate::state::{Ready, State};

use super::agree::agree;
use super::error::{Cause, Mismatch, Step, TeamError};
use super::multicast::SharedTeam;
use super::peers::Peers;
use super::shared::SharedMulticast;
use crate::bootstrap::Deadline;

/// The most devices one rank's report may name (a peer's count is checked
/// against it before anything is allocated for it).
const MAX_REPORTED: usize = 4096;

/// This rank's report: for each device of its own, `(device, ranges bound)`.
fn report<S: State, K: Kind>(ep: &Endpoint<S, K>) -> Vec<u8> {
    let slot = ep.slot();
    let devices = ep.devices();
    let mut out = Vec::with_capacity(4 + devices.len() * 8);
    out.extend_from_slice(&(devices.len() as u32).to_le_bytes());
    for &d in devices {
        let n = slot.bindings.iter().filter(|b| b.dev == d).count();
        out.extend_from_slice(&d.0.to_le_bytes());
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
    }
    out
}

/// A peer's report, read checked: `(device, ranges bound)` per device.
fn decode(bytes: &[u8]) -> Result<Vec<(i32, u32)>, Cause> {
    let bad = |reason| Cause::BadMessage { reason };
    let word = |at: usize| -> Result<[u8; 4], Cause> {
        bytes
            .get(at..at.checked_add(4).ok_or(bad("bind report too long"))?)
            .and_then(|w| w.try_into().ok())
            .ok_or(bad("bind report cut short"))
    };
    let n = usize::try_from(u32::from_le_bytes(word(0)?)).unwrap_or(usize::MAX);
    if n > MAX_REPORTED {
        return Err(bad("bind report names too many devices"));
    }
    let want = n.checked_mul(8).and_then(|b| b.checked_add(4));
    if want != Some(bytes.len()) {
        return Err(bad("bind report of the wrong length"));
    }
    (0..n)
        .map(|i| {
            let at = 4 + i * 8;
            Ok((
                i32::from_le_bytes(word(at)?),
                u32::from_le_bytes(word(at + 4)?),
            ))
        })
        .collect()
}

/// Every rank reports what `ep` has bound on this rank's devices; every
/// rank checks every report in rank order, so all name the same first rank
/// that bound nothing.
fn agree_bound_on<S: State, K: Kind>(
    boot: &dyn Bootstrap,
    tag: u64,
    ep: &Endpoint<S, K>,
    timeout: Duration,
) -> Result<(), TeamError> {
    let deadline = Deadline::after(timeout);
    let reports = agree(boot, tag, Step::Bind, Ok(report(ep)), deadline)?;
    for (rank, bytes) in reports.iter().enumerate() {
        let devices = decode(bytes).map_err(|c| TeamError::new(rank, Step::Bind, c))?;
        let not_bound = |device| {
            TeamError::new(
                rank,
                Step::Bind,
                Cause::Mismatch(Mismatch::NotBound { device }),
            )
        };
        if devices.is_empty() {
            return Err(not_bound(None));
        }
        if let Some(&(d, _)) = devices.iter().find(|(_, n)| *n == 0) {
            return Err(not_bound(Some(d)));
        }
    }
    Ok(())
}

impl SharedTeam {
    /// Agrees, with every rank of `boot`, that every rank bound memory on
    /// each of its team devices (R13.3); call it on every rank after this
    /// rank's binds. What it returns lends the endpoint as
    /// `Endpoint<Ready, SharedMulticast>`, the form a copy accepts.
    ///
    /// # Errors
    /// The same [`TeamError`] on every rank when a rank bound nothing on one
    /// of its devices ([`Step::Bind`], [`Mismatch::NotBound`], naming the
    /// first such rank), or the bootstrap's failure within `timeout`.
    pub fn agree_bound(
        &self,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<BoundTeam<'_>, TeamError> {
        agree_bound_on(boot, self.tag(), self.ready_endpoint(), timeout)?;
        Ok(BoundTeam { team: self })
    }
}

/// A multicast team whose ranks all bound their memory (R13.3): its
/// endpoint, ready to copy through. Borrows the team.
#[derive(Debug, Clone, Copy)]
pub struct BoundTeam<'t> {
    team: &'t SharedTeam,
}

impl<'t> BoundTeam<'t> {
    /// The team's endpoint, to put into (a multicast put lands in every
    /// member's bound memory, F1).
    pub fn endpoint(&self) -> &'t Endpoint<Ready, SharedMulticast> {
        self.team.ready_endpoint()
    }

    /// The team.
    pub fn team(&self) -> &'t SharedTeam {
        self.team
    }
}

impl Peers {
    /// Agrees, with every rank of `boot`, that every rank bound memory on
    /// its own endpoint (R13.3: each owner bound before its importers copy);
    /// call it on every rank after this rank's binds. What it returns lends
    /// the endpoints as `Endpoint<Ready, _>`, the form a copy accepts.
    ///
    /// # Errors
    /// The same [`TeamError`] on every rank when a rank bound nothing on its
    /// own endpoint ([`Step::Bind`], [`Mismatch::NotBound`], naming the
    /// first such rank), or the bootstrap's failure within `timeout`.
    pub fn agree_bound(
        &self,
        boot: &dyn Bootstrap,
        timeout: Duration,
    ) -> Result<BoundPeers<'_>, TeamError> {
        agree_bound_on(boot, self.tag(), self.ready_own(), timeout)?;
        Ok(BoundPeers { peers: self })
    }
}

/// Unicast peers whose owners all bound their memory (R13.3): every
/// endpoint, ready to copy through. Borrows the peers.
#[derive(Debug, Clone, Copy)]
pub struct BoundPeers<'p> {
    peers: &'p Peers,
}

impl<'p> BoundPeers<'p> {
    /// This rank's own endpoint.
    pub fn own(&self) -> &'p Endpoint<Ready, Unicast<Exportable>> {
        self.peers.ready_own()
    }

    /// Rank `rank`'s endpoint as imported here, to get from (or put into);
    /// `None` for this rank's own index (use [`BoundPeers::own`]) or past
    /// the last rank.
    pub fn peer(&self, rank: usize) -> Option<&'p Endpoint<Ready, ImportedUnicast>> {
        self.peers.ready_peer(rank)
    }

    /// The peers.
    pub fn peers(&self) -> &'p Peers {
        self.peers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_report_from_a_peer_is_read_checked_never_trusted() {
        let mut ok = 2u32.to_le_bytes().to_vec();
        for (d, n) in [(0i32, 1u32), (3, 0)] {
            ok.extend_from_slice(&d.to_le_bytes());
            ok.extend_from_slice(&n.to_le_bytes());
        }
        assert_eq!(decode(&ok).ok(), Some(vec![(0, 1), (3, 0)]));
        for cut in 0..ok.len() {
            assert!(decode(&ok[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = ok.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        assert!(decode(&u32::MAX.to_le_bytes()).is_err());
    }
}

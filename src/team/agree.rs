//! The agreement steps: every rank sends its outcome of a step, every rank
//! gets every outcome, and all of them decide the same way — go on, or undo
//! and report the first failing rank. This is what keeps one rank's failure
//! from hanging the others (the PyTorch AddDevice hang) and what keeps any
//! rank from binding before every rank enrolled (C3 on the classic API).
//! Every message carries the bring-up's tag, the step and the sender
//! (`wire::Frame`), checked on arrival.
//!
//! Also the close agreement every team's teardown runs ([`close`], R13.7):
//! each rank first completes its own copies through the team's endpoints,
//! then all agree, and only then does any rank unbind.

use crate::bootstrap::{Bootstrap, BootstrapError, Deadline};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::Kind;
use crate::state::State;

use super::error::{Cause, Step, TeamError};
use super::wire::{Status, decode_status, encode_status};

/// Sends this rank's outcome of `step` to every rank and collects theirs. Returns
/// every rank's payload when all succeeded; otherwise this rank's own
/// failure, or else the failure of the lowest failing rank.
pub(crate) fn agree(
    boot: &dyn Bootstrap,
    tag: u64,
    step: Step,
    mine: Result<Vec<u8>, (Step, Cause)>,
    deadline: Deadline,
) -> Result<Vec<Vec<u8>>, TeamError> {
    let me = boot.rank();
    let mut all = agree_all(boot, tag, step, mine, deadline)?;
    // This rank's own failure is what it reports, in full.
    if let Some(Err(_)) = all.get(me) {
        return Err(all.swap_remove(me).err().unwrap_or_else(|| {
            TeamError::new(
                me,
                step,
                Cause::BadMessage {
                    reason: "no outcome",
                },
            )
        }));
    }
    all.into_iter().collect()
}

/// Every rank's outcome of `step`, in rank order (this rank's own as it
/// was, not parsed back); `Err` only when the exchange itself failed.
pub(crate) fn agree_all(
    boot: &dyn Bootstrap,
    tag: u64,
    step: Step,
    mine: Result<Vec<u8>, (Step, Cause)>,
    deadline: Deadline,
) -> Result<Vec<Result<Vec<u8>, TeamError>>, TeamError> {
    let me = boot.rank();
    let bytes = encode_status(tag, step, me, &mine);
    let all = boot
        .allgather(&bytes, deadline.remaining())
        .map_err(|e| TeamError::new(bootstrap_rank(&e, me), step, Cause::Bootstrap(e)))?;
    if all.len() != boot.size() {
        return Err(TeamError::new(
            me,
            step,
            Cause::BadMessage {
                reason: "the bootstrap returned another number of ranks than its size",
            },
        ));
    }
    let mut mine = Some(mine);
    let mut outcomes = Vec::with_capacity(all.len());
    for (rank, theirs) in all.into_iter().enumerate() {
        if rank == me {
            outcomes.push(match mine.take() {
                Some(Ok(p)) => Ok(p),
                Some(Err((at, cause))) => Err(TeamError::new(me, at, cause)),
                None => Ok(Vec::new()),
            });
            continue;
        }
        outcomes.push(match decode_status(tag, step, rank, &theirs) {
            Ok(Status::Ok(p)) => Ok(p),
            Ok(Status::Failed(at, p)) => Err(TeamError::new(rank, at, Cause::Peer(p))),
            Err(cause) => Err(TeamError::new(rank, step, cause)),
        });
    }
    Ok(outcomes)
}

/// Like [`agree`], for a step only `root` does: the root's outcome goes to
/// every rank.
pub(crate) fn announce(
    boot: &dyn Bootstrap,
    tag: u64,
    root: usize,
    step: Step,
    mine: Option<Result<Vec<u8>, (Step, Cause)>>,
    deadline: Deadline,
) -> Result<Vec<u8>, TeamError> {
    let me = boot.rank();
    let sent = match (&mine, me == root) {
        (Some(m), true) => encode_status(tag, step, root, m),
        _ => Vec::new(),
    };
    let got = boot
        .broadcast(root, &sent, deadline.remaining())
        .map_err(|e| TeamError::new(bootstrap_rank(&e, root), step, Cause::Bootstrap(e)))?;
    if me == root {
        return match mine {
            Some(Ok(p)) => Ok(p),
            Some(Err((at, cause))) => Err(TeamError::new(me, at, cause)),
            None => Err(TeamError::new(
                me,
                step,
                Cause::BadMessage {
                    reason: "root sent nothing",
                },
            )),
        };
    }
    match decode_status(tag, step, root, &got) {
        Ok(Status::Ok(p)) => Ok(p),
        Ok(Status::Failed(at, p)) => Err(TeamError::new(root, at, Cause::Peer(p))),
        Err(cause) => Err(TeamError::new(root, step, cause)),
    }
}

/// This rank's copies in flight through `ep` (into a peer's memory, or out
/// of it) complete: the first half of a close (R13.7, F4).
pub(crate) fn settle<S: State, K: Kind>(ep: &Endpoint<S, K>) -> Result<(), Error> {
    crate::stream::settle(ep.range(), ep.id())
}

/// The close agreement (R13.7): `settled` is this rank's outcome of
/// completing its own copies through the team's endpoints ([`settle`]);
/// every rank sends it and gets every rank's. `Ok` on every rank only when
/// every rank completed its copies: no rank copies into the team any more,
/// and each may unbind. Otherwise the same [`TeamError`] at [`Step::Close`]
/// on every rank (a rank that never joins: the bootstrap's timeout, within
/// `deadline`), and no rank may unbind.
pub(crate) fn close(
    boot: &dyn Bootstrap,
    tag: u64,
    settled: Result<(), Error>,
    deadline: Deadline,
) -> Result<(), TeamError> {
    let mine = settled
        .map(|()| Vec::new())
        .map_err(|e| (Step::Close, Cause::Local(e)));
    agree(boot, tag, Step::Close, mine, deadline).map(drop)
}

/// The rank a bootstrap failure blames, or `me` when it blames none.
fn bootstrap_rank(e: &BootstrapError, me: usize) -> usize {
    match e {
        BootstrapError::Timeout { waiting_for, .. } => waiting_for.first().copied().unwrap_or(me),
        BootstrapError::PeerClosed { peer, .. }
        | BootstrapError::Broken { peer, .. }
        | BootstrapError::Malformed { peer, .. }
        | BootstrapError::Oversized { peer, .. }
        | BootstrapError::ContributionTooLarge { peer, .. }
        | BootstrapError::Mismatch { peer, .. } => *peer,
        BootstrapError::Aborted { culprit, .. } => *culprit,
        _ => me,
    }
}

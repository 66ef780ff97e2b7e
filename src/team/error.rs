//! [`TeamError`]: why a bring-up failed, on which rank and at which step.
//!
//! Every rank of a failed bring-up returns a `TeamError` that names the rank
//! where the failure happened first and the step it happened in, within the
//! bring-up's timeout: a failure on one rank is reported to the others at the
//! next agreement step, and a rank that died or went silent is reported by the
//! bootstrap.

use std::fmt;

use crate::bootstrap::BootstrapError;
use crate::driver::{Call, Code};
use crate::error::Error;

/// A step of a team bring-up, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Step {
    /// Every rank says what it brings (devices, size, options); all check
    /// that they agree.
    Hello,
    /// The root creates the endpoint (multicast), or each rank creates its
    /// own (unicast peers).
    Create,
    /// The fabric handle is exported and sent to the other ranks.
    Export,
    /// A rank imports the endpoint(s) of the others; at `agree_bound` on
    /// the portable path, the memory they bound.
    Import,
    /// What the handle says is checked against what the driver reports.
    Check,
    /// Each rank enrolls its own devices in the multicast team (R4).
    Enroll,
    /// Every rank waits until its endpoints are constructed (R3).
    Wait,
    /// After the bring-up, every rank reports the memory it bound and all
    /// check that every rank bound before anyone copies (R13.3;
    /// `agree_bound`).
    Bind,
    /// A symmetric heap grows: every rank binds the next chunk at the same
    /// offset and all check that they did (R13.5).
    Grow,
    /// A symmetric heap shrinks: every rank agrees it stopped using the top
    /// chunk before any rank unbinds it (R13.7).
    Shrink,
    /// The reachability probe a bring-up runs before it creates anything
    /// ([`probe`](super::probe)): every rank imports every other rank's
    /// trial endpoint.
    Probe,
    /// A team's teardown (`close`): every rank synchronized its copies
    /// through the team's endpoints and all agree that they stopped before
    /// any rank unbinds (R13.7).
    Close,
}

impl Step {
    /// In wire-tag order: a new step goes last.
    pub(crate) const ALL: [Step; 12] = [
        Step::Hello,
        Step::Create,
        Step::Export,
        Step::Import,
        Step::Check,
        Step::Enroll,
        Step::Wait,
        Step::Bind,
        Step::Grow,
        Step::Shrink,
        Step::Probe,
        Step::Close,
    ];

    pub(crate) fn tag(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Step> {
        Step::ALL.get(usize::from(tag)).copied()
    }

    /// The step in words.
    pub fn name(self) -> &'static str {
        match self {
            Step::Hello => "hello",
            Step::Create => "create",
            Step::Export => "export",
            Step::Import => "import",
            Step::Check => "check",
            Step::Enroll => "enroll",
            Step::Wait => "wait",
            Step::Bind => "bind",
            Step::Grow => "grow",
            Step::Shrink => "shrink",
            Step::Probe => "probe",
            Step::Close => "close",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What another rank reported when its own step failed. Built from peer
/// bytes: the call and code are what the peer said, the message is for
/// people (at most [`PeerFailure::MAX_MESSAGE`] bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerFailure {
    /// The driver entry point that failed there, if a driver call failed.
    pub call: Option<Call>,
    /// Its result code, if a driver call failed.
    pub code: Option<Code>,
    /// The peer's error, as it displayed it.
    pub message: String,
}

impl PeerFailure {
    /// The longest message kept, in bytes.
    pub const MAX_MESSAGE: usize = 512;
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Two ranks, or a handle and the driver, disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// A rank asked for another size per device than the root.
    Bytes {
        /// Bytes the root asked for.
        root: u64,
        /// Bytes this rank asked for.
        this: u64,
    },
    /// A rank asked for counted operations and another did not.
    CountedOps,
    /// The team size declared by the caller is not what the ranks bring.
    TeamSize {
        /// The size the caller declared.
        declared: u32,
        /// Devices the ranks that joined bring, in all.
        arriving: u64,
        /// Devices each rank brings, by rank.
        brought: Vec<u32>,
    },
    /// The handle's metadata disagrees with what the ranks agreed on or what
    /// the driver reports after import.
    Handle {
        /// Which field.
        field: &'static str,
        /// What the handle says.
        handle: u64,
        /// What the agreement or the driver says.
        expected: u64,
    },
    /// A rank's device is in another multicast clique than the root's first
    /// device (R4.5): the driver would refuse it at enrollment or query.
    Clique {
        /// The device.
        device: i32,
        /// Its clique.
        clique: u32,
        /// The root's clique.
        expected: u32,
    },
    /// The root shares a classic multicast object and this rank's backend
    /// makes logical endpoints, or the other way round.
    Backend,
    /// Two ranks of one node bring the same physical device (same node,
    /// same PCI location, whatever its ordinal in each process): a device
    /// joins a multicast team once (R4.2, R12.5).
    SameDevice {
        /// The device, as this rank numbers it (the later rank's ordinal).
        device: i32,
        /// The other rank that brings it.
        other_rank: usize,
    },
    /// A rank's report at enrollment (the first that differs) disagrees
    /// with what this rank saw:
    /// the ranks did not all see the same hellos (a peer's hello claims
    /// devices it does not enroll, or the bootstrap delivered different
    /// bytes to different ranks), so the team is not known to be complete.
    Report {
        /// Which field: "team size", "join digest" or "devices enrolled".
        field: &'static str,
        /// What that rank reported.
        reported: u64,
        /// What this rank's view says.
        expected: u64,
    },
    /// A rank reported no memory bound on one of its team devices (or on
    /// its own unicast endpoint) at the every-rank-bound agreement (R13.3).
    NotBound {
        /// The device, as that rank numbers it; `None` when the rank
        /// reported no device at all.
        device: Option<i32>,
    },
    /// A rank's symmetric heap is not where this rank's is: another offset
    /// or chunk size at a grow, another top at a shrink (R13.5).
    Heap {
        /// Which field: "offset", "chunk size" or "top".
        field: &'static str,
        /// What that rank reported.
        reported: u64,
        /// What this rank has.
        expected: u64,
    },
    /// A rank's table of which id names which peer (its digest) is not
    /// this rank's (R13.4: CUDA does not detect it; a kernel addressing
    /// peer `p` by id would reach another rank's memory).
    IdTable {
        /// The digest that rank reported.
        reported: u64,
        /// This rank's.
        expected: u64,
    },
    /// A message of another bring-up arrived: bring-ups that share one
    /// bootstrap each carry their own tag ([`TeamSpec::tag`](super::TeamSpec::tag),
    /// [`PeerSpec::tag`](super::PeerSpec::tag)), and every rank must give one
    /// bring-up the same tag.
    Tag {
        /// The tag of the message.
        theirs: u64,
        /// This bring-up's.
        ours: u64,
    },
    /// A rank speaks another version of the bring-up protocol.
    Version {
        /// Its version.
        theirs: u8,
        /// Ours.
        ours: u8,
    },
}

// Printed after "team call failed on rank R" (`TeamError`) on every rank: "that
// rank" is R, whoever prints it.
impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Bytes { root, this } => write!(
                f,
                "that rank asks for {this} bytes per device but the root asks for {root}; every rank must pass the same size"
            ),
            Mismatch::CountedOps => f.write_str(
                "ranks disagree on counted operations (COUNTED_OPS, R2.4); pass the same options on every rank",
            ),
            Mismatch::TeamSize {
                declared,
                arriving,
                brought,
            } => {
                write!(
                    f,
                    "the team was declared for {declared} devices but the ranks that joined bring {arriving} ("
                )?;
                // Name the ranks that bring devices; a long job lists the first few.
                const SHOWN: usize = 8;
                let mut bringing = brought.iter().enumerate().filter(|(_, n)| **n > 0);
                for (i, (rank, n)) in bringing.by_ref().take(SHOWN).enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}rank {rank}: {n}")?;
                }
                let more = bringing.count();
                if more > 0 {
                    write!(f, ", and {more} more ranks")?;
                }
                let declared = u64::from(*declared);
                if *arriving > declared {
                    write!(
                        f,
                        "), {} too many; bring {declared} in all (fewer devices per rank, or fewer ranks) or declare .team_size({arriving})",
                        arriving - declared
                    )
                } else {
                    write!(
                        f,
                        "), {} missing; start one rank per missing device or declare .team_size({arriving})",
                        declared - arriving
                    )
                }
            }
            Mismatch::Handle {
                field,
                handle,
                expected,
            } => write!(
                f,
                "the handle says {field} = {handle} but the team agreed on (or the driver reports) {expected}: refused before any use (R9.4)"
            ),
            Mismatch::Clique {
                device,
                clique,
                expected,
            } => write!(
                f,
                "device {device} is in multicast clique {clique}, the team's in clique {expected} (R4.5, cuDeviceGetCliqueInfo): build the team from devices of one clique"
            ),
            Mismatch::Backend => f.write_str(
                "the root and that rank use different backends (the classic multicast fallback on one, logical endpoints on the other): pick the same backend on every rank",
            ),
            Mismatch::SameDevice { device, other_rank } => write!(
                f,
                "device {device} is the physical device rank {other_rank} brings too (same node and PCI location): a device joins a team once (R4.2); give each rank of a node its own devices"
            ),
            Mismatch::Report {
                field,
                reported,
                expected,
            } => write!(
                f,
                "a rank reported {field} = {reported} at enrollment where the hellos as this rank saw them say {expected}: the ranks did not see the same hellos (a hello that claims devices its rank does not enroll, or a bootstrap that delivered different bytes), so the team is not known to be complete and nobody binds"
            ),
            Mismatch::NotBound { device: Some(d) } => write!(
                f,
                "that rank bound no memory on its device {d} before the every-rank-bound agreement: nobody copies until every rank bound (R13.3); bind on every device the rank brings, then call `agree_bound` on every rank"
            ),
            Mismatch::NotBound { device: None } => f.write_str(
                "that rank reported no device at the every-rank-bound agreement: nobody copies until every rank bound (R13.3)",
            ),
            Mismatch::Heap {
                field,
                reported,
                expected,
            } => write!(
                f,
                "a rank's symmetric heap has {field} = {reported} where this rank's has {expected}: every rank grows and shrinks by the same chunks in the same order (R13.5); nothing was bound or unbound"
            ),
            Mismatch::IdTable { reported, expected } => write!(
                f,
                "a rank's peer-to-id table (digest {reported:#018x}) is not this rank's ({expected:#018x}): kernels addressing a peer by id would reach another rank (R13.4); every rank must import peer p at index p of one range"
            ),
            Mismatch::Tag { theirs, ours } => write!(
                f,
                "a message of the bring-up tagged {theirs} reached the bring-up tagged {ours}: give one bring-up the same tag on every rank, and bring-ups that share a bootstrap each their own (`team::Tagged`)"
            ),
            Mismatch::Version { theirs, ours } => write!(
                f,
                "a rank speaks bring-up protocol version {theirs}, this one {ours}: build every rank with the same cuda-endpoints"
            ),
        }
    }
}

/// Why a step failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Cause {
    /// This rank's own call failed.
    Local(Error),
    /// Another rank's call failed; this is what it reported.
    Peer(PeerFailure),
    /// The bootstrap failed: a rank died, went silent past the timeout, or
    /// sent bytes of another job.
    Bootstrap(BootstrapError),
    /// Ranks disagree, or a handle disagrees with the driver.
    Mismatch(Mismatch),
    /// The reachability probe, a bring-up's first step after the hello,
    /// found a rank that cannot reach another: `importer` could not import
    /// `exporter`'s trial endpoint, or (the same rank twice) that rank
    /// could not export one. Every rank gets the same one (the first in
    /// rank order), and the error's rank is the importer.
    Unreachable {
        /// The rank whose import (or export) failed.
        importer: usize,
        /// The rank whose trial endpoint it could not import.
        exporter: usize,
        /// The driver's answer.
        code: Code,
    },
    /// A peer sent bytes that are not a bring-up message.
    BadMessage {
        /// What was wrong with them.
        reason: &'static str,
    },
    /// The error's rank refused to send its message of this step: it is
    /// past a limit of the bring-up's messages (`guide::sharing`, "How
    /// large a message may be"). The sender refuses it before sending and
    /// sends a short notice instead, so every rank gets this same error.
    TooLarge {
        /// What is counted: `"bytes"` (the whole message) or `"bindings
        /// on one device"`.
        what: &'static str,
        /// How many there were.
        len: u64,
        /// The most allowed.
        limit: u64,
    },
    /// The error's rank sent a memory share (on the portable path) that
    /// rank `seen_by` found to be memory it already knows as rank
    /// `owner`'s: its own memory when `owner == seen_by`, else memory it
    /// took as rank `owner`'s window. A window over it would make this
    /// rank's copies "to" the sender land in that memory, so it is refused
    /// before import on every rank (`guide::security`, "Memory shares on
    /// the portable path").
    Aliased {
        /// The rank that recognised the memory.
        seen_by: usize,
        /// Whose memory it is, as `seen_by` knows it.
        owner: usize,
    },
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Local(e) => write!(f, "{e}"),
            Cause::Peer(p) => write!(f, "{p}"),
            Cause::Bootstrap(e) => write!(f, "bootstrap: {e}"),
            Cause::Mismatch(m) => write!(f, "{m}"),
            Cause::Unreachable {
                importer,
                exporter,
                code,
            } if importer == exporter => write!(
                f,
                "the reachability probe: rank {importer} cannot export a trial logical endpoint ({code}); `team::probe` says which bring-up works"
            ),
            Cause::Unreachable {
                importer,
                exporter,
                code,
            } => write!(
                f,
                "the reachability probe: rank {importer} cannot import rank {exporter}'s trial endpoint ({code}): the ranks do not share a fabric domain (an IMEX channel, R9.1); `team::probe` says which bring-up works"
            ),
            Cause::BadMessage { reason } => {
                write!(f, "a peer sent a bad bring-up message: {reason}")
            }
            Cause::TooLarge { what, len, limit } => write!(
                f,
                "this rank's message has {len} {what}, past the limit of {limit} (see `guide::sharing`, \"How large a message may be\"); it refused to send it: bind fewer, larger chunks, or bind the rest after the agreement and share it with `OwnedPeers::grow`"
            ),
            Cause::Aliased { seen_by, owner } if seen_by == owner => write!(
                f,
                "this rank's memory share is memory of rank {seen_by}'s own process: a window over it would make rank {seen_by}'s copies to this rank land in its own memory; refused before import (`guide::security`)"
            ),
            Cause::Aliased { seen_by, owner } => write!(
                f,
                "this rank's memory share is memory rank {seen_by} already took as rank {owner}'s window: a copy to this rank would land in rank {owner}'s memory; refused before import (`guide::security`)"
            ),
        }
    }
}

/// A failed bring-up: the rank where it failed first, the step, and why.
/// Everything the bring-up made on this rank is undone before it is returned.
#[derive(Debug)]
pub struct TeamError {
    /// The rank where the failure happened (this rank's own number for a
    /// local failure).
    pub rank: usize,
    /// The step.
    pub step: Step,
    /// Why.
    pub cause: Cause,
}

impl TeamError {
    pub(crate) fn new(rank: usize, step: Step, cause: Cause) -> TeamError {
        TeamError { rank, step, cause }
    }

    /// The driver code behind the failure, wherever it happened.
    pub fn code(&self) -> Option<Code> {
        match &self.cause {
            Cause::Local(e) => e.code(),
            Cause::Peer(p) => p.code,
            Cause::Unreachable { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the bring-up timed out (a silent peer, or construction that
    /// did not finish in time).
    pub fn is_timeout(&self) -> bool {
        match &self.cause {
            Cause::Local(Error::Timeout { .. }) => true,
            Cause::Bootstrap(e) => matches!(e, BootstrapError::Timeout { .. }),
            _ => false,
        }
    }
}

impl fmt::Display for TeamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "team call failed on rank {} at step `{}`: {}",
            self.rank, self.step, self.cause
        )
    }
}

impl std::error::Error for TeamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Local(e) => Some(e),
            Cause::Bootstrap(e) => Some(e),
            _ => None,
        }
    }
}

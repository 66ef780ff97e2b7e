//! What can go wrong while ranks exchange bytes: [`BootstrapError`], with the
//! rank that saw it, the step ([`Exchange`]: operation and sequence number) and,
//! where one is to blame, the peer.
//!
//! Every variant has one meaning. Peer bytes never panic: they end in
//! [`BootstrapError::Malformed`], [`BootstrapError::Oversized`] or
//! [`BootstrapError::Mismatch`].

use std::fmt;
use std::io;
use std::time::Duration;

use super::node::NodeId;

/// A collective operation of a [`Bootstrap`](super::Bootstrap), as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// The rendezvous that makes the communicator: a rank joins the job
    /// (TCP handshake, MPI job-id agreement).
    Rendezvous,
    /// [`Bootstrap::allgather`](super::Bootstrap::allgather).
    Allgather,
    /// [`Bootstrap::broadcast`](super::Bootstrap::broadcast).
    Broadcast,
    /// [`Bootstrap::barrier`](super::Bootstrap::barrier).
    Barrier,
    /// Passing file descriptors over a Unix socket ([`FdExchange`](super::FdExchange)).
    FdPassing,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Rendezvous => "rendezvous",
            Op::Allgather => "allgather",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
            Op::FdPassing => "fd passing",
        })
    }
}

/// One step of a communicator: the operation and its sequence number (the
/// number of collectives this rank called on the communicator before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Exchange {
    /// The operation.
    pub op: Op,
    /// Its sequence number on this communicator (0 for [`Op::Rendezvous`]).
    pub seq: u64,
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{}", self.op, self.seq)
    }
}

/// What was wrong with a peer's bytes ([`BootstrapError::Malformed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Malformed {
    /// The frame does not start with this library's magic bytes.
    Magic,
    /// Fewer bytes than the structure announces.
    Truncated,
    /// More bytes than the structure announces.
    Trailing,
    /// A message type this version does not know.
    UnknownType(u8),
    /// A file-descriptor message arrived without a descriptor.
    NoDescriptor,
    /// A length or count that overflows this machine's arithmetic.
    Overflow,
    /// The kernel truncated the control message (`MSG_CTRUNC`): the peer
    /// attached more descriptors or control data than the one descriptor
    /// expected, and the excess was dropped.
    ControlTruncated,
    /// Bytes that do not decode as the message they claim to be (an
    /// invalid tag, string or field).
    Encoding,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Magic => {
                f.write_str("no cuda-endpoints magic bytes (not a bootstrap frame)")
            }
            Malformed::Truncated => f.write_str("truncated structure"),
            Malformed::Trailing => f.write_str("bytes past the end of the structure"),
            Malformed::UnknownType(t) => write!(f, "unknown message type {t}"),
            Malformed::NoDescriptor => f.write_str("no file descriptor attached"),
            Malformed::Overflow => f.write_str("a length that overflows"),
            Malformed::ControlTruncated => f.write_str(
                "a truncated control message (MSG_CTRUNC): more descriptors attached than the one expected",
            ),
            Malformed::Encoding => f.write_str("bytes that do not decode as the message"),
        }
    }
}

/// Which identity field of a message differs from this rank's
/// ([`BootstrapError::Mismatch`]): the bytes belong to another job,
/// communicator or step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameMismatch {
    /// Wire-format version.
    Version {
        /// This rank's.
        ours: u16,
        /// The message's.
        theirs: u16,
    },
    /// Job (communicator) id: bytes from another communicator.
    Job {
        /// This rank's.
        ours: u64,
        /// The message's.
        theirs: u64,
    },
    /// Communicator size.
    Size {
        /// This rank's.
        ours: u32,
        /// The message's.
        theirs: u32,
    },
    /// Sequence number: the peer is at another step (a step ahead, or a
    /// stale message where it cannot be skipped).
    Seq {
        /// This rank's.
        ours: u64,
        /// The message's.
        theirs: u64,
    },
    /// The peer runs another operation at this step (e.g. a barrier against
    /// an allgather, or a broadcast from another root).
    Operation {
        /// This rank's.
        ours: Op,
        /// The message's type byte.
        theirs: u8,
    },
    /// The message says it comes from another rank than the one it came from.
    Sender {
        /// The rank expected.
        expected: u32,
        /// The rank the message names.
        theirs: u32,
    },
    /// A block passed along the TCP ring names another origin rank than
    /// the one due at this round.
    Origin {
        /// The origin rank due.
        expected: u32,
        /// The origin rank the block names.
        theirs: u32,
    },
    /// Two processes joined with the same rank.
    DuplicateRank {
        /// The rank claimed twice.
        rank: u32,
    },
    /// An allgather result with another number of entries than ranks.
    Count {
        /// The communicator size.
        expected: usize,
        /// Entries received.
        got: usize,
    },
}

impl fmt::Display for FrameMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameMismatch::Version { ours, theirs } => {
                write!(f, "wire version {theirs}, this rank speaks {ours}")
            }
            FrameMismatch::Job { ours, theirs } => {
                write!(
                    f,
                    "job {theirs:016x}, this communicator is job {ours:016x} (bytes from another communicator)"
                )
            }
            FrameMismatch::Size { ours, theirs } => {
                write!(f, "communicator size {theirs}, this rank's is {ours}")
            }
            FrameMismatch::Seq { ours, theirs } => {
                write!(f, "step #{theirs}, this rank is at step #{ours}")
            }
            FrameMismatch::Operation { ours, theirs } => {
                write!(
                    f,
                    "message type {theirs} where this rank runs {ours} (ranks called different collectives)"
                )
            }
            FrameMismatch::Sender { expected, theirs } => {
                write!(f, "claims rank {theirs}, expected rank {expected}")
            }
            FrameMismatch::Origin { expected, theirs } => {
                write!(
                    f,
                    "a ring block of rank {theirs} where rank {expected}'s was due"
                )
            }
            FrameMismatch::DuplicateRank { rank } => {
                write!(f, "a second process joined as rank {rank}")
            }
            FrameMismatch::Count { expected, got } => {
                write!(f, "{got} entries for {expected} ranks")
            }
        }
    }
}

/// Why rank 0 refused a joining rank ([`BootstrapError::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The job secret of the unique id did not match (another job's id).
    WrongSecret,
    /// The rank is not in `1..size`.
    RankOutOfRange,
    /// Another process already joined with this rank.
    DuplicateRank,
    /// The joining rank declared another communicator size.
    SizeMismatch,
    /// A refusal code this version does not know.
    Unknown(u8),
}

impl Refusal {
    pub(crate) fn code(self) -> u8 {
        match self {
            Refusal::WrongSecret => 1,
            Refusal::RankOutOfRange => 2,
            Refusal::DuplicateRank => 3,
            Refusal::SizeMismatch => 4,
            Refusal::Unknown(c) => c,
        }
    }
    pub(crate) fn from_code(c: u8) -> Self {
        match c {
            1 => Refusal::WrongSecret,
            2 => Refusal::RankOutOfRange,
            3 => Refusal::DuplicateRank,
            4 => Refusal::SizeMismatch,
            c => Refusal::Unknown(c),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::WrongSecret => {
                f.write_str("wrong job secret (the unique id belongs to another job)")
            }
            Refusal::RankOutOfRange => f.write_str("rank out of range for the job's size"),
            Refusal::DuplicateRank => f.write_str("another process already joined with this rank"),
            Refusal::SizeMismatch => f.write_str("this rank declared another job size than rank 0"),
            Refusal::Unknown(c) => write!(f, "refusal code {c}"),
        }
    }
}

/// Why rank 0 aborted a collective ([`BootstrapError::Aborted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortReason {
    /// The culprit closed its connection (exited or was killed).
    PeerClosed,
    /// The culprit's connection was already broken by an earlier error.
    Broken,
    /// The culprit sent malformed, oversized or mismatched bytes.
    BadMessage,
    /// An I/O error on the culprit's connection.
    Io,
    /// The culprit did not answer within rank 0's timeout.
    Timeout,
    /// Rank 0 refused the culprit's join ([`Refusal`]), so the job cannot
    /// form: the ranks already admitted learn why at once.
    JoinRefused {
        /// Why rank 0 refused it.
        refusal: Refusal,
        /// The job size the culprit declared.
        declared: u32,
        /// The job size rank 0 was started with.
        size: u32,
    },
    /// A reason code this version does not know.
    Unknown(u8),
}

impl AbortReason {
    pub(crate) fn code(self) -> u8 {
        match self {
            AbortReason::PeerClosed => 1,
            AbortReason::Broken => 2,
            AbortReason::BadMessage => 3,
            AbortReason::Io => 4,
            AbortReason::Timeout => 5,
            AbortReason::JoinRefused { .. } => 6,
            AbortReason::Unknown(c) => c,
        }
    }

    /// An abort frame's payload ([`AbortWire`], then [`RefusalWire`] for
    /// a refused join).
    pub(crate) fn encode(self, culprit: usize) -> Vec<u8> {
        let head = AbortWire {
            code: self.code(),
            culprit: u32::try_from(culprit).unwrap_or(u32::MAX),
        };
        let mut payload = postcard::to_allocvec(&head).unwrap_or_default();
        if let AbortReason::JoinRefused {
            refusal,
            declared,
            size,
        } = self
        {
            let tail = RefusalWire {
                refusal: refusal.code(),
                declared,
                size,
            };
            payload.extend(postcard::to_allocvec(&tail).unwrap_or_default());
        }
        payload
    }

    /// Reads [`AbortReason::encode`]'s payload; short or unknown bytes give
    /// `Unknown`/zeros, and a culprit of `usize::MAX`, never a panic.
    pub(crate) fn decode(payload: &[u8]) -> (AbortReason, usize) {
        let (code, culprit, rest) = match postcard::take_from_bytes::<AbortWire>(payload) {
            Ok((head, rest)) => (
                head.code,
                usize::try_from(head.culprit).unwrap_or(usize::MAX),
                rest,
            ),
            Err(_) => (payload.first().copied().unwrap_or(0), usize::MAX, &[][..]),
        };
        let reason = match AbortReason::from_code(code) {
            AbortReason::JoinRefused { .. } => {
                let tail = postcard::take_from_bytes::<RefusalWire>(rest)
                    .map(|(t, _)| t)
                    .unwrap_or(RefusalWire {
                        refusal: 0,
                        declared: 0,
                        size: 0,
                    });
                AbortReason::JoinRefused {
                    refusal: Refusal::from_code(tail.refusal),
                    declared: tail.declared,
                    size: tail.size,
                }
            }
            r => r,
        };
        (reason, culprit)
    }
    pub(crate) fn from_code(c: u8) -> Self {
        match c {
            1 => AbortReason::PeerClosed,
            2 => AbortReason::Broken,
            3 => AbortReason::BadMessage,
            4 => AbortReason::Io,
            5 => AbortReason::Timeout,
            6 => AbortReason::JoinRefused {
                refusal: Refusal::Unknown(0),
                declared: 0,
                size: 0,
            },
            c => AbortReason::Unknown(c),
        }
    }
}

/// An abort payload's head: the reason code and the culprit (5 bytes).
#[derive(serde::Serialize, serde::Deserialize)]
struct AbortWire {
    code: u8,
    #[serde(with = "postcard::fixint::le")]
    culprit: u32,
}

/// What follows [`AbortWire`] for a refused join (9 bytes).
#[derive(serde::Serialize, serde::Deserialize)]
struct RefusalWire {
    refusal: u8,
    #[serde(with = "postcard::fixint::le")]
    declared: u32,
    #[serde(with = "postcard::fixint::le")]
    size: u32,
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::PeerClosed => f.write_str("it closed its connection"),
            AbortReason::Broken => f.write_str("its connection was broken by an earlier error"),
            AbortReason::BadMessage => f.write_str("it sent a malformed or mismatched message"),
            AbortReason::Io => f.write_str("an I/O error on its connection"),
            AbortReason::Timeout => f.write_str("it did not answer within rank 0's timeout"),
            AbortReason::JoinRefused {
                refusal,
                declared,
                size,
            } => match refusal {
                Refusal::SizeMismatch => write!(
                    f,
                    "rank 0 refused its join: it declared a job of {declared} ranks, rank 0 one of {size}; start every rank with the same size"
                ),
                Refusal::RankOutOfRange => write!(
                    f,
                    "rank 0 refused its join: its rank is out of range for a job of {size} ranks; give each rank a number in 1..{size}"
                ),
                Refusal::DuplicateRank => f.write_str(
                    "rank 0 refused its join: another process had already joined with this rank number; give each process its own rank",
                ),
                other => write!(f, "rank 0 refused its join: {other}"),
            },
            AbortReason::Unknown(c) => write!(f, "reason code {c}"),
        }
    }
}

/// A caller's argument that cannot work ([`BootstrapError::InvalidArgument`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Argument {
    /// The communicator size is 0.
    ZeroSize,
    /// A rank (own or root) is not below the size.
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The communicator size.
        size: usize,
    },
    /// This call is for ranks other than 0 (rank 0 uses [`TcpRoot::accept`](super::TcpRoot::accept)).
    JoinAsRoot,
    /// A payload larger than the frame limit.
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A message of a channel of a shared bootstrap (`team::Tagged` of
    /// `cuda-endpoints`) larger than one round of it carries for one rank:
    /// the bootstrap's frame limit shared among the ranks.
    RoundTooLarge {
        /// Its length, in bytes.
        len: usize,
        /// The most bytes one message may have.
        max: usize,
    },
    /// Rank 0 bound an unspecified address (`0.0.0.0`/`::`): peers need an
    /// address they can reach.
    UnspecifiedAddress,
    /// The root of an fd broadcast passed no descriptor.
    NoDescriptor,
    /// MPI is already initialized: use `Mpi::from_communicator`.
    MpiAlreadyInitialized,
}

impl fmt::Display for Argument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Argument::ZeroSize => f.write_str("a communicator needs at least one rank"),
            Argument::RankOutOfRange { rank, size } => write!(f, "rank {rank} is out of range for {size} ranks (0..{size})"),
            Argument::JoinAsRoot => f.write_str("rank 0 does not join: it calls TcpRoot::accept on the listener that made the unique id"),
            Argument::TooLarge { len, max } => write!(f, "{len} bytes exceed the bootstrap's frame limit of {max} bytes"),
            Argument::RoundTooLarge { len, max } => write!(f, "a message of {len} bytes exceeds the {max} bytes one round of the shared bootstrap carries per rank (one frame shared among the ranks); refused before sending: split the collective into smaller ones (the limit cannot be raised)"),
            Argument::UnspecifiedAddress => f.write_str(
                "the unique id would carry an unspecified address; bind rank 0 to the interface address peers reach, or use Tcp::root_advertising",
            ),
            Argument::NoDescriptor => f.write_str("the root of an fd broadcast must pass Some(fd)"),
            Argument::MpiAlreadyInitialized => {
                f.write_str("MPI is already initialized in this process: build the bootstrap with Mpi::from_communicator")
            }
        }
    }
}

/// What is wrong with a unique-id string ([`BootstrapError::InvalidId`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdProblem {
    /// The environment variable is not set (or not UTF-8).
    Unset {
        /// Its name.
        var: &'static str,
    },
    /// A part of the string does not parse.
    Syntax {
        /// Which part: `prefix`, `address`, `job` or `secret`.
        part: &'static str,
    },
    /// The id file could not be read.
    File {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error kind.
        kind: io::ErrorKind,
    },
    /// The listening socket a launcher handed down
    /// ([`LISTEN_FD_ENV`](crate::LISTEN_FD_ENV)) cannot be used.
    Listener {
        /// Why.
        why: &'static str,
    },
    /// The id file is refused: another user could have planted or changed it.
    Untrusted {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        why: &'static str,
    },
}

impl fmt::Display for IdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdProblem::Unset { var } => write!(
                f,
                "environment variable {var} is not set; rank 0 exports it (UniqueId::to_string)"
            ),
            IdProblem::Syntax { part } => {
                write!(
                    f,
                    "its {part} does not parse (expected cebs1/<ip:port>/<16 hex job>/<32 hex secret>)"
                )
            }
            IdProblem::File { path, kind } => write!(f, "cannot read {}: {kind}", path.display()),
            IdProblem::Listener { why } => write!(
                f,
                "the listening socket the launcher handed down ({}) cannot be used: {why}",
                crate::LISTEN_FD_ENV
            ),
            IdProblem::Untrusted { path, why } => write!(
                f,
                "{} is not trusted: {why}; the id file must be this user's, in a directory only this user can write",
                path.display()
            ),
        }
    }
}

/// A bootstrap operation failed. Each variant names this rank (`rank`) and the
/// step where applicable, and the peer to blame where one is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A peer did not answer within the timeout.
    #[error("rank {rank}: {step} timed out after {after:?} waiting for rank(s) {waiting_for:?}")]
    Timeout {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The ranks that had not answered.
        waiting_for: Vec<usize>,
        /// The timeout.
        after: Duration,
    },
    /// A peer closed its connection (it exited or was killed).
    #[error("rank {rank}: {step}: rank {peer} closed its connection (exited or was killed)")]
    PeerClosed {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer.
        peer: usize,
    },
    /// The connection to a peer was closed by this rank after an earlier
    /// error on it (a partial write or a bad message): the communicator is
    /// unusable with that peer.
    #[error("rank {rank}: {step}: the connection to rank {peer} was closed after an earlier error")]
    Broken {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer.
        peer: usize,
    },
    /// A peer sent bytes that are not a well-formed message.
    #[error("rank {rank}: {step}: rank {peer} sent a malformed message: {what}")]
    Malformed {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer.
        peer: usize,
        /// What was wrong.
        what: Malformed,
    },
    /// A peer announced a message larger than the hard limit.
    #[error("rank {rank}: {step}: rank {peer} announced {len} bytes, more than the limit of {max}")]
    Oversized {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer.
        peer: usize,
        /// The announced length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A well-formed message from another job, communicator, step or operation.
    #[error("rank {rank}: {step}: message from rank {peer} does not belong here: {what}")]
    Mismatch {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer.
        peer: usize,
        /// Which identity field differs.
        what: FrameMismatch,
    },
    /// Rank 0 refused this rank's join.
    #[error("rank {rank}: rank 0 refused the join: {reason}")]
    Refused {
        /// This rank.
        rank: usize,
        /// Why.
        reason: Refusal,
    },
    /// The process at rank 0's address did not prove that it knows the
    /// job secret (the challenge-response of the join failed): it is not
    /// this job's rank 0, and nothing it sent was taken.
    #[error(
        "rank {rank}: the process at {addr} is not this job's rank 0: it did not prove it knows the job secret ({what})"
    )]
    Impostor {
        /// This rank.
        rank: usize,
        /// The address of the unique id.
        addr: std::net::SocketAddr,
        /// What it answered instead of a valid proof.
        what: &'static str,
    },
    /// The process at a ring peer's address did not prove that it knows
    /// the job secret: it is not this job's rank `peer`, and nothing it
    /// sent was taken.
    #[error(
        "rank {rank}: the process at {addr} is not this job's rank {peer}: it did not prove it knows the job secret ({what})"
    )]
    UnprovenPeer {
        /// This rank.
        rank: usize,
        /// The rank it should have been.
        peer: usize,
        /// Its address, as rank 0 handed it out.
        addr: std::net::SocketAddr,
        /// What it answered instead of a valid proof.
        what: &'static str,
    },
    /// A rank refused to send its contribution to this collective, before
    /// sending it, because it was larger than the collective can carry (its
    /// own error is [`BootstrapError::InvalidArgument`] with
    /// [`Argument::RoundTooLarge`]): the collective cannot complete, and no
    /// bytes of it were malformed.
    #[error(
        "rank {rank}: {step}: rank {peer}'s contribution of {len} bytes exceeds the {max} bytes per rank that one round of the shared bootstrap carries; rank {peer} refused to send it (split that collective into smaller ones)"
    )]
    ContributionTooLarge {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The rank whose contribution was too large.
        peer: usize,
        /// Its length, in bytes.
        len: u64,
        /// The most bytes one rank's contribution may have.
        max: u64,
    },
    /// A collective of a channel of a shared bootstrap (`team::Tagged` of
    /// `cuda-endpoints`) refused because the shared bootstrap broke in an
    /// earlier round, run for channel `tag`'s collective `seq` on this
    /// rank: a round cannot be abandoned half-way (the TCP ring of three
    /// ranks or more), so every channel fails from then on.
    #[error(
        "rank {rank}: {step}: the shared bootstrap is unusable: a round of it failed for channel {tag} (its collective #{seq} on this rank): {cause}; a round cannot be abandoned half-way, so every channel fails from then on: bring the channels up again over a new bootstrap, with timeouts every rank can meet"
    )]
    SharedBroken {
        /// This rank.
        rank: usize,
        /// The step refused.
        step: Exchange,
        /// The channel whose round failed.
        tag: u64,
        /// That channel's collective, in its own count.
        seq: u64,
        /// Why that round failed (that channel's own error).
        cause: String,
    },
    /// The collective was aborted because another rank failed: rank 0 told
    /// this rank, or (on the TCP ring) the previous rank passed it on.
    #[error("rank {rank}: {step} aborted because rank {culprit} failed: {reason}")]
    Aborted {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The rank that failed.
        culprit: usize,
        /// How it failed.
        reason: AbortReason,
    },
    /// An operating-system error.
    #[error("rank {rank}: {step}: I/O error{}: {source}", peer.map(|p| format!(" with rank {p}")).unwrap_or_default())]
    Io {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer, if the error is on its connection.
        peer: Option<usize>,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The caller passed an argument that cannot work.
    #[error("rank {rank}: {step}: {what}")]
    InvalidArgument {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// What is wrong.
        what: Argument,
    },
    /// A unique-id string or file that cannot be used.
    #[error("invalid bootstrap unique id: {what}")]
    InvalidId {
        /// What is wrong.
        what: IdProblem,
    },
    /// A user-supplied communicator callback failed ([`Callbacks`](super::Callbacks)).
    #[error("rank {rank}: {step}: the communicator callback failed: {source}")]
    Callback {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The callback's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The communicator cannot be used after an earlier timeout of a
    /// collective that could not be cancelled (MPI): abort the job.
    #[error(
        "rank {rank}: {step}: the communicator is unusable after an earlier timed-out MPI collective ({first}); abort the job"
    )]
    Poisoned {
        /// This rank.
        rank: usize,
        /// The step refused.
        step: Exchange,
        /// The step that timed out.
        first: Exchange,
    },
    /// File descriptors pass only within a node; this peer is on another one.
    #[error(
        "rank {rank}: {step}: rank {peer} is on node {theirs}, this rank on node {mine}; file descriptors pass only within a node (use fabric handles across nodes)"
    )]
    OtherNode {
        /// This rank.
        rank: usize,
        /// The step.
        step: Exchange,
        /// The peer: the root to a rank off the root's node, else the
        /// first rank off it.
        peer: usize,
        /// The first rank (in rank order) off the root's node: the same on
        /// every rank, so that every rank can name the same one.
        outside: usize,
        /// This rank's node.
        mine: Box<NodeId>,
        /// The peer's node.
        theirs: Box<NodeId>,
    },
}

impl BootstrapError {
    /// The reason code rank 0 sends to the other ranks when this error on a
    /// peer's connection aborts a collective.
    pub(crate) fn abort_reason(&self) -> AbortReason {
        match self {
            BootstrapError::PeerClosed { .. } => AbortReason::PeerClosed,
            BootstrapError::Broken { .. } => AbortReason::Broken,
            BootstrapError::Timeout { .. } => AbortReason::Timeout,
            BootstrapError::Io { .. } => AbortReason::Io,
            _ => AbortReason::BadMessage,
        }
    }
}

//! The wire format every backend shares, as `serde` types encoded with
//! `postcard`: a header ([`RawHeader`]: magic, version, message type, job
//! id, sequence number, sender, communicator size, payload length) in front
//! of each payload, a hard maximum payload size, the encoding of an
//! allgather result (a `postcard` sequence of byte strings), and the checks
//! that refuse bytes from another job, communicator or step.
//!
//! The header's integers are fixed-width (`postcard::fixint::le`), so every
//! header is [`HEADER_LEN`] bytes: a reader knows the payload's length, and
//! refuses an oversized one, before it waits for or allocates any payload
//! byte. Every length from a peer is checked before use; nothing here
//! allocates more than the bytes that actually arrived (`serde` caps what a
//! sequence reserves up front), and nothing panics on peer bytes.

use std::io::Read;

use postcard::fixint::le;
use serde::{Deserialize, Serialize};

use super::error::{FrameMismatch, Malformed, Op};

/// The hard maximum of one frame's payload (64 MiB): a peer announcing more
/// gets [`BootstrapError::Oversized`](super::BootstrapError::Oversized).
pub const MAX_PAYLOAD: usize = 64 << 20;

pub(crate) const MAGIC: [u8; 4] = *b"CEbs";
/// 2: the join is a mutual challenge-response (`Challenge`, `Proof`).
pub(crate) const VERSION: u16 = 2;
pub(crate) const HEADER_LEN: usize = 36;

/// Message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Hello = 1,
    Welcome = 2,
    Reject = 3,
    Allgather = 4,
    AllgatherResult = 5,
    Broadcast = 6,
    Barrier = 7,
    BarrierRelease = 8,
    Abort = 9,
    FdRequest = 10,
    Challenge = 11,
    Proof = 12,
    /// The ring's setup: a rank's ring listener address, to rank 0.
    RingAddr = 13,
    /// The ring's setup: the next rank's address, from rank 0.
    RingNext = 14,
    /// The ring's setup: a rank's links stand (empty) or its failure.
    RingReady = 15,
    /// The ring's setup: every rank's links stand.
    RingGo = 16,
    /// One rank's contribution passing along the ring.
    RingBlock = 17,
}

impl Kind {
    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Reject,
            4 => Kind::Allgather,
            5 => Kind::AllgatherResult,
            6 => Kind::Broadcast,
            7 => Kind::Barrier,
            8 => Kind::BarrierRelease,
            9 => Kind::Abort,
            10 => Kind::FdRequest,
            11 => Kind::Challenge,
            12 => Kind::Proof,
            13 => Kind::RingAddr,
            14 => Kind::RingNext,
            15 => Kind::RingReady,
            16 => Kind::RingGo,
            17 => Kind::RingBlock,
            _ => return None,
        })
    }
}

/// A header as it travels: 36 bytes, the integers little-endian.
#[derive(Serialize, Deserialize)]
struct RawHeader {
    magic: [u8; 4],
    #[serde(with = "le")]
    version: u16,
    kind: u8,
    reserved: u8,
    #[serde(with = "le")]
    job: u64,
    #[serde(with = "le")]
    seq: u64,
    #[serde(with = "le")]
    from: u32,
    #[serde(with = "le")]
    size: u32,
    #[serde(with = "le")]
    len: u32,
}

/// How many of a header's first bytes name its job: magic, version, kind,
/// reserved byte and job id.
pub(crate) const JOB_PREFIX: usize = 16;

/// The first [`JOB_PREFIX`] bytes of a hello of job `job`: what a
/// connection of that job sends first (`None` only if the header does not
/// encode).
pub(crate) fn hello_prefix(job: u64) -> Option<[u8; JOB_PREFIX]> {
    let h = Header {
        kind: Kind::Hello as u8,
        job,
        seq: 0,
        from: 0,
        size: 0,
        len: 0,
    }
    .encode()?;
    h.get(..JOB_PREFIX)?.try_into().ok()
}

/// The header of one frame or envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: u8,
    pub(crate) job: u64,
    pub(crate) seq: u64,
    pub(crate) from: u32,
    pub(crate) size: u32,
    pub(crate) len: u32,
}

/// A header error before the payload is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderError {
    Malformed(Malformed),
    Version(u16),
    Oversized(u64),
}

impl Header {
    /// The header of a frame of `kind` from `rank` of a job of `size`,
    /// its length still 0; a rank or size beyond `u32` is sent as
    /// `u32::MAX`, which every receiver rejects as out of range.
    pub(crate) fn new(kind: Kind, job: u64, seq: u64, rank: usize, size: usize) -> Header {
        Header {
            kind: kind as u8,
            job,
            seq,
            from: u32::try_from(rank).unwrap_or(u32::MAX),
            size: u32::try_from(size).unwrap_or(u32::MAX),
            len: 0,
        }
    }

    /// The header's [`HEADER_LEN`] bytes; `None` only if `postcard` and
    /// [`RawHeader`] disagree on its size.
    pub(crate) fn encode(&self) -> Option<[u8; HEADER_LEN]> {
        let raw = RawHeader {
            magic: MAGIC,
            version: VERSION,
            kind: self.kind,
            reserved: 0,
            job: self.job,
            seq: self.seq,
            from: self.from,
            size: self.size,
            len: self.len,
        };
        let mut b = [0u8; HEADER_LEN];
        let used = postcard::to_slice(&raw, &mut b).ok()?.len();
        (used == HEADER_LEN).then_some(b)
    }

    /// Parses a header; `bytes` must hold at least [`HEADER_LEN`] bytes.
    pub(crate) fn decode(bytes: &[u8], max: usize) -> Result<Header, HeaderError> {
        let b = bytes
            .get(..HEADER_LEN)
            .ok_or(HeaderError::Malformed(Malformed::Truncated))?;
        let raw: RawHeader =
            postcard::from_bytes(b).map_err(|e| HeaderError::Malformed(malformed(&e)))?;
        if raw.magic != MAGIC {
            return Err(HeaderError::Malformed(Malformed::Magic));
        }
        if raw.version != VERSION {
            return Err(HeaderError::Version(raw.version));
        }
        let h = Header {
            kind: raw.kind,
            job: raw.job,
            seq: raw.seq,
            from: raw.from,
            size: raw.size,
            len: raw.len,
        };
        if usize::try_from(h.len).map_or(true, |l| l > max) {
            return Err(HeaderError::Oversized(u64::from(h.len)));
        }
        Ok(h)
    }

    pub(crate) fn payload_len(&self) -> usize {
        // `decode` checked `len <= max`, which fits in usize.
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }
}

/// Encodes a header and payload as one buffer; `None` when the payload
/// exceeds [`MAX_PAYLOAD`].
pub(crate) fn frame(mut header: Header, payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    header.len = u32::try_from(payload.len()).ok()?;
    let mut out = Vec::with_capacity(HEADER_LEN.checked_add(payload.len())?);
    out.extend_from_slice(&header.encode()?);
    out.extend_from_slice(payload);
    Some(out)
}

/// What a receiver expects of a message's identity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    pub(crate) job: u64,
    pub(crate) size: u32,
    pub(crate) seq: u64,
    pub(crate) kind: Kind,
    pub(crate) op: Op,
    pub(crate) from: u32,
}

impl Expect {
    /// Checks a header against the expected identity (the sequence number
    /// last: callers that skip stale messages check `seq < expected` first).
    pub(crate) fn check(&self, h: &Header) -> Result<(), FrameMismatch> {
        if h.job != self.job {
            return Err(FrameMismatch::Job {
                ours: self.job,
                theirs: h.job,
            });
        }
        if h.size != self.size {
            return Err(FrameMismatch::Size {
                ours: self.size,
                theirs: h.size,
            });
        }
        if h.from != self.from {
            return Err(FrameMismatch::Sender {
                expected: self.from,
                theirs: h.from,
            });
        }
        if h.seq != self.seq {
            return Err(FrameMismatch::Seq {
                ours: self.seq,
                theirs: h.seq,
            });
        }
        if h.kind != self.kind as u8 {
            return Err(FrameMismatch::Operation {
                ours: self.op,
                theirs: h.kind,
            });
        }
        Ok(())
    }
}

/// Why an envelope or frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Malformed(Malformed),
    Mismatch(FrameMismatch),
    Oversized(u64),
}

impl From<HeaderError> for Refused {
    fn from(e: HeaderError) -> Self {
        match e {
            HeaderError::Malformed(m) => Refused::Malformed(m),
            HeaderError::Version(v) => Refused::Mismatch(FrameMismatch::Version {
                ours: VERSION,
                theirs: v,
            }),
            HeaderError::Oversized(l) => Refused::Oversized(l),
        }
    }
}

/// Opens a sealed envelope (one whole message given by a callback or MPI):
/// header checks, then the exact payload length.
pub(crate) fn open(bytes: &[u8], expect: &Expect) -> Result<Vec<u8>, Refused> {
    if bytes.len() < HEADER_LEN {
        return Err(Refused::Malformed(
            if bytes.len() >= 4 && bytes[..4] != MAGIC {
                Malformed::Magic
            } else {
                Malformed::Truncated
            },
        ));
    }
    let h = Header::decode(bytes, MAX_PAYLOAD)?;
    expect.check(&h).map_err(Refused::Mismatch)?;
    let body = &bytes[HEADER_LEN..];
    match body.len().cmp(&h.payload_len()) {
        std::cmp::Ordering::Less => Err(Refused::Malformed(Malformed::Truncated)),
        std::cmp::Ordering::Greater => Err(Refused::Malformed(Malformed::Trailing)),
        std::cmp::Ordering::Equal => Ok(body.to_vec()),
    }
}

use super::codec::malformed;

/// Encodes allgather contributions as one `postcard` sequence of byte
/// strings (each a varint length and its bytes). `None` past
/// [`MAX_PAYLOAD`], checked before anything is allocated.
pub(crate) fn encode_list(items: &[Vec<u8>]) -> Option<Vec<u8>> {
    // A varint of a `usize` is at most 10 bytes.
    let mut total: usize = 10;
    for it in items {
        total = total.checked_add(10)?.checked_add(it.len())?;
    }
    if total > MAX_PAYLOAD.saturating_add(10) {
        return None;
    }
    let out = postcard::to_allocvec(items).ok()?;
    (out.len() <= MAX_PAYLOAD).then_some(out)
}

/// Decodes [`encode_list`]'s format, expecting `count` entries.
pub(crate) fn decode_list(bytes: &[u8], count: usize) -> Result<Vec<Vec<u8>>, Refused> {
    let (items, rest): (Vec<&[u8]>, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|e| Refused::Malformed(malformed(&e)))?;
    if items.len() != count {
        return Err(Refused::Mismatch(FrameMismatch::Count {
            expected: count,
            got: items.len(),
        }));
    }
    if !rest.is_empty() {
        return Err(Refused::Malformed(Malformed::Trailing));
    }
    Ok(items.into_iter().map(<[u8]>::to_vec).collect())
}

/// Accumulates a byte stream and cuts it into frames. The buffer grows only
/// with bytes that arrived, so a hostile length cannot make it allocate.
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// The bytes read and not yet taken as a frame.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Reads once (whatever is available after `poll` said readable).
    /// `Ok(0)` is end of stream.
    pub(crate) fn fill(&mut self, r: &mut impl Read) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = r.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// The next complete frame, if there is one. A bad header is reported
    /// as soon as its 36 bytes are in (an oversized length before any
    /// payload is awaited).
    pub(crate) fn next(&mut self, max: usize) -> Result<Option<(Header, Vec<u8>)>, HeaderError> {
        if self.buf.len() < HEADER_LEN {
            if self.buf.len() >= 4 && self.buf[..4] != MAGIC {
                return Err(HeaderError::Malformed(Malformed::Magic));
            }
            return Ok(None);
        }
        let h = Header::decode(&self.buf, max)?;
        let end = HEADER_LEN
            .checked_add(h.payload_len())
            .ok_or(HeaderError::Malformed(Malformed::Overflow))?;
        if self.buf.len() < end {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..end].to_vec();
        self.buf.drain(..end);
        Ok(Some((h, payload)))
    }
}

/// The frame rank `rank` of communicator `(job, size)` sends at `step`, or
/// `InvalidArgument` when `payload` is over the frame limit. One definition
/// for the backends that frame bytes themselves (callbacks, MPI).
pub(crate) fn seal(
    job: u64,
    rank: usize,
    size: usize,
    step: super::error::Exchange,
    kind: Kind,
    payload: &[u8],
) -> Result<Vec<u8>, super::error::BootstrapError> {
    let h = Header {
        kind: kind as u8,
        job,
        seq: step.seq,
        from: u32::try_from(rank).unwrap_or(u32::MAX),
        size: u32::try_from(size).unwrap_or(u32::MAX),
        len: 0,
    };
    frame(h, payload).ok_or(super::error::BootstrapError::InvalidArgument {
        rank,
        step,
        what: super::error::Argument::TooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD,
        },
    })
}

/// What a frame from `from` at `step` of communicator `(job, size)` must say.
pub(crate) fn expect(
    job: u64,
    size: usize,
    step: super::error::Exchange,
    kind: Kind,
    from: usize,
) -> Expect {
    Expect {
        job,
        size: u32::try_from(size).unwrap_or(u32::MAX),
        seq: step.seq,
        kind,
        op: step.op,
        from: u32::try_from(from).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trips_and_refuses_hostile_counts() {
        let items = vec![b"a".to_vec(), Vec::new(), b"xyz".to_vec()];
        let enc = encode_list(&items).unwrap_or_default();
        assert_eq!(decode_list(&enc, 3), Ok(items));
        assert!(matches!(
            decode_list(&enc, 2),
            Err(Refused::Mismatch(FrameMismatch::Count { .. }))
        ));
        // A count of u32::MAX with nothing behind it, an entry longer than
        // the bytes, a varint that never ends.
        assert!(decode_list(&[0xff, 0xff, 0xff, 0xff, 0x0f], 3).is_err());
        assert_eq!(
            decode_list(&[1, 0xff, 0xff, 0xff, 0xff, 0x0f], 1),
            Err(Refused::Malformed(Malformed::Truncated))
        );
        assert!(decode_list(&[0xff; 12], 1).is_err());
        assert!(decode_list(&enc[..enc.len() - 1], 3).is_err());
        assert!(decode_list(&[], 0).is_err());
    }

    #[test]
    fn header_refuses_oversized_length_before_payload() {
        let h = Header {
            kind: Kind::Allgather as u8,
            job: 1,
            seq: 0,
            from: 1,
            size: 2,
            len: u32::MAX,
        };
        let mut r = FrameReader {
            buf: h.encode().map_or_else(Vec::new, |b| b.to_vec()),
        };
        assert!(matches!(
            r.next(MAX_PAYLOAD),
            Err(HeaderError::Oversized(_))
        ));
        let mut g = FrameReader {
            buf: b"GET / HTTP/1.1\r\n".to_vec(),
        };
        assert_eq!(
            g.next(MAX_PAYLOAD),
            Err(HeaderError::Malformed(Malformed::Magic))
        );
    }

    #[test]
    fn the_header_keeps_its_documented_36_byte_layout() {
        let h = Header {
            kind: Kind::Broadcast as u8,
            job: 0x0102_0304_0506_0708,
            seq: 9,
            from: 3,
            size: 4,
            len: 0x0a0b_0c0d,
        };
        let b = h.encode().map_or_else(Vec::new, |b| b.to_vec());
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(&b[0..4], b"CEbs");
        assert_eq!(&b[4..8], &[2, 0, 6, 0]);
        assert_eq!(&b[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[16..24], &9u64.to_le_bytes());
        assert_eq!(&b[24..32], &[3, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(&b[32..36], &0x0a0b_0c0du32.to_le_bytes());
        assert_eq!(Header::decode(&b, usize::MAX), Ok(h));
    }

    proptest::proptest! {
        #[test]
        fn peer_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), count in 0usize..5) {
            let mut r = FrameReader { buf: bytes.clone() };
            while let Ok(Some(_)) = r.next(MAX_PAYLOAD) {}
            let _ = decode_list(&bytes, count);
            let exp = Expect { job: 1, size: 2, seq: 0, kind: Kind::Allgather, op: Op::Allgather, from: 0 };
            let _ = open(&bytes, &exp);
            let _ = Header::decode(&bytes, MAX_PAYLOAD);
        }

        #[test]
        fn a_valid_header_with_hostile_fields_never_panics(kind: u8, job: u64, seq: u64, from: u32, size: u32, len: u32, tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut bytes = Header { kind, job, seq, from, size, len }.encode().map_or_else(Vec::new, |b| b.to_vec());
            bytes.extend_from_slice(&tail);
            let mut r = FrameReader { buf: bytes.clone() };
            let _ = r.next(MAX_PAYLOAD);
            let exp = Expect { job, size, seq, kind: Kind::Broadcast, op: Op::Broadcast, from };
            let _ = open(&bytes, &exp);
            let _ = decode_list(&tail, 2);
        }
    }
}

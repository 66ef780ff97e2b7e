//! The wire format every backend shares: a fixed 36-byte header (magic,
//! version, message type, job id, sequence number, sender, communicator size,
//! payload length; little-endian) in front of each payload, a hard maximum
//! frame size, the encoding of an allgather result, and the checks that
//! refuse bytes from another job, communicator or step.
//!
//! Every length from a peer is checked before use; nothing here allocates
//! more than the bytes that actually arrived, and nothing panics on peer bytes.

use std::io::Read;

use super::error::{FrameMismatch, Malformed, Op};

/// The hard maximum of one frame's payload (64 MiB): a peer announcing more
/// gets [`BootstrapError::Oversized`](super::BootstrapError::Oversized).
pub const MAX_PAYLOAD: usize = 64 << 20;

pub(crate) const MAGIC: [u8; 4] = *b"CEbs";
pub(crate) const VERSION: u16 = 1;
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
            _ => return None,
        })
    }
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
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.kind;
        b[7] = 0;
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.from.to_le_bytes());
        b[28..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; `bytes` must hold at least [`HEADER_LEN`] bytes.
    pub(crate) fn decode(bytes: &[u8], max: usize) -> Result<Header, HeaderError> {
        let b = bytes
            .get(..HEADER_LEN)
            .ok_or(HeaderError::Malformed(Malformed::Truncated))?;
        if b[0..4] != MAGIC {
            return Err(HeaderError::Malformed(Malformed::Magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let h = Header {
            kind: b[6],
            job: u64_at(8),
            seq: u64_at(16),
            from: u32_at(24),
            size: u32_at(28),
            len: u32_at(32),
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
    out.extend_from_slice(&header.encode());
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

/// Encodes allgather contributions: `u32` count, then `u32` length and bytes
/// of each. `None` past [`MAX_PAYLOAD`].
pub(crate) fn encode_list(items: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut total: usize = 4;
    for it in items {
        total = total.checked_add(4)?.checked_add(it.len())?;
    }
    if total > MAX_PAYLOAD {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&u32::try_from(items.len()).ok()?.to_le_bytes());
    for it in items {
        out.extend_from_slice(&u32::try_from(it.len()).ok()?.to_le_bytes());
        out.extend_from_slice(it);
    }
    Some(out)
}

/// Decodes [`encode_list`]'s format, expecting `count` entries.
pub(crate) fn decode_list(bytes: &[u8], count: usize) -> Result<Vec<Vec<u8>>, Refused> {
    let read_u32 = |at: usize| -> Result<u32, Refused> {
        let end = at
            .checked_add(4)
            .ok_or(Refused::Malformed(Malformed::Overflow))?;
        let b = bytes
            .get(at..end)
            .ok_or(Refused::Malformed(Malformed::Truncated))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let n = usize::try_from(read_u32(0)?).map_err(|_| Refused::Malformed(Malformed::Overflow))?;
    if n != count {
        return Err(Refused::Mismatch(FrameMismatch::Count {
            expected: count,
            got: n,
        }));
    }
    let mut at = 4usize;
    let mut out = Vec::with_capacity(n.min(bytes.len() / 4));
    for _ in 0..n {
        let len =
            usize::try_from(read_u32(at)?).map_err(|_| Refused::Malformed(Malformed::Overflow))?;
        at = at
            .checked_add(4)
            .ok_or(Refused::Malformed(Malformed::Overflow))?;
        let end = at
            .checked_add(len)
            .ok_or(Refused::Malformed(Malformed::Overflow))?;
        let item = bytes
            .get(at..end)
            .ok_or(Refused::Malformed(Malformed::Truncated))?;
        out.push(item.to_vec());
        at = end;
    }
    if at != bytes.len() {
        return Err(Refused::Malformed(Malformed::Trailing));
    }
    Ok(out)
}

/// Accumulates a byte stream and cuts it into frames. The buffer grows only
/// with bytes that arrived, so a hostile length cannot make it allocate.
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
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
        let mut huge = enc.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_list(&huge, 3).is_err());
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
            buf: h.encode().to_vec(),
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

    proptest::proptest! {
        #[test]
        fn peer_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), count in 0usize..5) {
            let mut r = FrameReader { buf: bytes.clone() };
            while let Ok(Some(_)) = r.next(MAX_PAYLOAD) {}
            let _ = decode_list(&bytes, count);
            let exp = Expect { job: 1, size: 2, seq: 0, kind: Kind::Allgather, op: Op::Allgather, from: 0 };
            let _ = open(&bytes, &exp);
            let _ = Header::decode(&bytes, MAX_PAYLOAD);
            let _ = crate::node::NodeId::decode(&bytes);
        }

        #[test]
        fn a_valid_header_with_hostile_fields_never_panics(kind: u8, job: u64, seq: u64, from: u32, size: u32, len: u32, tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut bytes = Header { kind, job, seq, from, size, len }.encode().to_vec();
            bytes.extend_from_slice(&tail);
            let mut r = FrameReader { buf: bytes.clone() };
            let _ = r.next(MAX_PAYLOAD);
            let exp = Expect { job, size, seq, kind: Kind::Broadcast, op: Op::Broadcast, from };
            let _ = open(&bytes, &exp);
            let _ = decode_list(&tail, 2);
        }
    }
}

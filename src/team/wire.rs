//! The bring-up's messages on the wire, as `serde` types encoded by the
//! bootstrap crate's codec ([`crate::bootstrap::codec`], `postcard`): a
//! status per rank and step (what it brings, or why its step failed) behind
//! a fixed header, the hello every rank sends first, the envelope a handle
//! travels in, and the small reports of the later steps.
//!
//! The status header ([`Frame`], [`HEADER_LEN`] bytes, pinned by a test)
//! carries the magic, the protocol [`VERSION`], the bring-up's tag (so that
//! bring-ups sharing one bootstrap never take each other's messages), the
//! step and the sender's rank; a reader checks all of them before it looks
//! at the body. Everything read here is peer bytes: lengths are bounded,
//! and anything malformed is a [`Cause::BadMessage`] or a
//! [`Mismatch`](super::Mismatch), never a panic.

use serde::{Deserialize, Serialize};

use crate::bootstrap::{Malformed, codec};
use crate::driver::{Call, Code, Device};
use crate::error::Error;

use super::error::{Cause, Mismatch, PeerFailure, Step};

/// Bring-up protocol version; ranks with another refuse to proceed. 2: the
/// messages are `serde` types and the header names the tag and the sender;
/// 3: a heap's grow report carries the new chunk's shares (portable path);
/// 4: the bind report travels in pieces (`limits::agree_large`) and the
/// import agreement names a share refused as aliased memory (`windows`);
/// 5: the bind report names each binding's extent (`bound::report`).
pub(crate) const VERSION: u8 = 5;
const STATUS_MAGIC: [u8; 4] = *b"CETS";
/// "CETH" was the hello before it carried each device's place, "CET2" the
/// hand-encoded one: an older peer's hello is refused as "not a bring-up
/// hello".
const HELLO_MAGIC: [u8; 4] = *b"CET3";
const ENVELOPE_MAGIC: [u8; 4] = *b"CETE";
/// The most devices one rank may bring.
pub(crate) const MAX_DEVICES: usize = 1024;
/// The largest status payload (an envelope, a hello, one piece of a larger
/// message: `limits::PIECE`).
const MAX_PAYLOAD: usize = 64 * 1024;
/// The status header's length: magic 4, version 1, tag 8, step 1, sender 4.
pub(crate) const HEADER_LEN: usize = 18;

/// The status header as it travels: the integers as little-endian byte
/// arrays, so its layout is fixed whatever their values.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    magic: [u8; 4],
    version: u8,
    tag: [u8; 8],
    step: u8,
    from: [u8; 4],
}

impl Frame {
    /// The header rank `from` sends at `step` of the bring-up tagged `tag`.
    pub(crate) fn new(tag: u64, step: Step, from: usize) -> Frame {
        Frame {
            magic: STATUS_MAGIC,
            version: VERSION,
            tag: tag.to_le_bytes(),
            step: step.tag(),
            from: u32::try_from(from).unwrap_or(u32::MAX).to_le_bytes(),
        }
    }

    /// Checks a peer's header: our magic and version, the bring-up's tag,
    /// the step, and that the sender is the rank whose slot it came in.
    fn check(&self, want: &Frame) -> Result<(), Cause> {
        if self.magic != STATUS_MAGIC {
            return Err(Cause::BadMessage {
                reason: "not a bring-up message (magic)",
            });
        }
        if self.version != VERSION {
            return Err(Cause::Mismatch(Mismatch::Version {
                theirs: self.version,
                ours: VERSION,
            }));
        }
        if self.tag != want.tag {
            return Err(Cause::Mismatch(Mismatch::Tag {
                theirs: u64::from_le_bytes(self.tag),
                ours: u64::from_le_bytes(want.tag),
            }));
        }
        if self.step != want.step {
            return Err(Cause::BadMessage {
                reason: "a message of another bring-up step",
            });
        }
        if self.from != want.from {
            return Err(Cause::BadMessage {
                reason: "a message whose sender is not the rank it came from",
            });
        }
        Ok(())
    }
}

/// A status's body: the payload, or where and why the step failed.
#[derive(Serialize, Deserialize)]
enum Body<'a> {
    Ok(#[serde(borrow)] &'a [u8]),
    Failed {
        at: u8,
        code: u32,
        call: &'a str,
        message: &'a str,
    },
}

/// What the codec's refusal means, in a bring-up error.
fn bad(m: Malformed) -> Cause {
    Cause::BadMessage {
        reason: match m {
            Malformed::Truncated => "message shorter than its fields",
            Malformed::Trailing => "trailing bytes after the message",
            Malformed::Overflow => "a number too large for its field",
            _ => "bytes that do not decode as a bring-up message",
        },
    }
}

/// `value` encoded with the bootstrap's codec. Our own messages are far
/// below any bound; an unencodable one would be empty, which every reader
/// refuses.
pub(crate) fn to_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    codec::encode(value, crate::bootstrap::MAX_PAYLOAD).unwrap_or_default()
}

/// Exactly one `T` from a peer's bytes.
pub(crate) fn from_bytes<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Cause> {
    codec::decode(bytes).map_err(bad)
}

/// One rank's outcome of one step: its payload, or why it failed.
pub(crate) enum Status {
    Ok(Vec<u8>),
    /// The step it failed at (within the agreement step) and what it said.
    Failed(Step, PeerFailure),
}

/// Encodes rank `from`'s outcome of `step` of the bring-up tagged `tag`.
pub(crate) fn encode_status(
    tag: u64,
    step: Step,
    from: usize,
    outcome: &Result<Vec<u8>, (Step, Cause)>,
) -> Vec<u8> {
    let text;
    let body = match outcome {
        Ok(payload) => Body::Ok(payload),
        Err((at, cause)) => {
            let (call, code) = match cause {
                Cause::Local(Error::Driver { call, code }) => (Some(*call), Some(*code)),
                Cause::Local(e) => (None, e.code()),
                Cause::Peer(p) => (p.call, p.code),
                _ => (None, None),
            };
            text = cause.to_string();
            Body::Failed {
                at: at.tag(),
                code: code.map_or(0, Code::raw),
                call: call.map_or("", Call::name),
                message: truncate(&text, PeerFailure::MAX_MESSAGE),
            }
        }
    };
    let mut out = to_bytes(&Frame::new(tag, step, from));
    out.extend_from_slice(&to_bytes(&body));
    out
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Decodes rank `from`'s outcome of `step` of the bring-up tagged `tag`.
pub(crate) fn decode_status(
    tag: u64,
    step: Step,
    from: usize,
    bytes: &[u8],
) -> Result<Status, Cause> {
    let header = bytes.get(..HEADER_LEN).ok_or(Cause::BadMessage {
        reason: "message shorter than its header",
    })?;
    let frame: Frame = from_bytes(header)?;
    frame.check(&Frame::new(tag, step, from))?;
    let body = bytes.get(HEADER_LEN..).unwrap_or(&[]);
    match from_bytes::<Body<'_>>(body)? {
        Body::Ok(payload) => {
            if payload.len() > MAX_PAYLOAD {
                return Err(Cause::BadMessage {
                    reason: "payload larger than any bring-up message",
                });
            }
            Ok(Status::Ok(payload.to_vec()))
        }
        Body::Failed {
            at,
            code,
            call,
            message,
        } => {
            let at = Step::from_tag(at).ok_or(Cause::BadMessage {
                reason: "unknown step in a failure",
            })?;
            if message.len() > PeerFailure::MAX_MESSAGE {
                return Err(Cause::BadMessage {
                    reason: "failure message longer than allowed",
                });
            }
            Ok(Status::Failed(
                at,
                PeerFailure {
                    call: Call::from_name(call),
                    code: Code::from_raw(code),
                    message: message.to_owned(),
                },
            ))
        }
    }
}

/// One device a rank brings, as its hello says.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct HelloDevice {
    device: i32,
    clique: Option<u32>,
    place: Option<u64>,
}

/// A hello as it travels.
#[derive(Serialize, Deserialize)]
struct HelloWire {
    magic: [u8; 4],
    bytes: u64,
    counted_ops: bool,
    devices: Vec<HelloDevice>,
}

/// What a rank brings to a bring-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Bytes per device asked for.
    pub bytes: u64,
    /// Counted operations asked for.
    pub counted_ops: bool,
    /// This rank's devices.
    pub devices: Vec<Device>,
    /// Each device's multicast clique (R4.5), `None` where the driver cannot
    /// tell (before 13.4).
    pub cliques: Vec<Option<u32>>,
    /// Each device's place: which physical device of which node it is
    /// (`super::place`), whatever its ordinal in this process; `None` where
    /// the driver cannot tell.
    pub places: Vec<Option<u64>>,
}

impl Hello {
    /// At most [`MAX_DEVICES`] devices: checked before encoding.
    pub(crate) fn encode(&self) -> Vec<u8> {
        to_bytes(&HelloWire {
            magic: HELLO_MAGIC,
            bytes: self.bytes,
            counted_ops: self.counted_ops,
            devices: self
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| HelloDevice {
                    device: d.0,
                    clique: self.cliques.get(i).copied().flatten(),
                    place: self.places.get(i).copied().flatten(),
                })
                .collect(),
        })
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Hello, Cause> {
        // The magic first: an older peer's hello is named as such, whatever
        // follows it.
        if bytes.get(..4) != Some(&HELLO_MAGIC[..]) {
            return Err(Cause::BadMessage {
                reason: "not a bring-up hello (magic)",
            });
        }
        let w: HelloWire = from_bytes(bytes)?;
        if w.devices.len() > MAX_DEVICES {
            return Err(Cause::BadMessage {
                reason: "more devices than one rank may bring",
            });
        }
        Ok(Hello {
            bytes: w.bytes,
            counted_ops: w.counted_ops,
            devices: w.devices.iter().map(|d| Device(d.device)).collect(),
            cliques: w.devices.iter().map(|d| d.clique).collect(),
            places: w.devices.iter().map(|d| d.place).collect(),
        })
    }
}

/// How an envelope carries the shared object.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) enum Carrier<'a> {
    /// A logical endpoint's fabric handle, in its wire form.
    Fabric(#[serde(borrow)] &'a [u8]),
    /// A classic object's POSIX descriptor, passed over the bootstrap.
    ClassicFd,
    /// A classic object's 64 fabric bytes (checked to be 64 on decode).
    ClassicFabric(#[serde(borrow)] &'a [u8]),
}

/// The envelope a handle travels in: magic, protocol version, the options
/// the importer checks (counted operations), then the carrier: a logical
/// endpoint's checksummed handle (kind, size, alignment, team size, driver
/// bytes) or a classic object's.
#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    magic: [u8; 4],
    version: u8,
    counted_ops: bool,
    #[serde(borrow)]
    carrier: Carrier<'a>,
}

/// The envelope of a logical endpoint's handle (its wire form).
pub(crate) fn encode_envelope(counted_ops: bool, handle: &[u8]) -> Vec<u8> {
    to_bytes(&Envelope {
        magic: ENVELOPE_MAGIC,
        version: VERSION,
        counted_ops,
        carrier: Carrier::Fabric(handle),
    })
}

/// The envelope of a classic multicast object (C5): a POSIX descriptor that
/// travels beside it over the bootstrap (`fabric` = `None`), or the 64
/// fabric bytes.
pub(crate) fn encode_classic_envelope(counted_ops: bool, fabric: Option<&[u8; 64]>) -> Vec<u8> {
    to_bytes(&Envelope {
        magic: ENVELOPE_MAGIC,
        version: VERSION,
        counted_ops,
        carrier: match fabric {
            None => Carrier::ClassicFd,
            Some(b) => Carrier::ClassicFabric(b),
        },
    })
}

/// An envelope's counted-operations flag and carrier, checked.
pub(crate) fn decode_envelope(bytes: &[u8]) -> Result<(bool, Carrier<'_>), Cause> {
    if bytes.get(..4) != Some(&ENVELOPE_MAGIC[..]) {
        return Err(Cause::BadMessage {
            reason: "not a handle envelope (magic)",
        });
    }
    let e: Envelope<'_> = from_bytes(bytes)?;
    if e.version != VERSION {
        return Err(Cause::Mismatch(Mismatch::Version {
            theirs: e.version,
            ours: VERSION,
        }));
    }
    if let Carrier::ClassicFabric(b) = e.carrier
        && b.len() != 64
    {
        return Err(Cause::BadMessage {
            reason: "classic fabric bytes of the wrong length",
        });
    }
    Ok((e.counted_ops, e.carrier))
}

/// What each rank reports at the enrollment step, for every rank to check
/// against its own view before the team counts as complete: the team size
/// it computed, a digest of the hellos as it saw them, and how many
/// devices it enrolled (on the classic fallback, as the backend counts
/// them).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Enrolled {
    pub team_size: u32,
    pub join_digest: u64,
    pub devices: u32,
}

impl Enrolled {
    pub(crate) fn encode(&self) -> Vec<u8> {
        to_bytes(self)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Enrolled, Cause> {
        from_bytes(bytes)
    }
}

/// A digest of the hellos as one rank saw them (FNV-1a, 64 bits, over
/// each hello with its length): the same on every rank that saw the same
/// bytes, whatever the build's hasher.
pub(crate) fn join_digest(hellos: &[Vec<u8>]) -> u64 {
    let mut all = Vec::with_capacity(
        hellos
            .iter()
            .fold(0usize, |n, h| n.saturating_add(h.len()).saturating_add(8)),
    );
    for hello in hellos {
        all.extend_from_slice(&(hello.len() as u64).to_le_bytes());
        all.extend_from_slice(hello);
    }
    crate::driver::fnv1a(&all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_and_refuses_other_steps_senders_and_tags() {
        let s = encode_status(7, Step::Hello, 2, &Ok(vec![1, 2, 3]));
        assert!(
            matches!(decode_status(7, Step::Hello, 2, &s), Ok(Status::Ok(p)) if p == [1, 2, 3])
        );
        assert!(decode_status(7, Step::Wait, 2, &s).is_err());
        assert!(matches!(
            decode_status(7, Step::Hello, 1, &s),
            Err(Cause::BadMessage { .. })
        ));
        assert!(matches!(
            decode_status(8, Step::Hello, 2, &s),
            Err(Cause::Mismatch(Mismatch::Tag { theirs: 7, ours: 8 }))
        ));
        let f = encode_status(
            0,
            Step::Enroll,
            0,
            &Err((
                Step::Import,
                Cause::Local(Error::driver(Call::AddDevice, Code::INVALID_DEVICE)),
            )),
        );
        match decode_status(0, Step::Enroll, 0, &f) {
            Ok(Status::Failed(at, p)) => {
                assert_eq!(at, Step::Import);
                assert_eq!(p.call, Some(Call::AddDevice));
                assert_eq!(p.code, Some(Code::INVALID_DEVICE));
            }
            _ => panic!("expected a failure"),
        }
    }

    #[test]
    fn the_status_header_keeps_its_documented_18_byte_layout() {
        let s = encode_status(0x0102_0304_0506_0708, Step::Export, 3, &Ok(vec![9]));
        assert_eq!(&s[0..4], b"CETS");
        assert_eq!(s[4], VERSION);
        assert_eq!(&s[5..13], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(s[13], Step::Export.tag());
        assert_eq!(&s[14..18], &3u32.to_le_bytes());
        // The body: variant 0 (`Ok`), a varint length, the payload.
        assert_eq!(&s[HEADER_LEN..], &[0, 1, 9]);
        // Another version is a version mismatch, named before anything else.
        let mut old = s.clone();
        old[4] = 1;
        assert!(matches!(
            decode_status(0x0102_0304_0506_0708, Step::Export, 3, &old),
            Err(Cause::Mismatch(Mismatch::Version { theirs: 1, .. }))
        ));
    }

    #[test]
    fn truncated_or_garbage_status_is_a_bad_message_not_a_panic() {
        let s = encode_status(0, Step::Hello, 0, &Ok(vec![7; 40]));
        for n in 0..s.len() {
            assert!(
                decode_status(0, Step::Hello, 0, &s[..n]).is_err(),
                "cut at {n}"
            );
        }
        // A payload length of u32::MAX with 40 bytes behind it.
        let mut big = s[..HEADER_LEN + 1].to_vec();
        big.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        big.extend_from_slice(&[7; 40]);
        assert!(decode_status(0, Step::Hello, 0, &big).is_err());
        let mut long = s.clone();
        long.push(0);
        assert!(decode_status(0, Step::Hello, 0, &long).is_err());
        // A whole payload past the bound is refused by name, not read.
        let over = encode_status(0, Step::Hello, 0, &Ok(vec![0; MAX_PAYLOAD + 1]));
        assert!(matches!(
            decode_status(0, Step::Hello, 0, &over),
            Err(Cause::BadMessage {
                reason: "payload larger than any bring-up message"
            })
        ));
    }

    #[test]
    fn hello_round_trips_and_bounds_device_count() {
        let h = Hello {
            bytes: 2 << 20,
            counted_ops: false,
            devices: vec![Device(0), Device(3)],
            cliques: vec![Some(7), None],
            places: vec![None, Some(u64::MAX)],
        };
        assert_eq!(Hello::decode(&h.encode()).ok(), Some(h.clone()));
        let many = Hello {
            devices: vec![Device(0); MAX_DEVICES + 1],
            cliques: Vec::new(),
            places: Vec::new(),
            ..h.clone()
        };
        assert!(Hello::decode(&many.encode()).is_err());
        let mut flag = Hello { bytes: 1, ..h }.encode();
        // The counted-operations flag (after the magic and a one-byte
        // varint) is neither 0 nor 1.
        flag[5] = 2;
        assert!(Hello::decode(&flag).is_err());
    }

    #[test]
    fn envelopes_round_trip_and_refuse_other_magic_versions_and_lengths() {
        let e = encode_envelope(true, &[1, 2, 3]);
        assert_eq!(
            decode_envelope(&e).ok(),
            Some((true, Carrier::Fabric(&[1, 2, 3])))
        );
        let c = encode_classic_envelope(false, Some(&[5; 64]));
        assert_eq!(
            decode_envelope(&c).ok(),
            Some((false, Carrier::ClassicFabric(&[5; 64])))
        );
        let fd = encode_classic_envelope(false, None);
        assert_eq!(decode_envelope(&fd).ok(), Some((false, Carrier::ClassicFd)));
        let mut old = e.clone();
        old[4] = 1;
        assert!(matches!(
            decode_envelope(&old),
            Err(Cause::Mismatch(Mismatch::Version { .. }))
        ));
        let short = to_bytes(&Envelope {
            magic: ENVELOPE_MAGIC,
            version: VERSION,
            counted_ops: false,
            carrier: Carrier::ClassicFabric(&[1; 63]),
        });
        assert!(decode_envelope(&short).is_err());
        for cut in 0..e.len() {
            assert!(decode_envelope(&e[..cut]).is_err(), "cut at {cut}");
        }
    }

    proptest::proptest! {
        #[test]
        fn peer_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128), tag: u64) {
            let _ = decode_status(tag, Step::Hello, 0, &bytes);
            let _ = Hello::decode(&bytes);
            let _ = decode_envelope(&bytes);
            let _ = Enrolled::decode(&bytes);
            let mut framed = encode_status(tag, Step::Wait, 1, &Ok(Vec::new()));
            framed.truncate(HEADER_LEN);
            framed.extend_from_slice(&bytes);
            let _ = decode_status(tag, Step::Wait, 1, &framed);
        }
    }
}

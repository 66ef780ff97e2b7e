//! The bring-up's messages on the wire: a status per rank and step (what it
//! brings, or why its step failed) and the hello every rank sends first.
//!
//! Everything read here is peer bytes: lengths are bounded, arithmetic is
//! checked, and anything malformed is a [`Cause::BadMessage`], never a panic.

use crate::driver::{Call, Code, Device};
use crate::error::Error;

use super::error::{Cause, PeerFailure, Step};

/// Bring-up protocol version; ranks with another refuse to proceed.
pub(crate) const VERSION: u8 = 1;
const STATUS_MAGIC: &[u8; 4] = b"CETS";
/// "CETH" was the hello before it carried each device's place: an older
/// peer's hello is refused as "not a bring-up hello".
const HELLO_MAGIC: &[u8; 4] = b"CET2";
/// The most devices one rank may bring.
pub(crate) const MAX_DEVICES: usize = 1024;
/// The largest status payload (an envelope or a hello).
const MAX_PAYLOAD: usize = 64 * 1024;

/// A bounds-checked reader over peer bytes.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Cause> {
        if n > self.bytes.len() {
            return Err(Cause::BadMessage {
                reason: "message shorter than its fields",
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Cause> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Cause> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(a))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Cause> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Cause> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn rest(self) -> &'a [u8] {
        self.bytes
    }

    pub(crate) fn end(self) -> Result<(), Cause> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Cause::BadMessage {
                reason: "trailing bytes after the message",
            })
        }
    }
}

/// One rank's outcome of one step: its payload, or why it failed.
pub(crate) enum Status {
    Ok(Vec<u8>),
    /// The step it failed at (within the agreement step) and what it said.
    Failed(Step, PeerFailure),
}

/// Encodes this rank's outcome of `step`.
pub(crate) fn encode_status(step: Step, outcome: &Result<Vec<u8>, (Step, Cause)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(STATUS_MAGIC);
    out.push(VERSION);
    out.push(step.tag());
    match outcome {
        Ok(payload) => {
            out.push(0);
            // Payloads are ours (hellos, envelopes): far below u32::MAX.
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(payload);
        }
        Err((at, cause)) => {
            out.push(1);
            out.push(at.tag());
            let (call, code) = match cause {
                Cause::Local(Error::Driver { call, code }) => (Some(*call), Some(*code)),
                Cause::Local(e) => (None, e.code()),
                Cause::Peer(p) => (p.call, p.code),
                _ => (None, None),
            };
            out.extend_from_slice(&code.map_or(0, Code::raw).to_le_bytes());
            let name = call.map_or("", Call::name).as_bytes();
            out.push(name.len() as u8); // cuda.h names are short
            out.extend_from_slice(name);
            let text = cause.to_string();
            let msg = truncate(&text, PeerFailure::MAX_MESSAGE);
            out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
            out.extend_from_slice(msg.as_bytes());
        }
    }
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

/// Decodes a peer's outcome of `step`.
pub(crate) fn decode_status(step: Step, bytes: &[u8]) -> Result<Status, Cause> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != STATUS_MAGIC {
        return Err(Cause::BadMessage {
            reason: "not a bring-up message (magic)",
        });
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(Cause::Mismatch(super::Mismatch::Version {
            theirs: version,
            ours: VERSION,
        }));
    }
    let their_step = r.u8()?;
    if Step::from_tag(their_step) != Some(step) {
        return Err(Cause::BadMessage {
            reason: "a message of another bring-up step",
        });
    }
    match r.u8()? {
        0 => {
            let len = r.u32()? as usize;
            if len > MAX_PAYLOAD {
                return Err(Cause::BadMessage {
                    reason: "payload larger than any bring-up message",
                });
            }
            let payload = r.take(len)?.to_vec();
            r.end()?;
            Ok(Status::Ok(payload))
        }
        1 => {
            let at = Step::from_tag(r.u8()?).ok_or(Cause::BadMessage {
                reason: "unknown step in a failure",
            })?;
            let code = Code::from_raw(r.u32()?);
            let n = usize::from(r.u8()?);
            let call = std::str::from_utf8(r.take(n)?)
                .ok()
                .and_then(Call::from_name);
            let n = usize::from(r.u16()?);
            if n > PeerFailure::MAX_MESSAGE {
                return Err(Cause::BadMessage {
                    reason: "failure message longer than allowed",
                });
            }
            let message = String::from_utf8_lossy(r.take(n)?).into_owned();
            r.end()?;
            Ok(Status::Failed(
                at,
                PeerFailure {
                    call,
                    code,
                    message,
                },
            ))
        }
        _ => Err(Cause::BadMessage {
            reason: "unknown status tag",
        }),
    }
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
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17 + 18 * self.devices.len());
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out.push(u8::from(self.counted_ops));
        // At most MAX_DEVICES: checked before encoding.
        out.extend_from_slice(&(self.devices.len() as u32).to_le_bytes());
        for (i, d) in self.devices.iter().enumerate() {
            out.extend_from_slice(&d.0.to_le_bytes());
            let c = self.cliques.get(i).copied().flatten();
            out.push(u8::from(c.is_some()));
            out.extend_from_slice(&c.unwrap_or(0).to_le_bytes());
            let p = self.places.get(i).copied().flatten();
            out.push(u8::from(p.is_some()));
            out.extend_from_slice(&p.unwrap_or(0).to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Hello, Cause> {
        let mut r = Reader::new(bytes);
        if r.take(4)? != HELLO_MAGIC {
            return Err(Cause::BadMessage {
                reason: "not a bring-up hello (magic)",
            });
        }
        let bytes = r.u64()?;
        let counted_ops = match r.u8()? {
            0 => false,
            1 => true,
            _ => {
                return Err(Cause::BadMessage {
                    reason: "counted-operations flag is neither 0 nor 1",
                });
            }
        };
        let n = r.u32()? as usize;
        if n > MAX_DEVICES {
            return Err(Cause::BadMessage {
                reason: "more devices than one rank may bring",
            });
        }
        let mut devices = Vec::with_capacity(n);
        let mut cliques = Vec::with_capacity(n);
        let mut places = Vec::with_capacity(n);
        for _ in 0..n {
            devices.push(Device(r.u32()? as i32));
            let known = r.u8()?;
            let c = r.u32()?;
            cliques.push(match known {
                0 => None,
                1 => Some(c),
                _ => {
                    return Err(Cause::BadMessage {
                        reason: "clique flag is neither 0 nor 1",
                    });
                }
            });
            let known = r.u8()?;
            let p = r.u64()?;
            places.push(match known {
                0 => None,
                1 => Some(p),
                _ => {
                    return Err(Cause::BadMessage {
                        reason: "place flag is neither 0 nor 1",
                    });
                }
            });
        }
        r.end()?;
        Ok(Hello {
            bytes,
            counted_ops,
            devices,
            cliques,
            places,
        })
    }
}

/// The envelope a handle travels in: protocol version, the options the
/// importer checks (counted operations), then the handle's own checksummed
/// wire form (kind, size, alignment, team size, driver bytes).
pub(crate) fn encode_envelope(counted_ops: bool, handle: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + handle.len());
    out.extend_from_slice(b"CETE");
    out.push(VERSION);
    out.push(u8::from(counted_ops));
    out.extend_from_slice(handle);
    out
}

/// What the classic fallback's carrier starts with, where a logical
/// endpoint's envelope has its fabric handle's wire form.
const CLASSIC_MAGIC: &[u8; 4] = b"CECL";

/// The envelope of a classic multicast object (C5): the same header, then
/// the carrier: a POSIX descriptor that travels beside it over the
/// bootstrap (`fabric` = `None`), or the 64 fabric bytes.
pub(crate) fn encode_classic_envelope(counted_ops: bool, fabric: Option<&[u8; 64]>) -> Vec<u8> {
    let mut carrier = CLASSIC_MAGIC.to_vec();
    match fabric {
        None => carrier.push(0),
        Some(b) => {
            carrier.push(1);
            carrier.extend_from_slice(b);
        }
    }
    encode_envelope(counted_ops, &carrier)
}

/// How an envelope carries the shared object.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Carrier<'a> {
    /// A logical endpoint's fabric handle, in its wire form.
    Fabric(&'a [u8]),
    /// A classic object's POSIX descriptor, passed over the bootstrap.
    ClassicFd,
    /// A classic object's 64 fabric bytes.
    ClassicFabric([u8; 64]),
}

/// Reads the carrier after the envelope's header.
pub(crate) fn decode_carrier(rest: &[u8]) -> Result<Carrier<'_>, Cause> {
    let mut r = Reader::new(rest);
    if rest.len() < 4 || r.take(4)? != CLASSIC_MAGIC {
        return Ok(Carrier::Fabric(rest));
    }
    match r.u8()? {
        0 => {
            r.end()?;
            Ok(Carrier::ClassicFd)
        }
        1 => {
            let mut b = [0u8; 64];
            b.copy_from_slice(r.take(64)?);
            r.end()?;
            Ok(Carrier::ClassicFabric(b))
        }
        _ => Err(Cause::BadMessage {
            reason: "unknown classic handle carrier",
        }),
    }
}

/// Splits an envelope into its counted-operations flag and the handle bytes.
pub(crate) fn decode_envelope(bytes: &[u8]) -> Result<(bool, &[u8]), Cause> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != b"CETE" {
        return Err(Cause::BadMessage {
            reason: "not a handle envelope (magic)",
        });
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(Cause::Mismatch(super::Mismatch::Version {
            theirs: version,
            ours: VERSION,
        }));
    }
    let counted = match r.u8()? {
        0 => false,
        1 => true,
        _ => {
            return Err(Cause::BadMessage {
                reason: "counted-operations flag is neither 0 nor 1",
            });
        }
    };
    Ok((counted, r.rest()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_and_refuses_other_steps() {
        let s = encode_status(Step::Hello, &Ok(vec![1, 2, 3]));
        assert!(matches!(decode_status(Step::Hello, &s), Ok(Status::Ok(p)) if p == [1, 2, 3]));
        assert!(decode_status(Step::Wait, &s).is_err());
        let f = encode_status(
            Step::Enroll,
            &Err((
                Step::Import,
                Cause::Local(Error::driver(Call::AddDevice, Code::INVALID_DEVICE)),
            )),
        );
        match decode_status(Step::Enroll, &f) {
            Ok(Status::Failed(at, p)) => {
                assert_eq!(at, Step::Import);
                assert_eq!(p.call, Some(Call::AddDevice));
                assert_eq!(p.code, Some(Code::INVALID_DEVICE));
            }
            _ => panic!("expected a failure"),
        }
    }

    #[test]
    fn truncated_or_garbage_status_is_a_bad_message_not_a_panic() {
        let s = encode_status(Step::Hello, &Ok(vec![7; 40]));
        for n in 0..s.len() {
            assert!(decode_status(Step::Hello, &s[..n]).is_err());
        }
        let mut big = s.clone();
        big[7..11].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_status(Step::Hello, &big).is_err());
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
        let mut e = h.encode();
        e[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Hello::decode(&e).is_err());
    }
}

/// What each rank reports at the enrollment step, for every rank to check
/// against its own view before the team counts as complete: the team size
/// it computed, a digest of the hellos as it saw them, and how many
/// devices it enrolled (on the classic fallback, as the backend counts
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Enrolled {
    pub team_size: u32,
    pub join_digest: u64,
    pub devices: u32,
}

impl Enrolled {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.team_size.to_le_bytes());
        out.extend_from_slice(&self.join_digest.to_le_bytes());
        out.extend_from_slice(&self.devices.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Enrolled, Cause> {
        let mut r = Reader::new(bytes);
        let e = Enrolled {
            team_size: r.u32()?,
            join_digest: r.u64()?,
            devices: r.u32()?,
        };
        r.end()?;
        Ok(e)
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

//! The forms a model's shareable-handle token takes outside the model
//! (C5): a real POSIX descriptor (an anonymous in-memory file holding the
//! token, so that it can be passed with `SCM_RIGHTS` and closed like the
//! driver's), and 64 fabric bytes. The in-process [`Model`](super::Model)
//! and the fabric client (`fabric::Remote`) make and read the same forms.
//!
//! Both carry the fabric's tag ([`Secret`]) and a token sealed under the
//! fabric's key, so that neither can be forged from a sequence number nor
//! carried to another fabric.
//!
//! Bytes or descriptors that are not of this form read as `None`: the
//! model answers `INVALID_VALUE` for them (R9.4's rule for handle bytes,
//! applied to shareable handles; the model's choice).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::driver::{FabricHandleBytes, fnv1a};

/// What a descriptor's file starts with, before the fabric's tag and the token.
const FD_MAGIC: &[u8; 8] = b"CEPFD\0\x01\0";
/// What fabric bytes start with, before the fabric's tag and the token.
const FABRIC_MAGIC: &[u8; 8] = b"CEPMEMF1";

/// What a shareable-handle token is sealed for ([`Secret::seal`]).
pub(crate) const SEAL_EXPORT: u8 = 1;
/// What an endpoint's fabric handle is sealed for.
pub(crate) const SEAL_ENDPOINT: u8 = 2;

/// A fabric's secret, drawn from the OS (`getrandom`) when its model is
/// made: a public `tag` that every handle string of the fabric carries
/// (strings of another fabric are refused by it), and a `key` that never
/// leaves the model, under which the numbers handed out are sealed
/// (SipHash-2-4), so that no process can name memory or an endpoint it
/// was not given by guessing a sequence number.
#[derive(Clone, Copy)]
pub(crate) struct Secret {
    pub tag: u64,
    key: (u64, u64),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(tag {:#x})", self.tag)
    }
}

impl Secret {
    /// A fresh secret from the OS's generator. Should that fail (no
    /// `getrandom` and no `/dev/urandom`), the standard library's
    /// randomly keyed hasher seeds it: still random per process.
    pub fn new() -> Secret {
        let mut b = [0u8; 24];
        if getrandom::fill(&mut b).is_err() {
            use std::hash::{BuildHasher, RandomState};
            for (i, c) in b.chunks_mut(8).enumerate() {
                c.copy_from_slice(&RandomState::new().hash_one(i).to_le_bytes());
            }
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        Secret {
            tag: word(0),
            key: (word(1), word(2)),
        }
    }

    /// `value` sealed for `domain` under the key: unguessable without it.
    pub fn seal(&self, domain: u8, value: u64) -> u64 {
        use std::hash::Hasher;
        // SipHash-2-4 with a 128-bit key is a PRF; the standard library's
        // keyed form is deprecated only as a `HashMap` hasher.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new_with_keys(self.key.0, self.key.1);
        h.write_u8(domain);
        h.write_u64(self.tag);
        h.write_u64(value);
        h.finish()
    }
}

/// A new descriptor standing for `token` of the fabric tagged `tag`: an
/// unnamed in-memory file (no path, nothing left behind once every copy
/// is closed).
pub(crate) fn token_fd(tag: u64, token: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("cuda-endpoints-shareable", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(FD_MAGIC);
    bytes[8..16].copy_from_slice(&tag.to_le_bytes());
    bytes[16..].copy_from_slice(&token.to_le_bytes());
    let mut done = 0;
    while done < bytes.len() {
        let n = rustix::io::pwrite(&fd, &bytes[done..], done as u64)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    Ok(fd)
}

fn word(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The fabric tag and token a descriptor of [`token_fd`] stands for;
/// `None` for any other descriptor (or one that cannot be read).
pub(crate) fn fd_token(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let mut bytes = [0u8; 24];
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::pread(fd, &mut bytes[done..], done as u64) {
            Ok(0) | Err(_) => return None,
            Ok(n) => done += n,
        }
    }
    if &bytes[..8] != FD_MAGIC {
        return None;
    }
    Some((word(&bytes[8..16])?, word(&bytes[16..24])?))
}

/// The 64 fabric bytes standing for `token` of the fabric tagged `tag`:
/// magic, tag, token, a checksum.
pub(crate) fn token_bytes(tag: u64, token: u64) -> FabricHandleBytes {
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(FABRIC_MAGIC);
    b[8..16].copy_from_slice(&tag.to_le_bytes());
    b[16..24].copy_from_slice(&token.to_le_bytes());
    let sum = fnv1a(&b[..56]);
    b[56..].copy_from_slice(&sum.to_le_bytes());
    FabricHandleBytes(b)
}

/// The fabric tag and token of bytes made by [`token_bytes`]; `None` for
/// other bytes.
pub(crate) fn bytes_token(bytes: &FabricHandleBytes) -> Option<(u64, u64)> {
    let b = bytes.as_bytes();
    let sum = word(&b[56..])?;
    if &b[..8] != FABRIC_MAGIC || sum != fnv1a(&b[..56]) {
        return None;
    }
    Some((word(&b[8..16])?, word(&b[16..24])?))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn tokens_round_trip_and_other_forms_are_refused() {
        let fd = token_fd(9, 42).unwrap();
        assert_eq!(fd_token(fd.as_fd()), Some((9, 42)));
        let other = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert_eq!(fd_token(other.as_fd()), None);
        assert_eq!(bytes_token(&token_bytes(9, 7)), Some((9, 7)));
        let mut b = token_bytes(9, 7);
        b.0[9] ^= 1;
        assert_eq!(bytes_token(&b), None);
        assert_eq!(bytes_token(&FabricHandleBytes::ZERO), None);
    }

    #[test]
    fn two_secrets_differ_and_seal_differently() {
        let (a, b) = (Secret::new(), Secret::new());
        assert_ne!(a.tag, b.tag);
        assert_ne!(a.seal(SEAL_EXPORT, 1), b.seal(SEAL_EXPORT, 1));
        assert_ne!(a.seal(SEAL_EXPORT, 1), a.seal(SEAL_EXPORT, 2));
        assert_ne!(a.seal(SEAL_EXPORT, 1), a.seal(SEAL_ENDPOINT, 1));
        assert_eq!(a.seal(SEAL_EXPORT, 1), a.seal(SEAL_EXPORT, 1));
    }
}

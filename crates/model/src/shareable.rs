//! The forms a model's shareable-handle token takes outside the model
//! (C5): a real POSIX descriptor (an anonymous in-memory file holding the
//! token, so that it can be passed with `SCM_RIGHTS` and closed like the
//! driver's), and 64 fabric bytes. The in-process [`Model`](super::Model)
//! and the fabric client (`fabric::Remote`) make and read the same forms.
//!
//! Bytes or descriptors that are not of this form read as `None`: the
//! model answers `INVALID_VALUE` for them (R9.4's rule for handle bytes,
//! applied to shareable handles; the model's choice).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::driver::{FabricHandleBytes, fnv1a};

/// What a descriptor's file starts with, before the token.
const FD_MAGIC: &[u8; 8] = b"CEPFD\0\0\0";
/// What fabric bytes start with, before the token.
const FABRIC_MAGIC: &[u8; 8] = b"CEPMEMFB";

/// A new descriptor standing for `token`: an unnamed in-memory file (no
/// path, nothing left behind once every copy is closed).
pub(crate) fn token_fd(token: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("cuda-endpoints-shareable", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(FD_MAGIC);
    bytes[8..].copy_from_slice(&token.to_le_bytes());
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

/// The token a descriptor of [`token_fd`] stands for; `None` for any other
/// descriptor (or one that cannot be read).
pub(crate) fn fd_token(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut bytes = [0u8; 16];
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::pread(fd, &mut bytes[done..], done as u64) {
            Ok(0) | Err(_) => return None,
            Ok(n) => done += n,
        }
    }
    let (magic, token) = bytes.split_at(8);
    if magic != FD_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(token.try_into().ok()?))
}

/// The 64 fabric bytes standing for `token`: magic, token, a checksum.
pub(crate) fn token_bytes(token: u64) -> FabricHandleBytes {
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(FABRIC_MAGIC);
    b[8..16].copy_from_slice(&token.to_le_bytes());
    let sum = fnv1a(&b[..56]);
    b[56..].copy_from_slice(&sum.to_le_bytes());
    FabricHandleBytes(b)
}

/// The token of bytes made by [`token_bytes`]; `None` for other bytes.
pub(crate) fn bytes_token(bytes: &FabricHandleBytes) -> Option<u64> {
    let b = bytes.as_bytes();
    let sum = u64::from_le_bytes(b[56..].try_into().ok()?);
    if &b[..8] != FABRIC_MAGIC || sum != fnv1a(&b[..56]) {
        return None;
    }
    Some(u64::from_le_bytes(b[8..16].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn tokens_round_trip_and_other_forms_are_refused() {
        let fd = token_fd(42).unwrap();
        assert_eq!(fd_token(fd.as_fd()), Some(42));
        let other = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert_eq!(fd_token(other.as_fd()), None);
        assert_eq!(bytes_token(&token_bytes(7)), Some(7));
        let mut b = token_bytes(7);
        b.0[9] ^= 1;
        assert_eq!(bytes_token(&b), None);
        assert_eq!(bytes_token(&FabricHandleBytes::ZERO), None);
    }
}

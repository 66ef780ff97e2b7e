//! The bootstrap's own codec, for the layers that speak over a bootstrap
//! (the team bring-up of `cuda-endpoints`): `serde` types encoded by
//! `postcard`, as the bootstrap's own frames are, so that `postcard`
//! stays a dependency of this crate alone.
//!
//! Everything decoded here may be peer bytes: a decode never panics, never
//! allocates more than the bytes that arrived allow (`serde` caps what a
//! sequence reserves up front), and refuses trailing bytes. What a message
//! means (its magic, version, sender, bounds) is the caller's to check.

use serde::{Deserialize, Serialize};

use super::error::Malformed;

/// `value` encoded, or `None` when it does not encode or its encoding is
/// longer than `max` bytes.
pub fn encode<T: Serialize + ?Sized>(value: &T, max: usize) -> Option<Vec<u8>> {
    let bytes = postcard::to_allocvec(value).ok()?;
    (bytes.len() <= max).then_some(bytes)
}

/// Exactly one `T` from `bytes`.
///
/// # Errors
/// [`Malformed::Truncated`] when the bytes end early,
/// [`Malformed::Trailing`] when bytes are left after the value,
/// [`Malformed::Overflow`] for a varint past its type, and
/// [`Malformed::Encoding`] for anything else that is not a `T`.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Malformed> {
    let (value, rest) = decode_prefix(bytes)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(Malformed::Trailing)
    }
}

/// One `T` from the front of `bytes`, and the bytes after it.
///
/// # Errors
/// As [`decode`], less [`Malformed::Trailing`].
pub fn decode_prefix<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<(T, &'a [u8]), Malformed> {
    postcard::take_from_bytes(bytes).map_err(|e| malformed(&e))
}

/// What a `postcard` error says about a peer's bytes.
pub(crate) fn malformed(e: &postcard::Error) -> Malformed {
    match e {
        postcard::Error::DeserializeUnexpectedEnd => Malformed::Truncated,
        postcard::Error::DeserializeBadVarint => Malformed::Overflow,
        _ => Malformed::Encoding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Pair<'a> {
        n: u32,
        #[serde(borrow)]
        bytes: &'a [u8],
    }

    #[test]
    fn values_round_trip_and_cut_or_padded_bytes_are_refused() {
        let p = Pair {
            n: 300,
            bytes: b"abc",
        };
        let enc = encode(&p, 64).unwrap_or_default();
        assert_eq!(
            decode::<Pair<'_>>(&enc),
            Ok(Pair {
                n: 300,
                bytes: b"abc"
            })
        );
        for cut in 0..enc.len() {
            assert!(decode::<Pair<'_>>(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = enc.clone();
        long.push(0);
        assert_eq!(decode::<Pair<'_>>(&long), Err(Malformed::Trailing));
        assert_eq!(encode(&p, enc.len() - 1), None, "over the maximum");
        // A length of u32::MAX with three bytes behind it.
        assert_eq!(
            decode::<Pair<'_>>(&[1, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3]),
            Err(Malformed::Truncated)
        );
    }

    /// Length prefixes far past the bytes that follow (a peer's lie) end
    /// in an error, never a panic or an allocation of the claimed size.
    #[test]
    fn huge_length_prefixes_are_refused_without_a_panic() {
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let u32max = [0xff, 0xff, 0xff, 0xff, 0x0f];
        for prefix in [&max[..], &u32max[..]] {
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&u32max);
            bytes.extend_from_slice(&[1, 2, 3]);
            assert!(decode::<Vec<u8>>(&bytes).is_err());
            assert!(decode::<Vec<Vec<u8>>>(&bytes).is_err());
            assert!(decode::<Vec<String>>(&bytes).is_err());
            assert!(decode::<String>(&bytes).is_err());
            assert!(decode::<&[u8]>(&bytes).is_err());
            assert!(decode::<Vec<(u64, Vec<u8>)>>(&bytes).is_err());
        }
        // A varint longer than its type.
        assert_eq!(decode::<Vec<u8>>(&[0xff; 12]), Err(Malformed::Overflow));
    }
}

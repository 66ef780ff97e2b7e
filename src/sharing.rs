//! Fabric handles (rules R8, R9): what `export` writes and `import` reads,
//! with the kind, size and bind alignment carried beside the driver's 64
//! opaque bytes so that the importer gets a typed endpoint.
//!
//! The carried metadata is a convenience, not trusted for safety: the driver
//! validates the handle (R9.4) and every bind (R5.4) all the same, and
//! `import` checks the claimed size and alignment against the driver's
//! limits. The kind tag is trusted for typing only: see
//! [`FabricHandle::from_bytes`].

use std::marker::PhantomData;

use crate::driver::{FabricHandleBytes, fnv1a};
use crate::error::{Error, Result};
use crate::kind::CanExport;

const MAGIC: &[u8; 4] = b"CEFH";
/// Bytes of [`FabricHandle::to_bytes`].
pub(crate) const WIRE_LEN: usize = 4 + 1 + 1 + 8 + 8 + 4 + 64 + 8;
/// Where the checksum starts.
const SUM_AT: usize = WIRE_LEN - 8;

/// A fabric handle of an exported endpoint of kind `K`, to send to other
/// processes (as [`FabricHandle::to_bytes`]) and import there.
///
/// With the crate feature `serde`, it is also `Serialize` and `Deserialize`,
/// in the same checked wire form.
pub struct FabricHandle<K> {
    data: [u8; 64],
    size: u64,
    align: u64,
    team_size: u32,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for FabricHandle<K> {
    fn clone(&self) -> Self {
        FabricHandle { ..*self }
    }
}

impl<K: CanExport> std::fmt::Debug for FabricHandle<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricHandle")
            .field("kind", &K::NAME)
            .field("size", &self.size)
            .field("bind_alignment", &self.align)
            .field("team_size", &self.team_size)
            .finish_non_exhaustive()
    }
}

impl<K> FabricHandle<K> {
    /// Bytes of the wire form ([`FabricHandle::to_bytes`]), the same for
    /// every kind.
    pub const WIRE_LEN: usize = WIRE_LEN;

    // Not bound by `CanExport`: `export` asks `HasFabricHandles` of the
    // kind's origin instead, for a message that names it (every kind whose
    // origin is `Exportable` is `CanExport`).
    pub(crate) fn new(data: [u8; 64], size: u64, align: u64, team_size: u32) -> Self {
        FabricHandle {
            data,
            size,
            align,
            team_size,
            _kind: PhantomData,
        }
    }
}

impl<K: CanExport> FabricHandle<K> {
    pub(crate) fn bytes(&self) -> FabricHandleBytes {
        FabricHandleBytes(self.data)
    }

    /// Bytes per device of the exported endpoint.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its bind alignment, bytes.
    pub fn bind_alignment(&self) -> u64 {
        self.align
    }

    /// Its team size (1 for unicast).
    pub fn team_size(&self) -> u32 {
        self.team_size
    }

    /// The wire form: magic, version, kind, size, alignment, team size (all
    /// little-endian), the driver's 64 bytes, then a 64-bit FNV-1a checksum
    /// of all that, so that bytes damaged on the way are refused before they
    /// reach the driver or the typed checks. [`WIRE_LEN`](Self::WIRE_LEN) bytes. (A checksum,
    /// not a signature: the driver still validates the handle itself, R9.4.)
    pub fn to_bytes(&self) -> [u8; WIRE_LEN] {
        let mut out = [0u8; WIRE_LEN];
        out[..4].copy_from_slice(MAGIC);
        out[4] = 1;
        out[5] = K::WIRE;
        out[6..14].copy_from_slice(&self.size.to_le_bytes());
        out[14..22].copy_from_slice(&self.align.to_le_bytes());
        out[22..26].copy_from_slice(&self.team_size.to_le_bytes());
        out[26..SUM_AT].copy_from_slice(&self.data);
        let sum = fnv1a(&out[..SUM_AT]);
        out[SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        out
    }
}

// `from_bytes` is bound at the method, not the block: naming a kind without
// fabric handles is then `CanExport`'s own message (E0277), not E0599's
// "method exists but its trait bounds were not satisfied".
impl<K> FabricHandle<K> {
    /// Reads the wire form back, checking its shape and kind.
    ///
    /// Name the kind the exporter had, `Exportable` included: what
    /// [`team::multicast`](crate::team::multicast) shares is a
    /// `SpreadTeam<Exportable>`, what `Spec::unicast(..).exportable()` makes
    /// a `Unicast<Exportable>`. Importing one by hand:
    ///
    /// ```
    /// use std::time::Duration;
    /// use cuda_endpoints::{Context, Exportable, FabricHandle, Spec, SpreadTeam};
    ///
    /// let (ctx, model) = Context::model(Default::default());
    /// // The creating rank: an exportable team of 2, its handle as bytes.
    /// let team = ctx.reserve_one()?.create(Spec::spread(2, 2 << 20).exportable())?;
    /// let bytes = team.export()?.to_bytes();                 // send them to the other rank
    /// let team = team.add_device(0)?;
    ///
    /// // The other rank (another process): the bytes back as a typed handle.
    /// let other = Context::new(model.spawn_process());
    /// let handle = FabricHandle::<SpreadTeam<Exportable>>::from_bytes(&bytes)?;
    /// assert_eq!(handle.team_size(), 2);
    /// let imported = other.reserve_one()?.import(&handle)?.add_device(1)?;
    /// let (team, imported) = (team.wait(Duration::from_secs(1))?, imported.wait(Duration::from_secs(1))?);
    /// # drop((imported, team));
    /// # assert!(model.live_node().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # What the bytes are trusted for
    ///
    /// The kind tag, size, bind alignment and team size are the exporter's
    /// claims, under a checksum anyone can recompute, and no driver call
    /// reports an imported endpoint's kind or team size. What the driver
    /// can confirm is checked before the import
    /// ([`Endpoint::import`](crate::Endpoint::import)): a team's bind
    /// alignment and size against `cuLogicalEndpointGetLimits`, a unicast
    /// endpoint's size against the largest `maxSize` of this process's
    /// devices (R10). The kind is not: "a `get` from a multicast endpoint
    /// does not compile" ([`CanGet`](crate::CanGet), F1) holds for handles
    /// of honest exporters. A peer that tags a multicast endpoint's handle
    /// as unicast gives this process a typed unicast endpoint whose `get`
    /// reaches the driver, which refuses it (`CUDA_ERROR_INVALID_VALUE`; the
    /// reference model logs the F1 violation and moves no byte). The
    /// team bring-ups ([`crate::team`]) check each peer's claims against
    /// what the ranks agreed (size, team size, counted operations, the bind
    /// alignment against this driver) and that every rank imported the
    /// same bytes (a digest of the peer-to-id table, R13.4): that catches a
    /// bootstrap that delivers different bytes to different ranks, not a
    /// rank that tells every rank the same lie. See the guide's
    /// [security chapter](crate::guide::security).
    ///
    /// # Errors
    /// [`Error::BadHandle`] for bytes of the wrong length, magic, version or
    /// kind. Whether the driver accepts the handle is for `import` to say (R9.4).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self>
    where
        K: CanExport,
    {
        let bad = |reason: String| Error::BadHandle {
            expected: K::NAME,
            reason,
        };
        let b: &[u8; WIRE_LEN] = bytes
            .try_into()
            .map_err(|_| bad(format!("{} bytes, expected {WIRE_LEN}", bytes.len())))?;
        if &b[..4] != MAGIC || b[4] != 1 {
            return Err(bad(
                "not a cuda-endpoints fabric handle (magic/version)".into()
            ));
        }
        if K::WIRE == 0 || b[5] != K::WIRE {
            return Err(bad(format!(
                "kind tag {} is another kind of endpoint",
                b[5]
            )));
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut t = [0u8; 4];
        t.copy_from_slice(&b[22..26]);
        let mut data = [0u8; 64];
        data.copy_from_slice(&b[26..SUM_AT]);
        if b[SUM_AT..] != fnv1a(&b[..SUM_AT]).to_le_bytes() {
            return Err(bad(
                "checksum mismatch: the bytes were damaged on the way".into()
            ));
        }
        let (size, align, team) = (u64_at(6), u64_at(14), u32::from_le_bytes(t));
        if size == 0 || !align.is_power_of_two() || !size.is_multiple_of(align) || team == 0 {
            return Err(bad(format!(
                "size {size}, alignment {align}, team {team} are not a valid endpoint"
            )));
        }
        Ok(FabricHandle::new(data, size, align, team))
    }
}

/// On the wire a handle is its [`FabricHandle::to_bytes`] form, as bytes.
///
/// Available with the crate feature `serde`.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<K: CanExport> serde::Serialize for FabricHandle<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

/// Reads the [`FabricHandle::to_bytes`] form with the checks of
/// [`FabricHandle::from_bytes`].
///
/// Available with the crate feature `serde`.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de, K: CanExport> serde::Deserialize<'de> for FabricHandle<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let bytes: Vec<u8> = serde::Deserialize::deserialize(d)?;
        FabricHandle::from_bytes(&bytes).map_err(serde::de::Error::custom)
    }
}

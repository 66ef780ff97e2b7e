//! The domain types the [`Driver`](super::Driver) boundary speaks: what C
//! passes as structs (`CUlogicalEndpointProp`, `CUmemAllocationProp`,
//! `CUlogicalEndpointFabricHandle`, `CUmemAccessDesc` lists) as owned Rust
//! values that every backend reads directly. Only the real backend
//! (`driver::cuda`) turns them into C.
//!
//! Every type here is owned, `Clone` and `Debug`, and with the `serde`
//! feature `Serialize + Deserialize`, so that a call can cross a process
//! boundary as it is.

use std::fmt;

/// A CUDA device ordinal (`CUdevice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Device(pub i32);

impl Device {
    /// The ordinal as the driver sees it.
    pub fn ordinal(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

impl From<i32> for Device {
    fn from(v: i32) -> Self {
        Device(v)
    }
}

/// The step of making a context current that a backend takes before a
/// call (the real driver's primary contexts), named by its `cuda.h` entry
/// point, so that an error says which of them failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ContextStep {
    /// `cuDevicePrimaryCtxRetain`: the device's primary context could not be had.
    PrimaryCtxRetain,
    /// `cuCtxGetCurrent`: the thread's current context could not be read.
    CtxGetCurrent,
    /// `cuCtxSetCurrent`: the context could not be made current.
    CtxSetCurrent,
}

impl ContextStep {
    /// The `cuda.h` entry point.
    pub fn name(self) -> &'static str {
        match self {
            ContextStep::PrimaryCtxRetain => "cuDevicePrimaryCtxRetain",
            ContextStep::CtxGetCurrent => "cuCtxGetCurrent",
            ContextStep::CtxSetCurrent => "cuCtxSetCurrent",
        }
    }
}

impl fmt::Display for ContextStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure of the context step before a call, not of the call: the call
/// itself was never made ([`Code::in_context`](crate::Code::in_context)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContextFailure {
    /// The entry point that failed.
    pub step: ContextStep,
    /// The device whose context it was for (`None`: reading the thread's
    /// current context, before any device was chosen, or making a stream's
    /// own context current, which names the stream, not a device).
    pub device: Option<Device>,
}

/// Where a VMM allocation lives (`CUmemLocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Location {
    /// Device memory on this device (`CU_MEM_LOCATION_TYPE_DEVICE`).
    Device(Device),
    /// Host memory on this NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`).
    HostNuma(i32),
}

/// Shareable handle types of a VMM allocation, as the bits of
/// `CUmemAllocationHandleType` (`POSIX_FILE_DESCRIPTOR = 1`, `FABRIC = 8`).
pub mod handle_bits {
    /// No shareable handle.
    pub const NONE: u32 = 0;
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
    pub const POSIX_FD: u32 = 1;
    /// `CU_MEM_HANDLE_TYPE_FABRIC`.
    pub const FABRIC: u32 = 8;
}

/// The kind of a shareable handle of a VMM allocation or classic multicast
/// object (`CUmemAllocationHandleType`, C5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ShareableKind {
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: within a node only (R12.4).
    PosixFd,
    /// `CU_MEM_HANDLE_TYPE_FABRIC`: across the nodes of the fabric, for
    /// processes with an IMEX channel (R12.4).
    Fabric,
}

impl ShareableKind {
    /// The bit of [`handle_bits`] for this kind.
    pub fn bit(self) -> u32 {
        match self {
            ShareableKind::PosixFd => handle_bits::POSIX_FD,
            ShareableKind::Fabric => handle_bits::FABRIC,
        }
    }
}

/// A shareable handle as `cuMemExportToShareableHandle` writes it and
/// `cuMemImportFromShareableHandle` reads it (C5).
///
/// A `PosixFd` is a raw descriptor number of the process that holds it:
/// the exporter owns the descriptor it gets (and must close it); an
/// importer passes a descriptor it keeps open for the call. The typed API
/// turns it into an `OwnedFd` at once. Fabric bytes mean something only to
/// the driver that wrote them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ShareableHandle {
    /// A POSIX file descriptor (`int`).
    PosixFd(i32),
    /// The 64 bytes of a `CUmemFabricHandle`.
    Fabric(FabricHandleBytes),
}

impl ShareableHandle {
    /// Which kind of handle this is.
    pub fn kind(&self) -> ShareableKind {
        match self {
            ShareableHandle::PosixFd(_) => ShareableKind::PosixFd,
            ShareableHandle::Fabric(_) => ShareableKind::Fabric,
        }
    }
}

/// What `cuMemCreate` is asked for: a pinned allocation at `location` with the
/// shareable handle types `handle_types` (bits of [`handle_bits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AllocationRequest {
    /// Where the memory lives.
    pub location: Location,
    /// Bitmask of [`handle_bits`].
    pub handle_types: u32,
}

/// `CUmemAllocationGranularity_flags` (and the multicast granularity flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Granularity {
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`: the least size and alignment accepted.
    Minimum,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`: the one that performs best.
    Recommended,
}

/// `cuLogicalEndpointGetLimits` answer (SPEC R10), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Limits {
    /// Every bind offset, size and memory offset is a multiple of this (R5.3).
    pub bind_alignment: u64,
    /// The largest per-device `size` an endpoint with these properties may have (R2.3).
    pub max_size: u64,
}

/// Device attributes the library reads (`CUdevice_attribute` numbers).
pub mod attr {
    /// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
    pub const PCI_BUS_ID: i32 = 33;
    /// `CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID`.
    pub const PCI_DEVICE_ID: i32 = 34;
    /// `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`.
    pub const PCI_DOMAIN_ID: i32 = 50;
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`.
    pub const FABRIC_SUPPORTED: i32 = 128;
    /// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` (SPEC C6).
    pub const MULTICAST_SUPPORTED: i32 = 132;
    /// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID` (SPEC R5.5).
    pub const HOST_NUMA_ID: i32 = 134;
    /// `CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_UNICAST_SUPPORTED`.
    pub const LE_UNICAST: i32 = 153;
    /// `CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_MULTICAST_SUPPORTED`.
    pub const LE_MULTICAST: i32 = 154;
    /// `CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_COUNTED_OPS_SUPPORTED` (SPEC R2.4).
    pub const LE_COUNTED_OPS: i32 = 155;
    /// `CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_UNICAST_ACCESS_ON_OWNER_DEVICE_SUPPORTED`.
    pub const LE_UNICAST_OWNER_ACCESS: i32 = 156;
    /// `CU_DEVICE_ATTRIBUTE_LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES` (CUDA 13.5+).
    pub const LE_SUPPORTED_HANDLE_TYPES: i32 = 158;
    /// The FABRIC bit of attribute 158's bitmask
    /// (`CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC`).
    pub const LE_IPC_FABRIC: i32 = 1;
}

/// The first driver version (`cuDriverGetVersion`) with logical endpoints.
pub const LOGICAL_ENDPOINT_MIN_VERSION: i32 = 13030;

/// The endpoint type and its union member (SPEC R2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Shape {
    /// `UNICAST` with `unicast.device` as the owner device.
    Unicast {
        /// The owner device.
        owner: Device,
    },
    /// `MULTICAST` with `multicast.numDevices` as the team size.
    Multicast {
        /// The team size.
        num_devices: u32,
    },
}

/// The properties of a logical endpoint (`CUlogicalEndpointProp`, SPEC R2):
/// built once by the typed API, read as they are by every backend.
///
/// The C bitmasks become booleans: `ipcHandleTypes` has one bit (`FABRIC`)
/// and `flags` one (`COUNTED_OPS`) in 13.3–13.5 (R2.4), so an unknown bit
/// cannot be asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EndpointProps {
    /// Unicast or multicast, with the union member.
    pub shape: Shape,
    /// Bytes that can be bound per device (R2.3).
    pub size: u64,
    /// `FABRIC` in `ipcHandleTypes`: the endpoint can be exported (R8.1) and
    /// binds only shareable memory (R5.6).
    pub ipc_fabric: bool,
    /// `COUNTED_OPS` in `flags` (R2.4).
    pub counted_ops: bool,
}

impl EndpointProps {
    /// Plain properties: `size` bytes, no IPC, no flags.
    pub fn new(shape: Shape, size: u64) -> EndpointProps {
        EndpointProps {
            shape,
            size,
            ipc_fabric: false,
            counted_ops: false,
        }
    }

    /// Whether `FABRIC` is among the IPC handle types (R8.1).
    pub fn exportable(&self) -> bool {
        self.ipc_fabric
    }
}

/// The 64 opaque bytes of a `CUlogicalEndpointFabricHandle` (R8, R9) or of
/// a `CUmemFabricHandle` (C5), as the driver wrote them. What they mean is the driver's business; the typed
/// `cuda_endpoints::FabricHandle` adds the metadata needed to import
/// them safely.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FabricHandleBytes(pub [u8; 64]);

impl FabricHandleBytes {
    /// All zero: what an export writes into.
    pub const ZERO: FabricHandleBytes = FabricHandleBytes([0; 64]);

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

impl Default for FabricHandleBytes {
    fn default() -> Self {
        FabricHandleBytes::ZERO
    }
}

impl fmt::Debug for FabricHandleBytes {
    /// The checksum, not 64 bytes of noise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FabricHandleBytes(fnv1a={:#018x})", fnv1a(&self.0))
    }
}

impl From<[u8; 64]> for FabricHandleBytes {
    fn from(b: [u8; 64]) -> Self {
        FabricHandleBytes(b)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for FabricHandleBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for FabricHandleBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FabricHandleBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 bytes of a logical-endpoint fabric handle")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                <[u8; 64]>::try_from(v)
                    .map(FabricHandleBytes)
                    .map_err(|_| E::invalid_length(v.len(), &self))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = [0u8; 64];
                for (i, b) in out.iter_mut().enumerate() {
                    *b = seq
                        .next_element()?
                        .ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
                }
                if seq.next_element::<u8>()?.is_some() {
                    return Err(serde::de::Error::invalid_length(65, &self));
                }
                Ok(FabricHandleBytes(out))
            }
        }
        d.deserialize_bytes(V)
    }
}

/// 64-bit FNV-1a, the crate's one non-cryptographic hash: the checksum of a
/// fabric handle's wire form, the model's handle check (R9.4) and the digest
/// a team's ranks compare. A checksum against damage, not a signature.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn fabric_handle_bytes_round_trip_through_json() {
        let mut b = [0u8; 64];
        b[3] = 7;
        b[63] = 255;
        let h = FabricHandleBytes(b);
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<FabricHandleBytes>(&json).unwrap(), h);
        assert!(serde_json::from_str::<FabricHandleBytes>("[1,2,3]").is_err());
    }

    #[test]
    fn props_round_trip_through_json() {
        let p = EndpointProps {
            ipc_fabric: true,
            ..EndpointProps::new(Shape::Multicast { num_devices: 4 }, 2 << 20)
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<EndpointProps>(&json).unwrap(), p);
    }
}

//! Marshalling of `CUlogicalEndpointProp` (SPEC "Types"): built once here for
//! every backend, and decoded here by the backends that are not the real
//! driver (the model, the classic fallback).

use super::{Device, sys};

/// `CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC` as a bit of `ipcHandleTypes`.
pub const IPC_FABRIC: u32 = 1;
/// `CU_LOGICAL_ENDPOINT_FLAG_COUNTED_OPS`.
pub const FLAG_COUNTED_OPS: u32 = 1;

/// The endpoint type and its union member (SPEC R2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// The decoded content of a `CUlogicalEndpointProp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Props {
    /// Unicast or multicast, with the union member.
    pub shape: Shape,
    /// Bytes that can be bound per device (R2.3).
    pub size: u64,
    /// Bitmask of `IPC_*` (R2.4).
    pub ipc_handle_types: u32,
    /// Bitmask of `FLAG_*` (R2.4).
    pub flags: u32,
}

impl Props {
    /// Builds the C struct: zeroed first, then fields set (cudarc's struct
    /// layouts vary with the CUDA feature; zeroing keeps padding defined).
    pub fn to_c(&self) -> sys::CUlogicalEndpointProp {
        // SAFETY: a plain-old-data C struct; all-zero is a valid value
        // (`type_ = INVALID`, union zero).
        let mut p: sys::CUlogicalEndpointProp = unsafe { std::mem::zeroed() };
        match self.shape {
            Shape::Unicast { owner } => {
                p.type_ = sys::CUlogicalEndpointType::CU_LOGICAL_ENDPOINT_TYPE_UNICAST;
                p.__bindgen_anon_1.unicast.device = owner.0;
            }
            Shape::Multicast { num_devices } => {
                p.type_ = sys::CUlogicalEndpointType::CU_LOGICAL_ENDPOINT_TYPE_MULTICAST;
                p.__bindgen_anon_1.multicast.numDevices = num_devices;
            }
        }
        p.size = self.size;
        p.ipcHandleTypes = self.ipc_handle_types;
        p.flags = self.flags;
        p
    }

    /// Decodes a C struct; `None` when `type` is not `UNICAST` or `MULTICAST`.
    ///
    /// The `type_` field is read as its raw `u32` so that a value outside the
    /// Rust enum (from foreign code) is never materialised as the enum.
    pub fn from_c(p: &sys::CUlogicalEndpointProp) -> Option<Props> {
        // SAFETY: `CUlogicalEndpointType` is a `#[repr(u32)]` field at offset 0;
        // reading its bytes as `u32` is always defined.
        let raw_type = unsafe { std::ptr::read((&raw const p.type_).cast::<u32>()) };
        // SAFETY: both union members are a 4-byte integer at the same offset.
        let word = unsafe { p.__bindgen_anon_1.multicast.numDevices };
        let shape = match raw_type {
            1 => Shape::Unicast {
                owner: Device(word as i32),
            },
            2 => Shape::Multicast { num_devices: word },
            _ => return None,
        };
        Some(Props {
            shape,
            size: p.size,
            ipc_handle_types: p.ipcHandleTypes,
            flags: p.flags,
        })
    }

    /// Whether `FABRIC` is among the IPC handle types (R8.1).
    pub fn exportable(&self) -> bool {
        self.ipc_handle_types & IPC_FABRIC != 0
    }
}

/// A zeroed fabric handle buffer (64 opaque bytes).
pub fn empty_fabric_handle() -> sys::CUlogicalEndpointFabricHandle {
    sys::CUlogicalEndpointFabricHandle { data: [0; 64] }
}

/// 64-bit FNV-1a over fabric-handle bytes: the wire form's checksum and the
/// model's handle check (R9.4). A checksum against damage, not a signature.
pub fn fabric_checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The `FABRIC` IPC handle type enum value.
pub fn fabric_handle_type() -> sys::CUlogicalEndpointIpcHandleType {
    sys::CUlogicalEndpointIpcHandleType::CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use static_assertions::const_assert_eq;

    // SPEC "Types": 24 bytes, `size` at 8, `ipcHandleTypes` at 16, `flags` at 20.
    const_assert_eq!(std::mem::size_of::<sys::CUlogicalEndpointProp>(), 24);
    const_assert_eq!(std::mem::offset_of!(sys::CUlogicalEndpointProp, size), 8);
    const_assert_eq!(
        std::mem::offset_of!(sys::CUlogicalEndpointProp, ipcHandleTypes),
        16
    );
    const_assert_eq!(std::mem::offset_of!(sys::CUlogicalEndpointProp, flags), 20);
    const_assert_eq!(
        std::mem::size_of::<sys::CUlogicalEndpointFabricHandle>(),
        64
    );

    #[test]
    fn round_trip() {
        for shape in [
            Shape::Unicast { owner: Device(3) },
            Shape::Multicast { num_devices: 4 },
        ] {
            let p = Props {
                shape,
                size: 1 << 21,
                ipc_handle_types: IPC_FABRIC,
                flags: FLAG_COUNTED_OPS,
            };
            assert_eq!(Props::from_c(&p.to_c()), Some(p));
        }
    }
}

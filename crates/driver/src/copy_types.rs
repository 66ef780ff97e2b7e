//! The domain types of the data path at the driver boundary: where a
//! pointer operand lives ([`MemHint`]), a pointer with its hint
//! ([`Pointer`]), the two operand kinds of `cuFabricCpyBatchAsync`
//! ([`Operand`], SPEC F1), one copy of a batch ([`CopyOp`]), and one
//! pointer-to-pointer copy of `cuMemcpyBatchAsync` ([`MemcpyOp`]). The
//! lists of them a batch call takes are in `op_list` ([`super::CopyOps`],
//! [`super::MemcpyOps`]).
//!
//! Streams cross the boundary as plain `u64` handles (`CUstream`), as
//! allocation handles do; `0` is the legacy NULL stream, which no fabric
//! copy may use (F6) and which `cuStreamCreate` never returns.
//!
//! Owned, `Clone + Debug`, and with the `serde` feature serialisable, like
//! every type of [`super::types`]: only the real backend
//! (`driver::cuda`) turns them into `CUfabricCpyOperand` /
//! `CUDA_FABRIC_COPY_BATCH_OP`.

/// Where the memory behind a [`Pointer`] lives, as far as the caller says
/// (`CUfabricCpyOperand::op::ptr::locHint`, a `CUmemLocation`).
///
/// The real driver reads the hint only for managed or pageable memory.
/// The reference model reads it as the caller's word: a pointer that is
/// not a mapping of the process is host memory only when hinted
/// [`MemHint::Host`] (and then the model reads or writes it through the
/// address, as the driver would); any other unmapped pointer is refused
/// (F2), never dereferenced.
///
/// Laid out as `#[repr(u32)]` (its tag first, `None` = 0), as [`CopyOp`]
/// says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u32)]
pub enum MemHint {
    /// No hint (`CU_MEM_LOCATION_TYPE_INVALID`).
    None = 0,
    /// Device memory of this device (`CU_MEM_LOCATION_TYPE_DEVICE`).
    Device(super::Device),
    /// Host memory of the calling process (`CU_MEM_LOCATION_TYPE_HOST`).
    Host,
    /// Host memory on this NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`).
    HostNuma(i32),
}

/// A pointer operand: a device (or host) address and where it lives.
/// `#[repr(C)]`, as [`CopyOp`] says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(C)]
pub struct Pointer {
    /// The address (`CUdeviceptr`; for host memory the host address).
    pub ptr: u64,
    /// Where it lives (`locHint`).
    pub hint: MemHint,
}

impl Pointer {
    /// Device (or mapped host-NUMA) memory at `ptr`, no hint.
    pub fn device(ptr: u64) -> Pointer {
        Pointer {
            ptr,
            hint: MemHint::None,
        }
    }

    /// Host memory of this process at `ptr`.
    pub fn host(ptr: u64) -> Pointer {
        Pointer {
            ptr,
            hint: MemHint::Host,
        }
    }
}

/// One operand of a fabric copy (`CUfabricCpyOperand`, SPEC F1).
/// `#[repr(u32)]` (`Pointer` = 0, `LogicalEndpoint` = 1), as [`CopyOp`]
/// says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u32)]
pub enum Operand {
    /// `CU_FABRIC_COPY_OPERAND_TYPE_POINTER`.
    Pointer(Pointer) = 0,
    /// `CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT`: `offset` bytes into
    /// the endpoint on `id`.
    LogicalEndpoint {
        /// The logical-endpoint id (of the calling process).
        id: u32,
        /// Byte offset into the endpoint range.
        offset: u64,
    } = 1,
}

impl Operand {
    /// Whether this names an endpoint.
    pub fn is_endpoint(&self) -> bool {
        matches!(self, Operand::LogicalEndpoint { .. })
    }
}

/// One copy of a fabric copy batch (`CUDA_FABRIC_COPY_BATCH_OP`): `size`
/// bytes from `src` to `dst`. The per-op `flags` member is always 0 (F5):
/// it is not a field here, so it cannot be set to anything else.
///
/// Its layout is fixed (`#[repr(C)]`, of the `#[repr(C)]` [`Pointer`] and
/// the `#[repr(u32)]` [`Operand`] and [`MemHint`], whose layouts the Rust
/// reference defines): 56 bytes, `src` at 0, `dst` at 24, `size` at 48.
/// The data path writes a put's op into its list as words
/// (`cuda_endpoints`' `copy/op_words.rs`), which needs to know where each
/// field is; it leaves padding as padding (bytes 40..48, past a
/// `LogicalEndpoint` destination's offset, unwritten), so a `CopyOp` is
/// read field by field, never as raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(C)]
pub struct CopyOp {
    /// Where the bytes come from.
    pub src: Operand,
    /// Where they go.
    pub dst: Operand,
    /// Bytes; 0 is a no-op whose operands are still validated (F5).
    pub size: u64,
}

/// One copy of `cuMemcpyBatchAsync`: `size` bytes from `src` to `dst`,
/// both pointers (the portable path's copies through windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemcpyOp {
    /// Where the bytes go.
    pub dst: Pointer,
    /// Where they come from.
    pub src: Pointer,
    /// Bytes.
    pub size: u64,
}

/// The first driver version (`cuDriverGetVersion`) with `cuMemcpyBatchAsync`
/// (CUDA 12.8; the real backend binds the 13.0 prototype,
/// `cuMemcpyBatchAsync_v2`, and answers `NOT_SUPPORTED` on a driver that
/// does not export it).
pub const MEMCPY_BATCH_MIN_VERSION: i32 = 12080;

/// The first driver version (`cuDriverGetVersion`) with `cuFabricCpyBatchAsync` (F7).
pub const FABRIC_COPY_MIN_VERSION: i32 = 13050;

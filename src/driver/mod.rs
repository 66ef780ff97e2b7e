//! The driver boundary: one object-safe trait, [`Driver`], with the
//! logical-endpoint entry points of `cuda.h` 13.3 (SPEC R1–R10), the base calls
//! the library needs, the VMM calls that make bind targets, and the classic
//! `cuMulticast*` calls (SPEC C1–C6).
//!
//! Layers: `cudarc::driver::sys` (C ABI) → a [`Driver`] implementation
//! ([`cuda::Cuda`], the reference [`crate::model::Model`], the classic fallback
//! [`classic::Classic`], the call recorder [`trace::Traced`]) → the typed API.
//! The typed API only ever talks to `dyn Driver`. Wrappers stack: a
//! `Classic` over a `Traced` over `Cuda` records exactly what reached the real
//! driver. `Arc<D>` is a [`Driver`] whenever `D` is, so one backend can be
//! shared by several wrappers.
//!
//! The logical-endpoint methods take the C structs themselves
//! (`CUlogicalEndpointProp`, `CUlogicalEndpointFabricHandle`), built once by
//! [`prop`], so the same marshalling runs for every backend and only the final
//! call differs.

pub mod classic;
pub mod code;
pub mod cuda;
pub mod prop;
pub mod trace;

use std::fmt;

pub use classic::Classic;
pub use code::{Call, Code, DriverResult};
pub use cudarc::driver::sys;
pub use trace::{TraceEntry, Traced};

/// A CUDA device ordinal (`CUdevice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// Where a VMM allocation lives (`CUmemLocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// What `cuMemCreate` is asked for: a pinned allocation at `location` with the
/// shareable handle types `handle_types` (bits of [`handle_bits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationRequest {
    /// Where the memory lives.
    pub location: Location,
    /// Bitmask of [`handle_bits`].
    pub handle_types: u32,
}

/// `CUmemAllocationGranularity_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`: the least size and alignment accepted.
    Minimum,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`: the one that performs best.
    Recommended,
}

/// `cuLogicalEndpointGetLimits` answer (SPEC R10), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Every bind offset, size and memory offset is a multiple of this (R5.3).
    pub bind_alignment: u64,
    /// The largest per-device `size` an endpoint with these properties may have (R2.3).
    pub max_size: u64,
}

/// Device attributes the library reads (`CUdevice_attribute` numbers).
pub mod attr {
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
}

/// The first driver version (`cuDriverGetVersion`) with logical endpoints.
pub const LOGICAL_ENDPOINT_MIN_VERSION: i32 = 13030;

/// The driver entry points the library uses, one method per C function.
///
/// Every method returns `Err(code)` exactly when the C function would return a
/// code other than `CUDA_SUCCESS`; implementations never panic. Pointers and
/// handles are plain integers (`CUdeviceptr`, `CUmemGenericAllocationHandle`).
pub trait Driver: Send + Sync + fmt::Debug {
    /// A short name for reports: `"model"`, `"cuda"`, `"classic(cuda)"`.
    fn name(&self) -> String;

    // ---- base calls ----
    /// `cuDriverGetVersion`, e.g. `13030` for 13.3.
    fn driver_version(&self) -> DriverResult<i32>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DriverResult<i32>;
    /// `cuDeviceGetAttribute(attr, dev)`; `attr` is the raw attribute number.
    fn device_attribute(&self, dev: Device, attr: i32) -> DriverResult<i32>;
    /// `cuMemGetInfo` on `dev`'s primary context: `(free, total)` bytes.
    fn mem_get_info(&self, dev: Device) -> DriverResult<(u64, u64)>;
    /// Why this backend answers `call` with `CUDA_ERROR_NOT_SUPPORTED`, in
    /// words, when the reason is the backend's own (e.g. the classic fallback
    /// has no unicast endpoint). `None`: the driver's answer speaks for itself.
    fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
        let _ = call;
        None
    }

    /// The id of `dev`'s multicast logical-endpoint clique
    /// (`cuDeviceGetCliqueInfo`, type `CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT`,
    /// CUDA 13.4+; SPEC R4.5): devices of one clique can share a multicast team.
    ///
    /// The default answers `CUDA_ERROR_NOT_SUPPORTED` (a backend that cannot
    /// tell); the reference model returns its configured clique; the real
    /// driver `NOT_SUPPORTED` before 13.4 and `NOT_FOUND` for a device in no
    /// such clique.
    fn device_clique(&self, dev: Device) -> DriverResult<u32> {
        let _ = dev;
        Err(Code::NOT_SUPPORTED)
    }

    // ---- logical endpoints (SPEC R1-R10) ----
    /// `cuLogicalEndpointIdReserve(&base, count)` (R1).
    fn id_reserve(&self, count: u32) -> DriverResult<u32>;
    /// `cuLogicalEndpointIdRelease(base, count)` (R1).
    fn id_release(&self, base: u32, count: u32) -> DriverResult<()>;
    /// `cuLogicalEndpointGetLimits(&align, &max, prop)` (R10).
    fn get_limits(&self, prop: &sys::CUlogicalEndpointProp) -> DriverResult<Limits>;
    /// `cuLogicalEndpointCreate(id, prop)` (R2).
    fn create(&self, id: u32, prop: &sys::CUlogicalEndpointProp) -> DriverResult<()>;
    /// `cuLogicalEndpointAddDevice(id, dev)` (R4).
    fn add_device(&self, id: u32, dev: Device) -> DriverResult<()>;
    /// `cuLogicalEndpointQuery(base, count, &status)` (R3): `true` when every
    /// endpoint in `[base, base+count)` is constructed.
    fn query(&self, base: u32, count: u32) -> DriverResult<bool>;
    /// `cuLogicalEndpointBindMem(id, dev, offset, mem, mem_offset, size, flags)` (R5).
    #[allow(clippy::too_many_arguments)]
    fn bind_mem(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()>;
    /// `cuLogicalEndpointBindAddr(id, dev, offset, ptr, size, flags)` (R5).
    fn bind_addr(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        ptr: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()>;
    /// `cuLogicalEndpointUnbind(id, dev, offset, size)` (R6).
    fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()>;
    /// `cuLogicalEndpointDestroy(id)` (R7).
    fn destroy(&self, id: u32) -> DriverResult<()>;
    /// `cuLogicalEndpointExport(&handle, id, handle_type)` (R8).
    fn export(
        &self,
        id: u32,
        handle: &mut sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()>;
    /// `cuLogicalEndpointImport(id, &handle, handle_type)` (R9).
    fn import(
        &self,
        id: u32,
        handle: &sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()>;

    // ---- VMM: the memory that gets bound ----
    /// `cuMemGetAllocationGranularity` for `req`.
    fn mem_granularity(&self, req: &AllocationRequest, kind: Granularity) -> DriverResult<u64>;
    /// `cuMemCreate(&handle, size, prop)`.
    fn mem_create(&self, size: u64, req: &AllocationRequest) -> DriverResult<u64>;
    /// `cuMemRelease(handle)`: allocations and classic multicast objects (C5).
    fn mem_release(&self, handle: u64) -> DriverResult<()>;
    /// `cuMemGetAllocationPropertiesFromHandle`: where the memory lives (R5.5).
    fn mem_properties(&self, handle: u64) -> DriverResult<AllocationRequest>;
    /// `cuMemAddressReserve(&ptr, size, alignment, 0, 0)`.
    fn mem_address_reserve(&self, size: u64, alignment: u64) -> DriverResult<u64>;
    /// `cuMemAddressFree(ptr, size)`.
    fn mem_address_free(&self, ptr: u64, size: u64) -> DriverResult<()>;
    /// `cuMemMap(ptr, size, offset, handle, 0)`.
    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> DriverResult<()>;
    /// `cuMemUnmap(ptr, size)`.
    fn mem_unmap(&self, ptr: u64, size: u64) -> DriverResult<()>;
    /// `cuMemSetAccess(ptr, size, [{device dev, READWRITE}])` for each device.
    fn mem_set_access(&self, ptr: u64, size: u64, devices: &[Device]) -> DriverResult<()>;

    // ---- classic multicast (SPEC C1-C6) ----
    /// `cuMulticastGetGranularity` for a team of `num_devices` (C2).
    fn multicast_granularity(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64>;
    /// `cuMulticastCreate(&handle, {num_devices, size, handle_types, flags: 0})` (C1).
    fn multicast_create(&self, num_devices: u32, size: u64, handle_types: u64)
    -> DriverResult<u64>;
    /// `cuMulticastAddDevice(mc, dev)` (C3).
    fn multicast_add_device(&self, mc: u64, dev: Device) -> DriverResult<()>;
    /// `cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, 0)`.
    fn multicast_bind_mem(
        &self,
        mc: u64,
        mc_offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
    ) -> DriverResult<()>;
    /// `cuMulticastBindAddr(mc, mc_offset, ptr, size, 0)`.
    fn multicast_bind_addr(&self, mc: u64, mc_offset: u64, ptr: u64, size: u64)
    -> DriverResult<()>;
    /// `cuMulticastUnbind(mc, dev, mc_offset, size)` (C4).
    fn multicast_unbind(&self, mc: u64, dev: Device, mc_offset: u64, size: u64)
    -> DriverResult<()>;
}

//! Domain types to C and back, and one function per driver call that makes
//! the C call: which entry point, which context, which out-parameters.
//!
//! The generated `impl Driver for Cuda` (in `mod.rs`) forwards each table
//! row to the function of the same name here; [`Cuda::run`] does the rest
//! (policy, presence, context, tracing, result code).
//!
//! Every function here is `unsafe` with the contract of the `Driver` method
//! of the same name: the caller upholds it, the body only adds valid
//! pointers and initialised C structs.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;

use super::Cuda;
use super::context::Cx;
use super::ffi::*;
use crate::driver::{
    AllocationRequest, Call, Code, Device, DriverResult, EndpointProps, FabricHandleBytes,
    Granularity, Limits, Location, Shape, ShareableHandle, ShareableKind,
};

/// `u64` → `size_t`. Saturates (CUDA is 64-bit only): an oversized value is
/// then rejected by the driver instead of silently truncated.
pub(super) fn sz(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// `CUlogicalEndpointProp`: every byte set, padding included.
pub(super) fn le_prop(props: &EndpointProps) -> CUlogicalEndpointProp {
    let (type_, target) = match props.shape {
        Shape::Unicast { owner } => (
            CU_LOGICAL_ENDPOINT_TYPE_UNICAST,
            CUlogicalEndpointTarget { device: owner.0 },
        ),
        Shape::Multicast { num_devices } => (
            CU_LOGICAL_ENDPOINT_TYPE_MULTICAST,
            CUlogicalEndpointTarget { num_devices },
        ),
    };
    CUlogicalEndpointProp {
        type_,
        target,
        size: props.size,
        ipcHandleTypes: if props.ipc_fabric {
            CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC
        } else {
            CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_NONE
        },
        flags: if props.counted_ops {
            CU_LOGICAL_ENDPOINT_FLAG_COUNTED_OPS
        } else {
            CU_LOGICAL_ENDPOINT_FLAG_NONE
        },
    }
}

pub(super) fn location(loc: Location) -> CUmemLocation {
    match loc {
        Location::Device(d) => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: d.0,
        },
        Location::HostNuma(n) => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
            id: n,
        },
    }
}

pub(super) fn alloc_prop(req: &AllocationRequest) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: req.handle_types,
        location: location(req.location),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: CUmemAllocFlags::default(),
    }
}

fn mc_prop(num_devices: u32, size: u64, handle_types: u64) -> CUmulticastObjectProp {
    CUmulticastObjectProp {
        numDevices: num_devices,
        size: sz(size),
        handleTypes: handle_types,
        flags: 0,
    }
}

fn alloc_granularity(kind: Granularity) -> CUmemAllocationGranularity_flags {
    match kind {
        Granularity::Minimum => CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        Granularity::Recommended => CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
    }
}

fn mc_granularity(kind: Granularity) -> CUmulticastGranularity_flags {
    match kind {
        Granularity::Minimum => CU_MULTICAST_GRANULARITY_MINIMUM,
        Granularity::Recommended => CU_MULTICAST_GRANULARITY_RECOMMENDED,
    }
}

/// VMM calls on device memory run in that device's context.
fn cx_for(loc: Location) -> Cx {
    match loc {
        Location::Device(d) => Cx::On(d),
        Location::HostNuma(_) => Cx::Current,
    }
}

/// Create and GetLimits name no device for a multicast endpoint and need
/// no context (see `context`); a unicast one names its owner, a device the
/// program uses, which is then where a retry goes.
fn owner_cx(props: &EndpointProps) -> Cx {
    match props.shape {
        Shape::Unicast { owner } => Cx::NoneNeeded(Some(owner)),
        Shape::Multicast { .. } => Cx::NoneNeeded(None),
    }
}

/// An attribute number as the C enum; a negative one cannot name an attribute.
fn attribute(attr: i32) -> DriverResult<CUdevice_attribute> {
    CUdevice_attribute::try_from(attr).map_err(|_| Code::INVALID_VALUE)
}

/// Calls that pass their arguments on as plain integers and return nothing:
/// `name(args) => Call, entry point, context, (C arguments)`.
macro_rules! plain_calls {
    ($($name:ident($($a:ident: $t:ty),*) => $call:ident, $sym:ident, $cx:expr, ($($c:expr),*);)*) => {$(
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn $name(c: &Cuda $(, $a: $t)*) -> DriverResult<()> {
            let f = c.sym.$sym;
            // SAFETY: `f` is the entry point of this name as declared in
            // `ffi`; every argument is a plain integer (or a device address
            // passed on and never dereferenced here).
            c.run(Call::$call, f, $cx, |f| unsafe { f($($c),*) })
        }
    )*};
}

plain_calls! {
    id_release(base: u32, count: u32) => IdRelease, cuLogicalEndpointIdRelease, Cx::NoneNeeded(None), (base, count);
    add_device(id: u32, dev: Device) => AddDevice, cuLogicalEndpointAddDevice, Cx::On(dev), (id, dev.0);
    bind_mem(id: u32, dev: Device, offset: u64, mem: u64, mem_offset: u64, size: u64, flags: u64)
        => BindMem, cuLogicalEndpointBindMem, Cx::On(dev), (id, dev.0, offset, mem, mem_offset, size, flags);
    bind_addr(id: u32, dev: Device, offset: u64, ptr: u64, size: u64, flags: u64)
        => BindAddr, cuLogicalEndpointBindAddr, Cx::On(dev), (id, dev.0, offset, ptr as *mut c_void, size, flags);
    unbind(id: u32, dev: Device, offset: u64, size: u64) => Unbind, cuLogicalEndpointUnbind, Cx::On(dev), (id, dev.0, offset, size);
    destroy(id: u32) => Destroy, cuLogicalEndpointDestroy, Cx::NoneNeeded(None), (id);
    mem_release(handle: u64) => MemRelease, cuMemRelease, Cx::Current, (handle);
    mem_address_free(ptr: u64, size: u64) => MemAddressFree, cuMemAddressFree, Cx::Current, (ptr, sz(size));
    mem_map(ptr: u64, size: u64, offset: u64, handle: u64) => MemMap, cuMemMap, Cx::Current, (ptr, sz(size), sz(offset), handle, 0);
    mem_unmap(ptr: u64, size: u64) => MemUnmap, cuMemUnmap, Cx::Current, (ptr, sz(size));
    multicast_add_device(mc: u64, dev: Device) => MulticastAddDevice, cuMulticastAddDevice, Cx::On(dev), (mc, dev.0);
    multicast_bind_mem(mc: u64, mc_offset: u64, mem: u64, mem_offset: u64, size: u64)
        => MulticastBindMem, cuMulticastBindMem, Cx::Current, (mc, sz(mc_offset), mem, sz(mem_offset), sz(size), 0);
    multicast_bind_addr(mc: u64, mc_offset: u64, ptr: u64, size: u64)
        => MulticastBindAddr, cuMulticastBindAddr, Cx::Current, (mc, sz(mc_offset), ptr, sz(size), 0);
    multicast_unbind(mc: u64, dev: Device, mc_offset: u64, size: u64)
        => MulticastUnbind, cuMulticastUnbind, Cx::On(dev), (mc, dev.0, sz(mc_offset), sz(size));
}

// ---- base calls ----

pub(super) unsafe fn driver_version(c: &Cuda) -> DriverResult<i32> {
    let mut v: c_int = 0;
    let f = c.sym.cuDriverGetVersion;
    // SAFETY: `f` is `cuDriverGetVersion`; `v` is a live out-pointer.
    c.run(Call::DriverGetVersion, f, Cx::Free, |f| unsafe {
        f(&mut v)
    })?;
    Ok(v)
}

pub(super) unsafe fn device_count(c: &Cuda) -> DriverResult<i32> {
    let mut n: c_int = 0;
    let f = c.sym.cuDeviceGetCount;
    // SAFETY: `f` is `cuDeviceGetCount`; `n` is a live out-pointer.
    c.run(Call::DeviceGetCount, f, Cx::Free, |f| unsafe { f(&mut n) })?;
    Ok(n)
}

pub(super) unsafe fn device_attribute(c: &Cuda, dev: Device, attr: i32) -> DriverResult<i32> {
    let a = attribute(attr)?;
    let mut v: c_int = 0;
    let f = c.sym.cuDeviceGetAttribute;
    // SAFETY: `f` is `cuDeviceGetAttribute` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::DeviceGetAttribute, f, Cx::Free, |f| unsafe {
        f(&mut v, a, dev.0)
    })?;
    Ok(v)
}

pub(super) unsafe fn mem_get_info(c: &Cuda, dev: Device) -> DriverResult<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    let f = c.sym.cuMemGetInfo_v2;
    // SAFETY: `f` is `cuMemGetInfo_v2` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::MemGetInfo, f, Cx::On(dev), |f| unsafe {
        f(&mut free, &mut total)
    })?;
    Ok((free as u64, total as u64))
}

/// `cuDeviceGetCliqueCount` + `cuDeviceGetCliqueInfo`: the multicast
/// logical-endpoint clique of `dev` (R4.5). `NOT_FOUND` for none.
pub(super) unsafe fn device_clique(c: &Cuda, dev: Device) -> DriverResult<u32> {
    let call = Call::DeviceGetCliqueInfo;
    let mut n: usize = 0;
    // SAFETY: `f` is `cuDeviceGetCliqueCount` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(call, c.sym.cuDeviceGetCliqueCount, Cx::Free, |f| unsafe {
        f(&mut n, dev.0)
    })?;
    // A bound on what a driver may claim, so the buffer stays small.
    let n = n.min(64);
    if n == 0 {
        return Err(Code::NOT_FOUND);
    }
    let mut infos = vec![CUcliqueInfo { type_: 0, id: 0 }; n];
    let mut written = n;
    let buf = infos.as_mut_ptr();
    // `buf` holds `written` writable entries and `written` says so on input.
    // SAFETY: `f` is `cuDeviceGetCliqueInfo` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(call, c.sym.cuDeviceGetCliqueInfo, Cx::Free, |f| unsafe {
        f(buf, &mut written, dev.0)
    })?;
    infos
        .iter()
        .take(written.min(n))
        .find(|i| i.type_ == CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT)
        .map(|i| i.id)
        .ok_or(Code::NOT_FOUND)
}

// ---- logical endpoints ----

pub(super) unsafe fn id_reserve(c: &Cuda, count: u32) -> DriverResult<u32> {
    let mut base = 0u32;
    let f = c.sym.cuLogicalEndpointIdReserve;
    // SAFETY: `f` is `cuLogicalEndpointIdReserve` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::IdReserve, f, Cx::NoneNeeded(None), |f| unsafe {
        f(&mut base, count)
    })?;
    Ok(base)
}

pub(super) unsafe fn get_limits(c: &Cuda, props: EndpointProps) -> DriverResult<Limits> {
    let prop = le_prop(&props);
    let (mut align, mut max) = (0u64, 0u64);
    let f = c.sym.cuLogicalEndpointGetLimits;
    // SAFETY: `f` is `cuLogicalEndpointGetLimits` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::GetLimits, f, owner_cx(&props), |f| unsafe {
        f(&mut align, &mut max, &prop)
    })?;
    Ok(Limits {
        bind_alignment: align,
        max_size: max,
    })
}

pub(super) unsafe fn create(c: &Cuda, id: u32, props: EndpointProps) -> DriverResult<()> {
    let prop = le_prop(&props);
    let f = c.sym.cuLogicalEndpointCreate;
    // SAFETY: `f` is `cuLogicalEndpointCreate` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::Create, f, owner_cx(&props), |f| unsafe {
        f(id, &prop)
    })
}

pub(super) unsafe fn query(c: &Cuda, base: u32, count: u32) -> DriverResult<bool> {
    let mut status: c_int = 0;
    let f = c.sym.cuLogicalEndpointQuery;
    // SAFETY: `f` is `cuLogicalEndpointQuery` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::Query, f, Cx::NoneNeeded(None), |f| unsafe {
        f(base, count, &mut status)
    })?;
    Ok(status != 0)
}

pub(super) unsafe fn export(c: &Cuda, id: u32) -> DriverResult<FabricHandleBytes> {
    let mut handle = CUlogicalEndpointFabricHandle { data: [0; 64] };
    let out: *mut c_void = (&raw mut handle).cast();
    let ty = CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC;
    // `out` is 64 writable bytes, the size the driver writes (R8).
    let f = c.sym.cuLogicalEndpointExport;
    // SAFETY: `f` is `cuLogicalEndpointExport` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::Export, f, Cx::NoneNeeded(None), |f| unsafe {
        f(out, id, ty)
    })?;
    Ok(FabricHandleBytes(handle.data))
}

pub(super) unsafe fn import(c: &Cuda, id: u32, handle: FabricHandleBytes) -> DriverResult<()> {
    let h = CUlogicalEndpointFabricHandle { data: handle.0 };
    let src: *const c_void = (&raw const h).cast();
    let ty = CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC;
    let f = c.sym.cuLogicalEndpointImport;
    // SAFETY: `f` is `cuLogicalEndpointImport` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::Import, f, Cx::NoneNeeded(None), |f| unsafe {
        f(id, src, ty)
    })
}

// ---- VMM ----

pub(super) unsafe fn mem_granularity(
    c: &Cuda,
    req: AllocationRequest,
    kind: Granularity,
) -> DriverResult<u64> {
    let prop = alloc_prop(&req);
    let flag = alloc_granularity(kind);
    let mut g = 0usize;
    let f = c.sym.cuMemGetAllocationGranularity;
    let call = Call::MemGetAllocationGranularity;
    // SAFETY: `f` is `cuMemGetAllocationGranularity` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(call, f, cx_for(req.location), |f| unsafe {
        f(&mut g, &prop, flag)
    })?;
    Ok(g as u64)
}

pub(super) unsafe fn mem_create(c: &Cuda, size: u64, req: AllocationRequest) -> DriverResult<u64> {
    let prop = alloc_prop(&req);
    let mut handle: CUmemGenericAllocationHandle = 0;
    let f = c.sym.cuMemCreate;
    // SAFETY: `f` is `cuMemCreate` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::MemCreate, f, cx_for(req.location), |f| unsafe {
        f(&mut handle, sz(size), &prop, 0)
    })?;
    Ok(handle)
}

/// `CUmemAllocationHandleType` of a shareable handle kind.
fn shareable_type(kind: ShareableKind) -> CUmemAllocationHandleType {
    match kind {
        ShareableKind::PosixFd => CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        ShareableKind::Fabric => CU_MEM_HANDLE_TYPE_FABRIC,
    }
}

pub(super) unsafe fn mem_export(
    c: &Cuda,
    handle: u64,
    kind: ShareableKind,
) -> DriverResult<ShareableHandle> {
    let f = c.sym.cuMemExportToShareableHandle;
    let ty = shareable_type(kind);
    let call = Call::MemExportToShareableHandle;
    match kind {
        ShareableKind::PosixFd => {
            // cuda.h: the driver writes an `int` descriptor at the pointer.
            let mut fd: c_int = -1;
            let out: *mut c_void = (&raw mut fd).cast();
            // SAFETY: `f` is `cuMemExportToShareableHandle` as declared in
            // `ffi`; `out` points at a live `int`, what the POSIX type writes.
            c.run(call, f, Cx::Current, |f| unsafe { f(out, handle, ty, 0) })?;
            Ok(ShareableHandle::PosixFd(fd))
        }
        ShareableKind::Fabric => {
            // cuda.h: the driver writes a 64-byte `CUmemFabricHandle`.
            let mut bytes = [0u8; 64];
            let out: *mut c_void = bytes.as_mut_ptr().cast();
            // SAFETY: as above; `out` points at 64 writable bytes, the size
            // of `CUmemFabricHandle`.
            c.run(call, f, Cx::Current, |f| unsafe { f(out, handle, ty, 0) })?;
            Ok(ShareableHandle::Fabric(FabricHandleBytes(bytes)))
        }
    }
}

pub(super) unsafe fn mem_import(c: &Cuda, shared: ShareableHandle) -> DriverResult<u64> {
    let f = c.sym.cuMemImportFromShareableHandle;
    let ty = shareable_type(shared.kind());
    let call = Call::MemImportFromShareableHandle;
    let mut handle: CUmemGenericAllocationHandle = 0;
    let out = &raw mut handle;
    match shared {
        ShareableHandle::PosixFd(fd) => {
            // cuda.h: a descriptor passes by value, cast to `void *`; a
            // negative one is no descriptor.
            let fd = usize::try_from(fd).map_err(|_| Code::INVALID_VALUE)?;
            let os = std::ptr::without_provenance_mut::<c_void>(fd);
            // SAFETY: `f` is `cuMemImportFromShareableHandle` as declared in
            // `ffi`; `out` is a live out-pointer; `os` is never dereferenced
            // for this type (the driver reads it as the descriptor number),
            // and the caller keeps the descriptor open for the call.
            c.run(call, f, Cx::Current, |f| unsafe { f(out, os, ty) })?;
        }
        ShareableHandle::Fabric(mut bytes) => {
            let os: *mut c_void = bytes.0.as_mut_ptr().cast();
            // SAFETY: as above; `os` points at the 64 bytes of a
            // `CUmemFabricHandle`, live for the call.
            c.run(call, f, Cx::Current, |f| unsafe { f(out, os, ty) })?;
        }
    }
    Ok(handle)
}

pub(super) unsafe fn mem_properties(c: &Cuda, handle: u64) -> DriverResult<AllocationRequest> {
    // Zeroed, then written by the driver: every field is a plain integer,
    // so whatever the driver writes is a valid value.
    let mut prop = MaybeUninit::<CUmemAllocationProp>::zeroed();
    let out = prop.as_mut_ptr();
    let f = c.sym.cuMemGetAllocationPropertiesFromHandle;
    let call = Call::MemGetAllocationProperties;
    // SAFETY: `f` is `cuMemGetAllocationPropertiesFromHandle` as declared in
    // `ffi`; `out` points at a live, zeroed struct.
    c.run(call, f, Cx::Current, |f| unsafe { f(out, handle) })?;
    // SAFETY: all-zero is a valid `CUmemAllocationProp` (integers and a null
    // pointer), and the driver only wrote values of those field types.
    let p = unsafe { prop.assume_init() };
    let location = match p.location.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => Location::Device(Device(p.location.id)),
        CU_MEM_LOCATION_TYPE_HOST_NUMA => Location::HostNuma(p.location.id),
        other => {
            tracing::debug!(
                handle,
                location_type = other,
                "allocation location not representable"
            );
            return Err(Code::NOT_SUPPORTED);
        }
    };
    Ok(AllocationRequest {
        location,
        handle_types: p.requestedHandleTypes,
    })
}

pub(super) unsafe fn mem_address_reserve(c: &Cuda, size: u64, alignment: u64) -> DriverResult<u64> {
    let mut ptr: CUdeviceptr = 0;
    let f = c.sym.cuMemAddressReserve;
    // No fixed address, flags 0.
    // SAFETY: `f` is `cuMemAddressReserve` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::MemAddressReserve, f, Cx::Current, |f| unsafe {
        f(&mut ptr, sz(size), sz(alignment), 0, 0)
    })?;
    Ok(ptr)
}

pub(super) unsafe fn mem_set_access(
    c: &Cuda,
    ptr: u64,
    size: u64,
    devices: Vec<Device>,
) -> DriverResult<()> {
    let descs: Vec<CUmemAccessDesc> = devices
        .iter()
        .map(|&d| CUmemAccessDesc {
            location: location(Location::Device(d)),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    // `descs` holds exactly `len` initialised descriptors that outlive the call.
    // SAFETY: `f` is `cuMemSetAccess` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(
        Call::MemSetAccess,
        c.sym.cuMemSetAccess,
        Cx::Current,
        |f| unsafe { f(ptr, sz(size), descs.as_ptr(), descs.len()) },
    )
}

// ---- classic multicast ----

pub(super) unsafe fn multicast_granularity(
    c: &Cuda,
    num_devices: u32,
    size: u64,
    handle_types: u64,
    kind: Granularity,
) -> DriverResult<u64> {
    let prop = mc_prop(num_devices, size, handle_types);
    let flag = mc_granularity(kind);
    let mut g = 0usize;
    let f = c.sym.cuMulticastGetGranularity;
    // SAFETY: `f` is `cuMulticastGetGranularity` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::MulticastGetGranularity, f, Cx::Current, |f| unsafe {
        f(&mut g, &prop, flag)
    })?;
    Ok(g as u64)
}

pub(super) unsafe fn multicast_create(
    c: &Cuda,
    num_devices: u32,
    size: u64,
    handle_types: u64,
) -> DriverResult<u64> {
    let prop = mc_prop(num_devices, size, handle_types);
    let mut handle: CUmemGenericAllocationHandle = 0;
    let f = c.sym.cuMulticastCreate;
    // SAFETY: `f` is `cuMulticastCreate` as declared in `ffi`; the pointers are live
    // locals (out-pointers writable, inputs fully initialised).
    c.run(Call::MulticastCreate, f, Cx::Current, |f| unsafe {
        f(&mut handle, &prop)
    })?;
    Ok(handle)
}

mod work;
pub(super) use work::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_prop_marshalling() {
        let req = AllocationRequest {
            location: Location::HostNuma(1),
            handle_types: crate::driver::handle_bits::POSIX_FD,
        };
        let p = alloc_prop(&req);
        assert_eq!(p.type_, 1);
        assert_eq!(p.requestedHandleTypes, 1);
        assert_eq!(p.location.type_, 3);
        assert_eq!(p.location.id, 1);
    }

    #[test]
    fn endpoint_prop_marshalling() {
        let p = le_prop(&EndpointProps {
            ipc_fabric: true,
            counted_ops: true,
            ..EndpointProps::new(Shape::Multicast { num_devices: 4 }, 2 << 20)
        });
        assert_eq!(
            (p.type_, p.size, p.ipcHandleTypes, p.flags),
            (2, 2 << 20, 1, 1)
        );
        // SAFETY: the `num_devices` member was the one written.
        assert_eq!(unsafe { p.target.num_devices }, 4);
        let p = le_prop(&EndpointProps::new(Shape::Unicast { owner: Device(3) }, 1));
        // SAFETY: the `device` member was the one written.
        assert_eq!((p.type_, unsafe { p.target.device }), (1, 3));
    }
}

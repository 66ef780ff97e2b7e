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
    AllocationRequest, Call, Code, CopyOp, Device, DriverResult, EndpointProps, FabricHandleBytes,
    Granularity, Limits, Location, MemHint, MemcpyOp, Operand, Pointer, Shape, ShareableHandle,
    ShareableKind,
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

// ---- streams and the data path (SPEC F1-F9) ----

/// A `CUstream` as the boundary's `u64`, and back: the address the driver
/// gave, with its provenance exposed (the pointer is never dereferenced here).
fn stream_of(stream: u64) -> CUstream {
    std::ptr::with_exposed_provenance_mut(sz(stream))
}

/// `locHint` of a pointer operand.
fn hint(h: MemHint) -> CUmemLocation {
    match h {
        MemHint::None => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_INVALID,
            id: 0,
        },
        MemHint::Device(d) => location(Location::Device(d)),
        MemHint::Host => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        MemHint::HostNuma(n) => location(Location::HostNuma(n)),
    }
}

/// `CUfabricCpyOperand`: every byte of the union member in use set.
pub(super) fn operand(o: &Operand) -> CUfabricCpyOperand {
    match *o {
        Operand::Pointer(Pointer { ptr, hint: h }) => CUfabricCpyOperand {
            type_: CU_FABRIC_COPY_OPERAND_TYPE_POINTER,
            op: CUfabricCpyOperandOp {
                ptr: CUfabricCpyOperandPtr {
                    ptr,
                    locHint: hint(h),
                },
            },
        },
        Operand::LogicalEndpoint { id, offset } => CUfabricCpyOperand {
            type_: CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT,
            op: CUfabricCpyOperandOp {
                le: CUfabricCpyOperandLe { id, offset },
            },
        },
    }
}

pub(super) unsafe fn stream_create(c: &Cuda, dev: Device) -> DriverResult<u64> {
    // SAFETY: `cuStreamCreate` as declared in `ffi`; `out` is a live
    // out-pointer; the flag asks for a non-blocking stream.
    let s = unsafe {
        make(
            c,
            Call::StreamCreate,
            c.sym.cuStreamCreate,
            Cx::On(dev),
            stream_destroy,
            |f, out| f(out, CU_STREAM_NON_BLOCKING),
        )
    }?;
    if s.is_null() {
        // Never hand out the legacy NULL stream (F6), whatever a driver says.
        return Err(Code::UNKNOWN);
    }
    Ok(s.expose_provenance() as u64)
}

/// Runs a call that writes a new handle (stream, event, graph, executable
/// graph) into its out-pointer, the caller's alone to destroy. `run`
/// traces the success before it returns: a `tracing` layer that panics
/// there would lose the handle, so one written is destroyed by `destroy`
/// while that panic unwinds (`OnUnwind`: a panic of the destroy is
/// caught, the first goes on).
///
/// # Safety
/// `f` is the entry point `body` calls as its C prototype says; `destroy`
/// destroys what it made.
unsafe fn make<F: Copy>(
    c: &Cuda,
    call: Call,
    f: Option<F>,
    cx: Cx,
    destroy: unsafe fn(&Cuda, u64) -> DriverResult<()>,
    mut body: impl FnMut(F, *mut *mut c_void) -> CUresult,
) -> DriverResult<*mut c_void> {
    let made = std::cell::Cell::new(std::ptr::null_mut::<c_void>());
    let undo = crate::unwind::OnUnwind::new(|| {
        if let Ok(h) = handle_of(made.get()) {
            // SAFETY: `h` was just made by this call and never reached the
            // caller (the panic came before the return): no one else holds
            // it, and it is not used again.
            let _ = unsafe { destroy(c, h) };
        }
    });
    let r = c.run(call, f, cx, |f| {
        let mut out = std::ptr::null_mut();
        let rc = body(f, &mut out);
        if rc == CUDA_SUCCESS {
            made.set(out);
        }
        rc
    });
    undo.disarm();
    r.map(|()| made.get())
}

pub(super) unsafe fn stream_destroy(c: &Cuda, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuStreamDestroy_v2;
    // SAFETY: `f` is `cuStreamDestroy_v2`; the caller's contract says the
    // stream is its own and live.
    c.run(Call::StreamDestroy, f, Cx::Current, |f| unsafe {
        f(stream_of(stream))
    })
}

pub(super) unsafe fn stream_synchronize(c: &Cuda, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuStreamSynchronize;
    // SAFETY: `f` is `cuStreamSynchronize`; the stream is live (contract).
    c.run(Call::StreamSynchronize, f, Cx::Current, |f| unsafe {
        f(stream_of(stream))
    })
}

pub(super) unsafe fn stream_query(c: &Cuda, stream: u64) -> DriverResult<bool> {
    let f = c.sym.cuStreamQuery;
    // SAFETY: `f` is `cuStreamQuery`; the stream is live (contract).
    match c.run(Call::StreamQuery, f, Cx::Current, |f| unsafe {
        f(stream_of(stream))
    }) {
        Ok(()) => Ok(true),
        Err(code) if code == Code::NOT_READY => Ok(false),
        Err(code) => Err(code),
    }
}

pub(super) unsafe fn fabric_copy_batch(
    c: &Cuda,
    stream: u64,
    ops: Vec<CopyOp>,
    flags: u64,
) -> DriverResult<()> {
    let mut list: Vec<CUDA_FABRIC_COPY_BATCH_OP> = ops
        .iter()
        .map(|op| CUDA_FABRIC_COPY_BATCH_OP {
            src: operand(&op.src),
            dst: operand(&op.dst),
            size: sz(op.size),
            flags: 0,
        })
        .collect();
    let (n, buf) = (list.len(), list.as_mut_ptr());
    let f = c.sym.cuFabricCpyBatchAsync;
    // SAFETY: `f` is `cuFabricCpyBatchAsync` (absent before 13.5: `run`
    // answers NOT_SUPPORTED without a call); `buf` holds `n` initialised
    // ops and lives until the call returned (the driver copies the list
    // before it returns: cuda.h); the operands are the caller's contract.
    c.run(Call::FabricCpyBatchAsync, f, Cx::Current, |f| unsafe {
        f(n, buf, flags, stream_of(stream))
    })
}

pub(super) unsafe fn memcpy_async(
    c: &Cuda,
    dst: Pointer,
    src: Pointer,
    size: u64,
    stream: u64,
) -> DriverResult<()> {
    let f = c.sym.cuMemcpyAsync;
    // SAFETY: `f` is `cuMemcpyAsync`; the addresses are passed on, never
    // dereferenced here; their validity is the caller's contract.
    c.run(Call::MemcpyAsync, f, Cx::Current, |f| unsafe {
        f(dst.ptr, src.ptr, sz(size), stream_of(stream))
    })
}

/// The one attribute of every copy of a `cuMemcpyBatchAsync`: the source
/// read in stream order (as `cuMemcpyAsync` reads it: the portable path's
/// sources may be written by work enqueued before), no location hints
/// (`CU_MEM_LOCATION_TYPE_INVALID`: the driver reads them only for managed
/// or pageable memory, which the batch never names), no flags.
const STREAM_ORDERED: CUmemcpyAttributes = CUmemcpyAttributes {
    srcAccessOrder: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
    srcLocHint: CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_INVALID,
        id: 0,
    },
    dstLocHint: CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_INVALID,
        id: 0,
    },
    flags: CU_MEMCPY_FLAG_DEFAULT,
};

pub(super) unsafe fn memcpy_batch_async(
    c: &Cuda,
    copies: Vec<MemcpyOp>,
    stream: u64,
) -> DriverResult<()> {
    if copies.is_empty() {
        // `numAttrs` (1) may not exceed `count`: the driver's answer, without the call.
        return Err(Code::INVALID_VALUE);
    }
    let mut dsts: Vec<CUdeviceptr> = copies.iter().map(|o| o.dst.ptr).collect();
    let mut srcs: Vec<CUdeviceptr> = copies.iter().map(|o| o.src.ptr).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|o| sz(o.size)).collect();
    let mut attrs = [STREAM_ORDERED];
    let mut attrs_idxs = [0usize];
    let f = c.sym.cuMemcpyBatchAsync_v2;
    // SAFETY: `f` is `cuMemcpyBatchAsync_v2` (the 13.0 prototype, which
    // `ffi` declares and the ABI check compares with cuda.h; absent before
    // 13.0: `run` answers NOT_SUPPORTED without a call). `dsts`, `srcs` and
    // `sizes` hold `count` entries, `attrs` and `attrs_idxs` one each
    // (`attrsIdxs[0]` is 0, as cuda.h requires), all alive until the call
    // returned (the driver reads them during the call; none is written);
    // the addresses are passed on, never dereferenced here, and their
    // validity is the caller's contract.
    c.run(Call::MemcpyBatchAsync, f, Cx::Current, |f| unsafe {
        f(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            copies.len(),
            attrs.as_mut_ptr(),
            attrs_idxs.as_mut_ptr(),
            attrs.len(),
            stream_of(stream),
        )
    })
}

/// A handle (`CUgraph`, `CUgraphExec`, `CUevent`) as the pointer the C
/// API takes back (its address value; never dereferenced here).
fn opaque(h: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(sz(h))
}

/// A handle the driver wrote, as an integer; null is `UNKNOWN` (a driver
/// that answered success must have made one).
fn handle_of(p: *mut c_void) -> DriverResult<u64> {
    if p.is_null() {
        return Err(Code::UNKNOWN);
    }
    Ok(p.expose_provenance() as u64)
}

pub(super) unsafe fn stream_begin_capture(c: &Cuda, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuStreamBeginCapture_v2;
    // SAFETY: `f` is `cuStreamBeginCapture_v2`; the stream is live (contract).
    c.run(Call::StreamBeginCapture, f, Cx::Current, |f| unsafe {
        f(stream_of(stream), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    })
}

pub(super) unsafe fn stream_end_capture(c: &Cuda, stream: u64) -> DriverResult<u64> {
    // SAFETY: `cuStreamEndCapture`; `out` is a live out-pointer; the
    // stream is live and capturing (contract).
    let g = unsafe {
        make(
            c,
            Call::StreamEndCapture,
            c.sym.cuStreamEndCapture,
            Cx::Current,
            graph_destroy,
            |f, out| f(stream_of(stream), out),
        )
    }?;
    handle_of(g)
}

pub(super) unsafe fn graph_instantiate(c: &Cuda, graph: u64) -> DriverResult<u64> {
    // SAFETY: `cuGraphInstantiateWithFlags`; `out` is a live out-pointer;
    // the graph is live (contract); flags 0.
    let e = unsafe {
        make(
            c,
            Call::GraphInstantiate,
            c.sym.cuGraphInstantiateWithFlags,
            Cx::Current,
            graph_exec_destroy,
            |f, out| f(out, opaque(graph), 0),
        )
    }?;
    handle_of(e)
}

pub(super) unsafe fn graph_launch(c: &Cuda, exec: u64, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuGraphLaunch;
    // SAFETY: `f` is `cuGraphLaunch`; both handles are live and the
    // operands of its copies stay valid (contract, F8).
    c.run(Call::GraphLaunch, f, Cx::Current, |f| unsafe {
        f(opaque(exec), stream_of(stream))
    })
}

pub(super) unsafe fn graph_exec_destroy(c: &Cuda, exec: u64) -> DriverResult<()> {
    let f = c.sym.cuGraphExecDestroy;
    // SAFETY: `f` is `cuGraphExecDestroy`; the handle is the caller's own.
    c.run(Call::GraphExecDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(exec))
    })
}

pub(super) unsafe fn graph_destroy(c: &Cuda, graph: u64) -> DriverResult<()> {
    let f = c.sym.cuGraphDestroy;
    // SAFETY: `f` is `cuGraphDestroy`; the handle is the caller's own.
    c.run(Call::GraphDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(graph))
    })
}

pub(super) unsafe fn event_create(c: &Cuda, dev: Device) -> DriverResult<u64> {
    // SAFETY: `cuEventCreate`; `out` is a live out-pointer.
    let e = unsafe {
        make(
            c,
            Call::EventCreate,
            c.sym.cuEventCreate,
            Cx::On(dev),
            event_destroy,
            |f, out| f(out, CU_EVENT_DISABLE_TIMING),
        )
    }?;
    handle_of(e)
}

pub(super) unsafe fn event_record(c: &Cuda, event: u64, stream: u64) -> DriverResult<()> {
    let f = c.sym.cuEventRecord;
    // SAFETY: `f` is `cuEventRecord`; both handles are live (contract).
    c.run(Call::EventRecord, f, Cx::Current, |f| unsafe {
        f(opaque(event), stream_of(stream))
    })
}

pub(super) unsafe fn event_query(c: &Cuda, event: u64) -> DriverResult<bool> {
    let f = c.sym.cuEventQuery;
    // SAFETY: `f` is `cuEventQuery`; the event is live (contract).
    match c.run(Call::EventQuery, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    }) {
        Ok(()) => Ok(true),
        Err(code) if code == Code::NOT_READY => Ok(false),
        Err(code) => Err(code),
    }
}

pub(super) unsafe fn event_synchronize(c: &Cuda, event: u64) -> DriverResult<()> {
    let f = c.sym.cuEventSynchronize;
    // SAFETY: `f` is `cuEventSynchronize`; the event is live (contract).
    c.run(Call::EventSynchronize, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    })
}

pub(super) unsafe fn event_destroy(c: &Cuda, event: u64) -> DriverResult<()> {
    let f = c.sym.cuEventDestroy_v2;
    // SAFETY: `f` is `cuEventDestroy_v2`; the event is the caller's own.
    c.run(Call::EventDestroy, f, Cx::Current, |f| unsafe {
        f(opaque(event))
    })
}

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

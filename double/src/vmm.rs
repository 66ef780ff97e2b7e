//! VMM (`cuMem*`), host-backed `cuMemsetD8` / `cuMemcpyHtoD` /
//! `cuMemcpyDtoH`, and the classic `cuMulticast*` calls. Each needs a
//! current context, as on a real driver, except the granularity and
//! property queries; a call without one is `INVALID_CONTEXT` and logged.

use std::ffi::{c_uchar, c_uint, c_ulonglong, c_void};

use cuda_endpoints::driver::{
    AllocationRequest, FabricHandleBytes, Granularity, ShareableHandle, ShareableKind,
};
use cuda_endpoints::{Device, Location};

use crate::abi::*;
use crate::state::{self, INVALID_VALUE};
use crate::{model, out, read};

const PINNED: c_uint = 1;
const LOC_DEVICE: c_uint = 1;
const LOC_HOST_NUMA: c_uint = 3;
const PROT_READWRITE: c_uint = 3;
/// Handle-type bits the model knows (POSIX fd, fabric).
const KNOWN_HANDLE_BITS: c_uint = 1 | 8;

fn ctx(call: &str) -> Result<i32, CUresult> {
    state::with(|d| d.current_device(call))
}

fn location(call: &str, l: CUmemLocation) -> Result<Location, CUresult> {
    match l.type_ {
        LOC_DEVICE => Ok(Location::Device(Device(l.id))),
        LOC_HOST_NUMA => Ok(Location::HostNuma(l.id)),
        _ => Err(state::with(|d| {
            d.violate(
                call,
                "double: unsupported memory location type",
                INVALID_VALUE,
            )
        })),
    }
}

fn request(call: &str, p: *const CUmemAllocationProp) -> Result<AllocationRequest, CUresult> {
    let p = read(p)?;
    if p.type_ != PINNED || p.requestedHandleTypes & !KNOWN_HANDLE_BITS != 0 {
        return Err(state::with(|d| {
            d.violate(
                call,
                "double: allocation type or handle bits",
                INVALID_VALUE,
            )
        }));
    }
    Ok(AllocationRequest {
        location: location(call, p.location)?,
        handle_types: p.requestedHandleTypes,
    })
}

fn granularity(option: c_uint) -> Result<Granularity, CUresult> {
    match option {
        0 => Ok(Granularity::Minimum),
        1 => Ok(Granularity::Recommended),
        _ => Err(INVALID_VALUE),
    }
}

fn flags_zero(flags: c_ulonglong) -> Result<(), CUresult> {
    if flags == 0 {
        Ok(())
    } else {
        Err(INVALID_VALUE)
    }
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

crate::abi::exports! {
    [13000] fn cuMemGetAllocationGranularity(
        granularity_out: *mut size_t,
        prop: *const CUmemAllocationProp,
        option: CUmemAllocationGranularity_flags,
    ) {
        let req = request("cuMemGetAllocationGranularity", prop)?;
        let kind = granularity(option)?;
        // SAFETY: the model only simulates; the double is its sole user.
        let g = model(|m| unsafe { m.mem_granularity(req, kind) })?;
        out(granularity_out, usize_of(g))
    }
    [13000] fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: size_t,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong,
    ) {
        ctx("cuMemCreate")?;
        flags_zero(flags)?;
        let req = request("cuMemCreate", prop)?;
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let h = model(|m| unsafe { m.mem_create(size as u64, req) })?;
        out(handle, h)
    }
    [13000] fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        ctx("cuMemRelease")?;
        // SAFETY: as above.
        model(|m| unsafe { m.mem_release(handle) })
    }
    [13000] fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        if prop.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let req = model(|m| unsafe { m.mem_properties(handle) })?;
        let (type_, id) = match req.location {
            Location::Device(d) => (LOC_DEVICE, d.0),
            Location::HostNuma(n) => (LOC_HOST_NUMA, n),
        };
        out(prop, CUmemAllocationProp {
            type_: PINNED,
            requestedHandleTypes: req.handle_types,
            location: CUmemLocation { type_, id },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocFlags::default(),
        })
    }
    [13000] fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: CUmemAllocationHandleType,
        flags: c_ulonglong,
    ) {
        flags_zero(flags)?;
        let kind = match handle_type {
            1 => ShareableKind::PosixFd,
            8 => ShareableKind::Fabric,
            _ => return Err(INVALID_VALUE),
        };
        // SAFETY: as above.
        match model(|m| unsafe { m.mem_export(handle, kind) })? {
            ShareableHandle::PosixFd(fd) => out(shareable.cast::<std::ffi::c_int>(), fd),
            ShareableHandle::Fabric(bytes) => out(shareable.cast::<[u8; 64]>(), bytes.0),
        }
    }
    [13000] fn cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        handle_type: CUmemAllocationHandleType,
    ) {
        let shared = match handle_type {
            // A POSIX descriptor travels as the pointer's value (cuda.h).
            1 => ShareableHandle::PosixFd(
                std::ffi::c_int::try_from(os_handle as usize).map_err(|_| INVALID_VALUE)?,
            ),
            8 => ShareableHandle::Fabric(FabricHandleBytes(read(
                os_handle.cast_const().cast::<[u8; 64]>(),
            )?)),
            _ => return Err(INVALID_VALUE),
        };
        // SAFETY: as above; a descriptor is only read for the call.
        let h = model(|m| unsafe { m.mem_import(shared) })?;
        out(handle, h)
    }
    [13000] fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: size_t,
        alignment: size_t,
        addr: CUdeviceptr,
        flags: c_ulonglong,
    ) {
        ctx("cuMemAddressReserve")?;
        let _ = addr; // a hint only
        flags_zero(flags)?;
        if ptr.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let p = model(|m| unsafe { m.mem_address_reserve(size as u64, alignment as u64) })?;
        // Unified addressing: the range is CUDA's from now on (`cuMemcpyAsync`).
        state::with(|d| d.reserved.insert(p, size as u64));
        out(ptr, p)
    }
    [13000] fn cuMemAddressFree(ptr: CUdeviceptr, size: size_t) {
        ctx("cuMemAddressFree")?;
        // SAFETY: as above.
        model(|m| unsafe { m.mem_address_free(ptr, size as u64) })?;
        state::with(|d| d.reserved.remove(&ptr));
        Ok(())
    }
    [13000] fn cuMemMap(ptr: CUdeviceptr, size: size_t, offset: size_t, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) {
        ctx("cuMemMap")?;
        flags_zero(flags)?;
        let ptr = if state::with(|d| d.misbehave.narrow_map_ptr) { ptr & 0xffff_ffff } else { ptr };
        // SAFETY: as above.
        model(|m| unsafe { m.mem_map(ptr, size as u64, offset as u64, handle) })
    }
    [13000] fn cuMemUnmap(ptr: CUdeviceptr, size: size_t) {
        ctx("cuMemUnmap")?;
        // SAFETY: as above.
        model(|m| unsafe { m.mem_unmap(ptr, size as u64) })
    }
    [13000] fn cuMemSetAccess(ptr: CUdeviceptr, size: size_t, desc: *const CUmemAccessDesc, count: size_t) {
        ctx("cuMemSetAccess")?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(INVALID_VALUE);
        }
        let mut devices = Vec::with_capacity(count);
        for i in 0..count {
            let d = read(desc.wrapping_add(i))?;
            if d.flags != PROT_READWRITE {
                return Err(INVALID_VALUE);
            }
            match location("cuMemSetAccess", d.location)? {
                Location::Device(dev) => devices.push(dev),
                Location::HostNuma(_) => return Err(INVALID_VALUE),
            }
        }
        // SAFETY: as above.
        model(|m| unsafe { m.mem_set_access(ptr, size as u64, devices) })
    }
    [13000] fn cuMemsetD8_v2(dst_device: CUdeviceptr, uc: c_uchar, n: size_t) {
        ctx("cuMemsetD8")?;
        let m = state::node();
        let chunk = vec![uc; n.min(1 << 20)];
        let mut done = 0usize;
        while done < n {
            let k = (n - done).min(chunk.len());
            m.write(dst_device.wrapping_add(done as u64), &chunk[..k])?;
            done += k;
        }
        Ok(())
    }
    [13000] fn cuMemcpyHtoD_v2(dst_device: CUdeviceptr, src_host: *const c_void, byte_count: size_t) {
        ctx("cuMemcpyHtoD")?;
        if src_host.is_null() && byte_count > 0 {
            return Err(INVALID_VALUE);
        }
        let m = state::node();
        let src = if byte_count == 0 {
            &[][..]
        } else {
            // SAFETY: non-null, `byte_count` readable bytes (cuda.h contract).
            unsafe { std::slice::from_raw_parts(src_host.cast::<u8>(), byte_count) }
        };
        m.write(dst_device, src)
    }
    [13000] fn cuMemcpyDtoH_v2(dst_host: *mut c_void, src_device: CUdeviceptr, byte_count: size_t) {
        ctx("cuMemcpyDtoH")?;
        if dst_host.is_null() && byte_count > 0 {
            return Err(INVALID_VALUE);
        }
        let bytes = state::node().read(src_device, byte_count)?;
        if byte_count > 0 {
            // SAFETY: non-null, `byte_count` writable bytes (cuda.h contract);
            // `bytes` holds exactly `byte_count`.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst_host.cast::<u8>(), byte_count.min(bytes.len())) };
        }
        Ok(())
    }
    [13000] fn cuMulticastGetGranularity(
        granularity_out: *mut size_t,
        prop: *const CUmulticastObjectProp,
        option: CUmulticastGranularity_flags,
    ) {
        let p = read(prop)?;
        let kind = granularity(option)?;
        // SAFETY: as above.
        let g = model(|m| unsafe { m.multicast_granularity(p.numDevices, p.size as u64, p.handleTypes, kind) })?;
        out(granularity_out, usize_of(g))
    }
    [13000] fn cuMulticastCreate(mc_handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) {
        ctx("cuMulticastCreate")?;
        let p = read(prop)?;
        flags_zero(p.flags)?;
        if mc_handle.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let h = model(|m| unsafe { m.multicast_create(p.numDevices, p.size as u64, p.handleTypes) })?;
        out(mc_handle, h)
    }
    [13000] fn cuMulticastAddDevice(mc_handle: CUmemGenericAllocationHandle, dev: CUdevice) {
        ctx("cuMulticastAddDevice")?;
        // SAFETY: as above.
        model(|m| unsafe { m.multicast_add_device(mc_handle, Device(dev)) })
    }
    [13000] fn cuMulticastBindMem(
        mc_handle: CUmemGenericAllocationHandle,
        mc_offset: size_t,
        mem_handle: CUmemGenericAllocationHandle,
        mem_offset: size_t,
        size: size_t,
        flags: c_ulonglong,
    ) {
        ctx("cuMulticastBindMem")?;
        flags_zero(flags)?;
        // SAFETY: as above.
        model(|m| unsafe { m.multicast_bind_mem(mc_handle, mc_offset as u64, mem_handle, mem_offset as u64, size as u64) })
    }
    [13000] fn cuMulticastBindAddr(
        mc_handle: CUmemGenericAllocationHandle,
        mc_offset: size_t,
        memptr: CUdeviceptr,
        size: size_t,
        flags: c_ulonglong,
    ) {
        ctx("cuMulticastBindAddr")?;
        flags_zero(flags)?;
        // SAFETY: as above.
        model(|m| unsafe { m.multicast_bind_addr(mc_handle, mc_offset as u64, memptr, size as u64) })
    }
    [13000] fn cuMulticastUnbind(mc_handle: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: size_t, size: size_t) {
        ctx("cuMulticastUnbind")?;
        // SAFETY: as above.
        model(|m| unsafe { m.multicast_unbind(mc_handle, Device(dev), mc_offset as u64, size as u64) })
    }
}

//! `cuLogicalEndpoint*` (13.3+) and the clique queries (13.4+). Absent from
//! the `cuda-13000` build, as from driver 580's symbol table. On a newer
//! build that pretends to be older (`CUDA_DOUBLE_VERSION`), the model
//! answers for the version (`NOT_SUPPORTED`) and `cuGetProcAddress` says
//! "not found".

use std::ffi::{c_int, c_ulonglong, c_void};

use cuda_endpoints::Device;
use cuda_endpoints::driver::{EndpointProps, FabricHandleBytes, Shape};

use crate::abi::*;
use crate::state::{self, INVALID_VALUE, NOT_SUPPORTED};
use crate::{model, out, read};

/// `CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC`.
const IPC_FABRIC: CUlogicalEndpointIpcHandleType = 1;
/// `CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT`.
const CLIQUE_MULTICAST_LE: u32 = 3;

/// Decodes a `CUlogicalEndpointProp`. What the domain type cannot hold (an
/// unknown type, IPC bit or flag) is `INVALID_VALUE`, logged against the
/// rule it breaks.
fn props(call: &str, p: *const CUlogicalEndpointProp) -> Result<EndpointProps, CUresult> {
    let p = read(p)?;
    let bad = |rule: &str| Err(state::with(|d| d.violate(call, rule, INVALID_VALUE)));
    // SAFETY: both members of the union are 4-byte integers at offset 4:
    // any bit pattern reads as either.
    let (owner, num_devices) = unsafe { (p.target.device, p.target.num_devices) };
    let shape = match p.type_ {
        1 => Shape::Unicast {
            owner: Device(owner),
        },
        2 => Shape::Multicast { num_devices },
        _ => return bad("R2.2"),
    };
    if p.ipcHandleTypes & !IPC_FABRIC != 0 || p.flags & !1 != 0 {
        return bad("R2.4");
    }
    Ok(EndpointProps {
        shape,
        size: p.size,
        ipc_fabric: p.ipcHandleTypes & IPC_FABRIC != 0,
        counted_ops: p.flags & 1 != 0,
    })
}

fn check_handle_type(call: &str, t: CUlogicalEndpointIpcHandleType) -> Result<(), CUresult> {
    if t == IPC_FABRIC {
        Ok(())
    } else {
        Err(state::with(|d| {
            d.violate(call, "R8/R9: handle type must be FABRIC", INVALID_VALUE)
        }))
    }
}

/// The multicast logical-endpoint clique of `dev`: `None` when it is in none.
fn clique(dev: CUdevice) -> Result<Option<u32>, CUresult> {
    if state::with(|d| d.version) < 13040 {
        return Err(NOT_SUPPORTED);
    }
    // SAFETY: the model only simulates; the double is its sole user.
    match model(|m| unsafe { m.device_clique(Device(dev)) }) {
        Ok(c) => Ok(Some(c)),
        Err(state::NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

crate::abi::exports! {
    [13030] fn cuLogicalEndpointIdReserve(base_le_id: *mut CUlogicalEndpointId, count: cuuint32_t) {
        // SAFETY: the model only simulates; the double is its sole user.
        let base = model(|m| unsafe { m.id_reserve(count) })?;
        let wrong = state::with(|d| d.misbehave.wrong_reserve_out);
        out(base_le_id, if wrong { base.wrapping_add(1) } else { base })
    }
    [13030] fn cuLogicalEndpointIdRelease(base_le_id: CUlogicalEndpointId, count: cuuint32_t) {
        // SAFETY: as above.
        model(|m| unsafe { m.id_release(base_le_id, count) })
    }
    [13030] fn cuLogicalEndpointGetLimits(
        bind_alignment: *mut cuuint64_t,
        max_size: *mut cuuint64_t,
        prop: *const CUlogicalEndpointProp,
    ) {
        let p = props("cuLogicalEndpointGetLimits", prop)?;
        // SAFETY: as above.
        let l = model(|m| unsafe { m.get_limits(p) })?;
        out(bind_alignment, l.bind_alignment)?;
        out(max_size, l.max_size)
    }
    [13030] fn cuLogicalEndpointCreate(le_id: CUlogicalEndpointId, prop: *const CUlogicalEndpointProp) {
        let p = props("cuLogicalEndpointCreate", prop)?;
        // SAFETY: as above.
        model(|m| unsafe { m.create(le_id, p) })
    }
    [13030] fn cuLogicalEndpointAddDevice(le_id: CUlogicalEndpointId, dev: CUdevice) {
        // SAFETY: as above.
        model(|m| unsafe { m.add_device(le_id, Device(dev)) })
    }
    [13030] fn cuLogicalEndpointQuery(le_id: CUlogicalEndpointId, count: cuuint32_t, query_status: *mut c_int) {
        if query_status.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let ready = model(|m| unsafe { m.query(le_id, count) })?;
        out(query_status, c_int::from(ready))
    }
    [13030] fn cuLogicalEndpointBindMem(
        le_id: CUlogicalEndpointId,
        dev: CUdevice,
        offset: cuuint64_t,
        mem_handle: CUmemGenericAllocationHandle,
        mem_offset: cuuint64_t,
        size: cuuint64_t,
        flags: c_ulonglong,
    ) {
        let (offset, size) = if state::with(|d| d.misbehave.swap_bind_offset_size) {
            (size, offset)
        } else {
            (offset, size)
        };
        // SAFETY: as above.
        model(|m| unsafe { m.bind_mem(le_id, Device(dev), offset, mem_handle, mem_offset, size, flags) })
    }
    [13030] fn cuLogicalEndpointBindAddr(
        le_id: CUlogicalEndpointId,
        dev: CUdevice,
        offset: cuuint64_t,
        ptr: *mut c_void,
        size: cuuint64_t,
        flags: c_ulonglong,
    ) {
        let (offset, size) = if state::with(|d| d.misbehave.swap_bind_offset_size) {
            (size, offset)
        } else {
            (offset, size)
        };
        // SAFETY: as above.
        model(|m| unsafe { m.bind_addr(le_id, Device(dev), offset, ptr as u64, size, flags) })
    }
    [13030] fn cuLogicalEndpointUnbind(le_id: CUlogicalEndpointId, dev: CUdevice, offset: cuuint64_t, size: cuuint64_t) {
        // SAFETY: as above.
        model(|m| unsafe { m.unbind(le_id, Device(dev), offset, size) })
    }
    [13030] fn cuLogicalEndpointDestroy(le_id: CUlogicalEndpointId) {
        // SAFETY: as above.
        model(|m| unsafe { m.destroy(le_id) })
    }
    [13030] fn cuLogicalEndpointExport(handle: *mut c_void, le_id: CUlogicalEndpointId, handle_type: CUlogicalEndpointIpcHandleType) {
        check_handle_type("cuLogicalEndpointExport", handle_type)?;
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: as above.
        let h = model(|m| unsafe { m.export(le_id) })?;
        out(handle.cast::<[u8; 64]>(), h.0)
    }
    [13030] fn cuLogicalEndpointImport(le_id: CUlogicalEndpointId, handle: *const c_void, handle_type: CUlogicalEndpointIpcHandleType) {
        check_handle_type("cuLogicalEndpointImport", handle_type)?;
        let bytes = read(handle.cast::<[u8; 64]>())?;
        // SAFETY: as above.
        model(|m| unsafe { m.import(le_id, FabricHandleBytes(bytes)) })
    }
    [13040] fn cuDeviceGetCliqueCount(count: *mut size_t, dev: CUdevice) {
        let n = usize::from(clique(dev)?.is_some());
        out(count, n)
    }
    [13040] fn cuDeviceGetCliqueInfo(clique_info: *mut CUcliqueInfo, count: *mut size_t, dev: CUdevice) {
        let cap = read(count.cast_const())?;
        let c = clique(dev)?;
        let n = usize::from(c.is_some());
        if let (Some(id), 1..) = (c, cap) {
            out(clique_info, CUcliqueInfo { type_: CLIQUE_MULTICAST_LE, id })?;
        }
        out(count, n.min(cap))
    }
}

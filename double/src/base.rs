//! Initialisation, versions, devices, primary contexts, the current
//! context, `cuGetProcAddress` and error names.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use cuda_endpoints::Device;

use crate::abi::*;
use crate::node::Node;
use crate::state::{self, CURRENT, INVALID_VALUE, NOT_FOUND};
use crate::{model, out};

/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`, `_VERSION_NOT_SUFFICIENT`.
const SYMBOL_NOT_FOUND: c_uint = 1;
const VERSION_NOT_SUFFICIENT: c_uint = 2;

/// `cuGetProcAddress`: the exported symbol for `symbol` (the `_v2` one when
/// it exists), refused for a `cudaVersion` past the driver's (as driver 580
/// does for 13030) and "not found" for what this driver version lacks.
fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    status: *mut CUdriverProcAddressQueryResult,
) -> Result<(), CUresult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: a non-null C string from the caller (cuda.h contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let version = state::with(|d| d.version);
    if cuda_version > version {
        return Err(INVALID_VALUE);
    }
    let v2 = format!("{name}_v2");
    let found = crate::abi::all_exports()
        .filter(|e| e.symbol == v2 || e.symbol == name)
        .max_by_key(|e| e.symbol.len());
    let (ptr, st) = match found {
        Some(e) if e.since <= version && e.since <= cuda_version => (e.ptr, 0),
        Some(e) if e.since <= version => (std::ptr::null(), VERSION_NOT_SUFFICIENT),
        _ => (std::ptr::null(), SYMBOL_NOT_FOUND),
    };
    out(pfn, ptr as *mut c_void)?;
    if !status.is_null() {
        out(status, st)?;
    }
    if st == 0 { Ok(()) } else { Err(NOT_FOUND) }
}

crate::abi::exports! {
    [13000, no_init] fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        // A fabric named in the environment that cannot be joined: the
        // driver cannot start (the reason is in the violation log).
        if let Node::Unreachable(_) = state::node() {
            return Err(state::NOT_INITIALIZED);
        }
        state::set_initialized();
        Ok(())
    }
    [13000, no_init] fn cuDriverGetVersion(driver_version: *mut c_int) {
        // SAFETY: the model only simulates; the double is its sole user.
        let v = model(|m| unsafe { m.driver_version() })?;
        out(driver_version, v)
    }
    [13000] fn cuDeviceGetCount(count: *mut c_int) {
        // SAFETY: as above.
        let n = model(|m| unsafe { m.device_count() })?;
        out(count, n)
    }
    [13000] fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        state::with(|d| d.check_device(ordinal))?;
        out(device, ordinal)
    }
    [13000] fn cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) {
        let v = if let Some(v) = generic_attribute(attrib) {
            state::with(|d| d.check_device(dev))?;
            v
        } else {
            // The model answers the logical-endpoint attributes, 13.5's 158
            // included (INVALID_VALUE before 13.5).
            let attrib = c_int::try_from(attrib).map_err(|_| INVALID_VALUE)?;
            // SAFETY: as above.
            model(|m| unsafe { m.device_attribute(Device(dev), attrib) })?
        };
        out(pi, v)
    }
    [13000] fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        state::with(|d| {
            d.check_device(dev)?;
            if let Some((_, code)) = d.retain_fault.filter(|&(f, _)| f == dev) {
                return Err(code);
            }
            d.ctx_refs[dev as usize] += 1;
            d.retained_mask |= 1 << dev;
            Ok::<(), CUresult>(())
        })?;
        out(pctx, state::context_handle(dev) as CUcontext)
    }
    [13000] fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        state::with(|d| {
            // A context retained under an earlier node (before a reset that
            // shrank it) is still released: the retain count is the process's.
            if d.ctx_refs.get(dev as usize).is_none_or(|&r| r == 0) {
                d.check_device(dev)?;
            }
            let r = &mut d.ctx_refs[dev as usize];
            if *r == 0 {
                return Err(d.violate(
                    "cuDevicePrimaryCtxRelease",
                    "double: primary context released more often than retained",
                    state::INVALID_CONTEXT,
                ));
            }
            *r -= 1;
            Ok(())
        })
    }
    [13000] fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let refs = state::with(|d| d.check_device(dev).map(|()| d.ctx_refs[dev as usize]))?;
        out(flags, 0)?;
        out(active, c_int::from(refs > 0))
    }
    [13000] fn cuCtxSetCurrent(ctx: CUcontext) {
        let h = ctx as usize;
        if h == 0 {
            CURRENT.with(|c| c.set(0));
            return Ok(());
        }
        let dev = state::with(|d| match state::context_device(h) {
            Some(dev) if d.ctx_refs.get(dev as usize).copied().unwrap_or(0) > 0 => {
                d.current_mask |= 1 << dev;
                Ok(dev)
            }
            _ => Err(d.violate("cuCtxSetCurrent", "double: not a retained context", state::INVALID_CONTEXT)),
        })?;
        CURRENT.with(|c| c.set(state::context_handle(dev)));
        Ok(())
    }
    [13000] fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        state::count(|n| n.asked += 1);
        out(pctx, CURRENT.with(|c| c.get()) as CUcontext)
    }
    [13000] fn cuCtxGetDevice(device: *mut CUdevice) {
        let dev = state::with(|d| d.current_device("cuCtxGetDevice"))?;
        out(device, dev)
    }
    [13000] fn cuCtxSynchronize() {
        state::with(|d| d.current_device("cuCtxSynchronize")).map(|_| ())
    }
    [13000] fn cuMemGetInfo_v2(free: *mut size_t, total: *mut size_t) {
        let dev = state::with(|d| d.current_device("cuMemGetInfo"))?;
        // SAFETY: as above.
        let (f, t) = model(|m| unsafe { m.mem_get_info(Device(dev)) })?;
        out(free, usize::try_from(f).unwrap_or(usize::MAX))?;
        out(total, usize::try_from(t).unwrap_or(usize::MAX))
    }
    [13000, no_init] fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: cuuint64_t,
        symbol_status: *mut CUdriverProcAddressQueryResult,
    ) {
        let _ = flags;
        proc_address(symbol, pfn, cuda_version, symbol_status)
    }
    [13000, no_init] fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) {
        let s = error_name(error).ok_or(INVALID_VALUE)?;
        out(p_str, s.as_ptr())
    }
    [13000, no_init] fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) {
        let s = error_name(error).ok_or(INVALID_VALUE)?;
        out(p_str, s.as_ptr())
    }
}

/// Attributes outside the model's concern that programs beside the library
/// (cudarc's `CudaContext::new`) read: the double's fixed answers.
fn generic_attribute(attrib: CUdevice_attribute) -> Option<c_int> {
    Some(match attrib {
        // UNIFIED_ADDRESSING: VMM needs it.
        41 => 1,
        // COMPUTE_CAPABILITY_MAJOR / MINOR: an H200 (9.0).
        75 => 9,
        76 => 0,
        // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
        102 => 1,
        // MEMORY_POOLS_SUPPORTED: no stream-ordered allocator in the double.
        115 => 0,
        _ => return None,
    })
}

/// Names for the codes the double itself returns; anything else is unknown
/// to it (as to an old driver), which is `INVALID_VALUE` by `cuda.h`.
fn error_name(code: CUresult) -> Option<&'static CStr> {
    Some(match code {
        0 => c"CUDA_SUCCESS",
        1 => c"CUDA_ERROR_INVALID_VALUE",
        2 => c"CUDA_ERROR_OUT_OF_MEMORY",
        3 => c"CUDA_ERROR_NOT_INITIALIZED",
        34 => c"CUDA_ERROR_STUB_LIBRARY",
        101 => c"CUDA_ERROR_INVALID_DEVICE",
        201 => c"CUDA_ERROR_INVALID_CONTEXT",
        400 => c"CUDA_ERROR_INVALID_HANDLE",
        500 => c"CUDA_ERROR_NOT_FOUND",
        600 => c"CUDA_ERROR_NOT_READY",
        700 => c"CUDA_ERROR_ILLEGAL_ADDRESS",
        800 => c"CUDA_ERROR_NOT_PERMITTED",
        801 => c"CUDA_ERROR_NOT_SUPPORTED",
        999 => c"CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

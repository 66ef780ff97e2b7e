//! The real driver backend: [`Cuda`] implements [`Driver`] over `libcuda`.
//!
//! This module owns everything between the typed API and the C ABI:
//! - loading `libcuda` and resolving each entry point itself, so that a
//!   missing library or symbol is an error instead of cudarc's panic;
//! - the process-wide call policy ([`deny`], [`is_denied`], env var
//!   [`DENY_ENV`]), checked before any entry point is touched;
//! - the primary contexts that VMM and multicast calls need current;
//! - marshalling of `CUmemAllocationProp`, `CUmemAccessDesc` and
//!   `CUmulticastObjectProp`.
//!
//! cudarc's `sys::cuXxx` wrappers are never called: they unwrap the symbol
//! lookup and return `CUresult`, a Rust enum that a newer driver's code would
//! make undefined behaviour. The function pointers here return plain `u32`
//! and take enums as plain integers; results go through [`Code::from_raw`].

use std::ffi::{CStr, c_int, c_uint, c_ulonglong, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{
    AllocationRequest, Call, Code, Device, Driver, DriverResult, EndpointProps, FabricHandleBytes,
    Granularity, LOGICAL_ENDPOINT_MIN_VERSION, Limits, Location, Shape,
};
use crate::Error;
use cudarc::driver::sys;

/// Environment variable read by [`Cuda::open`]: comma-separated `cuda.h`
/// names (e.g. `cuMulticastCreate`) added to the deny set.
pub const DENY_ENV: &str = "CUDA_ENDPOINTS_DENY";

// ---------------------------------------------------------------------------
// Call policy
// ---------------------------------------------------------------------------

const DENY_WORDS: usize = Call::ALL.len().div_ceil(64);

/// A set of [`Call`]s as a bitset of atomics: lock-free to read on every call.
struct DenySet([AtomicU64; DENY_WORDS]);

impl DenySet {
    const fn new() -> DenySet {
        DenySet([const { AtomicU64::new(0) }; DENY_WORDS])
    }

    // `Call` is a fieldless enum declared in `Call::ALL` order, so its
    // discriminant is its index.
    fn slot(call: Call) -> (usize, u64) {
        let i = call as usize;
        (i / 64, 1u64 << (i % 64))
    }

    fn add(&self, call: Call) {
        let (w, bit) = Self::slot(call);
        self.0[w].fetch_or(bit, Ordering::SeqCst);
    }

    fn contains(&self, call: Call) -> bool {
        let (w, bit) = Self::slot(call);
        self.0[w].load(Ordering::SeqCst) & bit != 0
    }
}

static DENY: DenySet = DenySet::new();

/// Adds `calls` to the process-wide deny set. A denied call made through any
/// [`Cuda`] returns `CUDA_ERROR_NOT_PERMITTED` without reaching the driver.
/// There is no way to lift a denial: the set only grows.
pub fn deny(calls: &[Call]) {
    for &call in calls {
        DENY.add(call);
        tracing::debug!(call = call.name(), "driver call denied by policy");
    }
}

/// Whether `call` is in the process-wide deny set.
pub fn is_denied(call: Call) -> bool {
    DENY.contains(call)
}

/// Splits a deny list (`"cuMulticastCreate, cuMemCreate"`) into the calls it
/// names and the entries that name none.
fn parse_deny_list(list: &str) -> (Vec<Call>, Vec<String>) {
    let mut calls = Vec::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match Call::from_name(name) {
            Some(call) => calls.push(call),
            None => unknown.push(name.to_owned()),
        }
    }
    (calls, unknown)
}

/// Applies [`DENY_ENV`]. An entry that names no entry point fails: a typo in
/// a safety guard must not silently let the call through.
fn apply_env_deny() -> Result<(), Error> {
    let list = match std::env::var(DENY_ENV) {
        Ok(list) => list,
        Err(std::env::VarError::NotPresent) => return Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(Error::Unsupported {
                what: format!("{DENY_ENV} (not valid UTF-8)"),
                driver_version: None,
                hint: "set it to comma-separated cuda.h names, e.g. cuMulticastCreate".into(),
            });
        }
    };
    let (calls, unknown) = parse_deny_list(&list);
    // Deny what was understood even when something else was not.
    deny(&calls);
    if unknown.is_empty() {
        return Ok(());
    }
    let known: Vec<&str> = Call::ALL.iter().map(|c| c.name()).collect();
    Err(Error::Unsupported {
        what: format!("{DENY_ENV} entries {unknown:?} (no such driver entry point)"),
        driver_version: None,
        hint: format!("use cuda.h names from: {}", known.join(", ")),
    })
}

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

/// Declares the entry-point table: one `Option<fn>` per symbol, resolved by
/// name, and the map from [`Call`] to its field. Signatures mirror `cuda.h`
/// except that `CUresult` and every enum are plain integers.
macro_rules! entry_points {
    ($($field:ident = $sym:literal $([$call:ident])? : fn($($arg:ty),* $(,)?);)*) => {
        #[derive(Clone, Copy, Default)]
        struct Table {
            $($field: Option<unsafe extern "C" fn($($arg),*) -> u32>,)*
        }

        impl Table {
            /// Loads `libcuda` and resolves every entry point; `Err` says why
            /// there is no library.
            fn load() -> Result<Table, String> {
                // SAFETY: only tries to `dlopen` cudarc's candidate names and
                // closes them again; no driver code runs beyond its init.
                if !unsafe { sys::is_culib_present() } {
                    return Err(
                        "libcuda (libcuda.so / libcuda.so.1) was not found by the dynamic loader"
                            .into(),
                    );
                }
                // `culib` panics when no candidate loads; the check above makes
                // that unreachable short of the file vanishing in between, and
                // `catch_unwind` turns even that into an error.
                // SAFETY: loading libcuda runs its initialisers, which is what
                // any use of the driver requires.
                let lib = std::panic::catch_unwind(|| unsafe { sys::culib() })
                    .map_err(|_| "libcuda disappeared while it was being loaded".to_owned())?;
                Ok(Table {
                    $($field: {
                        let name: &CStr = $sym;
                        // SAFETY: the function type matches the `cuda.h`
                        // prototype of `name` (integers for enums and
                        // `CUresult`, same C ABI). The library lives in a
                        // `static` and is never unloaded, so the pointer stays
                        // valid for the whole process.
                        unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> u32>(name) }
                            .ok()
                            .map(|sym| *sym)
                    },)*
                })
            }

            /// Whether the entry point behind `call` was resolved.
            fn has(&self, call: Call) -> bool {
                #[allow(unreachable_patterns)]
                match call {
                    $($(Call::$call => self.$field.is_some(),)?)*
                    // A `Call` added elsewhere but not wired here counts as missing.
                    _ => false,
                }
            }

            /// The symbols that did not resolve, for reports.
            fn missing_names(&self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $(if self.$field.is_none() {
                    let name: &'static CStr = $sym;
                    out.push(name.to_str().unwrap_or("?"));
                })*
                out
            }
        }
    };
}

type Ctx = sys::CUcontext;
type Prop = sys::CUmemAllocationProp;
type McProp = sys::CUmulticastObjectProp;
type LeProp = sys::CUlogicalEndpointProp;

/// `CUcliqueInfo` (13.4+) with its `CUcliqueType` as a plain integer, so a
/// type this library does not know is never read as a Rust enum.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CliqueInfo {
    type_: c_uint,
    id: c_uint,
}

/// `CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT`: the clique of R4.5.
const CLIQUE_MULTICAST_LOGICAL_ENDPOINT: c_uint = 3;

entry_points! {
    // Setup and contexts (no `Call`: the library's own bookkeeping).
    init = c"cuInit": fn(c_uint);
    ctx_get_current = c"cuCtxGetCurrent": fn(*mut Ctx);
    ctx_set_current = c"cuCtxSetCurrent": fn(Ctx);
    primary_retain = c"cuDevicePrimaryCtxRetain": fn(*mut Ctx, c_int);
    primary_release = c"cuDevicePrimaryCtxRelease_v2": fn(c_int);
    // Base calls.
    driver_get_version = c"cuDriverGetVersion" [DriverGetVersion]: fn(*mut c_int);
    device_get_count = c"cuDeviceGetCount" [DeviceGetCount]: fn(*mut c_int);
    // The attribute is a raw `int` so that numbers outside cudarc's enum work.
    device_get_attribute = c"cuDeviceGetAttribute" [DeviceGetAttribute]: fn(*mut c_int, c_int, c_int);
    mem_get_info = c"cuMemGetInfo_v2" [MemGetInfo]: fn(*mut usize, *mut usize);
    // Fabric cliques (13.4+; no `Call` yet: not subject to the deny set).
    clique_count = c"cuDeviceGetCliqueCount": fn(*mut usize, c_int);
    clique_info = c"cuDeviceGetCliqueInfo" [DeviceGetCliqueInfo]: fn(*mut CliqueInfo, *mut usize, c_int);
    // Logical endpoints (13.3+).
    le_id_reserve = c"cuLogicalEndpointIdReserve" [IdReserve]: fn(*mut u32, u32);
    le_id_release = c"cuLogicalEndpointIdRelease" [IdRelease]: fn(u32, u32);
    le_get_limits = c"cuLogicalEndpointGetLimits" [GetLimits]: fn(*mut u64, *mut u64, *const LeProp);
    le_create = c"cuLogicalEndpointCreate" [Create]: fn(u32, *const LeProp);
    le_add_device = c"cuLogicalEndpointAddDevice" [AddDevice]: fn(u32, c_int);
    le_query = c"cuLogicalEndpointQuery" [Query]: fn(u32, u32, *mut c_int);
    le_bind_mem = c"cuLogicalEndpointBindMem" [BindMem]: fn(u32, c_int, u64, c_ulonglong, u64, u64, c_ulonglong);
    le_bind_addr = c"cuLogicalEndpointBindAddr" [BindAddr]: fn(u32, c_int, u64, *mut c_void, u64, c_ulonglong);
    le_unbind = c"cuLogicalEndpointUnbind" [Unbind]: fn(u32, c_int, u64, u64);
    le_destroy = c"cuLogicalEndpointDestroy" [Destroy]: fn(u32);
    le_export = c"cuLogicalEndpointExport" [Export]: fn(*mut c_void, u32, c_uint);
    le_import = c"cuLogicalEndpointImport" [Import]: fn(u32, *const c_void, c_uint);
    // VMM.
    mem_get_granularity = c"cuMemGetAllocationGranularity" [MemGetAllocationGranularity]: fn(*mut usize, *const Prop, c_uint);
    mem_create = c"cuMemCreate" [MemCreate]: fn(*mut c_ulonglong, usize, *const Prop, c_ulonglong);
    mem_release = c"cuMemRelease" [MemRelease]: fn(c_ulonglong);
    mem_get_properties = c"cuMemGetAllocationPropertiesFromHandle" [MemGetAllocationProperties]: fn(*mut Prop, c_ulonglong);
    mem_address_reserve = c"cuMemAddressReserve" [MemAddressReserve]: fn(*mut c_ulonglong, usize, usize, c_ulonglong, c_ulonglong);
    mem_address_free = c"cuMemAddressFree" [MemAddressFree]: fn(c_ulonglong, usize);
    mem_map = c"cuMemMap" [MemMap]: fn(c_ulonglong, usize, usize, c_ulonglong, c_ulonglong);
    mem_unmap = c"cuMemUnmap" [MemUnmap]: fn(c_ulonglong, usize);
    mem_set_access = c"cuMemSetAccess" [MemSetAccess]: fn(c_ulonglong, usize, *const sys::CUmemAccessDesc, usize);
    // Classic multicast.
    mc_get_granularity = c"cuMulticastGetGranularity" [MulticastGetGranularity]: fn(*mut usize, *const McProp, c_uint);
    mc_create = c"cuMulticastCreate" [MulticastCreate]: fn(*mut c_ulonglong, *const McProp);
    mc_add_device = c"cuMulticastAddDevice" [MulticastAddDevice]: fn(c_ulonglong, c_int);
    mc_bind_mem = c"cuMulticastBindMem" [MulticastBindMem]: fn(c_ulonglong, usize, c_ulonglong, usize, usize, c_ulonglong);
    mc_bind_addr = c"cuMulticastBindAddr" [MulticastBindAddr]: fn(c_ulonglong, usize, c_ulonglong, usize, c_ulonglong);
    mc_unbind = c"cuMulticastUnbind" [MulticastUnbind]: fn(c_ulonglong, c_int, usize, usize);
}

/// The logical-endpoint entry points (SPEC R1–R10).
const LE_CALLS: &[Call] = &[
    Call::IdReserve,
    Call::IdRelease,
    Call::GetLimits,
    Call::Create,
    Call::AddDevice,
    Call::Query,
    Call::BindMem,
    Call::BindAddr,
    Call::Unbind,
    Call::Destroy,
    Call::Export,
    Call::Import,
];

const VMM_CALLS: &[Call] = &[
    Call::MemGetAllocationGranularity,
    Call::MemCreate,
    Call::MemRelease,
    Call::MemAddressReserve,
    Call::MemAddressFree,
    Call::MemMap,
    Call::MemUnmap,
    Call::MemSetAccess,
];

const MULTICAST_CALLS: &[Call] = &[
    Call::MulticastGetGranularity,
    Call::MulticastCreate,
    Call::MulticastAddDevice,
    Call::MulticastBindMem,
    Call::MulticastBindAddr,
    Call::MulticastUnbind,
];

// The C layouts the marshalling relies on (x86-64 / aarch64 `cuda.h`).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<sys::CUmemLocation>() == 8);
    assert!(size_of::<Prop>() == 32);
    assert!(offset_of!(Prop, requestedHandleTypes) == 4);
    assert!(offset_of!(Prop, location) == 8);
    assert!(size_of::<sys::CUmemAccessDesc>() == 12);
    assert!(size_of::<McProp>() == 32);
    assert!(size_of::<CliqueInfo>() == 8);
    assert!(size_of::<sys::CUlogicalEndpointFabricHandle>() == 64);
};

/// `u64` → `size_t`. Saturates (CUDA is 64-bit only): an oversized value is
/// then rejected by the driver instead of silently truncated.
fn sz(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn location(loc: Location) -> sys::CUmemLocation {
    // SAFETY: plain C struct; all-zero is valid (`type_ = INVALID`, id 0).
    let mut l: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    let (ty, id) = match loc {
        Location::Device(d) => (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, d.0),
        Location::HostNuma(n) => (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, n),
    };
    l.type_ = ty;
    l.__bindgen_anon_1.id = id;
    l
}

fn alloc_prop(req: &AllocationRequest) -> Prop {
    // SAFETY: plain C struct; all-zero is valid (enums at their `INVALID = 0`
    // variant, null pointer, zero flags), and it keeps padding defined.
    let mut p: Prop = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType(req.handle_types);
    p.location = location(req.location);
    p
}

fn mc_prop(num_devices: u32, size: u64, handle_types: u64) -> McProp {
    McProp {
        numDevices: num_devices,
        size: sz(size),
        handleTypes: handle_types,
        flags: 0,
    }
}

fn granularity_flag(kind: Granularity) -> c_uint {
    match kind {
        Granularity::Minimum => 0,
        Granularity::Recommended => 1,
    }
}

// ---------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------

/// Which context a call runs in.
#[derive(Clone, Copy)]
enum Cx {
    /// None needed (device queries).
    Free,
    /// The primary context of this device.
    On(Device),
    /// Any context: the primary context of the device used last (device 0 at first).
    Any,
}

/// A retained primary context (`CUcontext` is a raw pointer, hence not `Send`).
struct Retained(Ctx);
// SAFETY: a CUDA context handle is a process-wide object usable from every
// thread; the pointer is never dereferenced on the Rust side.
unsafe impl Send for Retained {}

/// Restores the thread's previous current context on drop, so that the
/// caller's (or the CUDA runtime's) context binding is left as it was.
struct CtxGuard<'a> {
    cuda: &'a Cuda,
    previous: Option<Ctx>,
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        let (Some(prev), Some(set)) = (self.previous, self.cuda.t.ctx_set_current) else {
            return;
        };
        // SAFETY: `set` is `cuCtxSetCurrent`; `prev` was current on this thread
        // (or null, which unbinds) a moment ago.
        if let Some(code) = Code::from_raw(unsafe { set(prev) }) {
            tracing::debug!(%code, "cuCtxSetCurrent: restoring the previous context failed");
        }
    }
}

// ---------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------

/// The real CUDA driver, loaded at run time.
///
/// Every method first checks the process-wide deny set (`NOT_PERMITTED`, no
/// driver call), then whether the entry point exists (`NOT_SUPPORTED`, no
/// call), then makes a primary context current where the call needs one, and
/// restores the thread's previous context afterwards. Primary contexts are
/// retained lazily per device and released on drop.
pub struct Cuda {
    t: Table,
    version: i32,
    deny: &'static DenySet,
    /// Device → retained primary context.
    contexts: Mutex<Vec<(i32, Retained)>>,
    /// The device whose context serves device-less calls.
    last_device: AtomicI32,
}

impl Cuda {
    /// Loads `libcuda`, applies [`DENY_ENV`], resolves the entry points, runs
    /// `cuInit(0)` and reads `cuDriverGetVersion`.
    ///
    /// Missing logical-endpoint or multicast symbols are not an error here
    /// (driver 580 / CUDA 13.0 has none): those methods answer
    /// `CUDA_ERROR_NOT_SUPPORTED`; see [`Cuda::require_logical_endpoints`].
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded, is not a driver, or
    /// `cuInit` fails (e.g. no device, stub library); [`Error::Unsupported`]
    /// when a base entry point is missing or [`DENY_ENV`] names an unknown call.
    pub fn open() -> Result<Cuda, Error> {
        apply_env_deny()?;
        let t = Table::load().map_err(|reason| Error::NoDriver { reason })?;
        let (Some(init), Some(get_version)) = (t.init, t.driver_get_version) else {
            return Err(Error::NoDriver {
                reason: "the loaded libcuda exports no cuInit / cuDriverGetVersion".into(),
            });
        };
        // SAFETY: `init` is `cuInit`; flags must be 0.
        if let Some(code) = Code::from_raw(unsafe { init(0) }) {
            tracing::debug!(%code, "cuInit failed");
            return Err(Error::NoDriver {
                reason: format!("cuInit failed with {code}"),
            });
        }
        let mut version: c_int = 0;
        // SAFETY: `get_version` is `cuDriverGetVersion`; `version` is a valid out-pointer.
        if let Some(code) = Code::from_raw(unsafe { get_version(&mut version) }) {
            return Err(Error::NoDriver {
                reason: format!("cuDriverGetVersion failed with {code}"),
            });
        }
        let essential = [
            ("cuCtxGetCurrent", t.ctx_get_current.is_some()),
            ("cuCtxSetCurrent", t.ctx_set_current.is_some()),
            ("cuDevicePrimaryCtxRetain", t.primary_retain.is_some()),
            ("cuDevicePrimaryCtxRelease_v2", t.primary_release.is_some()),
            ("cuDeviceGetCount", t.device_get_count.is_some()),
            ("cuDeviceGetAttribute", t.device_get_attribute.is_some()),
        ];
        let lacking: Vec<&str> = essential
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect();
        if !lacking.is_empty() {
            return Err(Error::Unsupported {
                what: lacking.join(", "),
                driver_version: Some(version),
                hint: "the driver is too old for this library; install a CUDA 12+ driver".into(),
            });
        }
        tracing::debug!(version, missing = ?t.missing_names(), "CUDA driver loaded");
        Ok(Cuda {
            t,
            version,
            deny: &DENY,
            contexts: Mutex::new(Vec::new()),
            last_device: AtomicI32::new(0),
        })
    }

    /// The driver version read at [`Cuda::open`] (`cuDriverGetVersion`, e.g. `13000`).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Whether this driver lacks the entry point behind `call`.
    pub fn missing(&self, call: Call) -> bool {
        !self.t.has(call)
    }

    /// `Ok` when this driver has logical endpoints: version at least
    /// [`LOGICAL_ENDPOINT_MIN_VERSION`] and every `cuLogicalEndpoint*` symbol.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming what the driver does have instead.
    pub fn require_logical_endpoints(&self) -> Result<(), Error> {
        let lacking: Vec<&str> = LE_CALLS
            .iter()
            .filter(|&&c| self.missing(c))
            .map(|c| c.name())
            .collect();
        if self.version >= LOGICAL_ENDPOINT_MIN_VERSION && lacking.is_empty() {
            return Ok(());
        }
        let has_all = |calls: &[Call]| calls.iter().all(|&c| !self.missing(c));
        let mut hint = match (has_all(VMM_CALLS), has_all(MULTICAST_CALLS)) {
            (true, true) => "this driver has VMM (cuMem*) and classic multicast (cuMulticast*; \
                             each team device must also report MULTICAST_SUPPORTED, attribute 132)"
                .to_owned(),
            (true, false) => {
                "this driver has VMM (cuMem*) but no classic multicast (cuMulticast*)".to_owned()
            }
            (false, _) => "this driver lacks the VMM calls (cuMem*) too".to_owned(),
        };
        hint.push_str("; logical endpoints need CUDA 13.3 drivers");
        if self.version >= LOGICAL_ENDPOINT_MIN_VERSION {
            hint.push_str(&format!(
                " (this one reports {} but does not export {})",
                self.version,
                lacking.join(", ")
            ));
        }
        Err(Error::Unsupported {
            what: "cuLogicalEndpoint* (logical endpoints need driver 13.3+)".into(),
            driver_version: Some(self.version),
            hint,
        })
    }

    /// The primary context of `dev`, retained on first use.
    fn primary(&self, dev: Device) -> DriverResult<Ctx> {
        let mut table = self.contexts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, ctx)) = table.iter().find(|(d, _)| *d == dev.0) {
            return Ok(ctx.0);
        }
        let retain = self.t.primary_retain.ok_or(Code::NOT_SUPPORTED)?;
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: `retain` is `cuDevicePrimaryCtxRetain`; `ctx` is a valid
        // out-pointer. An invalid ordinal is an error code, not UB.
        let rc = Code::from_raw(unsafe { retain(&mut ctx, dev.0) });
        tracing::trace!(device = dev.0, result = ?rc, "cuDevicePrimaryCtxRetain");
        if let Some(code) = rc {
            return Err(code);
        }
        table.push((dev.0, Retained(ctx)));
        Ok(ctx)
    }

    /// Makes the context for `cx` current on this thread until the guard drops.
    fn bind(&self, cx: Cx) -> DriverResult<CtxGuard<'_>> {
        let dev = match cx {
            Cx::Free => {
                return Ok(CtxGuard {
                    cuda: self,
                    previous: None,
                });
            }
            Cx::On(dev) => dev,
            Cx::Any => Device(self.last_device.load(Ordering::Relaxed)),
        };
        let ctx = self.primary(dev)?;
        // Only a device whose context exists serves later device-less calls.
        self.last_device.store(dev.0, Ordering::Relaxed);
        let (Some(get), Some(set)) = (self.t.ctx_get_current, self.t.ctx_set_current) else {
            return Err(Code::NOT_SUPPORTED);
        };
        let mut previous: Ctx = std::ptr::null_mut();
        // SAFETY: `get` is `cuCtxGetCurrent`; `previous` is a valid out-pointer.
        if let Some(code) = Code::from_raw(unsafe { get(&mut previous) }) {
            return Err(code);
        }
        if previous == ctx {
            return Ok(CtxGuard {
                cuda: self,
                previous: None,
            });
        }
        // SAFETY: `set` is `cuCtxSetCurrent`; `ctx` is a primary context this
        // object retained and has not released.
        if let Some(code) = Code::from_raw(unsafe { set(ctx) }) {
            return Err(code);
        }
        Ok(CtxGuard {
            cuda: self,
            previous: Some(previous),
        })
    }

    /// Runs one entry point: policy, presence, context, call, trace.
    /// `body` makes the C call through the resolved pointer and returns its
    /// raw result.
    fn run<F: Copy>(
        &self,
        call: Call,
        f: Option<F>,
        cx: Cx,
        args: fmt::Arguments<'_>,
        body: impl FnOnce(F) -> u32,
    ) -> DriverResult<()> {
        if self.deny.contains(call) {
            tracing::debug!(call = call.name(), %args, "denied by policy: CUDA_ERROR_NOT_PERMITTED");
            return Err(Code::NOT_PERMITTED);
        }
        let Some(f) = f else {
            tracing::debug!(call = call.name(), %args, "not exported by this driver: CUDA_ERROR_NOT_SUPPORTED");
            return Err(Code::NOT_SUPPORTED);
        };
        let _guard = self.bind(cx).inspect_err(|code| {
            tracing::debug!(call = call.name(), %args, %code, "no context for the call");
        })?;
        match Code::from_raw(body(f)) {
            None => {
                tracing::trace!(call = call.name(), %args, "CUDA_SUCCESS");
                Ok(())
            }
            Some(code) => {
                tracing::debug!(call = call.name(), %args, %code, "driver call failed");
                Err(code)
            }
        }
    }

    /// A backend with no entry points, for tests of the policy and presence checks.
    #[cfg(test)]
    fn detached(deny: &'static DenySet) -> Cuda {
        Cuda {
            t: Table::default(),
            version: 0,
            deny,
            contexts: Mutex::new(Vec::new()),
            last_device: AtomicI32::new(0),
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let table = self
            .contexts
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(release) = self.t.primary_release else {
            return;
        };
        for (dev, _) in table.drain(..) {
            // SAFETY: `release` is `cuDevicePrimaryCtxRelease_v2`; this object
            // retained `dev`'s primary context exactly once.
            let rc = Code::from_raw(unsafe { release(dev) });
            tracing::trace!(device = dev, result = ?rc, "cuDevicePrimaryCtxRelease");
        }
    }
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<i32> = self
            .contexts
            .lock()
            .map(|t| t.iter().map(|(d, _)| *d).collect())
            .unwrap_or_default();
        f.debug_struct("Cuda")
            .field("version", &self.version)
            .field("missing", &self.t.missing_names())
            .field("primary_contexts", &devices)
            .finish()
    }
}

static_assertions::assert_impl_all!(Cuda: Send, Sync);

impl Driver for Cuda {
    fn name(&self) -> String {
        "cuda".into()
    }

    unsafe fn driver_version(&self) -> DriverResult<i32> {
        let mut v: c_int = 0;
        self.run(
            Call::DriverGetVersion,
            self.t.driver_get_version,
            Cx::Free,
            format_args!(""),
            |f| {
                // SAFETY: `f` is `cuDriverGetVersion`; `v` is a valid out-pointer.
                unsafe { f(&mut v) }
            },
        )?;
        Ok(v)
    }

    unsafe fn device_count(&self) -> DriverResult<i32> {
        let mut n: c_int = 0;
        self.run(
            Call::DeviceGetCount,
            self.t.device_get_count,
            Cx::Free,
            format_args!(""),
            |f| {
                // SAFETY: `f` is `cuDeviceGetCount`; `n` is a valid out-pointer.
                unsafe { f(&mut n) }
            },
        )?;
        Ok(n)
    }

    unsafe fn device_attribute(&self, dev: Device, attr: i32) -> DriverResult<i32> {
        let mut v: c_int = 0;
        self.run(
            Call::DeviceGetAttribute,
            self.t.device_get_attribute,
            Cx::Free,
            format_args!("attr={attr} dev={}", dev.0),
            |f| {
                // SAFETY: `f` is `cuDeviceGetAttribute` typed with an `int`
                // attribute; unknown numbers are an error code, not UB.
                unsafe { f(&mut v, attr, dev.0) }
            },
        )?;
        Ok(v)
    }

    unsafe fn mem_get_info(&self, dev: Device) -> DriverResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        self.run(
            Call::MemGetInfo,
            self.t.mem_get_info,
            Cx::On(dev),
            format_args!("dev={}", dev.0),
            |f| {
                // SAFETY: `f` is `cuMemGetInfo_v2`; both are valid out-pointers and
                // `dev`'s primary context is current.
                unsafe { f(&mut free, &mut total) }
            },
        )?;
        Ok((free as u64, total as u64))
    }

    /// `cuDeviceGetCliqueCount` + `cuDeviceGetCliqueInfo` (13.4+): the id
    /// of `dev`'s multicast logical-endpoint clique. `NOT_SUPPORTED` on a
    /// driver without them, `NOT_FOUND` when `dev` is in no such clique. No
    /// context needed; not subject to the deny set (no [`Call`] names it).
    unsafe fn device_clique(&self, dev: Device) -> DriverResult<u32> {
        let (Some(count_f), Some(info_f)) = (self.t.clique_count, self.t.clique_info) else {
            return Err(Code::NOT_SUPPORTED);
        };
        let mut n: usize = 0;
        // SAFETY: `count_f` is `cuDeviceGetCliqueCount`; `n` is a valid
        // out-pointer; an invalid ordinal is an error code.
        if let Some(code) = Code::from_raw(unsafe { count_f(&mut n, dev.0) }) {
            tracing::debug!(device = dev.0, %code, "cuDeviceGetCliqueCount failed");
            return Err(code);
        }
        // A bound on what a driver may claim, so the buffer stays small.
        let n = n.min(64);
        if n == 0 {
            return Err(Code::NOT_FOUND);
        }
        let mut infos = vec![CliqueInfo::default(); n];
        let mut written = n;
        // SAFETY: `info_f` is `cuDeviceGetCliqueInfo`; `infos` holds
        // `written` writable `CUcliqueInfo`-layout entries (two `unsigned
        // int`s) and `written` says so on input.
        let rc = unsafe { info_f(infos.as_mut_ptr(), &mut written, dev.0) };
        if let Some(code) = Code::from_raw(rc) {
            tracing::debug!(device = dev.0, %code, "cuDeviceGetCliqueInfo failed");
            return Err(code);
        }
        infos
            .iter()
            .take(written.min(n))
            .find(|c| c.type_ == CLIQUE_MULTICAST_LOGICAL_ENDPOINT)
            .map(|c| c.id)
            .ok_or(Code::NOT_FOUND)
    }

    unsafe fn id_reserve(&self, count: u32) -> DriverResult<u32> {
        let mut base = 0u32;
        self.run(
            Call::IdReserve,
            self.t.le_id_reserve,
            Cx::Any,
            format_args!("count={count}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointIdReserve`; `base` is a valid out-pointer.
                unsafe { f(&mut base, count) }
            },
        )?;
        Ok(base)
    }

    unsafe fn id_release(&self, base: u32, count: u32) -> DriverResult<()> {
        self.run(
            Call::IdRelease,
            self.t.le_id_release,
            Cx::Any,
            format_args!("base={base} count={count}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointIdRelease`; plain integers.
                unsafe { f(base, count) }
            },
        )
    }

    unsafe fn get_limits(&self, props: EndpointProps) -> DriverResult<Limits> {
        let prop = &le_prop_c(&props);
        let (mut align, mut max) = (0u64, 0u64);
        self.run(
            Call::GetLimits,
            self.t.le_get_limits,
            Cx::Any,
            format_args!("prop={props:?}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointGetLimits`; two valid
                // out-pointers and a live `prop` the driver only reads.
                unsafe { f(&mut align, &mut max, prop) }
            },
        )?;
        Ok(Limits {
            bind_alignment: align,
            max_size: max,
        })
    }

    unsafe fn create(&self, id: u32, props: EndpointProps) -> DriverResult<()> {
        let prop = &le_prop_c(&props);
        self.run(
            Call::Create,
            self.t.le_create,
            Cx::Any,
            format_args!("id={id} prop={props:?}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointCreate`; `prop` is live and only read.
                unsafe { f(id, prop) }
            },
        )
    }

    unsafe fn add_device(&self, id: u32, dev: Device) -> DriverResult<()> {
        self.run(
            Call::AddDevice,
            self.t.le_add_device,
            Cx::On(dev),
            format_args!("id={id} dev={}", dev.0),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointAddDevice`; plain integers.
                unsafe { f(id, dev.0) }
            },
        )
    }

    unsafe fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        let mut status: c_int = 0;
        self.run(
            Call::Query,
            self.t.le_query,
            Cx::Any,
            format_args!("base={base} count={count}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointQuery`; `status` is a valid out-pointer.
                unsafe { f(base, count, &mut status) }
            },
        )?;
        Ok(status != 0)
    }

    unsafe fn bind_mem(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::BindMem,
            self.t.le_bind_mem,
            Cx::On(dev),
            format_args!(
                "id={id} dev={} offset={offset} mem={mem:#x} mem_offset={mem_offset} size={size} flags={flags}",
                dev.0
            ),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointBindMem`; plain integers and
                // a handle the driver validates.
                unsafe { f(id, dev.0, offset, mem, mem_offset, size, flags) }
            },
        )
    }

    unsafe fn bind_addr(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        ptr: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::BindAddr,
            self.t.le_bind_addr,
            Cx::On(dev),
            format_args!(
                "id={id} dev={} offset={offset} ptr={ptr:#x} size={size} flags={flags}",
                dev.0
            ),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointBindAddr`; `ptr` is a device
                // virtual address the driver validates and never dereferenced here.
                unsafe { f(id, dev.0, offset, ptr as *mut c_void, size, flags) }
            },
        )
    }

    unsafe fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::Unbind,
            self.t.le_unbind,
            Cx::On(dev),
            format_args!("id={id} dev={} offset={offset} size={size}", dev.0),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointUnbind`; plain integers.
                unsafe { f(id, dev.0, offset, size) }
            },
        )
    }

    unsafe fn destroy(&self, id: u32) -> DriverResult<()> {
        self.run(
            Call::Destroy,
            self.t.le_destroy,
            Cx::Any,
            format_args!("id={id}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointDestroy`; plain integer.
                unsafe { f(id) }
            },
        )
    }

    unsafe fn export(&self, id: u32) -> DriverResult<FabricHandleBytes> {
        let ty: c_uint = 1; // CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC
        let mut handle = FabricHandleBytes::ZERO;
        let out: *mut c_void = handle.0.as_mut_ptr().cast();
        self.run(
            Call::Export,
            self.t.le_export,
            Cx::Any,
            format_args!("id={id} type={ty}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointExport`; `out` points to a live,
                // exclusively borrowed 64-byte handle, the size the driver writes.
                unsafe { f(out, id, ty) }
            },
        )?;
        Ok(handle)
    }

    unsafe fn import(&self, id: u32, handle: FabricHandleBytes) -> DriverResult<()> {
        let ty: c_uint = 1; // CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC
        let src: *const c_void = handle.0.as_ptr().cast();
        self.run(
            Call::Import,
            self.t.le_import,
            Cx::Any,
            format_args!("id={id} type={ty}"),
            |f| {
                // SAFETY: `f` is `cuLogicalEndpointImport`; `src` points to a live
                // 64-byte handle the driver only reads.
                unsafe { f(id, src, ty) }
            },
        )
    }

    unsafe fn mem_granularity(
        &self,
        req: AllocationRequest,
        kind: Granularity,
    ) -> DriverResult<u64> {
        let prop = alloc_prop(&req);
        let flag = granularity_flag(kind);
        let mut g = 0usize;
        self.run(
            Call::MemGetAllocationGranularity,
            self.t.mem_get_granularity,
            cx_for(req.location),
            format_args!("req={req:?} kind={kind:?}"),
            |f| {
                // SAFETY: `f` is `cuMemGetAllocationGranularity`; `g` is a valid
                // out-pointer, `prop` a fully initialised struct; flag is 0 or 1.
                unsafe { f(&mut g, &prop, flag) }
            },
        )?;
        Ok(g as u64)
    }

    unsafe fn mem_create(&self, size: u64, req: AllocationRequest) -> DriverResult<u64> {
        let prop = alloc_prop(&req);
        let mut handle: c_ulonglong = 0;
        self.run(
            Call::MemCreate,
            self.t.mem_create,
            cx_for(req.location),
            format_args!("size={size} req={req:?}"),
            |f| {
                // SAFETY: `f` is `cuMemCreate`; `handle` is a valid out-pointer,
                // `prop` a fully initialised struct; flags must be 0.
                unsafe { f(&mut handle, sz(size), &prop, 0) }
            },
        )?;
        Ok(handle)
    }

    unsafe fn mem_release(&self, handle: u64) -> DriverResult<()> {
        self.run(
            Call::MemRelease,
            self.t.mem_release,
            Cx::Any,
            format_args!("handle={handle:#x}"),
            |f| {
                // SAFETY: `f` is `cuMemRelease`; the driver validates the handle.
                unsafe { f(handle) }
            },
        )
    }

    unsafe fn mem_properties(&self, handle: u64) -> DriverResult<AllocationRequest> {
        // Kept uninitialised-as-a-Rust-value: the driver may write enum values
        // that cudarc's enums lack, so fields are read back as raw integers.
        let mut prop = MaybeUninit::<Prop>::zeroed();
        let out = prop.as_mut_ptr();
        self.run(
            Call::MemGetAllocationProperties,
            self.t.mem_get_properties,
            Cx::Any,
            format_args!("handle={handle:#x}"),
            |f| {
                // SAFETY: `f` is `cuMemGetAllocationPropertiesFromHandle`; `out`
                // points to 32 writable, zeroed bytes laid out as the C struct.
                unsafe { f(out, handle) }
            },
        )?;
        let p = prop.as_ptr();
        // SAFETY: `p` points to initialised bytes (zeroed, then written by the
        // driver); each field is read as the integer type of its C layout
        // (enums are `unsigned int`, the location id an `int`), so no invalid
        // Rust enum value is ever produced.
        let (handle_types, loc_type, loc_id) = unsafe {
            (
                (&raw const (*p).requestedHandleTypes).cast::<u32>().read(),
                (&raw const (*p).location.type_).cast::<u32>().read(),
                (&raw const (*p).location.__bindgen_anon_1)
                    .cast::<i32>()
                    .read(),
            )
        };
        let location = match loc_type {
            1 => Location::Device(Device(loc_id)),
            3 => Location::HostNuma(loc_id),
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
            handle_types,
        })
    }

    unsafe fn mem_address_reserve(&self, size: u64, alignment: u64) -> DriverResult<u64> {
        let mut ptr: c_ulonglong = 0;
        self.run(
            Call::MemAddressReserve,
            self.t.mem_address_reserve,
            Cx::Any,
            format_args!("size={size} alignment={alignment}"),
            |f| {
                // SAFETY: `f` is `cuMemAddressReserve`; `ptr` is a valid
                // out-pointer; no fixed address, flags 0.
                unsafe { f(&mut ptr, sz(size), sz(alignment), 0, 0) }
            },
        )?;
        Ok(ptr)
    }

    unsafe fn mem_address_free(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::MemAddressFree,
            self.t.mem_address_free,
            Cx::Any,
            format_args!("ptr={ptr:#x} size={size}"),
            |f| {
                // SAFETY: `f` is `cuMemAddressFree`; the driver validates the range.
                unsafe { f(ptr, sz(size)) }
            },
        )
    }

    unsafe fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> DriverResult<()> {
        self.run(
            Call::MemMap,
            self.t.mem_map,
            Cx::Any,
            format_args!("ptr={ptr:#x} size={size} offset={offset} handle={handle:#x}"),
            |f| {
                // SAFETY: `f` is `cuMemMap`; the driver validates the reserved
                // range and the handle; flags must be 0.
                unsafe { f(ptr, sz(size), sz(offset), handle, 0) }
            },
        )
    }

    unsafe fn mem_unmap(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::MemUnmap,
            self.t.mem_unmap,
            Cx::Any,
            format_args!("ptr={ptr:#x} size={size}"),
            |f| {
                // SAFETY: `f` is `cuMemUnmap`; the driver validates the range.
                unsafe { f(ptr, sz(size)) }
            },
        )
    }

    unsafe fn mem_set_access(&self, ptr: u64, size: u64, devices: Vec<Device>) -> DriverResult<()> {
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&d| {
                // SAFETY: plain C struct; all-zero is valid (`PROT_NONE`,
                // location `INVALID`), then every field is set.
                let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
                desc.location = location(Location::Device(d));
                desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                desc
            })
            .collect();
        self.run(
            Call::MemSetAccess,
            self.t.mem_set_access,
            Cx::Any,
            format_args!("ptr={ptr:#x} size={size} devices={devices:?}"),
            |f| {
                // SAFETY: `f` is `cuMemSetAccess`; `descs` holds exactly `len`
                // initialised descriptors that outlive the call.
                unsafe { f(ptr, sz(size), descs.as_ptr(), descs.len()) }
            },
        )
    }

    unsafe fn multicast_granularity(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        let prop = mc_prop(num_devices, size, handle_types);
        let flag = granularity_flag(kind);
        let mut g = 0usize;
        self.run(
            Call::MulticastGetGranularity,
            self.t.mc_get_granularity,
            Cx::Any,
            format_args!(
                "num_devices={num_devices} size={size} handle_types={handle_types} kind={kind:?}"
            ),
            |f| {
                // SAFETY: `f` is `cuMulticastGetGranularity`; `g` is a valid
                // out-pointer, `prop` fully initialised; flag is 0 or 1.
                unsafe { f(&mut g, &prop, flag) }
            },
        )?;
        Ok(g as u64)
    }

    unsafe fn multicast_create(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
    ) -> DriverResult<u64> {
        let prop = mc_prop(num_devices, size, handle_types);
        let mut handle: c_ulonglong = 0;
        self.run(
            Call::MulticastCreate,
            self.t.mc_create,
            Cx::Any,
            format_args!("num_devices={num_devices} size={size} handle_types={handle_types}"),
            |f| {
                // SAFETY: `f` is `cuMulticastCreate`; `handle` is a valid
                // out-pointer, `prop` fully initialised.
                unsafe { f(&mut handle, &prop) }
            },
        )?;
        Ok(handle)
    }

    unsafe fn multicast_add_device(&self, mc: u64, dev: Device) -> DriverResult<()> {
        self.run(
            Call::MulticastAddDevice,
            self.t.mc_add_device,
            Cx::On(dev),
            format_args!("mc={mc:#x} dev={}", dev.0),
            |f| {
                // SAFETY: `f` is `cuMulticastAddDevice`; the driver validates both.
                unsafe { f(mc, dev.0) }
            },
        )
    }

    unsafe fn multicast_bind_mem(
        &self,
        mc: u64,
        mc_offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastBindMem,
            self.t.mc_bind_mem,
            Cx::Any,
            format_args!(
                "mc={mc:#x} mc_offset={mc_offset} mem={mem:#x} mem_offset={mem_offset} size={size}"
            ),
            |f| {
                // SAFETY: `f` is `cuMulticastBindMem`; handles and ranges are
                // validated by the driver; flags must be 0.
                unsafe { f(mc, sz(mc_offset), mem, sz(mem_offset), sz(size), 0) }
            },
        )
    }

    unsafe fn multicast_bind_addr(
        &self,
        mc: u64,
        mc_offset: u64,
        ptr: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastBindAddr,
            self.t.mc_bind_addr,
            Cx::Any,
            format_args!("mc={mc:#x} mc_offset={mc_offset} ptr={ptr:#x} size={size}"),
            |f| {
                // SAFETY: `f` is `cuMulticastBindAddr`; the driver validates the
                // handle and the mapped range; flags must be 0.
                unsafe { f(mc, sz(mc_offset), ptr, sz(size), 0) }
            },
        )
    }

    unsafe fn multicast_unbind(
        &self,
        mc: u64,
        dev: Device,
        mc_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastUnbind,
            self.t.mc_unbind,
            Cx::On(dev),
            format_args!("mc={mc:#x} dev={} mc_offset={mc_offset} size={size}", dev.0),
            |f| {
                // SAFETY: `f` is `cuMulticastUnbind`; the typed API only passes a
                // range a bind returned (SPEC C4).
                unsafe { f(mc, dev.0, sz(mc_offset), sz(size)) }
            },
        )
    }
}

/// VMM calls on device memory run in that device's context.
fn cx_for(loc: Location) -> Cx {
    match loc {
        Location::Device(d) => Cx::On(d),
        Location::HostNuma(_) => Cx::Any,
    }
}

/// Builds the C struct: zeroed first, then fields set, so padding is defined.
fn le_prop_c(props: &EndpointProps) -> LeProp {
    // SAFETY: a plain-old-data C struct; all-zero is a valid value.
    let mut p: LeProp = unsafe { std::mem::zeroed() };
    match props.shape {
        Shape::Unicast { owner } => {
            p.type_ = sys::CUlogicalEndpointType::CU_LOGICAL_ENDPOINT_TYPE_UNICAST;
            p.__bindgen_anon_1.unicast.device = owner.0;
        }
        Shape::Multicast { num_devices } => {
            p.type_ = sys::CUlogicalEndpointType::CU_LOGICAL_ENDPOINT_TYPE_MULTICAST;
            p.__bindgen_anon_1.multicast.numDevices = num_devices;
        }
    }
    p.size = props.size;
    p.ipcHandleTypes = u32::from(props.ipc_fabric);
    p.flags = u32::from(props.counted_ops);
    p
}

#[cfg(test)]
#[allow(unused_unsafe)] // interim: this file is split up next
mod tests {
    use super::*;

    #[test]
    fn open_without_libcuda_is_no_driver() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            // SAFETY: only probes the dynamic loader.
            let present = unsafe { sys::is_culib_present() };
            let opened = std::panic::catch_unwind(Cuda::open);
            let Ok(result) = opened else {
                panic!("Cuda::open panicked");
            };
            if !present {
                assert!(
                    matches!(result, Err(Error::NoDriver { .. })),
                    "expected NoDriver, got {result:?}"
                );
            }
        }
    }

    #[test]
    fn deny_set_bits() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            let set = DenySet::new();
            assert!(Call::ALL.iter().all(|&c| !set.contains(c)));
            set.add(Call::MulticastCreate);
            set.add(Call::MulticastUnbind);
            for &c in Call::ALL {
                let expected = matches!(c, Call::MulticastCreate | Call::MulticastUnbind);
                assert_eq!(set.contains(c), expected, "{c}");
            }
        }
    }

    #[test]
    fn denied_calls_never_reach_the_driver() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            // A private set, so that the process-wide policy of other tests is untouched.
            let set: &'static DenySet = Box::leak(Box::new(DenySet::new()));
            set.add(Call::MulticastCreate);
            let cuda = Cuda::detached(set);
            // Denied: NOT_PERMITTED, before the presence check.
            assert_eq!(
                cuda.multicast_create(2, 1 << 21, 0),
                Err(Code::NOT_PERMITTED)
            );
            // Not denied, not exported: NOT_SUPPORTED, nothing called.
            assert_eq!(
                cuda.multicast_granularity(2, 1 << 21, 0, Granularity::Minimum),
                Err(Code::NOT_SUPPORTED)
            );
            assert_eq!(cuda.id_reserve(1), Err(Code::NOT_SUPPORTED));
            assert!(cuda.missing(Call::Create));
            assert!(matches!(
                cuda.require_logical_endpoints(),
                Err(Error::Unsupported {
                    driver_version: Some(0),
                    ..
                })
            ));
        }
    }

    #[test]
    fn deny_list_parsing() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            let (calls, unknown) =
                parse_deny_list(" cuMulticastCreate,,cuMemCreate , cuMulticastCreat");
            assert_eq!(calls, vec![Call::MulticastCreate, Call::MemCreate]);
            assert_eq!(unknown, vec!["cuMulticastCreat".to_owned()]);
            assert_eq!(parse_deny_list(""), (vec![], vec![]));
        }
    }

    #[test]
    fn allocation_prop_marshalling() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            let req = AllocationRequest {
                location: Location::HostNuma(1),
                handle_types: crate::driver::handle_bits::POSIX_FD,
            };
            let p = alloc_prop(&req);
            assert_eq!(p.type_ as u32, 1);
            assert_eq!(p.requestedHandleTypes.0, 1);
            assert_eq!(p.location.type_ as u32, 3);
            // SAFETY: the `id` member was the one written.
            assert_eq!(unsafe { p.location.__bindgen_anon_1.id }, 1);
        }
    }

    /// Real-driver smoke test: `cargo test --lib -- --ignored gpu_smoke`.
    /// Denies `cuMulticastCreate` first and never calls it.
    #[test]
    #[ignore = "needs a CUDA driver"]
    fn gpu_smoke() {
        // SAFETY: the test owns everything it names; no typed object exists.
        unsafe {
            use crate::driver::handle_bits;
            deny(&[Call::MulticastCreate]);
            let cuda = match Cuda::open() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("skip: {e}");
                    return;
                }
            };
            eprintln!("{cuda:?}");
            eprintln!(
                "require_logical_endpoints: {:?}",
                cuda.require_logical_endpoints()
            );
            if let Err(e) = cuda.require_logical_endpoints() {
                eprintln!("  display: {e}");
            }
            assert_eq!(cuda.driver_version(), Ok(cuda.version()));
            eprintln!("device_count: {:?}", cuda.device_count());

            // Which calls need a current context? Raw calls on a fresh thread,
            // before this process has any context.
            let t = cuda.t;
            std::thread::scope(|s| {
                s.spawn(|| {
                    let prop = alloc_prop(&AllocationRequest {
                        location: Location::Device(Device(0)),
                        handle_types: 0,
                    });
                    let mut g = 0usize;
                    let (mut free, mut total) = (0usize, 0usize);
                    let mut ptr = 0u64;
                    let mut h = 0u64;
                    // SAFETY: resolved entry points with valid out-pointers.
                    unsafe {
                        eprintln!(
                            "no ctx: cuMemGetAllocationGranularity {:?}",
                            Code::from_raw(t.mem_get_granularity.unwrap()(&mut g, &prop, 0))
                        );
                        eprintln!(
                            "no ctx: cuMemGetInfo {:?}",
                            Code::from_raw(t.mem_get_info.unwrap()(&mut free, &mut total))
                        );
                        eprintln!(
                            "no ctx: cuMemAddressReserve {:?}",
                            Code::from_raw(t.mem_address_reserve.unwrap()(
                                &mut ptr,
                                2 << 20,
                                0,
                                0,
                                0
                            ))
                        );
                        eprintln!(
                            "no ctx: cuMemCreate {:?}",
                            Code::from_raw(t.mem_create.unwrap()(&mut h, 2 << 20, &prop, 0))
                        );
                        eprintln!(
                            "no ctx: cuMemMap {:?}",
                            Code::from_raw(t.mem_map.unwrap()(ptr, 2 << 20, 0, h, 0))
                        );
                        let d = [{
                            let mut desc: sys::CUmemAccessDesc = std::mem::zeroed();
                            desc.location = location(Location::Device(Device(0)));
                            desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                            desc
                        }];
                        eprintln!(
                            "no ctx: cuMemSetAccess {:?}",
                            Code::from_raw(t.mem_set_access.unwrap()(ptr, 2 << 20, d.as_ptr(), 1))
                        );
                        eprintln!(
                            "no ctx: cuMemSetAccess(count 0) {:?}",
                            Code::from_raw(t.mem_set_access.unwrap()(ptr, 2 << 20, d.as_ptr(), 0))
                        );
                        eprintln!(
                            "no ctx: cuMemUnmap {:?}",
                            Code::from_raw(t.mem_unmap.unwrap()(ptr, 2 << 20))
                        );
                        if h != 0 {
                            eprintln!(
                                "no ctx: cuMemRelease {:?}",
                                Code::from_raw(t.mem_release.unwrap()(h))
                            );
                        }
                        h = 0;
                        if ptr != 0 {
                            eprintln!(
                                "no ctx: cuMemAddressFree {:?}",
                                Code::from_raw(t.mem_address_free.unwrap()(ptr, 2 << 20))
                            );
                        }
                        eprintln!(
                            "no ctx: cuMemCreate {:?}",
                            Code::from_raw(t.mem_create.unwrap()(&mut h, 2 << 20, &prop, 0))
                        );
                        if h != 0 {
                            eprintln!(
                                "no ctx: cuMemRelease {:?}",
                                Code::from_raw(t.mem_release.unwrap()(h))
                            );
                        }
                    }
                });
            });

            for attr in [128, 132, 134, 153, 154, 155, 156] {
                eprintln!("attr {attr}: {:?}", cuda.device_attribute(Device(0), attr));
            }
            assert_eq!(
                cuda.multicast_create(1, 2 << 20, 0),
                Err(Code::NOT_PERMITTED)
            );
            assert_eq!(cuda.id_reserve(1), Err(Code::NOT_SUPPORTED));

            let req = AllocationRequest {
                location: Location::Device(Device(0)),
                handle_types: handle_bits::POSIX_FD,
            };
            let g = cuda.mem_granularity(req, Granularity::Minimum).unwrap();
            eprintln!(
                "granularity min {g}, rec {:?}",
                cuda.mem_granularity(req, Granularity::Recommended)
            );
            let h = cuda.mem_create(g, req).unwrap();
            assert_eq!(cuda.mem_properties(h), Ok(req));
            let ptr = cuda.mem_address_reserve(g, g).unwrap();
            cuda.mem_map(ptr, g, 0, h).unwrap();
            cuda.mem_set_access(ptr, g, vec![Device(0)]).unwrap();
            eprintln!("mem_get_info: {:?}", cuda.mem_get_info(Device(0)));
            cuda.mem_unmap(ptr, g).unwrap();
            cuda.mem_address_free(ptr, g).unwrap();
            cuda.mem_release(h).unwrap();
            let fabric = AllocationRequest {
                handle_types: handle_bits::FABRIC,
                ..req
            };
            eprintln!("fabric mem_create: {:?}", cuda.mem_create(g, fabric));
            if let Ok(numa) = cuda.device_attribute(Device(0), 134) {
                let host = AllocationRequest {
                    location: Location::HostNuma(numa),
                    handle_types: 0,
                };
                match cuda.mem_create(g, host) {
                    Ok(h) => {
                        eprintln!("host numa {numa}: props {:?}", cuda.mem_properties(h));
                        eprintln!("release {:?}", cuda.mem_release(h));
                    }
                    Err(c) => eprintln!("host numa {numa}: mem_create {c}"),
                }
            }
            eprintln!(
                "bad device mem_get_info: {:?}",
                cuda.mem_get_info(Device(99))
            );
            // A failed device does not become the one for device-less calls.
            let va = cuda.mem_address_reserve(g, g).unwrap();
            cuda.mem_address_free(va, g).unwrap();
            // The thread's binding was restored: nothing current now.
            let mut cur: Ctx = std::ptr::null_mut();
            // SAFETY: `cuCtxGetCurrent` with a valid out-pointer.
            let rc = unsafe { t.ctx_get_current.unwrap()(&mut cur) };
            assert_eq!((rc, cur.is_null()), (0, true));
            eprintln!("{cuda:?}");
            drop(cuda);
        }
    }
}

//! [`Traced`]: a [`Driver`] wrapper that records every call and enforces a
//! per-wrapper call policy.
//!
//! Each call that reaches a `Traced` is appended to its log as a
//! [`TraceEntry`] (entry point, arguments in words, outcome) and emitted as a
//! `tracing::debug!` event (target `cuda_endpoints::driver::trace`). Calls on
//! its deny list are answered `CUDA_ERROR_NOT_PERMITTED` and never reach the
//! inner driver; the log marks them `denied`.
//!
//! Stack it where the question is: `Classic::new(Arc::new(Traced::new(cuda)))`
//! shows exactly which `cuMulticast*` calls the classic fallback made on the
//! real driver, and `.deny([Call::MulticastCreate])` proves one was never
//! made. Keep an `Arc<Traced<_>>` to read the log after handing a clone to
//! the wrapper above it.
//!
//! This module also makes `Arc<D>` a [`Driver`] for every driver `D`
//! (`Arc<dyn Driver>` included), so a shared backend can be wrapped.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::prop::Props;
use super::{
    AllocationRequest, Call, Code, Device, Driver, DriverResult, Granularity, Limits, sys,
};

/// One call as it reached a [`Traced`] driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// The entry point; `None` only for calls that have no [`Call`] name yet
    /// (`cuDeviceGetCliqueInfo`).
    pub call: Option<Call>,
    /// The `cuda.h` name, e.g. `"cuMulticastCreate"`.
    pub name: &'static str,
    /// The arguments in words, e.g. `"num_devices=2 size=2097152 handle_types=0"`.
    pub args: String,
    /// What the call returned: the value in words (`""` for none), or the code.
    pub result: Result<String, Code>,
    /// Refused by this wrapper's deny list: the inner driver never saw it.
    pub denied: bool,
}

impl TraceEntry {
    /// Whether this call went through to the inner driver.
    pub fn reached(&self) -> bool {
        !self.denied
    }
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name, self.args)?;
        match (&self.result, self.denied) {
            (Err(code), true) => write!(f, " -> {code} (denied by policy)"),
            (Err(code), false) => write!(f, " -> {code}"),
            (Ok(v), _) if v.is_empty() => write!(f, " -> CUDA_SUCCESS"),
            (Ok(v), _) => write!(f, " -> {v}"),
        }
    }
}

/// A [`Driver`] that records every call to `inner` and refuses the calls on
/// its deny list with `CUDA_ERROR_NOT_PERMITTED` before they reach `inner`.
///
/// ```
/// # #[cfg(feature = "model")] {
/// use std::sync::Arc;
/// use cuda_endpoints::driver::{Call, Traced};
/// use cuda_endpoints::model::{Model, ModelConfig};
/// use cuda_endpoints::{Allocation, Code, Context, Device, Error, Private};
///
/// let traced = Arc::new(Traced::new(Model::new(ModelConfig::node(1))).deny([Call::MemCreate]));
/// let ctx = Context::from_arc(traced.clone());
/// let e = Allocation::<Private>::on_device(&ctx, Device(0), 1).unwrap_err();
/// assert!(matches!(e, Error::Driver { call: Call::MemCreate, code: Code::NOT_PERMITTED }));
/// assert!(!traced.reached(Call::MemCreate));
/// # }
/// ```
pub struct Traced<D> {
    inner: D,
    deny: Vec<Call>,
    log: Arc<Mutex<Vec<TraceEntry>>>,
}

impl<D: fmt::Debug> fmt::Debug for Traced<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Traced")
            .field("inner", &self.inner)
            .field("deny", &self.deny)
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl<D> Traced<D> {
    fn lock(&self) -> MutexGuard<'_, Vec<TraceEntry>> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<D: Driver> Traced<D> {
    /// Records every call to `inner`; denies nothing.
    pub fn new(inner: D) -> Traced<D> {
        Traced {
            inner,
            deny: Vec::new(),
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Adds `calls` to the deny list: they answer `CUDA_ERROR_NOT_PERMITTED`
    /// without reaching the inner driver.
    pub fn deny(mut self, calls: impl IntoIterator<Item = Call>) -> Traced<D> {
        for c in calls {
            if !self.deny.contains(&c) {
                self.deny.push(c);
            }
        }
        self
    }

    /// Whether `call` is on this wrapper's deny list.
    pub fn denies(&self, call: Call) -> bool {
        self.deny.contains(&call)
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// A copy of the log, oldest first.
    pub fn log(&self) -> Vec<TraceEntry> {
        self.lock().clone()
    }

    /// The shared log itself, to read it after the wrapper was moved away.
    pub fn log_handle(&self) -> Arc<Mutex<Vec<TraceEntry>>> {
        self.log.clone()
    }

    /// Empties the log.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The entry points called, in order (denied ones included).
    pub fn calls(&self) -> Vec<Call> {
        self.lock().iter().filter_map(|e| e.call).collect()
    }

    /// How many times `call` was made (denied ones included).
    pub fn count(&self, call: Call) -> usize {
        self.lock().iter().filter(|e| e.call == Some(call)).count()
    }

    /// Whether `call` ever reached the inner driver.
    pub fn reached(&self, call: Call) -> bool {
        self.lock()
            .iter()
            .any(|e| e.call == Some(call) && e.reached())
    }

    /// The entries for `call`, in order.
    pub fn entries(&self, call: Call) -> Vec<TraceEntry> {
        self.lock()
            .iter()
            .filter(|e| e.call == Some(call))
            .cloned()
            .collect()
    }

    /// Runs one call: policy, inner call, log, event.
    fn run<T>(
        &self,
        call: Call,
        args: impl FnOnce() -> String,
        show: impl FnOnce(&T) -> String,
        body: impl FnOnce(&D) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let denied = self.deny.contains(&call);
        let args = args();
        let r = if denied {
            Err(Code::NOT_PERMITTED)
        } else {
            body(&self.inner)
        };
        self.record(Some(call), call.name(), args, &r, show, denied);
        r
    }

    fn record<T>(
        &self,
        call: Option<Call>,
        name: &'static str,
        args: String,
        r: &DriverResult<T>,
        show: impl FnOnce(&T) -> String,
        denied: bool,
    ) {
        let result = r.as_ref().map(show).map_err(|c| *c);
        match (&result, denied) {
            (_, true) => {
                tracing::debug!(call = name, %args, "denied by the trace policy: CUDA_ERROR_NOT_PERMITTED")
            }
            (Ok(v), false) => tracing::debug!(call = name, %args, result = %v, "CUDA_SUCCESS"),
            (Err(code), false) => tracing::debug!(call = name, %args, %code, "driver call failed"),
        }
        self.lock().push(TraceEntry {
            call,
            name,
            args,
            result,
            denied,
        });
    }
}

fn none<T>(_: &T) -> String {
    String::new()
}

fn hex(v: &u64) -> String {
    format!("{v:#x}")
}

fn num<T: fmt::Display>(v: &T) -> String {
    v.to_string()
}

fn prop(p: &sys::CUlogicalEndpointProp) -> String {
    match Props::from_c(p) {
        Some(p) => format!(
            "{:?} size={} ipc={} flags={}",
            p.shape, p.size, p.ipc_handle_types, p.flags
        ),
        None => "invalid type".into(),
    }
}

impl<D: Driver> Driver for Traced<D> {
    fn name(&self) -> String {
        format!("traced({})", self.inner.name())
    }

    fn driver_version(&self) -> DriverResult<i32> {
        self.run(Call::DriverGetVersion, String::new, num, |d| {
            d.driver_version()
        })
    }
    fn device_count(&self) -> DriverResult<i32> {
        self.run(Call::DeviceGetCount, String::new, num, |d| d.device_count())
    }
    fn device_attribute(&self, dev: Device, a: i32) -> DriverResult<i32> {
        self.run(
            Call::DeviceGetAttribute,
            || format!("attr={a} dev={}", dev.0),
            num,
            |d| d.device_attribute(dev, a),
        )
    }
    fn mem_get_info(&self, dev: Device) -> DriverResult<(u64, u64)> {
        self.run(
            Call::MemGetInfo,
            || format!("dev={}", dev.0),
            |(f, t)| format!("free={f} total={t}"),
            |d| d.mem_get_info(dev),
        )
    }
    fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
        self.inner.explain_unsupported(call)
    }
    fn device_clique(&self, dev: Device) -> DriverResult<u32> {
        let r = self.inner.device_clique(dev);
        self.record(
            None,
            "cuDeviceGetCliqueInfo",
            format!("dev={}", dev.0),
            &r,
            num,
            false,
        );
        r
    }

    fn id_reserve(&self, count: u32) -> DriverResult<u32> {
        self.run(
            Call::IdReserve,
            || format!("count={count}"),
            |b| format!("base={b}"),
            |d| d.id_reserve(count),
        )
    }
    fn id_release(&self, base: u32, count: u32) -> DriverResult<()> {
        self.run(
            Call::IdRelease,
            || format!("base={base} count={count}"),
            none,
            |d| d.id_release(base, count),
        )
    }
    fn get_limits(&self, p: &sys::CUlogicalEndpointProp) -> DriverResult<Limits> {
        self.run(
            Call::GetLimits,
            || prop(p),
            |l: &Limits| {
                format!(
                    "bind_alignment={} max_size={}",
                    l.bind_alignment, l.max_size
                )
            },
            |d| d.get_limits(p),
        )
    }
    fn create(&self, id: u32, p: &sys::CUlogicalEndpointProp) -> DriverResult<()> {
        self.run(
            Call::Create,
            || format!("id={id} {}", prop(p)),
            none,
            |d| d.create(id, p),
        )
    }
    fn add_device(&self, id: u32, dev: Device) -> DriverResult<()> {
        self.run(
            Call::AddDevice,
            || format!("id={id} dev={}", dev.0),
            none,
            |d| d.add_device(id, dev),
        )
    }
    fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        self.run(
            Call::Query,
            || format!("base={base} count={count}"),
            |ready| format!("ready={ready}"),
            |d| d.query(base, count),
        )
    }
    fn bind_mem(
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
            || {
                format!(
                    "id={id} dev={} offset={offset} mem={mem:#x} mem_offset={mem_offset} size={size} flags={flags}",
                    dev.0
                )
            },
            none,
            |d| d.bind_mem(id, dev, offset, mem, mem_offset, size, flags),
        )
    }
    fn bind_addr(
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
            || {
                format!(
                    "id={id} dev={} offset={offset} ptr={ptr:#x} size={size} flags={flags}",
                    dev.0
                )
            },
            none,
            |d| d.bind_addr(id, dev, offset, ptr, size, flags),
        )
    }
    fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::Unbind,
            || format!("id={id} dev={} offset={offset} size={size}", dev.0),
            none,
            |d| d.unbind(id, dev, offset, size),
        )
    }
    fn destroy(&self, id: u32) -> DriverResult<()> {
        self.run(
            Call::Destroy,
            || format!("id={id}"),
            none,
            |d| d.destroy(id),
        )
    }
    fn export(
        &self,
        id: u32,
        handle: &mut sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        self.run(
            Call::Export,
            || format!("id={id} handle_type={}", handle_type as u32),
            none,
            |d| d.export(id, handle, handle_type),
        )
    }
    fn import(
        &self,
        id: u32,
        handle: &sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        self.run(
            Call::Import,
            || format!("id={id} handle_type={}", handle_type as u32),
            none,
            |d| d.import(id, handle, handle_type),
        )
    }

    fn mem_granularity(&self, req: &AllocationRequest, kind: Granularity) -> DriverResult<u64> {
        self.run(
            Call::MemGetAllocationGranularity,
            || {
                format!(
                    "location={:?} handle_types={} kind={kind:?}",
                    req.location, req.handle_types
                )
            },
            num,
            |d| d.mem_granularity(req, kind),
        )
    }
    fn mem_create(&self, size: u64, req: &AllocationRequest) -> DriverResult<u64> {
        self.run(
            Call::MemCreate,
            || {
                format!(
                    "size={size} location={:?} handle_types={}",
                    req.location, req.handle_types
                )
            },
            hex,
            |d| d.mem_create(size, req),
        )
    }
    fn mem_release(&self, handle: u64) -> DriverResult<()> {
        self.run(
            Call::MemRelease,
            || format!("handle={handle:#x}"),
            none,
            |d| d.mem_release(handle),
        )
    }
    fn mem_properties(&self, handle: u64) -> DriverResult<AllocationRequest> {
        self.run(
            Call::MemGetAllocationProperties,
            || format!("handle={handle:#x}"),
            |r: &AllocationRequest| {
                format!("location={:?} handle_types={}", r.location, r.handle_types)
            },
            |d| d.mem_properties(handle),
        )
    }
    fn mem_address_reserve(&self, size: u64, alignment: u64) -> DriverResult<u64> {
        self.run(
            Call::MemAddressReserve,
            || format!("size={size} alignment={alignment}"),
            hex,
            |d| d.mem_address_reserve(size, alignment),
        )
    }
    fn mem_address_free(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::MemAddressFree,
            || format!("ptr={ptr:#x} size={size}"),
            none,
            |d| d.mem_address_free(ptr, size),
        )
    }
    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> DriverResult<()> {
        self.run(
            Call::MemMap,
            || format!("ptr={ptr:#x} size={size} offset={offset} handle={handle:#x}"),
            none,
            |d| d.mem_map(ptr, size, offset, handle),
        )
    }
    fn mem_unmap(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.run(
            Call::MemUnmap,
            || format!("ptr={ptr:#x} size={size}"),
            none,
            |d| d.mem_unmap(ptr, size),
        )
    }
    fn mem_set_access(&self, ptr: u64, size: u64, devices: &[Device]) -> DriverResult<()> {
        self.run(
            Call::MemSetAccess,
            || {
                let devs: Vec<i32> = devices.iter().map(|d| d.0).collect();
                format!("ptr={ptr:#x} size={size} devices={devs:?}")
            },
            none,
            |d| d.mem_set_access(ptr, size, devices),
        )
    }

    fn multicast_granularity(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        self.run(
            Call::MulticastGetGranularity,
            || {
                format!(
                    "num_devices={num_devices} size={size} handle_types={handle_types} kind={kind:?}"
                )
            },
            num,
            |d| d.multicast_granularity(num_devices, size, handle_types, kind),
        )
    }
    fn multicast_create(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
    ) -> DriverResult<u64> {
        self.run(
            Call::MulticastCreate,
            || format!("num_devices={num_devices} size={size} handle_types={handle_types}"),
            hex,
            |d| d.multicast_create(num_devices, size, handle_types),
        )
    }
    fn multicast_add_device(&self, mc: u64, dev: Device) -> DriverResult<()> {
        self.run(
            Call::MulticastAddDevice,
            || format!("mc={mc:#x} dev={}", dev.0),
            none,
            |d| d.multicast_add_device(mc, dev),
        )
    }
    fn multicast_bind_mem(
        &self,
        mc: u64,
        mc_offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastBindMem,
            || {
                format!(
                    "mc={mc:#x} mc_offset={mc_offset} mem={mem:#x} mem_offset={mem_offset} size={size}"
                )
            },
            none,
            |d| d.multicast_bind_mem(mc, mc_offset, mem, mem_offset, size),
        )
    }
    fn multicast_bind_addr(
        &self,
        mc: u64,
        mc_offset: u64,
        ptr: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastBindAddr,
            || format!("mc={mc:#x} mc_offset={mc_offset} ptr={ptr:#x} size={size}"),
            none,
            |d| d.multicast_bind_addr(mc, mc_offset, ptr, size),
        )
    }
    fn multicast_unbind(
        &self,
        mc: u64,
        dev: Device,
        mc_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.run(
            Call::MulticastUnbind,
            || format!("mc={mc:#x} dev={} mc_offset={mc_offset} size={size}", dev.0),
            none,
            |d| d.multicast_unbind(mc, dev, mc_offset, size),
        )
    }
}

/// A shared driver is a driver: every call goes to the one behind the `Arc`.
impl<D: Driver + ?Sized> Driver for Arc<D> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn driver_version(&self) -> DriverResult<i32> {
        (**self).driver_version()
    }
    fn device_count(&self) -> DriverResult<i32> {
        (**self).device_count()
    }
    fn device_attribute(&self, dev: Device, a: i32) -> DriverResult<i32> {
        (**self).device_attribute(dev, a)
    }
    fn mem_get_info(&self, dev: Device) -> DriverResult<(u64, u64)> {
        (**self).mem_get_info(dev)
    }
    fn device_clique(&self, dev: Device) -> DriverResult<u32> {
        (**self).device_clique(dev)
    }
    fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
        (**self).explain_unsupported(call)
    }
    fn id_reserve(&self, count: u32) -> DriverResult<u32> {
        (**self).id_reserve(count)
    }
    fn id_release(&self, base: u32, count: u32) -> DriverResult<()> {
        (**self).id_release(base, count)
    }
    fn get_limits(&self, p: &sys::CUlogicalEndpointProp) -> DriverResult<Limits> {
        (**self).get_limits(p)
    }
    fn create(&self, id: u32, p: &sys::CUlogicalEndpointProp) -> DriverResult<()> {
        (**self).create(id, p)
    }
    fn add_device(&self, id: u32, dev: Device) -> DriverResult<()> {
        (**self).add_device(id, dev)
    }
    fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        (**self).query(base, count)
    }
    fn bind_mem(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        (**self).bind_mem(id, dev, offset, mem, mem_offset, size, flags)
    }
    fn bind_addr(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        ptr: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        (**self).bind_addr(id, dev, offset, ptr, size, flags)
    }
    fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()> {
        (**self).unbind(id, dev, offset, size)
    }
    fn destroy(&self, id: u32) -> DriverResult<()> {
        (**self).destroy(id)
    }
    fn export(
        &self,
        id: u32,
        handle: &mut sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        (**self).export(id, handle, handle_type)
    }
    fn import(
        &self,
        id: u32,
        handle: &sys::CUlogicalEndpointFabricHandle,
        handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        (**self).import(id, handle, handle_type)
    }
    fn mem_granularity(&self, req: &AllocationRequest, kind: Granularity) -> DriverResult<u64> {
        (**self).mem_granularity(req, kind)
    }
    fn mem_create(&self, size: u64, req: &AllocationRequest) -> DriverResult<u64> {
        (**self).mem_create(size, req)
    }
    fn mem_release(&self, handle: u64) -> DriverResult<()> {
        (**self).mem_release(handle)
    }
    fn mem_properties(&self, handle: u64) -> DriverResult<AllocationRequest> {
        (**self).mem_properties(handle)
    }
    fn mem_address_reserve(&self, size: u64, alignment: u64) -> DriverResult<u64> {
        (**self).mem_address_reserve(size, alignment)
    }
    fn mem_address_free(&self, ptr: u64, size: u64) -> DriverResult<()> {
        (**self).mem_address_free(ptr, size)
    }
    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> DriverResult<()> {
        (**self).mem_map(ptr, size, offset, handle)
    }
    fn mem_unmap(&self, ptr: u64, size: u64) -> DriverResult<()> {
        (**self).mem_unmap(ptr, size)
    }
    fn mem_set_access(&self, ptr: u64, size: u64, devices: &[Device]) -> DriverResult<()> {
        (**self).mem_set_access(ptr, size, devices)
    }
    fn multicast_granularity(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        (**self).multicast_granularity(num_devices, size, handle_types, kind)
    }
    fn multicast_create(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
    ) -> DriverResult<u64> {
        (**self).multicast_create(num_devices, size, handle_types)
    }
    fn multicast_add_device(&self, mc: u64, dev: Device) -> DriverResult<()> {
        (**self).multicast_add_device(mc, dev)
    }
    fn multicast_bind_mem(
        &self,
        mc: u64,
        mc_offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        (**self).multicast_bind_mem(mc, mc_offset, mem, mem_offset, size)
    }
    fn multicast_bind_addr(
        &self,
        mc: u64,
        mc_offset: u64,
        ptr: u64,
        size: u64,
    ) -> DriverResult<()> {
        (**self).multicast_bind_addr(mc, mc_offset, ptr, size)
    }
    fn multicast_unbind(
        &self,
        mc: u64,
        dev: Device,
        mc_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        (**self).multicast_unbind(mc, dev, mc_offset, size)
    }
}

//! The reference model of the driver contract: a pure-Rust [`Driver`] that
//! enforces the rules R1–R12 and C1–C6 of the driver contract
//! (the contract, `cuda_endpoints::guide::contract`) with the codes it gives, on simulated devices
//! with host memory standing in for device memory.
//!
//! The crate `cuda-endpoints` re-exports it as `cuda_endpoints::model`
//! with its feature `model` (`Context::model` makes a context over a new
//! [`Model`]); the model fabric, which OS processes share, is this crate's
//! feature `fabric` (module `fabric`, the launcher `cuda-endpoints-fabric`).
//!
//! One [`Model`] value is one process of a simulated fabric: one or more
//! nodes ([`FabricConfig`]), each with its devices. Values made with
//! [`Model::new`] (one node) or [`Model::fabric`] share nothing, so parallel
//! tests never see each other. [`Model::spawn_process`] and
//! [`Model::spawn_process_on`] add processes to the same fabric, for
//! export/import between ranks; [`Model::exit`] ends one as the driver does
//! at process exit (R12.2). Separate OS processes share one fabric through
//! the fabric server (feature `fabric`). Everything lives behind one mutex:
//! the model is thread-safe and simple, not fast.
//!
//! What the model owns:
//! - `config`: simulated devices and their attributes ([`ModelConfig`],
//!   [`SimDevice`], [`FabricConfig`]);
//! - `state`: the tables (ids, endpoint objects, allocations, mappings,
//!   classic multicast objects) and the leak counters ([`Live`]);
//! - [`faults`]: failing any call on demand;
//! - `process`: processes joining and exiting, shareable handles (R12);
//! - `shareable`: a shareable handle as a real descriptor or fabric bytes (C5);
//! - `endpoints`, `memory`, `classic`: the rules, one file per API family.
//!
//! Every rule violation that reaches the model is also logged as a
//! [`Violation`] (with its rule number), so tests can assert that the typed
//! API never lets one through.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod classic;
mod config;
mod copy;
mod endpoints;
#[cfg(feature = "fabric")]
#[cfg_attr(docsrs, doc(cfg(feature = "fabric")))]
pub mod fabric;
pub mod faults;
mod memory;
mod process;
pub(crate) mod shareable;
mod state;

// The boundary under the name the model's files use for it.
use cuda_endpoints_driver as driver;

use std::os::fd::{BorrowedFd, IntoRawFd};
use std::sync::{Arc, Mutex, MutexGuard};

pub use config::{FabricConfig, ModelConfig, SimDevice};
pub use process::{FabricLive, ShareableKind};
pub use state::{Live, Violation};

use crate::faults::FaultPlan;

use crate::driver::{
    AllocationRequest, Call, Code, CopyOps, Device, Driver, DriverResult, EndpointProps,
    FabricHandleBytes, Granularity, Limits, MemcpyOps, Pointer, ShareableHandle,
};
use state::World;

/// One simulated process on a node of a simulated fabric. Cloning gives
/// another handle to the same process.
#[derive(Clone)]
pub struct Model {
    world: Arc<Mutex<World>>,
    pid: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Model(process {})", self.pid)
    }
}

impl Model {
    /// A new node with one process on it.
    pub fn new(config: ModelConfig) -> Model {
        Model::fabric(FabricConfig::single(config))
    }

    /// A new fabric, and its first process (on node 0).
    pub fn fabric(config: FabricConfig) -> Model {
        let mut world = World::new(config.nodes);
        world.imex_default = config.imex_channel;
        let pid = world.add_process_on(0, config.imex_channel).unwrap_or(0);
        Model {
            world: Arc::new(Mutex::new(world)),
            pid,
        }
    }

    /// Another process on the same node: it shares devices, exported
    /// endpoints and the fabric, but has its own ids (for R8/R9 tests).
    pub fn spawn_process(&self) -> Model {
        let node = self.node();
        self.spawn_process_on(node).unwrap_or_else(|| self.clone())
    }

    /// Another process on `node` of this fabric; `None` when the fabric has
    /// no such node. It gets an IMEX channel as [`FabricConfig::imex_channel`] says.
    pub fn spawn_process_on(&self, node: usize) -> Option<Model> {
        self.join_process(node, None)
    }

    /// This process's number on the node (0 for the first).
    pub fn pid(&self) -> usize {
        self.pid
    }

    /// What this process still holds: ids, endpoints, bindings, allocations,
    /// mappings, address ranges and classic multicast objects.
    pub fn live(&self) -> Live {
        self.lock().live(self.pid)
    }

    /// What the whole node still holds, over every process of this
    /// process's node.
    pub fn live_node(&self) -> Live {
        let w = self.lock();
        let node = w.procs.get(self.pid).map_or(0, |p| p.node);
        w.live_on(node)
    }

    /// The rule violations that reached the model so far, in order: the
    /// most recent [`MAX_VIOLATIONS`]; [`Model::violations_dropped`] counts
    /// the older ones dropped.
    pub fn violations(&self) -> Vec<Violation> {
        self.lock().violations.iter().cloned().collect()
    }

    /// How many violations were dropped from [`Model::violations`] (it
    /// keeps the most recent [`MAX_VIOLATIONS`]).
    pub fn violations_dropped(&self) -> u64 {
        self.lock().violations_dropped
    }

    /// How many times `call` reached the model (from every process).
    pub fn calls(&self, call: Call) -> u64 {
        self.lock().calls.get(&call).copied().unwrap_or(0)
    }

    /// Every call that reached the model, in order (from every process).
    pub fn trace(&self) -> Vec<Call> {
        self.lock().trace.clone()
    }

    /// Installs a fault plan: matching calls fail with the planned code before
    /// any rule is checked (the R11 codes, R5.10, R4.5).
    pub fn set_faults(&self, plan: FaultPlan) {
        self.lock().faults = plan.bounded();
    }

    /// How many planned faults fired so far.
    pub fn faults_fired(&self) -> u64 {
        self.lock().faults.fired()
    }

    /// A snapshot of the fault plan in force: what fired, per call, and the
    /// most recent faults in order ([`FaultPlan::history`]).
    pub fn faults(&self) -> FaultPlan {
        self.lock().faults.clone()
    }

    /// Whether this process has an IMEX channel, without which fabric
    /// handles do not import (R9.1, R12.4); default [`FabricConfig::imex_channel`].
    pub fn set_fabric_access(&self, allowed: bool) {
        if let Some(p) = self.lock().procs.get_mut(self.pid) {
            p.fabric_access = allowed;
        }
    }

    /// Writes `bytes` at device address `ptr` of a mapped allocation, as a
    /// kernel would.
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> DriverResult<()> {
        self.lock().write(self.pid, ptr, bytes)
    }

    /// Reads `len` bytes at device address `ptr` of a mapped allocation.
    pub fn read(&self, ptr: u64, len: usize) -> DriverResult<Vec<u8>> {
        self.lock().read(self.pid, ptr, len)
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        // A panic while holding the lock cannot leave the tables half-written
        // in a way that matters to a test; keep going instead of poisoning.
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the world after counting the call and firing faults.
    /// A process that exited makes no calls (`DEINITIALIZED`).
    fn enter<T>(
        &self,
        call: Call,
        f: impl FnOnce(&mut World, usize) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let mut w = self.lock();
        w.node = w.procs.get(self.pid).map_or(0, |p| p.node);
        if !w.running(self.pid) {
            return Err(Code::DEINITIALIZED);
        }
        w.count(call);
        if let Some(code) = w.faults.check(call, self.pid) {
            return Err(code);
        }
        w.current = call;
        f(&mut w, self.pid)
    }
}

impl Driver for Model {
    fn name(&self) -> String {
        "model".into()
    }

    /// One simulated process: every `Model` handle on this world and pid.
    fn process_scope(&self) -> Option<u64> {
        let world = Arc::as_ptr(&self.world) as usize as u64;
        Some(world.rotate_left(16) ^ self.pid as u64)
    }

    unsafe fn driver_version(&self) -> DriverResult<i32> {
        self.enter(Call::DriverGetVersion, |w, _| Ok(w.config().driver_version))
    }
    unsafe fn device_count(&self) -> DriverResult<i32> {
        self.enter(Call::DeviceGetCount, |w, _| {
            Ok(w.config().devices.len() as i32)
        })
    }
    unsafe fn device_attribute(&self, dev: Device, attr: i32) -> DriverResult<i32> {
        self.enter(Call::DeviceGetAttribute, |w, _| w.attribute(dev, attr))
    }
    unsafe fn mem_get_info(&self, dev: Device) -> DriverResult<(u64, u64)> {
        self.enter(Call::MemGetInfo, |w, _| w.mem_info(dev))
    }
    /// The configured [`SimDevice::clique`]; `NOT_SUPPORTED` on a driver
    /// before 13.4 (no clique query), `INVALID_DEVICE` for an unknown ordinal.
    /// Not counted in [`Model::calls`] (a query the typed API makes only
    /// while probing).
    unsafe fn device_clique(&self, dev: Device) -> DriverResult<u32> {
        let mut w = self.lock();
        w.node = w.procs.get(self.pid).map_or(0, |p| p.node);
        if w.config().driver_version < 13040 {
            return Err(Code::NOT_SUPPORTED);
        }
        w.device(dev).map(|d| d.clique).ok_or(Code::INVALID_DEVICE)
    }

    unsafe fn id_reserve(&self, count: u32) -> DriverResult<u32> {
        self.enter(Call::IdReserve, |w, p| w.id_reserve(p, count))
    }
    unsafe fn id_release(&self, base: u32, count: u32) -> DriverResult<()> {
        self.enter(Call::IdRelease, |w, p| w.id_release(p, base, count))
    }
    unsafe fn get_limits(&self, props: EndpointProps) -> DriverResult<Limits> {
        self.enter(Call::GetLimits, |w, _| w.get_limits(&props))
    }
    unsafe fn create(&self, id: u32, props: EndpointProps) -> DriverResult<()> {
        self.enter(Call::Create, |w, p| w.create(p, id, &props))
    }
    unsafe fn add_device(&self, id: u32, dev: Device) -> DriverResult<()> {
        self.enter(Call::AddDevice, |w, p| w.add_device(p, id, dev))
    }
    unsafe fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        self.enter(Call::Query, |w, p| w.query(p, base, count))
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
        self.enter(Call::BindMem, |w, p| {
            w.bind(
                p,
                id,
                dev,
                offset,
                state::Target::Handle(mem, mem_offset),
                size,
                flags,
            )
        })
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
        self.enter(Call::BindAddr, |w, p| {
            w.bind(p, id, dev, offset, state::Target::Addr(ptr), size, flags)
        })
    }
    unsafe fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()> {
        self.enter(Call::Unbind, |w, p| w.unbind(p, id, dev, offset, size))
    }
    unsafe fn destroy(&self, id: u32) -> DriverResult<()> {
        self.enter(Call::Destroy, |w, p| w.destroy(p, id))
    }
    unsafe fn export(&self, id: u32) -> DriverResult<FabricHandleBytes> {
        self.enter(Call::Export, |w, p| w.export(p, id))
    }
    unsafe fn import(&self, id: u32, handle: FabricHandleBytes) -> DriverResult<()> {
        self.enter(Call::Import, |w, p| w.import(p, id, &handle))
    }

    unsafe fn mem_granularity(
        &self,
        req: AllocationRequest,
        kind: Granularity,
    ) -> DriverResult<u64> {
        self.enter(Call::MemGetAllocationGranularity, |w, _| {
            w.mem_granularity(&req, kind)
        })
    }
    unsafe fn mem_create(&self, size: u64, req: AllocationRequest) -> DriverResult<u64> {
        self.enter(Call::MemCreate, |w, p| w.mem_create(p, size, &req))
    }
    unsafe fn mem_release(&self, handle: u64) -> DriverResult<()> {
        self.enter(Call::MemRelease, |w, p| w.mem_release(p, handle))
    }
    unsafe fn mem_properties(&self, handle: u64) -> DriverResult<AllocationRequest> {
        self.enter(Call::MemGetAllocationProperties, |w, p| {
            w.mem_properties(p, handle)
        })
    }
    /// A POSIX descriptor is real: an in-memory file standing for the
    /// model's token, owned by the caller; fabric bytes carry the token and
    /// a checksum. Either is refused on import where its reach ends (R12.4).
    unsafe fn mem_export(&self, handle: u64, kind: ShareableKind) -> DriverResult<ShareableHandle> {
        self.enter(Call::MemExportToShareableHandle, |w, p| {
            let token = w.shareable_export(p, handle, kind)?;
            let tag = w.secret.tag;
            match kind {
                ShareableKind::Fabric => {
                    Ok(ShareableHandle::Fabric(shareable::token_bytes(tag, token)))
                }
                ShareableKind::PosixFd => match shareable::token_fd(tag, token) {
                    Ok(fd) => Ok(ShareableHandle::PosixFd(fd.into_raw_fd())),
                    Err(_) => {
                        // No descriptor left in this process: nothing exported.
                        w.exports.remove(&token);
                        Err(Code::OUT_OF_MEMORY)
                    }
                },
            }
        })
    }
    /// A descriptor or bytes that the model did not make are `INVALID_VALUE`
    /// (the model's choice, as R9.4).
    unsafe fn mem_import(&self, shared: ShareableHandle) -> DriverResult<u64> {
        self.enter(Call::MemImportFromShareableHandle, |w, p| {
            let token = match shared {
                ShareableHandle::PosixFd(fd) if fd >= 0 => {
                    // SAFETY: the caller keeps `fd` open for this call (the
                    // method's contract); it is only read.
                    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                    shareable::fd_token(fd)
                }
                ShareableHandle::PosixFd(_) => None,
                ShareableHandle::Fabric(bytes) => shareable::bytes_token(&bytes),
            };
            // Another fabric's (or a forged) string: not this driver's.
            let token = token
                .filter(|&(tag, _)| tag == w.secret.tag)
                .ok_or(Code::INVALID_VALUE)?
                .1;
            w.shareable_import(p, token, shared.kind())
        })
    }
    unsafe fn mem_address_reserve(&self, size: u64, alignment: u64) -> DriverResult<u64> {
        self.enter(Call::MemAddressReserve, |w, p| {
            w.address_reserve(p, size, alignment)
        })
    }
    unsafe fn mem_address_free(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.enter(Call::MemAddressFree, |w, p| w.address_free(p, ptr, size))
    }
    unsafe fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> DriverResult<()> {
        self.enter(Call::MemMap, |w, p| w.map(p, ptr, size, offset, handle))
    }
    unsafe fn mem_unmap(&self, ptr: u64, size: u64) -> DriverResult<()> {
        self.enter(Call::MemUnmap, |w, p| w.unmap(p, ptr, size))
    }
    unsafe fn mem_set_access(&self, ptr: u64, size: u64, devices: Vec<Device>) -> DriverResult<()> {
        self.enter(Call::MemSetAccess, |w, p| {
            w.set_access(p, ptr, size, &devices)
        })
    }

    unsafe fn multicast_granularity(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        self.enter(Call::MulticastGetGranularity, |w, _| {
            w.mc_granularity(num_devices, size, handle_types, kind)
        })
    }
    unsafe fn multicast_create(
        &self,
        num_devices: u32,
        size: u64,
        handle_types: u64,
    ) -> DriverResult<u64> {
        self.enter(Call::MulticastCreate, |w, p| {
            w.mc_create(p, num_devices, size, handle_types)
        })
    }
    unsafe fn multicast_add_device(&self, mc: u64, dev: Device) -> DriverResult<()> {
        self.enter(Call::MulticastAddDevice, |w, p| w.mc_add_device(p, mc, dev))
    }
    unsafe fn multicast_bind_mem(
        &self,
        mc: u64,
        mc_offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.enter(Call::MulticastBindMem, |w, p| {
            w.mc_bind(
                p,
                mc,
                mc_offset,
                state::Target::Handle(mem, mem_offset),
                size,
            )
        })
    }
    unsafe fn multicast_bind_addr(
        &self,
        mc: u64,
        mc_offset: u64,
        ptr: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.enter(Call::MulticastBindAddr, |w, p| {
            w.mc_bind(p, mc, mc_offset, state::Target::Addr(ptr), size)
        })
    }
    unsafe fn multicast_unbind(
        &self,
        mc: u64,
        dev: Device,
        mc_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.enter(Call::MulticastUnbind, |w, p| {
            w.mc_unbind(p, mc, dev, mc_offset, size)
        })
    }

    unsafe fn stream_create(&self, dev: Device) -> DriverResult<u64> {
        self.enter(Call::StreamCreate, |w, p| w.stream_create(p, dev))
    }
    unsafe fn stream_destroy(&self, stream: u64) -> DriverResult<()> {
        self.enter(Call::StreamDestroy, |w, p| w.stream_destroy(p, stream))
    }
    unsafe fn stream_synchronize(&self, stream: u64) -> DriverResult<()> {
        self.enter(Call::StreamSynchronize, |w, p| {
            w.stream_synchronize(p, stream)
        })
    }
    unsafe fn stream_query(&self, stream: u64) -> DriverResult<bool> {
        self.enter(Call::StreamQuery, |w, p| w.stream_query(p, stream))
    }
    /// SAFETY (of the body): the caller upholds the row's contract, which
    /// makes every `MemHint::Host` pointer valid host memory of this
    /// process until the stream passed the op; the model touches it only then.
    unsafe fn fabric_copy_batch(&self, stream: u64, ops: CopyOps, flags: u64) -> DriverResult<()> {
        self.enter(Call::FabricCpyBatchAsync, |w, p| {
            w.fabric_copy_batch(p, stream, &ops, flags, None)
        })
    }
    unsafe fn memcpy_async(
        &self,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
    ) -> DriverResult<()> {
        self.enter(Call::MemcpyAsync, |w, p| {
            w.memcpy_async(p, dst, src, size, stream, None)
        })
    }
    unsafe fn memcpy_batch_async(&self, copies: MemcpyOps, stream: u64) -> DriverResult<()> {
        self.enter(Call::MemcpyBatchAsync, |w, p| {
            w.memcpy_batch_async(p, &copies, stream, None)
        })
    }
    unsafe fn stream_begin_capture(&self, stream: u64) -> DriverResult<()> {
        self.enter(Call::StreamBeginCapture, |w, p| {
            w.stream_begin_capture(p, stream)
        })
    }
    unsafe fn stream_end_capture(&self, stream: u64) -> DriverResult<u64> {
        self.enter(Call::StreamEndCapture, |w, p| {
            w.stream_end_capture(p, stream)
        })
    }
    unsafe fn graph_instantiate(&self, graph: u64) -> DriverResult<u64> {
        self.enter(Call::GraphInstantiate, |w, p| w.graph_instantiate(p, graph))
    }
    /// SAFETY (of the body): as `fabric_copy_batch`: the caller upholds F8
    /// and the copies' contract until the stream passed the launch.
    unsafe fn graph_launch(&self, exec: u64, stream: u64) -> DriverResult<()> {
        self.enter(Call::GraphLaunch, |w, p| w.graph_launch(p, exec, stream))
    }
    unsafe fn graph_exec_destroy(&self, exec: u64) -> DriverResult<()> {
        self.enter(Call::GraphExecDestroy, |w, p| w.graph_exec_destroy(p, exec))
    }
    unsafe fn graph_destroy(&self, graph: u64) -> DriverResult<()> {
        self.enter(Call::GraphDestroy, |w, p| w.graph_destroy(p, graph))
    }
    unsafe fn event_create(&self, dev: Device) -> DriverResult<u64> {
        self.enter(Call::EventCreate, |w, p| w.event_create(p, dev))
    }
    unsafe fn event_record(&self, event: u64, stream: u64) -> DriverResult<()> {
        self.enter(Call::EventRecord, |w, p| w.event_record(p, event, stream))
    }
    unsafe fn event_query(&self, event: u64) -> DriverResult<bool> {
        self.enter(Call::EventQuery, |w, p| w.event_query(p, event))
    }
    unsafe fn event_synchronize(&self, event: u64) -> DriverResult<()> {
        self.enter(Call::EventSynchronize, |w, p| w.event_synchronize(p, event))
    }
    unsafe fn event_destroy(&self, event: u64) -> DriverResult<()> {
        self.enter(Call::EventDestroy, |w, p| w.event_destroy(p, event))
    }
}

/// The most violations [`Model::violations`] keeps (the most recent).
pub const MAX_VIOLATIONS: usize = 4096;

/// Shorthand used by the rule files: log a violation of `rule` and fail with `code`.
pub(crate) fn violate<T>(w: &mut World, rule: &'static str, code: Code) -> DriverResult<T> {
    // Bounded: any process of a fabric can make violations, and the log
    // must stay small enough for one reply (a victim's `violations()`).
    while w.violations.len() >= MAX_VIOLATIONS {
        w.violations.pop_front();
        w.violations_dropped = w.violations_dropped.saturating_add(1);
    }
    w.violations.push_back(Violation {
        call: w.current,
        rule,
        code,
    });
    Err(code)
}

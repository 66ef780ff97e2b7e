//! The model's tables and leak counters. The rules that change them live in
//! `endpoints.rs`, `memory.rs` and `classic.rs`.

use std::collections::{BTreeMap, HashMap};

use super::config::ModelConfig;
use super::faults::FaultPlan;
use crate::driver::EndpointProps;
use crate::driver::{Call, Code, Device, Location};

/// What one process (or the whole node) still holds. All zero once every
/// owner has been dropped: that is the "nothing leaked" check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Reserved logical-endpoint ids (R1).
    pub ids: u64,
    /// Endpoints attached to ids (created or imported; R2, R9).
    pub endpoints: u64,
    /// Live bindings, logical-endpoint and classic (R5, C3).
    pub bindings: u64,
    /// VMM allocations not yet freed (handle released and unmapped and unbound).
    pub allocations: u64,
    /// Live `cuMemMap` mappings.
    pub mappings: u64,
    /// Reserved virtual address ranges.
    pub address_ranges: u64,
    /// Classic multicast objects (C1, C5).
    pub multicast_objects: u64,
}

impl Live {
    /// Whether everything is zero.
    pub fn is_empty(&self) -> bool {
        *self == Live::default()
    }
}

/// A call that broke a rule of the contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The entry point.
    pub call: Call,
    /// The SPEC rule, e.g. `"R5.3"`.
    pub rule: &'static str,
    /// The code the model answered.
    pub code: Code,
}

/// What a bind points at: an allocation handle and offset (BindMem) or a
/// mapped device address (BindAddr).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    Handle(u64, u64),
    Addr(u64),
}

/// A bind recorded on an endpoint or multicast object.
#[derive(Clone, Debug)]
pub(crate) struct Bound {
    pub pid: usize,
    pub dev: Device,
    pub offset: u64,
    pub size: u64,
    /// The allocation bound: kept alive until unbound.
    pub alloc: u64,
}

/// A logical endpoint object; several processes may hold references (R7, R9).
#[derive(Debug)]
pub(crate) struct EndpointObj {
    pub props: EndpointProps,
    pub enrolled: Vec<Device>,
    /// Queries still answering "pending" once the team is complete.
    pub queries_left: u32,
    pub refs: u32,
    pub bindings: Vec<Bound>,
    /// The limits it was created under.
    pub bind_alignment: u64,
}

/// One reserved id of a process.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub obj: Option<u64>,
    pub imported: bool,
    /// A query reported the endpoint constructed (R3.1).
    pub reported_ready: bool,
}

#[derive(Debug)]
pub(crate) struct Proc {
    pub ids: BTreeMap<u32, Slot>,
    pub next_id: u32,
    pub fabric_access: bool,
}

impl Proc {
    fn new() -> Proc {
        Proc {
            ids: BTreeMap::new(),
            next_id: 1,
            fabric_access: true,
        }
    }
}

/// A VMM allocation. Freed when the handle is released and nothing maps or
/// binds it any more (as the driver does).
#[derive(Debug)]
pub(crate) struct Alloc {
    pub pid: usize,
    pub location: Location,
    pub handle_types: u32,
    pub size: u64,
    pub released: bool,
    pub users: u32,
    pub data: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct Mapping {
    pub size: u64,
    pub offset: u64,
    pub alloc: u64,
    pub access: Vec<Device>,
}

#[derive(Debug)]
pub(crate) struct VaRange {
    pub pid: usize,
    pub size: u64,
    /// Mappings by start address.
    pub maps: BTreeMap<u64, Mapping>,
}

/// A classic multicast object (C1).
#[derive(Debug)]
pub(crate) struct McObj {
    pub pid: usize,
    pub num_devices: u32,
    pub size: u64,
    pub granularity: u64,
    pub devices: Vec<Device>,
    pub bindings: Vec<Bound>,
}

/// The whole simulated node.
#[derive(Debug)]
pub(crate) struct World {
    pub config: ModelConfig,
    pub procs: Vec<Proc>,
    pub objects: HashMap<u64, EndpointObj>,
    pub allocs: HashMap<u64, Alloc>,
    pub vas: BTreeMap<u64, VaRange>,
    pub mcs: HashMap<u64, McObj>,
    pub next_handle: u64,
    pub next_va: u64,
    /// Distinguishes handles of this node from any other node's.
    pub node_tag: u64,
    pub violations: Vec<Violation>,
    pub calls: HashMap<Call, u64>,
    pub trace: Vec<Call>,
    pub faults: FaultPlan,
    pub current: Call,
}

impl World {
    pub fn new(config: ModelConfig) -> World {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NODES: AtomicU64 = AtomicU64::new(1);
        World {
            config,
            procs: vec![Proc::new()],
            objects: HashMap::new(),
            allocs: HashMap::new(),
            vas: BTreeMap::new(),
            mcs: HashMap::new(),
            next_handle: 1,
            next_va: 0x7f00_0000_0000,
            node_tag: NODES.fetch_add(1, Ordering::Relaxed),
            violations: Vec::new(),
            calls: HashMap::new(),
            trace: Vec::new(),
            faults: FaultPlan::none(),
            current: Call::DriverGetVersion,
        }
    }

    pub fn add_process(&mut self) -> usize {
        self.procs.push(Proc::new());
        self.procs.len() - 1
    }

    pub fn count(&mut self, call: Call) {
        *self.calls.entry(call).or_default() += 1;
        // Bounded so that long runs keep flat memory.
        if self.trace.len() < 1 << 16 {
            self.trace.push(call);
        }
    }

    pub fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// The device if it exists.
    pub fn device(&self, dev: Device) -> Option<&super::SimDevice> {
        usize::try_from(dev.0)
            .ok()
            .and_then(|i| self.config.devices.get(i))
    }

    pub fn live(&self, pid: usize) -> Live {
        let mut l = Live::default();
        if let Some(p) = self.procs.get(pid) {
            l.ids = p.ids.len() as u64;
            l.endpoints = p.ids.values().filter(|s| s.obj.is_some()).count() as u64;
        }
        l.bindings = self
            .objects
            .values()
            .flat_map(|o| &o.bindings)
            .chain(self.mcs.values().flat_map(|m| &m.bindings))
            .filter(|b| b.pid == pid)
            .count() as u64;
        l.allocations = self.allocs.values().filter(|a| a.pid == pid).count() as u64;
        let vas = self.vas.values().filter(|v| v.pid == pid);
        l.address_ranges = vas.clone().count() as u64;
        l.mappings = vas.map(|v| v.maps.len() as u64).sum();
        l.multicast_objects = self.mcs.values().filter(|m| m.pid == pid).count() as u64;
        l
    }

    pub fn live_all(&self) -> Live {
        let mut all = Live::default();
        for pid in 0..self.procs.len() {
            let l = self.live(pid);
            all.ids += l.ids;
            all.endpoints += l.endpoints;
            all.bindings += l.bindings;
            all.allocations += l.allocations;
            all.mappings += l.mappings;
            all.address_ranges += l.address_ranges;
            all.multicast_objects += l.multicast_objects;
        }
        all
    }

    /// Drops one user of an allocation (a mapping or a binding) and frees it
    /// when it was released and has no user left.
    pub fn alloc_unuse(&mut self, handle: u64) {
        if let Some(a) = self.allocs.get_mut(&handle) {
            a.users = a.users.saturating_sub(1);
            if a.released && a.users == 0 {
                self.allocs.remove(&handle);
            }
        }
    }
}

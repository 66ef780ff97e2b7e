//! The model's tables and leak counters: one simulated fabric of one or more
//! nodes, each with its devices and processes. The rules that change the
//! tables live in `endpoints.rs`, `memory.rs` and `classic.rs`; processes
//! joining and exiting (R12) in `process.rs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::config::ModelConfig;
use super::faults::FaultPlan;
use crate::driver::EndpointProps;
use crate::driver::{Call, Code, Device, Location};

/// Where the model's virtual addresses start (`cuMemAddressReserve`).
pub(crate) const FIRST_VA: u64 = 0x0100_0000_0000_0000;

/// Where they end: the processes of a fabric share `[FIRST_VA, VA_END)`.
pub(crate) const VA_END: u64 = 1 << 63;

/// The most address space one process holds reserved at once: a GPU
/// process's own virtual address space (47 bits), so that no process of a
/// fabric leaves another none, as no process can on a real machine.
pub(crate) const VA_PER_PROCESS: u64 = 1 << 47;

/// What one process (or the whole node) still holds. All zero once every
/// owner has been dropped: that is the "nothing leaked" check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// Streams not yet destroyed (`cuStreamCreate`).
    pub streams: u64,
    /// Events not yet destroyed (`cuEventCreate`).
    pub events: u64,
    /// Graphs captured and not yet destroyed (`cuStreamEndCapture`).
    pub graphs: u64,
    /// Executable graphs not yet destroyed (`cuGraphInstantiate`).
    pub graph_execs: u64,
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
    /// The contract rule, e.g. `"R5.3"`.
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
    /// Where in the allocation the bound range starts.
    pub mem_offset: u64,
}

/// One device enrolled in a multicast team (R4): devices are named by
/// ordinal *on their node*, so the node is part of the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Enrolled {
    pub node: usize,
    pub dev: Device,
    /// The attachment (create or import, [`Slot::attach`]) that enrolled
    /// it: what another attachment enrolled — another process's, or an
    /// earlier import of this one's — only the driver knows (R12.5).
    pub attach: u64,
}

/// A logical endpoint object; several processes may hold references (R7, R9).
#[derive(Debug)]
pub(crate) struct EndpointObj {
    pub props: EndpointProps,
    /// The creator's node: a unicast owner device is a device of this node.
    pub node: usize,
    pub enrolled: Vec<Enrolled>,
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
    /// Which attachment of the endpoint this is (fresh per create or import).
    pub attach: u64,
}

#[derive(Debug)]
pub(crate) struct Proc {
    pub ids: BTreeMap<u32, Slot>,
    pub next_id: u32,
    /// The node this process runs on.
    pub node: usize,
    /// Whether the process has an IMEX channel: fabric handles import only
    /// with one (R9.1, R12.4).
    pub fabric_access: bool,
    /// The process exited (or was killed): the driver cleaned up after it
    /// (R12.2) and it makes no more calls.
    pub exited: bool,
}

impl Proc {
    pub fn new(node: usize, fabric_access: bool) -> Proc {
        Proc {
            ids: BTreeMap::new(),
            next_id: 1,
            node,
            fabric_access,
            exited: false,
        }
    }
}

/// The processes of a fabric by pid. A pid is never reused; the record of
/// a process that exited is reclaimed by [`Procs::forget`] (a fabric
/// server's process whose connection closed), so that a long-lived fabric
/// holds records only for the processes it still has.
#[derive(Debug, Default)]
pub(crate) struct Procs {
    map: BTreeMap<usize, Proc>,
    next: usize,
}

impl Procs {
    /// Adds a process: its pid.
    pub fn push(&mut self, p: Proc) -> usize {
        let pid = self.next;
        self.next = self.next.saturating_add(1);
        self.map.insert(pid, p);
        pid
    }

    pub fn get(&self, pid: usize) -> Option<&Proc> {
        self.map.get(&pid)
    }

    pub fn get_mut(&mut self, pid: usize) -> Option<&mut Proc> {
        self.map.get_mut(&pid)
    }

    /// Every pid with a record, in order.
    pub fn pids(&self) -> Vec<usize> {
        self.map.keys().copied().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Proc> {
        self.map.values()
    }

    /// Drops the record of `pid` if it exited.
    // Used by the fabric server only.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub fn forget(&mut self, pid: usize) {
        if self.map.get(&pid).is_some_and(|p| p.exited) {
            self.map.remove(&pid);
        }
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

impl std::ops::Index<usize> for Procs {
    type Output = Proc;
    /// Only for the calling process, whose record exists while it runs.
    fn index(&self, pid: usize) -> &Proc {
        &self.map[&pid]
    }
}

impl std::ops::IndexMut<usize> for Procs {
    fn index_mut(&mut self, pid: usize) -> &mut Proc {
        self.map
            .get_mut(&pid)
            .expect("the calling process has a record")
    }
}

/// A VMM allocation. Freed when the handle is released and nothing maps or
/// binds it any more (as the driver does).
#[derive(Debug)]
pub(crate) struct Alloc {
    pub pid: usize,
    /// The node whose memory this is (of the exporter, for an imported one).
    pub node: usize,
    /// Imported through a shareable handle: the memory is counted once, at
    /// its exporter.
    pub imported: bool,
    pub location: Location,
    pub handle_types: u32,
    pub size: u64,
    pub released: bool,
    pub users: u32,
    /// The bytes, shared with every process that imported this memory.
    pub data: Arc<Mutex<super::memory::Backing>>,
}

#[derive(Debug)]
pub(crate) struct Mapping {
    pub size: u64,
    pub offset: u64,
    /// The allocation mapped (0 for a classic multicast object).
    pub alloc: u64,
    pub access: Vec<Device>,
    /// The classic multicast object mapped (its key in `World::mcs`), if
    /// this maps one (`multimem` access); the mapping holds a reference.
    pub multicast: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct VaRange {
    pub pid: usize,
    pub size: u64,
    /// Mappings by start address.
    pub maps: BTreeMap<u64, Mapping>,
}

/// A classic multicast object (C1), keyed by its creator's handle; other
/// processes hold it through imported handles (C5).
#[derive(Debug)]
pub(crate) struct McObj {
    /// Shareable handle types it was created with (bits of `handle_bits`).
    pub handle_types: u64,
    pub num_devices: u32,
    pub size: u64,
    pub granularity: u64,
    /// Team devices as (node, ordinal).
    pub devices: Vec<(usize, Device)>,
    /// The process that added each of `devices`, in the same order.
    pub added_by: Vec<usize>,
    pub bindings: Vec<Bound>,
    /// Handles that refer to it (the creator's and every importer's); the
    /// object is freed with the last.
    pub holders: u32,
}

/// What a shareable handle (`cuMemExportToShareableHandle`) refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandleTarget {
    /// A VMM allocation, by the exporter's handle.
    Alloc(u64),
    /// A classic multicast object, by its key in `World::mcs`.
    Multicast(u64),
}

/// An exported shareable handle (C5): a POSIX file descriptor or a fabric
/// handle, modelled as a token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Export {
    pub pid: usize,
    pub node: usize,
    pub fabric: bool,
    pub what: HandleTarget,
}

/// The whole simulated fabric.
#[derive(Debug)]
pub(crate) struct World {
    /// Every node's configuration, node number = index; never empty.
    pub nodes: Vec<ModelConfig>,
    /// The node of the process whose call runs now (set on entry).
    pub node: usize,
    /// Whether a process that joins gets an IMEX channel unless told.
    pub imex_default: bool,
    pub procs: Procs,
    pub objects: HashMap<u64, EndpointObj>,
    pub allocs: HashMap<u64, Alloc>,
    pub vas: BTreeMap<u64, VaRange>,
    pub mcs: HashMap<u64, McObj>,
    /// Every process's multicast handle: (holder, object key).
    pub mc_handles: HashMap<u64, (usize, u64)>,
    /// Live shareable handles, by token (C5, R12.4).
    pub exports: HashMap<u64, Export>,
    pub next_handle: u64,
    /// The next [`Slot::attach`] (its own counter: handle numbers stay dense).
    pub next_attach: u64,
    pub next_va: u64,
    /// This fabric's secret: its tag is in every handle string it makes
    /// (distinguishing them from any other fabric's), its key seals them.
    pub secret: super::shareable::Secret,
    /// The most recent violations, at most [`crate::MAX_VIOLATIONS`].
    pub violations: std::collections::VecDeque<Violation>,
    /// How many older violations were dropped from `violations`.
    pub violations_dropped: u64,
    pub calls: HashMap<Call, u64>,
    pub trace: Vec<Call>,
    pub faults: FaultPlan,
    pub current: Call,
    /// Streams and their enqueued copies (`copy.rs`).
    pub streams: super::copy::Streams,
}

impl World {
    /// A fabric of `nodes` (at least one: an empty list becomes one default
    /// node) with no process yet.
    pub fn new(mut nodes: Vec<ModelConfig>) -> World {
        if nodes.is_empty() {
            nodes.push(ModelConfig::default());
        }
        World {
            nodes,
            node: 0,
            imex_default: true,
            procs: Procs::default(),
            objects: HashMap::new(),
            allocs: HashMap::new(),
            vas: BTreeMap::new(),
            mcs: HashMap::new(),
            mc_handles: HashMap::new(),
            exports: HashMap::new(),
            next_handle: 1,
            next_attach: 1,
            // Above every user-space address (47-bit, and 56-bit with
            // five-level paging): a host buffer's real address can never
            // fall inside a model mapping and be taken for device memory.
            next_va: FIRST_VA,
            secret: super::shareable::Secret::new(),
            violations: Default::default(),
            violations_dropped: 0,
            calls: HashMap::new(),
            trace: Vec::new(),
            faults: FaultPlan::none(),
            current: Call::DriverGetVersion,
            streams: Default::default(),
        }
    }

    /// The configuration of the node whose process is calling.
    pub fn config(&self) -> &ModelConfig {
        // `node` is only ever set from a process's node, checked when the
        // process joined; node 0 always exists.
        self.nodes.get(self.node).unwrap_or(&self.nodes[0])
    }

    pub fn count(&mut self, call: Call) {
        *self.calls.entry(call).or_default() += 1;
        // Bounded so that long runs keep flat memory.
        if self.trace.len() < 1 << 16 {
            self.trace.push(call);
        }
    }

    /// A fresh attachment number ([`Slot::attach`]).
    pub fn attachment(&mut self) -> u64 {
        let a = self.next_attach;
        self.next_attach = self.next_attach.wrapping_add(1);
        a
    }

    pub fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// The device of the calling process's node, if it exists.
    pub fn device(&self, dev: Device) -> Option<&super::SimDevice> {
        self.device_on(self.node, dev)
    }

    /// The device `dev` of `node`, if it exists.
    pub fn device_on(&self, node: usize, dev: Device) -> Option<&super::SimDevice> {
        let config = self.nodes.get(node)?;
        usize::try_from(dev.0)
            .ok()
            .and_then(|i| config.devices.get(i))
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
        l.multicast_objects = self.mc_handles.values().filter(|h| h.0 == pid).count() as u64;
        (l.streams, l.events, l.graphs, l.graph_execs) = self.streams.held_by(pid);
        l
    }

    pub fn live_all(&self) -> Live {
        self.procs
            .pids()
            .into_iter()
            .map(|p| self.live(p))
            .fold(Live::default(), Live::plus)
    }

    /// Drops one user of an allocation (a mapping or a binding) and frees it
    /// when it was released and has no user left.
    pub fn alloc_unuse(&mut self, handle: u64) {
        if let Some(a) = self.allocs.get_mut(&handle) {
            a.users = a.users.saturating_sub(1);
            if a.released && a.users == 0 {
                self.allocs.remove(&handle);
                self.drop_exports(HandleTarget::Alloc(handle));
            }
        }
    }
}

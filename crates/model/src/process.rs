//! Processes of the simulated fabric: joining a node, exiting (the driver's
//! cleanup, SPEC R12.2–R12.3), and the shareable handles of the classic API
//! (`cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle`, C5)
//! with the reach of each kind (R12.4).
//!
//! The header is mostly silent on processes; every choice here is the
//! model's, as SPEC R12 states it:
//! - an exiting (or killed) process loses every endpoint reference (its
//!   bindings unbound), its ids, classic multicast handles, mappings, address
//!   ranges and allocations, and the shareable handles it exported; what
//!   other processes still reference lives on;
//! - a POSIX file descriptor reaches only processes of its node: imported on
//!   another node it is `INVALID_VALUE` (a descriptor means nothing there);
//! - a fabric handle reaches every node, for processes with an IMEX channel
//!   (`NOT_PERMITTED` without);
//! - a shareable handle of memory or an object already freed, or of an
//!   exporter that exited, is `INVALID_VALUE`, not a violation: only the
//!   driver can know (R12.5).

use super::Model;
use super::config::FabricConfig;
use super::state::{Alloc, Export, HandleTarget, Live, Proc, World};
use super::violate;
use crate::driver::{Code, DriverResult};

pub use crate::driver::ShareableKind;

/// What the whole fabric still holds. All zero once every process has
/// released everything or exited: the fabric's "nothing leaked" check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FabricLive {
    /// Processes that joined and have not exited (not a leak).
    pub processes: u64,
    /// The sum of every process's [`Live`].
    pub held: Live,
    /// Logical endpoint objects still referenced by some process.
    pub endpoint_objects: u64,
    /// Classic multicast objects still held by some process.
    pub multicast_objects: u64,
    /// Shareable handles exported and not yet closed.
    pub shareable_handles: u64,
}

impl FabricLive {
    /// Whether nothing is held (processes still joined do not count).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
            && self.endpoint_objects == 0
            && self.multicast_objects == 0
            && self.shareable_handles == 0
    }
}

impl Live {
    /// The sum of two counters (saturating).
    pub fn plus(self, o: Live) -> Live {
        Live {
            ids: self.ids.saturating_add(o.ids),
            endpoints: self.endpoints.saturating_add(o.endpoints),
            bindings: self.bindings.saturating_add(o.bindings),
            allocations: self.allocations.saturating_add(o.allocations),
            mappings: self.mappings.saturating_add(o.mappings),
            address_ranges: self.address_ranges.saturating_add(o.address_ranges),
            multicast_objects: self.multicast_objects.saturating_add(o.multicast_objects),
            streams: self.streams.saturating_add(o.streams),
            events: self.events.saturating_add(o.events),
            graphs: self.graphs.saturating_add(o.graphs),
            graph_execs: self.graph_execs.saturating_add(o.graph_execs),
        }
    }
}

impl World {
    /// A new process on `node`; `None` if the fabric has no such node.
    pub fn add_process_on(&mut self, node: usize, fabric_access: bool) -> Option<usize> {
        if node >= self.nodes.len() {
            return None;
        }
        Some(self.procs.push(Proc::new(node, fabric_access)))
    }

    /// Whether `pid` is a joined process that has not exited.
    pub fn running(&self, pid: usize) -> bool {
        self.procs.get(pid).is_some_and(|p| !p.exited)
    }

    /// What the processes of `node` hold.
    pub fn live_on(&self, node: usize) -> Live {
        self.procs
            .pids()
            .into_iter()
            .filter(|&p| self.procs[p].node == node)
            .map(|p| self.live(p))
            .fold(Live::default(), Live::plus)
    }

    pub fn live_fabric(&self) -> FabricLive {
        FabricLive {
            processes: self.procs.iter().filter(|p| !p.exited).count() as u64,
            held: self.live_all(),
            endpoint_objects: self.objects.len() as u64,
            multicast_objects: self.mcs.len() as u64,
            shareable_handles: self.exports.len() as u64,
        }
    }

    /// R12.2: the driver's cleanup when process `pid` exits or is killed.
    /// Returns what the process still held (what was cleaned up).
    pub fn exit_process(&mut self, pid: usize) -> Live {
        let Some(p) = self.procs.get(pid).filter(|p| !p.exited) else {
            return Live::default();
        };
        let held = self.live(pid);
        self.node = p.node;
        // Every endpoint reference, unbinding what it bound; the last
        // reference frees the endpoint (R12.3).
        let attached: Vec<u32> = p
            .ids
            .iter()
            .filter(|(_, s)| s.obj.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in attached {
            self.drop_reference(pid, id);
        }
        if let Some(p) = self.procs.get_mut(pid) {
            p.ids.clear();
        }
        let handles: Vec<u64> = self
            .mc_handles
            .iter()
            .filter(|(_, h)| h.0 == pid)
            .map(|(&h, _)| h)
            .collect();
        for h in handles {
            let _ = self.mc_release(h);
        }
        let ranges: Vec<u64> = self
            .vas
            .iter()
            .filter(|(_, v)| v.pid == pid)
            .map(|(&b, _)| b)
            .collect();
        for base in ranges {
            if let Some(va) = self.vas.remove(&base) {
                for m in va.maps.into_values() {
                    self.unmapped(m);
                }
            }
        }
        let allocs: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.pid == pid)
            .map(|(&h, _)| h)
            .collect();
        for h in allocs {
            // Nothing of another process can use this process's handle:
            // binds and mappings are per process.
            self.allocs.remove(&h);
            self.drop_exports(HandleTarget::Alloc(h));
        }
        self.exports.retain(|_, e| e.pid != pid);
        self.streams.drop_process(pid);
        if let Some(p) = self.procs.get_mut(pid) {
            p.exited = true;
        }
        held
    }

    /// Detaches `id` of `pid` as `cuLogicalEndpointDestroy` does (R7),
    /// without the rule checks of a call.
    fn drop_reference(&mut self, pid: usize, id: u32) {
        let Some(o) = self.procs[pid].ids.get_mut(&id).and_then(|s| s.obj.take()) else {
            return;
        };
        let mut freed = Vec::new();
        let mut gone = false;
        if let Some(obj) = self.objects.get_mut(&o) {
            obj.bindings.retain(|b| {
                if b.pid == pid {
                    freed.push(b.alloc);
                }
                b.pid != pid
            });
            obj.refs = obj.refs.saturating_sub(1);
            gone = obj.refs == 0;
        }
        if gone {
            self.objects.remove(&o);
        }
        for a in freed {
            self.alloc_unuse(a);
        }
    }

    /// Closes every shareable handle of `what` (it was freed).
    pub fn drop_exports(&mut self, what: HandleTarget) {
        if !self.exports.is_empty() {
            self.exports.retain(|_, e| e.what != what);
        }
    }

    /// `cuMemExportToShareableHandle(&token, handle, kind, 0)` (C5): a token
    /// standing for the descriptor or fabric handle.
    pub fn shareable_export(
        &mut self,
        pid: usize,
        handle: u64,
        kind: ShareableKind,
    ) -> DriverResult<u64> {
        let what = if let Some(key) = self.mc_key(pid, handle) {
            if self.mcs[&key].handle_types & u64::from(kind.bit()) == 0 {
                return violate(self, "C5", Code::INVALID_VALUE);
            }
            HandleTarget::Multicast(key)
        } else {
            match self.allocs.get(&handle) {
                Some(a) if a.pid == pid && !a.released => {
                    if a.handle_types & kind.bit() == 0 {
                        return violate(self, "C5", Code::INVALID_VALUE);
                    }
                    HandleTarget::Alloc(handle)
                }
                _ => return violate(self, "C5", Code::INVALID_HANDLE),
            }
        };
        // A sealed number, not a sequential one: a token is a capability,
        // and a process that was not given it cannot guess it.
        let mut token = 0;
        while token == 0 || self.exports.contains_key(&token) {
            let n = self.handle();
            token = self.secret.seal(super::shareable::SEAL_EXPORT, n);
        }
        self.exports.insert(
            token,
            Export {
                pid,
                node: self.node,
                fabric: kind == ShareableKind::Fabric,
                what,
            },
        );
        Ok(token)
    }

    /// `cuMemImportFromShareableHandle(&handle, token, kind)` (C5, R12.4): a
    /// new handle of this process on the same memory or multicast object.
    pub fn shareable_import(
        &mut self,
        pid: usize,
        token: u64,
        kind: ShareableKind,
    ) -> DriverResult<u64> {
        // Unknown, closed, freed, or of the other kind: only the driver
        // knows which (R12.5).
        let Some(e) = self
            .exports
            .get(&token)
            .copied()
            .filter(|e| e.fabric == (kind == ShareableKind::Fabric))
        else {
            return Err(Code::INVALID_VALUE);
        };
        match kind {
            ShareableKind::PosixFd if e.node != self.node => return Err(Code::INVALID_VALUE),
            ShareableKind::Fabric if !self.procs[pid].fabric_access => {
                return Err(Code::NOT_PERMITTED);
            }
            _ => {}
        }
        let h = self.handle();
        match e.what {
            HandleTarget::Alloc(src) => {
                let Some(a) = self.allocs.get(&src) else {
                    return Err(Code::INVALID_VALUE);
                };
                let copy = Alloc {
                    pid,
                    node: a.node,
                    imported: true,
                    location: a.location,
                    handle_types: a.handle_types,
                    size: a.size,
                    released: false,
                    users: 0,
                    data: a.data.clone(),
                };
                self.allocs.insert(h, copy);
            }
            HandleTarget::Multicast(key) => {
                let Some(m) = self.mcs.get_mut(&key) else {
                    return Err(Code::INVALID_VALUE);
                };
                m.holders = m.holders.saturating_add(1);
                self.mc_handles.insert(h, (pid, key));
            }
        }
        Ok(h)
    }
}

impl Model {
    /// This process's node.
    pub fn node(&self) -> usize {
        self.lock().procs.get(self.pid).map_or(0, |p| p.node)
    }

    /// How many nodes the fabric has.
    pub fn nodes(&self) -> usize {
        self.lock().nodes.len()
    }

    /// Whether this process has an IMEX channel (R9.1, R12.4).
    pub fn fabric_access(&self) -> bool {
        self.lock()
            .procs
            .get(self.pid)
            .is_some_and(|p| p.fabric_access)
    }

    /// Ends this process as the driver does at process exit or kill
    /// (R12.2): every endpoint reference it held is destroyed (unbinding
    /// what it bound), its ids released, its classic multicast handles,
    /// mappings, address ranges and allocations freed, and its shareable
    /// handles closed; endpoints other processes still reference live on
    /// (R12.3). Returns what it still held. Later calls through this
    /// process answer `DEINITIALIZED`; a second exit does nothing.
    pub fn exit(&self) -> Live {
        self.lock().exit_process(self.pid)
    }

    /// Drops this process's record once it exited (a fabric server's
    /// process whose connection closed): pids are never reused, so nothing
    /// can name it again.
    // Used by the fabric server only.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn forget(&self) {
        self.lock().procs.forget(self.pid);
    }

    /// Host bytes the model holds behind memory, over the whole fabric:
    /// backing is sparse (a chunk per first write that touches it).
    pub fn backed_bytes(&self) -> u64 {
        let w = self.lock();
        w.allocs
            .values()
            .filter(|a| !a.imported)
            .map(|a| a.data.lock().unwrap_or_else(|e| e.into_inner()).backed())
            .fold(0, u64::saturating_add)
    }

    /// How many process records the fabric keeps: running processes, and
    /// exited ones a fabric server has not reclaimed yet.
    pub fn process_records(&self) -> usize {
        self.lock().procs.len()
    }

    /// The fabric's public tag (in every handle string it makes).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn fabric_tag(&self) -> u64 {
        self.lock().secret.tag
    }

    /// Whether [`Model::exit`] ran for this process.
    pub fn has_exited(&self) -> bool {
        !self.lock().running(self.pid)
    }

    /// What the whole fabric still holds, over every node and process.
    pub fn live_fabric(&self) -> FabricLive {
        self.lock().live_fabric()
    }

    /// `cuMemExportToShareableHandle` of an allocation or classic multicast
    /// object of this process (C5): a token standing for the file
    /// descriptor or fabric handle. The handle must have been created with
    /// that handle type.
    pub fn export_shareable(&self, handle: u64, kind: ShareableKind) -> DriverResult<u64> {
        self.enter_uncounted(|w, p| w.shareable_export(p, handle, kind))
    }

    /// `cuMemImportFromShareableHandle` (C5): this process's own handle on
    /// the memory or multicast object behind `token`. A POSIX descriptor of
    /// another node is `INVALID_VALUE`; a fabric handle without an IMEX
    /// channel `NOT_PERMITTED` (R12.4).
    pub fn import_shareable(&self, token: u64, kind: ShareableKind) -> DriverResult<u64> {
        self.enter_uncounted(|w, p| w.shareable_import(p, token, kind))
    }

    /// Like `enter`, for calls that have no [`Call`](crate::driver::Call) (not counted, no faults).
    fn enter_uncounted<T>(
        &self,
        f: impl FnOnce(&mut World, usize) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let mut w = self.lock();
        if !w.running(self.pid) {
            return Err(Code::DEINITIALIZED);
        }
        w.node = w.procs[self.pid].node;
        f(&mut w, self.pid)
    }
}

impl Model {
    /// A fabric with no process yet, and a handle on it that is no process
    /// (its driver calls answer `DEINITIALIZED`): what a fabric server
    /// keeps to add processes and read the fabric's counters.
    pub fn fabric_observer(config: FabricConfig) -> Model {
        let mut world = World::new(config.nodes);
        world.imex_default = config.imex_channel;
        Model {
            world: std::sync::Arc::new(std::sync::Mutex::new(world)),
            pid: usize::MAX,
        }
    }

    /// A new process on `node`, with an IMEX channel as `imex_channel` says
    /// (`None`: [`FabricConfig::imex_channel`]); `None` when there is no
    /// such node.
    pub fn join_process(&self, node: usize, imex_channel: Option<bool>) -> Option<Model> {
        let mut w = self.lock();
        let imex = imex_channel.unwrap_or(w.imex_default);
        let pid = w.add_process_on(node, imex)?;
        drop(w);
        Some(Model {
            world: self.world.clone(),
            pid,
        })
    }

    /// How many devices `node` has; `None` when there is no such node.
    pub fn node_devices(&self, node: usize) -> Option<usize> {
        self.lock().nodes.get(node).map(|n| n.devices.len())
    }
}

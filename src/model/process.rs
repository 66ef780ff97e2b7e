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
use super::state::{Alloc, Export, Live, Proc, Shared, World};
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
        }
    }
}

impl World {
    /// A new process on `node`; `None` if the fabric has no such node.
    pub fn add_process_on(&mut self, node: usize, fabric_access: bool) -> Option<usize> {
        if node >= self.nodes.len() {
            return None;
        }
        self.procs.push(Proc::new(node, fabric_access));
        Some(self.procs.len() - 1)
    }

    /// Whether `pid` is a joined process that has not exited.
    pub fn running(&self, pid: usize) -> bool {
        self.procs.get(pid).is_some_and(|p| !p.exited)
    }

    /// What the processes of `node` hold.
    pub fn live_on(&self, node: usize) -> Live {
        (0..self.procs.len())
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
            self.drop_exports(Shared::Alloc(h));
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
    pub fn drop_exports(&mut self, what: Shared) {
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
            Shared::Multicast(key)
        } else {
            match self.allocs.get(&handle) {
                Some(a) if a.pid == pid && !a.released => {
                    if a.handle_types & kind.bit() == 0 {
                        return violate(self, "C5", Code::INVALID_VALUE);
                    }
                    Shared::Alloc(handle)
                }
                _ => return violate(self, "C5", Code::INVALID_HANDLE),
            }
        };
        let token = self.handle();
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
            Shared::Alloc(src) => {
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
            Shared::Multicast(key) => {
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

    /// Like `enter`, for calls that have no [`crate::Call`] (not counted, no faults).
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::driver::{AllocationRequest, Device, Driver, Location, handle_bits};
    use crate::{Allocation, Context, Exportable, FabricHandle, Multicast, PosixFd, Spec};

    const ALIGN: u64 = 2 << 20;
    const T: Duration = Duration::from_secs(5);

    fn request(dev: i32, handle_types: u32) -> AllocationRequest {
        AllocationRequest {
            location: Location::Device(Device(dev)),
            handle_types,
        }
    }

    #[test]
    fn r12_2_exit_frees_what_the_process_held_and_r12_3_shared_endpoints_live_on() {
        let a = Model::fabric(FabricConfig::nodes(1, 2));
        let b = a.spawn_process();
        let (ca, cb) = (Context::new(a.clone()), Context::new(b.clone()));
        let ep = ca
            .reserve_one()
            .unwrap()
            .create(Spec::spread(2, ALIGN).exportable())
            .unwrap()
            .add_device(0)
            .unwrap();
        let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&ep.export().unwrap().to_bytes())
            .unwrap();
        let imported = cb.reserve_one().unwrap().import(&h).unwrap();
        let imported = imported.add_device(1).unwrap().wait(T).unwrap();
        let ep = ep.wait(T).unwrap();
        let mem = Allocation::<PosixFd>::on_device(&ca, Device(0), ALIGN).unwrap();
        let bound = ep.bind(0, 0, &mem).unwrap();
        // Process a dies holding everything; its typed objects are leaked
        // here as a killed process's would be.
        std::mem::forget(bound);
        std::mem::forget(ep);
        std::mem::forget(mem);
        let held = a.exit();
        assert_eq!(
            (held.ids, held.endpoints, held.bindings, held.allocations),
            (1, 1, 1, 1)
        );
        assert!(a.live().is_empty() && a.has_exited());
        assert_eq!(
            a.live_fabric().endpoint_objects,
            1,
            "b's reference keeps it"
        );
        // b carries on: binds, unbinds, tears down.
        let mem = Allocation::<PosixFd>::on_device(&cb, Device(1), ALIGN).unwrap();
        drop(imported.bind(1, 0, &mem).unwrap());
        drop((imported, mem));
        assert!(b.live().is_empty());
        assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
        assert!(a.violations().is_empty(), "{:?}", a.violations());
        // The exited process makes no more calls.
        // SAFETY: a raw reserve of the exited process; nothing owns it.
        assert_eq!(unsafe { a.id_reserve(1) }, Err(Code::DEINITIALIZED));
    }

    #[test]
    fn r12_4_posix_descriptors_reach_their_node_only() {
        let n0 = Model::fabric(FabricConfig::nodes(2, 1));
        let same = n0.spawn_process();
        let other = n0.spawn_process_on(1).unwrap();
        assert!(n0.spawn_process_on(2).is_none());
        // SAFETY: raw VMM calls on handles these tests own alone.
        unsafe {
            let mem = n0
                .mem_create(ALIGN, request(0, handle_bits::POSIX_FD))
                .unwrap();
            let fd = n0.export_shareable(mem, ShareableKind::PosixFd).unwrap();
            assert_eq!(
                other.import_shareable(fd, ShareableKind::PosixFd),
                Err(Code::INVALID_VALUE)
            );
            let mine = same.import_shareable(fd, ShareableKind::PosixFd).unwrap();
            // Not exported as a fabric handle: the wrong kind is refused.
            assert_eq!(
                n0.export_shareable(mem, ShareableKind::Fabric),
                Err(Code::INVALID_VALUE)
            );
            same.mem_release(mine).unwrap();
            n0.mem_release(mem).unwrap();
            // Freed: the descriptor is closed with it.
            assert_eq!(
                same.import_shareable(fd, ShareableKind::PosixFd),
                Err(Code::INVALID_VALUE)
            );
        }
        // Only the wrong-kind export was a rule the caller could check.
        assert_eq!(n0.violations().len(), 1, "{:?}", n0.violations());
        assert!(n0.live_fabric().is_empty());
    }

    #[test]
    fn imported_memory_is_the_same_memory() {
        let a = Model::fabric(FabricConfig::nodes(1, 1));
        let b = a.spawn_process();
        // SAFETY: raw VMM calls on handles and ranges this test owns alone.
        unsafe {
            let map = |m: &Model, h: u64| {
                let va = m.mem_address_reserve(ALIGN, 0).unwrap();
                m.mem_map(va, ALIGN, 0, h).unwrap();
                m.mem_set_access(va, ALIGN, vec![Device(0)]).unwrap();
                va
            };
            let mem = a
                .mem_create(ALIGN, request(0, handle_bits::POSIX_FD))
                .unwrap();
            let fd = a.export_shareable(mem, ShareableKind::PosixFd).unwrap();
            let theirs = b.import_shareable(fd, ShareableKind::PosixFd).unwrap();
            let (va, vb) = (map(&a, mem), map(&b, theirs));
            b.write(vb + 64, b"written by b").unwrap();
            assert_eq!(a.read(va + 64, 12).unwrap(), b"written by b");
            // Counted once, at the exporter.
            assert_eq!(
                a.mem_get_info(Device(0)).unwrap().1 - a.mem_get_info(Device(0)).unwrap().0,
                ALIGN
            );
            for (m, v, h) in [(&a, va, mem), (&b, vb, theirs)] {
                m.mem_unmap(v, ALIGN).unwrap();
                m.mem_address_free(v, ALIGN).unwrap();
                m.mem_release(h).unwrap();
            }
        }
        assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
        assert!(a.violations().is_empty(), "{:?}", a.violations());
    }

    #[test]
    fn r12_4_fabric_handles_cross_nodes_with_an_imex_channel() {
        let n0 = Model::fabric(FabricConfig::nodes(2, 1));
        let n1 = n0.spawn_process_on(1).unwrap();
        // SAFETY: raw classic calls on objects these tests own alone.
        unsafe {
            let mc = n0
                .multicast_create(2, ALIGN, u64::from(handle_bits::FABRIC))
                .unwrap();
            n0.multicast_add_device(mc, Device(0)).unwrap();
            let token = n0.export_shareable(mc, ShareableKind::Fabric).unwrap();
            n1.set_fabric_access(false);
            assert_eq!(
                n1.import_shareable(token, ShareableKind::Fabric),
                Err(Code::NOT_PERMITTED)
            );
            n1.set_fabric_access(true);
            let theirs = n1.import_shareable(token, ShareableKind::Fabric).unwrap();
            // Node 1's device 0 is another GPU than node 0's device 0.
            n1.multicast_add_device(theirs, Device(0)).unwrap();
            let mem = n1.mem_create(ALIGN, request(0, 0)).unwrap();
            n1.multicast_bind_mem(theirs, 0, mem, 0, ALIGN).unwrap();
            assert_eq!(n1.live().multicast_objects, 1);
            // The creator's release does not free the importer's object.
            n0.mem_release(mc).unwrap();
            assert_eq!(n0.live_fabric().multicast_objects, 1);
            n1.multicast_unbind(theirs, Device(0), 0, ALIGN).unwrap();
            n1.mem_release(theirs).unwrap();
            n1.mem_release(mem).unwrap();
        }
        assert!(n0.live_fabric().is_empty(), "{:?}", n0.live_fabric());
        assert!(n0.violations().is_empty(), "{:?}", n0.violations());
    }
}

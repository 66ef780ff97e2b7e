//! The logical-endpoint rules (R1–R12 of the contract, the contract, `cuda_endpoints::guide::contract`) and the base calls, on the model's tables.
//! Where the contract marks a code *(model's choice)*, the code here is that choice.

use super::state::{Bound, EndpointObj, Enrolled, Slot, Target, World};
use super::violate;
use crate::driver::{
    Code, Device, DriverResult, EndpointProps, FabricHandleBytes, Limits, Location, Shape, attr,
    fnv1a,
};

const HANDLE_MAGIC: &[u8; 8] = b"CEPMODEL";

impl World {
    pub fn attribute(&mut self, dev: Device, a: i32) -> DriverResult<i32> {
        let le = self.config().has_logical_endpoints();
        let Some(d) = self.device(dev) else {
            return Err(Code::INVALID_DEVICE);
        };
        let b = |v: bool| Ok(v as i32);
        match a {
            attr::FABRIC_SUPPORTED => b(d.fabric),
            attr::MULTICAST_SUPPORTED => b(d.classic_multicast),
            attr::HOST_NUMA_ID => Ok(d.host_numa_id),
            // The PCI location (model's choice): domain = the simulated
            // node, bus = ordinal + 1, so that it names one device of the
            // whole simulated fabric, whose nodes share one real host.
            attr::PCI_DOMAIN_ID => i32::try_from(self.node).map_err(|_| Code::INVALID_VALUE),
            attr::PCI_BUS_ID => dev.0.checked_add(1).ok_or(Code::INVALID_DEVICE),
            attr::PCI_DEVICE_ID => Ok(0),
            // A driver older than 13.3 does not know these ids (contract, "Types").
            attr::LE_UNICAST..=attr::LE_UNICAST_OWNER_ACCESS if !le => Err(Code::INVALID_VALUE),
            attr::LE_UNICAST => b(d.unicast),
            attr::LE_MULTICAST => b(d.multicast),
            attr::LE_COUNTED_OPS => b(d.counted_ops),
            attr::LE_UNICAST_OWNER_ACCESS => b(d.unicast_owner_access),
            // 13.5: the bitmask of `CUlogicalEndpointIpcHandleType`s (FABRIC = 1).
            attr::LE_SUPPORTED_HANDLE_TYPES if self.config().driver_version >= 13050 => {
                b(d.le_fabric_handles)
            }
            _ => Err(Code::INVALID_VALUE),
        }
    }

    pub fn mem_info(&mut self, dev: Device) -> DriverResult<(u64, u64)> {
        let Some(total) = self.device(dev).map(|d| d.memory) else {
            return Err(Code::INVALID_DEVICE);
        };
        let node = self.node;
        let used: u64 = self
            .allocs
            .values()
            .filter(|a| !a.imported && a.node == node && a.location == Location::Device(dev))
            .map(|a| a.size)
            .sum();
        Ok((total.saturating_sub(used), total))
    }

    /// Logical endpoints exist only from 13.3 on: older drivers have no symbol.
    fn le_present(&self) -> DriverResult<()> {
        if self.config().has_logical_endpoints() {
            Ok(())
        } else {
            Err(Code::NOT_SUPPORTED)
        }
    }

    pub fn id_reserve(&mut self, pid: usize, count: u32) -> DriverResult<u32> {
        self.le_present()?;
        if count == 0 {
            return violate(self, "R1.3", Code::INVALID_VALUE);
        }
        let max = self.config().max_ids as u64;
        let p = &mut self.procs[pid];
        if p.ids.len() as u64 + count as u64 > max {
            return Err(Code::OUT_OF_MEMORY);
        }
        let Some(end) = p.next_id.checked_add(count) else {
            return Err(Code::OUT_OF_MEMORY);
        };
        let base = p.next_id;
        p.next_id = end;
        for id in base..end {
            p.ids.insert(id, Slot::default());
        }
        Ok(base)
    }

    pub fn id_release(&mut self, pid: usize, base: u32, count: u32) -> DriverResult<()> {
        self.le_present()?;
        if count == 0 {
            return violate(self, "R1.3", Code::INVALID_VALUE);
        }
        let Some(end) = base.checked_add(count) else {
            return violate(self, "R1.1", Code::INVALID_VALUE);
        };
        let p = &self.procs[pid];
        if (base..end).any(|id| !p.ids.contains_key(&id)) {
            return violate(self, "R1.1", Code::INVALID_VALUE);
        }
        if (base..end).any(|id| p.ids[&id].obj.is_some()) {
            return violate(self, "R1.2", Code::INVALID_VALUE);
        }
        let p = &mut self.procs[pid];
        for id in base..end {
            p.ids.remove(&id);
        }
        Ok(())
    }

    fn limits_of(&mut self, props: &EndpointProps) -> DriverResult<Limits> {
        match props.shape {
            Shape::Unicast { owner } => {
                let Some(d) = self.device(owner) else {
                    return violate(self, "R2.2", Code::INVALID_DEVICE);
                };
                if !d.unicast {
                    return Err(Code::NOT_SUPPORTED);
                }
                Ok(Limits {
                    bind_alignment: d.bind_alignment,
                    max_size: d.max_size,
                })
            }
            Shape::Multicast { num_devices } => {
                if num_devices == 0 {
                    return violate(self, "R2.2", Code::INVALID_VALUE);
                }
                let devs = &self.config().devices;
                if devs.is_empty() || !devs.iter().any(|d| d.multicast) {
                    return Err(Code::NOT_SUPPORTED);
                }
                // A team may hold any devices: the strictest limits apply.
                Ok(Limits {
                    bind_alignment: devs.iter().map(|d| d.bind_alignment).max().unwrap_or(1),
                    max_size: devs.iter().map(|d| d.max_size).min().unwrap_or(0),
                })
            }
        }
    }

    pub fn get_limits(&mut self, props: &EndpointProps) -> DriverResult<Limits> {
        self.le_present()?;
        self.limits_of(props)
    }

    /// Whether `dev` may take part in an exportable endpoint: attribute 158
    /// includes FABRIC, or the driver predates 158 (before 13.5).
    fn fabric_handles(&self, dev: Device) -> bool {
        self.config().driver_version < 13050
            || self.device(dev).is_some_and(|d| d.le_fabric_handles)
    }

    pub fn create(&mut self, pid: usize, id: u32, props: &EndpointProps) -> DriverResult<()> {
        self.le_present()?;
        match self.procs[pid].ids.get(&id) {
            Some(s) if s.obj.is_none() => {}
            _ => return violate(self, "R2.1", Code::INVALID_VALUE),
        }
        let props = *props;
        let limits = self.limits_of(&props)?;
        if props.size == 0 || !props.size.is_multiple_of(limits.bind_alignment) {
            return violate(self, "R2.3", Code::INVALID_VALUE);
        }
        if props.size > limits.max_size {
            return violate(self, "R2.3", Code::INVALID_VALUE);
        }
        // R2.4's "FABRIC only" and "COUNTED_OPS only" hold by construction:
        // `EndpointProps` has one boolean for each.
        // COUNTED_OPS needs attribute 155 of the devices that take part (a
        // device's attribute, cuda.h): the unicast owner here; a multicast
        // endpoint names no device at create, so each is checked as it is
        // added (R2.4, model's choice of where).
        if let (true, Shape::Unicast { owner }) = (props.counted_ops, props.shape)
            && !self.device(owner).is_some_and(|d| d.counted_ops)
        {
            return violate(self, "R2.4", Code::NOT_SUPPORTED);
        }
        // The same for FABRIC in `ipcHandleTypes` and attribute 158 (13.5+;
        // before 13.5 nothing says, and the model accepts).
        if let (true, Shape::Unicast { owner }) = (props.ipc_fabric, props.shape)
            && !self.fabric_handles(owner)
        {
            return violate(self, "R2.4", Code::NOT_SUPPORTED);
        }
        let handle = self.handle();
        self.objects.insert(
            handle,
            EndpointObj {
                props,
                node: self.node,
                enrolled: Vec::new(),
                queries_left: self.config().queries_to_ready,
                refs: 1,
                bindings: Vec::new(),
                bind_alignment: limits.bind_alignment,
            },
        );
        let attach = self.attachment();
        let slot = self.procs[pid].ids.entry(id).or_default();
        slot.obj = Some(handle);
        slot.imported = false;
        slot.reported_ready = false;
        slot.attach = attach;
        Ok(())
    }

    /// The endpoint object attached to `id` in process `pid`.
    fn obj_of(&mut self, pid: usize, id: u32, rule: &'static str) -> DriverResult<u64> {
        match self.procs[pid].ids.get(&id).and_then(|s| s.obj) {
            Some(o) => Ok(o),
            None => violate(self, rule, Code::INVALID_VALUE),
        }
    }

    pub fn add_device(&mut self, pid: usize, id: u32, dev: Device) -> DriverResult<()> {
        self.le_present()?;
        let o = self.obj_of(pid, id, "R4")?;
        let Some(clique) = self.device(dev).map(|d| d.clique) else {
            return violate(self, "R4", Code::INVALID_DEVICE);
        };
        let node = self.node;
        let obj = &self.objects[&o];
        // An importer knows the kind, team size and size only from the
        // handle's metadata, which it cannot verify: breaking R4.1, R4.2 or
        // R5.4 on an imported endpoint is the driver's refusal (model's
        // choice, as R12.5), not a rule the caller broke.
        let imported = self.procs[pid].ids.get(&id).is_some_and(|s| s.imported);
        let Shape::Multicast { num_devices } = obj.props.shape else {
            if imported {
                return Err(Code::INVALID_VALUE);
            }
            return violate(self, "R4.1", Code::INVALID_VALUE);
        };
        let attach = self.procs[pid].ids.get(&id).map_or(0, |s| s.attach);
        let mine = |e: &&Enrolled| e.attach == attach;
        let here = obj
            .enrolled
            .iter()
            .find(|e| e.node == node && e.dev == dev)
            .copied();
        let by_me = obj.enrolled.iter().filter(mine).count() as u32;
        let total = obj.enrolled.len() as u32;
        match here {
            Some(e) if e.attach == attach => return violate(self, "R4.2", Code::INVALID_VALUE),
            // R12.5 (model's choice): enrolled by another process (or an
            // earlier attachment), or the team filled up by others: only the
            // driver can know.
            Some(_) => return Err(Code::INVALID_VALUE),
            None if by_me >= num_devices && imported => return Err(Code::INVALID_VALUE),
            None if by_me >= num_devices => return violate(self, "R4.2", Code::INVALID_VALUE),
            None if total >= num_devices => return Err(Code::INVALID_VALUE),
            None => {}
        }
        // R2.4 for a multicast endpoint, device by device (see `create`).
        // An importer that was not told the endpoint counts operations
        // cannot know: the driver's refusal (model's choice, as R12.5).
        if obj.props.counted_ops && !self.device(dev).is_some_and(|d| d.counted_ops) {
            if imported {
                return Err(Code::NOT_SUPPORTED);
            }
            return violate(self, "R2.4", Code::NOT_SUPPORTED);
        }
        // Attribute 158 of each device of an exportable team (13.5+); an
        // importer's endpoint came by a fabric handle, so it knows too.
        if obj.props.ipc_fabric && !self.fabric_handles(dev) {
            return violate(self, "R2.4", Code::NOT_SUPPORTED);
        }
        let first = obj.enrolled.first().copied();
        if self.config().driver_version >= 13040
            && let Some(first) = first
            && self.device_on(first.node, first.dev).map(|d| d.clique) != Some(clique)
        {
            // The crate can read both cliques only when it enrolled the
            // first device itself; another process's device is the
            // driver's knowledge (R12.5).
            if first.attach == attach {
                return violate(self, "R4.5", Code::INVALID_DEVICE);
            }
            return Err(Code::INVALID_DEVICE);
        }
        if let Some(obj) = self.objects.get_mut(&o) {
            obj.enrolled.push(Enrolled { node, dev, attach });
        }
        Ok(())
    }

    pub fn query(&mut self, pid: usize, base: u32, count: u32) -> DriverResult<bool> {
        self.le_present()?;
        let Some(end) = base.checked_add(count).filter(|_| count > 0) else {
            return violate(self, "R3", Code::INVALID_VALUE);
        };
        // Not `with_capacity(count)`: a hostile count would allocate
        // gigabytes before the first missing id ends the loop.
        let mut objs = Vec::new();
        for id in base..end {
            // Model's choice: every id queried must hold an endpoint.
            objs.push(self.obj_of(pid, id, "R3")?);
        }
        let mut all = true;
        for o in &objs {
            let Some(obj) = self.objects.get_mut(o) else {
                all = false;
                continue;
            };
            let complete = match obj.props.shape {
                Shape::Multicast { num_devices } => obj.enrolled.len() as u32 == num_devices,
                Shape::Unicast { .. } => true,
            };
            // R3.2: a multicast endpoint cannot finish before its team is in.
            if !complete {
                all = false;
            } else if obj.queries_left > 0 {
                obj.queries_left -= 1;
                all = false;
            }
        }
        if all {
            let p = &mut self.procs[pid];
            for id in base..end {
                if let Some(s) = p.ids.get_mut(&id) {
                    s.reported_ready = true;
                }
            }
        }
        Ok(all)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &mut self,
        pid: usize,
        id: u32,
        dev: Device,
        offset: u64,
        target: Target,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        self.le_present()?;
        let o = self.obj_of(pid, id, "R5")?;
        let (imported, ready) = {
            let s = &self.procs[pid].ids[&id];
            (s.imported, s.reported_ready)
        };
        if !ready {
            return violate(self, "R3.1", Code::INVALID_VALUE);
        }
        if flags != 0 {
            return violate(self, "R5.8", Code::INVALID_VALUE);
        }
        let obj = &self.objects[&o];
        let (props, align) = (obj.props, obj.bind_alignment);
        if imported && matches!(props.shape, Shape::Unicast { .. }) {
            return violate(self, "R5.7", Code::NOT_SUPPORTED);
        }
        let node = self.node;
        let member = match props.shape {
            Shape::Unicast { owner } => owner == dev && obj.node == node,
            Shape::Multicast { .. } => obj.enrolled.iter().any(|e| e.node == node && e.dev == dev),
        };
        if !member {
            return violate(self, "R5.2", Code::INVALID_DEVICE);
        }
        let (alloc, mem_offset) = match target {
            Target::Handle(h, off) => (h, off),
            Target::Addr(ptr) => match self.resolve_addr(pid, ptr, size) {
                Some(x) => x,
                None => return violate(self, "R5.4", Code::INVALID_VALUE),
            },
        };
        let addr_aligned = match target {
            Target::Handle(..) => mem_offset.is_multiple_of(align),
            Target::Addr(ptr) => ptr.is_multiple_of(align),
        };
        if size == 0
            || !offset.is_multiple_of(align)
            || !size.is_multiple_of(align)
            || !addr_aligned
        {
            return violate(self, "R5.3", Code::INVALID_VALUE);
        }
        let Some(a) = self
            .allocs
            .get(&alloc)
            .filter(|a| a.pid == pid && !a.released)
        else {
            return violate(self, "R5", Code::INVALID_VALUE);
        };
        let fits_mem = mem_offset.checked_add(size).is_some_and(|e| e <= a.size);
        let fits_ep = offset.checked_add(size).is_some_and(|e| e <= props.size);
        if fits_mem && !fits_ep && imported {
            // The size of an imported endpoint came from its handle (see
            // `add_device`).
            return Err(Code::INVALID_VALUE);
        }
        if !fits_mem || !fits_ep {
            return violate(self, "R5.4", Code::INVALID_VALUE);
        }
        let host_numa = self.device(dev).map(|d| d.host_numa_id);
        let on_dev = a.node == self.node
            && match a.location {
                Location::Device(d) => d == dev,
                Location::HostNuma(n) => Some(n) == host_numa,
            };
        if !on_dev {
            return violate(self, "R5.5", Code::INVALID_DEVICE);
        }
        let needs_shareable =
            props.exportable() || (imported && matches!(props.shape, Shape::Multicast { .. }));
        if needs_shareable && a.handle_types == 0 {
            return violate(self, "R5.6", Code::INVALID_VALUE);
        }
        let end = offset + size;
        let overlaps = self.objects[&o]
            .bindings
            .iter()
            .any(|b| b.pid == pid && b.dev == dev && b.offset < end && offset < b.offset + b.size);
        if overlaps {
            return violate(self, "R5.9", Code::INVALID_VALUE);
        }
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.users += 1;
        }
        if let Some(obj) = self.objects.get_mut(&o) {
            obj.bindings.push(Bound {
                pid,
                dev,
                offset,
                size,
                alloc,
                mem_offset,
            });
        }
        Ok(())
    }

    pub fn unbind(
        &mut self,
        pid: usize,
        id: u32,
        dev: Device,
        offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        self.le_present()?;
        let o = self.obj_of(pid, id, "R6")?;
        let align = self.objects[&o].bind_alignment;
        if !offset.is_multiple_of(align) || !size.is_multiple_of(align) || size == 0 {
            return violate(self, "R6.3", Code::INVALID_VALUE);
        }
        // R6.1/R6.2: starts at a bind, and encloses whole, back-to-back binds.
        let mine: Vec<(usize, u64, u64)> = self.objects[&o]
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, b)| b.pid == pid && b.dev == dev)
            .map(|(i, b)| (i, b.offset, b.size))
            .collect();
        let Some(end) = offset.checked_add(size) else {
            return violate(self, "R6.2", Code::INVALID_VALUE);
        };
        let mut at = offset;
        let mut hit = Vec::new();
        while at < end {
            match mine.iter().find(|(_, o, _)| *o == at) {
                Some(&(i, o, s)) => {
                    hit.push(i);
                    at = o + s;
                }
                None => break,
            }
        }
        if hit.is_empty() {
            return violate(self, "R6.1", Code::INVALID_VALUE);
        }
        if at != end {
            return violate(self, "R6.2", Code::INVALID_VALUE);
        }
        hit.sort_unstable_by(|a, b| b.cmp(a));
        let mut freed = Vec::new();
        if let Some(obj) = self.objects.get_mut(&o) {
            for i in hit {
                freed.push(obj.bindings.remove(i).alloc);
            }
        }
        for a in freed {
            self.alloc_unuse(a);
        }
        Ok(())
    }

    pub fn destroy(&mut self, pid: usize, id: u32) -> DriverResult<()> {
        self.le_present()?;
        let o = self.obj_of(pid, id, "R7")?;
        if let Some(s) = self.procs[pid].ids.get_mut(&id) {
            *s = Slot::default();
        }
        let mut freed = Vec::new();
        let mut gone = false;
        if let Some(obj) = self.objects.get_mut(&o) {
            // R7: unbind whatever this process bound, drop its reference.
            obj.bindings.retain(|b| {
                if b.pid == pid {
                    freed.push(b.alloc);
                }
                b.pid != pid
            });
            obj.refs -= 1;
            gone = obj.refs == 0;
        }
        if gone {
            self.objects.remove(&o);
        }
        for a in freed {
            self.alloc_unuse(a);
        }
        Ok(())
    }

    pub fn export(&mut self, pid: usize, id: u32) -> DriverResult<FabricHandleBytes> {
        self.le_present()?;
        let o = self.obj_of(pid, id, "R8")?;
        if !self.objects[&o].props.exportable() {
            return violate(self, "R8.1", Code::INVALID_VALUE);
        }
        let mut data = [0u8; 64];
        data[..8].copy_from_slice(HANDLE_MAGIC);
        data[8..16].copy_from_slice(&self.secret.tag.to_le_bytes());
        data[16..24].copy_from_slice(&o.to_le_bytes());
        // Sealed under the fabric's key: object numbers are sequential, so
        // without the seal any process could name any endpoint.
        let seal = self.secret.seal(super::shareable::SEAL_ENDPOINT, o);
        data[24..32].copy_from_slice(&seal.to_le_bytes());
        let sum = fnv1a(&data[..32]);
        data[32..40].copy_from_slice(&sum.to_le_bytes());
        Ok(FabricHandleBytes(data))
    }

    pub fn import(&mut self, pid: usize, id: u32, handle: &FabricHandleBytes) -> DriverResult<()> {
        self.le_present()?;
        match self.procs[pid].ids.get(&id) {
            Some(s) if s.obj.is_none() => {}
            _ => return violate(self, "R9", Code::INVALID_VALUE),
        }
        let d = &handle.0;
        let mut o = [0u8; 8];
        o.copy_from_slice(&d[16..24]);
        let seal = self
            .secret
            .seal(super::shareable::SEAL_ENDPOINT, u64::from_le_bytes(o));
        let valid = &d[..8] == HANDLE_MAGIC
            && d[8..16] == self.secret.tag.to_le_bytes()
            && d[24..32] == seal.to_le_bytes()
            && d[32..40] == fnv1a(&d[..32]).to_le_bytes()
            && d[40..].iter().all(|&b| b == 0);
        // R9.4: bytes this driver never issued. A process that got them
        // from a peer cannot know (the 64 bytes are opaque): the driver's
        // refusal, not a rule the caller broke (model's choice, as R12.5).
        if !valid {
            return Err(Code::INVALID_VALUE);
        }
        if !self.procs[pid].fabric_access {
            return Err(Code::NOT_PERMITTED);
        }
        let mut o = [0u8; 8];
        o.copy_from_slice(&d[16..24]);
        let o = u64::from_le_bytes(o);
        let Some(obj) = self.objects.get_mut(&o) else {
            // Every reference was dropped before this import (R12.3): only
            // the driver knows, so no rule of the caller's is broken (R12.5).
            return Err(Code::INVALID_VALUE);
        };
        if !obj.props.exportable() {
            // Well-formed bytes naming an endpoint that was never exportable:
            // not a handle this driver issued (forged; R9.4 as above).
            return Err(Code::INVALID_VALUE);
        }
        obj.refs += 1;
        let attach = self.attachment();
        let slot = self.procs[pid].ids.entry(id).or_default();
        slot.obj = Some(o);
        slot.imported = true;
        slot.reported_ready = false;
        slot.attach = attach;
        Ok(())
    }

    /// The allocation and offset mapped at `[ptr, ptr+size)` of this process,
    /// when one mapping covers it all.
    pub fn resolve_addr(&self, pid: usize, ptr: u64, size: u64) -> Option<(u64, u64)> {
        let (_, va) = self.vas.range(..=ptr).next_back()?;
        if va.pid != pid {
            return None;
        }
        let (&start, m) = va.maps.range(..=ptr).next_back()?;
        let end = ptr.checked_add(size)?;
        (end <= start + m.size).then_some((m.alloc, m.offset + (ptr - start)))
    }
}

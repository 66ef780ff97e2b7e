//! The classic multicast contract C1–C6 on the model: synchronous create, team
//! enrollment, binds that would block (C3) reported as violations instead of
//! hanging, and unbinds that must match a bind exactly (C4); mapping a
//! classic object for `multimem` access (a map before the team is complete
//! would block as a bind does: C3), and stores through that mapping reaching
//! every bound memory.

use super::state::{Bound, HandleTarget, McObj, Target, World};
use super::violate;
use crate::driver::{Code, Device, DriverResult, Granularity, Location};

impl World {
    /// Whether this node has classic multicast at all: the granularity and
    /// create calls name no device (and a team may span nodes), so the
    /// driver can only ask that some device has attribute 132 (C6); which
    /// ones join is checked at `cuMulticastAddDevice`.
    fn classic_supported(&self, _n: u32) -> bool {
        self.config().devices.iter().any(|d| d.classic_multicast)
    }

    pub fn mc_granularity(
        &mut self,
        num_devices: u32,
        _size: u64,
        _handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        if !self.classic_supported(num_devices) {
            return Err(Code::NOT_SUPPORTED);
        }
        if num_devices == 0 {
            return violate(self, "C2", Code::INVALID_VALUE);
        }
        let devs = &self.config().devices;
        Ok(match kind {
            Granularity::Minimum => devs.iter().map(|d| d.granularity).max().unwrap_or(1),
            Granularity::Recommended => devs
                .iter()
                .map(|d| d.recommended_granularity)
                .max()
                .unwrap_or(1),
        })
    }

    pub fn mc_create(
        &mut self,
        pid: usize,
        num_devices: u32,
        size: u64,
        handle_types: u64,
    ) -> DriverResult<u64> {
        // C6: the driver refuses when the devices have no multicast.
        if !self.classic_supported(num_devices) {
            return violate(self, "C6", Code::NOT_SUPPORTED);
        }
        let gran = self.mc_granularity(num_devices, size, 0, Granularity::Minimum)?;
        if size == 0 || !size.is_multiple_of(gran) {
            return violate(self, "C1", Code::INVALID_VALUE);
        }
        let h = self.handle();
        self.mcs.insert(
            h,
            McObj {
                handle_types,
                num_devices,
                size,
                granularity: gran,
                devices: Vec::new(),
                added_by: Vec::new(),
                bindings: Vec::new(),
                holders: 1,
            },
        );
        self.mc_handles.insert(h, (pid, h));
        Ok(h)
    }

    /// The multicast object behind `pid`'s handle `mc`, if it holds one.
    pub fn mc_key(&self, pid: usize, mc: u64) -> Option<u64> {
        self.mc_handles
            .get(&mc)
            .filter(|(holder, key)| *holder == pid && self.mcs.contains_key(key))
            .map(|&(_, key)| key)
    }

    pub fn mc_add_device(&mut self, pid: usize, mc: u64, dev: Device) -> DriverResult<()> {
        let Some(capable) = self.device(dev).map(|d| d.classic_multicast) else {
            return violate(self, "C3", Code::INVALID_DEVICE);
        };
        // C6: the crate reads attribute 132 of each team device first.
        if !capable {
            return violate(self, "C6", Code::NOT_SUPPORTED);
        }
        let node = self.node;
        let Some(m) = self.mc_key(pid, mc).and_then(|k| self.mcs.get_mut(&k)) else {
            return violate(self, "C1", Code::INVALID_HANDLE);
        };
        // As the logical-endpoint twin (R4.2, R12.5): a device this process
        // added already, or a team this process filled, is a rule broken; a
        // device another process added, or a team others filled, only the
        // driver can know, so it refuses (model's choice, as R12.5).
        let by_me = m.added_by.iter().filter(|&&p| p == pid).count() as u32;
        match m.devices.iter().position(|&d| d == (node, dev)) {
            Some(i) if m.added_by.get(i) == Some(&pid) => {
                return violate(self, "C3", Code::INVALID_VALUE);
            }
            Some(_) => return Err(Code::INVALID_VALUE),
            None if by_me >= m.num_devices => return violate(self, "C3", Code::INVALID_VALUE),
            None if m.devices.len() as u32 >= m.num_devices => return Err(Code::INVALID_VALUE),
            None => {}
        }
        m.devices.push((node, dev));
        m.added_by.push(pid);
        Ok(())
    }

    pub fn mc_bind(
        &mut self,
        pid: usize,
        mc: u64,
        mc_offset: u64,
        target: Target,
        size: u64,
    ) -> DriverResult<()> {
        let Some(key) = self.mc_key(pid, mc) else {
            return violate(self, "C1", Code::INVALID_HANDLE);
        };
        let m = &self.mcs[&key];
        let (complete, gran, mc_size) = (
            m.devices.len() as u32 == m.num_devices,
            m.granularity,
            m.size,
        );
        if !complete {
            // The driver would block here until the team is in: a hang in a
            // one-thread program. The typed API must never get here.
            return violate(self, "C3", Code::ILLEGAL_STATE);
        }
        let (alloc, mem_offset) = match target {
            Target::Handle(h, off) => (h, off),
            Target::Addr(ptr) => match self.resolve_addr(pid, ptr, size) {
                Some(x) => x,
                None => return violate(self, "C2", Code::INVALID_VALUE),
            },
        };
        let aligned = mc_offset.is_multiple_of(gran)
            && mem_offset.is_multiple_of(gran)
            && size.is_multiple_of(gran);
        let fits = mc_offset.checked_add(size).is_some_and(|e| e <= mc_size);
        let Some(a) = self
            .allocs
            .get(&alloc)
            .filter(|a| a.pid == pid && !a.released)
        else {
            return violate(self, "C2", Code::INVALID_VALUE);
        };
        let fits_mem = mem_offset.checked_add(size).is_some_and(|e| e <= a.size);
        if size == 0 || !aligned || !fits || !fits_mem {
            return violate(self, "C2", Code::INVALID_VALUE);
        }
        let Location::Device(dev) = a.location else {
            return violate(self, "C2", Code::INVALID_VALUE);
        };
        if a.node != self.node || !self.mcs[&key].devices.contains(&(self.node, dev)) {
            return violate(self, "C3", Code::INVALID_DEVICE);
        }
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.users += 1;
        }
        if let Some(m) = self.mcs.get_mut(&key) {
            m.bindings.push(Bound {
                pid,
                dev,
                offset: mc_offset,
                size,
                alloc,
                mem_offset,
            });
        }
        Ok(())
    }

    pub fn mc_unbind(
        &mut self,
        pid: usize,
        mc: u64,
        dev: Device,
        mc_offset: u64,
        size: u64,
    ) -> DriverResult<()> {
        let Some(m) = self.mc_key(pid, mc).and_then(|k| self.mcs.get_mut(&k)) else {
            return violate(self, "C1", Code::INVALID_HANDLE);
        };
        let Some(i) = m
            .bindings
            .iter()
            .position(|b| b.pid == pid && b.dev == dev && b.offset == mc_offset && b.size == size)
        else {
            // Undefined behaviour in the driver: never reachable from the typed API.
            return violate(self, "C4", Code::INVALID_VALUE);
        };
        let alloc = m.bindings.remove(i).alloc;
        self.alloc_unuse(alloc);
        Ok(())
    }

    /// `cuMemMap` of the classic object behind `pid`'s handle (key `key`):
    /// only on a complete team (C3), within the object, at its granularity.
    /// The mapping holds a reference to the object until it is unmapped.
    pub fn mc_map(
        &mut self,
        pid: usize,
        ptr: u64,
        size: u64,
        offset: u64,
        key: u64,
    ) -> DriverResult<()> {
        let m = &self.mcs[&key];
        if (m.devices.len() as u32) < m.num_devices {
            // The driver would block until the team is in (C3).
            return violate(self, "C3", Code::ILLEGAL_STATE);
        }
        let fits = offset.checked_add(size).is_some_and(|e| e <= m.size);
        let aligned = offset.is_multiple_of(m.granularity) && size.is_multiple_of(m.granularity);
        let Some((&base, va)) = self.vas.range(..=ptr).next_back() else {
            return violate(self, "cuMemMap address", Code::INVALID_VALUE);
        };
        let inside = va.pid == pid && ptr.checked_add(size).is_some_and(|e| e <= base + va.size);
        if size == 0 || !fits || !aligned || !inside {
            return violate(self, "cuMemMap range", Code::INVALID_VALUE);
        }
        let end = ptr + size;
        if va.maps.iter().any(|(&s, x)| s < end && ptr < s + x.size) {
            return violate(self, "cuMemMap overlap", Code::ALREADY_MAPPED);
        }
        if let Some(va) = self.vas.get_mut(&base) {
            va.maps.insert(
                ptr,
                super::state::Mapping {
                    size,
                    offset,
                    alloc: 0,
                    access: Vec::new(),
                    multicast: Some(key),
                },
            );
        }
        if let Some(m) = self.mcs.get_mut(&key) {
            m.holders = m.holders.saturating_add(1);
        }
        Ok(())
    }

    /// A mapping of classic object `key` is gone: its reference with it.
    pub fn mc_unmapped(&mut self, key: u64) {
        let gone = self.mcs.get_mut(&key).is_some_and(|m| {
            m.holders = m.holders.saturating_sub(1);
            m.holders == 0
        });
        if gone {
            let freed: Vec<u64> = self
                .mcs
                .remove(&key)
                .map(|m| m.bindings.iter().map(|b| b.alloc).collect())
                .unwrap_or_default();
            self.drop_exports(HandleTarget::Multicast(key));
            for a in freed {
                self.alloc_unuse(a);
            }
        }
    }

    /// `multimem.st` through a mapping of object `key` at object offset
    /// `at`: the bytes reach every memory bound there, on every device.
    pub fn mc_store(&mut self, key: u64, at: u64, bytes: &[u8]) {
        let Some(m) = self.mcs.get(&key) else {
            return;
        };
        let end = at.saturating_add(bytes.len() as u64);
        let targets: Vec<(u64, u64)> = m
            .bindings
            .iter()
            .filter(|b| b.offset <= at && end <= b.offset.saturating_add(b.size))
            .map(|b| (b.alloc, b.mem_offset + (at - b.offset)))
            .collect();
        for (alloc, off) in targets {
            self.store(alloc, off as usize, bytes);
        }
    }

    /// C5: `cuMemRelease` on a multicast handle drops it with the bindings
    /// its process made; the object is freed with its last handle.
    pub fn mc_release(&mut self, mc: u64) -> DriverResult<()> {
        let Some((pid, key)) = self.mc_handles.remove(&mc) else {
            return Ok(());
        };
        let mut freed = Vec::new();
        let mut gone = false;
        if let Some(m) = self.mcs.get_mut(&key) {
            m.bindings.retain(|b| {
                if b.pid == pid {
                    freed.push(b.alloc);
                }
                b.pid != pid
            });
            m.holders = m.holders.saturating_sub(1);
            gone = m.holders == 0;
        }
        if gone {
            if let Some(m) = self.mcs.remove(&key) {
                freed.extend(m.bindings.iter().map(|b| b.alloc));
            }
            self.drop_exports(HandleTarget::Multicast(key));
        }
        for a in freed {
            self.alloc_unuse(a);
        }
        Ok(())
    }
}

//! The classic multicast contract C1–C6 on the model: synchronous create, team
//! enrollment, binds that would block (C3) reported as violations instead of
//! hanging, and unbinds that must match a bind exactly (C4).

use super::state::{Bound, McObj, Target, World};
use super::violate;
use crate::driver::{Code, Device, DriverResult, Granularity, Location};

impl World {
    fn classic_supported(&self) -> bool {
        !self.config.devices.is_empty() && self.config.devices.iter().all(|d| d.classic_multicast)
    }

    pub fn mc_granularity(
        &mut self,
        num_devices: u32,
        _size: u64,
        _handle_types: u64,
        kind: Granularity,
    ) -> DriverResult<u64> {
        if !self.classic_supported() {
            return Err(Code::NOT_SUPPORTED);
        }
        if num_devices == 0 {
            return violate(self, "C2", Code::INVALID_VALUE);
        }
        let devs = &self.config.devices;
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
        _handle_types: u64,
    ) -> DriverResult<u64> {
        // C6: the driver refuses when the devices have no multicast.
        if !self.classic_supported() {
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
                pid,
                num_devices,
                size,
                granularity: gran,
                devices: Vec::new(),
                bindings: Vec::new(),
            },
        );
        Ok(h)
    }

    pub fn mc_add_device(&mut self, pid: usize, mc: u64, dev: Device) -> DriverResult<()> {
        if self.device(dev).is_none() {
            return violate(self, "C3", Code::INVALID_DEVICE);
        }
        match self.mcs.get_mut(&mc) {
            Some(m) if m.pid == pid => {
                if m.devices.contains(&dev) || m.devices.len() as u32 >= m.num_devices {
                    return violate(self, "C3", Code::INVALID_VALUE);
                }
                m.devices.push(dev);
                Ok(())
            }
            _ => violate(self, "C1", Code::INVALID_HANDLE),
        }
    }

    pub fn mc_bind(
        &mut self,
        pid: usize,
        mc: u64,
        mc_offset: u64,
        target: Target,
        size: u64,
    ) -> DriverResult<()> {
        let (complete, gran, mc_size) = match self.mcs.get(&mc) {
            Some(m) if m.pid == pid => (
                m.devices.len() as u32 == m.num_devices,
                m.granularity,
                m.size,
            ),
            _ => return violate(self, "C1", Code::INVALID_HANDLE),
        };
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
        if !self.mcs[&mc].devices.contains(&dev) {
            return violate(self, "C3", Code::INVALID_DEVICE);
        }
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.users += 1;
        }
        if let Some(m) = self.mcs.get_mut(&mc) {
            m.bindings.push(Bound {
                pid,
                dev,
                offset: mc_offset,
                size,
                alloc,
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
        let Some(m) = self.mcs.get_mut(&mc).filter(|m| m.pid == pid) else {
            return violate(self, "C1", Code::INVALID_HANDLE);
        };
        let Some(i) = m
            .bindings
            .iter()
            .position(|b| b.dev == dev && b.offset == mc_offset && b.size == size)
        else {
            // Undefined behaviour in the driver: never reachable from the typed API.
            return violate(self, "C4", Code::INVALID_VALUE);
        };
        let alloc = m.bindings.remove(i).alloc;
        self.alloc_unuse(alloc);
        Ok(())
    }

    /// C5: `cuMemRelease` on the multicast handle drops it, with its bindings.
    pub fn mc_release(&mut self, mc: u64) -> DriverResult<()> {
        if let Some(m) = self.mcs.remove(&mc) {
            for b in m.bindings {
                self.alloc_unuse(b.alloc);
            }
        }
        Ok(())
    }
}

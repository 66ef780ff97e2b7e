//! VMM on the model: `cuMemCreate` allocations backed by host memory, address
//! reservations, mappings and access. An allocation lives until its handle is
//! released and nothing maps or binds it, as in the driver.

use super::state::{Alloc, Mapping, VaRange, World};
use super::violate;
use crate::driver::{
    AllocationRequest, Code, Device, DriverResult, Granularity, Location, handle_bits,
};

/// Host memory behind a model allocation is only materialised (on the first
/// write) up to this size; larger allocations read as zeros and ignore
/// writes past it.
const BACKED: u64 = 64 << 20;

impl World {
    fn check_location(&mut self, req: &AllocationRequest) -> DriverResult<(u64, u64)> {
        let dev = match req.location {
            Location::Device(d) => self.device(d).cloned(),
            Location::HostNuma(n) => self
                .config()
                .devices
                .iter()
                .find(|d| d.host_numa_id == n)
                .cloned(),
        };
        match dev {
            Some(d) => Ok((d.granularity, d.recommended_granularity)),
            None => Err(Code::INVALID_DEVICE),
        }
    }

    pub fn mem_granularity(
        &mut self,
        req: &AllocationRequest,
        kind: Granularity,
    ) -> DriverResult<u64> {
        let (min, rec) = self.check_location(req)?;
        Ok(match kind {
            Granularity::Minimum => min,
            Granularity::Recommended => rec,
        })
    }

    pub fn mem_create(
        &mut self,
        pid: usize,
        size: u64,
        req: &AllocationRequest,
    ) -> DriverResult<u64> {
        let (min, _) = self.check_location(req)?;
        if size == 0 || !size.is_multiple_of(min) {
            return violate(self, "cuMemCreate size", Code::INVALID_VALUE);
        }
        let known = handle_bits::POSIX_FD | handle_bits::FABRIC;
        if req.handle_types & !known != 0 {
            return violate(self, "cuMemCreate handle types", Code::INVALID_VALUE);
        }
        if req.handle_types & handle_bits::FABRIC != 0 && !self.config().fabric_memory_permitted {
            // As on the H200 test machine without a fabric daemon.
            return Err(Code::NOT_PERMITTED);
        }
        if let Location::Device(d) = req.location {
            let (free, _) = self.mem_info(d)?;
            if size > free {
                return Err(Code::OUT_OF_MEMORY);
            }
        }
        let h = self.handle();
        self.allocs.insert(
            h,
            Alloc {
                pid,
                node: self.node,
                imported: false,
                location: req.location,
                handle_types: req.handle_types,
                size,
                released: false,
                users: 0,
                // Materialised on the first write: zeroing megabytes per
                // allocation dominated long runs that never write.
                data: Default::default(),
            },
        );
        Ok(h)
    }

    pub fn mem_release(&mut self, pid: usize, handle: u64) -> DriverResult<()> {
        if self.mc_handles.get(&handle).is_some_and(|h| h.0 == pid) {
            return self.mc_release(handle);
        }
        // R7.2: memory bound to an endpoint (or a classic multicast object)
        // must outlive the binding. Releasing the handle while mapped is fine
        // (the mapping keeps it); while bound, it is a bug in the caller
        // (model's choice: refused).
        let bound = self
            .objects
            .values()
            .flat_map(|o| &o.bindings)
            .chain(self.mcs.values().flat_map(|m| &m.bindings))
            .any(|b| b.alloc == handle);
        if bound && self.allocs.get(&handle).is_some_and(|a| a.pid == pid) {
            return violate(self, "R7.2", Code::INVALID_VALUE);
        }
        match self.allocs.get_mut(&handle) {
            Some(a) if a.pid == pid && !a.released => {
                a.released = true;
                if a.users == 0 {
                    self.allocs.remove(&handle);
                    self.drop_exports(super::state::Shared::Alloc(handle));
                }
                Ok(())
            }
            _ => violate(self, "cuMemRelease handle", Code::INVALID_VALUE),
        }
    }

    pub fn mem_properties(&mut self, pid: usize, handle: u64) -> DriverResult<AllocationRequest> {
        match self.allocs.get(&handle) {
            Some(a) if a.pid == pid && !a.released => Ok(AllocationRequest {
                location: a.location,
                handle_types: a.handle_types,
            }),
            _ => violate(self, "cuMemGetAllocationProperties", Code::INVALID_VALUE),
        }
    }

    pub fn address_reserve(&mut self, pid: usize, size: u64, alignment: u64) -> DriverResult<u64> {
        if size == 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return violate(self, "cuMemAddressReserve", Code::INVALID_VALUE);
        }
        let align = alignment.max(2 << 20);
        let next = self
            .next_va
            .checked_next_multiple_of(align)
            .and_then(|ptr| Some((ptr, ptr.checked_add(size)?.checked_add(align)?)));
        let Some((ptr, next)) = next else {
            return Err(Code::OUT_OF_MEMORY);
        };
        self.next_va = next;
        self.vas.insert(
            ptr,
            VaRange {
                pid,
                size,
                maps: Default::default(),
            },
        );
        Ok(ptr)
    }

    pub fn address_free(&mut self, pid: usize, ptr: u64, size: u64) -> DriverResult<()> {
        match self.vas.get(&ptr) {
            Some(v) if v.pid == pid && v.size == size && v.maps.is_empty() => {
                self.vas.remove(&ptr);
                Ok(())
            }
            _ => violate(self, "cuMemAddressFree", Code::INVALID_VALUE),
        }
    }

    pub fn map(
        &mut self,
        pid: usize,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> DriverResult<()> {
        if let Some(key) = self.mc_key(pid, handle) {
            return self.mc_map(pid, ptr, size, offset, key);
        }
        let fits_alloc = match self.allocs.get(&handle) {
            Some(a) if a.pid == pid && !a.released => {
                let fits = offset.checked_add(size).is_some_and(|e| e <= a.size);
                // An importer cannot know the size of imported memory (the
                // driver has no query for it): mapping past its end is the
                // driver's refusal, not a violation (the model's choice, as R12.5).
                if !fits && a.imported {
                    return Err(Code::INVALID_VALUE);
                }
                fits
            }
            _ => return violate(self, "cuMemMap handle", Code::INVALID_HANDLE),
        };
        let Some((&base, va)) = self.vas.range(..=ptr).next_back() else {
            return violate(self, "cuMemMap address", Code::INVALID_VALUE);
        };
        let end = ptr.checked_add(size);
        let inside = va.pid == pid && end.is_some_and(|e| e <= base + va.size);
        if !inside || !fits_alloc || size == 0 {
            return violate(self, "cuMemMap range", Code::INVALID_VALUE);
        }
        let end = ptr + size;
        if va.maps.iter().any(|(&s, m)| s < end && ptr < s + m.size) {
            return violate(self, "cuMemMap overlap", Code::ALREADY_MAPPED);
        }
        if let Some(va) = self.vas.get_mut(&base) {
            va.maps.insert(
                ptr,
                Mapping {
                    size,
                    offset,
                    alloc: handle,
                    access: Vec::new(),
                    multicast: None,
                },
            );
        }
        if let Some(a) = self.allocs.get_mut(&handle) {
            a.users += 1;
        }
        Ok(())
    }

    pub fn unmap(&mut self, pid: usize, ptr: u64, size: u64) -> DriverResult<()> {
        let base = match self.vas.range(..=ptr).next_back() {
            Some((&b, va))
                if va.pid == pid && va.maps.get(&ptr).is_some_and(|m| m.size == size) =>
            {
                b
            }
            _ => return violate(self, "cuMemUnmap", Code::INVALID_VALUE),
        };
        let gone = self.vas.get_mut(&base).and_then(|va| va.maps.remove(&ptr));
        if let Some(m) = gone {
            self.unmapped(m);
        }
        Ok(())
    }

    pub fn set_access(
        &mut self,
        pid: usize,
        ptr: u64,
        size: u64,
        devices: &[Device],
    ) -> DriverResult<()> {
        if devices.iter().any(|&d| self.device(d).is_none()) {
            return Err(Code::INVALID_DEVICE);
        }
        let base = match self.vas.range(..=ptr).next_back() {
            Some((&b, va))
                if va.pid == pid && va.maps.get(&ptr).is_some_and(|m| m.size == size) =>
            {
                b
            }
            _ => return violate(self, "cuMemSetAccess", Code::INVALID_VALUE),
        };
        let multicast = self
            .vas
            .get(&base)
            .and_then(|v| v.maps.get(&ptr))
            .and_then(|m| m.multicast);
        if let Some(key) = multicast {
            // `multimem` access: only the team's devices of this node.
            let node = self.node;
            let team = &self.mcs[&key].devices;
            if devices.iter().any(|&d| !team.contains(&(node, d))) {
                return violate(self, "C3 access", Code::INVALID_DEVICE);
            }
        }
        if let Some(m) = self.vas.get_mut(&base).and_then(|v| v.maps.get_mut(&ptr)) {
            m.access = devices.to_vec();
        }
        Ok(())
    }

    /// What a mapping held goes with it: an allocation's use, or a
    /// reference to a classic multicast object.
    pub fn unmapped(&mut self, m: super::state::Mapping) {
        match m.multicast {
            Some(key) => self.mc_unmapped(key),
            None => self.alloc_unuse(m.alloc),
        }
    }

    /// Writes `bytes` at `off` of allocation `alloc`'s data.
    pub(crate) fn store(&mut self, alloc: u64, off: usize, bytes: &[u8]) {
        if let Some(a) = self.allocs.get(&alloc) {
            let mut data = a.data.lock().unwrap_or_else(|e| e.into_inner());
            if data.is_empty() {
                data.resize(a.size.min(BACKED) as usize, 0);
            }
            let n = data.len().saturating_sub(off).min(bytes.len());
            if n > 0 {
                data[off..off + n].copy_from_slice(&bytes[..n]);
            }
        }
    }

    /// The allocation (or, `Err(key)`, the classic object) and offset
    /// behind `len` bytes at `ptr`.
    fn backing(
        &mut self,
        pid: usize,
        ptr: u64,
        len: usize,
    ) -> DriverResult<Result<(u64, usize), (u64, u64)>> {
        let (&_base, va) = self.vas.range(..=ptr).next_back().ok_or(Code::NOT_MAPPED)?;
        let (&start, m) = va.maps.range(..=ptr).next_back().ok_or(Code::NOT_MAPPED)?;
        let end = ptr.checked_add(len as u64).ok_or(Code::INVALID_VALUE)?;
        if va.pid != pid || end > start + m.size || m.access.is_empty() {
            return Err(Code::ILLEGAL_ADDRESS);
        }
        let at = m.offset + (ptr - start);
        Ok(match m.multicast {
            Some(key) => Err((key, at)),
            None => Ok((m.alloc, at as usize)),
        })
    }

    /// A store as a kernel makes it; through a classic multicast mapping
    /// (`multimem.st`) it reaches every memory bound there.
    pub fn write(&mut self, pid: usize, ptr: u64, bytes: &[u8]) -> DriverResult<()> {
        match self.backing(pid, ptr, bytes.len())? {
            Ok((alloc, off)) => self.store(alloc, off, bytes),
            Err((key, at)) => self.mc_store(key, at, bytes),
        }
        Ok(())
    }

    /// A plain load; a classic multicast address has none (`multimem`
    /// loads reduce, which the model does not): `ILLEGAL_ADDRESS`.
    pub fn read(&mut self, pid: usize, ptr: u64, len: usize) -> DriverResult<Vec<u8>> {
        let Ok((alloc, off)) = self.backing(pid, ptr, len)? else {
            return Err(Code::ILLEGAL_ADDRESS);
        };
        let mut out = vec![0; len];
        if let Some(a) = self.allocs.get(&alloc) {
            let data = a.data.lock().unwrap_or_else(|e| e.into_inner());
            let n = data.len().saturating_sub(off).min(len);
            if n > 0 {
                out[..n].copy_from_slice(&data[off..off + n]);
            }
        }
        Ok(out)
    }
}

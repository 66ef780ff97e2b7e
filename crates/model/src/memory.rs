//! VMM on the model: `cuMemCreate` allocations backed by host memory, address
//! reservations, mappings and access. An allocation lives until its handle is
//! released and nothing maps or binds it, as in the driver.

use super::state::{Alloc, FIRST_VA, Mapping, VA_END, VA_PER_PROCESS, VaRange, World};
use super::violate;
use crate::driver::{
    AllocationRequest, Code, Device, DriverResult, Granularity, Location, handle_bits,
};

/// Host memory behind a model allocation is only materialised up to this
/// offset; past it an allocation reads as zeros and ignores writes.
const BACKED: u64 = 64 << 20;

/// The unit of [`Backing`]: what one write can make the model allocate.
const CHUNK: u64 = 4096;

/// The bytes of an allocation, sparse: a chunk of [`CHUNK`] bytes is made
/// on the first write that touches it, so a one-byte write costs one chunk
/// (not the allocation), and what was never written reads as zeros.
#[derive(Debug, Default)]
pub(crate) struct Backing {
    chunks: std::collections::BTreeMap<u64, Box<[u8]>>,
}

impl Backing {
    /// Writes `bytes` at `off`; what lies past `limit` (the allocation's
    /// size, at most [`BACKED`]) is dropped.
    pub(crate) fn store(&mut self, limit: u64, off: u64, bytes: &[u8]) {
        let limit = limit.min(BACKED);
        let end = off.saturating_add(bytes.len() as u64).min(limit);
        let mut at = off;
        while at < end {
            let chunk = at / CHUNK;
            let inside = at % CHUNK;
            let n = (CHUNK - inside).min(end - at);
            let data = self
                .chunks
                .entry(chunk)
                .or_insert_with(|| vec![0; CHUNK as usize].into_boxed_slice());
            let from = (at - off) as usize;
            data[inside as usize..(inside + n) as usize]
                .copy_from_slice(&bytes[from..from + n as usize]);
            at += n;
        }
    }

    /// Fills `out` with the bytes at `off` (zeros where never written).
    pub(crate) fn load(&self, off: u64, out: &mut [u8]) {
        out.fill(0);
        let end = off.saturating_add(out.len() as u64);
        let first = off / CHUNK;
        for (&chunk, data) in self.chunks.range(first..) {
            let start = chunk * CHUNK;
            if start >= end {
                break;
            }
            let from = start.max(off);
            let to = (start + CHUNK).min(end);
            if from < to {
                out[(from - off) as usize..(to - off) as usize]
                    .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
            }
        }
    }

    /// How many bytes are materialised.
    pub(crate) fn backed(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
    }
}

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
        match req.location {
            Location::Device(d) => {
                let (free, _) = self.mem_info(d)?;
                if size > free {
                    return Err(Code::OUT_OF_MEMORY);
                }
            }
            // Host memory is limited too: the node's, all processes and
            // NUMA nodes together.
            Location::HostNuma(_) => {
                let node = self.node;
                let used: u64 = self
                    .allocs
                    .values()
                    .filter(|a| {
                        !a.imported && a.node == node && matches!(a.location, Location::HostNuma(_))
                    })
                    .fold(0u64, |sum, a| sum.saturating_add(a.size));
                if used.saturating_add(size) > self.config().host_memory {
                    return Err(Code::OUT_OF_MEMORY);
                }
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
                // Materialised chunk by chunk on the first write that
                // touches it (`Backing`).
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
                    self.drop_exports(super::state::HandleTarget::Alloc(handle));
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
        // The process's own address space: what it holds plus this.
        let held = self
            .vas
            .values()
            .filter(|v| v.pid == pid)
            .try_fold(size, |sum, v| sum.checked_add(v.size));
        if held.is_none_or(|h| h > VA_PER_PROCESS) {
            return Err(Code::OUT_OF_MEMORY);
        }
        // Addresses never used first (a stale pointer meets no new range
        // while they last), then the lowest gap that fits: a process that
        // reserves and frees again and again never leaves the others none.
        let fit = |from: u64| {
            let ptr = from.checked_next_multiple_of(align)?;
            let end = ptr.checked_add(size)?;
            (end <= VA_END).then_some((ptr, end))
        };
        let gap = || {
            let mut from = FIRST_VA;
            for (&start, v) in &self.vas {
                if let Some((ptr, end)) = fit(from)
                    && end <= start
                {
                    return Some((ptr, end));
                }
                from = from.max(start.saturating_add(v.size));
            }
            fit(from)
        };
        let Some((ptr, end)) = fit(self.next_va).or_else(gap) else {
            return Err(Code::OUT_OF_MEMORY);
        };
        // One alignment's gap after each range, as before.
        self.next_va = self.next_va.max(end.saturating_add(align));
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
            data.store(a.size, off as u64, bytes);
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
            data.load(off as u64, &mut out);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_byte_write_backs_one_chunk_and_reads_round_trip() {
        let mut b = Backing::default();
        b.store(64 << 20, (32 << 20) + 5, &[7]);
        assert_eq!(b.backed(), CHUNK);
        let mut out = [1u8; 3];
        b.load((32 << 20) + 4, &mut out);
        assert_eq!(out, [0, 7, 0]);
        // Across a chunk boundary, and past the limit.
        b.store(CHUNK + 2, CHUNK - 2, &[1, 2, 3, 4, 5, 6]);
        let mut out = [9u8; 6];
        b.load(CHUNK - 2, &mut out);
        assert_eq!(out, [1, 2, 3, 4, 0, 0]);
    }
}

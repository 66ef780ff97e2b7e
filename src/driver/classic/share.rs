//! How [`Classic`] shares its objects across processes ([`ObjectSharing`],
//! C5): a team's object exported by shareable handle, staged for import,
//! completed when the bring-up agrees.

use super::*;

impl ObjectSharing for Classic {
    /// Marks the shared endpoint `id` complete: binds may go to the driver
    /// from now on, and a query reports it ready (C3).
    ///
    /// # Safety
    /// Every device of the team was added to the object, by this process
    /// or another (the bring-up's agreement step says so); otherwise a bind
    /// blocks in the driver until they are (C3).
    unsafe fn team_complete(&self, id: u32) -> DriverResult<()> {
        let mut t = self.lock();
        match t.ids.get_mut(&id) {
            Some(Some(ep)) if ep.mc.is_some() && ep.shared => {
                ep.complete = true;
                Ok(())
            }
            _ => Err(Code::INVALID_VALUE),
        }
    }

    /// Exports the classic object of the shared (exportable) endpoint `id`
    /// as `kind` (`cuMemExportToShareableHandle`, C5), for the team
    /// bring-up. `NOT_SUPPORTED` before the driver when the object was not
    /// made with that handle type (fabric refused at create).
    fn export_object(&self, id: u32, kind: ShareableKind) -> DriverResult<ObjectExport> {
        // Intent under the lock: the endpoint is busy (no destroy releases
        // `mc` meanwhile); the export itself runs with no lock held.
        let mc = self.with_ep(id, |ep| {
            let (Some(mc), true, false) = (ep.mc, ep.shared, ep.busy) else {
                return Err(Code::INVALID_VALUE);
            };
            if ep.handle_types & u64::from(kind.bit()) == 0 {
                return Err(Code::NOT_SUPPORTED);
            }
            ep.busy = true;
            Ok(mc)
        })?;
        // Not busy again when the export returns or unwinds.
        let _idle = Idle { classic: self, id };
        // SAFETY: an export makes a new descriptor or bytes and changes
        // nothing about `mc`, this backend's own object.
        match unsafe { self.inner.mem_export(mc, kind) }? {
            ShareableHandle::PosixFd(fd) if fd >= 0 && kind == ShareableKind::PosixFd => {
                // SAFETY: the driver hands an exported descriptor to the
                // caller (C5), which owns it from now on.
                Ok(ObjectExport::Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
            }
            ShareableHandle::Fabric(b) if kind == ShareableKind::Fabric => {
                Ok(ObjectExport::Fabric(b.0))
            }
            _ => Err(Code::UNKNOWN),
        }
    }

    /// Stages `what` (received from the exporter) for import as a team of
    /// `num_devices` devices and `size` bytes per device, the values the
    /// ranks agreed on: the returned ticket goes to
    /// `cuLogicalEndpointImport` as the handle bytes. Nothing the exporter
    /// sent decides what is imported but the object itself.
    fn stage_import(
        &self,
        what: ObjectExport,
        num_devices: u32,
        size: u64,
    ) -> DriverResult<FabricHandleBytes> {
        let mut ticket = [0u8; 64];
        getrandom::fill(&mut ticket).map_err(|_| Code::OPERATING_SYSTEM)?;
        let staged = Staged {
            what,
            num_devices,
            size,
        };
        self.staged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ticket, staged);
        Ok(FabricHandleBytes(ticket))
    }

    /// Drops a staged import that was not used (its descriptor closes).
    fn unstage(&self, ticket: &FabricHandleBytes) {
        self.staged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ticket.0);
    }

    /// The classic object of endpoint `id`, for `cuMemMap` (multimem
    /// access): only once the team is complete, since a map before then
    /// blocks as a bind does (C3). The object stays this backend's: the
    /// caller maps it and unmaps it before the endpoint is destroyed.
    fn mappable_object(&self, id: u32) -> DriverResult<u64> {
        match self.lock().ids.get(&id) {
            Some(Some(Emulated {
                mc: Some(mc),
                complete: true,
                ..
            })) => Ok(*mc),
            _ => Err(Code::INVALID_VALUE),
        }
    }

    /// How many devices this process added to endpoint `id`, as this
    /// backend recorded them (the team bring-up's enrollment report).
    fn enrolled_here(&self, id: u32) -> Option<usize> {
        match self.lock().ids.get(&id) {
            Some(Some(ep)) => Some(ep.devices.len()),
            _ => None,
        }
    }
}

//! The logical-endpoint calls of [`Classic`] ([`Forward`]), each emulated
//! on the classic `cuMulticast*` calls of the inner driver as the table of
//! the module doc says; every other call passes through.

use super::*;

impl Forward for Classic {
    type Inner = dyn Driver;

    fn inner(&self) -> &(dyn Driver + 'static) {
        &*self.inner
    }

    fn object_sharing(&self) -> Option<&dyn ObjectSharing> {
        Some(self)
    }

    fn name(&self) -> String {
        format!("classic({})", self.inner.name())
    }

    unsafe fn device_attribute(&self, dev: Device, a: i32) -> DriverResult<i32> {
        // SAFETY: attribute queries touch nothing anyone owns.
        unsafe {
            match a {
                attr::LE_MULTICAST => self.inner.device_attribute(dev, attr::MULTICAST_SUPPORTED),
                // Unicast endpoints are bookkeeping for the portable path:
                // every device has them.
                attr::LE_UNICAST => self
                    .inner
                    .device_attribute(dev, attr::MULTICAST_SUPPORTED)
                    .map(|_| 1),
                attr::LE_COUNTED_OPS | attr::LE_UNICAST_OWNER_ACCESS => {
                    // Validate the ordinal the same way, then answer "no".
                    self.inner
                        .device_attribute(dev, attr::MULTICAST_SUPPORTED)
                        .map(|_| 0)
                }
                _ => self.inner.device_attribute(dev, a),
            }
        }
    }

    unsafe fn id_reserve(&self, count: u32) -> DriverResult<u32> {
        if count == 0 {
            return Err(Code::INVALID_VALUE); // R1.3
        }
        let mut t = self.lock();
        // The ids are this table's: bound them as a driver would (R11), so
        // that a hostile count is an error, not minutes of inserting.
        if t.ids.len() as u64 + count as u64 > MAX_IDS {
            return Err(Code::OUT_OF_MEMORY);
        }
        let base = t.next_id;
        let end = base.checked_add(count).ok_or(Code::OUT_OF_MEMORY)?;
        t.next_id = end;
        for id in base..end {
            t.ids.insert(id, None);
        }
        Ok(base)
    }

    unsafe fn id_release(&self, base: u32, count: u32) -> DriverResult<()> {
        if count == 0 {
            return Err(Code::INVALID_VALUE); // R1.3
        }
        let end = base.checked_add(count).ok_or(Code::INVALID_VALUE)?;
        let mut t = self.lock();
        for id in base..end {
            match t.ids.get(&id) {
                Some(None) => {}
                // R1.1 not reserved here; R1.2 still holds an endpoint.
                _ => return Err(Code::INVALID_VALUE),
            }
        }
        for id in base..end {
            t.ids.remove(&id);
        }
        Ok(())
    }

    unsafe fn get_limits(&self, props: EndpointProps) -> DriverResult<Limits> {
        if let Shape::Unicast { owner } = props.shape {
            return self.unicast_limits(owner, &props);
        }
        let n = Self::team_size(&props)?;
        // C6 before any cuMulticast* call: at least `n` devices must have it
        // (a team shared across processes and nodes: at least one here; each
        // device is checked again as it is added).
        let local = if props.ipc_fabric { 1 } else { n };
        if self.capable_devices()? < local {
            tracing::debug!(
                team = n,
                "classic multicast: fewer devices than the team report MULTICAST_SUPPORTED"
            );
            return Err(Code::NOT_SUPPORTED);
        }
        // SAFETY: a granularity query touches nothing anyone owns.
        let align = noted(Call::MulticastGetGranularity, unsafe {
            self.inner
                .multicast_granularity(n, props.size, 0, self.granularity)
        })?
        .max(1);
        Ok(Limits {
            bind_alignment: align,
            // The classic API has no maxSize: cuMulticastCreate answers
            // OUT_OF_MEMORY for what it cannot back.
            max_size: u64::MAX / align * align,
        })
    }

    unsafe fn create(&self, id: u32, props: EndpointProps) -> DriverResult<()> {
        let free = |t: &Table| matches!(t.ids.get(&id), Some(None));
        if !free(&self.lock()) {
            return Err(Code::INVALID_VALUE); // R2.1
        }
        if let Shape::Unicast { owner } = props.shape {
            return self.create_unicast(id, owner, &props);
        }
        let num_devices = Self::team_size(&props)?;
        if props.size == 0 {
            return Err(Code::INVALID_VALUE); // R2.3
        }
        // Shared across processes: the object must exist before it can be
        // exported (C5), so it is made now, before its devices are known;
        // each is checked for attribute 132 as it is added (C6), and no bind
        // passes before the team is complete (C3). No lock is held across
        // the inner calls.
        let (mc, handle_types) = if props.ipc_fabric {
            // A panic inside the create loses the object before this backend
            // sees it (README "Guarantees"); the id still gets an endpoint,
            // with no object, so that the typed API's destroy of it (it takes
            // the create as made) finds one.
            let unwound = OnUnwind::new(|| {
                if let Some(slot @ None) = self.lock().ids.get_mut(&id) {
                    *slot = Some(Emulated::without_object(num_devices, props.size));
                }
            });
            let made = self.create_shareable(num_devices, props.size);
            unwound.disarm();
            let (mc, types) = noted(Call::MulticastCreate, made)?;
            (Some(mc), types)
        } else {
            (None, 0)
        };
        let mut t = self.lock();
        if !free(&t) {
            // Taken meanwhile by a racing raw caller: give the object back.
            drop(t);
            if let Some(mc) = mc {
                // SAFETY: `mc` was made just above and is no one else's.
                let _ = unsafe { self.inner.mem_release(mc) };
            }
            return Err(Code::INVALID_VALUE);
        }
        t.ids.insert(
            id,
            Some(Emulated {
                num_devices,
                size: props.size,
                devices: Vec::new(),
                mc,
                shared: props.ipc_fabric,
                handle_types,
                complete: false,
                stale: None,
                bindings: Vec::new(),
                busy: false,
                unicast: None,
            }),
        );
        Ok(())
    }

    unsafe fn add_device(&self, id: u32, dev: Device) -> DriverResult<()> {
        let check = |ep: &mut Emulated| {
            if ep.unicast.is_some() {
                return Err(Code::INVALID_VALUE); // R4.1: multicast only
            }
            if ep.busy || ep.devices.contains(&dev) || ep.devices.len() as u32 >= ep.num_devices {
                return Err(Code::INVALID_VALUE); // R4.2
            }
            if ep.shared && ep.mc.is_none() {
                // Its object was lost to a panic (`without_object`).
                return Err(Code::INVALID_VALUE);
            }
            Ok(())
        };
        self.with_ep(id, check)?;
        // C6: refuse before cuMulticastCreate.
        if !noted(Call::DeviceGetAttribute, self.multicast_supported(dev))? {
            tracing::debug!(
                device = dev.0,
                "classic multicast refused: MULTICAST_SUPPORTED (attribute 132) is 0"
            );
            return Err(Code::NOT_SUPPORTED);
        }
        /// What the enrollment does once the lock is let go.
        enum Step {
            Recorded,
            CrossProcess(u64),
            Last(u32, u64, Vec<Device>),
        }
        let step = self.with_ep(id, |ep| {
            check(ep)?;
            if let (true, Some(mc)) = (ep.shared, ep.mc) {
                ep.busy = true;
                return Ok(Step::CrossProcess(mc));
            }
            if (ep.devices.len() as u32) + 1 < ep.num_devices {
                ep.devices.push(dev);
                return Ok(Step::Recorded);
            }
            ep.busy = true;
            let mut team = ep.devices.clone();
            team.push(dev);
            Ok(Step::Last(ep.num_devices, ep.size, team))
        })?;
        if let Step::Recorded = step {
            return Ok(());
        }
        // Busy from here: not busy again when the enrollment returns or
        // unwinds.
        let _idle = Idle { classic: self, id };
        let (built, shared) = match step {
            Step::Recorded => return Ok(()),
            Step::CrossProcess(mc) => {
                // A panic inside the add is taken as coming after the driver
                // added (see `OnUnwind`): the device is enrolled on the
                // object, and the table says so.
                let enrolled = OnUnwind::new(|| {
                    let _ = self.with_ep(id, |ep| {
                        if !ep.devices.contains(&dev) {
                            ep.devices.push(dev);
                        }
                        Ok(())
                    });
                });
                // The object exists (shared across processes): add at once.
                // SAFETY: `mc` is this backend's object; no bind on it is in
                // flight (none passes before the team is complete, C3).
                let r = unsafe { self.inner.multicast_add_device(mc, dev) };
                enrolled.disarm();
                (
                    noted(Call::MulticastAddDevice, r)
                        .map(|()| mc)
                        .map_err(|code| (code, None)),
                    true,
                )
            }
            // The last device: only now does the object exist, so no bind
            // can ever be issued on an incomplete team (C3).
            Step::Last(num_devices, size, team) => {
                // The object being built, while no one else knows it: a
                // panic inside an add (taken as coming after the driver
                // acted, see `OnUnwind`) leaves it to be released when the
                // backend drops; one inside its release does not release it
                // again (forgotten before the call). A panic inside the
                // create loses it before this backend sees it (README
                // "Guarantees").
                let building: Cell<Option<u64>> = Cell::new(None);
                let release = OnUnwind::new(|| {
                    if let Some(mc) = building.take() {
                        self.orphan(mc, Vec::new());
                    }
                });
                let built = (|| {
                    // SAFETY: every team device said yes to attribute 132 (C6).
                    let r = unsafe { self.inner.multicast_create(num_devices, size, 0) };
                    let mc = noted(Call::MulticastCreate, r).map_err(|code| (code, None))?;
                    building.set(Some(mc));
                    for &d in &team {
                        // SAFETY: `mc` is this backend's new object; nothing is
                        // bound yet (C3).
                        let r = unsafe { self.inner.multicast_add_device(mc, d) };
                        if let Err(code) = noted(Call::MulticastAddDevice, r) {
                            building.set(None);
                            // SAFETY: `mc` is this backend's own and nothing
                            // is bound to it.
                            if let Err(c2) = unsafe { self.inner.mem_release(mc) } {
                                // Kept, and released again at destroy, whose
                                // failure reaches the caller (and its
                                // teardown list).
                                tracing::error!(code = %c2, "cuMemRelease of a half-built multicast object failed; retried at destroy");
                                return Err((code, Some(mc)));
                            }
                            return Err((code, None));
                        }
                    }
                    Ok(mc)
                })();
                release.disarm();
                (built, false)
            }
        };
        let mut t = self.lock();
        let ep = match t.ids.get_mut(&id) {
            Some(Some(ep)) => ep,
            // Not reachable: `busy` refused a destroy.
            _ => return built.map(|_| ()).map_err(|(code, _)| code),
        };
        let mc = match built {
            Ok(mc) => mc,
            Err((code, stale)) => {
                if stale.is_some() {
                    ep.stale = stale;
                }
                return Err(code);
            }
        };
        ep.devices.push(dev);
        if shared {
            // Every device added here: complete without the bring-up.
            ep.complete = ep.devices.len() as u32 == ep.num_devices;
        } else {
            ep.mc = Some(mc);
            ep.complete = true;
        }
        Ok(())
    }

    unsafe fn query(&self, base: u32, count: u32) -> DriverResult<bool> {
        if count == 0 {
            return Err(Code::INVALID_VALUE);
        }
        let end = base.checked_add(count).ok_or(Code::INVALID_VALUE)?;
        let t = self.lock();
        let mut ready = true;
        for id in base..end {
            match t.ids.get(&id) {
                Some(Some(ep)) => ready &= ep.complete,
                _ => return Err(Code::INVALID_VALUE),
            }
        }
        Ok(ready)
    }

    unsafe fn bind_mem(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        mem: u64,
        mem_offset: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        // The classic bind takes no device: it binds on the memory's own
        // device, which must be the one asked for (R5.5).
        // SAFETY: a property query touches nothing anyone owns.
        let location = unsafe { self.inner.mem_properties(mem) }.map(|p| p.location);
        let (mc, bind) = self.intend_bind(id, dev, offset, size, flags)?;
        let r = match location {
            // A unicast endpoint: the record is the binding; no driver
            // object to bind to.
            Ok(Location::Device(d)) if d == dev && mc.is_none() => Ok(()),
            Ok(Location::Device(d)) if d == dev => match mc {
                Some(mc) => {
                    // A panic inside the call may come before the driver bound.
                    let unwound = OnUnwind::new(|| self.bind_unwound(id, bind));
                    // SAFETY: the team of `mc` is complete (`bindable`,
                    // C3); the caller keeps `mem` alive while bound (R7.2,
                    // this method's contract).
                    let r = unsafe {
                        self.inner
                            .multicast_bind_mem(mc, offset, mem, mem_offset, size)
                    };
                    unwound.disarm();
                    r
                }
                None => Ok(()),
            },
            Ok(_) => return self.settle_bind(id, bind, Err(Code::INVALID_VALUE)),
            Err(code) => Err(code),
        };
        let r = noted(
            if location.is_err() {
                Call::MemGetAllocationProperties
            } else {
                Call::MulticastBindMem
            },
            r,
        );
        self.settle_bind(id, bind, r)
    }

    unsafe fn bind_addr(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        ptr: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<()> {
        let (mc, bind) = self.intend_bind(id, dev, offset, size, flags)?;
        let Some(mc) = mc else {
            // A unicast endpoint: the record is the binding (where the memory
            // lives was checked by the typed API, R5.5).
            return Ok(());
        };
        // Where the mapped memory lives was checked by the typed API (R5.5);
        // the driver binds it on its own device.
        // A panic inside the call may come before the driver bound.
        let unwound = OnUnwind::new(|| self.bind_unwound(id, bind));
        // SAFETY: the team of `mc` is complete (`bindable`, C3); the caller
        // keeps the mapping alive while bound (R7.2, this method's contract).
        let r = noted(Call::MulticastBindAddr, unsafe {
            self.inner.multicast_bind_addr(mc, offset, ptr, size)
        });
        unwound.disarm();
        self.settle_bind(id, bind, r)
    }

    unsafe fn unbind(&self, id: u32, dev: Device, offset: u64, size: u64) -> DriverResult<()> {
        let end = offset.checked_add(size).ok_or(Code::INVALID_VALUE)?;
        let (mc, covered) = self.with_ep(id, |ep| {
            let mc = match (ep.mc, ep.unicast) {
                (Some(mc), _) => Some(mc),
                // A unicast endpoint: its records are its binds.
                (None, Some(_)) if !ep.busy => None,
                _ => return Err(Code::INVALID_VALUE), // nothing can be bound yet
            };
            // R6.1/R6.2: the range must be tiled exactly by binds on `dev`.
            let mut covered: Vec<Bind> = ep
                .bindings
                .iter()
                .copied()
                .filter(|b| b.dev == dev && b.offset < end && offset < b.offset + b.size)
                .collect();
            covered.sort_by_key(|b| b.offset);
            let mut at = offset;
            for b in &covered {
                if b.offset != at {
                    return Err(Code::INVALID_VALUE);
                }
                at = b.offset + b.size;
            }
            if covered.is_empty() || at != end || covered.iter().any(|b| !b.known) {
                // C4: a mismatched classic unbind is undefined behaviour; it
                // never reaches the driver (nor one of a bind not known
                // made).
                return Err(Code::INVALID_VALUE);
            }
            // Intent: out of the table while they are being unbound.
            ep.bindings.retain(|b| !covered.contains(b));
            Ok((mc, covered))
        })?;
        let Some(mc) = mc else {
            return Ok(()); // recorded only: nothing to unbind in the driver
        };
        let r = self.unbind_all(id, mc, covered);
        match r {
            Ok(()) => Ok(()),
            Err((code, left)) => {
                // Still bound: back into the table.
                let _ = self.with_ep(id, |ep| {
                    ep.bindings.extend(left);
                    Ok(())
                });
                Err(code)
            }
        }
    }

    unsafe fn destroy(&self, id: u32) -> DriverResult<()> {
        let (mc, stale, binds) = self.with_ep(id, |ep| {
            if ep.busy {
                return Err(Code::INVALID_VALUE);
            }
            // Intent: busy (no bind, enrollment or export meanwhile), the
            // binds out of the table while they are being unbound.
            ep.busy = true;
            Ok((ep.mc, ep.stale, std::mem::take(&mut ep.bindings)))
        })?;
        // Not busy again when the destroy fails (on success the endpoint is
        // gone).
        let _idle = Idle { classic: self, id };
        // A panic inside an unbind or a release is taken as coming after the
        // driver acted (see `OnUnwind`), as the typed API takes it: the
        // endpoint is destroyed, and the typed API frees the memory bound
        // through it. So the binds not yet unbound (back in the table) are
        // unbound now, a panic of theirs caught; if any is left on the
        // object (not known made, or its unbind failed), the object is
        // released now, which drops it (C5); an object with nothing left is
        // released when the backend drops.
        let unwound = OnUnwind::new(|| {
            let left = self.with_ep(id, |ep| Ok((ep.mc, std::mem::take(&mut ep.bindings))));
            // A bind not known made stays on the object whatever the
            // unbinds below do: it is never unbound (C4).
            let not_known = matches!(&left, Ok((_, binds)) if binds.iter().any(|b| !b.known));
            if let Ok((Some(mc), binds)) = left
                && !binds.is_empty()
            {
                // Caught here, not only by `OnUnwind`: the object is still
                // taken out of the table below.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.unbind_all(id, mc, binds)
                }));
                if let Ok(Err((_, still))) = r {
                    let _ = self.with_ep(id, |ep| {
                        ep.bindings.extend(still);
                        Ok(())
                    });
                }
            }
            let ep = match self.lock().ids.get_mut(&id) {
                Some(slot) => slot.take(),
                None => None,
            };
            if let Some(ep) = ep {
                match ep.mc {
                    // Binds still on the object (one not known made, one
                    // whose unbind failed): the typed API frees their memory
                    // once this unwinds, so the object goes now, which drops
                    // them (C5, R7.2); a panic inside the release is taken
                    // as coming after it. Only a failed release is left to
                    // the backend's drop.
                    Some(mc) if not_known || !ep.bindings.is_empty() => {
                        // SAFETY: `mc` is this backend's own object, out of
                        // the table: released once.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                            noted(Call::MemRelease, self.inner.mem_release(mc))
                        }));
                        if let Ok(Err(_)) = r {
                            self.orphan(mc, ep.bindings);
                        }
                    }
                    Some(mc) => self.orphan(mc, ep.bindings),
                    None => {}
                }
                if let Some(st) = ep.stale {
                    self.orphan(st, Vec::new());
                }
            }
        });
        // R7: destroy unbinds what is still bound, exactly as bound (C4).
        // C5: the object goes before the memory that was bound to it (the
        // typed API frees memory only after destroy returns). Each object is
        // forgotten before its release call.
        let mut r = match mc {
            None => Ok(()),
            Some(mc) => self.unbind_all(id, mc, binds).and_then(|()| {
                self.release_object(id, mc, |ep| ep.mc = None, |ep| ep.mc = Some(mc))
                    .map_err(|code| (code, Vec::new()))
            }),
        };
        if r.is_ok()
            && let Some(st) = stale
        {
            r = self
                .release_object(id, st, |ep| ep.stale = None, |ep| ep.stale = Some(st))
                .map_err(|code| (code, Vec::new()));
        }
        unwound.disarm();
        let mut t = self.lock();
        let Some(slot) = t.ids.get_mut(&id) else {
            return r.map_err(|(code, _)| code);
        };
        match r {
            Ok(()) => {
                *slot = None;
                Ok(())
            }
            Err((code, left)) => {
                if let Some(ep) = slot {
                    ep.bindings.extend(left);
                }
                Err(code)
            }
        }
    }

    /// A fabric copy names this backend's own ids, which no driver knows
    /// (and a unicast endpoint here has no driver object at all): refused
    /// before the inner driver. Copies take the portable path.
    unsafe fn fabric_copy_batch(
        &self,
        _stream: u64,
        _ops: crate::driver::CopyOps,
        _flags: u64,
    ) -> DriverResult<()> {
        Err(Code::NOT_SUPPORTED)
    }

    fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
        Some(match call {
            Call::GetLimits | Call::Create => {
                "the classic fallback makes multicast endpoints for teams of devices that report MULTICAST_SUPPORTED, without fabric export (C1, C6), and unicast endpoints as process-local bookkeeping for the portable path (no driver object); neither has counted operations"
            }
            Call::AddDevice => {
                "the device reports MULTICAST_SUPPORTED (attribute 132) = 0, so the classic fallback cannot enroll it (C6)"
            }
            Call::FabricCpyBatchAsync => {
                "the classic fallback has no fabric copy: its ids are its own and its unicast endpoints have no driver object, so copies take the portable path (cuMemcpyAsync through the memory bound to the team, or through add_peer_window for a peer's memory)"
            }
            Call::Export | Call::Import => {
                "the classic fallback shares its multicast objects only through the team bring-up (team::multicast: a POSIX descriptor within a node, fabric bytes across nodes), not as logical-endpoint fabric handles; only its exportable unicast endpoints export (a ticket of bookkeeping, whose memory the importer reaches with add_peer_window)"
            }
            _ => return None,
        })
    }

    /// A unicast endpoint created exportable gives its ticket (the same
    /// bytes every time); a multicast one is shared only through the team
    /// bring-up (`NOT_SUPPORTED`).
    unsafe fn export(&self, id: u32) -> DriverResult<FabricHandleBytes> {
        self.with_ep(id, |ep| match ep.unicast {
            Some(Uni::Owned {
                ticket: Some(ticket),
            }) => Ok(FabricHandleBytes(ticket)),
            // R8.1: not created exportable, or imported.
            Some(_) => Err(Code::INVALID_VALUE),
            None => Err(Code::NOT_SUPPORTED),
        })
    }

    /// Only what the team bring-up staged (by a ticket of its own): the
    /// classic object behind it becomes this process's own (C5); any other
    /// bytes are `NOT_SUPPORTED`.
    unsafe fn import(&self, id: u32, handle: FabricHandleBytes) -> DriverResult<()> {
        let free = |t: &Table| matches!(t.ids.get(&id), Some(None));
        if !free(&self.lock()) {
            return Err(Code::INVALID_VALUE); // R2.1
        }
        let staged = self
            .staged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&handle.0);
        let Some(Staged {
            what,
            num_devices,
            size,
        }) = staged
        else {
            // Not staged here: a classic unicast ticket, or not a handle at
            // all (R9.4).
            return self.import_unicast(id, &handle);
        };
        let shared = match &what {
            ObjectExport::Fd(fd) => ShareableHandle::PosixFd(fd.as_raw_fd()),
            ObjectExport::Fabric(b) => ShareableHandle::Fabric(FabricHandleBytes(*b)),
        };
        // A panic inside the import loses the object before this backend
        // sees it (README "Guarantees"); the id still gets an endpoint, with
        // no object, so that the typed API's destroy of it (it takes the
        // import as made) finds one.
        let unwound = OnUnwind::new(|| {
            if let Some(slot @ None) = self.lock().ids.get_mut(&id) {
                *slot = Some(Emulated::without_object(num_devices, size));
            }
        });
        // No lock held: the import is the inner driver's call (and its
        // tracing), as in `create`.
        // SAFETY: the descriptor is owned by `what`, open for the call.
        let mc = unsafe { self.inner.mem_import(shared) };
        unwound.disarm();
        let mc = mc?;
        drop(what); // the descriptor closes; the object lives on in `mc`
        let mut t = self.lock();
        if !free(&t) {
            // Taken meanwhile by a racing raw caller: give the object back.
            drop(t);
            // SAFETY: `mc` was imported just above and is no one else's.
            let _ = unsafe { self.inner.mem_release(mc) };
            return Err(Code::INVALID_VALUE);
        }
        t.ids.insert(
            id,
            Some(Emulated {
                mc: Some(mc),
                ..Emulated::without_object(num_devices, size)
            }),
        );
        Ok(())
    }
}

//! [`Classic`]: the logical-endpoint calls emulated on the classic
//! `cuMulticast*` API (SPEC C1–C6), for drivers before 13.3 whose devices
//! report `MULTICAST_SUPPORTED` (attribute 132).
//!
//! It implements [`Driver`] over any inner driver, so the whole typed API
//! (ids, specs, readiness, bindings, teardown) runs unchanged on it:
//!
//! | logical-endpoint call | classic emulation |
//! | --- | --- |
//! | `IdReserve` / `IdRelease` (R1) | this backend's own id table (C1: classic objects have no ids) |
//! | `GetLimits` (R10) | `bindAlignment` = `cuMulticastGetGranularity` (C2), for unicast the owner's VMM granularity (`cuMemGetAllocationGranularity`); `maxSize` unbounded |
//! | `Create` (R2) | records the properties. An exportable team (shared across processes) creates its object here: it must exist before it can be exported (C5). A unicast endpoint is bookkeeping only (below) |
//! | `AddDevice` (R4) | checks attribute 132 for the device (C6), records it; the **last** one runs `cuMulticastCreate` then `cuMulticastAddDevice` for every device. On a shared object, `cuMulticastAddDevice` at once |
//! | `Query` (R3) | ready once the team is complete: every device added here, or (shared across processes) the bring-up's agreement said so |
//! | `BindMem` / `BindAddr` (R5) | `cuMulticastBindMem` / `cuMulticastBindAddr`, only on a complete team (C3) |
//! | `Unbind` (R6) | `cuMulticastUnbind` of exactly the recorded binds (C4) |
//! | `Destroy` (R7) | unbinds what is still bound, then `cuMemRelease` of the object (C5) |
//! | `Export` / `Import` (R8, R9) | not as fabric-handle bytes: the team bring-up ([`crate::team::multicast`]) shares the object with `cuMemExportToShareableHandle` (a POSIX descriptor within a node, fabric bytes across nodes) and imports what it staged here (`cuMemImportFromShareableHandle`); a unicast ticket (below) imports as an endpoint that binds nothing; other bytes are `NOT_SUPPORTED` |
//! | `FabricCpyBatchAsync` (F) | `NOT_SUPPORTED` before the inner driver: the ids are this backend's; copies take the portable path |
//!
//! **Unicast endpoints** (for the portable path, [`crate::CopyPath::Portable`],
//! issue 19 item 4) have no classic form, so they are process-local
//! bookkeeping with no driver object and no `cuMulticast*` call, on any
//! device (attribute 132 is not asked): create checks the owner device and
//! the size (R2.2, R2.3) against its VMM granularity; the endpoint is ready at
//! once (R3.3); `AddDevice` is refused (R4.1); binds are checked (R5.2-R5.9;
//! by handle, the allocation's device is read, R5.5) and recorded, unbinds
//! must match them (R6), destroy forgets them (R7) — the typed API keeps
//! the memory alive as for any binding. An exportable one exports a
//! *ticket* (magic, size, owner, random bytes); another process's
//! [`Driver::import`] of it gives an imported unicast endpoint, ready at
//! once, that accepts no memory (R5.7). The bytes themselves move only by
//! `cuMemcpyAsync` through windows: this process's binds of mapped memory,
//! and the owner's memory imported by POSIX descriptor and registered with
//! [`crate::Endpoint::add_peer_window`]. Counted operations stay
//! `NOT_SUPPORTED`.
//!
//! Two hazards of the classic API are made impossible here rather than
//! documented: in one process, `cuMulticastCreate` is issued only when every
//! team device has been enrolled and said yes to attribute 132, so a bind
//! (which blocks until the team is complete, C3) can never be issued early
//! (across processes the object exists first, and no bind passes before the
//! bring-up's agreement step said every rank added its devices); and an
//! unbind only
//! ever passes the device, offset and size of recorded binds, so the undefined
//! behaviour of a mismatched `cuMulticastUnbind` (C4) is unreachable.
//!
//! A panic inside an inner call (a `tracing` layer on the success event,
//! a user backend) is taken as coming after the driver acted, as the typed
//! API takes it: every transition records its intent under the lock first
//! and a guard commits or rolls it back, the `busy` mark included; an
//! object whose release call was made is forgotten before the call; an
//! unwound destroy still unbinds what is left (the typed API then frees
//! that memory), and what an unwound destroy or build leaves (an object) is
//! released when the backend drops.
//!
//! Everything else (base and VMM calls) passes through to the inner driver
//! ([`Forward`]: only the calls above are written out here).
//! Attributes 153–156 are answered for the emulation: multicast is attribute
//! 132, unicast is 1 (bookkeeping), counted operations and owner access are 0.
//!
//! Codes where the classic API has no counterpart are this backend's choice:
//! `NOT_SUPPORTED` for what it cannot emulate (fabric-handle export of a
//! multicast team, counted operations, the fabric copy, a device without
//! attribute 132), `INVALID_VALUE` for
//! calls that break R1–R7, `INVALID_DEVICE` for a bind on a device outside
//! the team.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::unwind::OnUnwind;

use super::{
    AllocationRequest, Call, Code, Device, Driver, DriverResult, EndpointProps, FabricHandleBytes,
    Forward, Granularity, Limits, Location, ObjectExport, ObjectSharing, Shape, ShareableHandle,
    ShareableKind, attr, handle_bits,
};

/// `r` is what an emulated call returns: if it failed, `inner` did, and the
/// code says so (`Code::raised_by`): errors name the `cuMulticast*` (or VMM)
/// call that failed, not the logical-endpoint call it emulates.
fn noted<T>(inner: Call, r: DriverResult<T>) -> DriverResult<T> {
    r.map_err(|code| code.raised_by(inner))
}

/// The most ids the fallback hands out at once (the reference model's
/// default limit too).
const MAX_IDS: u64 = 1 << 16;

/// A logical endpoint emulated on a classic multicast object.
#[derive(Debug)]
struct Emulated {
    /// `multicast.numDevices` (R2.2).
    num_devices: u32,
    /// `prop.size`, bytes per device (R2.3).
    size: u64,
    /// Devices enrolled so far, in order (R4).
    devices: Vec<Device>,
    /// The classic object: once the team is complete (C1), or from create
    /// on (exportable) or import on (shared across processes).
    mc: Option<u64>,
    /// Shared across processes (exportable or imported): the object exists
    /// before the team is complete, and only the bring-up knows when it is.
    shared: bool,
    /// The shareable handle types the object was created with (C5); 0 for
    /// an imported one (it is not exported again).
    handle_types: u64,
    /// Every team device was added (C3): binds may go to the driver.
    complete: bool,
    /// A half-built object whose release failed: released at destroy.
    stale: Option<u64>,
    /// Live binds, exactly as issued (C4), and those being issued now.
    bindings: Vec<Bind>,
    /// The last enrollment, an enrollment on a shared object, or the
    /// destroy is talking to the inner driver: a concurrent enrollment,
    /// bind or destroy of the same endpoint is refused.
    busy: bool,
    /// A unicast endpoint: bookkeeping only, no classic object (`mc` is
    /// always `None`); `None` for a multicast one.
    unicast: Option<Uni>,
}

/// A classic unicast endpoint, for the portable path
/// ([`crate::CopyPath::Portable`]): process-local bookkeeping with no
/// driver object. Its binds are recorded (R5.2-R5.9 checked) and reach no
/// driver; copies reach the owner's memory through windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Uni {
    /// Created here; `ticket` is what [`Driver::export`] gives for an
    /// exportable one (R8.1), `None` otherwise.
    Owned { ticket: Option<[u8; 64]> },
    /// Imported from another process's ticket: ready at once, binds nothing
    /// (R5.7).
    Imported,
}

/// The first bytes of a classic unicast ticket. A ticket is
/// `MAGIC | size (u64 LE) | owner (i32 LE) | 0u32 | 32 random bytes`: it
/// names no driver object, so bytes from a peer can only make an imported
/// endpoint of that size, which binds nothing (R5.7) and reaches only the
/// windows its importer registers.
const TICKET_MAGIC: [u8; 16] = *b"cuda-ep:classicU";

impl Uni {
    /// A fresh ticket for a unicast endpoint of `size` bytes owned by `owner`.
    fn ticket(size: u64, owner: Device) -> DriverResult<[u8; 64]> {
        let mut t = [0u8; 64];
        getrandom::fill(&mut t[32..]).map_err(|_| Code::OPERATING_SYSTEM)?;
        t[..16].copy_from_slice(&TICKET_MAGIC);
        t[16..24].copy_from_slice(&size.to_le_bytes());
        t[24..28].copy_from_slice(&owner.0.to_le_bytes());
        Ok(t)
    }

    /// The size a ticket claims: `NOT_SUPPORTED` for bytes that are no
    /// classic handle at all (as for any unknown bytes on this backend),
    /// `INVALID_VALUE` for a malformed ticket (R9.4).
    fn parse(t: &[u8; 64]) -> DriverResult<u64> {
        let field = |r: std::ops::Range<usize>| t.get(r).ok_or(Code::INVALID_VALUE);
        if field(0..16)? != TICKET_MAGIC {
            return Err(Code::NOT_SUPPORTED);
        }
        if field(28..32)? != [0u8; 4] {
            return Err(Code::INVALID_VALUE);
        }
        let size = u64::from_le_bytes(field(16..24)?.try_into().map_err(|_| Code::INVALID_VALUE)?);
        if size == 0 {
            return Err(Code::INVALID_VALUE);
        }
        Ok(size)
    }
}

impl Emulated {
    /// A shared endpoint whose object was lost to a panic inside its create
    /// or import: it binds nothing and is only ever destroyed.
    fn without_object(num_devices: u32, size: u64) -> Emulated {
        Emulated {
            num_devices,
            size,
            devices: Vec::new(),
            mc: None,
            shared: true,
            handle_types: 0,
            complete: false,
            stale: None,
            bindings: Vec::new(),
            busy: false,
            unicast: None,
        }
    }

    /// A unicast endpoint (bookkeeping only): ready at once (R3.3).
    fn unicast(owner: Option<Device>, size: u64, uni: Uni) -> Emulated {
        Emulated {
            num_devices: 1,
            size,
            devices: owner.into_iter().collect(),
            mc: None,
            shared: false,
            handle_types: 0,
            complete: true,
            stale: None,
            bindings: Vec::new(),
            busy: false,
            unicast: Some(uni),
        }
    }
}

/// Clears an endpoint's `busy` mark on drop, so that a call that returned
/// or unwound leaves it usable.
struct Idle<'a> {
    classic: &'a Classic,
    id: u32,
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        if let Some(Some(ep)) = self.classic.lock().ids.get_mut(&self.id) {
            ep.busy = false;
        }
    }
}

/// A shareable handle received from the exporter, staged for
/// `cuLogicalEndpointImport` with the team's agreed properties.
#[derive(Debug)]
struct Staged {
    what: ObjectExport,
    num_devices: u32,
    size: u64,
}

/// One `cuMulticastBind*` as issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bind {
    dev: Device,
    offset: u64,
    size: u64,
}

/// The emulated id space.
#[derive(Debug)]
struct Table {
    /// The next id handed out; ids are never reused.
    next_id: u32,
    /// Reserved ids and the endpoint each holds, if any.
    ids: BTreeMap<u32, Option<Emulated>>,
}

/// The classic multicast fallback: a [`Driver`] that emulates multicast
/// logical endpoints on the `cuMulticast*` calls of `inner` (SPEC C1–C6).
///
/// ```
/// # #[cfg(feature = "model")] {
/// use std::sync::Arc;
/// use cuda_endpoints::driver::Classic;
/// use cuda_endpoints::model::{Model, ModelConfig};
/// use cuda_endpoints::{Context, Device, Spec};
///
/// let model = Model::new(ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true));
/// let ctx = Context::new(Classic::new(Arc::new(model.clone())));
/// let team = ctx.reserve_one()?
///     .create(Spec::multicast(&[Device(0), Device(1)], 2 << 20))?   // cuMulticastCreate here
///     .wait(std::time::Duration::from_secs(1))?;
/// team.destroy()?.release()?;                                        // cuMemRelease of the object
/// assert!(model.live().is_empty() && model.violations().is_empty());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Classic {
    inner: Arc<dyn Driver>,
    granularity: Granularity,
    table: Mutex<Table>,
    /// Imports staged by the bring-up, by a random ticket that this process
    /// made: handle bytes from a peer can never name one.
    staged: Mutex<HashMap<[u8; 64], Staged>>,
    /// Objects (with any bind whose unbind failed) whose destroy or build
    /// unwound: released when the backend drops, not while unwinding.
    orphans: Mutex<Vec<(u64, Vec<Bind>)>>,
}

impl fmt::Debug for Classic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.lock();
        f.debug_struct("Classic")
            .field("inner", &self.inner)
            .field("granularity", &self.granularity)
            .field("ids", &t.ids.len())
            .finish()
    }
}

impl Classic {
    /// The fallback over `inner`, with the bind alignment taken from the
    /// *minimum* multicast granularity (C2).
    pub fn new(inner: Arc<dyn Driver>) -> Classic {
        Classic {
            inner,
            granularity: Granularity::Minimum,
            table: Mutex::new(Table {
                next_id: 1,
                ids: BTreeMap::new(),
            }),
            staged: Mutex::new(HashMap::new()),
            orphans: Mutex::new(Vec::new()),
        }
    }

    /// Which multicast granularity becomes `bindAlignment` (C2):
    /// [`Granularity::Minimum`] (the default: the smallest valid sizes and
    /// offsets) or [`Granularity::Recommended`] (what NCCL rounds to; can be
    /// hundreds of MiB).
    pub fn with_granularity(mut self, kind: Granularity) -> Classic {
        self.granularity = kind;
        self
    }

    /// How many classic multicast objects this backend holds now (C1, C5):
    /// one per endpoint whose team is complete and not yet destroyed.
    pub fn live_multicast_objects(&self) -> usize {
        self.lock()
            .ids
            .values()
            .flatten()
            .filter(|e| e.mc.is_some())
            .count()
    }

    /// The emulated endpoint on `id`, under the lock.
    fn with_ep<T>(
        &self,
        id: u32,
        f: impl FnOnce(&mut Emulated) -> DriverResult<T>,
    ) -> DriverResult<T> {
        match self.lock().ids.get_mut(&id) {
            Some(Some(ep)) => f(ep),
            _ => Err(Code::INVALID_VALUE),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The lock is never held across an inner call (a tracing layer or
        // backend may call back into this one), the team bring-up's export
        // and import included: each records its intent, lets go, calls, and
        // commits or rolls back in one step. The table is only changed in
        // one step; a panic elsewhere cannot leave it half-written.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `mc` (and the binds on it) for release when the backend drops.
    fn orphan(&self, mc: u64, binds: Vec<Bind>) {
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((mc, binds));
    }

    /// C6: whether `dev` reports `MULTICAST_SUPPORTED` = 1. A device the
    /// driver does not know keeps the driver's code (`INVALID_DEVICE`).
    fn multicast_supported(&self, dev: Device) -> DriverResult<bool> {
        // SAFETY: an attribute query touches nothing anyone owns.
        let v = unsafe { self.inner.device_attribute(dev, attr::MULTICAST_SUPPORTED) }?;
        Ok(v != 0)
    }

    /// How many devices of the machine report attribute 132 = 1.
    fn capable_devices(&self) -> DriverResult<u32> {
        // SAFETY: a device count touches nothing anyone owns.
        let count = noted(Call::DeviceGetCount, unsafe { self.inner.device_count() })?;
        Ok((0..count)
            .filter(|&d| self.multicast_supported(Device(d)).unwrap_or(false))
            .count() as u32)
    }

    /// The multicast team size of `prop`, or why it cannot be emulated. An
    /// exportable (`ipc_fabric`) team is shared with the classic shareable
    /// handles, through the team bring-up.
    fn team_size(props: &EndpointProps) -> DriverResult<u32> {
        let n = match props.shape {
            // Unicast endpoints are bookkeeping (`unicast_limits`), never a
            // classic object.
            Shape::Unicast { .. } => return Err(Code::INVALID_VALUE),
            Shape::Multicast { num_devices } => num_devices,
        };
        if props.counted_ops {
            // Counted operations have no classic form.
            return Err(Code::NOT_SUPPORTED);
        }
        if n == 0 {
            return Err(Code::INVALID_VALUE);
        }
        Ok(n)
    }

    /// The limits of a unicast endpoint owned by `owner` (R10): the bind
    /// alignment is the owner's VMM granularity (`cuMemGetAllocationGranularity`,
    /// of the kind this backend uses for multicast, C2), so that every
    /// allocation sized in granularities binds; no `maxSize`. No
    /// `cuMulticast*` call: a unicast endpoint is bookkeeping only.
    fn unicast_limits(&self, owner: Device, props: &EndpointProps) -> DriverResult<Limits> {
        if props.counted_ops {
            // Counted operations need a driver object.
            return Err(Code::NOT_SUPPORTED);
        }
        // R2.2: the owner is a device of this machine.
        // SAFETY: a device count touches nothing anyone owns.
        let count = noted(Call::DeviceGetCount, unsafe { self.inner.device_count() })?;
        if !(0..count).contains(&owner.0) {
            return Err(Code::INVALID_DEVICE);
        }
        let req = AllocationRequest {
            location: Location::Device(owner),
            handle_types: 0,
        };
        // SAFETY: a granularity query touches nothing anyone owns.
        let align = noted(Call::MemGetAllocationGranularity, unsafe {
            self.inner.mem_granularity(req, self.granularity)
        })?
        .max(1);
        Ok(Limits {
            bind_alignment: align,
            max_size: u64::MAX / align * align,
        })
    }

    /// Creates the unicast endpoint `id` owned by `owner` (R2): the table
    /// records it, ready at once (R3.3); no driver object is made.
    fn create_unicast(&self, id: u32, owner: Device, props: &EndpointProps) -> DriverResult<()> {
        if !matches!(self.lock().ids.get(&id), Some(None)) {
            return Err(Code::INVALID_VALUE); // R2.1
        }
        let limits = self.unicast_limits(owner, props)?;
        // R2.3: a non-zero multiple of the bind alignment.
        if props.size == 0 || !props.size.is_multiple_of(limits.bind_alignment) {
            return Err(Code::INVALID_VALUE);
        }
        // R2.4 / R8.1: only an exportable one has a ticket to export.
        let ticket = match props.ipc_fabric {
            true => Some(Uni::ticket(props.size, owner)?),
            false => None,
        };
        let mut t = self.lock();
        match t.ids.get_mut(&id) {
            Some(slot @ None) => {
                *slot = Some(Emulated::unicast(
                    Some(owner),
                    props.size,
                    Uni::Owned { ticket },
                ));
                Ok(())
            }
            // Taken meanwhile by a racing raw caller (R2.1).
            _ => Err(Code::INVALID_VALUE),
        }
    }

    /// Imports the unicast endpoint of another process's ticket on `id`:
    /// ready at once, accepting no memory (R5.7). The peer's memory is
    /// reached through the window its importer registers
    /// ([`crate::Endpoint::add_peer_window`]).
    fn import_unicast(&self, id: u32, handle: &FabricHandleBytes) -> DriverResult<()> {
        let size = Uni::parse(&handle.0)?;
        let mut t = self.lock();
        match t.ids.get_mut(&id) {
            Some(slot @ None) => {
                *slot = Some(Emulated::unicast(None, size, Uni::Imported));
                Ok(())
            }
            _ => Err(Code::INVALID_VALUE), // R2.1
        }
    }

    /// `cuMulticastCreate` of an object shareable as a POSIX descriptor and,
    /// where the driver allows it, as fabric bytes (refused without the
    /// fabric daemon: then POSIX descriptors only).
    fn create_shareable(&self, num_devices: u32, size: u64) -> DriverResult<(u64, u64)> {
        let both = u64::from(handle_bits::POSIX_FD | handle_bits::FABRIC);
        // SAFETY: attribute 132 was checked for enough devices of this node
        // (`get_limits`, which the typed API calls before `create`), and is
        // checked for every device as it is added (C6).
        match unsafe { self.inner.multicast_create(num_devices, size, both) } {
            Ok(mc) => Ok((mc, both)),
            Err(code) if code == Code::NOT_PERMITTED || code == Code::NOT_SUPPORTED => {
                let fd = u64::from(handle_bits::POSIX_FD);
                // SAFETY: as above.
                let mc = unsafe { self.inner.multicast_create(num_devices, size, fd) }?;
                Ok((mc, fd))
            }
            Err(code) => Err(code),
        }
    }

    /// Checks a bind and records it before it is issued (so that concurrent
    /// binds see it, R5.9): the object and the bind.
    fn intend_bind(
        &self,
        id: u32,
        dev: Device,
        offset: u64,
        size: u64,
        flags: u64,
    ) -> DriverResult<(Option<u64>, Bind)> {
        let mut t = self.lock();
        let (mc, ep) = bindable(&mut t, id, dev, offset, size, flags)?;
        let bind = Bind { dev, offset, size };
        ep.bindings.push(bind);
        Ok((mc, bind))
    }

    /// Forgets a recorded bind that the driver refused.
    fn settle_bind(&self, id: u32, bind: Bind, r: DriverResult<()>) -> DriverResult<()> {
        if r.is_err() {
            let _ = self.with_ep(id, |ep| {
                if let Some(i) = ep.bindings.iter().position(|b| *b == bind) {
                    ep.bindings.swap_remove(i);
                }
                Ok(())
            });
        }
        r
    }

    /// Unbinds `binds` of `mc` one by one, exactly as issued (C4). On a
    /// failure, returns the code and the binds still bound. A panic inside
    /// an unbind is taken as coming after the driver unbound (see
    /// `OnUnwind`): the binds not yet unbound go back into the table of
    /// endpoint `id`, the one whose call panicked does not.
    fn unbind_all(&self, id: u32, mc: u64, binds: Vec<Bind>) -> Result<(), (Code, Vec<Bind>)> {
        let made = Cell::new(0usize);
        let back = OnUnwind::new(|| {
            let rest = binds.get(made.get()..).unwrap_or_default();
            let _ = self.with_ep(id, |ep| {
                ep.bindings.extend_from_slice(rest);
                Ok(())
            });
        });
        for (i, b) in binds.iter().enumerate() {
            made.set(i + 1);
            // SAFETY: `b` is a bind this backend issued on its own object `mc`
            // exactly so (C4).
            let r = unsafe { self.inner.multicast_unbind(mc, b.dev, b.offset, b.size) };
            if let Err(code) = noted(Call::MulticastUnbind, r) {
                back.disarm();
                return Err((code, binds.get(i..).unwrap_or_default().to_vec()));
            }
        }
        back.disarm();
        Ok(())
    }

    /// Releases the classic object `mc` (C5), forgotten first by `forget`
    /// (under the lock): a panic inside the release is taken as coming
    /// after the driver released (see `OnUnwind`), so nothing releases it
    /// again. A failed release gives it back with `restore`.
    fn release_object(
        &self,
        id: u32,
        mc: u64,
        forget: impl FnOnce(&mut Emulated),
        restore: impl FnOnce(&mut Emulated),
    ) -> DriverResult<()> {
        let _ = self.with_ep(id, |ep| {
            forget(ep);
            Ok(())
        });
        // SAFETY: `mc` is this backend's own object, unbound (C5).
        let r = noted(Call::MemRelease, unsafe { self.inner.mem_release(mc) });
        if r.is_err() {
            let _ = self.with_ep(id, |ep| {
                restore(ep);
                Ok(())
            });
        }
        r
    }
}

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

impl Drop for Classic {
    /// Best effort for endpoints nobody destroyed (e.g. leaked with
    /// `mem::forget`): unbind, then release the object (C5).
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let table = std::mem::take(
                &mut self
                    .table
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner)
                    .ids,
            );
            let orphans = std::mem::take(
                self.orphans
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            // Ids 0: the table is gone, so no `unbind_all` gives binds back.
            let left = orphans.into_iter().map(|(mc, b)| (0, Some(mc), b, None));
            let live = table.into_iter().filter_map(|(id, ep)| {
                let ep = ep?;
                Some((id, ep.mc, ep.bindings, ep.stale))
            });
            for (id, mc, bindings, stale) in live.chain(left) {
                for (mc, bindings) in [(mc, bindings), (stale, Vec::new())] {
                    let Some(mc) = mc else {
                        continue;
                    };
                    tracing::warn!(
                        id,
                        "classic backend dropped with a live multicast object; releasing it"
                    );
                    // The table is gone: `unbind_all` finds no endpoint to
                    // give binds back to, on any path.
                    if let Err((code, left)) = self.unbind_all(id, mc, bindings) {
                        tracing::error!(id, %code, still_bound = left.len(), "cuMulticastUnbind failed at drop");
                        continue; // still bound: kept rather than released
                    }
                    // SAFETY: `mc` is this backend's own object, unbound above.
                    if let Err(code) = unsafe { self.inner.mem_release(mc) } {
                        tracing::error!(id, %code, "cuMemRelease of a multicast object failed at drop");
                    }
                }
            }
        });
    }
}

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
                // SAFETY: the team of `mc` is complete (`bindable`, C3); the
                // caller keeps `mem` alive while bound (R7.2, this method's
                // contract).
                Some(mc) => unsafe {
                    self.inner
                        .multicast_bind_mem(mc, offset, mem, mem_offset, size)
                },
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
        // SAFETY: the team of `mc` is complete (`bindable`, C3); the caller
        // keeps the mapping alive while bound (R7.2, this method's contract).
        let r = noted(Call::MulticastBindAddr, unsafe {
            self.inner.multicast_bind_addr(mc, offset, ptr, size)
        });
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
            if covered.is_empty() || at != end {
                // C4: a mismatched classic unbind is undefined behaviour; it
                // never reaches the driver.
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
        // unbound now, a panic of theirs caught; what is left (the object,
        // unless its release was called; a bind whose unbind failed) is
        // released when the backend drops.
        let unwound = OnUnwind::new(|| {
            let left = self.with_ep(id, |ep| Ok((ep.mc, std::mem::take(&mut ep.bindings))));
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
                if let Some(mc) = ep.mc {
                    self.orphan(mc, ep.bindings);
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
        _ops: Vec<super::CopyOp>,
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

/// The checks every emulated bind makes before the driver: flags 0 (R5.8), a
/// complete team (R3.1, C3), an enrolled device (R5.2), a range inside the
/// endpoint (R5.4) that overlaps no live bind on that device (R5.9). Returns
/// the classic object (`None` for a unicast endpoint, which has none) and
/// the endpoint.
fn bindable(
    t: &mut Table,
    id: u32,
    dev: Device,
    offset: u64,
    size: u64,
    flags: u64,
) -> DriverResult<(Option<u64>, &mut Emulated)> {
    if flags != 0 {
        return Err(Code::INVALID_VALUE);
    }
    let Some(Some(ep)) = t.ids.get_mut(&id) else {
        return Err(Code::INVALID_VALUE);
    };
    let mc = match (ep.unicast, ep.mc, ep.complete, ep.busy) {
        // A destroy in progress: nothing to bind to.
        (.., true) => return Err(Code::INVALID_VALUE),
        // R5.7: an imported unicast endpoint accepts no memory.
        (Some(Uni::Imported), ..) => return Err(Code::INVALID_VALUE),
        (Some(Uni::Owned { .. }), ..) => None,
        (None, Some(mc), true, false) => Some(mc),
        // The classic bind would block until the team is complete (C3).
        (None, ..) => return Err(Code::INVALID_VALUE),
    };
    if !ep.devices.contains(&dev) {
        return Err(Code::INVALID_DEVICE);
    }
    let end = offset.checked_add(size).ok_or(Code::INVALID_VALUE)?;
    if size == 0 || end > ep.size {
        return Err(Code::INVALID_VALUE);
    }
    if ep
        .bindings
        .iter()
        .any(|b| b.dev == dev && b.offset < end && offset < b.offset + b.size)
    {
        return Err(Code::INVALID_VALUE);
    }
    Ok((mc, ep))
}

#[cfg(all(test, feature = "model"))]
mod tests {
    // Not `super::*`: with `Forward` in scope too, calls on `Classic` would be
    // ambiguous between the two traits.
    use super::{Classic, Code, Device, Driver, EndpointProps, Location, Shape};
    use crate::driver::AllocationRequest;
    use crate::model::{Model, ModelConfig};
    use std::sync::Arc;

    fn prop(n: u32, size: u64) -> EndpointProps {
        EndpointProps::new(Shape::Multicast { num_devices: n }, size)
    }

    #[test]
    fn create_happens_only_with_the_last_device() {
        // SAFETY: the test owns every id, handle and binding it names.
        unsafe {
            let model = Model::new(ModelConfig::node(3));
            let c = Classic::new(Arc::new(model.clone()));
            let id = c.id_reserve(1).unwrap();
            c.create(id, prop(3, 2 << 20)).unwrap();
            c.add_device(id, Device(0)).unwrap();
            c.add_device(id, Device(1)).unwrap();
            assert!(!c.query(id, 1).unwrap());
            assert_eq!(model.calls(crate::Call::MulticastCreate), 0);
            c.add_device(id, Device(2)).unwrap();
            assert_eq!(model.calls(crate::Call::MulticastCreate), 1);
            assert_eq!(model.calls(crate::Call::MulticastAddDevice), 3);
            assert!(c.query(id, 1).unwrap());
            assert_eq!(c.live_multicast_objects(), 1);
            c.destroy(id).unwrap();
            c.id_release(id, 1).unwrap();
            assert!(model.live().is_empty());
            assert!(model.violations().is_empty());
        }
    }

    #[test]
    fn a_device_without_attribute_132_is_refused_before_create() {
        // SAFETY: the test owns every id, handle and binding it names.
        unsafe {
            let cfg = ModelConfig::node(2).with_devices(|i, d| d.classic_multicast = i == 0);
            let model = Model::new(cfg);
            let c = Classic::new(Arc::new(model.clone()));
            let id = c.id_reserve(1).unwrap();
            c.create(id, prop(2, 2 << 20)).unwrap();
            c.add_device(id, Device(0)).unwrap();
            assert_eq!(c.add_device(id, Device(1)), Err(Code::NOT_SUPPORTED));
            assert_eq!(model.calls(crate::Call::MulticastCreate), 0);
            assert!(model.violations().is_empty());
        }
    }

    #[test]
    fn mismatched_unbind_never_reaches_the_driver() {
        // SAFETY: the test owns every id, handle and binding it names.
        unsafe {
            let model = Model::new(ModelConfig::node(1));
            let c = Classic::new(Arc::new(model.clone()));
            let id = c.id_reserve(1).unwrap();
            c.create(id, prop(1, 4 << 20)).unwrap();
            c.add_device(id, Device(0)).unwrap();
            let req = AllocationRequest {
                location: Location::Device(Device(0)),
                handle_types: 0,
            };
            let mem = c.mem_create(4 << 20, req).unwrap();
            c.bind_mem(id, Device(0), 0, mem, 0, 2 << 20, 0).unwrap();
            c.bind_mem(id, Device(0), 2 << 20, mem, 2 << 20, 2 << 20, 0)
                .unwrap();
            assert_eq!(
                c.unbind(id, Device(0), 0, 1 << 20),
                Err(Code::INVALID_VALUE)
            );
            assert_eq!(
                c.unbind(id, Device(0), 1 << 20, 2 << 20),
                Err(Code::INVALID_VALUE)
            );
            assert_eq!(model.calls(crate::Call::MulticastUnbind), 0);
            // Two consecutive binds unbound as one range (R6.2): two exact unbinds.
            c.unbind(id, Device(0), 0, 4 << 20).unwrap();
            assert_eq!(model.calls(crate::Call::MulticastUnbind), 2);
            c.destroy(id).unwrap();
            c.mem_release(mem).unwrap();
            c.id_release(id, 1).unwrap();
            assert!(model.live().is_empty());
            assert!(model.violations().is_empty());
        }
    }

    #[test]
    fn unicast_is_bookkeeping_with_no_driver_call() {
        // SAFETY: the test owns every id, handle and binding it names.
        unsafe {
            let mut cfg = ModelConfig::node(1);
            cfg.driver_version = 13000;
            let model = Model::new(cfg);
            let c = Classic::new(Arc::new(model.clone()));
            let id = c.id_reserve(2).unwrap();
            let mut p = EndpointProps::new(Shape::Unicast { owner: Device(0) }, 4 << 20);
            assert_eq!(c.get_limits(p).unwrap().bind_alignment, 2 << 20);
            p.counted_ops = true;
            assert_eq!(c.create(id, p), Err(Code::NOT_SUPPORTED));
            p.counted_ops = false;
            let bad = EndpointProps::new(Shape::Unicast { owner: Device(3) }, 4 << 20);
            assert_eq!(c.create(id, bad), Err(Code::INVALID_DEVICE)); // R2.2
            let odd = EndpointProps::new(Shape::Unicast { owner: Device(0) }, 3 << 20);
            assert_eq!(c.create(id, odd), Err(Code::INVALID_VALUE)); // R2.3
            p.ipc_fabric = true;
            c.create(id, p).unwrap();
            assert!(c.query(id, 1).unwrap()); // ready at once
            assert_eq!(c.add_device(id, Device(0)), Err(Code::INVALID_VALUE)); // R4.1
            let req = AllocationRequest {
                location: Location::Device(Device(0)),
                handle_types: 0,
            };
            let mem = c.mem_create(4 << 20, req).unwrap();
            c.bind_mem(id, Device(0), 0, mem, 0, 2 << 20, 0).unwrap();
            assert_eq!(
                c.bind_mem(id, Device(0), 0, mem, 2 << 20, 2 << 20, 0),
                Err(Code::INVALID_VALUE) // R5.9
            );
            c.bind_mem(id, Device(0), 2 << 20, mem, 2 << 20, 2 << 20, 0)
                .unwrap();
            assert_eq!(
                c.unbind(id, Device(0), 0, 1 << 20),
                Err(Code::INVALID_VALUE)
            );
            c.unbind(id, Device(0), 0, 2 << 20).unwrap();
            // Its ticket, every time the same, imports as an endpoint that
            // binds nothing (R5.7).
            let ticket = c.export(id).unwrap();
            assert_eq!(c.export(id).unwrap(), ticket);
            c.import(id + 1, ticket).unwrap();
            assert!(c.query(id + 1, 1).unwrap());
            assert_eq!(
                c.bind_mem(id + 1, Device(0), 0, mem, 0, 2 << 20, 0),
                Err(Code::INVALID_VALUE)
            );
            assert_eq!(c.export(id + 1), Err(Code::INVALID_VALUE));
            // Not a ticket: refused (R9.4).
            let mut forged = ticket;
            forged.0[30] = 1;
            c.destroy(id + 1).unwrap();
            assert_eq!(c.import(id + 1, forged), Err(Code::INVALID_VALUE));
            assert_eq!(
                c.import(id + 1, super::FabricHandleBytes([7; 64])),
                Err(Code::NOT_SUPPORTED)
            );
            c.destroy(id).unwrap(); // forgets the bind left
            c.mem_release(mem).unwrap();
            c.id_release(id, 2).unwrap();
            for call in [
                crate::Call::MulticastGetGranularity,
                crate::Call::MulticastCreate,
                crate::Call::MulticastBindMem,
                crate::Call::MulticastUnbind,
            ] {
                assert_eq!(model.calls(call), 0, "{call}");
            }
            assert!(model.live().is_empty());
            assert!(model.violations().is_empty());
        }
    }
}

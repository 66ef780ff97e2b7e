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
//!
//! This file owns the emulated id table and the steps the calls share;
//! `emulate.rs` the logical-endpoint calls ([`Forward`]), `share.rs` the
//! sharing across processes ([`ObjectSharing`]).

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

mod emulate;
mod share;
#[cfg(all(test, feature = "model"))]
mod tests;

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
    /// Whether the driver is known to have made it: not when its call
    /// unwound (a layer may panic on the call's denial or failure, before
    /// the driver bound). Such a bind stays in the table, so no bind goes
    /// over it (R5.9), but is never unbound: an unbind of a range the
    /// driver did not bind is undefined behaviour (C4); the object's
    /// release drops it if it was made (C5).
    known: bool,
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
        let bind = Bind {
            dev,
            offset,
            size,
            known: true,
        };
        ep.bindings.push(bind);
        Ok((mc, bind))
    }

    /// A recorded bind whose driver call unwound: not known made
    /// ([`Bind::known`]). Out of line: only unwinding comes here.
    #[cold]
    #[inline(never)]
    fn bind_unwound(&self, id: u32, bind: Bind) {
        let _ = self.with_ep(id, |ep| {
            if let Some(b) = ep.bindings.iter_mut().find(|b| **b == bind) {
                b.known = false;
            }
            Ok(())
        });
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

    /// Unbinds `binds` of `mc` one by one, exactly as issued (C4), skipping
    /// those not known made ([`Bind::known`]). On a failure, returns the
    /// code and the binds still on the object (those skipped included). A
    /// panic inside an unbind is taken as coming after the driver unbound
    /// (see `OnUnwind`): the binds still on the object go back into the
    /// table of endpoint `id`, the one whose call panicked does not, unless
    /// the inner driver says it refused that unbind (`unwound_answer`).
    fn unbind_all(&self, id: u32, mc: u64, binds: Vec<Bind>) -> Result<(), (Code, Vec<Bind>)> {
        let made = Cell::new(0usize);
        // What is still on the object when this stops at `from`: the binds
        // not reached yet and the ones skipped as not known made.
        let left = |from: usize| -> Vec<Bind> {
            let (done, rest) = binds.split_at(from.min(binds.len()));
            done.iter()
                .filter(|b| !b.known)
                .chain(rest)
                .copied()
                .collect()
        };
        let back = OnUnwind::new(|| {
            let refused = self.inner.unwound_answer(Call::MulticastUnbind).is_some();
            let rest = left(made.get().saturating_sub(usize::from(refused)));
            let _ = self.with_ep(id, |ep| {
                ep.bindings.extend(rest);
                Ok(())
            });
        });
        for (i, b) in binds.iter().enumerate() {
            made.set(i + 1);
            if !b.known {
                // Never unbound (C4): the object's release drops it (C5).
                continue;
            }
            // SAFETY: `b` is a bind this backend issued on its own object `mc`
            // exactly so (C4), and the driver made it (`known`).
            let r = unsafe { self.inner.multicast_unbind(mc, b.dev, b.offset, b.size) };
            if let Err(code) = noted(Call::MulticastUnbind, r) {
                back.disarm();
                return Err((code, left(i)));
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

//! Bind targets: VMM allocations (`cuMemCreate`) and their mapped form
//! (address reserve + map + access), typed by their shareable handle type so
//! that R5.6 is checked by the compiler.
//!
//! An allocation's handle is released only when the last owner lets go: the
//! user's [`Allocation`] / [`Mapped`], and every binding that uses it (an
//! endpoint keeps a reference until the binding is unbound or the endpoint
//! destroyed, so a forgotten `Binding` never leaves freed memory bound, R7.2).
//!
//! What others hold of memory is a [`KeepAlive`]: typed (an allocation or a
//! mapping), so what it keeps is read, never downcast, and each allocation
//! carries an identity of its own ([`AllocId`]) that F3's checks compare
//! (two binds of one allocation), never a reference count.
//!
//! **The files.** This one: [`Allocation`] (made, imported, exported,
//! mapped; released by the last owner), what a bind call points at and
//! [`BindSource`]; `mapped.rs`: [`Mapped`] and where its memory is for F2;
//! `keep.rs`: [`KeepAlive`], [`AllocId`] and what peers are given of bound
//! memory.

use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::context::Context;
use crate::driver::{
    AllocationRequest, Call, Code, Device, FabricHandleBytes, Granularity, Location,
    ShareableHandle, ShareableKind, handle_bits,
};
use crate::error::{Error, Failed, Failure, Result};
use crate::kind::{FabricShareable, MemShare, PosixFd, Private};
use crate::state::Sealed;
use crate::unwind::OnUnwind;

mod keep;
mod mapped;
pub(crate) use keep::{AllocId, KeepAlive, NotForPeers, PeerHandle, export_for_peers};
pub use mapped::{CopyMemory, Mapped};
pub(crate) use mapped::{Locality, MappedInner};

/// The allocation itself, shared by its owner and the bindings that use it.
pub(crate) struct AllocInner {
    ctx: Context,
    /// Its identity (F3: one allocation bound twice).
    id: AllocId,
    handle: u64,
    size: u64,
    location: Location,
    /// `H::BITS` of the typed owner, kept for the bring-ups' agreement,
    /// which finds bound memory type-erased ([`export_for_peers`]).
    share: u32,
    /// Whether it was imported by fabric handle: then `location` names a
    /// device (or NUMA node) of the node that exported it, which may be
    /// another node, so its ordinal says nothing of this node's (F2).
    fabric_import: bool,
}

impl Drop for AllocInner {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            // SAFETY: the last owner of the allocation is gone: every `Binding`,
            // `Mapped` and endpoint slot that kept it alive dropped its `Arc`, so
            // nothing is bound to or mapped from it (R7.2).
            if let Err(code) = unsafe { self.ctx.driver().mem_release(self.handle) } {
                let e = self.ctx.error(Call::MemRelease, code);
                self.ctx.record_teardown(e);
            }
        });
    }
}

/// A pinned VMM allocation made with `cuMemCreate`, bindable by handle
/// (`cuLogicalEndpointBindMem`, R5).
///
/// `H` is its shareable handle type: [`Private`], [`PosixFd`] or [`FabricShareable`].
/// Dropping it releases the handle (`cuMemRelease`) once no binding uses it.
pub struct Allocation<H: MemShare = Private> {
    inner: Arc<AllocInner>,
    _share: PhantomData<fn() -> H>,
}

impl<H: MemShare> std::fmt::Debug for Allocation<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("share", &H::NAME)
            .field("handle", &self.inner.handle)
            .field("size", &self.inner.size)
            .field("location", &self.inner.location)
            .finish()
    }
}

impl<H: MemShare> Allocation<H> {
    /// Allocates at least `bytes` bytes of device memory on `dev`, rounded up
    /// to the minimum allocation granularity (`cuMemGetAllocationGranularity`).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for 0 bytes; [`Error::NoSuchDevice`];
    /// [`Error::FabricNotPermitted`] when fabric handles are refused (no
    /// fabric daemon); [`Error::Driver`] from `cuMemCreate` otherwise.
    pub fn on_device(ctx: &Context, dev: impl Into<Device>, bytes: u64) -> Result<Self> {
        let dev = dev.into();
        ctx.check_device(dev)?;
        Self::new(ctx, Location::Device(dev), bytes, Granularity::Minimum)
    }

    /// Allocates at least `bytes` bytes at `location`, rounded up to the
    /// `granularity` asked for (any granularity, power of two or not).
    ///
    /// # Errors
    /// As [`Allocation::on_device`].
    pub fn new(
        ctx: &Context,
        location: Location,
        bytes: u64,
        granularity: Granularity,
    ) -> Result<Self> {
        let req = AllocationRequest {
            location,
            handle_types: H::BITS,
        };
        let gran = ctx.check(
            Call::MemGetAllocationGranularity,
            ctx.queries().mem_granularity(req, granularity),
        )?;
        if bytes == 0 {
            return Err(Error::ZeroSize {
                what: crate::error::Arg::AllocationSize,
                suggested: gran,
                rule: None,
            });
        }
        let gran = gran.max(1);
        // Rounding up must not wrap (or saturate to a size that is not a
        // multiple of the granularity): refuse before the driver.
        let Some(size) = bytes.checked_next_multiple_of(gran) else {
            return Err(Error::AllocationTooLarge {
                requested: bytes,
                granularity: gran,
                largest: u64::MAX / gran * gran,
            });
        };
        // A new allocation, owned by the `Allocation` made below.
        let handle =
            ctx.queries()
                .mem_create(size, req)
                .map_err(|code| match (code, location) {
                    (code, Location::Device(device))
                        if code == crate::Code::NOT_PERMITTED
                            && H::BITS & handle_bits::FABRIC != 0 =>
                    {
                        Error::FabricNotPermitted {
                            device,
                            call: Call::MemCreate,
                        }
                    }
                    _ => ctx.error(Call::MemCreate, code),
                })?;
        Ok(Allocation {
            inner: Arc::new(AllocInner {
                ctx: ctx.clone(),
                id: AllocId::next(),
                handle,
                size,
                location,
                share: H::BITS,
                fabric_import: false,
            }),
            _share: PhantomData,
        })
    }

    /// Takes ownership of an allocation handle this library did not make
    /// (imported from another process with `cuMemImportFromShareableHandle`,
    /// or made by other code), as an `Allocation` that releases it on drop.
    /// Where it lives is read from the driver
    /// (`cuMemGetAllocationPropertiesFromHandle`, R5.5).
    ///
    /// Its memory is taken as this node's: a copy through an endpoint
    /// takes device memory as local to streams of the device the driver
    /// names (F2). Memory of another node is for
    /// [`Allocation::import_fabric`], whose memory copies never take as
    /// local (its ordinal may name a device of the exporting node).
    ///
    /// # Safety
    /// `handle` is a live allocation handle of this context's driver, owned
    /// by the caller and handed over (nothing else releases it); it holds at
    /// least `size` bytes; its shareable handle types include `H`'s (R5.6).
    ///
    /// # Errors
    /// [`Error::Driver`] from the properties query; the handle is then not
    /// taken (the caller still owns it).
    pub unsafe fn from_raw_handle(ctx: &Context, handle: u64, size: u64) -> Result<Self> {
        // SAFETY: a properties query changes nothing.
        let props = unsafe { ctx.driver().mem_properties(handle) };
        let props = ctx.check(Call::MemGetAllocationProperties, props)?;
        Ok(Allocation {
            inner: Arc::new(AllocInner {
                ctx: ctx.clone(),
                id: AllocId::next(),
                handle,
                size,
                location: props.location,
                share: H::BITS,
                fabric_import: false,
            }),
            _share: PhantomData,
        })
    }

    /// Size in bytes (a multiple of the granularity).
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Where the memory lives.
    pub fn location(&self) -> Location {
        self.inner.location
    }

    /// The raw `CUmemGenericAllocationHandle`, for users' own driver calls.
    /// It stays valid while `self` lives.
    pub fn handle(&self) -> u64 {
        self.inner.handle
    }

    /// Maps the whole allocation into a fresh virtual address range and gives
    /// its own device, and every device in `access`, read-write access, for
    /// `BindAddr` and kernels. Host memory has no own device: only the
    /// devices in `access` reach it, and a copy on a stream of another
    /// device is refused ([`Error::CopyNotAccessible`], F2).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for a device in `access` that does not exist
    /// (checked before the driver); [`Error::Driver`] from
    /// `cuMemAddressReserve`, `cuMemMap` or `cuMemSetAccess`. The allocation
    /// comes back unchanged and nothing leaks.
    ///
    /// `access` takes what `on_device` and `bind` take: `&[0, 1]`,
    /// `&[Device(0)]`, `&devices`; with no other device, name the type:
    /// `map::<Device>(&[])`.
    ///
    /// ```
    /// use cuda_endpoints::{Allocation, Context, Device, Private};
    /// let (ctx, _model) = Context::model(Default::default());
    /// let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0, 1])?;
    /// let own = Allocation::<Private>::on_device(&ctx, 1, 2 << 20)?.map::<Device>(&[])?;
    /// # drop((mem, own));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map<D: Into<Device> + Copy>(
        self,
        access: &[D],
    ) -> Result<Mapped<H>, Failed<Allocation<H>>> {
        self.map_aligned(access, 0)
    }

    /// As [`Allocation::map`], with the address range aligned to `alignment`
    /// bytes, rounded up to a power of two (`cuMemAddressReserve`'s
    /// alignment; 0: the driver's default).
    /// Pass an endpoint's [`bind_alignment`](crate::Endpoint::bind_alignment)
    /// when it exceeds the allocation granularity, so that the address is a
    /// valid `BindAddr` address for it (R5.3).
    ///
    /// # Errors
    /// As [`Allocation::map`].
    pub fn map_aligned<D: Into<Device> + Copy>(
        self,
        access: &[D],
        alignment: u64,
    ) -> Result<Mapped<H>, Failed<Allocation<H>>> {
        let access: Vec<Device> = access.iter().map(|&d| d.into()).collect();
        let alignment = match alignment {
            0 => 0,
            a => a.checked_next_power_of_two().unwrap_or(1 << 63),
        };
        let ctx = self.inner.ctx.clone();
        let d = ctx.driver();
        let size = self.inner.size;
        let fail = |call, code, value| Failure::new(ctx.error(call, code), value);
        // Before the driver: every device to give access to exists.
        for &dev in &access {
            if let Err(error) = ctx.check_device(dev) {
                return Err(Failure::new(error, self));
            }
        }
        // A new range, owned by the `Mapped` made below.
        let ptr = match ctx.queries().mem_address_reserve(size, alignment) {
            Ok(p) => p,
            Err(c) => return Err(fail(Call::MemAddressReserve, c, self)),
        };
        // A panic inside the map is taken as coming after the driver mapped
        // (see `OnUnwind`): the mapping is undone as a `Mapped`'s drop does
        // (unmap, free the range; `self` releases the handle after it). A
        // map the backend says it refused mapped nothing: the range is freed.
        let unwind = {
            let alloc = self.inner.clone();
            OnUnwind::new(move || {
                if d.unwound_answer(Call::MemMap).is_some() {
                    // SAFETY: the reservation made above; nothing mapped.
                    let _ = unsafe { d.mem_address_free(ptr, size) };
                    return;
                }
                drop(MappedInner {
                    alloc: Some(alloc),
                    ptr,
                    size,
                    access: Arc::from([]),
                })
            })
        };
        // SAFETY: `ptr` is the reservation just made, `self` owns the handle.
        let r = unsafe { d.mem_map(ptr, size, 0, self.inner.handle) };
        unwind.disarm();
        if let Err(c) = r {
            // SAFETY: the reservation just made; nothing is mapped in it.
            if let Err(c2) = unsafe { d.mem_address_free(ptr, size) } {
                // Not swallowed: the address range leaks, and says so.
                ctx.record_teardown(ctx.error(Call::MemAddressFree, c2));
            }
            return Err(fail(Call::MemMap, c, self));
        }
        let mut devices: Vec<Device> = access.to_vec();
        if let Location::Device(own) = self.inner.location
            && !devices.contains(&own)
        {
            devices.insert(0, own);
        }
        // Built now so that a failure below unmaps and frees through `Drop`.
        let mapped = Mapped {
            inner: Arc::new(MappedInner {
                alloc: Some(self.inner.clone()),
                ptr,
                size,
                access: Arc::from(devices.as_slice()),
            }),
            _share: PhantomData,
        };
        // SAFETY: the mapping just made, owned by `mapped`.
        if let Err(c) = unsafe { d.mem_set_access(ptr, size, devices) } {
            drop(mapped);
            return Err(fail(Call::MemSetAccess, c, self));
        }
        Ok(mapped)
    }
}

/// Sharing an allocation with another process (C5, R12.4): export gives a
/// descriptor or fabric bytes; import makes this process's own
/// `Allocation`, checked against the driver.
impl<H: MemShare> Allocation<H> {
    /// Imports `shared` as this process's own allocation of `size` bytes,
    /// then checks it against the driver, never against the bytes: where it
    /// lives and its handle types (`cuMemGetAllocationPropertiesFromHandle`),
    /// `size` against the granularity there, and that `size` bytes really
    /// map (the driver refuses a map past the end of the memory). On any
    /// error the imported handle is released again.
    fn import_shared(ctx: &Context, shared: ShareableHandle, size: u64) -> Result<Self> {
        let mismatch = |problem: String| Error::ImportMismatch {
            declared: size,
            share: H::NAME,
            problem,
        };
        if size == 0 {
            return Err(mismatch("a size of 0 bytes cannot be imported".into()));
        }
        let fabric_import = matches!(shared, ShareableHandle::Fabric(_));
        // SAFETY: a descriptor in `shared` is borrowed by the caller for
        // this call (the callers below hold an `AsFd` or own the bytes).
        let handle = unsafe { ctx.driver().mem_import(shared) };
        let handle = ctx.check(Call::MemImportFromShareableHandle, handle)?;
        // Owned from here: an error below drops `inner`, which releases it.
        let mut inner = AllocInner {
            ctx: ctx.clone(),
            id: AllocId::next(),
            handle,
            size,
            location: Location::HostNuma(-1),
            share: H::BITS,
            fabric_import,
        };
        let props = ctx.check(
            Call::MemGetAllocationProperties,
            ctx.queries().mem_properties(handle),
        )?;
        if let Location::Device(d) = props.location {
            ctx.check_device(d)?;
        }
        // A real driver (580, seen on an H200) reports no requested handle
        // types for an imported handle; the import itself proves the
        // exporter's type. Other non-zero answers must include `H`'s.
        if props.handle_types != 0 && props.handle_types & H::BITS != H::BITS {
            return Err(mismatch(format!(
                "the driver reports handle types {:#x}, without {}'s {:#x}",
                props.handle_types,
                H::NAME,
                H::BITS
            )));
        }
        inner.location = props.location;
        let req = AllocationRequest {
            location: props.location,
            handle_types: H::BITS,
        };
        let gran = ctx.check(
            Call::MemGetAllocationGranularity,
            ctx.queries().mem_granularity(req, Granularity::Minimum),
        )?;
        if gran == 0 || !size.is_multiple_of(gran) {
            return Err(mismatch(format!(
                "{size} bytes is not a multiple of the {gran}-byte granularity at {:?}",
                props.location
            )));
        }
        probe_size(&inner).map_err(|e| match e {
            Error::Driver {
                call: Call::MemMap,
                code,
            } if code == Code::INVALID_VALUE => {
                mismatch(format!("the memory is smaller than {size} bytes"))
            }
            e => e,
        })?;
        Ok(Allocation {
            inner: Arc::new(inner),
            _share: PhantomData,
        })
    }
}

/// `cuMemExportToShareableHandle` of `alloc` as `kind`; the answer must be
/// of that kind.
fn export_shared(alloc: &AllocInner, kind: ShareableKind) -> Result<ShareableHandle> {
    let ctx = &alloc.ctx;
    // The export makes something new (a descriptor or bytes) and changes
    // nothing the allocation owns.
    let shared = ctx.queries().mem_export(alloc.handle, kind);
    let shared = ctx.check(Call::MemExportToShareableHandle, shared)?;
    if shared.kind() != kind {
        // Not what was asked for: a driver bug, reported as its answer.
        return Err(ctx.error(Call::MemExportToShareableHandle, Code::UNKNOWN));
    }
    Ok(shared)
}

/// As [`export_shared`], as an owned descriptor.
fn export_fd(alloc: &AllocInner) -> Result<OwnedFd> {
    match export_shared(alloc, ShareableKind::PosixFd)? {
        ShareableHandle::PosixFd(fd) if fd >= 0 => {
            // SAFETY: the driver hands an exported descriptor to the caller,
            // who owns it from now on (C5).
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
        _ => Err(alloc
            .ctx
            .error(Call::MemExportToShareableHandle, Code::UNKNOWN)),
    }
}

/// As [`export_shared`], as fabric bytes.
fn export_fabric(alloc: &AllocInner) -> Result<[u8; 64]> {
    match export_shared(alloc, ShareableKind::Fabric)? {
        ShareableHandle::Fabric(b) => Ok(b.0),
        ShareableHandle::PosixFd(_) => Err(alloc
            .ctx
            .error(Call::MemExportToShareableHandle, Code::UNKNOWN)),
    }
}

/// Maps the whole declared size of `alloc` once and undoes it: the driver
/// refuses a map past the end of the memory.
fn probe_size(alloc: &AllocInner) -> Result<()> {
    let ctx = &alloc.ctx;
    let d = ctx.driver();
    let ptr = ctx.check(
        Call::MemAddressReserve,
        ctx.queries().mem_address_reserve(alloc.size, 0),
    )?;
    // A panic inside the map or the unmap is taken as coming after the
    // driver acted (see `OnUnwind`): what is mapped is unmapped, and the
    // range freed, once.
    let free = || {
        // SAFETY: the probe's reservation; nothing is mapped in it.
        let _ = unsafe { d.mem_address_free(ptr, alloc.size) };
    };
    let undo_map = OnUnwind::new(|| {
        // A map the backend says it refused mapped nothing.
        if d.unwound_answer(Call::MemMap).is_some() {
            free();
            return;
        }
        // SAFETY: the mapping made in the probe, bound to nothing.
        if unsafe { d.mem_unmap(ptr, alloc.size) }.is_ok() {
            free();
        }
    });
    // SAFETY: `ptr` is the reservation just made; `alloc` owns the handle.
    let mapped = unsafe { d.mem_map(ptr, alloc.size, 0, alloc.handle) };
    undo_map.disarm();
    if mapped.is_ok() {
        // An unmap the backend says it refused left the range mapped: kept.
        let undo_unmap = OnUnwind::new(|| {
            if d.unwound_answer(Call::MemUnmap).is_none() {
                free();
            }
        });
        // SAFETY: the mapping just made, bound to nothing.
        let r = unsafe { d.mem_unmap(ptr, alloc.size) };
        undo_unmap.disarm();
        if let Err(c) = r {
            // Still mapped: keep the range rather than free a mapped one.
            return Err(ctx.error(Call::MemUnmap, c));
        }
    }
    // SAFETY: the reservation just made; nothing is mapped in it.
    if let Err(c) = unsafe { d.mem_address_free(ptr, alloc.size) } {
        ctx.record_teardown(ctx.error(Call::MemAddressFree, c));
    }
    ctx.check(Call::MemMap, mapped)
}

impl Allocation<PosixFd> {
    /// Exports the allocation as a POSIX file descriptor
    /// (`cuMemExportToShareableHandle`, C5), to pass to a process of the
    /// same node (with [`FdExchange`](crate::bootstrap::FdExchange), `SCM_RIGHTS`). The descriptor
    /// is the caller's; it does not keep the memory alive.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuMemExportToShareableHandle`.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_fd(&self.inner)
    }

    /// Imports a descriptor exported by [`Allocation::export_fd`] (in this
    /// process or another of the node) as this process's own allocation of
    /// `size` bytes (the exporter's [`Allocation::size`]). Size, location
    /// and handle type are checked against the driver after import.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuMemImportFromShareableHandle`
    /// (`INVALID_VALUE` for a descriptor of another node, R12.4, or one that
    /// is no exported memory); [`Error::ImportMismatch`] when the memory is
    /// not `size` bytes of `PosixFd` memory. Nothing is left imported on error.
    pub fn import_fd(ctx: &Context, fd: impl AsFd, size: u64) -> Result<Self> {
        let fd = fd.as_fd();
        Self::import_shared(ctx, ShareableHandle::PosixFd(fd.as_raw_fd()), size)
    }
}

impl Allocation<FabricShareable> {
    /// Exports the allocation as the 64 bytes of a fabric handle
    /// (`cuMemExportToShareableHandle`, C5), for processes of any node of
    /// the fabric that have an IMEX channel (R12.4).
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuMemExportToShareableHandle`.
    pub fn export_fabric(&self) -> Result<[u8; 64]> {
        export_fabric(&self.inner)
    }

    /// Imports fabric bytes of [`Allocation::export_fabric`] as this
    /// process's own allocation of `size` bytes, checked against the driver
    /// after import as [`Allocation::import_fd`].
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuMemImportFromShareableHandle`
    /// (`NOT_PERMITTED` without an IMEX channel, R9.1/R12.4;
    /// `INVALID_VALUE` for bytes that are no handle);
    /// [`Error::ImportMismatch`] as for `import_fd`.
    pub fn import_fabric(ctx: &Context, bytes: &[u8; 64], size: u64) -> Result<Self> {
        let shared = ShareableHandle::Fabric(FabricHandleBytes(*bytes));
        Self::import_shared(ctx, shared, size)
    }
}

/// What a bind call points at.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// `cuLogicalEndpointBindMem`: handle, whole-allocation size.
    Handle(u64),
    /// `cuLogicalEndpointBindAddr`: device pointer.
    Addr(u64),
}

/// Memory that can be bound to an endpoint: an [`Allocation`] (by handle) or a
/// [`Mapped`] allocation (by address). Sealed.
pub trait BindSource: Sealed {
    /// The shareable handle type (R5.6).
    type Share: MemShare;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Where the memory lives (R5.5).
    fn location(&self) -> Location;
    #[doc(hidden)]
    fn context(&self) -> &Context;
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn target(&self) -> Target;
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn keep_alive(&self) -> KeepAlive;
}

impl<H: MemShare> Sealed for Allocation<H> {}

impl<H: MemShare> BindSource for Allocation<H> {
    type Share = H;
    fn size(&self) -> u64 {
        self.inner.size
    }
    fn location(&self) -> Location {
        self.inner.location
    }
    fn context(&self) -> &Context {
        &self.inner.ctx
    }
    #[allow(private_interfaces)]
    fn target(&self) -> Target {
        Target::Handle(self.inner.handle)
    }
    #[allow(private_interfaces)]
    fn keep_alive(&self) -> KeepAlive {
        KeepAlive(self.inner.clone())
    }
}

/// Rounds `v` up to a multiple of `m` (any `m > 0`).
pub(crate) fn round_up(v: u64, m: u64) -> u64 {
    v.div_ceil(m).saturating_mul(m)
}

//! The mapped form of an allocation: [`Mapped`] (address reserve + map +
//! access), bindable by address and usable from kernels.
//!
//! What this file owns: the mapping ([`MappedInner`]) and its teardown in
//! the one right order (unmap, release the handle, free the address range),
//! what a mapping answers (its address, size, access, and where its memory
//! is for F2, [`Locality`]), its exports, and how it is bound
//! ([`BindSource`] by address), and what a copy takes as memory
//! ([`CopyMemory`]). Mappings are made by
//! [`Allocation::map`](super::Allocation::map).

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{AllocInner, BindSource, KeepAlive, Target, export_fabric, export_fd};
use crate::context::Context;
use crate::driver::{Call, Device, Location};
use crate::error::Result;
use crate::kind::{FabricShareable, MemShare, PosixFd, Private};
use crate::state::Sealed;
use crate::unwind::OnUnwind;

/// The mapping, shared by its owner and the bindings that use it.
pub(crate) struct MappedInner {
    pub(super) alloc: Option<Arc<AllocInner>>,
    pub(super) ptr: u64,
    pub(super) size: u64,
    /// The devices given read-write access (`cuMemSetAccess`): those asked
    /// for, and device memory's own device. Host memory is reachable from
    /// these alone (F2: "every operand accessible from the stream's device").
    pub(super) access: Arc<[Device]>,
}

impl Drop for MappedInner {
    // The one right order: unmap, release the handle, free the address range.
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let Some(alloc) = self.alloc.take() else {
                return;
            };
            let ctx = alloc.ctx.clone();
            let (ptr, size) = (self.ptr, self.size);
            // A panic inside the unmap or the release is taken as coming after
            // the driver acted (see `OnUnwind`): the range is still freed, once
            // (and, when the unmap panicked, the handle released), unless the
            // backend says it refused the unmap: then as a failed one.
            let (r, panic) = crate::unwind::answered(ctx.driver(), Call::MemUnmap, || {
                // SAFETY: the last owner of the mapping is gone: no `Mapped`
                // and no binding through it is left (bindings hold this `Arc`,
                // R7.2).
                unsafe { ctx.driver().mem_unmap(ptr, size) }
            });
            if let Err(code) = r {
                // Still mapped: keep the memory and the range rather than free
                // what the device may still reach.
                std::mem::forget(alloc);
                if let Some(panic) = panic {
                    std::panic::resume_unwind(panic);
                }
                ctx.record_teardown(ctx.error(Call::MemUnmap, code));
                return;
            }
            let free = OnUnwind::new(|| {
                // SAFETY: this mapping's range; the unmap was made.
                if let Err(code) = unsafe { ctx.driver().mem_address_free(ptr, size) } {
                    ctx.record_teardown(ctx.error(Call::MemAddressFree, code));
                }
            });
            drop(alloc);
            free.disarm();
            // SAFETY: this mapping's range, unmapped just above.
            let freed = unsafe { ctx.driver().mem_address_free(ptr, size) };
            if let Some(panic) = panic {
                std::panic::resume_unwind(panic);
            }
            if let Err(code) = freed {
                ctx.record_teardown(ctx.error(Call::MemAddressFree, code));
            }
        });
    }
}

/// An [`Allocation`](super::Allocation) mapped at a device address with
/// access set, bindable by address (`cuLogicalEndpointBindAddr`, R5) and
/// usable from kernels.
///
/// Dropping it unmaps, releases the handle and frees the address range, in
/// that order, once no binding uses it.
pub struct Mapped<H: MemShare = Private> {
    pub(super) inner: Arc<MappedInner>,
    pub(super) _share: PhantomData<fn() -> H>,
}

impl<H: MemShare> std::fmt::Debug for Mapped<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("share", &H::NAME)
            .field("ptr", &format_args!("{:#x}", self.inner.ptr))
            .field("size", &self.inner.size)
            .finish()
    }
}

impl<H: MemShare> Mapped<H> {
    /// The device address (`CUdeviceptr`) of the first byte, for kernels.
    pub fn device_ptr(&self) -> u64 {
        self.inner.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Where the memory lives.
    pub fn location(&self) -> Location {
        self.alloc().location
    }

    /// The raw allocation handle.
    pub fn handle(&self) -> u64 {
        self.alloc().handle
    }

    /// Where its memory is, as F2 asks it of a copy's local operand.
    pub(crate) fn locality(&self) -> Locality {
        let alloc = self.alloc();
        match alloc.location {
            location if alloc.fabric_import => Locality::Fabric(location),
            Location::Device(d) => Locality::Device(d),
            Location::HostNuma(numa) => Locality::Host { numa },
        }
    }

    /// The devices this mapping gives access to (device memory's own
    /// device included).
    pub fn access(&self) -> &[Device] {
        &self.inner.access
    }

    /// How many hold this mapping (its owner, bindings, copies in flight):
    /// tests count what a copy in flight holds with it.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    fn alloc(&self) -> &AllocInner {
        // `alloc` is `None` only inside `Drop`.
        self.inner
            .alloc
            .as_deref()
            .unwrap_or_else(|| unreachable!("mapping used after drop"))
    }
}

impl Mapped<PosixFd> {
    /// As [`Allocation::export_fd`](super::Allocation::export_fd), for the
    /// mapped allocation.
    ///
    /// # Errors
    /// As [`Allocation::export_fd`](super::Allocation::export_fd).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_fd(self.alloc())
    }
}

impl Mapped<FabricShareable> {
    /// As [`Allocation::export_fabric`](super::Allocation::export_fabric),
    /// for the mapped allocation.
    ///
    /// # Errors
    /// As [`Allocation::export_fabric`](super::Allocation::export_fabric).
    pub fn export_fabric(&self) -> Result<[u8; 64]> {
        export_fabric(self.alloc())
    }
}

/// Where a mapping's memory is, as F2 asks it of a copy's local operand
/// ("on the stream's device or host memory").
///
/// Memory of this node is allocated here, or imported by POSIX descriptor
/// (which stays within one node, R12.4, so its device ordinal names the
/// same device here).
///
/// Plain values: a batch keeps one per allocation and clears them per
/// batch, and a list of values that own nothing is cleared without a walk
/// (with the host access list here, an `Arc`: a one-op batch 806 -> 772
/// instructions on `Null`, `benches/copy_batch.rs`; portable 1,003 -> 972).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Locality {
    /// Device memory of this node: its own device always has access.
    Device(Device),
    /// Host memory of this node, reachable from the devices its mapping
    /// gave access to alone ([`KeepAlive::host_access`](super::KeepAlive::host_access)).
    Host { numa: i32 },
    /// Imported by fabric handle: at that location of the node that
    /// exported it, which may be another node (an ordinal names a device of
    /// its own node).
    Fabric(Location),
}

impl<H: MemShare> Sealed for Mapped<H> {}

/// What a copy reads or writes on this side: [`Mapped`] memory, by
/// reference. Sealed.
///
/// A copy works on addresses, and an [`Allocation`](super::Allocation) has
/// none in this process until [`map`](super::Allocation::map): a trait
/// rather than `&Mapped` so that passing one is refused with that fix
/// (`ui-tests/copy_put_from_unmapped_allocation.rs`), not as a bare type
/// mismatch, and any other argument with the trait's notes (host bytes:
/// `put_host`, `copy_put_from_host_bytes.rs`; a type of your own: `&*x`;
/// an endpoint where the memory goes, the order of the arguments,
/// `copy_get_arguments_swapped.rs`).
///
/// Taken: `&x` and `&mut x` where `x` is a `Mapped`, an `Arc<Mapped>`, a
/// `Box<Mapped>` or an `Rc<Mapped>`, and `&r` where `r` is a shared
/// reference to one of those (`r: &Mapped`, as in a loop over
/// `&[Mapped]`, which clippy calls a needless borrow). The copy holds the
/// `&Mapped` inside for `'a`: through `x`'s borrow, or with `&r`, through
/// the reference `r` holds, as deref coercion took them before this
/// trait. Anything else that holds a `Mapped` (a type with `Deref`, a
/// `Pin<Box<_>>`, a guard, `&&mut`) is passed as `&*x`. Test:
/// `data_path::f1_a_copy_takes_mapped_memory_through_a_reference_an_arc_a_box_or_an_rc`.
#[diagnostic::on_unimplemented(
    message = "a copy's memory argument is a `&Mapped` (memory mapped in this process), and `{Self}` is not one (F1)",
    label = "the memory argument: not `&Mapped`",
    note = "an `Allocation` has no address here until it is mapped: `let mapped = alloc.map(&[dev])?;`, then pass `&mapped`",
    note = "host bytes (`Vec<u8>`) go through `put_host(bytes, &ep, offset)` and `get_host(&ep, offset, size)`",
    note = "a type of your own that holds a `Mapped`: pass `&*x`",
    note = "an endpoint in this place: a put takes the memory first, `put(&src, src_offset, &ep, offset, size)`; a get the endpoint first, `get(&ep, offset, &dst, dst_offset, size)`"
)]
pub trait CopyMemory<'a>: Sealed {
    /// The shareable handle type of the memory (R5.6).
    type Share: MemShare;
    #[doc(hidden)]
    fn mapped(self) -> &'a Mapped<Self::Share>;
}

mod holds {
    /// A `Mapped` or an owning pointer to one: what [`super::CopyMemory`]
    /// takes a reference to. Unnameable outside the crate.
    pub trait HoldsMapped {
        type Share: super::MemShare;
        fn held(&self) -> &super::Mapped<Self::Share>;
    }
}
use holds::HoldsMapped;

macro_rules! holds_mapped {
    ($($t:ty),*) => {$(
        impl<H: MemShare> HoldsMapped for $t {
            type Share = H;
            #[inline(always)]
            fn held(&self) -> &Mapped<H> {
                self
            }
        }
    )*};
}
holds_mapped!(
    Mapped<H>,
    Arc<Mapped<H>>,
    Box<Mapped<H>>,
    std::rc::Rc<Mapped<H>>
);

impl<T: HoldsMapped> Sealed for &T {}
// Reported as `CopyMemory` with its words (the trait's notes say what is
// taken), not as the helper behind it; so are the impls below.
#[diagnostic::do_not_recommend]
impl<'a, T: HoldsMapped> CopyMemory<'a> for &'a T {
    type Share = T::Share;
    #[inline(always)]
    fn mapped(self) -> &'a Mapped<T::Share> {
        self.held()
    }
}

impl<T: HoldsMapped> Sealed for &mut T {}
#[diagnostic::do_not_recommend]
impl<'a, T: HoldsMapped> CopyMemory<'a> for &'a mut T {
    type Share = T::Share;
    #[inline(always)]
    fn mapped(self) -> &'a Mapped<T::Share> {
        let shared: &'a T = self;
        shared.held()
    }
}

// As deref coercion took it before the trait: the reference inside, not
// the short borrow of it. One impl per holder (not on every `&&T`): the
// compiler cannot rule out another crate's `HoldsMapped for &T` otherwise.
macro_rules! through_a_reference {
    ($($t:ty),*) => {$(
        impl<H: MemShare> Sealed for &&$t {}
        #[diagnostic::do_not_recommend]
        impl<'a, H: MemShare> CopyMemory<'a> for &&'a $t {
            type Share = H;
            #[inline(always)]
            fn mapped(self) -> &'a Mapped<H> {
                let inner: &'a $t = self;
                inner.held()
            }
        }
    )*};
}
through_a_reference!(
    Mapped<H>,
    Arc<Mapped<H>>,
    Box<Mapped<H>>,
    std::rc::Rc<Mapped<H>>
);

impl<H: MemShare> BindSource for Mapped<H> {
    type Share = H;
    fn size(&self) -> u64 {
        self.inner.size
    }
    fn location(&self) -> Location {
        self.alloc().location
    }
    fn context(&self) -> &Context {
        &self.alloc().ctx
    }
    #[allow(private_interfaces)]
    fn target(&self) -> Target {
        Target::Addr(self.inner.ptr)
    }
    #[allow(private_interfaces)]
    fn keep_alive(&self) -> KeepAlive {
        KeepAlive(self.inner.clone())
    }
}

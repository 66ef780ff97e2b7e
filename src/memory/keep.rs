//! What others hold of memory so that it is not freed under them (R7.2,
//! F4): [`KeepAlive`].
//!
//! What this file owns: the keep-alive, typed (an allocation or a mapping,
//! [`Held`]), so what it keeps is read, never downcast; each allocation's
//! identity ([`AllocId`]), which F3's checks compare (two binds of one
//! allocation), never a reference count; and what peers are given of the
//! memory a binding keeps ([`export_for_peers`], the portable path).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{AllocInner, Mapped, MappedInner, export_fabric, export_fd};
use crate::driver::Device;
use crate::error::Result;
use crate::kind::{FabricShareable, MemShare, PosixFd, Private};

/// An allocation's identity in this process: given once, when this
/// process made or imported it, never reused (unlike its handle or its
/// address). Never 0: F3's checks keep 0 for memory named by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct AllocId(u64);

impl AllocId {
    pub(super) fn next() -> AllocId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // 2^64 allocations are never made: no wrap to 0.
        AllocId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// As a number (never 0).
    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl<H: MemShare> Mapped<H> {
    /// Whether `keep` is this mapping's keep-alive
    /// ([`BindSource::keep_alive`](super::BindSource::keep_alive)), by
    /// address: no reference count touched.
    #[inline]
    pub(crate) fn keeps(&self, keep: &KeepAlive) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.inner), Arc::as_ptr(&keep.0))
    }
}

/// What a binding, a window or a copy in flight holds of memory so that it
/// is not freed under it (R7.2, F4): the allocation (bound by handle) or
/// its mapping (bound by address, a copy's local memory, a peer's memory
/// mapped here). Typed: what it holds answers [`Held`]'s questions, never
/// a downcast. One `Arc` of a trait object, as cheap to hold and drop as
/// the `Arc<dyn Any>` it replaced (an enum of the two `Arc`s cost 4
/// instructions more per unbind and per create, `benches/instructions.rs`).
#[derive(Clone)]
pub(crate) struct KeepAlive(pub(super) Arc<dyn Held>);

/// What a [`KeepAlive`] holds: [`AllocInner`] or [`MappedInner`].
pub(crate) trait Held: std::any::Any + Send + Sync {
    /// The allocation it is or maps: its identity, for F3 (one allocation
    /// bound twice is the same bytes twice). `None` only for a mapping
    /// being dropped, which nothing holds any more.
    fn allocation(&self) -> Option<AllocId>;
    /// The mapping, if it is one.
    fn mapping(&self) -> Option<&MappedInner>;
}

impl Held for AllocInner {
    fn allocation(&self) -> Option<AllocId> {
        Some(self.id)
    }
    fn mapping(&self) -> Option<&MappedInner> {
        None
    }
}

impl Held for MappedInner {
    fn allocation(&self) -> Option<AllocId> {
        self.alloc.as_deref().map(|a| a.id)
    }
    fn mapping(&self) -> Option<&MappedInner> {
        Some(self)
    }
}

impl KeepAlive {
    /// See [`Held::allocation`].
    pub(crate) fn allocation(&self) -> Option<AllocId> {
        self.0.allocation()
    }

    /// The held object as a liveness token, for tables that only ask
    /// whether it still lives (`team::known` keeps a `Weak` of it): the
    /// same object, never downcast.
    pub(crate) fn token(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.0.clone()
    }

    /// The devices a mapping gives access to (none for an allocation held
    /// as itself, which has no mapping): what F2 asks of host memory.
    pub(crate) fn host_access(&self) -> &[Device] {
        self.0.mapping().map_or(&[], |m| &m.access[..])
    }

    /// The held object's address, telling held objects apart while held
    /// (one allocation held as an allocation and as a mapping are two): no
    /// reference count touched.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.0).cast::<()>().addr()
    }
}

/// How peers import memory bound in this process (the portable path).
pub(crate) enum PeerHandle {
    /// Fabric bytes: they cross in a bootstrap message.
    Fabric([u8; 64]),
    /// A POSIX descriptor: it crosses within a node only, by `SCM_RIGHTS`.
    Fd(OwnedFd),
}

/// What peers need to reach memory bound by address in this process on the
/// portable path: the allocation's handle and size, and where the mapping
/// starts (a binding's address minus it is its offset there).
pub(crate) struct PeerExport {
    pub handle: PeerHandle,
    pub alloc_size: u64,
    pub map_base: u64,
}

/// Memory a binding keeps that peers cannot import from a report: what
/// it is, in words.
pub(crate) enum NotForPeers {
    /// [`PosixFd`] memory, whose descriptors cross only with the `_fds`
    /// agreements.
    PosixFdWithoutFds,
    /// Anything else peers cannot import (named).
    Other(&'static str),
}

/// What a binding keeps alive (`keep`), exported for peers: the fabric
/// handle of a mapping of [`FabricShareable`] memory, or with `fds` a
/// descriptor of one of [`PosixFd`] memory; `Ok(Err(..))` for memory peers
/// cannot import that way (an [`Allocation`](super::Allocation) bound by
/// handle has no address here).
pub(crate) fn export_for_peers(
    keep: &KeepAlive,
    fds: bool,
) -> Result<std::result::Result<PeerExport, NotForPeers>> {
    let Some(m) = keep.0.mapping() else {
        return Ok(Err(NotForPeers::Other("an Allocation bound by handle")));
    };
    let Some(alloc) = m.alloc.as_deref() else {
        return Ok(Err(NotForPeers::Other("a mapping being dropped")));
    };
    let handle = match alloc.share {
        FabricShareable::BITS => PeerHandle::Fabric(export_fabric(alloc)?),
        PosixFd::BITS if fds => PeerHandle::Fd(export_fd(alloc)?),
        PosixFd::BITS => return Ok(Err(NotForPeers::PosixFdWithoutFds)),
        _ => return Ok(Err(NotForPeers::Other(Private::NAME))),
    };
    Ok(Ok(PeerExport {
        handle,
        alloc_size: alloc.size,
        map_base: m.ptr,
    }))
}

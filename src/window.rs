//! A *window* of an endpoint for the portable path: where this process
//! reaches the memory bound at an endpoint offset on one target (the owner
//! of a unicast endpoint, a member of a multicast team). Recorded per id
//! beside its bindings (`ledger/attach.rs`); made, checked and read by `copy/portable/`.

use crate::driver::Device;
use crate::memory::KeepAlive;

/// Which target of an endpoint a window reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Member {
    /// A device of this process (its own binding).
    Local(Device),
    /// `device` of the process the caller calls `rank`.
    Peer { rank: u32, device: Device },
}

/// One window: `size` bytes at endpoint `offset` of `member` are at `addr`
/// in this process.
pub(crate) struct Window {
    pub(crate) member: Member,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) addr: u64,
    /// The mapping of a peer window; `None` for a local binding, whose
    /// memory the binding keeps.
    pub(crate) keep: Option<KeepAlive>,
}

impl Window {
    /// The window of a bind by address of this process.
    pub(crate) fn local(dev: Device, offset: u64, size: u64, addr: u64) -> Window {
        Window {
            member: Member::Local(dev),
            offset,
            size,
            addr,
            keep: None,
        }
    }

    /// A local bind by address: `(endpoint offset, size, address)`.
    pub(crate) fn local_span(&self) -> Option<(u64, u64, u64)> {
        matches!(self.member, Member::Local(_)).then_some((self.offset, self.size, self.addr))
    }

    /// Whether this is the window of the local bind on `dev` at `offset`.
    pub(crate) fn is_local(&self, dev: Device, offset: u64) -> bool {
        self.member == Member::Local(dev) && self.offset == offset
    }

    pub(crate) fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }
}

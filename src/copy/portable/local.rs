//! Where the usual put lands on the portable path, read once with an
//! endpoint's facts rather than under the range's lock at each put
//! ([`LocalWindow`]).
//!
//! What this file owns: [`LocalWindow::of`], the window of an endpoint's
//! one device here that holds the start of its first interval bound on
//! every device (where a batch's deferred first put and a route's put
//! lie: `copy/one.rs`), read under the lock with the facts and their
//! bindings generation; [`LocalWindow::to`], the address a put lands at
//! inside it; and [`one_copy`], that put's one copy. Every change to an
//! id's windows moves the range's bindings generation
//! (`ledger/attach.rs`), which the lane compares inside the copy gate:
//! a window read at the facts' generation is the id's window while it
//! stays. What it saves on the H200's one put: `benches/README.md`, "The
//! one put after emptied caches".

use super::view::{onto, piece};
use crate::driver::{Device, MemcpyOp, Pointer};
use crate::ledger::SlotGuard;
use crate::window::Member;

/// The window of an endpoint's one device here that holds the start of
/// its first covered interval: `[offset, end)` of the endpoint at `addr`,
/// which does not wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalWindow {
    offset: u64,
    end: u64,
    addr: u64,
}

impl LocalWindow {
    /// The window of the endpoint whose slot is `slot`, bound here on
    /// `devices` with `team_size` targets, whose first covered interval
    /// starts at `first`, where `one_piece` (`view.rs`) would take a put
    /// there: one target, on one device here, every window of the id that
    /// device's (so no peer window's mapping to hold); `None` otherwise.
    pub(crate) fn of(
        slot: &SlotGuard<'_>,
        devices: &[Device],
        team_size: u32,
        first: Option<u64>,
    ) -> Option<LocalWindow> {
        let (&[dev], 1, Some(start)) = (devices, team_size, first) else {
            return None;
        };
        let mut found = None;
        for w in slot.windows() {
            if w.member != Member::Local(dev) || w.keep.is_some() {
                return None;
            }
            // The windows of one member never overlap: at most one holds it.
            if w.size > 0 && w.offset <= start && start < w.end() {
                found = Some(w);
            }
        }
        let w = found?;
        w.addr.checked_add(w.size)?;
        Some(LocalWindow {
            offset: w.offset,
            end: w.end(),
            addr: w.addr,
        })
    }

    /// The address a put of `size` bytes at `offset` of the endpoint lands
    /// at: inside the window, of one byte or more (`one_piece`'s); `None`
    /// otherwise.
    #[inline(always)]
    pub(crate) fn to(&self, offset: u64, size: u64) -> Option<u64> {
        let end = offset.checked_add(size)?;
        // No wrap: inside the window, whose end at `addr` does not.
        (size > 0 && self.offset <= offset && end <= self.end)
            .then(|| self.addr.wrapping_add(offset - self.offset))
    }
}

/// The one copy of a put of `size` bytes from `from` landing at `to`
/// ([`LocalWindow::to`]); `None` where it would copy bytes onto
/// themselves (`one_piece`'s test: `cuMemcpyAsync`'s ranges may not
/// overlap).
#[inline(always)]
pub(crate) fn one_copy(from: u64, to: u64, size: u64) -> Option<MemcpyOp> {
    let c = piece(true, Pointer::device(from), Pointer::device(to), size);
    (!onto(&c)).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::LocalWindow;

    /// A put lands inside the window only, of one byte or more, at its
    /// offset from the window's start.
    #[test]
    fn a_put_lands_inside_the_window_only() {
        let w = LocalWindow {
            offset: 64,
            end: 192,
            addr: 0x1000,
        };
        assert_eq!(w.to(64, 128), Some(0x1000));
        assert_eq!(w.to(100, 8), Some(0x1000 + 36));
        assert_eq!(w.to(64, 0), None);
        assert_eq!(w.to(63, 8), None);
        assert_eq!(w.to(128, 65), None);
        assert_eq!(w.to(u64::MAX, 2), None);
    }
}

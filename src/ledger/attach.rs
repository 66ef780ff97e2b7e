//! What is attached to the ids of a range, besides their bindings: the
//! fabric handle of each exported or imported id, the portable path's
//! windows, the heap's agreed top of each id of an owned heap, and what
//! peers bound on an id as their last every-rank-bound agreement said. All
//! are behind the range's lock, read and changed through a [`SlotGuard`].

use std::sync::atomic::Ordering;

use super::SlotGuard;
use crate::error::PeerBound;

/// What the range's lock guards besides the slots: the fabric handle of each
/// attachment (exported or imported id), which the context refuses to attach
/// a second time (R9). Few ids of a range have one, so they are a list, not
/// a field of every record.
#[derive(Default)]
pub(crate) struct Attachments {
    pub(crate) fabric: Vec<(u32, [u8; 64])>,
    /// The portable path's windows of each id (`crate::copy::portable`): few ids
    /// have one, so a list beside the fabric handles, not a record field.
    pub(crate) windows: Vec<(u32, crate::window::Window)>,
    /// The heap top of each id of an [`crate::team::OwnedPeers`]: the bytes
    /// every rank bound and agreed on, past which copies are refused before
    /// the driver (R13.3). Set and cleared by the heap that owns the ids.
    pub(crate) agreed: Vec<(u32, u64)>,
    /// What each peer device of an id bound there (the endpoint bytes, merged),
    /// as the last every-rank-bound agreement said (`team::agree_bound`):
    /// copies outside it are refused before the driver (F9, R13.5). Set by
    /// that agreement, cleared with the id's endpoint or by a heap's top.
    pub(crate) peers: Vec<(u32, PeerBound)>,
}

impl SlotGuard<'_> {
    /// Whether any id of the range has a window (the portable path).
    #[inline]
    pub fn has_windows(&self) -> bool {
        !self.shared.windows.is_empty()
    }

    /// The fabric handle of this id's attachment, if any.
    pub fn fabric(&self) -> Option<&[u8; 64]> {
        let id = self.id;
        self.shared
            .fabric
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, f)| f)
    }

    /// Records the fabric handle of this id's attachment; returns the one it
    /// replaces.
    pub fn set_fabric(&mut self, handle: [u8; 64]) -> Option<[u8; 64]> {
        self.range.attached.store(true, Ordering::Relaxed);
        let id = self.id;
        match self.shared.fabric.iter_mut().find(|(i, _)| *i == id) {
            Some((_, f)) => Some(std::mem::replace(f, handle)),
            None => {
                self.shared.fabric.push((id, handle));
                None
            }
        }
    }

    /// Lets go of this id's fabric handle (the id holds no endpoint any more).
    pub fn take_fabric(&mut self) -> Option<[u8; 64]> {
        take_fabric(&mut self.shared, self.id)
    }

    /// The heap top agreed for this id, if it belongs to a heap.
    #[inline]
    pub fn agreed(&self) -> Option<u64> {
        let id = self.id;
        self.shared
            .agreed
            .iter()
            .find(|(i, _)| *i == id)
            .map(|&(_, top)| top)
    }

    /// Sets (`Some`) or clears (`None`) this id's agreed heap top. A heap's
    /// top stands for what every rank bound (its chunks, from offset 0 up),
    /// so it replaces what an earlier agreement said peers bound.
    pub fn set_agreed(&mut self, top: Option<u64>) {
        let id = self.id;
        self.shared.agreed.retain(|(i, _)| *i != id);
        if let Some(top) = top {
            self.shared.agreed.push((id, top));
            self.set_peers(Vec::new());
        }
    }

    /// What peer devices bound on this id, as the last every-rank-bound
    /// agreement said (none before one).
    #[inline]
    pub fn peers(&self) -> impl Iterator<Item = &PeerBound> {
        of_id(&self.shared.peers, self.id)
    }

    /// Replaces what peer devices bound on this id.
    pub fn set_peers(&mut self, peers: Vec<PeerBound>) {
        let id = self.id;
        self.shared.peers.retain(|(i, _)| *i != id);
        self.shared.peers.extend(peers.into_iter().map(|p| (id, p)));
    }

    /// This id's windows (the portable path), in the order they were added.
    pub fn windows(&self) -> impl Iterator<Item = &crate::window::Window> {
        of_id(&self.shared.windows, self.id)
    }

    /// Adds a window to this id. Moves the range's bindings generation, as
    /// every change to the windows does: a copy's facts that say where a put
    /// lands (`crate::copy::EpFacts`'s `local`) are read at one.
    pub fn push_window(&mut self, w: crate::window::Window) {
        self.range.attached.store(true, Ordering::Relaxed);
        self.range.bindings_changed();
        let id = self.id;
        self.shared.windows.push((id, w));
    }

    /// Removes the windows of this id that `remove` picks; returns them, to
    /// be dropped outside the lock (they may keep memory alive).
    #[inline]
    pub fn take_windows(
        &mut self,
        remove: impl FnMut(&crate::window::Window) -> bool,
    ) -> Vec<crate::window::Window> {
        // Inline: no window in the range (the usual case), no call.
        if self.shared.windows.is_empty() {
            return Vec::new();
        }
        self.take_windows_some(remove)
    }

    #[inline(never)]
    fn take_windows_some(
        &mut self,
        mut remove: impl FnMut(&crate::window::Window) -> bool,
    ) -> Vec<crate::window::Window> {
        let id = self.id;
        let (out, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.shared.windows)
            .into_iter()
            .partition(|(i, w)| *i == id && remove(w));
        self.shared.windows = keep;
        if !out.is_empty() {
            // As `push_window`.
            self.range.bindings_changed();
        }
        out.into_iter().map(|(_, w)| w).collect()
    }
}

/// The entries of `list` attached to `id`, in order.
fn of_id<T>(list: &[(u32, T)], id: u32) -> impl Iterator<Item = &T> {
    list.iter().filter(move |(i, _)| *i == id).map(|(_, t)| t)
}

pub(super) fn take_fabric(shared: &mut Attachments, id: u32) -> Option<[u8; 64]> {
    let i = shared.fabric.iter().position(|(i, _)| *i == id)?;
    Some(shared.fabric.swap_remove(i).1)
}

//! The synchronization primitives of the crate's own waits, swapped for
//! `loom`'s under `--cfg loom` (as tokio's `src/loom/`), so that a loom test
//! explores every interleaving of the code that uses them: the copy gate
//! ([`crate::ledger::gate`]) and the in-flight holds
//! ([`crate::ledger::holds`]) today. Code that uses these, and only these,
//! is what `ci/loom.sh` checks. (loom has no `Weak`: the holds keep std's
//! `Arc` and `Weak`, whose counts change between the points loom explores.)
//!
//! Also the identity of the calling thread, which the gate records for
//! the threads inside it (no thread-local state of the crate's own).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

/// A lock that no panic poisons, for data that every holder leaves
/// consistent at each step (the in-flight holds, which ignored std's
/// poison anyway): `parking_lot`'s, one compare-exchange to lock and one
/// to unlock, with no panic-count check on either side: a one-op copy
/// batch's record (`StreamInner::record`, two locks) measured 100
/// instructions against 136 with std's `Mutex` (`benches/copy_batch.rs`,
/// typed 1 op 1,439 against 1,475; rustc 1.95).
#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex as Lock, MutexGuard as LockGuard};

/// loom's mutex, its poison ignored, under [`Lock`]'s interface.
#[cfg(loom)]
pub(crate) struct Lock<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Lock(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The guard of a [`Lock`].
#[cfg(loom)]
pub(crate) type LockGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// A number that names the calling thread among the threads alive now
/// (never 0): the address of a thread-local byte of `parking_lot`'s, one
/// TLS address computation, no atomic operation.
#[cfg(not(loom))]
#[inline]
pub(crate) fn thread_id() -> usize {
    use parking_lot::lock_api::GetThreadId;
    parking_lot::RawThreadId.nonzero_thread_id().get()
}

/// Under loom every model thread runs on one OS thread: its loom id,
/// hashed into 47 bits (never 0), so that the gate adds it to its words
/// as it does a real thread's name (an address below 2^47).
#[cfg(loom)]
pub(crate) fn thread_id() -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    loom::thread::current().id().hash(&mut h);
    // Truncated on 32-bit targets: still a name per thread of a model.
    #[allow(clippy::cast_possible_truncation)]
    let id = (h.finish() & ((1 << 47) - 1)) as usize;
    id | 1
}

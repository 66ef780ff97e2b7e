//! The synchronization primitives of the crate's own waits, swapped for
//! `loom`'s under `--cfg loom` (as tokio's `src/loom/`), so that a loom test
//! explores every interleaving of the code that uses them: the copy gate
//! ([`crate::ledger::gate`]) and the in-flight holds
//! ([`crate::ledger::holds`]) today. Code that uses these, and only these,
//! is what `ci/loom.sh` checks. (loom has no `Weak`: the holds keep std's
//! `Arc` and `Weak`, whose counts change between the points loom explores.)
//!
//! Also the identity of the calling thread, which the gate records for
//! the threads inside it (no thread-local state of the crate's own): the
//! thread pointer where it is one load, else `parking_lot`'s.

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
/// (never 0): on x86_64 Linux the thread pointer, one load.
#[cfg(all(
    not(loom),
    not(miri),
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
))]
#[inline(always)]
pub(crate) fn thread_id() -> usize {
    let tp: usize;
    // SAFETY: reads the first word of the thread control block, which the
    // x86_64 TLS ABI (glibc and musl alike) makes its own address: the
    // thread pointer (the `fs` base the kernel keeps per thread). Distinct
    // for every live thread (each has its own block), never 0, and
    // constant for the thread's life. A plain load: no stack, no flags,
    // no write. Unsafe for speed: `parking_lot`'s thread id (the address
    // of its thread-local byte) is a call the compiler does not inline:
    // bind 190 instructions against 183 here, unbind 144 against 135, the
    // `Null` lifecycle 760 against 744 (`benches/instructions.rs`, rustc
    // 1.95). Miri cannot run inline assembly: under Miri (and on other
    // targets) the name is `parking_lot`'s, below.
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) tp,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    tp
}

/// A number that names the calling thread among the threads alive now
/// (never 0): the address of a thread-local byte of `parking_lot`'s, one
/// TLS address computation (a call), no atomic operation.
#[cfg(all(
    not(loom),
    any(
        miri,
        not(all(
            target_arch = "x86_64",
            target_os = "linux",
            target_pointer_width = "64"
        ))
    )
))]
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::thread_id;

    /// The gate's names: never 0, the same for one thread at every call,
    /// another for each thread alive at once.
    #[test]
    fn a_threads_name_is_its_own_and_stays() {
        let me = thread_id();
        assert_ne!(me, 0);
        assert_eq!(me, std::hint::black_box(thread_id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let them = thread_id();
            tx.send(them).unwrap();
            // Alive until the main thread has compared.
            done_rx.recv().unwrap();
            assert_eq!(them, thread_id());
        });
        let them = rx.recv().unwrap();
        assert_ne!(them, 0);
        assert_ne!(them, me);
        done_tx.send(()).unwrap();
        other.join().unwrap();
        assert_eq!(me, thread_id());
    }
}

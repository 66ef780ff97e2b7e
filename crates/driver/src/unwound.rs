//! [`UnwoundAnswers`]: the error a backend answered to a call whose
//! `tracing` event panicked, kept for the rollback above it.
//!
//! A panic inside a driver call is taken by the typed layer as coming after
//! the driver acted (its success event), so its rollback records what the
//! driver then holds. A backend that emits an event on an error it answers
//! (a deny policy's refusal, a failed call's event) emits it through
//! [`UnwoundAnswers::event`]: when a layer panics there, the answer is
//! noted by thread and call before the panic goes on, and
//! [`Driver::unwound_answer`](crate::Driver::unwound_answer) hands it to
//! that rollback, which then knows the driver did not act (a destroy the
//! driver refused leaves the endpoint there, with the memory it binds).
//!
//! Keyed by thread: the rollback runs on the thread the panic unwinds,
//! while other threads call the same driver. Nothing is kept on the usual
//! path (no event panicked): one relaxed load to find the notes empty.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::ThreadId;

use super::{Call, Code};

/// The most notes kept: a note is taken by the rollback of its call right
/// away; the oldest goes first if none took it.
const MOST: usize = 16;

/// Errors answered to calls whose event panicked, by thread and call (see
/// the module doc). A backend holds one and answers
/// [`Driver::unwound_answer`](crate::Driver::unwound_answer) with
/// [`UnwoundAnswers::take`].
#[derive(Debug, Default)]
pub struct UnwoundAnswers {
    /// Whether `notes` may hold any: read before the lock.
    any: AtomicBool,
    notes: Mutex<Vec<(ThreadId, Call, Code)>>,
}

impl UnwoundAnswers {
    /// No notes.
    pub const fn new() -> Self {
        UnwoundAnswers {
            any: AtomicBool::new(false),
            notes: Mutex::new(Vec::new()),
        }
    }

    /// Runs `emit` (the event of `call`'s answer `code`, an error); if it
    /// panics, notes `code` for this thread's `call` and lets the panic go
    /// on.
    pub fn event(&self, call: Call, code: Code, emit: impl FnOnce()) {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(emit)) {
            self.note(call, code);
            std::panic::resume_unwind(panic);
        }
    }

    #[cold]
    #[inline(never)]
    fn note(&self, call: Call, code: Code) {
        let me = std::thread::current().id();
        let mut notes = self.lock();
        notes.retain(|&(t, c, _)| !(t == me && c == call));
        if notes.len() == MOST {
            notes.remove(0);
        }
        notes.push((me, call, code));
        self.any.store(true, Ordering::Release);
    }

    /// The error noted for this thread's `call`, taken: the driver did not
    /// act on it.
    pub fn take(&self, call: Call) -> Option<Code> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let me = std::thread::current().id();
        let mut notes = self.lock();
        let at = notes.iter().position(|&(t, c, _)| t == me && c == call)?;
        let (_, _, code) = notes.remove(at);
        self.any.store(!notes.is_empty(), Ordering::Release);
        Some(code)
    }

    /// Drops this thread's notes: a new call on it, so an older note no
    /// rollback took speaks of no call in progress.
    pub fn forget_this_thread(&self) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let me = std::thread::current().id();
        let mut notes = self.lock();
        notes.retain(|&(t, _, _)| t != me);
        self.any.store(!notes.is_empty(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(ThreadId, Call, Code)>> {
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note is this thread's and this call's, taken once.
    #[test]
    fn a_note_is_taken_once_by_its_thread_and_call() {
        let u = UnwoundAnswers::new();
        let r = std::panic::catch_unwind(|| {
            u.event(Call::Destroy, Code::NOT_PERMITTED, || panic!("layer"));
        });
        assert!(r.is_err());
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(u.take(Call::Destroy), None));
        });
        assert_eq!(u.take(Call::Create), None);
        assert_eq!(u.take(Call::Destroy), Some(Code::NOT_PERMITTED));
        assert_eq!(u.take(Call::Destroy), None);
    }

    /// An event that does not panic notes nothing; a new call forgets the
    /// thread's old notes.
    #[test]
    fn only_a_panicking_event_is_noted_and_a_new_call_forgets_it() {
        let u = UnwoundAnswers::new();
        u.event(Call::Destroy, Code::UNKNOWN, || {});
        assert_eq!(u.take(Call::Destroy), None);
        let _ = std::panic::catch_unwind(|| u.event(Call::MemMap, Code::UNKNOWN, || panic!()));
        u.forget_this_thread();
        assert_eq!(u.take(Call::MemMap), None);
    }
}

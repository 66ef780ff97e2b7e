//! Unwinding through driver calls, for both layers (the typed API and the
//! backends of this crate): [`OnUnwind`] rolls a transition back when its
//! driver call panicked, [`in_drop`] keeps a `Drop` that calls the driver
//! from turning a panic into an abort, and [`completing`] ends a copy's
//! life (a synchronize) whatever the synchronize did.

/// The rollback of a transition whose driver call panicked: runs `f` when
/// dropped while armed, i.e. only when unwinding passes through.
///
/// A panic inside a driver call (a `tracing` layer on the success event, a
/// user backend) is taken as coming *after* the driver acted: `Driver`
/// implementations never panic themselves, and the layers they call run
/// once the answer is known. The rollback therefore records what the driver
/// then holds (an endpoint to destroy, a binding to keep alive) and never
/// repeats the call; unless the backend says the answer was an error
/// ([`Driver::unwound_answer`](crate::driver::Driver::unwound_answer): a
/// layer panicked on a refusal's or a failure's event of `Traced` or the
/// real backend): then the driver did not act, and the rollback is the
/// error path's (a create made nothing; a destroy or an unmap left the
/// endpoint or the mapping there, and what they keep is kept). Where the
/// record is what later calls trust, it does not bet on either: a bind or
/// unbind that unwound keeps its memory (R7.2) and its extent, so no bind
/// goes over bytes the driver may hold (R5.9), but covers no byte, so F9
/// refuses copies there (a layer may panic on a call's denial or failure,
/// before the driver acted).
#[must_use = "an unarmed guard does nothing: keep it until the call returned"]
pub(crate) struct OnUnwind<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnUnwind<F> {
    pub fn new(f: F) -> Self {
        OnUnwind(Some(f))
    }

    /// The call returned: nothing to roll back.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

/// [`OnUnwind`] over a value the guarded call also uses: reached through
/// the guard ([`OnUnwindWith::value`]) while it is armed, handed to `f` if
/// the guard drops armed. `f` is `Copy` (it captures references alone), so
/// [`OnUnwindWith::disarm`] forgets the guard: nothing to drop, no flag to
/// test (a copy's enqueue: the op list is made in the driver call's
/// argument, through the guard).
#[must_use = "an unarmed guard does nothing: keep it until the call returned"]
pub(crate) struct OnUnwindWith<'v, T, F: FnOnce(&mut T) + Copy> {
    value: &'v mut T,
    f: F,
}

impl<'v, T, F: FnOnce(&mut T) + Copy> OnUnwindWith<'v, T, F> {
    pub fn new(value: &'v mut T, f: F) -> Self {
        OnUnwindWith { value, f }
    }

    /// The guarded value.
    #[inline]
    pub fn value(&mut self) -> &mut T {
        self.value
    }

    /// The call returned: nothing to roll back.
    #[inline]
    pub fn disarm(self) {
        std::mem::forget(self);
    }
}

impl<T, F: FnOnce(&mut T) + Copy> Drop for OnUnwindWith<'_, T, F> {
    fn drop(&mut self) {
        let (f, value) = (self.f, &mut *self.value);
        roll_back(move || f(value));
    }
}

/// Runs `call`, a driver call named `name` whose answer holds no value,
/// to its end even when it panics: its result, and the panic to go on
/// with once the caller recorded what the driver then holds. A panic is
/// taken as coming after the driver acted (`Ok`, as for [`OnUnwind`]),
/// unless the backend says it answered an error
/// ([`Driver::unwound_answer`](crate::driver::Driver::unwound_answer)).
pub(crate) fn answered(
    driver: &dyn crate::driver::Driver,
    name: crate::driver::Call,
    call: impl FnOnce() -> crate::driver::DriverResult<()>,
) -> (
    crate::driver::DriverResult<()>,
    Option<Box<dyn std::any::Any + Send>>,
) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(r) => (r, None),
        Err(panic) => (driver.unwound_answer(name).map_or(Ok(()), Err), Some(panic)),
    }
}

/// Runs the body of a `Drop` that calls the driver. While unwinding, a
/// panic inside it (a `tracing` layer or user backend that panics again) is
/// caught: one escaping a destructor during unwinding aborts the process.
/// Outside unwinding it runs as is (one thread-local read).
#[inline]
pub(crate) fn in_drop(body: impl FnOnce()) {
    if std::thread::panicking() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    } else {
        body();
    }
}

impl<F: FnOnce()> Drop for OnUnwind<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            roll_back(f);
        }
    }
}

/// A rollback that calls the driver (an unmap, an unbind) may meet the same
/// panicking layer again: caught here, so that the first panic goes on
/// unwinding instead of the process aborting. Out of line: only unwinding
/// comes here.
#[cold]
#[inline(never)]
fn roll_back<F: FnOnce()>(f: F) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

/// What [`completing`] learned of a synchronize that ends a copy's life.
pub(crate) struct Completion {
    /// The work is known complete: what it used may be let go.
    pub done: bool,
    /// The synchronize's error (none when it panicked: the panic says it).
    /// Boxed: the usual answer is none, and a completion moved with the
    /// error inline moved 88 bytes more (`InFlight::wait` of a one-op batch
    /// 326 -> 321 instructions on `Null`, `benches/copy_batch.rs`).
    error: Option<Box<crate::error::Error>>,
    /// The panic it raised, to go on with once the teardown is over.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl Completion {
    /// Goes on with the panic the synchronize raised, if it raised one;
    /// else its answer.
    ///
    /// # Errors
    /// The synchronize's error.
    pub fn resume(self) -> crate::error::Result<()> {
        if let Some(p) = self.panic {
            std::panic::resume_unwind(p);
        }
        match self.error {
            Some(e) => Err(*e),
            None => Ok(()),
        }
    }
}

/// Runs `sync`, a synchronize that ends a copy's life (a stream's, a
/// graph's or a token's teardown). A panic inside it (a `tracing` layer, a
/// user backend) is caught and `sync` made once more, caught too: the
/// first may have come after the driver failed, so only an answer says the
/// work completed. The caller then tears down as that answer says (lets go
/// of what the copy used, or keeps it for good) and destroys what it owns
/// either way, before [`Completion::resume`] goes on with the panic: a
/// panic there leaks no stream, event or graph, and frees nothing under a
/// copy that may still run.
// Inline: out of line, a one-put batch's wait cost 15 instructions
// more (`benches/copy_batch.rs`, `Null`).
#[inline]
pub(crate) fn completing(sync: impl Fn() -> crate::error::Result<()>) -> Completion {
    let boxed = || sync().map_err(Box::new);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(boxed)) {
        Ok(Ok(())) => Completion {
            done: true,
            error: None,
            panic: None,
        },
        Ok(Err(e)) => Completion {
            done: false,
            error: Some(e),
            panic: None,
        },
        Err(p) => again(&sync, p),
    }
}

/// [`completing`] after a panic: out of line, only a panic comes here.
#[cold]
#[inline(never)]
fn again(
    sync: &dyn Fn() -> crate::error::Result<()>,
    panic: Box<dyn std::any::Any + Send>,
) -> Completion {
    let done = matches!(
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(sync)),
        Ok(Ok(()))
    );
    Completion {
        done,
        error: None,
        panic: Some(panic),
    }
}

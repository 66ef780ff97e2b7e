//! Unwinding through driver calls, for both layers (the typed API and the
//! backends of this crate): [`OnUnwind`] rolls a transition back when its
//! driver call panicked, [`in_drop`] keeps a `Drop` that calls the driver
//! from turning a panic into an abort.

/// The rollback of a transition whose driver call panicked: runs `f` when
/// dropped while armed, i.e. only when unwinding passes through.
///
/// A panic inside a driver call (a `tracing` layer on the success event, a
/// user backend) is taken as coming *after* the driver acted: `Driver`
/// implementations never panic themselves, and the layers they call run
/// once the answer is known. The rollback therefore records what the driver
/// then holds (an endpoint to destroy, a binding to keep alive) and never
/// repeats the call.
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

//! A hang guard for tests that wait (issue 21, item 13): no test asserts on
//! how long something took, which a busy machine can break; a test whose
//! code under test could hang holds a [`Watchdog`] with a generous bound,
//! which fires only on a real hang. What the test asserts is the outcome.

use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::time::Duration;

/// Generous: minutes beyond any bound under test, at any load.
pub const HANG: Duration = Duration::from_secs(120);

/// Aborts the test process (naming `what`) unless dropped within the bound.
pub struct Watchdog {
    _cancel: Sender<()>,
}

/// Starts a watchdog on `what` for [`HANG`].
pub fn guard(what: &'static str) -> Watchdog {
    let (cancel, rx) = channel::<()>();
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(HANG) {
            eprintln!("{what}: hung for {HANG:?}");
            std::process::abort();
        }
    });
    Watchdog { _cancel: cancel }
}

//! A `tracing` subscriber that hands every event's `call` field and message to
//! a closure: the fixture for layers that panic or re-enter the crate from
//! inside a driver call (`Traced` emits one event per call, after it).

/// What a driver-call event says.
#[derive(Default, Debug)]
pub struct EventFields {
    /// The `call` field: a `cuda.h` name.
    pub call: Option<String>,
    /// The message: `"CUDA_SUCCESS"`, `"driver call failed"`, ...
    pub message: String,
}

impl EventFields {
    /// The call, when the event is a success event of `Traced`.
    pub fn succeeded(&self) -> Option<cuda_endpoints::driver::Call> {
        (self.message == "CUDA_SUCCESS")
            .then(|| {
                self.call
                    .as_deref()
                    .and_then(cuda_endpoints::driver::Call::from_name)
            })
            .flatten()
    }
}

impl EventFields {
    /// The call, when the event is an error's of `Traced` (a failure, or a
    /// refusal by its deny list).
    pub fn failed(&self) -> Option<cuda_endpoints::driver::Call> {
        (self.message == "driver call failed" || self.message.starts_with("denied by"))
            .then(|| {
                self.call
                    .as_deref()
                    .and_then(cuda_endpoints::driver::Call::from_name)
            })
            .flatten()
    }
}

impl tracing::field::Visit for EventFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "call" {
            self.call = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

/// Calls `.0` with every event (spans are ignored).
pub struct OnEvent<F>(pub F);

impl<F: Fn(&EventFields) + Send + Sync + 'static> tracing::Subscriber for OnEvent<F> {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = EventFields::default();
        event.record(&mut f);
        (self.0)(&f);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Calls `f` at every event that names `call` (its success, its denial by
/// `Traced`'s policy, its failure): the layer that panics inside a call
/// whether or not the driver acted.
pub fn on_call(
    call: cuda_endpoints::driver::Call,
    f: impl Fn() + Send + Sync + 'static,
) -> impl tracing::Subscriber {
    OnEvent(move |e: &EventFields| {
        if e.call.as_deref() == Some(call.name()) {
            f();
        }
    })
}

/// Runs `f` on a thread of its own and fails the test when it does not end
/// within `secs` seconds (a deadlock must fail, not hang the suite).
#[track_caller]
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("deadlock: the call did not return")
}

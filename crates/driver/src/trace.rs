//! [`Traced`]: a [`Driver`] wrapper that records every call and enforces a
//! per-wrapper call policy.
//!
//! Each call that reaches a `Traced` is appended to its log as a
//! [`TraceEntry`] (entry point, arguments in words, outcome) and emitted as a
//! `tracing::debug!` event (target `cuda_endpoints::driver::trace`). The log
//! is a ring buffer of the newest [`Traced::DEFAULT_CAPACITY`] entries (see
//! [`Traced::with_capacity`]); [`Traced::dropped`] counts the older ones it
//! let go, so that a long `wait` (one query per poll) cannot grow it without
//! bound. The entry is logged before the event is emitted: a `tracing` layer
//! that panics cannot lose it. When that layer panics on the success event
//! of a call whose answer is a new stream, event, graph or executable graph
//! (`cuStreamCreate`, `cuEventCreate`, `cuStreamEndCapture`,
//! `cuGraphInstantiateWithFlags`), the caller never gets the answer: the
//! wrapper destroys it (logged as such, no event) before the panic goes on,
//! so it is no one's leak. When it panics on the event of an error (a
//! failure, a refusal), the error is noted first
//! ([`UnwoundAnswers`](crate::UnwoundAnswers)), and
//! [`Driver::unwound_answer`] tells the rollback above that the driver did
//! not act. Calls on
//! its deny list are answered `CUDA_ERROR_NOT_PERMITTED` and never reach the
//! inner driver; the log marks them `denied`.
//!
//! Stack it where the question is: `Classic::new(Arc::new(Traced::new(cuda)))`
//! shows exactly which `cuMulticast*` calls the classic fallback made on the
//! real driver, and `.deny([Call::MulticastCreate])` proves one was never
//! made. Keep an `Arc<Traced<_>>` to read the log after handing a clone to
//! the wrapper above it.
//!
//! The wrapper is generated from the table of calls, arguments formatted as
//! `name=value` (addresses and handles in hex).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{BoundedLog, Call, Code, Driver, DriverResult, FabricHandleBytes, UnwoundAnswers};

/// One call as it reached a [`Traced`] driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// The entry point (always `Some` since every call has a [`Call`] name;
    /// kept an `Option` for logs from other sources).
    pub call: Option<Call>,
    /// The `cuda.h` name, e.g. `"cuMulticastCreate"`.
    pub name: &'static str,
    /// The arguments in words, e.g. `"num_devices=2 size=2097152 handle_types=0"`.
    pub args: String,
    /// What the call returned: the value in words (`""` for none), or the code.
    pub result: Result<String, Code>,
    /// Refused by this wrapper's deny list: the inner driver never saw it.
    pub denied: bool,
}

impl TraceEntry {
    /// Whether this call went through to the inner driver.
    pub fn reached(&self) -> bool {
        !self.denied
    }
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name, self.args)?;
        match (&self.result, self.denied) {
            (Err(code), true) => write!(f, " -> {code} (denied by policy)"),
            (Err(code), false) => write!(f, " -> {code}"),
            (Ok(v), _) if v.is_empty() => write!(f, " -> CUDA_SUCCESS"),
            (Ok(v), _) => write!(f, " -> {v}"),
        }
    }
}

/// A [`Driver`] that records every call to `inner` and refuses the calls on
/// its deny list with `CUDA_ERROR_NOT_PERMITTED` before they reach `inner`.
///
/// ```
/// # #[cfg(feature = "model")] {
/// use std::sync::Arc;
/// use cuda_endpoints::driver::{Call, Code, Traced};
/// use cuda_endpoints::model::{Model, ModelConfig};
/// use cuda_endpoints::{Allocation, Context, Device, Error, Private};
///
/// let traced = Arc::new(Traced::new(Model::new(ModelConfig::node(1))).deny([Call::MemCreate]));
/// let ctx = Context::new(traced.clone());
/// let e = Allocation::<Private>::on_device(&ctx, Device(0), 1).unwrap_err();
/// assert!(matches!(e, Error::Driver { call: Call::MemCreate, code } if code == Code::NOT_PERMITTED));
/// assert!(!traced.reached(Call::MemCreate));
/// # }
/// ```
pub struct Traced<D> {
    inner: D,
    deny: Vec<Call>,
    log: Arc<Mutex<BoundedLog<TraceEntry>>>,
    /// The errors whose event panicked, for the rollback above.
    unwound: UnwoundAnswers,
}

impl<D: fmt::Debug> fmt::Debug for Traced<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Traced")
            .field("inner", &self.inner)
            .field("deny", &self.deny)
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl<D> Traced<D> {
    fn lock(&self) -> MutexGuard<'_, BoundedLog<TraceEntry>> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<D: Driver> Traced<D> {
    /// How many entries the log keeps by default.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// Records every call to `inner` (the newest
    /// [`DEFAULT_CAPACITY`](Traced::DEFAULT_CAPACITY) of them); denies nothing.
    pub fn new(inner: D) -> Traced<D> {
        Traced::with_capacity(inner, Self::DEFAULT_CAPACITY)
    }

    /// As [`Traced::new`], keeping the newest `cap` entries (at least 1).
    pub fn with_capacity(inner: D, cap: usize) -> Traced<D> {
        Traced {
            inner,
            deny: Vec::new(),
            log: Arc::new(Mutex::new(BoundedLog::new(cap))),
            unwound: UnwoundAnswers::new(),
        }
    }

    /// How many entries the log let go to keep the newest ones.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped()
    }

    /// Adds `calls` to the deny list: they answer `CUDA_ERROR_NOT_PERMITTED`
    /// without reaching the inner driver.
    pub fn deny(mut self, calls: impl IntoIterator<Item = Call>) -> Traced<D> {
        for c in calls {
            if !self.deny.contains(&c) {
                self.deny.push(c);
            }
        }
        self
    }

    /// Whether `call` is on this wrapper's deny list.
    pub fn denies(&self, call: Call) -> bool {
        self.deny.contains(&call)
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// A copy of the log (the entries kept), oldest first.
    pub fn log(&self) -> Vec<TraceEntry> {
        self.lock().entries().cloned().collect()
    }

    /// The shared log itself, to read it after the wrapper was moved away.
    pub fn log_handle(&self) -> Arc<Mutex<BoundedLog<TraceEntry>>> {
        self.log.clone()
    }

    /// Empties the log.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The entry points called, in order (denied ones included).
    pub fn calls(&self) -> Vec<Call> {
        self.lock().entries().filter_map(|e| e.call).collect()
    }

    /// How many times `call` was made (denied ones included).
    pub fn count(&self, call: Call) -> usize {
        self.lock()
            .entries()
            .filter(|e| e.call == Some(call))
            .count()
    }

    /// Whether `call` ever reached the inner driver.
    pub fn reached(&self, call: Call) -> bool {
        self.lock()
            .entries()
            .any(|e| e.call == Some(call) && e.reached())
    }

    /// The entries for `call`, in order.
    pub fn entries(&self, call: Call) -> Vec<TraceEntry> {
        self.lock()
            .entries()
            .filter(|e| e.call == Some(call))
            .cloned()
            .collect()
    }

    /// Runs one call: policy, inner call, log, event. `undo` gives back
    /// what a successful call made when its success event panics (a
    /// `tracing` layer): the caller never gets the answer, so the resource
    /// would be no one's. The undo goes to `inner` directly (logged, no
    /// event: the layer that panicked is not asked again) before the panic
    /// goes on.
    fn run<T>(
        &self,
        call: Call,
        args: String,
        show: impl FnOnce(&T) -> String,
        body: impl FnOnce(&D) -> DriverResult<T>,
        undo: Option<Undo<D, T>>,
    ) -> DriverResult<T> {
        self.unwound.forget_this_thread();
        let denied = self.deny.contains(&call);
        let r = if denied {
            Err(Code::NOT_PERMITTED)
        } else {
            body(&self.inner)
        };
        match (&r, undo) {
            (Ok(made), Some(undo)) => {
                let event = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.record(Some(call), call.name(), args, &r, show, denied);
                }));
                if let Err(panic) = event {
                    self.undo(made, undo);
                    std::panic::resume_unwind(panic);
                }
            }
            _ => self.record(Some(call), call.name(), args, &r, show, denied),
        }
        r
    }

    /// Gives back `made` (a success event panicked, [`Traced::run`]):
    /// logged, no event. A panic of the inner driver here is caught: the
    /// first one goes on.
    #[cold]
    #[inline(never)]
    fn undo<T>(&self, made: &T, undo: Undo<D, T>) {
        let (call, args) = (undo.call, (undo.args)(made));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (undo.undo)(&self.inner, made)
        }))
        .unwrap_or(Err(Code::UNKNOWN));
        self.lock().push(TraceEntry {
            call: Some(call),
            name: call.name(),
            args: format!("{args} (its maker's success event panicked)"),
            result: r.map(|()| String::new()),
            denied: false,
        });
    }

    fn record<T>(
        &self,
        call: Option<Call>,
        name: &'static str,
        args: String,
        r: &DriverResult<T>,
        show: impl FnOnce(&T) -> String,
        denied: bool,
    ) {
        let result = r.as_ref().map(show).map_err(|c| *c);
        // Logged first, with the lock let go before the event: a layer may
        // read this log, or panic, without losing the entry.
        let event = result.clone();
        self.lock().push(TraceEntry {
            call,
            name,
            args: args.clone(),
            result,
            denied,
        });
        // An error's event may panic (a layer): the error is noted first,
        // so that the rollback above knows the driver did not act.
        let unwound = |code: Code, emit: &dyn Fn()| match call {
            Some(c) => self.unwound.event(c, code, emit),
            None => emit(),
        };
        match (&event, denied) {
            (_, true) => unwound(
                Code::NOT_PERMITTED,
                &|| tracing::debug!(call = name, %args, "denied by the trace policy: CUDA_ERROR_NOT_PERMITTED"),
            ),
            (Ok(v), false) => tracing::debug!(call = name, %args, result = %v, "CUDA_SUCCESS"),
            (Err(code), false) => unwound(
                *code,
                &|| tracing::debug!(call = name, %args, %code, "driver call failed"),
            ),
        }
    }
}

/// How to give back the answer of a call that made a resource (see
/// [`Traced::run`]): the call that destroys it, its argument in words, and
/// the destroy itself.
struct Undo<D, T> {
    call: Call,
    args: fn(&T) -> String,
    undo: fn(&D, &T) -> DriverResult<()>,
}

/// The undo of a call whose answer is a new stream, event, graph or
/// executable graph, the caller's alone to destroy; `None` for any other
/// call. (The ids, allocations, address ranges and classic objects made by
/// `cuLogicalEndpointIdReserve`, `cuMemCreate`, `cuMemAddressReserve`,
/// `cuMulticastCreate` and `cuMemImportFromShareableHandle` stay the
/// process's until it exits, R12.2, as the guide's guarantees say.)
macro_rules! undo {
    (stream_create, $d:ty) => {
        undo!(@ $d, StreamDestroy, stream_destroy, "stream")
    };
    (event_create, $d:ty) => {
        undo!(@ $d, EventDestroy, event_destroy, "event")
    };
    (stream_end_capture, $d:ty) => {
        undo!(@ $d, GraphDestroy, graph_destroy, "graph")
    };
    (graph_instantiate, $d:ty) => {
        undo!(@ $d, GraphExecDestroy, graph_exec_destroy, "exec")
    };
    (@ $d:ty, $call:ident, $destroy:ident, $what:literal) => {
        Some(Undo::<$d, u64> {
            call: Call::$call,
            args: |h| format!(concat!($what, "={:#x}"), h),
            // SAFETY: `h` was just made by this driver and never reached
            // the caller (its success event panicked): no one else holds
            // it, and it is not used again.
            undo: |d, h| unsafe { d.$destroy(*h) },
        })
    };
    ($method:ident, $d:ty) => {
        None
    };
}

/// One argument as `name=value`: addresses and allocation handles in hex,
/// devices by ordinal, anything else as `Debug` (so a new call of the table
/// needs nothing here).
macro_rules! arg {
    (mem, $v:expr) => {
        format!("mem={:#x}", $v)
    };
    (ptr, $v:expr) => {
        format!("ptr={:#x}", $v)
    };
    (mc, $v:expr) => {
        format!("mc={:#x}", $v)
    };
    (stream, $v:expr) => {
        format!("stream={:#x}", $v)
    };
    (dev, $v:expr) => {
        format!("dev={}", $v.0)
    };
    (devices, $v:expr) => {
        format!("devices={:?}", $v.iter().map(|d| d.0).collect::<Vec<_>>())
    };
    (handle, $v:expr) => {
        format!("handle={}", Handle(&$v))
    };
    // A batch of up to thousands of copies: its size, not every copy.
    (copies, $v:expr) => {
        format!(
            "copies={} bytes={}",
            $v.len(),
            $v.iter().fold(0u64, |n, c| n.saturating_add(c.size))
        )
    };
    ($name:ident, $v:expr) => {
        format!(concat!(stringify!($name), "={:?}"), $v)
    };
}

/// A returned value: ids, readiness, handles and limits by what they are,
/// anything else as `Debug` (`()` as nothing).
macro_rules! ret {
    (id_reserve, $v:expr) => {
        format!("base={}", $v)
    };
    (query, $v:expr) => {
        format!("ready={}", $v)
    };
    (mem_get_info, $v:expr) => {
        format!("free={} total={}", $v.0, $v.1)
    };
    (get_limits, $v:expr) => {
        format!(
            "bind_alignment={} max_size={}",
            $v.bind_alignment, $v.max_size
        )
    };
    (mem_create, $v:expr) => {
        format!("{:#x}", $v)
    };
    (mem_address_reserve, $v:expr) => {
        format!("{:#x}", $v)
    };
    (multicast_create, $v:expr) => {
        format!("{:#x}", $v)
    };
    (stream_create, $v:expr) => {
        format!("stream={:#x}", $v)
    };
    (stream_query, $v:expr) => {
        format!("done={}", $v)
    };
    ($method:ident, $v:expr) => {
        debug_or_nothing($v)
    };
}

fn debug_or_nothing<T: fmt::Debug>(v: &T) -> String {
    match format!("{v:?}") {
        unit if unit == "()" => String::new(),
        s => s,
    }
}

/// A `handle` argument: allocation handles (`u64`) in hex, fabric handles
/// as their `Debug` (a checksum, not 64 bytes).
struct Handle<'a, T>(&'a T);

impl fmt::Display for Handle<'_, u64> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for Handle<'_, FabricHandleBytes> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

macro_rules! traced_impl {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        impl<D: Driver> Driver for Traced<D> {
            fn name(&self) -> String {
                format!("traced({})", self.inner.name())
            }
            fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
                self.inner.explain_unsupported(call)
            }
            fn process_scope(&self) -> Option<u64> {
                self.inner.process_scope()
            }
            fn object_sharing(&self) -> Option<&dyn super::ObjectSharing> {
                self.inner.object_sharing()
            }
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                // Its own refusal or the inner driver's error: the panic
                // came from one of them.
                self.unwound.take(call).or_else(|| self.inner.unwound_answer(call))
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    let parts: [String; _] = [$(arg!($arg, $arg)),*];
                    self.run(
                        Call::$variant,
                        parts.join(" "),
                        |v: &$ret| ret!($method, v),
                        // SAFETY: the caller upholds this call's contract;
                        // it is passed on unchanged.
                        move |d| unsafe { d.$method($($arg),*) },
                        undo!($method, D),
                    )
                }
            )*
        }
    };
}

crate::for_each_driver_call!(traced_impl);

//! The real driver backend: [`Cuda`] implements [`Driver`] over `libcuda`,
//! loaded at run time. The only part of the crate that sees C.
//!
//! - `ffi`: the C declarations this backend calls (typedefs, structs, enum
//!   values, prototypes), checked against the real `cuda.h` by `abi`
//!   (`ci/abi-check.sh`);
//! - `symbols`: loading `libcuda` once and resolving the entry points by
//!   name, so that a missing library or symbol is an error, never a panic;
//! - `policy`: the process-wide deny set ([`deny`], [`is_denied`],
//!   [`DENY_ENV`]), checked before any entry point is touched;
//! - `context`: which context each call runs in (primary contexts of the
//!   devices the program uses; none for the device-less logical-endpoint calls);
//! - `marshal`: domain types to C structs and back, one function per call.
//!
//! The `Driver` impl is generated from the table of calls; each method is
//! the `marshal` function of the same name.

#[cfg(test)]
mod abi;
mod context;
mod ffi;
mod marshal;
mod policy;
mod symbols;

use std::ffi::c_int;
use std::fmt;

pub use policy::{DENY_ENV, deny, is_denied};

use self::context::{Contexts, Cx};
use self::ffi::Symbols;
use self::policy::{DENY, DenySet, apply_env_deny};
use crate::Error;
#[cfg(test)]
use crate::driver::{AllocationRequest, Device, Granularity};
use crate::driver::{
    Call, Code, Driver, DriverResult, Family, LOGICAL_ENDPOINT_MIN_VERSION, UnwoundAnswers,
};

/// The real CUDA driver, loaded at run time.
///
/// Every call first checks the process-wide deny set (`NOT_PERMITTED`, no
/// driver call), then whether the entry point exists (`NOT_SUPPORTED`, no
/// call), then makes a primary context current where the call needs one, and
/// restores the thread's previous context afterwards. Primary contexts are
/// retained lazily, only of devices the program uses (a call names the
/// device), and released on drop. The logical-endpoint calls that name no
/// device need no context (cuda.h states none for them) and touch none;
/// the VMM calls that name none use the thread's current context, else
/// the device used last's, else that of a device whose primary context the
/// program holds (device 0 when it holds none). The copies and a stream's
/// query and synchronize are made as they are (no `cuCtxGetCurrent` before
/// each copy): in the thread's context, else in the stream's as the driver
/// takes it; one a driver refuses in no context, or in another device's
/// (a copy's pointers checked against the current context), is made again
/// with the stream's own context current. A failed context step is reported as such
/// ([`Code::in_context`](crate::driver::Code::in_context), [`Error::Context`]), not as the call's.
pub struct Cuda {
    sym: Symbols,
    version: i32,
    deny: &'static DenySet,
    contexts: Contexts,
    /// The errors whose event panicked, for the rollback above.
    unwound: UnwoundAnswers,
}

/// The exported symbol behind a call (`cuda.h` maps some names to `_v2`).
fn symbol_of(call: Call) -> &'static str {
    match call {
        Call::MemGetInfo => "cuMemGetInfo_v2",
        // The 13.0 prototype (no `failIdx`); 12.8 and 12.9 drivers lack it,
        // and the portable path takes `cuMemcpyAsync` there.
        Call::MemcpyBatchAsync => "cuMemcpyBatchAsync_v2",
        other => other.name(),
    }
}

impl Cuda {
    /// Loads `libcuda` (`libcuda.so.1`, else `libcuda.so`), applies
    /// [`DENY_ENV`], resolves the entry points, runs `cuInit(0)` and reads
    /// `cuDriverGetVersion`.
    ///
    /// Missing logical-endpoint or multicast symbols are not an error here
    /// (driver 580 / CUDA 13.0 has none): those calls answer
    /// `CUDA_ERROR_NOT_SUPPORTED`; see [`Cuda::require_logical_endpoints`].
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded, is not a driver, or
    /// `cuInit` fails (e.g. no device, stub library); [`Error::Unsupported`]
    /// when a base entry point is missing or [`DENY_ENV`] names an unknown call.
    pub fn open() -> Result<Cuda, Error> {
        apply_env_deny()?;
        let sym = symbols::load().map_err(|reason| Error::NoDriver { reason })?;
        let (Some(init), Some(get_version)) = (sym.cuInit, sym.cuDriverGetVersion) else {
            return Err(Error::NoDriver {
                reason: "the loaded libcuda exports no cuInit / cuDriverGetVersion".into(),
            });
        };
        // SAFETY: `init` is `cuInit`; flags must be 0.
        if let Some(code) = Code::from_raw(unsafe { init(0) }) {
            tracing::debug!(%code, "cuInit failed");
            return Err(Error::NoDriver {
                reason: format!("cuInit failed with {code}"),
            });
        }
        let mut version: c_int = 0;
        // SAFETY: `get_version` is `cuDriverGetVersion`; `version` is a valid out-pointer.
        if let Some(code) = Code::from_raw(unsafe { get_version(&mut version) }) {
            return Err(Error::NoDriver {
                reason: format!("cuDriverGetVersion failed with {code}"),
            });
        }
        let essential = [
            "cuCtxGetCurrent",
            "cuCtxSetCurrent",
            "cuDevicePrimaryCtxRetain",
            "cuDevicePrimaryCtxRelease_v2",
            "cuDeviceGetCount",
            "cuDeviceGetAttribute",
        ];
        let lacking: Vec<&str> = essential.into_iter().filter(|n| !sym.has(n)).collect();
        if !lacking.is_empty() {
            return Err(Error::unsupported(
                crate::error::Feature::BaseDriver,
                Some(version),
                format!("the driver lacks {}", lacking.join(", ")),
            ));
        }
        tracing::debug!(version, missing = ?sym.missing(), "CUDA driver loaded");
        Ok(Cuda {
            sym,
            version,
            deny: &DENY,
            contexts: Contexts::new(),
            unwound: UnwoundAnswers::new(),
        })
    }

    /// The driver version read at [`Cuda::open`] (`cuDriverGetVersion`, e.g. `13000`).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Whether this driver lacks the entry point behind `call`.
    pub fn missing(&self, call: Call) -> bool {
        !self.sym.has(symbol_of(call))
    }

    /// `Ok` when this driver has logical endpoints: version at least
    /// [`LOGICAL_ENDPOINT_MIN_VERSION`] and every `cuLogicalEndpoint*` symbol.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming what the driver does have instead.
    pub fn require_logical_endpoints(&self) -> Result<(), Error> {
        let of = |family: Family| {
            Call::ALL
                .iter()
                .copied()
                .filter(move |c| c.family() == family)
        };
        let lacking: Vec<&str> = of(Family::LogicalEndpoint)
            .filter(|&c| self.missing(c))
            .map(Call::name)
            .collect();
        if self.version >= LOGICAL_ENDPOINT_MIN_VERSION && lacking.is_empty() {
            return Ok(());
        }
        let has_all = |family| of(family).all(|c| !self.missing(c));
        let mut hint = match (has_all(Family::Vmm), has_all(Family::Classic)) {
            (true, true) => "this driver has VMM (cuMem*) and classic multicast (cuMulticast*; \
                             each team device must also report MULTICAST_SUPPORTED, attribute 132)"
                .to_owned(),
            (true, false) => {
                "this driver has VMM (cuMem*) but no classic multicast (cuMulticast*)".to_owned()
            }
            (false, _) => "this driver lacks the VMM calls (cuMem*) too".to_owned(),
        };
        hint.push_str("; logical endpoints need CUDA 13.3 drivers");
        if self.version >= LOGICAL_ENDPOINT_MIN_VERSION {
            hint.push_str(&format!(
                " (this one reports {} but does not export {})",
                self.version,
                lacking.join(", ")
            ));
        }
        Err(Error::unsupported(
            crate::error::Feature::LogicalEndpoints,
            Some(self.version),
            hint,
        ))
    }

    /// Runs one entry point: policy, presence, context, call, trace. `body`
    /// makes the C call through the resolved pointer and returns its raw
    /// result (twice at most: see [`Cx::NoneNeeded`] and [`Cx::Stream`]).
    fn run<F: Copy>(
        &self,
        call: Call,
        f: Option<F>,
        cx: Cx,
        mut body: impl FnMut(F) -> u32,
    ) -> DriverResult<()> {
        // An error's event may panic (a layer): `unwound` notes the error
        // first, so that the rollback above knows the call was not made.
        if self.deny.contains(call) {
            self.unwound.event(call, Code::NOT_PERMITTED, || {
                tracing::debug!(
                    call = call.name(),
                    "denied by policy: CUDA_ERROR_NOT_PERMITTED"
                );
            });
            return Err(Code::NOT_PERMITTED);
        }
        let Some(f) = f else {
            self.unwound.event(call, Code::NOT_SUPPORTED, || {
                tracing::debug!(
                    call = call.name(),
                    "not exported by this driver: CUDA_ERROR_NOT_SUPPORTED"
                );
            });
            return Err(Code::NOT_SUPPORTED);
        };
        let no_context = |(failure, code): context::StepError| {
            // The call was not made (or, after the driver refused it for
            // want of a context, not made again): the code names the step.
            let answer = code.in_context(failure);
            self.unwound.event(call, answer, || {
                tracing::debug!(call = call.name(), ?cx, step = %failure.step, device = ?failure.device, %code, "no context for the call");
            });
            answer
        };
        // A stream call is made as it is (no driver call before it) while
        // the driver has refused none for want of a context (see `context`).
        let as_is = matches!(cx, Cx::Stream(_)) && self.contexts.stream_as_is();
        let guard = if as_is {
            context::CtxGuard::unchanged(&self.sym)
        } else {
            self.contexts
                .make_current(&self.sym, cx)
                .map_err(no_context)?
        };
        let mut rc = Code::from_raw(body(f));
        if let Some(code) = rc
            && let Some((retry, speculative)) = match cx {
                // cuda.h lists no INVALID_CONTEXT for these calls; a driver
                // that answers it anyway gets the call once more in the
                // context of a device the program uses.
                Cx::NoneNeeded(prefer) if code == Code::INVALID_CONTEXT => self
                    .contexts
                    .retry_context(&self.sym, prefer)
                    .map(|r| (r, false)),
                // Refused in no context or in another: once more in the
                // stream's own.
                Cx::Stream(stream) if Contexts::may_be_the_wrong_context(code) => {
                    self.contexts.stream_retry(&self.sym, stream, code)
                }
                _ => None,
            }
        {
            let _retry = retry.map_err(no_context)?;
            // Refused so far: not made.
            self.unwound.event(call, code, || {
                tracing::debug!(
                    call = call.name(),
                    ?cx,
                    %code,
                    "refused in no context or in another: made again in the stream's or a device's primary context"
                );
            });
            rc = Code::from_raw(body(f));
            // A retry made on the chance that another context was the
            // cause: when it fails too, the driver's first answer stands.
            if speculative && rc.is_some() {
                rc = Some(code);
            }
        }
        drop(guard);
        match rc {
            None => {
                tracing::trace!(call = call.name(), "CUDA_SUCCESS");
                Ok(())
            }
            Some(code) => {
                self.unwound.event(call, code, || {
                    tracing::debug!(call = call.name(), %code, "driver call failed");
                });
                Err(code)
            }
        }
    }

    /// A backend with no entry points, for tests of the policy and presence checks.
    #[cfg(test)]
    fn detached(deny: &'static DenySet) -> Cuda {
        Cuda {
            sym: Symbols::default(),
            version: 0,
            deny,
            contexts: Contexts::new(),
            unwound: UnwoundAnswers::new(),
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // A `tracing` layer that panics on a release's event while this
        // drops during an unwind must not abort the process.
        crate::unwind::in_drop(|| self.contexts.release_all(&self.sym));
    }
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda")
            .field("version", &self.version)
            .field("missing", &self.sym.missing())
            .field("primary_contexts", &self.contexts.devices())
            .finish()
    }
}

static_assertions::assert_impl_all!(Cuda: Send, Sync);

macro_rules! cuda_driver {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        impl Driver for Cuda {
            fn name(&self) -> String {
                "cuda".into()
            }
            /// The OS process: every `Cuda` of it talks to the one libcuda
            /// of the process, whose attachments are per process (R9).
            fn process_scope(&self) -> Option<u64> {
                Some(0)
            }
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                self.unwound.take(call)
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    // SAFETY: the marshalling function has this method's
                    // contract, which the caller upholds.
                    unsafe { marshal::$method(self $(, $arg)*) }
                }
            )*
        }
    };
}

cuda_endpoints_driver::for_each_driver_call!(cuda_driver);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_libcuda_is_no_driver() {
        let present = symbols::load().is_ok();
        let opened = std::panic::catch_unwind(Cuda::open);
        let Ok(result) = opened else {
            panic!("Cuda::open panicked");
        };
        if !present {
            assert!(
                matches!(result, Err(Error::NoDriver { .. })),
                "expected NoDriver, got {result:?}"
            );
        }
    }

    #[test]
    fn denied_calls_never_reach_the_driver() {
        // A private set, so that the process-wide policy of other tests is untouched.
        let set: &'static DenySet = Box::leak(Box::new(DenySet::new()));
        set.add(Call::MulticastCreate);
        let cuda = Cuda::detached(set);
        // SAFETY: a backend without entry points: nothing can reach a driver.
        unsafe {
            // Denied: NOT_PERMITTED, before the presence check.
            assert_eq!(
                cuda.multicast_create(2, 1 << 21, 0),
                Err(Code::NOT_PERMITTED)
            );
            // Not denied, not exported: NOT_SUPPORTED, nothing called.
            assert_eq!(
                cuda.multicast_granularity(2, 1 << 21, 0, Granularity::Minimum),
                Err(Code::NOT_SUPPORTED)
            );
            assert_eq!(cuda.id_reserve(1), Err(Code::NOT_SUPPORTED));
            assert_eq!(cuda.device_clique(Device(0)), Err(Code::NOT_SUPPORTED));
        }
        assert!(cuda.missing(Call::Create));
        assert!(cuda.missing(Call::MemGetInfo));
        assert!(matches!(
            cuda.require_logical_endpoints(),
            Err(Error::Unsupported {
                driver_version: Some(0),
                ..
            })
        ));
    }

    /// A layer that panics on a refusal's event (the deny policy, an entry
    /// point the driver lacks): the refusal is kept for the rollback above
    /// (`Driver::unwound_answer`), on this thread, once.
    #[test]
    fn a_refusal_whose_event_panicked_is_answered_to_the_rollback() {
        let set: &'static DenySet = Box::leak(Box::new(DenySet::new()));
        set.add(Call::Destroy);
        let cuda = Cuda::detached(set);
        for (call, code) in [
            (Call::Destroy, Code::NOT_PERMITTED),
            (Call::IdRelease, Code::NOT_SUPPORTED),
        ] {
            let r = tracing::subscriber::with_default(Panics, || {
                std::panic::catch_unwind(|| {
                    // SAFETY: a backend without entry points: nothing
                    // reaches a driver.
                    let _ = unsafe {
                        match call {
                            Call::Destroy => cuda.destroy(7),
                            _ => cuda.id_release(7, 1),
                        }
                    };
                })
            });
            assert!(r.is_err(), "{call}: the layer's panic goes on");
            assert_eq!(cuda.unwound_answer(call), Some(code), "{call}");
            assert_eq!(cuda.unwound_answer(call), None, "{call}: taken once");
        }
    }

    /// A `tracing` subscriber that panics on every event.
    struct Panics;

    impl tracing::Subscriber for Panics {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            panic!("a layer");
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The ABI check's C file: `ffi.rs`'s declarations (`abi.rs`, shared
    /// with the libcuda double) and every `CUresult` that `Code` names.
    fn c_source() -> String {
        use std::fmt::Write as _;
        let mut out = String::from(abi::HEAD);
        out.push_str(&abi::declarations());
        out.push_str("\n/* CUresult: every code `Code` names */\n");
        for &(name, value, since) in cuda_endpoints_driver::KNOWN {
            abi::guarded(&mut out, since.max(12000), |out| {
                let _ = writeln!(out, "CHECK({name} == {value}, \"value of {name}\");");
            });
        }
        out
    }

    /// Writes the C file for `ci/abi-check.sh`: to `$ABI_CHECK_OUT`, else
    /// `target/abi_check.c`.
    #[test]
    #[ignore = "run by ci/abi-check.sh"]
    fn write_abi_check() {
        let path = std::env::var("ABI_CHECK_OUT").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/abi_check.c").to_owned()
        });
        std::fs::write(&path, c_source()).expect("write the ABI check");
        eprintln!("wrote {path}");
    }

    #[test]
    fn every_call_has_a_declared_symbol() {
        for &call in Call::ALL {
            assert!(
                ffi::FUNCTIONS.iter().any(|f| f.name == symbol_of(call)),
                "{call}: no prototype in ffi"
            );
        }
    }

    /// The typed lifecycle on this backend over `ci/fake-libcuda.c` (run by
    /// `ci/abi-check.sh` with `LD_LIBRARY_PATH` pointing at it): loading,
    /// symbols and marshalling end to end.
    #[test]
    #[ignore = "needs ci/fake-libcuda.c as libcuda.so.1 (ci/abi-check.sh)"]
    fn fake_libcuda_lifecycle() {
        use crate::{Allocation, Context, PosixFd, Spec};
        let ctx = Context::cuda().expect("the fake libcuda loads");
        assert_eq!(ctx.backend_name(), "cuda");
        assert_eq!(ctx.driver_version(), Some(13030));
        assert_eq!(ctx.devices().unwrap(), vec![Device(0)]);
        let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), 2 << 20).unwrap();
        let ep = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::unicast(0, 2 << 20).exportable())
            .unwrap()
            .wait(std::time::Duration::from_secs(1))
            .unwrap();
        ep.export().unwrap();
        ep.bind(Device(0), 0, &mem).unwrap().unbind().unwrap();
        ep.destroy().unwrap().release().unwrap();
        // Memory sharing (C5): a descriptor passes by value, fabric bytes by
        // pointer; the import's probe map goes through too.
        let fd = mem.export_fd().unwrap();
        let theirs = Allocation::<PosixFd>::import_fd(&ctx, &fd, 2 << 20).unwrap();
        assert_eq!(theirs.location(), crate::Location::Device(Device(0)));
        drop((fd, theirs));
        let fab =
            Allocation::<crate::FabricShareable>::on_device(&ctx, Device(0), 2 << 20).unwrap();
        let bytes = fab.export_fabric().unwrap();
        assert_eq!(bytes, [0xcd; 64]);
        drop(Allocation::<crate::FabricShareable>::import_fabric(&ctx, &bytes, 2 << 20).unwrap());
        drop(fab);
        drop(mem);
        assert!(ctx.take_teardown_errors().is_empty());
    }

    /// Real-driver smoke test: `cargo test --lib -- --ignored gpu_smoke`.
    /// Denies `cuMulticastCreate` first and never calls it.
    #[test]
    #[ignore = "needs a CUDA driver"]
    fn gpu_smoke() {
        use crate::driver::{Location, handle_bits};
        deny(&[Call::MulticastCreate]);
        let cuda = match Cuda::open() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("skip: {e}");
                return;
            }
        };
        eprintln!("{cuda:?}");
        eprintln!(
            "require_logical_endpoints: {:?}",
            cuda.require_logical_endpoints()
        );
        // SAFETY: the test owns everything it makes and frees it in order;
        // cuMulticastCreate is denied above.
        unsafe {
            assert_eq!(cuda.driver_version(), Ok(cuda.version()));
            eprintln!("device_count: {:?}", cuda.device_count());
            for attr in [128, 132, 134, 153, 154, 155, 156, 158] {
                eprintln!("attr {attr}: {:?}", cuda.device_attribute(Device(0), attr));
            }
            eprintln!("clique: {:?}", cuda.device_clique(Device(0)));
            assert_eq!(
                cuda.multicast_create(1, 2 << 20, 0),
                Err(Code::NOT_PERMITTED)
            );
            let req = AllocationRequest {
                location: Location::Device(Device(0)),
                handle_types: handle_bits::POSIX_FD,
            };
            let g = cuda.mem_granularity(req, Granularity::Minimum).unwrap();
            eprintln!(
                "granularity min {g}, rec {:?}",
                cuda.mem_granularity(req, Granularity::Recommended)
            );
            let h = cuda.mem_create(g, req).unwrap();
            assert_eq!(cuda.mem_properties(h), Ok(req));
            let ptr = cuda.mem_address_reserve(g, g).unwrap();
            cuda.mem_map(ptr, g, 0, h).unwrap();
            cuda.mem_set_access(ptr, g, vec![Device(0)]).unwrap();
            eprintln!("mem_get_info: {:?}", cuda.mem_get_info(Device(0)));
            cuda.mem_unmap(ptr, g).unwrap();
            cuda.mem_address_free(ptr, g).unwrap();
            cuda.mem_release(h).unwrap();
            let fabric = AllocationRequest {
                handle_types: handle_bits::FABRIC,
                ..req
            };
            eprintln!("fabric mem_create: {:?}", cuda.mem_create(g, fabric));
            if let Ok(numa) = cuda.device_attribute(Device(0), 134) {
                let host = AllocationRequest {
                    location: Location::HostNuma(numa),
                    handle_types: 0,
                };
                match cuda.mem_create(g, host) {
                    Ok(h) => {
                        eprintln!("host numa {numa}: props {:?}", cuda.mem_properties(h));
                        eprintln!("release {:?}", cuda.mem_release(h));
                    }
                    Err(c) => eprintln!("host numa {numa}: mem_create {c}"),
                }
            }
            eprintln!(
                "bad device mem_get_info: {:?}",
                cuda.mem_get_info(Device(99))
            );
            // A failed device does not become the one for device-less calls.
            let va = cuda.mem_address_reserve(g, g).unwrap();
            cuda.mem_address_free(va, g).unwrap();
            // The thread's binding was restored: nothing current now.
            let mut cur: ffi::CUcontext = std::ptr::null_mut();
            let rc = cuda.sym.cuCtxGetCurrent.unwrap()(&mut cur);
            assert_eq!((rc, cur.is_null()), (0, true));
        }
        eprintln!("{cuda:?}");
        drop(cuda);
    }
}

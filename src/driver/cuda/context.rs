//! Contexts: which context each call runs in, and never one of a device the
//! program does not use.
//!
//! [`Contexts`] retains a device's primary context the first time a call
//! names that device ([`Cx::On`]), makes the right one current for one call
//! ([`Contexts::make_current`]) and restores the thread's previous context
//! afterwards.
//!
//! The `cuLogicalEndpoint*` calls that name no device (IdReserve/Release,
//! GetLimits, Create, Query, Destroy, Export, Import) are [`Cx::NoneNeeded`]:
//! cuda.h (13.3 and 13.5, section `CUDA_LOGICAL_ENDPOINT`) states no context
//! for any of them — their doc comments speak of ids "reserved", of memory
//! "bound by this process", of "the current process" and "the importer
//! process", never of a context, and none of their return lists has
//! `CUDA_ERROR_INVALID_CONTEXT`, which the header lists for the calls that do
//! work in the current context. So they run in whatever context the thread
//! has (none, or the caller's), with no retain and no switch. Should a
//! driver still answer `CUDA_ERROR_INVALID_CONTEXT` while no context is
//! current, the call is made once more in the primary context of a device
//! the program uses (the unicast owner named in the properties, else the
//! device used last); with no such device the driver's answer stands.
//!
//! The VMM and classic calls that name no device ([`Cx::Current`]: map,
//! unmap, address reserve/free, release, set access, multicast bind...) work
//! in the current context: the thread's current one when there is one, else
//! the primary context of the device the program used last; before this
//! backend used any device, of the first device whose primary context the
//! program holds (`cuDevicePrimaryCtxGetState`), else of device 0 (the CUDA
//! runtime's default device).
//!
//! The calls on a stream that the data path makes for every copy (the
//! copies, the stream's query and synchronize: [`Cx::Stream`]) are made as
//! they are, without asking which context is current (`cuCtxGetCurrent`
//! is a driver call of its own before each copy): in the thread's current
//! context when it has one, as [`Cx::Current`] calls are; with none, a
//! driver runs them in the stream's own context (what CCCL reports of
//! recent drivers, NVIDIA/cccl#9615) or refuses them. Should the driver
//! answer `CUDA_ERROR_INVALID_CONTEXT` with no context current (the libcuda
//! double can be made to), the call is made once more with the stream's
//! own context current (`cuStreamGetCtx`; the context a [`Cx::Current`]
//! call takes when the driver cannot say), and the driver is remembered as
//! one that refuses ([`Contexts::stream_as_is`]: a fact of the driver, not
//! of the thread; the crate keeps no thread-local state): every later
//! stream call of this backend asks which context is current first and,
//! with none, makes the stream's current.
//!
//! A thread whose current context is another device's (a program that
//! works on several GPUs leaves one so) meets a driver that checks a copy's
//! pointers against the current context, not the stream's
//! (NVIDIA/cccl#9615, #9997: `CUDA_ERROR_INVALID_VALUE`). A stream call
//! refused so (`INVALID_VALUE`, `INVALID_HANDLE` or `INVALID_CONTEXT` with
//! a context current other than the stream's) is made once more with the
//! stream's context current, and the thread's is put back after. Nothing
//! is remembered: a thread in the stream's context, or in none, never pays
//! for it, and a thread left in another device's pays a refused call and
//! four context calls per copy (make the stream's device current, or none,
//! to avoid them). The retry is speculative (`INVALID_VALUE` may be the
//! driver's answer to the call itself): a call whose stream's context was
//! current already is not made again, one made again that fails again
//! keeps the driver's first answer, and a context step that fails makes no
//! retry. It rests on what a CUDA error code means for an asynchronous
//! call: the driver checked the call and enqueued none of it (cuda.h says
//! of no copy call that it may enqueue part of its work and fail); so a
//! retried copy runs once.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, PoisonError};

use super::ffi::{CUcontext, CUstream, Symbols};
use crate::driver::{Code, ContextFailure, ContextStep, Device};

/// Which context a call runs in.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cx {
    /// None needed (device queries).
    Free,
    /// The primary context of this device.
    On(Device),
    /// None needed per cuda.h (the device-less logical-endpoint calls): made
    /// as is. The device is where a retry after `INVALID_CONTEXT` goes
    /// first (the unicast owner of the properties), else the device used last.
    NoneNeeded(Option<Device>),
    /// The current context: the thread's, else the device used last's
    /// primary context, else an active one's (device 0 only while the
    /// program holds no device's primary context at all).
    Current,
    /// A call on this stream: made as it is while the driver has refused
    /// none for want of a context (the thread's context, else the
    /// stream's, as the driver takes it); made again in the stream's own
    /// context when the driver refuses it in another context or in none
    /// ([`Contexts::stream_retry`]); after a refusal in none, with the
    /// stream's context made current when none is, from then on.
    Stream(CUstream),
}

/// A retained primary context (`CUcontext` is a raw pointer, hence not `Send`).
struct Retained(CUcontext);
// SAFETY: a CUDA context handle is a process-wide object usable from every
// thread; the pointer is never dereferenced on the Rust side.
unsafe impl Send for Retained {}

/// No device used yet.
const NO_DEVICE: i32 = -1;

/// The primary contexts one backend retained.
pub(super) struct Contexts {
    /// Device → retained primary context.
    retained: Mutex<Vec<(i32, Retained)>>,
    /// The device whose context was bound last ([`NO_DEVICE`] before any).
    last_device: AtomicI32,
    /// Whether the driver refused a [`Cx::Stream`] call for want of a
    /// context ([`Contexts::stream_retry`]); never unset.
    refuses_streams: AtomicBool,
}

/// A failed context step: which, for which device, and its code.
pub(super) type StepError = (ContextFailure, Code);

fn step_err(step: ContextStep, device: Option<Device>, code: Code) -> StepError {
    (ContextFailure { step, device }, code)
}

/// Restores the thread's previous current context on drop, so that the
/// caller's (or the CUDA runtime's) context binding is left as it was.
pub(super) struct CtxGuard<'a> {
    sym: &'a Symbols,
    previous: Option<CUcontext>,
}

impl CtxGuard<'_> {
    /// A guard that restores nothing (no context was made current).
    #[inline(always)]
    pub(super) fn unchanged(sym: &Symbols) -> CtxGuard<'_> {
        CtxGuard {
            sym,
            previous: None,
        }
    }

    #[cold]
    #[inline(never)]
    fn restore(&self, prev: CUcontext) {
        let Some(set) = self.sym.cuCtxSetCurrent else {
            return;
        };
        // SAFETY: `set` is `cuCtxSetCurrent`; `prev` was current on this thread
        // (or null, which unbinds) a moment ago.
        if let Some(code) = Code::from_raw(unsafe { set(prev) }) {
            // Run by a `Drop`: a layer that panics here while a panic
            // unwinds must not abort the process.
            crate::unwind::in_drop(|| {
                tracing::debug!(%code, "cuCtxSetCurrent: restoring the previous context failed");
            });
        }
    }
}

impl Drop for CtxGuard<'_> {
    // Inline: most calls made nothing current and restore nothing.
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            self.restore(prev);
        }
    }
}

impl Contexts {
    pub(super) fn new() -> Contexts {
        Contexts {
            retained: Mutex::new(Vec::new()),
            last_device: AtomicI32::new(NO_DEVICE),
            refuses_streams: AtomicBool::new(false),
        }
    }

    /// The devices whose primary context is retained.
    pub(super) fn devices(&self) -> Vec<i32> {
        self.retained
            .lock()
            .map(|t| t.iter().map(|(d, _)| *d).collect())
            .unwrap_or_default()
    }

    /// The device used last, if any.
    fn last(&self) -> Option<Device> {
        match self.last_device.load(Ordering::Relaxed) {
            NO_DEVICE => None,
            d => Some(Device(d)),
        }
    }

    fn lookup(&self, dev: Device) -> Option<CUcontext> {
        let table = self.retained.lock().unwrap_or_else(PoisonError::into_inner);
        table.iter().find(|(d, _)| *d == dev.0).map(|(_, c)| c.0)
    }

    /// The primary context of `dev`, retained on first use. The driver is
    /// called (and the retain traced) with no lock held.
    fn primary(&self, sym: &Symbols, dev: Device) -> Result<CUcontext, StepError> {
        if let Some(ctx) = self.lookup(dev) {
            return Ok(ctx);
        }
        let retain_failed = |code| step_err(ContextStep::PrimaryCtxRetain, Some(dev), code);
        let retain = sym
            .cuDevicePrimaryCtxRetain
            .ok_or_else(|| retain_failed(Code::NOT_SUPPORTED))?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `retain` is `cuDevicePrimaryCtxRetain`; `ctx` is a valid
        // out-pointer. An invalid ordinal is an error code, not UB.
        let rc = Code::from_raw(unsafe { retain(&mut ctx, dev.0) });
        if let Some(code) = rc {
            tracing::trace!(device = dev.0, result = ?rc, "cuDevicePrimaryCtxRetain");
            return Err(retain_failed(code));
        }
        let raced = {
            let mut table = self.retained.lock().unwrap_or_else(PoisonError::into_inner);
            if table.iter().any(|(d, _)| *d == dev.0) {
                true
            } else {
                table.push((dev.0, Retained(ctx)));
                false
            }
        };
        // Another thread retained it first: give back this extra retain
        // (the primary context is the same object).
        let released = match sym.cuDevicePrimaryCtxRelease_v2 {
            // SAFETY: `release` is `cuDevicePrimaryCtxRelease_v2`; this
            // thread retained `dev`'s primary context just above.
            Some(release) if raced => Some(Code::from_raw(unsafe { release(dev.0) })),
            _ => None,
        };
        // Traced only now that the table holds the retain (or it was given
        // back): a `tracing` layer that panics here leaks none.
        tracing::trace!(device = dev.0, result = ?rc, "cuDevicePrimaryCtxRetain");
        if let Some(rc) = released {
            tracing::trace!(device = dev.0, result = ?rc, "cuDevicePrimaryCtxRelease");
        }
        Ok(ctx)
    }

    /// The thread's current context (null for none).
    fn current(sym: &Symbols) -> Result<CUcontext, StepError> {
        let get_failed = |code| step_err(ContextStep::CtxGetCurrent, None, code);
        let get = sym
            .cuCtxGetCurrent
            .ok_or_else(|| get_failed(Code::NOT_SUPPORTED))?;
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: `get` is `cuCtxGetCurrent`; `current` is a valid out-pointer.
        if let Some(code) = Code::from_raw(unsafe { get(&mut current) }) {
            return Err(get_failed(code));
        }
        Ok(current)
    }

    /// Before this backend used any device: the first device whose primary
    /// context is active (retained by the program: the CUDA runtime, cudarc,
    /// another backend), so that a call naming no device goes to a device
    /// the program uses. `None` when none is (then device 0, the CUDA
    /// runtime's default device) or the driver cannot say.
    fn active_device(sym: &Symbols) -> Option<Device> {
        let (count, state) = (sym.cuDeviceGetCount?, sym.cuDevicePrimaryCtxGetState?);
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `count` is `cuDeviceGetCount`; `n` is a valid out-pointer.
        if Code::from_raw(unsafe { count(&mut n) }).is_some() {
            return None;
        }
        (0..n.clamp(0, 64)).map(Device).find(|d| {
            let (mut flags, mut active): (std::ffi::c_uint, std::ffi::c_int) = (0, 0);
            // SAFETY: `state` is `cuDevicePrimaryCtxGetState`; `d` is an
            // ordinal below the count; both out-pointers are valid.
            let rc = unsafe { state(d.0, &mut flags, &mut active) };
            rc == 0 && active != 0
        })
    }

    /// Makes `dev`'s primary context current until the guard drops.
    fn make_current_on<'a>(
        &self,
        sym: &'a Symbols,
        dev: Device,
    ) -> Result<CtxGuard<'a>, StepError> {
        let ctx = self.primary(sym, dev)?;
        // Only a device whose context exists serves later device-less calls.
        self.last_device.store(dev.0, Ordering::Relaxed);
        let previous = Self::current(sym)?;
        if previous == ctx {
            return Ok(CtxGuard {
                sym,
                previous: None,
            });
        }
        // `ctx` is a primary context this object retained and has not released.
        Self::switch_to(sym, ctx, previous, Some(dev))
    }

    /// Makes the context for `cx` current on this thread until the guard drops.
    pub(super) fn make_current<'a>(
        &self,
        sym: &'a Symbols,
        cx: Cx,
    ) -> Result<CtxGuard<'a>, StepError> {
        let unchanged = CtxGuard::unchanged(sym);
        match cx {
            Cx::Free | Cx::NoneNeeded(_) => Ok(unchanged),
            Cx::On(dev) => self.make_current_on(sym, dev),
            Cx::Current => {
                if !Self::current(sym)?.is_null() {
                    return Ok(unchanged);
                }
                self.make_current_on(sym, self.fallback(sym))
            }
            Cx::Stream(stream) => {
                let current = Self::current(sym)?;
                if !current.is_null() {
                    return Ok(unchanged);
                }
                self.make_streams_current(sym, stream)
            }
        }
    }

    /// The context `stream` belongs to (`cuStreamGetCtx`); `None` when the
    /// driver cannot say (no such entry point, or an error).
    fn stream_context(sym: &Symbols, stream: CUstream) -> Option<CUcontext> {
        let get = sym.cuStreamGetCtx?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `get` is `cuStreamGetCtx`; `ctx` is a valid out-pointer;
        // the stream is live (the calling call's contract).
        let rc = Code::from_raw(unsafe { get(stream, &mut ctx) });
        tracing::trace!(result = ?rc, "cuStreamGetCtx");
        (rc.is_none() && !ctx.is_null()).then_some(ctx)
    }

    /// `stream`'s own context made current on this thread, where none is
    /// (restored to none when the guard drops); with no answer from
    /// `cuStreamGetCtx`, the primary context [`Cx::Current`] takes.
    fn make_streams_current<'a>(
        &self,
        sym: &'a Symbols,
        stream: CUstream,
    ) -> Result<CtxGuard<'a>, StepError> {
        match Self::stream_context(sym, stream) {
            Some(ctx) => Self::switch_to(sym, ctx, std::ptr::null_mut(), None),
            None => self.make_current_on(sym, self.fallback(sym)),
        }
    }

    /// `ctx` made current on this thread in place of `previous`, restored
    /// when the guard drops; `ctx` is alive for the call: `device`'s primary
    /// context this object retained, or (`device` `None`) the context of a
    /// live stream, as the driver answered just now.
    fn switch_to(
        sym: &Symbols,
        ctx: CUcontext,
        previous: CUcontext,
        device: Option<Device>,
    ) -> Result<CtxGuard<'_>, StepError> {
        let set_failed = |code| step_err(ContextStep::CtxSetCurrent, device, code);
        let set = sym
            .cuCtxSetCurrent
            .ok_or_else(|| set_failed(Code::NOT_SUPPORTED))?;
        // SAFETY: `set` is `cuCtxSetCurrent`; `ctx` is alive for the call
        // (a retained primary context, or a live stream's: see above).
        if let Some(code) = Code::from_raw(unsafe { set(ctx) }) {
            return Err(set_failed(code));
        }
        Ok(CtxGuard {
            sym,
            previous: Some(previous),
        })
    }

    /// The device whose primary context a [`Cx::Current`] call takes when
    /// the thread has none current.
    fn fallback(&self, sym: &Symbols) -> Device {
        self.last()
            .or_else(|| Self::active_device(sym))
            .unwrap_or(Device(0))
    }

    /// Whether a [`Cx::Stream`] call is made as it is (no context step
    /// before it): while the driver has refused none for want of a context.
    #[inline(always)]
    pub(super) fn stream_as_is(&self) -> bool {
        !self.refuses_streams.load(Ordering::Relaxed)
    }

    /// Whether a [`Cx::Stream`] call's answer `code` may be the driver's
    /// refusal of the context it was made in ([`Contexts::stream_retry`]):
    /// `INVALID_CONTEXT` (none current), or `INVALID_VALUE` and
    /// `INVALID_HANDLE`, the answers of a driver that checks a copy's
    /// pointers against the current context (NVIDIA/cccl#9615, #9997).
    /// `NOT_READY` (a query) and every other answer stand as they are.
    #[inline(always)]
    pub(super) fn may_be_the_wrong_context(code: Code) -> bool {
        code == Code::INVALID_CONTEXT || code == Code::INVALID_VALUE || code == Code::INVALID_HANDLE
    }

    /// For a [`Cx::Stream`] call that the driver answered `code`
    /// ([`Contexts::may_be_the_wrong_context`]): the stream's own context,
    /// made current to make the call again in, when the call was made in
    /// another, and whether that retry is speculative.
    ///
    /// - With none current and `INVALID_CONTEXT`, the driver is remembered
    ///   as one that refuses stream calls without a context: later ones,
    ///   where none is current, make the stream's context current first
    ///   ([`Contexts::make_current`]). Not speculative: the driver said
    ///   what was wrong, and the retry's answer is the call's.
    /// - With another context current (a thread left in another device's,
    ///   which a copy's pointers are checked against), nothing is
    ///   remembered: a thread in the stream's context, or in none, pays
    ///   nothing. Speculative: `INVALID_VALUE` may be the driver's answer
    ///   to the call itself, so a retry that fails too leaves the first
    ///   answer standing, and a context step that fails makes no retry.
    ///
    /// `None`: the answer stands (the stream's context was current, the
    /// driver cannot say which it is, or a speculative step failed).
    #[cold]
    #[inline(never)]
    pub(super) fn stream_retry<'a>(
        &self,
        sym: &'a Symbols,
        stream: CUstream,
        code: Code,
    ) -> Option<(Result<CtxGuard<'a>, StepError>, bool)> {
        let current = match Self::current(sym) {
            Ok(c) => c,
            Err(_) if code != Code::INVALID_CONTEXT => return None,
            Err(e) => return Some((Err(e), false)),
        };
        if current.is_null() {
            if code != Code::INVALID_CONTEXT {
                return None;
            }
            self.refuses_streams.store(true, Ordering::Relaxed);
            return Some((self.make_streams_current(sym, stream), false));
        }
        let ctx = Self::stream_context(sym, stream)?;
        if ctx == current {
            return None;
        }
        let made = Self::switch_to(sym, ctx, current, None).ok()?;
        Some((Ok(made), true))
    }

    /// For a [`Cx::NoneNeeded`] call the driver answered `INVALID_CONTEXT`:
    /// the context to make it again in, when no context was current and the
    /// program uses a device (`prefer`, else the device used last). `None`:
    /// the answer stands.
    pub(super) fn retry_context<'a>(
        &self,
        sym: &'a Symbols,
        prefer: Option<Device>,
    ) -> Option<Result<CtxGuard<'a>, StepError>> {
        let dev = prefer.or_else(|| self.last())?;
        match Self::current(sym) {
            Ok(c) if c.is_null() => Some(self.make_current_on(sym, dev)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Releases every retained primary context (at the backend's drop).
    pub(super) fn release_all(&mut self, sym: &Symbols) {
        let table = self
            .retained
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(release) = sym.cuDevicePrimaryCtxRelease_v2 else {
            return;
        };
        let released: Vec<(i32, Option<Code>)> = table
            .drain(..)
            .map(|(dev, _)| {
                // SAFETY: `release` is `cuDevicePrimaryCtxRelease_v2`; this
                // object retained `dev`'s primary context exactly once.
                (dev, Code::from_raw(unsafe { release(dev) }))
            })
            .collect();
        // Traced once every one is released: a `tracing` layer that panics
        // here leaves none retained.
        for (dev, rc) in released {
            tracing::trace!(device = dev, result = ?rc, "cuDevicePrimaryCtxRelease");
        }
    }
}

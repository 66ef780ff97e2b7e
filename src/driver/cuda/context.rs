//! Primary contexts: VMM, multicast and logical-endpoint calls need a current
//! context. [`Contexts`] retains each device's primary context on first use,
//! makes the right one current for one call ([`Contexts::bind`]) and
//! restores the thread's previous context afterwards.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, PoisonError};

use super::ffi::{CUcontext, Symbols};
use crate::driver::{Code, Device, DriverResult};

/// Which context a call runs in.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cx {
    /// None needed (device queries).
    Free,
    /// The primary context of this device.
    On(Device),
    /// Any context: the primary context of the device used last (device 0 at first).
    Any,
}

/// A retained primary context (`CUcontext` is a raw pointer, hence not `Send`).
struct Retained(CUcontext);
// SAFETY: a CUDA context handle is a process-wide object usable from every
// thread; the pointer is never dereferenced on the Rust side.
unsafe impl Send for Retained {}

/// The primary contexts one backend retained.
pub(super) struct Contexts {
    /// Device → retained primary context.
    retained: Mutex<Vec<(i32, Retained)>>,
    /// The device whose context serves device-less calls.
    last_device: AtomicI32,
}

/// Restores the thread's previous current context on drop, so that the
/// caller's (or the CUDA runtime's) context binding is left as it was.
pub(super) struct CtxGuard<'a> {
    sym: &'a Symbols,
    previous: Option<CUcontext>,
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        let (Some(prev), Some(set)) = (self.previous, self.sym.cuCtxSetCurrent) else {
            return;
        };
        // SAFETY: `set` is `cuCtxSetCurrent`; `prev` was current on this thread
        // (or null, which unbinds) a moment ago.
        if let Some(code) = Code::from_raw(unsafe { set(prev) }) {
            tracing::debug!(%code, "cuCtxSetCurrent: restoring the previous context failed");
        }
    }
}

impl Contexts {
    pub(super) fn new() -> Contexts {
        Contexts {
            retained: Mutex::new(Vec::new()),
            last_device: AtomicI32::new(0),
        }
    }

    /// The devices whose primary context is retained.
    pub(super) fn devices(&self) -> Vec<i32> {
        self.retained
            .lock()
            .map(|t| t.iter().map(|(d, _)| *d).collect())
            .unwrap_or_default()
    }

    /// The primary context of `dev`, retained on first use.
    fn primary(&self, sym: &Symbols, dev: Device) -> DriverResult<CUcontext> {
        let mut table = self.retained.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, ctx)) = table.iter().find(|(d, _)| *d == dev.0) {
            return Ok(ctx.0);
        }
        let retain = sym.cuDevicePrimaryCtxRetain.ok_or(Code::NOT_SUPPORTED)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `retain` is `cuDevicePrimaryCtxRetain`; `ctx` is a valid
        // out-pointer. An invalid ordinal is an error code, not UB.
        let rc = Code::from_raw(unsafe { retain(&mut ctx, dev.0) });
        tracing::trace!(device = dev.0, result = ?rc, "cuDevicePrimaryCtxRetain");
        if let Some(code) = rc {
            return Err(code);
        }
        table.push((dev.0, Retained(ctx)));
        Ok(ctx)
    }

    /// Makes the context for `cx` current on this thread until the guard drops.
    pub(super) fn bind<'a>(&self, sym: &'a Symbols, cx: Cx) -> DriverResult<CtxGuard<'a>> {
        let unchanged = CtxGuard {
            sym,
            previous: None,
        };
        let dev = match cx {
            Cx::Free => return Ok(unchanged),
            Cx::On(dev) => dev,
            Cx::Any => Device(self.last_device.load(Ordering::Relaxed)),
        };
        let ctx = self.primary(sym, dev)?;
        // Only a device whose context exists serves later device-less calls.
        self.last_device.store(dev.0, Ordering::Relaxed);
        let (Some(get), Some(set)) = (sym.cuCtxGetCurrent, sym.cuCtxSetCurrent) else {
            return Err(Code::NOT_SUPPORTED);
        };
        let mut previous: CUcontext = std::ptr::null_mut();
        // SAFETY: `get` is `cuCtxGetCurrent`; `previous` is a valid out-pointer.
        if let Some(code) = Code::from_raw(unsafe { get(&mut previous) }) {
            return Err(code);
        }
        if previous == ctx {
            return Ok(unchanged);
        }
        // SAFETY: `set` is `cuCtxSetCurrent`; `ctx` is a primary context this
        // object retained and has not released.
        if let Some(code) = Code::from_raw(unsafe { set(ctx) }) {
            return Err(code);
        }
        Ok(CtxGuard {
            sym,
            previous: Some(previous),
        })
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
        for (dev, _) in table.drain(..) {
            // SAFETY: `release` is `cuDevicePrimaryCtxRelease_v2`; this object
            // retained `dev`'s primary context exactly once.
            let rc = Code::from_raw(unsafe { release(dev) });
            tracing::trace!(device = dev, result = ?rc, "cuDevicePrimaryCtxRelease");
        }
    }
}

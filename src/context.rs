//! [`Context`]: the driver backend a program talks to, the errors that
//! teardown could not return, and the entry points of the typed API
//! (reserving ids, allocating memory).

use std::sync::{Arc, Mutex, OnceLock};

use crate::driver::{
    Call, Code, Device, Driver, DriverResult, Family, LOGICAL_ENDPOINT_MIN_VERSION,
};
use crate::error::{Error, Result};

/// A handle on one driver backend. Cheap to clone; every endpoint, range and
/// allocation keeps its context alive.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    driver: Arc<dyn Driver>,
    device_count: OnceLock<i32>,
    version: OnceLock<Option<i32>>,
    teardown: Mutex<Vec<Error>>,
    /// Fabric handles attached in this context (exported or imported), and
    /// the id holding each.
    attached: Mutex<std::collections::HashMap<[u8; 64], u32>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({})", self.inner.driver.name())
    }
}

impl Context {
    /// A context over any backend.
    pub fn new(driver: impl Driver + 'static) -> Context {
        Context::from_arc(Arc::new(driver))
    }

    /// A context over a shared backend.
    pub fn from_arc(driver: Arc<dyn Driver>) -> Context {
        Context {
            inner: Arc::new(Inner {
                driver,
                device_count: OnceLock::new(),
                version: OnceLock::new(),
                teardown: Mutex::new(Vec::new()),
                attached: Mutex::new(Default::default()),
            }),
        }
    }

    /// The embedded default: the reference model of a node, and a handle on
    /// the model to inspect it (leak counters, violations, faults).
    #[cfg(feature = "model")]
    pub fn model(config: crate::model::ModelConfig) -> (Context, crate::model::Model) {
        let model = crate::model::Model::new(config);
        (Context::new(model.clone()), model)
    }

    /// The real driver (`libcuda`).
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded or initialised.
    /// Logical-endpoint calls on a driver older than 13.3 later fail with
    /// [`Error::Unsupported`], naming the call and the driver version.
    pub fn cuda() -> Result<Context> {
        Ok(Context::new(crate::driver::cuda::Cuda::open()?))
    }

    /// The backend. Crate-private: safe code reaches the driver only through
    /// the typed API (see [`Driver`]'s `# Safety`).
    pub(crate) fn driver(&self) -> &dyn Driver {
        &*self.inner.driver
    }

    /// The backend's calls that are safe to make (queries).
    pub(crate) fn queries(&self) -> crate::driver::Queries<'_> {
        crate::driver::Queries(&*self.inner.driver)
    }

    /// The backend, shared, for raw calls beside the typed API.
    ///
    /// # Safety
    ///
    /// Calling its methods is `unsafe` already; this function is too because
    /// the returned driver is the one the typed objects of this context use:
    /// the caller takes on [`Driver`]'s contract for every call it makes
    /// through it — never touch an id, endpoint, binding, allocation or
    /// mapping that a typed object of this context owns (SPEC R3.4, R7.2, C3,
    /// C4).
    pub unsafe fn driver_arc(&self) -> Arc<dyn Driver> {
        self.inner.driver.clone()
    }

    /// The backend's name, e.g. `"model"` or `"classic(cuda)"`.
    pub fn backend_name(&self) -> String {
        self.inner.driver.name()
    }

    /// Whether two contexts are the same one.
    pub fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Errors that `Drop` could not return (a failed unbind, destroy or
    /// release), oldest first; taking them clears the list. They are also
    /// logged through `tracing` at `error` level when they happen.
    pub fn take_teardown_errors(&self) -> Vec<Error> {
        std::mem::take(&mut *self.lock_teardown())
    }

    pub(crate) fn record_teardown(&self, e: Error) {
        tracing::error!(error = %e, "teardown failed; resource kept alive");
        self.lock_teardown().push(e);
    }

    fn lock_attached(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<[u8; 64], u32>> {
        self.inner
            .attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `handle` for `id`, atomically; `Err(holder)` when another id of
    /// this context already holds it.
    pub(crate) fn try_attach(&self, handle: [u8; 64], id: u32) -> Result<(), u32> {
        match self.lock_attached().entry(handle) {
            std::collections::hash_map::Entry::Occupied(e) => Err(*e.get()),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
                Ok(())
            }
        }
    }

    pub(crate) fn attach(&self, handle: [u8; 64], id: u32) {
        self.lock_attached().insert(handle, id);
    }

    pub(crate) fn detach(&self, handle: &[u8; 64]) {
        self.lock_attached().remove(handle);
    }

    fn lock_teardown(&self) -> std::sync::MutexGuard<'_, Vec<Error>> {
        self.inner
            .teardown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `cuDriverGetVersion`, cached; `None` if the driver would not say.
    pub fn driver_version(&self) -> Option<i32> {
        *self
            .inner
            .version
            .get_or_init(|| self.queries().driver_version().ok())
    }

    /// Number of devices, cached.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32> {
        if let Some(&n) = self.inner.device_count.get() {
            return Ok(n);
        }
        let n = self.check(Call::DeviceGetCount, self.queries().device_count())?;
        Ok(*self.inner.device_count.get_or_init(|| n))
    }

    /// Every device of the machine, in ordinal order.
    ///
    /// # Errors
    /// As [`Context::device_count`].
    pub fn devices(&self) -> Result<Vec<Device>> {
        Ok((0..self.device_count()?).map(Device).collect())
    }

    /// Checks that `dev` exists.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`].
    pub fn check_device(&self, dev: Device) -> Result<()> {
        let count = self.device_count()?;
        if (0..count).contains(&dev.0) {
            Ok(())
        } else {
            Err(Error::NoSuchDevice { device: dev, count })
        }
    }

    /// Reads a device attribute (raw number, see [`crate::driver::attr`]).
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuDeviceGetAttribute` (a driver older than 13.3
    /// answers `INVALID_VALUE` for 153-156).
    pub fn attribute(&self, dev: Device, attr: i32) -> Result<i32> {
        self.check(
            Call::DeviceGetAttribute,
            self.queries().device_attribute(dev, attr),
        )
    }

    /// Turns a driver answer into the crate's error. A logical-endpoint call
    /// that a driver older than 13.3 cannot make becomes [`Error::Unsupported`].
    pub(crate) fn check<T>(&self, call: Call, r: DriverResult<T>) -> Result<T> {
        r.map_err(|code| self.error(call, code))
    }

    pub(crate) fn error(&self, call: Call, code: Code) -> Error {
        if code == Code::NOT_SUPPORTED
            && let Some(why) = self.driver().explain_unsupported(call)
        {
            return Error::Unsupported {
                what: format!("{call} on the {} backend: {why}", self.driver().name()),
                driver_version: self.driver_version(),
                hint: "logical endpoints (a CUDA 13.3+ driver) have no such limits".into(),
            };
        }
        let le_call = call.family() == Family::LogicalEndpoint;
        let old = self
            .driver_version()
            .is_some_and(|v| v < LOGICAL_ENDPOINT_MIN_VERSION);
        if le_call && code == Code::NOT_SUPPORTED && old {
            return Error::Unsupported {
                what: format!("{call} (logical endpoints need a CUDA 13.3 driver)"),
                driver_version: self.driver_version(),
                hint: "this driver still has VMM memory and, on multicast-capable devices, the classic cuMulticast* API".into(),
            };
        }
        Error::driver(call, code)
    }
}

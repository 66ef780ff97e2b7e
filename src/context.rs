//! [`Context`]: the driver backend a program talks to, its versions and
//! devices, the errors that teardown could not return, and the copy path
//! its batches take, chosen once ([`Context::copy_path`]). A leaf: it knows
//! no endpoint, range or backend choice.
//!
//! Every way to make a context is here, one per source of a backend:
//! [`Context::new`] over any [`Driver`], [`Context::cuda`] on the real
//! driver, [`Context::model`] (feature `model`) and
//! [`Context::from_cudarc`] (feature `cudarc`); a process of the model fabric
//! gets its context from [`fabric::connect`](crate::fabric). But for
//! [`Context::auto`], over a driver with the backend
//! [`decide`](crate::backend::decide) picks, which is written beside that
//! decision in `backend.rs`; and [`Context::reserve`], where every endpoint
//! starts, is in `id_range.rs`.

use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::driver::cuda::Cuda;
use crate::driver::{
    BoundedLog, Call, Code, CodeOrigin, Device, Driver, DriverResult, EndpointProps,
    FABRIC_COPY_MIN_VERSION, Family, LOGICAL_ENDPOINT_MIN_VERSION, ObjectSharing, Shape,
};
use crate::error::{Error, Feature, Result};

/// A handle on one driver backend. Cheap to clone; every endpoint, range and
/// allocation keeps its context alive.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    driver: Arc<dyn Driver>,
    /// `&*driver`, computed once: every call of the typed API reaches the
    /// backend through it without recomputing where the `Arc` keeps its
    /// value (a load of the vtable's alignment and three instructions).
    driver_ref: DriverRef,
    device_count: OnceLock<i32>,
    /// Cached once the driver answered; a failed query is asked again.
    version: OnceLock<i32>,
    teardown: Mutex<BoundedLog<Error>>,
    /// Fabric handles attached in this context's process (exported or
    /// imported), and the id holding each: one table shared by every
    /// context of the process ([`Driver::process_scope`], R9).
    attached: Arc<Attached>,
    /// The last released one-id range, for the next `reserve(1)`.
    spare: Spare,
    /// The copy path, once chosen ([`Context::copy_path`]).
    copy_path: PathCell,
    /// What the portable path learned of `cuMemcpyBatchAsync` (`copy/portable/`).
    memcpy_batch: AtomicU8,
}

/// A pointer to the value of [`Inner::driver`].
struct DriverRef(*const dyn Driver);

// SAFETY: it points to a `dyn Driver`, which is `Send + Sync`, kept alive by
// the `Arc` beside it in the same `Inner` and never written through.
unsafe impl Send for DriverRef {}
// SAFETY: as above.
unsafe impl Sync for DriverRef {}

/// `driver` behind an `Arc`: an `Arc<dyn Driver>` as it is, any other
/// driver moved into a new one.
pub(crate) fn shared(driver: impl Driver + 'static) -> Arc<dyn Driver> {
    let any: &dyn std::any::Any = &driver;
    match any.downcast_ref::<Arc<dyn Driver>>() {
        // The caller's `Arc`: a clone of it; `driver` (the same `Arc`) is
        // dropped on return, so the count is unchanged.
        Some(same) => same.clone(),
        None => Arc::new(driver),
    }
}

/// The attached fabric handles of one process, and the id holding each.
type Attached = Mutex<std::collections::HashMap<[u8; 64], u32>>;

/// The attachment table of the process `driver` belongs to: the same table
/// for every context whose driver answers the same scope, for as long as
/// one of them lives.
fn attached_table(driver: &Arc<dyn Driver>) -> Arc<Attached> {
    use std::collections::HashMap;
    use std::sync::Weak;
    // `(true, scope)` for a driver that names its process, `(false,
    // address)` for one that does not (its object is the scope).
    type Scopes = HashMap<(bool, u64), Weak<Attached>>;
    static SCOPES: Mutex<Option<Scopes>> = Mutex::new(None);
    let key = match driver.process_scope() {
        Some(scope) => (true, scope),
        None => (false, Arc::as_ptr(driver) as *const () as usize as u64),
    };
    let mut scopes = SCOPES.lock().unwrap_or_else(|e| e.into_inner());
    let scopes = scopes.get_or_insert_with(HashMap::new);
    if let Some(table) = scopes.get(&key).and_then(Weak::upgrade) {
        return table;
    }
    scopes.retain(|_, t| t.strong_count() > 0);
    let table = Arc::new(Attached::default());
    scopes.insert(key, Arc::downgrade(&table));
    table
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({})", self.inner.driver.name())
    }
}

impl Context {
    /// A context over any backend. An `Arc<dyn Driver>` is used as it is,
    /// so contexts made from clones of one `Arc` share the backend (and, for
    /// a driver that names no process scope, its table of attached fabric
    /// handles); any other driver is moved into a new `Arc`.
    pub fn new(driver: impl Driver + 'static) -> Context {
        let driver = shared(driver);
        Context {
            inner: Arc::new(Inner {
                attached: attached_table(&driver),
                driver_ref: DriverRef(Arc::as_ptr(&driver)),
                driver,
                device_count: OnceLock::new(),
                version: OnceLock::new(),
                teardown: Mutex::new(BoundedLog::new(Context::TEARDOWN_CAPACITY)),
                spare: Default::default(),
                copy_path: Default::default(),
                memcpy_batch: AtomicU8::new(0),
            }),
        }
    }

    /// The embedded default: the reference model of a node, and a handle on
    /// the model to inspect it (leak counters, violations, faults).
    ///
    /// The model reports the driver version of its config
    /// (`ModelConfig::driver_version`, 13.4 by default: logical endpoints,
    /// no fabric copy), so its copies take the portable path
    /// ([`Context::copy_path`]) and read and write `Mapped` memory through
    /// the endpoints' bound memory; set 13.5 (`13050`) for the fabric copy.
    ///
    /// Available with the crate feature `model` (off by default; `fabric`
    /// turns it on too).
    #[cfg(feature = "model")]
    #[cfg_attr(docsrs, doc(cfg(feature = "model")))]
    pub fn model(config: crate::model::ModelConfig) -> (Context, crate::model::Model) {
        let model = crate::model::Model::new(config);
        (Context::new(model.clone()), model)
    }

    /// The real driver (`libcuda`) as it is: no emulation, nothing chosen
    /// for you. Logical endpoints need a 13.3+ driver; on an older one every
    /// logical-endpoint call is [`Error::Unsupported`], naming the call and
    /// the driver version. Programs meant for the drivers in use today
    /// (most are before 13.3) take [`Context::auto`] instead, whose context
    /// has working unicast endpoints and copies on every driver:
    ///
    /// ```no_run
    /// use cuda_endpoints::{Context, backend::Policy, driver::cuda::Cuda};
    /// let (ctx, decision) = Context::auto(Cuda::open()?, &[], &Policy::from_env())?;
    /// println!("{decision}"); // which backend, and why
    /// # Ok::<(), cuda_endpoints::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded or initialised.
    pub fn cuda() -> Result<Context> {
        Ok(Context::new(Cuda::open()?))
    }

    /// A context on the real driver for a `cudarc` context, and the device
    /// that context is on (`CudaContext::ordinal`). Both load the same
    /// `libcuda`; the device's primary context is shared.
    ///
    /// Needs the `cudarc` feature (and a CUDA-version feature on your own
    /// cudarc dependency).
    ///
    /// # Errors
    /// [`Error::NoDriver`]; [`Error::NoSuchDevice`] when the ordinal is not a
    /// device of this driver.
    #[cfg(feature = "cudarc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
    pub fn from_cudarc(cx: &Arc<cudarc::driver::CudaContext>) -> Result<(Context, Device)> {
        let ctx = Context::cuda()?;
        let ordinal = i32::try_from(cx.ordinal()).unwrap_or(i32::MAX);
        let dev = Device(ordinal);
        ctx.check_device(dev)?;
        Ok((ctx, dev))
    }

    /// The backend. Crate-private: safe code reaches the driver only through
    /// the typed API (see [`Driver`]'s `# Safety`).
    #[inline]
    pub(crate) fn driver(&self) -> &dyn Driver {
        // SAFETY: `driver_ref` points to the value of `inner.driver`, which
        // lives (and never moves: it is in an `Arc`) as long as `inner`, so
        // at least as long as `&self`. Unsafe for speed: the safe
        // `&*self.inner.driver` finds the value behind the `Arc` from the
        // vtable's alignment at every call, 5 instructions per driver call:
        // 921 instructions per `Null` lifecycle against 881 with the
        // pointer, `wait` 34 against 29 (`benches/instructions.rs`, rustc 1.95).
        unsafe { &*self.inner.driver_ref.0 }
    }

    /// The copy path cell (see [`Context::copy_path`]).
    fn path_cell(&self) -> &PathCell {
        &self.inner.copy_path
    }

    /// What the portable path learned of `cuMemcpyBatchAsync` on this
    /// context (`copy/portable/` reads and writes it).
    pub(crate) fn memcpy_batch(&self) -> &AtomicU8 {
        &self.inner.memcpy_batch
    }

    /// The spare one-id range (see [`Spare`]).
    pub(crate) fn spare(&self) -> &Spare {
        &self.inner.spare
    }

    /// How the backend shares its objects across processes, where it does
    /// so itself (the classic fallback, C5): the bring-ups' one question of
    /// the backend, typed (no raw driver call in `team/`).
    pub(crate) fn object_sharing(&self) -> Option<&dyn ObjectSharing> {
        self.driver().object_sharing()
    }

    /// The process the backend's driver names, where it names one (a
    /// simulated fabric's process, or this OS process): bring-up keys its
    /// table of taken shares by it, typed (no raw driver call in `team/`).
    pub(crate) fn process_scope(&self) -> Option<u64> {
        self.driver().process_scope()
    }

    /// A device attribute, `None` where the driver would not say: for
    /// checks that are skipped then (no error is made, nothing else asked).
    pub(crate) fn attribute_or_none(&self, dev: Device, attr: i32) -> Option<i32> {
        self.queries().device_attribute(dev, attr).ok()
    }

    /// The backend's calls that are safe to make (queries).
    #[inline]
    pub(crate) fn queries(&self) -> crate::driver::Queries<'_> {
        crate::driver::Queries(self.driver())
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

    /// Which context this is, by address: equal exactly when [`Context::same`].
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.inner).addr()
    }

    /// How many teardown errors the context keeps until they are taken
    /// ([`Context::take_teardown_errors`]); older ones are counted in
    /// [`Context::teardown_errors_dropped`] (every one is also logged).
    pub const TEARDOWN_CAPACITY: usize = 1024;

    /// Errors that `Drop` could not return (a failed unbind, destroy or
    /// release), oldest first, at most the newest
    /// [`TEARDOWN_CAPACITY`](Context::TEARDOWN_CAPACITY); taking them clears
    /// the list. They are also logged through `tracing` at `error` level when
    /// they happen.
    pub fn take_teardown_errors(&self) -> Vec<Error> {
        self.lock_teardown().take()
    }

    /// How many teardown errors were let go, since the context was made, to
    /// keep the newest [`TEARDOWN_CAPACITY`](Context::TEARDOWN_CAPACITY).
    pub fn teardown_errors_dropped(&self) -> u64 {
        self.lock_teardown().dropped()
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
    /// this process (through any context) already holds it.
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

    fn lock_teardown(&self) -> std::sync::MutexGuard<'_, BoundedLog<Error>> {
        self.inner
            .teardown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `cuDriverGetVersion`, cached once the driver answered; `None` if it
    /// would not say (asked again next time: a transient failure must not
    /// hide the version for the context's life).
    pub fn driver_version(&self) -> Option<i32> {
        if let Some(&v) = self.inner.version.get() {
            return Some(v);
        }
        let v = self.queries().driver_version().ok()?;
        Some(*self.inner.version.get_or_init(|| v))
    }

    /// Number of devices, cached.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuDeviceGetCount`.
    #[inline]
    pub fn device_count(&self) -> Result<i32> {
        match self.inner.device_count.get() {
            Some(&n) => Ok(n),
            None => self.device_count_first(),
        }
    }

    /// [`Context::device_count`] before the driver answered once.
    #[cold]
    #[inline(never)]
    fn device_count_first(&self) -> Result<i32> {
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
    #[inline]
    pub fn check_device(&self, dev: impl Into<Device>) -> Result<()> {
        let dev = dev.into();
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
    pub fn attribute(&self, dev: impl Into<Device>, attr: i32) -> Result<i32> {
        self.check(
            Call::DeviceGetAttribute,
            self.queries().device_attribute(dev.into(), attr),
        )
    }

    /// Before a device joins a multicast team (R4): on a driver with
    /// logical endpoints (13.3+), attribute 154 must say the device has
    /// multicast endpoints. A backend that explains its own enrollment
    /// refusals (the classic fallback, which reads attribute 132 instead)
    /// is left to answer.
    ///
    /// # Errors
    /// [`Error::FeatureMissing`] naming the device and attribute 154;
    /// [`Error::Driver`] when the attribute cannot be read.
    pub(crate) fn check_multicast_device(&self, dev: Device) -> Result<()> {
        let le = self
            .driver_version()
            .is_some_and(|v| v >= LOGICAL_ENDPOINT_MIN_VERSION);
        if !le || self.driver().explain_unsupported(Call::AddDevice).is_some() {
            return Ok(());
        }
        match self.attribute(dev, crate::driver::attr::LE_MULTICAST)? {
            0 => Err(Error::FeatureMissing {
                device: dev,
                feature: Feature::MulticastEndpoints,
                attribute: crate::driver::attr::LE_MULTICAST,
                value: 0,
            }),
            _ => Ok(()),
        }
    }

    /// Before `dev` takes part in an endpoint with `COUNTED_OPS` (owner,
    /// team device): attribute 155 (R2.4).
    ///
    /// # Errors
    /// [`Error::FeatureMissing`] naming the device, attribute 155 and its value.
    pub(crate) fn check_counted_ops(&self, dev: Device) -> Result<()> {
        match self.attribute(dev, crate::driver::attr::LE_COUNTED_OPS)? {
            0 => Err(Error::FeatureMissing {
                device: dev,
                feature: Feature::CountedOps,
                attribute: crate::driver::attr::LE_COUNTED_OPS,
                value: 0,
            }),
            _ => Ok(()),
        }
    }

    /// Before `dev` takes part in an exportable endpoint (owner, team
    /// device): attribute 158 (`LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES`,
    /// 13.5) must include FABRIC. A driver before 13.5 does not know the
    /// attribute (`INVALID_VALUE`): nothing to check then, the create or
    /// export answers. The classic fallback shares its objects by its own
    /// handles (C5) and is not asked.
    ///
    /// # Errors
    /// [`Error::FeatureMissing`] naming the device, attribute 158 and its
    /// value; another failure to read it.
    pub(crate) fn check_fabric_handles(&self, dev: Device) -> Result<()> {
        if self.driver().explain_unsupported(Call::Export).is_some() {
            return Ok(());
        }
        let attribute = crate::driver::attr::LE_SUPPORTED_HANDLE_TYPES;
        let fabric = crate::driver::attr::LE_IPC_FABRIC;
        match self.attribute(dev, attribute) {
            Ok(value) if value & fabric == 0 => Err(Error::FeatureMissing {
                device: dev,
                feature: Feature::FabricHandles,
                attribute,
                value,
            }),
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(Code::INVALID_VALUE) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Before `dev` joins a team that already holds `team` (enrolled by this
    /// process): the same multicast clique, where the driver can tell (13.4+,
    /// R4.5).
    ///
    /// # Errors
    /// [`Error::OtherClique`].
    pub(crate) fn check_clique(&self, dev: Device, team: &[Device]) -> Result<()> {
        let Some(&first) = team.first() else {
            return Ok(());
        };
        if let (Some(clique), Some(team_clique)) = (self.clique(dev), self.clique(first))
            && clique != team_clique
        {
            return Err(Error::OtherClique {
                device: dev,
                clique,
                team_device: first,
                team_clique,
            });
        }
        Ok(())
    }

    /// The error of a refused `cuLogicalEndpointAddDevice` of `dev`: a
    /// backend's own refusal (the classic fallback, C6) names the device and
    /// its attribute 132.
    pub(crate) fn enroll_error(&self, dev: Device, code: Code) -> Error {
        if code == Code::NOT_SUPPORTED
            && code.origin() == CodeOrigin::Call
            && let Some(why) = self.driver().explain_unsupported(Call::AddDevice)
        {
            let value = match self.attribute(dev, crate::driver::attr::MULTICAST_SUPPORTED) {
                Ok(v) => v.to_string(),
                Err(e) => format!("unreadable: {e}"),
            };
            return Error::unsupported(
                Feature::ClassicMulticastDevice,
                self.driver_version(),
                format!(
                    "{dev} reports MULTICAST_SUPPORTED (attribute 132) = {value}; {} on the {} backend: {why}",
                    Call::AddDevice,
                    self.driver().name()
                ),
            );
        }
        self.error(Call::AddDevice, code)
    }

    /// `cuLogicalEndpointGetLimits` for `props` (R10).
    pub(crate) fn limits(&self, props: &EndpointProps) -> Result<crate::Limits> {
        // SAFETY: a limits query touches nothing anyone owns.
        let r = unsafe { self.driver().get_limits(*props) };
        r.map_err(|code| self.error_for(Call::GetLimits, code, Some(props)))
    }

    /// `dev`'s multicast clique (R4.5), `None` where the driver cannot tell.
    pub(crate) fn clique(&self, dev: crate::Device) -> Option<u32> {
        // SAFETY: a clique query touches nothing anyone owns.
        unsafe { self.driver().device_clique(dev) }.ok()
    }

    /// Turns a driver answer into the crate's error. A logical-endpoint call
    /// that a driver older than 13.3 cannot make becomes [`Error::Unsupported`].
    pub(crate) fn check<T>(&self, call: Call, r: DriverResult<T>) -> Result<T> {
        r.map_err(|code| self.error(call, code))
    }

    pub(crate) fn error(&self, call: Call, code: Code) -> Error {
        self.error_for(call, code, None)
    }

    /// As [`Context::error`], for a call made with `props` (create, limits):
    /// a backend's refusal then names the property it cannot serve.
    pub(crate) fn error_for(&self, call: Call, code: Code, props: Option<&EndpointProps>) -> Error {
        // The entry point that really failed, when the backend emulates
        // `call` on others (the classic fallback's `cuMulticast*`).
        match code.origin() {
            // The entry point that really failed, when the backend emulates
            // `call` on others (the classic fallback's `cuMulticast*`).
            CodeOrigin::Inner(inner) => return Error::driver(inner, code),
            // A context step before the call failed, not the call (the real
            // backend's primary contexts): name the step and the device.
            CodeOrigin::Context(cf) => {
                return Error::Context {
                    call,
                    step: cf.step,
                    device: cf.device,
                    code,
                };
            }
            CodeOrigin::Call => {}
        }
        if code == Code::NOT_SUPPORTED
            && let Some(why) = self.driver().explain_unsupported(call)
            && let Some(feature) = backend_feature(call, props)
        {
            return Error::unsupported(
                feature,
                self.driver_version(),
                format!("{call} on the {} backend: {why}", self.driver().name()),
            );
        }
        let le_call = call.family() == Family::LogicalEndpoint;
        let old = self
            .driver_version()
            .is_some_and(|v| v < LOGICAL_ENDPOINT_MIN_VERSION);
        if le_call && code == Code::NOT_SUPPORTED && old {
            return Error::unsupported(
                Feature::LogicalEndpoints,
                self.driver_version(),
                format!(
                    "{call} refused; this driver still has VMM memory and, on multicast-capable devices, the classic cuMulticast* API"
                ),
            );
        }
        Error::driver(call, code)
    }
}

/// What a backend that explains its `NOT_SUPPORTED` (the classic multicast
/// fallback) cannot do, by the call it refused and the properties asked for.
/// `None`: no feature to name; the driver's code then speaks for itself.
fn backend_feature(call: Call, props: Option<&EndpointProps>) -> Option<Feature> {
    match call {
        Call::AddDevice => Some(Feature::ClassicMulticastDevice),
        Call::Export | Call::Import => Some(Feature::FabricOnClassic),
        Call::Create | Call::GetLimits => props.map(|p| match p.shape {
            Shape::Unicast { .. } => Feature::UnicastOnClassic,
            // An exportable team is what the bring-up shares (C5): its
            // refusal is no multicast at all, not the fabric export.
            Shape::Multicast { .. } if p.counted_ops => Feature::CountedOpsOnClassic,
            Shape::Multicast { .. } => Feature::MulticastTeam,
        }),
        _ => None,
    }
}

/// How a context's [`crate::CopyBatch`]es reach the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyPath {
    /// One `cuFabricCpyBatchAsync` per batch (CUDA 13.5+, logical endpoints).
    Fabric,
    /// One `cuMemcpyAsync` per target piece, through the endpoint's windows
    /// (made by a bring-up's `agree_bound`, or [`Endpoint::add_peer_window`](crate::Endpoint::add_peer_window));
    /// a multicast put is one per member. A batch of several pieces goes
    /// as one `cuMemcpyBatchAsync` where the driver has it (12.8+).
    Portable,
}

impl std::fmt::Display for CopyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyPath::Fabric => "fabric copy (cuFabricCpyBatchAsync)",
            CopyPath::Portable => "portable (cuMemcpyAsync through mapped peer memory)",
        })
    }
}

/// The context's choice: 0 not yet made, else `encode(path)`.
#[derive(Default)]
pub(crate) struct PathCell(AtomicU8);

const fn encode(p: CopyPath) -> u8 {
    match p {
        CopyPath::Fabric => 1,
        CopyPath::Portable => 2,
    }
}

impl PathCell {
    #[inline]
    pub(crate) fn get(&self) -> Option<CopyPath> {
        match self.0.load(Ordering::Acquire) {
            1 => Some(CopyPath::Fabric),
            2 => Some(CopyPath::Portable),
            _ => None,
        }
    }

    pub(crate) fn set(&self, p: CopyPath) {
        self.0.store(encode(p), Ordering::Release);
    }
}

/// The path a backend gets, from what it says: the fabric copy when the
/// driver has the symbol (13.5+) and the backend does not refuse it (the
/// classic fallback does), else the portable path. With the reason.
pub(crate) fn choose(
    driver_version: Option<i32>,
    refused: Option<&'static str>,
) -> (CopyPath, String) {
    match (driver_version, refused) {
        (_, Some(why)) => (CopyPath::Portable, format!("the backend: {why}")),
        (Some(v), None) if v >= FABRIC_COPY_MIN_VERSION => (
            CopyPath::Fabric,
            format!("driver {v} has cuFabricCpyBatchAsync (13.5+, F7)"),
        ),
        (Some(v), None) => (
            CopyPath::Portable,
            format!("driver {v} has no cuFabricCpyBatchAsync (before 13.5, F7)"),
        ),
        (None, None) => (
            CopyPath::Portable,
            "the driver version is unknown, so cuFabricCpyBatchAsync may be missing".into(),
        ),
    }
}

impl Context {
    /// How this context's copy batches reach the driver: decided once, at
    /// the first copy or by [`Context::auto`] (the backend decision), from
    /// the driver version and the backend — [`CopyPath::Fabric`] on 13.5+
    /// with logical endpoints, else [`CopyPath::Portable`] — and logged
    /// (`tracing`, target `cuda_endpoints::portable`).
    // Inline: once chosen, one load on every enqueue (a call cost 24
    // instructions of a one-op batch, `benches/copy_batch.rs`).
    #[inline]
    pub fn copy_path(&self) -> CopyPath {
        match self.path_cell().get() {
            Some(p) => p,
            None => self.choose_copy_path(),
        }
    }

    /// [`Context::copy_path`]'s first call: the choice, logged.
    #[cold]
    #[inline(never)]
    fn choose_copy_path(&self) -> CopyPath {
        let refused = self.driver().explain_unsupported(Call::FabricCpyBatchAsync);
        let (path, why) = choose(self.driver_version(), refused);
        // The target it had before the choice moved here from `portable`.
        tracing::info!(target: "cuda_endpoints::portable", %path, %why, backend = %self.backend_name(), "copy path chosen");
        self.path_cell().set(path);
        path
    }

    /// Overrides [`Context::copy_path`] for every later batch (tests, or a
    /// program that wants the portable path on a 13.5 driver). Batches
    /// already in flight are not affected. Forcing [`CopyPath::Fabric`] on
    /// a driver without it makes each enqueue fail with `NOT_SUPPORTED`.
    pub fn set_copy_path(&self, path: CopyPath) {
        tracing::info!(target: "cuda_endpoints::portable", %path, "copy path set");
        self.path_cell().set(path);
    }
}

/// A context's spare one-id range (`range.rs`): the allocation of the last
/// one-id range released, kept for the next `reserve(1)`, so that a program
/// that reserves and releases one id at a time (the usual lifecycle)
/// allocates once, not once per lifecycle, and builds no record on the stack
/// to copy in. At most one per context; freed with the context.
///
/// Held without its type, which is a floor above (the ranges' record): the
/// pointer `Arc::into_raw` gave [`Spare::put`], and the function that frees
/// it. One type per context: only `range.rs` puts and takes.
#[derive(Default)]
pub(crate) struct Spare {
    value: AtomicPtr<()>,
    /// [`free`]`::<T>` of the `T` the last [`Spare::put`] was given, as a
    /// data pointer; null before the first.
    free: AtomicPtr<()>,
}

impl Spare {
    // An `AtomicPtr` for speed: a `parking_lot::Mutex<Option<Arc<_>>>`
    // measured 908 instructions per `Null` lifecycle against 881 (reserve
    // 66 against 56, release 111 against 95; `benches/instructions.rs`,
    // rustc 1.95), for one pointer swapped in and out.

    /// The spare as `Arc::into_raw` gave it, if there is one: the caller
    /// owns it (and must give it back to `Arc::<T>::from_raw`, `T` the type
    /// [`Spare::put`] was given).
    #[inline]
    pub(crate) fn take_raw<T>(&self) -> Option<*const T> {
        let p = self.value.swap(std::ptr::null_mut(), Ordering::Acquire);
        (!p.is_null()).then_some(p.cast_const().cast())
    }

    /// Where the spare is (null: none), for tests that follow it.
    #[cfg(test)]
    pub(crate) fn peek(&self) -> *const () {
        self.value.load(Ordering::Relaxed).cast_const()
    }

    /// Keeps `value` (for a range: released, unique, one id, reset) as the
    /// spare; an older spare is freed.
    // Always: inlined into `range::release_shared` as it was before the
    // copy builder's changes of issue 30 moved LLVM's choice (the
    // lifecycle on `Null`: 781 without, 777 with, as at c0868d4).
    #[inline(always)]
    pub(crate) fn put<T: Send + Sync>(&self, value: Arc<T>) {
        let free_t: unsafe fn(*const ()) = free::<T>;
        // Before the value it frees: whoever takes the value (`Acquire`)
        // or drops the spare (`&mut`) sees it.
        self.free.store(free_t as *mut (), Ordering::Relaxed);
        let old = self
            .value
            .swap(Arc::into_raw(value).cast_mut().cast(), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: the pointer swapped out is owned here, an
            // `Arc::<T>::into_raw` of an earlier `put` (one type per context).
            unsafe { free::<T>(old) };
        }
    }
}

/// Frees a spare of type `T`.
///
/// # Safety
/// `p` is an `Arc::<T>::into_raw` that the caller owns.
unsafe fn free<T>(p: *const ()) {
    // SAFETY: the caller's contract.
    drop(unsafe { Arc::from_raw(p.cast::<T>()) });
}

impl Drop for Spare {
    fn drop(&mut self) {
        let p = *self.value.get_mut();
        if p.is_null() {
            return;
        }
        // SAFETY: a value was put, so `free` holds `free::<T>` of its type
        // (stored before it), cast to a data pointer: cast back to the
        // function pointer it was (pointers and function pointers are the
        // same size on every target this crate builds for).
        let free_t =
            unsafe { std::mem::transmute::<*mut (), unsafe fn(*const ())>(*self.free.get_mut()) };
        // SAFETY: `&mut self`: the spare's pointer is owned here, and
        // `free_t` frees its type.
        unsafe { free_t(p) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Spare;

    /// The spare frees what it holds by the type it was given: an older
    /// value when a newer one is put, the last one with the spare (Miri
    /// checks the function pointer's round trip through a data pointer).
    #[test]
    fn spare_frees_each_value_once_by_its_type() {
        let (a, b) = (Arc::new(1u64), Arc::new(2u64));
        let spare = Spare::default();
        spare.put(a.clone());
        spare.put(b.clone());
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(Arc::strong_count(&b), 2);
        let p = spare.take_raw::<u64>().map(|p| {
            // SAFETY: an `Arc::<u64>::into_raw` of `put`, owned here.
            unsafe { Arc::from_raw(p) }
        });
        assert_eq!(p.as_deref(), Some(&2));
        drop(p);
        spare.put(b.clone());
        drop(spare);
        assert_eq!(Arc::strong_count(&b), 1);
    }
}

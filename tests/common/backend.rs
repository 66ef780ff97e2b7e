//! Which backend the integration suites run through.
//!
//! By default, the reference model directly (`Context::model`). With
//! `CUDA_ENDPOINTS_TEST_BACKEND=cuda`, the real backend
//! (`driver::cuda::Cuda`, via `Context::cuda()`) on the libcuda test double
//! (`double/`, put first on `LD_LIBRARY_PATH` by `ci/double.sh`): every call
//! then crosses the C ABI, with the double's model behind it.
//!
//! [`context`] gives the context and a [`Probe`]: the leak counters, call
//! counts, violation log, faults and memory of whichever model is behind,
//! and the same backend for raw calls (`Probe` is a [`Driver`]). The double
//! has one model per process (unless it is a process of a model fabric:
//! `common/rank.rs`), so on it tests take turns: a probe holds a
//! process-wide token until it drops, and each [`context`] resets the
//! double's node to the configuration asked for.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use cuda_endpoints::driver::Forward;
use cuda_endpoints::model::{
    Live, Model, ModelConfig, Violation,
    faults::{Fault, FaultPlan},
};
use cuda_endpoints::{
    Context,
    driver::{Call, Code, Driver},
};

/// The environment variable that picks the backend.
pub const BACKEND_ENV: &str = "CUDA_ENDPOINTS_TEST_BACKEND";

/// Whether the suites run through the real backend on the double.
pub fn is_cuda() -> bool {
    std::env::var(BACKEND_ENV).is_ok_and(|v| v == "cuda")
}

/// The double's own symbols, loaded from the `libcuda.so.1` the backend
/// uses (the dynamic loader hands back the same object).
pub struct DoubleLib {
    lib: libloading::Library,
}

impl DoubleLib {
    /// The double, or why not (no `libcuda.so.1`, or one without `cuDouble*`).
    pub fn load() -> Result<&'static DoubleLib, String> {
        static LIB: OnceLock<Result<DoubleLib, String>> = OnceLock::new();
        LIB.get_or_init(|| {
            // SAFETY: loading libcuda runs its initialisers; the double's are
            // Rust statics only.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }
                .map_err(|e| format!("libcuda.so.1: {e}"))?;
            // SAFETY: only checks that the symbol exists.
            unsafe { lib.get::<unsafe extern "C" fn() -> u64>(b"cuDoubleFaultsFired") }
                .map_err(|_| "the libcuda.so.1 on the path is not the test double".to_owned())?;
            Ok(DoubleLib { lib })
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: every caller names a `cuDouble*` symbol with its real type.
        unsafe { *self.lib.get::<T>(name.as_bytes()).expect(name) }
    }

    fn text(&self, name: &str) -> String {
        let f: unsafe extern "C" fn(*mut c_char, usize) -> usize = self.sym(name);
        // SAFETY: null buffer: only the length is returned.
        let n = unsafe { f(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; n + 1];
        // SAFETY: `buf` has `n + 1` writable bytes.
        unsafe { f(buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n);
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn with_str<R>(&self, name: &str, arg: &str, conv: impl FnOnce(c_int) -> R) -> R {
        let f: unsafe extern "C" fn(*const c_char) -> c_int = self.sym(name);
        let s = CString::new(arg).expect("no NUL");
        // SAFETY: a valid NUL-terminated string.
        conv(unsafe { f(s.as_ptr()) })
    }

    /// Replaces the double's node with `config`.
    pub fn reset(&self, config: &ModelConfig) {
        self.with_str("cuDoubleReset", &encode(config), |rc| {
            assert_eq!(rc, 0, "cuDoubleReset refused {}", encode(config))
        });
    }

    /// The model's leak counters and the retained primary contexts.
    pub fn live(&self) -> (Live, u64) {
        let f: unsafe extern "C" fn(*mut u64, usize) -> usize = self.sym("cuDoubleLiveCounters");
        let mut v = [0u64; 12];
        // SAFETY: room for 12.
        unsafe { f(v.as_mut_ptr(), v.len()) };
        let live = Live {
            ids: v[0],
            endpoints: v[1],
            bindings: v[2],
            allocations: v[3],
            mappings: v[4],
            address_ranges: v[5],
            multicast_objects: v[6],
            streams: v[8],
            events: v[9],
            graphs: v[10],
            graph_execs: v[11],
        };
        (live, v[7])
    }

    /// Where on a model fabric this process runs, when the double is a
    /// fabric's process (`CUDA_ENDPOINTS_FABRIC`, double/src/node.rs).
    pub fn fabric_place(&self) -> Option<FabricPlace> {
        let f: unsafe extern "C" fn(*mut i64, usize) -> usize = self.sym("cuDoubleFabricPlace");
        let mut v = [0i64; 6];
        // SAFETY: room for 6.
        let n = unsafe { f(v.as_mut_ptr(), v.len()) };
        (n == v.len()).then_some(FabricPlace {
            pid: v[0],
            node: v[1],
            nodes: v[2],
            devices: v[3],
            device: v[4],
            imex_channel: v[5] != 0,
        })
    }

    /// The violation log: the model's, and the double's own (rules
    /// starting with `double:`; their call is named in the rule text).
    pub fn violations(&self) -> Vec<(String, String, u32)> {
        self.text("cuDoubleViolations")
            .lines()
            .filter_map(|l| {
                let mut it = l.split('\t');
                Some((
                    it.next()?.to_owned(),
                    it.next()?.to_owned(),
                    it.next()?.parse().ok()?,
                ))
            })
            .collect()
    }

    /// Calls of the entry point `name` (`cuda.h` name, no `_v2`) since load.
    pub fn call_count(&self, name: &str) -> u64 {
        let f: unsafe extern "C" fn(*const c_char) -> u64 = self.sym("cuDoubleCallCount");
        let s = CString::new(name).expect("no NUL");
        // SAFETY: a valid string.
        unsafe { f(s.as_ptr()) }
    }

    /// `name count` lines for every entry point called since load.
    pub fn call_table(&self) -> String {
        self.text("cuDoubleCallTable")
    }

    /// [`DoubleLib::call_table`] as a map.
    pub fn call_counts(&self) -> HashMap<String, u64> {
        self.call_table()
            .lines()
            .filter_map(|l| {
                let (n, c) = l.split_once('\t')?;
                Some((n.to_owned(), c.parse().ok()?))
            })
            .collect()
    }

    /// The calls that reached the double's model since the last reset.
    pub fn trace(&self) -> Vec<Call> {
        self.text("cuDoubleTrace")
            .lines()
            .filter_map(Call::from_name)
            .collect()
    }

    /// Installs faults (the double's text form, see `double/src/extra.rs`).
    pub fn set_faults(&self, spec: &str) {
        self.with_str("cuDoubleSetFaults", spec, |rc| {
            assert_eq!(rc, 0, "cuDoubleSetFaults refused {spec}")
        });
    }

    /// Planned faults fired so far.
    pub fn faults_fired(&self) -> u64 {
        let f: extern "C" fn() -> u64 = self.sym("cuDoubleFaultsFired");
        f()
    }

    /// Bitmasks of the devices whose primary context was retained, and was
    /// made current, since the last reset.
    pub fn contexts(&self) -> (u64, u64) {
        let f: unsafe extern "C" fn(*mut u64, *mut u64) -> c_int = self.sym("cuDoubleContexts");
        let (mut r, mut c) = (0, 0);
        // SAFETY: two writable `u64`s.
        unsafe { f(&mut r, &mut c) };
        (r, c)
    }

    /// Every `cuDevicePrimaryCtxRetain` of `dev` fails with `code` from now
    /// on (`0`: off again).
    pub fn fail_retain(&self, dev: i32, code: u32) {
        let f: extern "C" fn(c_int, c_int) -> c_int = self.sym("cuDoubleFailRetain");
        let code = c_int::try_from(code).expect("a CUresult fits an int");
        assert_eq!(f(dev, code), 0, "cuDoubleFailRetain refused {code}");
    }

    /// Switches a misbehaviour on (`"none"`: all off).
    pub fn misbehave(&self, spec: &str) {
        self.with_str("cuDoubleMisbehave", spec, |rc| {
            assert_eq!(rc, 0, "cuDoubleMisbehave refused {spec}")
        });
    }

    /// Whether the library exports `name` (`dlsym`).
    pub fn exports(&self, name: &str) -> bool {
        // SAFETY: only looks the symbol up.
        unsafe { self.lib.get::<*const ()>(name.as_bytes()) }.is_ok()
    }

    /// `cuGetProcAddress_v2(name, &pfn, version, 0, &status)`: `Ok` when
    /// found, else the result code and the status it wrote.
    pub fn proc_address(&self, name: &str, version: c_int) -> Result<(), (u32, u32)> {
        type GetProc = unsafe extern "C" fn(
            *const c_char,
            *mut *mut std::ffi::c_void,
            c_int,
            u64,
            *mut u32,
        ) -> u32;
        let f: GetProc = self.sym("cuGetProcAddress_v2");
        let s = CString::new(name).expect("no NUL");
        let mut pfn = std::ptr::null_mut();
        let mut status = 0u32;
        // SAFETY: valid string and out-pointers.
        let rc = unsafe { f(s.as_ptr(), &mut pfn, version, 0, &mut status) };
        if rc == 0 && !pfn.is_null() {
            Ok(())
        } else {
            Err((rc, status))
        }
    }

    /// Runs `f` with `dev`'s primary context current on this thread, as a
    /// program beside the library would (retain, set, restore, release).
    pub fn in_context<R>(&self, dev: i32, f: impl FnOnce() -> R) -> R {
        type Retain = unsafe extern "C" fn(*mut usize, c_int) -> u32;
        type Set = unsafe extern "C" fn(usize) -> u32;
        type Release = unsafe extern "C" fn(c_int) -> u32;
        let retain: Retain = self.sym("cuDevicePrimaryCtxRetain");
        let set: Set = self.sym("cuCtxSetCurrent");
        let release: Release = self.sym("cuDevicePrimaryCtxRelease_v2");
        let mut ctx = 0usize;
        // SAFETY: valid out-pointer; a context this function retained.
        unsafe {
            assert_eq!(retain(&mut ctx, dev), 0);
            assert_eq!(set(ctx), 0);
        }
        let r = f();
        // SAFETY: unbinds, then drops the reference taken above.
        unsafe {
            set(0);
            release(dev);
        }
        r
    }

    /// This thread's stream calls the double refused for want of a
    /// context, its stream calls made with none current (run in the
    /// stream's context), its `cuCtxGetCurrent` calls, and its copies
    /// refused in another device's context, since the thread began.
    pub fn thread_counts(&self) -> [u64; 4] {
        let f: unsafe extern "C" fn(*mut u64, usize) -> usize = self.sym("cuDoubleThreadCounts");
        let mut out = [0u64; 4];
        // SAFETY: four writable `u64`s.
        let n = unsafe { f(out.as_mut_ptr(), out.len()) };
        assert_eq!(n, 4);
        out
    }

    /// Until the next reset, the stream calls refuse a thread with no
    /// context current (`INVALID_CONTEXT`), as a stricter driver would.
    pub fn strict_streams(&self) {
        let f: extern "C" fn(c_int) -> c_int = self.sym("cuDoubleStrictStreams");
        assert_eq!(f(1), 0);
    }

    /// Retains `dev`'s primary context without making it current, as a
    /// program's own CUDA runtime would; [`DoubleLib::release_primary`] gives it back.
    pub fn retain_primary(&self, dev: i32) {
        type Retain = unsafe extern "C" fn(*mut usize, c_int) -> u32;
        let retain: Retain = self.sym("cuDevicePrimaryCtxRetain");
        let mut ctx = 0usize;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { retain(&mut ctx, dev) }, 0);
    }

    /// Drops one reference taken by [`DoubleLib::retain_primary`].
    pub fn release_primary(&self, dev: i32) {
        type Release = unsafe extern "C" fn(c_int) -> u32;
        let release: Release = self.sym("cuDevicePrimaryCtxRelease_v2");
        // SAFETY: gives back a reference this test took.
        assert_eq!(unsafe { release(dev) }, 0);
    }

    /// This thread's current context as the double sees it (0: none).
    pub fn current_context(&self) -> usize {
        let f: unsafe extern "C" fn(*mut usize) -> u32 = self.sym("cuCtxGetCurrent");
        let mut ctx = 0usize;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { f(&mut ctx) }, 0);
        ctx
    }

    /// What a broken backend would do: make `dev`'s primary context current
    /// for a moment.
    pub fn emulate_context_switch(&self, dev: i32) {
        self.in_context(dev, || ());
    }

    /// `cuMemsetD8_v2` in `dev`'s context.
    pub fn memset_d8(&self, dev: i32, ptr: u64, value: u8, n: usize) -> Result<(), Code> {
        let f: unsafe extern "C" fn(u64, u8, usize) -> u32 = self.sym("cuMemsetD8_v2");
        // SAFETY: plain values.
        self.in_context(dev, || {
            Code::from_raw(unsafe { f(ptr, value, n) }).map_or(Ok(()), Err)
        })
    }

    /// `cuMemcpyHtoD_v2` in `dev`'s context.
    pub fn memcpy_htod(&self, dev: i32, ptr: u64, bytes: &[u8]) -> Result<(), Code> {
        let f: unsafe extern "C" fn(u64, *const u8, usize) -> u32 = self.sym("cuMemcpyHtoD_v2");
        // SAFETY: `bytes` is readable for its length.
        self.in_context(dev, || {
            Code::from_raw(unsafe { f(ptr, bytes.as_ptr(), bytes.len()) }).map_or(Ok(()), Err)
        })
    }

    /// `cuMemcpyDtoH_v2` in `dev`'s context.
    pub fn memcpy_dtoh(&self, dev: i32, ptr: u64, len: usize) -> Result<Vec<u8>, Code> {
        let f: unsafe extern "C" fn(*mut u8, u64, usize) -> u32 = self.sym("cuMemcpyDtoH_v2");
        let mut out = vec![0u8; len];
        // SAFETY: `out` is writable for `len`.
        self.in_context(dev, || {
            Code::from_raw(unsafe { f(out.as_mut_ptr(), ptr, len) }).map_or(Ok(()), Err)
        })?;
        Ok(out)
    }

    /// Loads `name` on its own and calls its `cuInit(0)`: the code, or
    /// `None` when there is no such library.
    pub fn stub_init(name: &str) -> Option<u32> {
        // SAFETY: loading a libcuda runs its initialisers.
        let lib = unsafe { libloading::Library::new(name) }.ok()?;
        // SAFETY: `cuInit` has this prototype.
        let init = unsafe { lib.get::<unsafe extern "C" fn(u32) -> u32>(b"cuInit") }.ok()?;
        // SAFETY: flags 0.
        Some(unsafe { init(0) })
    }

    /// The path the double was loaded from.
    pub fn loaded_as(&self) -> String {
        self.text("cuDoubleLoadedAs")
    }

    /// Writes at a device address, as a kernel would.
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), Code> {
        let f: unsafe extern "C" fn(u64, *const u8, usize) -> u32 = self.sym("cuDoubleWrite");
        // SAFETY: `bytes` is readable for its length.
        Code::from_raw(unsafe { f(ptr, bytes.as_ptr(), bytes.len()) }).map_or(Ok(()), Err)
    }

    /// Reads at a device address.
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, Code> {
        let f: unsafe extern "C" fn(u64, *mut u8, usize) -> u32 = self.sym("cuDoubleRead");
        let mut out = vec![0u8; len];
        // SAFETY: `out` is writable for `len`.
        Code::from_raw(unsafe { f(ptr, out.as_mut_ptr(), len) }).map_or(Ok(out), Err)
    }
}

/// A process's place on a model fabric, as the double reports it.
#[derive(Clone, Copy, Debug)]
pub struct FabricPlace {
    /// Its number on the fabric.
    pub pid: i64,
    pub node: i64,
    pub nodes: i64,
    /// Devices of its node.
    pub devices: i64,
    /// Its device when placed by rank; -1: none.
    pub device: i64,
    pub imex_channel: bool,
}

/// The double's text form of a node (`double/src/config.rs`).
pub fn encode(c: &ModelConfig) -> String {
    let devices: Vec<String> = c
        .devices
        .iter()
        .map(|d| {
            let flags = u32::from(d.unicast)
                | u32::from(d.multicast) << 1
                | u32::from(d.counted_ops) << 2
                | u32::from(d.unicast_owner_access) << 3
                | u32::from(d.classic_multicast) << 4
                | u32::from(d.fabric) << 5
                | u32::from(d.le_fabric_handles) << 6;
            format!(
                "{}:{}:{}:{}:{}:{}:{}:{}",
                d.bind_alignment,
                d.max_size,
                d.granularity,
                d.recommended_granularity,
                d.memory,
                d.clique,
                d.host_numa_id,
                flags
            )
        })
        .collect();
    format!(
        "version={};queries={};max_ids={};fabric_memory={};devices={}",
        c.driver_version,
        c.queries_to_ready,
        c.max_ids,
        u8::from(c.fabric_memory_permitted),
        devices.join(",")
    )
}

/// One planned fault, for either backend.
#[derive(Clone, Copy, Debug)]
pub struct F {
    call: Option<Call>,
    nth: u64,
    times: u64,
    code: Code,
}

impl F {
    /// The `nth` call to `call` fails with `code`, once.
    pub fn nth(call: Call, nth: u64, code: Code) -> F {
        F {
            call: Some(call),
            nth,
            times: 1,
            code,
        }
    }
    /// Every call to `call` fails with `code`.
    pub fn always(call: Call, code: Code) -> F {
        F {
            call: Some(call),
            nth: 1,
            times: 0,
            code,
        }
    }
    /// The `nth` call of any kind fails with `code`, once.
    pub fn nth_any(nth: u64, code: Code) -> F {
        F {
            call: None,
            nth,
            times: 1,
            code,
        }
    }
    /// Fails `times` matching calls from the `nth` on.
    pub fn times(mut self, times: u64) -> F {
        self.times = times;
        self
    }
    fn fault(self) -> Fault {
        let f = match self.call {
            Some(c) => Fault::nth(c, self.nth, self.code),
            None => Fault::nth_any(self.nth, self.code),
        };
        f.times(if self.times == 0 {
            u64::MAX
        } else {
            self.times
        })
    }
    fn text(self) -> String {
        format!(
            "{} {} {} {}",
            self.call.map_or("*", |c| c.name()),
            self.nth,
            self.times,
            self.code.raw()
        )
    }
}

/// A process-wide turn on the double, released on drop.
struct Turn;

/// The thread holding the turn, if any.
static TURN: (Mutex<Option<std::thread::ThreadId>>, Condvar) = (Mutex::new(None), Condvar::new());

impl Turn {
    fn take() -> Turn {
        let me = std::thread::current().id();
        let mut holder = TURN.0.lock().unwrap_or_else(|e| e.into_inner());
        // Two nodes at once cannot be had on one double: say so instead of hanging.
        assert_ne!(
            *holder,
            Some(me),
            "a test asked for a second node while holding one; on the double there is one node per process"
        );
        while holder.is_some() {
            holder = TURN.1.wait(holder).unwrap_or_else(|e| e.into_inner());
        }
        *holder = Some(me);
        Turn
    }
}

/// The marker of the turn before's backend ([`Held`]), while it lives.
static LAST_BACKEND: Mutex<Option<Weak<()>>> = Mutex::new(None);

/// How long a turn waits for the backend of the turn before to go.
const LAST_BACKEND_GOES: Duration = Duration::from_secs(2);

impl Turn {
    /// Waits, at most [`LAST_BACKEND_GOES`], until the backend of the turn
    /// before is dropped, its primary contexts released ([`Held`]). A test's probe (and with it the turn) drops
    /// before its context (locals drop in reverse), so the context's
    /// backend, and the primary contexts it holds, may outlive the turn by
    /// a moment: a test that reads which devices are in use
    /// (`double::a_call_naming_no_device_before_…`) then saw the device
    /// before's too (about 1 run in 30). A test that leaked its context
    /// (`mem::forget` of a binding) costs the next turn the bound.
    fn after_the_last_backend(&self) {
        let last = LAST_BACKEND
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(last) = last else { return };
        let start = Instant::now();
        while last.strong_count() > 0 && start.elapsed() < LAST_BACKEND_GOES {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Notes the marker of this turn's backend, for the next turn.
    fn backend(&self, alive: &Arc<()>) {
        *LAST_BACKEND.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::downgrade(alive));
    }
}

/// The real backend on the double with a marker dropped after it (fields
/// drop in order): the next turn waits on the marker, which goes only once
/// the backend's drop released its primary contexts. (A `Weak` of the
/// backend itself reads no strong count before that drop runs.)
#[derive(Debug)]
struct Held {
    cuda: cuda_endpoints::driver::cuda::Cuda,
    _alive: Arc<()>,
}

impl Forward for Held {
    type Inner = cuda_endpoints::driver::cuda::Cuda;
    fn inner(&self) -> &Self::Inner {
        &self.cuda
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *TURN.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
        TURN.1.notify_one();
    }
}

/// What the rule tests read off either a [`Model`] or a [`Probe`].
pub trait Inspect {
    /// How many times `call` reached the driver.
    fn calls(&self, call: Call) -> u64;
    /// The violation log.
    fn violations(&self) -> Vec<Violation>;
    /// The leak counters.
    fn live(&self) -> Live;
    /// The leak counters of the whole node.
    fn live_node(&self) -> Live;
}

impl Inspect for Model {
    fn calls(&self, call: Call) -> u64 {
        Model::calls(self, call)
    }
    fn violations(&self) -> Vec<Violation> {
        Model::violations(self)
    }
    fn live(&self) -> Live {
        Model::live(self)
    }
    fn live_node(&self) -> Live {
        Model::live_node(self)
    }
}

impl Inspect for Probe {
    fn calls(&self, call: Call) -> u64 {
        Probe::calls(self, call)
    }
    fn violations(&self) -> Vec<Violation> {
        Probe::violations(self)
    }
    fn live(&self) -> Live {
        Probe::live(self)
    }
    fn live_node(&self) -> Live {
        Probe::live_node(self)
    }
}

enum Behind {
    Model(Model),
    /// The double, the turn, and its call counts when the probe was made.
    Double(&'static DoubleLib, Turn, HashMap<String, u64>),
}

/// What is behind a test's context: the model itself, or the double (with
/// the real backend in front). A [`Driver`] too, for raw calls.
pub struct Probe {
    behind: Behind,
    driver: Arc<dyn Driver>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Probe({})", self.driver.name())
    }
}

impl Forward for Probe {
    type Inner = dyn Driver + 'static;
    fn inner(&self) -> &(dyn Driver + 'static) {
        &*self.driver
    }
}

/// A context on the backend the environment picks, on a node made as
/// `config` says, and its probe.
pub fn context(config: ModelConfig) -> (Context, Probe) {
    context_over(config, Context::new)
}

/// As [`context`], with `wrap` making the context over the raw backend
/// (e.g. the classic fallback over it); the probe's raw calls go to the
/// raw backend itself.
pub fn context_over(
    config: ModelConfig,
    wrap: impl FnOnce(Arc<dyn Driver>) -> Context,
) -> (Context, Probe) {
    if !is_cuda() {
        let model = Model::new(config);
        let driver: Arc<dyn Driver> = Arc::new(model.clone());
        return (
            wrap(driver.clone()),
            Probe {
                behind: Behind::Model(model),
                driver,
            },
        );
    }
    let lib = DoubleLib::load().unwrap_or_else(|e| {
        panic!(
            "{BACKEND_ENV}=cuda needs the test double first on LD_LIBRARY_PATH (ci/double.sh): {e}"
        )
    });
    let turn = Turn::take();
    turn.after_the_last_backend();
    lib.reset(&config);
    let before = lib.call_counts();
    let cuda = cuda_endpoints::driver::cuda::Cuda::open().expect("Cuda::open() on the test double");
    let alive = Arc::new(());
    turn.backend(&alive);
    let driver: Arc<dyn Driver> = Arc::new(Held {
        cuda,
        _alive: alive,
    });
    (
        wrap(driver.clone()),
        Probe {
            behind: Behind::Double(lib, turn, before),
            driver,
        },
    )
}

/// A backend for raw calls only (no typed objects), on a node made as `config` says.
pub fn raw(config: ModelConfig) -> Probe {
    context(config).1
}

impl Probe {
    /// The raw backend's name: `"model"` or `"cuda"`.
    pub fn name(&self) -> String {
        self.driver.name()
    }

    /// The model itself, when the suites run on it (`None` on the double).
    pub fn model(&self) -> Option<&Model> {
        match &self.behind {
            Behind::Model(m) => Some(m),
            Behind::Double(..) => None,
        }
    }

    /// The double, when the suites run on it.
    pub fn double(&self) -> Option<&'static DoubleLib> {
        match &self.behind {
            Behind::Model(_) => None,
            Behind::Double(lib, _, _) => Some(lib),
        }
    }

    /// What the process still holds (the model's `Live`). On the double,
    /// also asserts nothing of the backend's own is left but its primary
    /// contexts (they go with the `Context`).
    pub fn live(&self) -> Live {
        match &self.behind {
            Behind::Model(m) => m.live(),
            Behind::Double(lib, _, _) => lib.live().0,
        }
    }

    /// What the whole node still holds (on the double: one process, so
    /// [`Probe::live`]).
    pub fn live_node(&self) -> Live {
        match &self.behind {
            Behind::Model(m) => m.live_node(),
            Behind::Double(lib, _, _) => lib.live().0,
        }
    }

    /// How many times `call` reached the driver (on the double: since the
    /// probe was made).
    pub fn calls(&self, call: Call) -> u64 {
        match &self.behind {
            Behind::Model(m) => m.calls(call),
            Behind::Double(lib, _, before) => {
                lib.call_count(call.name()) - before.get(call.name()).copied().unwrap_or(0)
            }
        }
    }

    /// Every rule violation that reached the driver, in order (on the
    /// double, its own come last with the call named in the rule).
    pub fn violations(&self) -> Vec<Violation> {
        match &self.behind {
            Behind::Model(m) => m.violations(),
            Behind::Double(lib, _, _) => lib
                .violations()
                .into_iter()
                .map(|(call, rule, code)| {
                    let (call, rule) = match Call::from_name(&call) {
                        Some(c) => (c, rule),
                        // The double's own, on a call outside the table (cuCtxSetCurrent...).
                        None => (Call::DriverGetVersion, format!("{rule} ({call})")),
                    };
                    Violation {
                        call,
                        rule: Box::leak(rule.into_boxed_str()),
                        code: Code::from_raw(code).unwrap_or(Code::UNKNOWN),
                    }
                })
                .collect(),
        }
    }

    /// Every call that reached the model, in order.
    pub fn trace(&self) -> Vec<Call> {
        match &self.behind {
            Behind::Model(m) => m.trace(),
            Behind::Double(lib, _, _) => lib.trace(),
        }
    }

    /// Installs `faults` (replacing any earlier plan).
    pub fn set_faults(&self, faults: &[F]) {
        match &self.behind {
            Behind::Model(m) => m.set_faults(
                faults
                    .iter()
                    .fold(FaultPlan::none(), |p, f| p.with(f.fault())),
            ),
            Behind::Double(lib, _, _) => {
                let spec: Vec<String> = faults.iter().map(|f| f.text()).collect();
                lib.set_faults(&spec.join(";"));
            }
        }
    }

    /// Fails about `per_mille` of all calls but teardown ones
    /// (`faults::TEARDOWN`), with codes the SPEC allows each, from `seed`.
    pub fn set_random_faults(&self, seed: u64, per_mille: u32) {
        match &self.behind {
            Behind::Model(m) => m.set_faults(FaultPlan::none().random_except(
                seed,
                per_mille,
                cuda_endpoints::model::faults::TEARDOWN,
            )),
            Behind::Double(lib, _, _) => lib.set_faults(&format!("random {seed} {per_mille}")),
        }
    }

    /// Planned faults fired so far.
    pub fn faults_fired(&self) -> u64 {
        match &self.behind {
            Behind::Model(m) => m.faults_fired(),
            Behind::Double(lib, _, _) => lib.faults_fired(),
        }
    }

    /// Writes at a device address, as a kernel would.
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), Code> {
        match &self.behind {
            Behind::Model(m) => m.write(ptr, bytes),
            Behind::Double(lib, _, _) => lib.write(ptr, bytes),
        }
    }

    /// Reads at a device address.
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, Code> {
        match &self.behind {
            Behind::Model(m) => m.read(ptr, len),
            Behind::Double(lib, _, _) => lib.read(ptr, len),
        }
    }
}

/// A copy's enqueue and its wait as a value two ways of making the same
/// copy compare by: `Ok(())`, or the error as `Debug` prints it (its
/// variant, op and values).
pub fn copy_outcome(r: cuda_endpoints::Result<cuda_endpoints::InFlight<'_>>) -> Result<(), String> {
    r.and_then(|t| t.wait())
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

/// How many copies reached the driver on either path: fabric batches,
/// `cuMemcpyAsync` and `cuMemcpyBatchAsync`.
pub fn copy_calls(model: &impl Inspect) -> u64 {
    [
        Call::FabricCpyBatchAsync,
        Call::MemcpyAsync,
        Call::MemcpyBatchAsync,
    ]
    .map(|c| model.calls(c))
    .iter()
    .sum()
}

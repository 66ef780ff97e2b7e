//! The double's process-wide state: the node behind the entry points (its
//! own reference model or a model fabric's process, [`crate::node`]), the driver version it pretends to be, primary contexts and the
//! per-thread current context, per-call counters, its own violation log and
//! the deliberate misbehaviours that the catch tests switch on.
//!
//! Everything sits behind one mutex; [`enter`] wraps every exported call.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cuda_endpoints::model::{Model, ModelConfig};

use crate::abi::CUresult;
use crate::config;
use crate::node::{self, Node};

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const NOT_INITIALIZED: CUresult = 3;
pub const STUB_LIBRARY: CUresult = 34;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_CONTEXT: CUresult = 201;
pub const INVALID_HANDLE: CUresult = 400;
pub const NOT_FOUND: CUresult = 500;
pub const NOT_READY: CUresult = 600;
pub const NOT_SUPPORTED: CUresult = 801;
pub const UNKNOWN: CUresult = 999;

/// Deliberate misbehaviour: the double reads or writes an argument the way a
/// backend with a wrong declaration would, so that a test can show the
/// suite notices (`cuDoubleMisbehave`, env `CUDA_DOUBLE_MISBEHAVE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misbehave {
    /// `cuLogicalEndpointBindMem`/`BindAddr` read `offset` and `size` swapped (argument order).
    pub swap_bind_offset_size: bool,
    /// `cuMemMap` reads `ptr` as 32 bits (argument width).
    pub narrow_map_ptr: bool,
    /// `cuLogicalEndpointIdReserve` writes a base one past the real one (out-parameter).
    pub wrong_reserve_out: bool,
}

impl Misbehave {
    pub fn parse(spec: &str) -> Option<Misbehave> {
        let mut m = Misbehave::default();
        for w in spec.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "swap-bind-offset-size" => m.swap_bind_offset_size = true,
                "narrow-map-ptr" => m.narrow_map_ptr = true,
                "wrong-reserve-out" => m.wrong_reserve_out = true,
                "none" => {}
                _ => return None,
            }
        }
        Some(m)
    }
}

/// The node the double simulates.
pub struct Double {
    pub node: Node,
    /// `cuDriverGetVersion`.
    pub version: i32,
    pub devices: usize,
    /// Retain count of each device's primary context.
    pub ctx_refs: Vec<u32>,
    /// Devices whose primary context was ever retained (since the last reset).
    pub retained_mask: u64,
    /// Devices whose primary context was ever made current (since the last reset).
    pub current_mask: u64,
    /// The double's own violations: `(call, rule, code)`.
    pub violations: Vec<(String, String, CUresult)>,
    pub misbehave: Misbehave,
    /// `cuDevicePrimaryCtxRetain` of this device fails with this code
    /// (`cuDoubleFailRetain`).
    pub retain_fault: Option<(i32, CUresult)>,
    /// The stream calls refuse a thread with no context current
    /// (`cuDoubleStrictStreams`), as a driver stricter than those CCCL
    /// reports on; else they run in the stream's context then.
    pub strict_streams: bool,
    /// Each live stream's device (`cuStreamCreate`: the current context's),
    /// for `cuStreamGetCtx` and the check of a copy's context.
    pub streams: BTreeMap<u64, i32>,
    /// The virtual address ranges this process reserved
    /// (`cuMemAddressReserve`, start → size) and has not freed: CUDA's part
    /// of the unified address space. An address outside every one is host
    /// memory to `cuMemcpyAsync` ([`Double::in_device_va`]).
    pub reserved: BTreeMap<u64, u64>,
}

impl Double {
    pub fn new(cfg: ModelConfig) -> Double {
        let (version, devices) = (cfg.driver_version, cfg.devices.len());
        Double::on(Node::Local(Model::new(cfg)), version, devices)
    }

    /// The node the environment asks for: a fabric's process when one is
    /// named ([`node::fabric_requested`]), else a model of its own.
    pub fn from_env() -> Double {
        if !node::fabric_requested() {
            return Double::new(config::from_env());
        }
        let n = node::join_fabric();
        // The fabric's node decides the version and the devices.
        // SAFETY: a version query touches nothing anyone owns.
        let version = n.call(|d| unsafe { d.driver_version() }).unwrap_or(0);
        let devices = match &n {
            Node::Fabric(p) => usize::try_from(p.devices()).unwrap_or(0).min(64),
            _ => 0,
        };
        Double::on(n, version, devices)
    }

    fn on(node: Node, version: i32, devices: usize) -> Double {
        Double {
            version,
            node,
            devices,
            ctx_refs: vec![0; devices.max(64)],
            retained_mask: 0,
            current_mask: 0,
            violations: Vec::new(),
            misbehave: Misbehave::parse(
                &std::env::var("CUDA_DOUBLE_MISBEHAVE").unwrap_or_default(),
            )
            .unwrap_or_default(),
            retain_fault: None,
            strict_streams: false,
            streams: BTreeMap::new(),
            reserved: BTreeMap::new(),
        }
    }

    /// Whether `[ptr, ptr+len)` (at least one byte) touches a virtual
    /// address range this process reserved: device (or mapped host-NUMA)
    /// memory as unified addressing sees it, mapped or not, which the
    /// double never reads or writes itself (the model decides what it is).
    pub fn in_device_va(&self, ptr: u64, len: u64) -> bool {
        let end = ptr.saturating_add(len.max(1));
        // The last range starting before `end` is the only one that can
        // reach into `[ptr, end)` (ranges never overlap).
        self.reserved
            .range(..end)
            .next_back()
            .is_some_and(|(&start, &size)| start.saturating_add(size) > ptr)
    }

    /// Logs one of the double's own violations and returns its code.
    pub fn violate(&mut self, call: &str, rule: &str, code: CUresult) -> CUresult {
        self.violations
            .push((call.to_owned(), rule.to_owned(), code));
        code
    }

    /// The device whose primary context is current on this thread, or the
    /// code a driver gives without one (`INVALID_CONTEXT`, logged: the
    /// backend must make a context current for this call).
    pub fn current_device(&mut self, call: &str) -> Result<i32, CUresult> {
        match context_device(CURRENT.with(Cell::get)) {
            Some(d) if self.ctx_refs.get(d as usize).copied().unwrap_or(0) > 0 => Ok(d),
            Some(_) => Err(self.violate(
                call,
                "double: current context was released",
                INVALID_CONTEXT,
            )),
            None => Err(self.violate(call, "double: no current context", INVALID_CONTEXT)),
        }
    }

    /// [`Double::current_device`] for a call on `stream`, which a backend
    /// may make with no context current (the stream names its own): then
    /// it runs in the stream's context, as CCCL reports of recent drivers
    /// (NVIDIA/cccl#9615), or, with [`Double::strict_streams`],
    /// is refused (`INVALID_CONTEXT`); either counted on this thread
    /// ([`THREAD_COUNTS`]), neither logged. A copy (`copy`) made with
    /// another device's context current is refused (`INVALID_VALUE`,
    /// counted as `foreign`): CCCL reports that drivers check a copy's
    /// pointers against the current context, not the stream's
    /// (NVIDIA/cccl#9615, #9997). A stream's query and synchronize are not.
    pub fn stream_context(&mut self, call: &str, stream: u64, copy: bool) -> Result<(), CUresult> {
        if CURRENT.with(Cell::get) != 0 {
            let dev = self.current_device(call)?;
            if copy && self.streams.get(&stream).is_some_and(|&s| s != dev) {
                count(|n| n.foreign += 1);
                return Err(INVALID_VALUE);
            }
            return Ok(());
        }
        if self.strict_streams {
            count(|n| n.refused += 1);
            return Err(INVALID_CONTEXT);
        }
        count(|n| n.without += 1);
        Ok(())
    }

    pub fn check_device(&self, dev: i32) -> Result<(), CUresult> {
        if dev >= 0 && (dev as usize) < self.devices {
            Ok(())
        } else {
            Err(INVALID_DEVICE)
        }
    }
}

/// Per thread: its stream calls refused for want of a context and those
/// made with none current (run in the stream's context), both
/// [`Double::stream_context`], its `cuCtxGetCurrent` calls, and its copies
/// refused in another device's context.
#[derive(Clone, Copy, Debug)]
pub struct ThreadCounts {
    pub refused: u64,
    pub without: u64,
    pub asked: u64,
    pub foreign: u64,
}

/// Fake `CUcontext` values: `CTX_BASE + 16 * device`, never dereferenced.
pub const CTX_BASE: usize = 0xC7C0_0000;

pub fn context_handle(dev: i32) -> usize {
    CTX_BASE + 16 * dev as usize
}

pub fn context_device(ctx: usize) -> Option<i32> {
    if ctx < CTX_BASE || !(ctx - CTX_BASE).is_multiple_of(16) {
        return None;
    }
    i32::try_from((ctx - CTX_BASE) / 16)
        .ok()
        .filter(|&d| d < 64)
}

thread_local! {
    /// This thread's current context (a fake handle; 0 for none).
    pub static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// What this thread's calls met ([`ThreadCounts`]).
    pub static THREAD_COUNTS: Cell<ThreadCounts> = const { Cell::new(ThreadCounts { refused: 0, without: 0, asked: 0, foreign: 0 }) };
}

/// Counts one thing this thread's call met ([`THREAD_COUNTS`]).
pub fn count(what: impl FnOnce(&mut ThreadCounts)) {
    THREAD_COUNTS.with(|c| {
        let mut n = c.get();
        what(&mut n);
        c.set(n);
    });
}

static STATE: Mutex<Option<Double>> = Mutex::new(None);
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
/// Of [`CALLS`], those that returned a code other than `CUDA_SUCCESS`.
static FAILED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Runs `f` on the double, built from the environment on first use.
pub fn with<R>(f: impl FnOnce(&mut Double) -> R) -> R {
    let mut g: MutexGuard<'_, Option<Double>> = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let d = g.get_or_insert_with(Double::from_env);
    f(d)
}

/// The node, to call outside the lock.
pub fn node() -> Node {
    with(|d| d.node.clone())
}

/// Whether this process is on a model fabric.
pub fn on_fabric() -> bool {
    with(|d| !matches!(d.node, Node::Local(_)))
}

/// Replaces the simulated node (a fresh model, masks and log cleared).
/// Primary-context retain counts survive: they belong to the backends that
/// are still alive, not to the node. Refused (`false`) on a fabric: the
/// node is the fabric's, shared with other processes.
pub fn reset(cfg: ModelConfig) -> bool {
    if on_fabric() {
        return false;
    }
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let refs = g.as_ref().map(|d| d.ctx_refs.clone());
    let misbehave = g.as_ref().map(|d| d.misbehave);
    let mut d = Double::new(cfg);
    if let Some(r) = refs {
        d.ctx_refs = r;
    }
    if let Some(m) = misbehave {
        d.misbehave = m;
    }
    *g = Some(d);
    true
}

pub fn set_initialized() {
    INITIALIZED.store(true, Ordering::SeqCst);
}

/// Counts per `cuda.h` name (`_v2` dropped, so `cuMemGetInfo_v2` counts as
/// `cuMemGetInfo`, the name the library's `Call` uses; kept where the
/// `Call` name has it: `cuStreamDestroy_v2`).
pub fn call_counts() -> BTreeMap<&'static str, u64> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Of [`call_counts`], how many failed, per name.
pub fn failure_counts() -> BTreeMap<&'static str, u64> {
    FAILED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The name a symbol is counted under: the call table's name where it has
/// one (`cuStreamDestroy_v2` is a row as such), else without `_v2`.
fn base_name(symbol: &'static str) -> &'static str {
    if cuda_endpoints::driver::Call::from_name(symbol).is_some() {
        return symbol;
    }
    symbol.strip_suffix("_v2").unwrap_or(symbol)
}

/// Whether this copy of the library was loaded under the unversioned name
/// `libcuda.so`: then it plays the CUDA toolkit's stub library, which every
/// real installation has under that name and which answers
/// `CUDA_ERROR_STUB_LIBRARY` to everything. A backend that loads
/// `libcuda.so` before `libcuda.so.1` finds the stub.
pub fn is_stub() -> bool {
    static STUB: OnceLock<bool> = OnceLock::new();
    *STUB.get_or_init(|| {
        crate::extra::loaded_path()
            .and_then(|p| p.rsplit('/').next().map(|n| n == "libcuda.so"))
            .unwrap_or(false)
    })
}

/// The wrapper of every exported `cu*` call: counts it, plays the stub if
/// loaded as one, refuses calls before `cuInit` (when `needs_init`), and
/// runs `body` with panics caught.
pub fn enter(
    symbol: &'static str,
    needs_init: bool,
    body: impl FnOnce() -> Result<(), CUresult>,
) -> CUresult {
    let run = AssertUnwindSafe(|| {
        {
            let mut c = CALLS.lock().unwrap_or_else(|e| e.into_inner());
            *c.entry(base_name(symbol)).or_insert(0) += 1;
        }
        if is_stub() {
            return STUB_LIBRARY;
        }
        if needs_init && !INITIALIZED.load(Ordering::SeqCst) {
            return with(|d| d.violate(symbol, "double: called before cuInit", NOT_INITIALIZED));
        }
        match body() {
            Ok(()) => SUCCESS,
            Err(code) => code,
        }
    });
    let rc = catch_unwind(run).unwrap_or(UNKNOWN);
    if rc != SUCCESS {
        let mut f = FAILED.lock().unwrap_or_else(|e| e.into_inner());
        *f.entry(base_name(symbol)).or_insert(0) += 1;
    }
    rc
}

/// At exit (or unload), appends this process's call counts to the file named
/// by `CUDA_DOUBLE_COUNTS`, `name calls failed` per line, so that CI can sum
/// them over every process it ran.
extern "C" fn dump_counts() {
    let _ = catch_unwind(|| {
        let Ok(path) = std::env::var("CUDA_DOUBLE_COUNTS") else {
            return;
        };
        let failed = failure_counts();
        let mut text = String::new();
        for (n, c) in call_counts() {
            let f = failed.get(n).copied().unwrap_or(0);
            text.push_str(&format!("{n} {c} {f}\n"));
        }
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(text.as_bytes());
        }
    });
}

/// At exit, a process on a model fabric appends the double's own
/// violations (contexts, calls before `cuInit`: what only the C side sees)
/// to the file named by `CUDA_DOUBLE_VIOLATIONS`, `os-pid call rule code`
/// per line: the fabric's model keeps the log of the rules, one for every
/// process, but the double's own log dies with its process. Nothing is
/// written for a process that never used the double, or off a fabric
/// (there the tests read the log through `cuDoubleViolations`).
extern "C" fn dump_violations() {
    let _ = catch_unwind(|| {
        let Ok(path) = std::env::var("CUDA_DOUBLE_VIOLATIONS") else {
            return;
        };
        // Never start the double (or join a fabric) at exit: only look.
        let g = STATE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref().filter(|d| !matches!(d.node, Node::Local(_))) else {
            return;
        };
        let pid = std::process::id();
        let text: String = d
            .violations
            .iter()
            .map(|(c, r, code)| format!("{pid}\t{c}\t{r}\t{code}\n"))
            .collect();
        drop(g);
        if text.is_empty() {
            return;
        }
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(text.as_bytes());
        }
    });
}

/// Registers [`dump_counts`] and [`dump_violations`] as ELF finalisers.
#[used]
#[unsafe(link_section = ".fini_array")]
static DUMP_AT_EXIT: extern "C" fn() = dump_counts;
#[used]
#[unsafe(link_section = ".fini_array")]
static DUMP_VIOLATIONS_AT_EXIT: extern "C" fn() = dump_violations;

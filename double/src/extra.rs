//! The double's own symbols (`cuDouble*`, not in `cuda.h`), for tests and CI:
//! reconfigure the node, read live counters, the violation log, per-call
//! counters and which contexts were used, install faults, switch on a
//! misbehaviour, say where on a model fabric the process runs, and print
//! the ABI check. Text goes out through
//! caller-provided buffers: each returns the length it needs (without the
//! NUL) and writes a NUL-terminated prefix that fits.

use std::ffi::{CStr, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use cuda_endpoints::driver::Code;
use cuda_endpoints::model::faults::{Fault, FaultPlan};

use crate::state::{self, Misbehave};

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

fn text_in<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null NUL-terminated string from the caller.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

fn text_out(s: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = s.len().min(len - 1);
        // SAFETY: the caller gave `len` writable bytes at `buf`; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    s.len()
}

/// The path this library was loaded from, read off `/proc/self/maps`.
pub fn loaded_path() -> Option<String> {
    let here = loaded_path as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (lo, hi) = it.next()?.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        let path = it.nth(4)?;
        (lo <= here && here < hi).then(|| path.to_owned())
    })
}

/// Replaces the simulated node (text form of [`crate::config`]; null: from
/// the environment again). 0 on success, -1 when the text is unreadable or
/// the double is a fabric's process (the node is shared, [`crate::node`]).
///
/// # Safety
/// `config` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleReset(config: *const c_char) -> c_int {
    guard(-1, || {
        let cfg = if config.is_null() {
            Some(crate::config::from_env())
        } else {
            text_in(config).and_then(crate::config::parse)
        };
        match cfg.map(state::reset) {
            Some(true) => 0,
            _ => -1,
        }
    })
}

/// Writes up to `n` of: ids, endpoints, bindings, allocations, mappings,
/// address ranges, multicast objects (the model's `Live`, this process),
/// retained primary-context references, then streams, events, graphs and
/// executable graphs (the model's `Live` again: appended, so that a reader
/// of the first 8 still reads them). Returns how many there are (12), or 0
/// when the node did not answer (a fabric gone).
///
/// # Safety
/// `out` is null or has room for `n` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleLiveCounters(out: *mut u64, n: usize) -> usize {
    guard(0, || {
        let (node, refs) = state::with(|d| {
            (
                d.node.clone(),
                d.ctx_refs.iter().map(|&r| u64::from(r)).sum::<u64>(),
            )
        });
        let Ok(l) = node.live() else { return 0 };
        let v = [
            l.ids,
            l.endpoints,
            l.bindings,
            l.allocations,
            l.mappings,
            l.address_ranges,
            l.multicast_objects,
            refs,
            l.streams,
            l.events,
            l.graphs,
            l.graph_execs,
        ];
        if !out.is_null() {
            for (i, x) in v.iter().take(n).enumerate() {
                // SAFETY: `i < n`, and the caller gave room for `n`.
                unsafe { *out.add(i) = *x };
            }
        }
        v.len()
    })
}

/// The violation log, one `call rule code` per line (the model's, then the
/// double's own, whose rules start with `double:`). On a fabric the model's
/// log is the whole fabric's (every process), the double's own this process's.
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleViolations(buf: *mut c_char, len: usize) -> usize {
    guard(0, || {
        let mut text = String::new();
        for (c, r, code) in state::node().violations() {
            text.push_str(&format!("{c}\t{r}\t{code}\n"));
        }
        state::with(|d| {
            for (c, r, code) in &d.violations {
                text.push_str(&format!("{c}\t{r}\t{code}\n"));
            }
        });
        text_out(&text, buf, len)
    })
}

/// Installs a fault plan, one fault per `;`: `NAME nth times code` (`NAME`
/// a `cuda.h` name or `*` for any call, `times` 0 for always), or
/// `random seed per_mille` (any call but teardown). Empty: no faults.
/// On a fabric the plan is the fabric's (every process's).
/// 0 on success, -1 when the text is unreadable or the fabric refused.
///
/// # Safety
/// `spec` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleSetFaults(spec: *const c_char) -> c_int {
    guard(-1, || {
        let Some(spec) = text_in(spec) else { return -1 };
        let Some(plan) = parse_faults(spec) else {
            return -1;
        };
        if state::node().set_faults(plan) {
            0
        } else {
            -1
        }
    })
}

fn parse_faults(spec: &str) -> Option<FaultPlan> {
    let mut plan = FaultPlan::none();
    for f in spec.split(';').map(str::trim).filter(|f| !f.is_empty()) {
        let w: Vec<&str> = f.split_whitespace().collect();
        match w.as_slice() {
            ["random", seed, per_mille] => {
                plan = plan.random_except(
                    seed.parse().ok()?,
                    per_mille.parse().ok()?,
                    cuda_endpoints::model::faults::TEARDOWN,
                );
            }
            [name, nth, times, code] => {
                let code = Code::from_raw(code.parse().ok()?)?;
                let nth: u64 = nth.parse().ok()?;
                let times: u64 = times.parse().ok()?;
                let fault = if *name == "*" {
                    Fault::nth_any(nth, code)
                } else {
                    Fault::nth(cuda_endpoints::driver::Call::from_name(name)?, nth, code)
                };
                plan = plan.with(fault.times(if times == 0 { u64::MAX } else { times }));
            }
            _ => return None,
        }
    }
    Some(plan)
}

/// How many planned faults fired since they were installed (0 on a
/// fabric, which does not say).
#[unsafe(no_mangle)]
pub extern "C" fn cuDoubleFaultsFired() -> u64 {
    guard(0, || state::node().faults_fired())
}

/// How many times the entry point `name` (a `cuda.h` name without `_v2`)
/// was called since the library was loaded; never reset.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleCallCount(name: *const c_char) -> u64 {
    guard(0, || {
        let Some(name) = text_in(name) else { return 0 };
        state::call_counts().get(name).copied().unwrap_or(0)
    })
}

/// Every entry point's call count, `name count` per line, in name order.
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleCallTable(buf: *mut c_char, len: usize) -> usize {
    guard(0, || {
        let mut s = String::new();
        for (n, c) in state::call_counts() {
            s.push_str(&format!("{n}\t{c}\n"));
        }
        text_out(&s, buf, len)
    })
}

/// The calling thread's counts: stream calls refused for want of a
/// context (`out[0]`), stream calls made with none current, run in the
/// stream's context (`out[1]`), `cuCtxGetCurrent` calls (`out[2]`), and
/// copies refused in another device's context (`out[3]`).
/// Writes up to `n` of them and returns how many it wrote.
///
/// # Safety
/// `out` is null or has `n` writable `u64`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleThreadCounts(out: *mut u64, n: usize) -> usize {
    guard(0, || {
        let t = state::THREAD_COUNTS.with(std::cell::Cell::get);
        let counts = [t.refused, t.without, t.asked, t.foreign];
        if out.is_null() {
            return 0;
        }
        let k = n.min(counts.len());
        // SAFETY: the caller gives `n` writable `u64`s at `out`; `k <= n`.
        unsafe { std::ptr::copy_nonoverlapping(counts.as_ptr(), out, k) };
        k
    })
}

/// Bitmasks of the devices whose primary context was retained and was made
/// current since the last reset (bit `d` for device `d`). 0, or -1 on a
/// null pointer.
///
/// # Safety
/// Both pointers are null or point to a writable `u64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleContexts(retained: *mut u64, made_current: *mut u64) -> c_int {
    guard(-1, || {
        if retained.is_null() || made_current.is_null() {
            return -1;
        }
        let (r, c) = state::with(|d| (d.retained_mask, d.current_mask));
        // SAFETY: both non-null, writable by the contract.
        unsafe {
            *retained = r;
            *made_current = c;
        }
        0
    })
}

/// Switches misbehaviours on (comma-separated: `swap-bind-offset-size`,
/// `narrow-map-ptr`, `wrong-reserve-out`; `none` or empty: all off).
/// 0, or -1 for an unknown word.
///
/// # Safety
/// `spec` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleMisbehave(spec: *const c_char) -> c_int {
    guard(-1, || match text_in(spec).and_then(Misbehave::parse) {
        Some(m) => {
            state::with(|d| d.misbehave = m);
            0
        }
        None => -1,
    })
}

/// From now on (`on` non-zero) until the next reset, the stream calls
/// (copies, query, synchronize) refuse a thread with no context current
/// (`INVALID_CONTEXT`), as a driver stricter than those CCCL reports on;
/// `on` 0: they run in the stream's context then (the default). 0.
#[unsafe(no_mangle)]
pub extern "C" fn cuDoubleStrictStreams(on: c_int) -> c_int {
    guard(-1, || {
        state::with(|d| d.strict_streams = on != 0);
        0
    })
}

/// From now on `cuDevicePrimaryCtxRetain(_, dev)` fails with `code` (a
/// device whose context cannot be had: exclusive compute mode, a GPU
/// fallen off the bus); `code` 0 switches it off. 0, or -1 for a negative code.
#[unsafe(no_mangle)]
pub extern "C" fn cuDoubleFailRetain(dev: c_int, code: c_int) -> c_int {
    guard(-1, || {
        let Ok(code) = u32::try_from(code) else {
            return -1;
        };
        state::with(|d| d.retain_fault = (code != 0).then_some((dev, code)));
        0
    })
}

/// Writes `len` bytes at device address `ptr`, as a kernel would (no
/// context, not counted as a driver call). 0, or the model's code.
///
/// # Safety
/// `src` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleWrite(ptr: u64, src: *const u8, len: usize) -> u32 {
    guard(999, || {
        if src.is_null() {
            return 1;
        }
        // SAFETY: the caller gave `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src, len) };
        state::node().write(ptr, bytes).err().unwrap_or(0)
    })
}

/// Reads `len` bytes at device address `ptr` into `dst`. 0, or the model's code.
///
/// # Safety
/// `dst` has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleRead(ptr: u64, dst: *mut u8, len: usize) -> u32 {
    guard(999, || {
        if dst.is_null() {
            return 1;
        }
        match state::node().read(ptr, len) {
            Ok(b) => {
                // SAFETY: the caller gave `len` writable bytes; `b` has `len`.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, len.min(b.len())) };
                0
            }
            Err(c) => c,
        }
    })
}

/// The path this copy of the library was loaded from.
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleLoadedAs(buf: *mut c_char, len: usize) -> usize {
    guard(0, || text_out(&loaded_path().unwrap_or_default(), buf, len))
}

/// The C file that checks this build's prototypes and layouts against
/// `cuda.h` ([`crate::abi::abi_check_c`]).
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleAbiC(buf: *mut c_char, len: usize) -> usize {
    guard(0, || text_out(&crate::abi::abi_check_c(), buf, len))
}

/// The calls that reached the model since the last reset, in order, one
/// `cuda.h` name per line (none on a fabric, which does not say).
///
/// # Safety
/// `buf` is null or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleTrace(buf: *mut c_char, len: usize) -> usize {
    guard(0, || {
        let mut s = String::new();
        for c in state::node().trace() {
            s.push_str(c.name());
            s.push('\n');
        }
        text_out(&s, buf, len)
    })
}

/// This process's place on the model fabric it is a process of
/// ([`crate::node`]): writes up to `n` of its fabric pid, node, the number
/// of nodes, its node's devices, its device when placed by rank (-1: none)
/// and whether it has an IMEX channel (0/1). Returns how many there are (6),
/// or 0 when the double is not on a fabric.
///
/// # Safety
/// `out` is null or has room for `n` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDoubleFabricPlace(out: *mut i64, n: usize) -> usize {
    guard(0, || {
        let Some(v) = state::node().place() else {
            return 0;
        };
        if !out.is_null() {
            for (i, x) in v.iter().take(n).enumerate() {
                // SAFETY: `i < n`, and the caller gave room for `n`.
                unsafe { *out.add(i) = *x };
            }
        }
        v.len()
    })
}

//! The data path on a real GPU, typed against raw, side by side in one run
//! (issues 28 and 30): one process, one device, a context from
//! `Context::auto()` alone (on a driver before 13.3 that is the classic
//! emulation, whose copies are `cuMemcpyAsync` through the endpoint's bound
//! memory), a unicast endpoint bound to mapped device memory, and
//!
//! - bandwidth: a typed `CopyBatch::put` of one op from local mapped memory
//!   into the endpoint, enqueued and waited, against a raw `cuMemcpyAsync`
//!   between the same two addresses on a raw stream and its
//!   `cuStreamSynchronize`, and the same put through a route
//!   (`Stream::route`, made once), for 4 KiB … 256 MiB;
//! - small puts: a typed batch of 1, 64 and 1,024 puts of 64 bytes (on the
//!   portable path one `cuMemcpyBatchAsync` for several puts where the
//!   driver has it, 12.8+; one `cuMemcpyAsync` for one put), against the
//!   raw loop of as many `cuMemcpyAsync` calls, and, for reference, the raw
//!   `cuMemcpyBatchAsync` of the same puts (arrays filled inside the timing,
//!   one attribute: source in stream order, no hints); host time of the
//!   enqueue alone (what the typed layer adds), and with the wait; what the
//!   typed batch costs over the raw loop per batch and per put. Twice: with
//!   a gap of 64 bytes between the puts' destinations (one piece each),
//!   then laid end to end on both sides, which the portable path grows
//!   into one copy (issue 30, item 5). Which calls a typed batch makes is
//!   counted first, once, on a traced context (untimed); and one put
//!   through a route (`Stream::route`, made once before the loop), the
//!   same put with the endpoint's facts read once, against the same raw
//!   call;
//! - the driver's entries for one device-to-device put, raw: `cuMemcpyAsync`
//!   against `cuMemcpyDtoDAsync_v2` (told both sides are device memory),
//!   64 B to 16 MiB, interleaved, enqueue alone and with the wait;
//! - the cost of `cuCtxGetCurrent`, which the backend asked before each
//!   stream call up to `c0c1d8f` (from `361c3f0` only once the driver
//!   refused a stream call for want of a context: then before each later
//!   one, on every thread; this bench's thread has device 0's);
//! - where a typed one put's enqueue goes: on a context of its own whose
//!   backend notes when its `cuMemcpyAsync` came in and went back
//!   (`Stamped`), the time before the driver's call, the call and after it,
//!   against the raw call stamped the same way, the raw call after a
//!   `cuCtxGetCurrent` (as the backend asked it up to `c0c1d8f`), and the raw call made
//!   through the real backend alone; then the raw call alone on the raw
//!   stream, on the typed one, on two raw streams made just before and
//!   after it, and after a typed batch was built and dropped (round 26:
//!   the call costs more on a stream that section uses less, whoever made
//!   it, so the split's middle part is not the typed layer's);
//! - the kinds of work the typed path does around its driver call (locked
//!   instructions after it or before it, lines read and written after
//!   it), added by hand to the raw one put: what each costs there;
//! - one put on a thread with no context current (a program that uses
//!   this crate alone): what raw `cuMemcpyAsync` answers there, and the
//!   typed one put against raw on that thread.
//!
//! `benches/report.sh --gpu LOG` rewrites the GPU tables of
//! `benches/README.md` from this output (saved with `# report:` lines for
//! the run: `scripts/gpu-suite.sh bench` writes them).
//!
//! Typed and raw alternate repetition by repetition; every figure is a
//! median with its range (min–max). Then the free-memory question of issue
//! 28: two contexts, a stream each, made and dropped, and `cuMemGetInfo`
//! before and after.
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench gpu_copy --no-run   # here; carry the binary
//! gpu_copy [repetitions]                                             # on the GPU machine
//! ```
//! Needs `libcuda`; prints "skipped: no driver" and exits 2 without one
//! (0 under `cargo bench`, which passes `--bench`).
//! Makes no multicast object (`CUDA_ENDPOINTS_DENY=cuMulticastCreate` is
//! set before the context is made).

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_endpoints::backend::Policy;
use cuda_endpoints::driver::cuda::Cuda;
use cuda_endpoints::driver::{Call, Driver, DriverResult, Forward, Pointer, Traced};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, Device, Endpoint, Mapped, Private, Ready, Spec, Stream, Unicast,
};

/// `Context::auto` over the real driver, for a team of device 0 (the
/// decision for unicast endpoints and copies does not depend on it).
fn auto(say: bool) -> Result<Context, Box<dyn std::error::Error>> {
    let (ctx, decision) = Context::auto(Cuda::open()?, &[Device(0)], &Policy::from_env())?;
    if say {
        println!("Context::auto: {decision}");
    }
    Ok(ctx)
}

type Init = unsafe extern "C" fn(u32) -> u32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type StreamCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> u32;
type StreamDestroy = unsafe extern "C" fn(*mut c_void) -> u32;
type StreamSync = unsafe extern "C" fn(*mut c_void) -> u32;
type Memcpy = unsafe extern "C" fn(u64, u64, usize, *mut c_void) -> u32;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
type GetCurrent = unsafe extern "C" fn(*mut *mut c_void) -> u32;
type MemcpyBatch = unsafe extern "C" fn(
    *mut u64,
    *mut u64,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    *mut c_void,
) -> u32;

/// `CUmemLocation`.
#[repr(C)]
struct MemLocation {
    type_: u32,
    id: i32,
}

/// `CUmemcpyAttributes` (the layout `src/driver/cuda/ffi.rs` declares and
/// `ci/abi-check.sh` compares with cuda.h 13.0-13.5).
#[repr(C)]
struct MemcpyAttributes {
    src_access_order: u32,
    src_loc_hint: MemLocation,
    dst_loc_hint: MemLocation,
    flags: u32,
}

/// The raw `cuMemcpyBatchAsync`'s arrays, filled inside the timing.
#[derive(Default)]
struct BatchArrays {
    dsts: Vec<u64>,
    srcs: Vec<u64>,
    sizes: Vec<usize>,
}

/// The raw side: libcuda's own entry points.
struct Raw {
    _lib: libloading::Library,
    stream: *mut c_void,
    memcpy: Memcpy,
    /// `cuMemcpyDtoDAsync_v2`: the same copy, both sides said to be device
    /// memory (no lookup of what each pointer is).
    dtod: Memcpy,
    sync: StreamSync,
    create: StreamCreate,
    destroy: StreamDestroy,
    info: MemGetInfo,
    get_current: GetCurrent,
    /// `cuMemcpyBatchAsync_v2` (cuda.h 13.0+), when the driver exports it.
    batch: Option<MemcpyBatch>,
}

fn check(what: &str, r: u32) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} returned CUresult {r}"))
    }
}

impl Raw {
    fn open() -> Result<Raw, String> {
        // SAFETY: loading the system's libcuda, as the backend does.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| e.to_string())?;
        // SAFETY: the symbols have these prototypes in cuda.h; the
        // `_v2` entry points are the ones the headers map the names to.
        unsafe {
            let init = *lib.get::<Init>(b"cuInit\0").map_err(|e| e.to_string())?;
            let retain = *lib
                .get::<Retain>(b"cuDevicePrimaryCtxRetain\0")
                .map_err(|e| e.to_string())?;
            let set = *lib
                .get::<SetCurrent>(b"cuCtxSetCurrent\0")
                .map_err(|e| e.to_string())?;
            let create = *lib
                .get::<StreamCreate>(b"cuStreamCreate\0")
                .map_err(|e| e.to_string())?;
            let destroy = *lib
                .get::<StreamDestroy>(b"cuStreamDestroy_v2\0")
                .map_err(|e| e.to_string())?;
            let sync = *lib
                .get::<StreamSync>(b"cuStreamSynchronize\0")
                .map_err(|e| e.to_string())?;
            let memcpy = *lib
                .get::<Memcpy>(b"cuMemcpyAsync\0")
                .map_err(|e| e.to_string())?;
            let dtod = *lib
                .get::<Memcpy>(b"cuMemcpyDtoDAsync_v2\0")
                .map_err(|e| e.to_string())?;
            let info = *lib
                .get::<MemGetInfo>(b"cuMemGetInfo_v2\0")
                .map_err(|e| e.to_string())?;
            let get_current = *lib
                .get::<GetCurrent>(b"cuCtxGetCurrent\0")
                .map_err(|e| e.to_string())?;
            let batch = lib
                .get::<MemcpyBatch>(b"cuMemcpyBatchAsync_v2\0")
                .ok()
                .map(|f| *f);
            check("cuInit", init(0))?;
            let mut pctx = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", retain(&mut pctx, 0))?;
            check("cuCtxSetCurrent", set(pctx))?;
            let mut stream = std::ptr::null_mut();
            // CU_STREAM_NON_BLOCKING, as the typed `Stream`.
            check("cuStreamCreate", create(&mut stream, 1))?;
            Ok(Raw {
                _lib: lib,
                stream,
                memcpy,
                dtod,
                sync,
                create,
                destroy,
                info,
                get_current,
                batch,
            })
        }
    }

    fn copy(&self, dst: u64, src: u64, size: u64) {
        // SAFETY: both ranges are mapped device memory of this process,
        // valid for `size` bytes until the synchronize below.
        let r = unsafe { (self.memcpy)(dst, src, size as usize, self.stream) };
        assert_eq!(r, 0, "cuMemcpyAsync");
    }

    /// [`Raw::copy`] on the stream `stream` (another's handle).
    fn copy_on(&self, stream: u64, dst: u64, src: u64, size: u64) {
        // SAFETY: as `copy`, on a live stream of this context (the typed
        // `Stream`'s, which outlives the call and the synchronize after it).
        let r = unsafe { (self.memcpy)(dst, src, size as usize, stream as usize as *mut c_void) };
        assert_eq!(r, 0, "cuMemcpyAsync");
    }

    /// A new stream of the current context, as `Raw::open` made its own
    /// (non-blocking), the caller's to [`Raw::drop_stream`].
    fn new_stream(&self) -> u64 {
        let mut s = std::ptr::null_mut();
        // SAFETY: one out-parameter; flags CU_STREAM_NON_BLOCKING.
        let r = unsafe { (self.create)(&mut s, 1) };
        assert_eq!(r, 0, "cuStreamCreate");
        s as usize as u64
    }

    /// Destroys a stream of [`Raw::new_stream`], idle.
    fn drop_stream(&self, stream: u64) {
        // SAFETY: the caller's stream, made by `new_stream`, synchronized.
        let r = unsafe { (self.destroy)(stream as usize as *mut c_void) };
        assert_eq!(r, 0, "cuStreamDestroy");
    }

    /// [`Raw::sync`] of the stream `stream` (another's handle).
    fn sync_on(&self, stream: u64) {
        // SAFETY: a live stream of this context (see `copy_on`).
        let r = unsafe { (self.sync)(stream as usize as *mut c_void) };
        assert_eq!(r, 0, "cuStreamSynchronize");
    }

    /// The same copy as [`Raw::copy`] through `cuMemcpyDtoDAsync_v2`.
    fn copy_dtod(&self, dst: u64, src: u64, size: u64) {
        // SAFETY: as `copy`: both ranges are mapped device memory of this
        // process, valid for `size` bytes until the synchronize below.
        let r = unsafe { (self.dtod)(dst, src, size as usize, self.stream) };
        assert_eq!(r, 0, "cuMemcpyDtoDAsync");
    }

    /// One `cuMemcpyBatchAsync` of `n` puts of `SMALL` bytes (put `i` from
    /// `s + i SMALL` to `d + i stride`), the arrays filled here (as a raw
    /// program fills them).
    fn copy_batch(&self, a: &mut BatchArrays, d: u64, s: u64, n: u64, stride: u64) {
        let Some(f) = self.batch else { return };
        a.dsts.clear();
        a.srcs.clear();
        a.sizes.clear();
        for i in 0..n {
            a.dsts.push(d + i * stride);
            a.srcs.push(s + i * SMALL);
            a.sizes.push(SMALL as usize);
        }
        // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEM_LOCATION_TYPE_INVALID hints.
        let mut attr = MemcpyAttributes {
            src_access_order: 1,
            src_loc_hint: MemLocation { type_: 0, id: 0 },
            dst_loc_hint: MemLocation { type_: 0, id: 0 },
            flags: 0,
        };
        let mut at = 0usize;
        // SAFETY: `n` entries in each array, one attribute applying from
        // copy 0; every range is mapped device memory of this process,
        // valid until the synchronize that follows; the copies do not overlap.
        let r = unsafe {
            f(
                a.dsts.as_mut_ptr(),
                a.srcs.as_mut_ptr(),
                a.sizes.as_mut_ptr(),
                n as usize,
                &mut attr,
                &mut at,
                1,
                self.stream,
            )
        };
        assert_eq!(r, 0, "cuMemcpyBatchAsync_v2");
    }

    fn sync(&self) {
        // SAFETY: the stream is ours.
        let r = unsafe { (self.sync)(self.stream) };
        assert_eq!(r, 0, "cuStreamSynchronize");
    }

    /// `cuCtxGetCurrent`, as the backend asks it before each call that
    /// works in the current context, and before each stream call once the
    /// driver refused one for want of a context (`driver/cuda/context.rs`).
    fn current(&self) -> *mut c_void {
        let mut c = std::ptr::null_mut();
        // SAFETY: one out-parameter.
        let r = unsafe { (self.get_current)(&mut c) };
        assert_eq!(r, 0, "cuCtxGetCurrent");
        c
    }

    fn free(&self) -> u64 {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two out-parameters.
        let r = unsafe { (self.info)(&mut free, &mut total) };
        assert_eq!(r, 0, "cuMemGetInfo");
        free as u64
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the stream is ours and idle.
        unsafe { (self.destroy)(self.stream) };
    }
}

/// Median, min and max of `v` (sorted in place).
/// What a side section copies with: a context from `Context::auto` over
/// `driver`, a ready unicast endpoint of 2 MiB on device 0, its memory to
/// bind and a source, both mapped there.
type Rig = (
    Context,
    Endpoint<Ready, Unicast>,
    Mapped<Private>,
    Mapped<Private>,
);

fn rig(driver: impl Driver + 'static) -> Result<Rig, Box<dyn std::error::Error>> {
    let (ctx, _) = Context::auto(driver, &[Device(0)], &Policy::from_env())?;
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(10))?;
    let dst = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let src = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    Ok((ctx, ep, dst, src))
}

/// The real backend with the times of its last `cuMemcpyAsync` noted: when
/// the call came into the backend and when it came back (nanoseconds since
/// `base`), so that a typed put's time splits into before the driver's
/// call, the call (with what the backend does around it: the context
/// check), and after it.
#[derive(Debug)]
struct Stamped {
    inner: Cuda,
    base: Instant,
    enter: AtomicU64,
    exit: AtomicU64,
    /// The stream of its last `cuMemcpyAsync` (the typed `Stream`'s handle).
    stream: AtomicU64,
}

impl Stamped {
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Forward for Stamped {
    type Inner = Cuda;
    fn inner(&self) -> &Cuda {
        &self.inner
    }
    unsafe fn memcpy_async(
        &self,
        dst: Pointer,
        src: Pointer,
        size: u64,
        stream: u64,
    ) -> DriverResult<()> {
        self.stream.store(stream, Ordering::Relaxed);
        self.enter.store(self.now(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged: the caller's contract is the inner
        // driver's.
        let r = unsafe { Driver::memcpy_async(&self.inner, dst, src, size, stream) };
        self.exit.store(self.now(), Ordering::Relaxed);
        r
    }
}

/// Where a typed one-put batch's enqueue spends its time, against raw's:
/// before the driver's call, the call, after it (each typed `put` of
/// `SMALL` bytes on a context of its own over [`Stamped`], the same put
/// through a route, then the raw
/// `cuMemcpyAsync` stamped the same way; interleaved, medians). Untimed
/// by the tables: each stamp costs a clock read on both sides. Then why
/// the call itself is slower on the typed side: the raw call alone on the
/// raw stream, on the typed stream, and after a typed batch of the same
/// put was built and dropped.
fn where_one_put_goes(raw: &Raw, reps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let stamped = Arc::new(Stamped {
        inner: Cuda::open()?,
        base: Instant::now(),
        enter: AtomicU64::new(0),
        exit: AtomicU64::new(0),
        stream: AtomicU64::new(0),
    });
    let (ctx, ep, dst, src) = rig(stamped.clone())?;
    let b = ep.bind(0, 0, &dst)?;
    // Two raw streams more, made just before and just after the typed one
    // (does a stream's order of making, not its maker, change the call?).
    let early = raw.new_stream();
    let s = Stream::new(&ctx, 0)?;
    let late = raw.new_stream();
    let (rd, rs) = (dst.device_ptr(), src.device_ptr());
    // The raw call through the backend alone (its policy check, its
    // context check, the call), on the raw stream.
    let backend = Cuda::open()?;
    let mut v: [Vec<u64>; 15] = Default::default();
    // Why the driver's call itself takes longer on the typed side: the
    // raw call alone, on the typed stream (its handle), and after a typed
    // batch of the same put was built and dropped (its lines and atomics
    // before the call, no enqueue); each call alone timed, interleaved.
    let mut why: [Vec<u64>; 5] = Default::default();
    // The same put through a route, made once (its facts read here).
    let mut route = s.route(&src, &ep);
    // A raw call stamped as the typed one is: before it, it, after it;
    // then the stream synchronized (untimed).
    let stamp = |v: &mut [Vec<u64>], call: &mut dyn FnMut() -> DriverResult<()>| {
        let a = stamped.now();
        let e = stamped.now();
        let r = call();
        let x = stamped.now();
        let z = stamped.now();
        raw.sync();
        for (k, t) in [
            e.saturating_sub(a),
            x.saturating_sub(e),
            z.saturating_sub(x),
        ]
        .into_iter()
        .enumerate()
        {
            v[k].push(t);
        }
        r
    };
    for rep in 0..reps {
        // The batch and the route change places every other repetition.
        let order = if rep % 2 == 0 { [0, 12] } else { [12, 0] };
        for k in order {
            let a = stamped.now();
            let token = if k == 0 {
                s.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, SMALL))?
            } else {
                route.put(0, 0, SMALL)?
            };
            let z = stamped.now();
            let (e, x) = (
                stamped.enter.load(Ordering::Relaxed),
                stamped.exit.load(Ordering::Relaxed),
            );
            token.wait()?;
            v[k].push(e.saturating_sub(a));
            v[k + 1].push(x.saturating_sub(e));
            v[k + 2].push(z.saturating_sub(x));
        }
        stamp(&mut v[3..6], &mut || {
            raw.copy(rd, rs, SMALL);
            Ok(())
        })?;
        // The call alone: on the raw stream, on the typed one, after a
        // typed batch built and dropped; in turns.
        let typed_stream = stamped.stream.load(Ordering::Relaxed);
        for i in 0..5 {
            let k = (rep + i) % 5;
            if k == 1 && typed_stream == 0 {
                continue; // no typed call through `memcpy_async` yet
            }
            if k == 2 {
                drop(std::hint::black_box(
                    CopyBatch::new().put(&src, 0, &ep, 0, SMALL),
                ));
            }
            let on = match k {
                1 => Some(typed_stream),
                3 => Some(early),
                4 => Some(late),
                _ => None,
            };
            let a = stamped.now();
            match on {
                Some(stream) => raw.copy_on(stream, rd, rs, SMALL),
                None => raw.copy(rd, rs, SMALL),
            }
            why[k].push(stamped.now().saturating_sub(a));
            match on {
                Some(stream) => raw.sync_on(stream),
                None => raw.sync(),
            }
        }
        // Raw, with the context asked first, as the backend asked it up to
        // `c0c1d8f` (now only once the driver refused a stream call).
        stamp(&mut v[6..9], &mut || {
            std::hint::black_box(raw.current());
            raw.copy(rd, rs, SMALL);
            Ok(())
        })?;
        // Raw through the backend.
        stamp(&mut v[9..12], &mut || {
            // SAFETY: as `Raw::copy`: mapped device memory of this
            // process, valid until the synchronize that follows, on the
            // raw stream.
            unsafe {
                Driver::memcpy_async(
                    &backend,
                    Pointer::device(rd),
                    Pointer::device(rs),
                    SMALL,
                    raw.stream as u64,
                )
            }
        })?;
    }
    let med = |x: &mut Vec<u64>| {
        x.sort_unstable();
        x.get(x.len() / 2).copied().unwrap_or(0)
    };
    let [tb, tc, ta, rb, rc, ra, xb, xc, xa, bb, bc, ba, ub, uc, ua] = v.each_mut().map(med);
    println!(
        "\n== where a typed one put's enqueue goes: ns before the driver's call, the call (through the backend), after it; medians of {reps}, each side with the same clock reads; raw+ctx: raw with cuCtxGetCurrent first (in the call); backend: the raw call made through the real backend alone"
    );
    println!("{:>8} {:>8} {:>8} {:>8}", "", "before", "call", "after");
    println!("{:>8} {tb:>8} {tc:>8} {ta:>8}", "typed");
    println!("{:>8} {rb:>8} {rc:>8} {ra:>8}", "raw");
    println!("{:>8} {xb:>8} {xc:>8} {xa:>8}", "raw+ctx");
    println!("{:>8} {bb:>8} {bc:>8} {ba:>8}", "backend");
    // A typed side's split less raw's.
    let over = |name: &str, b: u64, c: u64, a: u64| {
        let less = |x: u64, r: u64| x as i64 - r as i64;
        println!(
            "{name:>8} {:>8} {:>8} {:>8}",
            less(b, rb),
            less(c, rc),
            less(a, ra)
        );
    };
    over("typed-raw", tb, tc, ta);
    println!("{:>8} {ub:>8} {uc:>8} {ua:>8}", "route");
    over("route-raw", ub, uc, ua);
    let [alone, on_typed, after_typed, on_early, on_late] = why.each_mut().map(med);
    println!(
        "\n== the raw call alone, host ns (medians of {reps}): on the raw stream, on the typed stream, after a typed batch of the same put was built and dropped; each less the first"
    );
    println!(
        "{alone:>8} {on_typed:>8} {after_typed:>8} {:>+8} {:>+8}",
        on_typed as i64 - alone as i64,
        after_typed as i64 - alone as i64
    );
    println!(
        "== the same on two raw streams made just before and just after the typed one, each less the raw stream's"
    );
    println!(
        "{on_early:>8} {on_late:>8} {:>+8} {:>+8}",
        on_early as i64 - alone as i64,
        on_late as i64 - alone as i64
    );
    drop(route);
    raw.drop_stream(early);
    raw.drop_stream(late);
    drop((s, b));
    ep.destroy()?.release()?;
    drop((dst, src, ctx));
    Ok(())
}

/// A cache line of its own: the typed path's atomics and fields lie on
/// distinct lines (the range's gate, the keep-alives' counts, the stream's
/// lock).
#[repr(align(64))]
struct Line(AtomicU64);

/// The kinds of work the typed path does around its driver call, added by
/// hand to a raw one put (issue 30: where the typed one put's ~200 ns over
/// raw go, with no `perf` on the GPU machine): locked instructions after
/// the call (1, 4, 10 on as many lines: a one-put batch's enqueue runs 10;
/// and 6, the fewest its design needs: the copy gate's enter and leave, the
/// memory's and the range's keep-alives, the stream record's lock pair),
/// one before it instead, and 16 or 48 lines, the same every repetition,
/// read and written after it (plainly, no lock: the lines the typed path
/// touches after the call). Each enqueue timed alone, the stream
/// synchronized after it untimed; the variants interleaved, their order
/// turned every repetition; medians in ns and each over the plain call.
fn around_the_call(raw: &Raw, d: u64, s: u64, reps: usize) {
    let atoms: Vec<Line> = (0..16).map(|_| Line(AtomicU64::new(0))).collect();
    let plain: Vec<Line> = (0..64).map(|_| Line(AtomicU64::new(0))).collect();
    let locked = |k: usize| {
        for l in &atoms[..k] {
            l.0.fetch_add(1, Ordering::SeqCst);
        }
    };
    let touch = |k: usize| {
        for l in &plain[..k] {
            let v = l.0.load(Ordering::Relaxed);
            l.0.store(v.wrapping_add(1), Ordering::Relaxed);
        }
    };
    const NAMES: [&str; 8] = [
        "the call alone",
        "1 locked op after",
        "4 locked ops after",
        "10 locked ops after",
        "1 locked op before",
        "16 lines after",
        "48 lines after",
        "6 locked ops after",
    ];
    let mut v: [Vec<Duration>; 8] = Default::default();
    for rep in 0..reps {
        for i in 0..NAMES.len() {
            let k = (rep + i) % NAMES.len();
            let a = Instant::now();
            match k {
                4 => {
                    locked(1);
                    raw.copy(d, s, SMALL);
                }
                _ => {
                    raw.copy(d, s, SMALL);
                    match k {
                        1 => locked(1),
                        2 => locked(4),
                        3 => locked(10),
                        5 => touch(16),
                        6 => touch(48),
                        7 => locked(6),
                        _ => {}
                    }
                }
            }
            v[k].push(a.elapsed());
            raw.sync();
        }
    }
    println!(
        "\n== around a raw one put of {SMALL} bytes: the typed path's kinds of work added by hand, host ns of the enqueue (median of {reps}, min-max), and over the call alone"
    );
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    let all = v.each_mut().map(|x| stats(x));
    for (name, (m, l, h)) in NAMES.iter().zip(all) {
        println!(
            "{name:>22} {:>8.0} ({:.0}-{:.0}) {:>+8.0}",
            ns(m),
            ns(l),
            ns(h),
            ns(m) - ns(all[0].0)
        );
    }
}

/// One put on a thread with no context current, as a program that uses
/// this crate alone calls from (the backend leaves none behind): first
/// what a raw `cuMemcpyAsync` answers there (CCCL reports that recent
/// drivers run it in the stream's context, NVIDIA/cccl#9615; the backend
/// makes its stream calls as they are from `361c3f0`, and again in a
/// device's primary context should the driver refuse), then the typed one
/// put's enqueue against raw's on that thread, interleaved, each waited.
fn with_no_context(
    raw: &Raw,
    stream: &Stream,
    src: &Mapped<Private>,
    ep: &Endpoint<Ready, Unicast>,
    reps: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    // What the thread needs of the raw side: the entry points and the
    // stream (a handle usable from every thread), not `Raw` itself.
    let (memcpy, sync, handle) = (raw.memcpy, raw.sync, raw.stream.expose_provenance());
    let (d, s) = (src.device_ptr() + (1 << 20), src.device_ptr());
    let run = || -> Result<String, String> {
        let h = std::ptr::with_exposed_provenance_mut::<c_void>(handle);
        let mut out = String::new();
        // SAFETY: both ranges are mapped device memory of this process
        // (two halves of `src`), valid until the synchronize below.
        let rc = unsafe { memcpy(d, s, SMALL as usize, h) };
        out.push_str(&format!(
            "raw cuMemcpyAsync with no context current: CUresult {rc}{}\n",
            if rc == 0 {
                " (run in the stream's context)"
            } else {
                ""
            }
        ));
        if rc == 0 {
            // SAFETY: the raw stream, live.
            let r = unsafe { sync(h) };
            if r != 0 {
                return Err(format!("cuStreamSynchronize with no context current: {r}"));
            }
        }
        let (mut typed, mut raws) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let a = Instant::now();
            let token = stream
                .enqueue(CopyBatch::new().put(src, 0, ep, 0, SMALL))
                .map_err(|e| e.to_string())?;
            typed.push(a.elapsed());
            token.wait().map_err(|e| e.to_string())?;
            if rc == 0 {
                let a = Instant::now();
                // SAFETY: as above.
                let r = unsafe { memcpy(d, s, SMALL as usize, h) };
                raws.push(a.elapsed());
                // SAFETY: as above.
                let w = unsafe { sync(h) };
                if r != 0 || w != 0 {
                    return Err(format!("raw copy {r}, synchronize {w}"));
                }
            }
        }
        let t = stats(&mut typed);
        let f = |m: (Duration, Duration, Duration)| {
            format!("{:.2} ({:.2}-{:.2})", us(m.0), us(m.1), us(m.2))
        };
        out.push_str(&format!("typed one-put enqueue us: {}", f(t)));
        if rc == 0 {
            let r = stats(&mut raws);
            out.push_str(&format!(
                "; raw us: {}; typed / raw {:.3}",
                f(r),
                us(t.0) / us(r.0)
            ));
        }
        Ok(out)
    };
    let said = std::thread::scope(|sc| sc.spawn(run).join())
        .map_err(|_| "the thread with no context panicked")??;
    println!(
        "\n== one put on a thread with no context current (medians of {reps}, min-max; each waited, untimed)"
    );
    println!("{said}");
    Ok(())
}

fn stats(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

const MAX: u64 = 256 << 20;
const SMALL: u64 = 64;
/// A batch's puts, the typed enqueue over the raw loop and over the raw
/// batch call (ns; `None`: no batch call on this driver).
type Overhead = (u64, f64, Option<f64>);
/// The stride of the small puts' destinations with a gap between them.
const GAP: u64 = 2 * SMALL;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`: then a machine without a GPU skips
    // (exit 0), so that `cargo bench -p cuda-endpoints-benches`
    // (`benches/report.sh`) runs every other bench.
    let under_cargo = std::env::args().any(|a| a == "--bench");
    let reps: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(50);
    // SAFETY: set before any thread is started.
    unsafe { std::env::set_var("CUDA_ENDPOINTS_DENY", "cuMulticastCreate") };
    let raw = match Raw::open() {
        Ok(raw) => raw,
        Err(e) => {
            println!("skipped: no driver ({e})");
            std::process::exit(if under_cargo { 0 } else { 2 });
        }
    };
    let free_start = raw.free();
    let ctx = auto(true)?;
    println!(
        "context: Context::auto(), driver {:?}, copy path {:?}",
        ctx.driver_version(),
        ctx.copy_path()
    );
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, MAX))?
        .wait(Duration::from_secs(10))?;
    let dst = Allocation::<Private>::on_device(&ctx, 0, MAX)?.map(&[0])?;
    let src = Allocation::<Private>::on_device(&ctx, 0, MAX)?.map(&[0])?;
    let after_alloc = raw.free();
    let binding = ep.bind(0, 0, &dst)?;
    let after_bind = raw.free();
    let stream = Stream::new(&ctx, 0)?;
    let after_stream = raw.free();
    // A second stream, made and dropped: does each stream take memory?
    drop(Stream::new(&ctx, 0)?);
    let after_second = raw.free();
    let (d, s) = (dst.device_ptr(), src.device_ptr());

    // Warm-up: both paths, every size once; free memory after each first
    // copy (where issue 28's 2 MiB went).
    stream
        .enqueue(CopyBatch::new().put(&src, 0, &ep, 0, MAX))?
        .wait()?;
    let after_typed = raw.free();
    raw.copy(d, s, MAX);
    raw.sync();
    let after_raw = raw.free();
    let phases = [
        ("context, endpoint and two allocations", after_alloc),
        ("binding", after_bind),
        ("the typed stream", after_stream),
        ("a second stream, made and dropped", after_second),
        ("first typed copy", after_typed),
        ("first raw copy", after_raw),
    ];

    println!(
        "\n== bandwidth: one put of N bytes, enqueue + wait (median of {reps}, min-max); route: the same put through a route made once"
    );
    println!(
        "{:>10} {:>12} {:>12} {:>8} {:>22} {:>22} {:>8} {:>22}",
        "bytes",
        "typed GB/s",
        "raw GB/s",
        "ratio",
        "typed us (min-max)",
        "raw us (min-max)",
        "route",
        "route us (min-max)"
    );
    let mut route = stream.route(&src, &ep);
    let mut size = 4u64 << 10;
    while size <= MAX {
        let mut v: [Vec<Duration>; 3] = Default::default();
        for rep in 0..reps {
            // The batch and the route change places every other
            // repetition, raw between them: neither always follows raw.
            let order = if rep % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for k in order {
                let a = Instant::now();
                match k {
                    0 => {
                        stream
                            .enqueue(CopyBatch::new().put(&src, 0, &ep, 0, size))?
                            .wait()?;
                    }
                    1 => {
                        raw.copy(d, s, size);
                        raw.sync();
                    }
                    _ => {
                        route.put(0, 0, size)?.wait()?;
                    }
                }
                v[k].push(a.elapsed());
            }
        }
        let [(tm, tl, th), (rm, rl, rh), (um, ul, uh)] = v.each_mut().map(|x| stats(x));
        let gb = |x: Duration| size as f64 / x.as_secs_f64() / 1e9;
        println!(
            "{:>10} {:>12.1} {:>12.1} {:>8.3} {:>8.1} ({:.1}-{:.1}) {:>8.1} ({:.1}-{:.1}) {:>8.3} {:>8.1} ({:.1}-{:.1})",
            size,
            gb(tm),
            gb(rm),
            gb(tm) / gb(rm),
            us(tm),
            us(tl),
            us(th),
            us(rm),
            us(rl),
            us(rh),
            gb(um) / gb(rm),
            us(um),
            us(ul),
            us(uh)
        );
        size *= 4;
    }
    drop(route);

    // Which calls a typed batch of small puts makes, counted once on a
    // traced context of its own (untimed: the trace formats every call).
    {
        let traced = Arc::new(Traced::new(Cuda::open()?));
        let (tctx, tep, tdst, tsrc) = rig(traced.clone())?;
        let tb = tep.bind(0, 0, &tdst)?;
        let ts = Stream::new(&tctx, 0)?;
        for (n, stride, how) in [(1u64, GAP, ""), (64, GAP, ""), (64, SMALL, " end to end")] {
            traced.clear();
            let mut batch = CopyBatch::new();
            for i in 0..n {
                batch = batch.put(&tsrc, i * SMALL, &tep, i * stride, SMALL);
            }
            ts.enqueue(batch)?.wait()?;
            println!(
                "typed batch of {n} put(s){how} reaches the driver as: {} cuMemcpyBatchAsync, {} cuMemcpyAsync, {} cuFabricCpyBatchAsync",
                traced.count(Call::MemcpyBatchAsync),
                traced.count(Call::MemcpyAsync),
                traced.count(Call::FabricCpyBatchAsync)
            );
        }
        // Every byte through the batch call, both ways: a pattern put from
        // the host, 64 gets of it into device memory, 64 puts of that back
        // further into the endpoint, read back to the host.
        let pattern: Vec<u8> = (0..64 * SMALL).map(|i| (i * 7 + 3) as u8).collect();
        let far = 64 * SMALL * 2;
        traced.clear();
        ts.enqueue(CopyBatch::new().put_host(pattern.clone(), &tep, 0))?
            .wait()?;
        let gets = (0..64).fold(CopyBatch::new(), |b, i| {
            b.get(&tep, i * SMALL, &tsrc, i * SMALL, SMALL)
        });
        ts.enqueue(gets)?.wait()?;
        let puts = (0..64).fold(CopyBatch::new(), |b, i| {
            b.put(&tsrc, i * SMALL, &tep, far + i * SMALL, SMALL)
        });
        ts.enqueue(puts)?.wait()?;
        let back = ts
            .enqueue(CopyBatch::new().get_host(&tep, far, 64 * SMALL))?
            .wait()?;
        let right = back.received.first() == Some(&pattern);
        println!(
            "typed 64 gets then 64 puts, every byte checked: {} ({} cuMemcpyBatchAsync, {} cuMemcpyAsync)",
            if right { "right" } else { "WRONG" },
            traced.count(Call::MemcpyBatchAsync),
            traced.count(Call::MemcpyAsync)
        );
        if !right {
            return Err("the bytes through the typed batches are wrong".into());
        }
        drop((ts, tb));
        tep.destroy()?.release()?;
        drop((tdst, tsrc, tctx));
    }
    println!(
        "raw cuMemcpyBatchAsync_v2: {}",
        if raw.batch.is_some() {
            "exported by this driver"
        } else {
            "not exported by this driver (its rows are left out)"
        }
    );

    // Small puts, typed against the raw loop and the raw batch call,
    // interleaved repetition by repetition: put `i` from `SMALL i` of the
    // source to `stride i` of the endpoint (`SMALL`: end to end on both
    // sides, which the portable path grows into one copy; `GAP`: one
    // piece each).
    let mut arrays = BatchArrays::default();
    // A route (`Stream::route`), made once as a program would: its one put
    // is a batch of one put, checked the same, its facts read once.
    let mut route = stream.route(&src, &ep);
    let mut small = |stride: u64| -> Result<Vec<Overhead>, Box<dyn std::error::Error>> {
        println!(
            "{:>6} {:<10} {:>8} {:>16} {:>8} {:>16} {:>10} {:>10}",
            "ops", "variant", "enqueue", "(min-max)", "+wait", "(min-max)", "enq/loop", "wait/loop"
        );
        let mut overheads = Vec::new();
        for n in [1u64, 64, 1024] {
            // typed, raw_loop, raw_batch, route (one put alone).
            let mut enq: [Vec<Duration>; 4] = Default::default();
            let mut all: [Vec<Duration>; 4] = Default::default();
            for rep in 0..reps {
                // For one put, the route goes first every other
                // repetition (the batch first in the others).
                let route_first = n == 1 && rep % 2 == 1;
                if route_first {
                    let a = Instant::now();
                    let token = route.put(0, 0, SMALL)?;
                    enq[3].push(a.elapsed());
                    token.wait()?;
                    all[3].push(a.elapsed());
                }
                let a = Instant::now();
                let mut batch = CopyBatch::new();
                for i in 0..n {
                    batch = batch.put(&src, i * SMALL, &ep, i * stride, SMALL);
                }
                let token = stream.enqueue(batch)?;
                enq[0].push(a.elapsed());
                token.wait()?;
                all[0].push(a.elapsed());
                let a = Instant::now();
                for i in 0..n {
                    raw.copy(d + i * stride, s + i * SMALL, SMALL);
                }
                enq[1].push(a.elapsed());
                raw.sync();
                all[1].push(a.elapsed());
                if raw.batch.is_some() {
                    let a = Instant::now();
                    raw.copy_batch(&mut arrays, d, s, n, stride);
                    enq[2].push(a.elapsed());
                    raw.sync();
                    all[2].push(a.elapsed());
                }
                if n == 1 && !route_first {
                    let a = Instant::now();
                    let token = route.put(0, 0, SMALL)?;
                    enq[3].push(a.elapsed());
                    token.wait()?;
                    all[3].push(a.elapsed());
                }
            }
            let names = ["typed", "raw_loop", "raw_batch", "route"];
            let stat = |v: &mut Vec<Duration>| (!v.is_empty()).then(|| stats(v));
            let e: Vec<_> = enq.iter_mut().map(stat).collect();
            let w: Vec<_> = all.iter_mut().map(stat).collect();
            let (Some(loop_e), Some(loop_w)) = (e[1], w[1]) else {
                return Err("no raw loop measured".into());
            };
            for (k, name) in names.iter().enumerate() {
                let (Some((em, el, eh)), Some((wm, wl, wh))) = (e[k], w[k]) else {
                    continue;
                };
                println!(
                    "{:>6} {:<10} {:>8.1} {:>16} {:>8.1} {:>16} {:>10.3} {:>10.3}",
                    n,
                    name,
                    us(em),
                    format!("({:.1}-{:.1})", us(el), us(eh)),
                    us(wm),
                    format!("({:.1}-{:.1})", us(wl), us(wh)),
                    us(em) / us(loop_e.0),
                    us(wm) / us(loop_w.0),
                );
            }
            let (Some(typed_e), raw_batch_e) = (e[0], e[2]) else {
                return Err("no typed batch measured".into());
            };
            let over = |base: Duration| typed_e.0.as_nanos() as f64 - base.as_nanos() as f64;
            overheads.push((n, over(loop_e.0), raw_batch_e.map(|b| over(b.0))));
        }
        Ok(overheads)
    };
    println!(
        "\n== small puts: a batch of N puts of {SMALL} bytes, a gap of {SMALL} bytes between their destinations (one piece each), host microseconds (median of {reps}, min-max); ratios against the raw loop of cuMemcpyAsync"
    );
    let overheads = small(GAP)?;
    println!("\n== small puts: the typed batch's enqueue over raw (medians; negative: faster)");
    println!(
        "{:>6} {:>16} {:>12} {:>16} {:>12}",
        "ops", "ns/batch, loop", "ns/op, loop", "ns/batch, batch", "ns/op, batch"
    );
    for (n, loop_, batch) in overheads {
        let b = |x: Option<f64>, per: f64| x.map_or("-".to_owned(), |v| format!("{:.1}", v / per));
        println!(
            "{:>6} {:>16.0} {:>12.1} {:>16} {:>12}",
            n,
            loop_,
            loop_ / n as f64,
            b(batch, 1.0),
            b(batch, n as f64)
        );
    }
    println!(
        "\n== small puts end to end: a batch of N puts of {SMALL} bytes laid end to end on both sides (the portable path grows them into one copy), host microseconds (median of {reps}, min-max); ratios against the raw loop of cuMemcpyAsync"
    );
    small(SMALL)?;
    // What the backend asked before each stream call up to `c0c1d8f`
    // (`cuMemcpyAsync`, `cuStreamSynchronize`: one each per one-put batch
    // and its wait), and still asks once the driver refused a stream call
    // for want of a context; the raw side, whose context is set once,
    // never asks.
    println!(
        "\n== the context check the backend made before each stream call up to c0c1d8f (from 361c3f0 only once the driver refused a stream call for want of a context): cuCtxGetCurrent, host ns per call (median of {reps} rounds of 1,000 calls, min-max)"
    );
    let mut g = Vec::with_capacity(reps);
    for _ in 0..reps {
        let a = Instant::now();
        for _ in 0..1000 {
            std::hint::black_box(raw.current());
        }
        g.push(a.elapsed());
    }
    let (gm, gl, gh) = stats(&mut g);
    let ns = |d: Duration| d.as_secs_f64() * 1e9 / 1000.0;
    println!(
        "cuCtxGetCurrent: {:.1} ns per call ({:.1}-{:.1})",
        ns(gm),
        ns(gl),
        ns(gh)
    );
    // Which entry a device-to-device piece should take: `cuMemcpyAsync`
    // infers what each pointer is, `cuMemcpyDtoDAsync_v2` is told. Raw both,
    // interleaved, one put of N bytes: the enqueue alone, and with the wait.
    println!(
        "\n== one device-to-device put, raw: cuMemcpyAsync against cuMemcpyDtoDAsync_v2, host us (median of {reps}, min-max)"
    );
    println!(
        "{:>10} {:>22} {:>22} {:>8} {:>22} {:>22} {:>8}",
        "bytes", "memcpy enqueue", "dtod enqueue", "ratio", "memcpy +wait", "dtod +wait", "ratio"
    );
    for size in [SMALL, 4 << 10, 1 << 20, 16 << 20] {
        let mut v: [Vec<Duration>; 4] = Default::default();
        for _ in 0..reps {
            let a = Instant::now();
            raw.copy(d, s, size);
            v[0].push(a.elapsed());
            raw.sync();
            v[2].push(a.elapsed());
            let a = Instant::now();
            raw.copy_dtod(d, s, size);
            v[1].push(a.elapsed());
            raw.sync();
            v[3].push(a.elapsed());
        }
        let [m, t, mw, tw] = v.each_mut().map(|x| stats(x));
        let f = |(x, l, h): (Duration, Duration, Duration)| {
            format!("{:.2} ({:.2}-{:.2})", us(x), us(l), us(h))
        };
        println!(
            "{:>10} {:>22} {:>22} {:>8.3} {:>22} {:>22} {:>8.3}",
            size,
            f(m),
            f(t),
            us(t.0) / us(m.0),
            f(mw),
            f(tw),
            us(tw.0) / us(mw.0)
        );
    }
    where_one_put_goes(&raw, reps)?;
    around_the_call(&raw, d, s, reps);
    // Not fatal: the tables above are what `report.sh` reads.
    if let Err(e) = with_no_context(&raw, &stream, &src, &ep, reps) {
        println!("\n== one put on a thread with no context current: {e}");
    }
    drop(binding);
    drop(stream);
    ep.destroy()?.release()?;
    drop((dst, src));
    drop(ctx);
    println!("\n== free device memory by phase (bytes; negative: taken)");
    let mut last = free_start;
    for (what, free) in phases {
        println!("{what}: {:+}", free as i128 - last as i128);
        last = free;
    }
    println!(
        "everything above dropped: {:+} against the start",
        raw.free() as i128 - free_start as i128
    );

    // Issue 28's 2 MiB: two contexts, a stream each, made and dropped, a
    // few rounds; free device memory read raw before and after each.
    println!("\n== free device memory: two contexts, a stream each, made and dropped");
    let before = raw.free();
    for round in 0..4 {
        let a = raw.free();
        {
            let c1 = auto(false)?;
            let c2 = auto(false)?;
            let s1 = Stream::new(&c1, 0)?;
            let s2 = Stream::new(&c2, 0)?;
            s1.synchronize()?;
            s2.synchronize()?;
        }
        let b = raw.free();
        println!(
            "round {round}: free {a} -> {b} ({:+} bytes)",
            b as i128 - a as i128
        );
    }
    let after = raw.free();
    println!(
        "free at start {free_start}, before the rounds {before}, after {after} ({:+} bytes over the rounds)",
        after as i128 - before as i128
    );
    Ok(())
}

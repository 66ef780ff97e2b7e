//! The real backend's per-call overhead against the same driver calls made
//! raw, side by side in one run on a real GPU: device-attribute queries, and
//! 2 MiB `cuMemCreate`/`cuMemRelease` cycles (typed: `Allocation::on_device`
//! and its drop, which also read the granularity).
//!
//! ```text
//! cargo build --release --example driver_overhead
//! target/release/examples/driver_overhead [iterations]
//! ```
//! Needs `libcuda`; prints "skipped: no driver" and exits 2 (not run)
//! without one. Makes no
//! endpoint and no multicast object.

use std::ffi::c_void;
use std::time::Instant;

use cuda_endpoints::{Allocation, Context, Private};

/// `CUmemAllocationProp` (cuda.h): pinned device memory on `id`, no handle types.
#[repr(C)]
struct MemProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32: *mut c_void,
    alloc_flags: [u8; 8],
}

type Attr = unsafe extern "C" fn(*mut i32, i32, i32) -> u32;
type Init = unsafe extern "C" fn(u32) -> u32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type Create = unsafe extern "C" fn(*mut u64, usize, *const MemProp, u64) -> u32;
type Release = unsafe extern "C" fn(u64) -> u32;

/// A failure prints its message and causes (`Report`), not `Debug`.
fn main() -> Result<(), cuda_endpoints::Report> {
    run().map_err(cuda_endpoints::Report::from_boxed)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let ctx = match Context::cuda() {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("skipped: no driver ({e})");
            std::process::exit(2);
        }
    };
    // SAFETY: loading the system's libcuda, as the backend does.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }?;
    // SAFETY: the symbols have these prototypes in cuda.h.
    let (init, attr, retain, set, create, release) = unsafe {
        (
            *lib.get::<Init>(b"cuInit\0")?,
            *lib.get::<Attr>(b"cuDeviceGetAttribute\0")?,
            *lib.get::<Retain>(b"cuDevicePrimaryCtxRetain\0")?,
            *lib.get::<SetCurrent>(b"cuCtxSetCurrent\0")?,
            *lib.get::<Create>(b"cuMemCreate\0")?,
            *lib.get::<Release>(b"cuMemRelease\0")?,
        )
    };
    let mut pctx = std::ptr::null_mut();
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut pctx, 0), 0);
        assert_eq!(set(pctx), 0);
    }
    const MULTICAST_SUPPORTED: i32 = 132;
    const SIZE: usize = 2 << 20;

    // Attribute queries, interleaved rounds so drift hits both alike.
    let (mut raw_attr, mut typed_attr) = (0f64, 0f64);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            let mut v = 0;
            // SAFETY: a valid out-pointer; device 0 exists.
            let r = unsafe { attr(&mut v, MULTICAST_SUPPORTED, 0) };
            std::hint::black_box((r, v));
        }
        raw_attr += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(ctx.attribute(0, MULTICAST_SUPPORTED).ok());
        }
        typed_attr += t.elapsed().as_secs_f64();
    }
    let calls = f64::from(n) * 5.0;

    // 2 MiB allocations made and released.
    let m = n / 20;
    let prop = MemProp {
        kind: 1,
        handle_types: 0,
        location_type: 1,
        location_id: 0,
        win32: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    let (mut raw_mem, mut typed_mem) = (0f64, 0f64);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..m {
            let mut h = 0u64;
            // SAFETY: a valid out-pointer and property struct; the handle
            // is released at once.
            unsafe {
                assert_eq!(create(&mut h, SIZE, &prop, 0), 0);
                assert_eq!(release(h), 0);
            }
        }
        raw_mem += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..m {
            drop(Allocation::<Private>::on_device(&ctx, 0, SIZE as u64)?);
        }
        typed_mem += t.elapsed().as_secs_f64();
    }
    let cycles = f64::from(m) * 5.0;
    let ns = |s: f64, k: f64| s * 1e9 / k;
    println!(
        "cuDeviceGetAttribute: raw {:.0} ns, typed {:.0} ns per call: typed/raw {:.2}x ({} calls each)",
        ns(raw_attr, calls),
        ns(typed_attr, calls),
        typed_attr / raw_attr,
        calls
    );
    println!(
        "2 MiB cuMemCreate + cuMemRelease: raw {:.0} ns, typed {:.0} ns per cycle: typed/raw {:.2}x ({} cycles each; typed also reads the granularity)",
        ns(raw_mem, cycles),
        ns(typed_mem, cycles),
        typed_mem / raw_mem,
        cycles
    );
    Ok(())
}

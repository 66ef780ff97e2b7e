//! Readiness at scale (issue 13): heap bytes per endpoint, counted by a
//! global allocator, and wall clock per endpoint, for 1 … 100 000 endpoints
//! of one range, on the pass-through `Null` driver (so every byte is the
//! typed layer's).
//!
//! ```sh
//! cargo bench -p cuda-endpoints-benches --bench readiness_heap
//! ```
//!
//! The bring-up measured is `reserve(n)`, `into_endpoints`, `create` on
//! each, `wait_all`. "live" is what the `n` ready endpoints hold (the range's
//! records and the `Vec` of endpoints), "peak" the most held at once on the
//! way; both per endpoint. The time is the best of several bring-ups, per
//! endpoint, teardown (destroy and release) not included.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use cuda_endpoints::Context;

use common::{Null, bring_up};

/// The system allocator, counting the bytes held now and the most held.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    if COUNT_ALLOCS.load(Relaxed) {
        ALLOCS.fetch_add(1, Relaxed);
    }
    let now = NOW.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counters are only read.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            NOW.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The issue's bound at 100 000 endpoints.
const LIMIT: f64 = 120.0;

fn main() {
    // Under `cargo test --benches` (no `--bench`): one small run as a check.
    let measuring = std::env::args().any(|a| a == "--bench");
    let sizes: &[u32] = if measuring {
        &[1, 10, 100, 1_000, 10_000, 100_000]
    } else {
        &[1, 1_000]
    };
    let ctx = Context::new(Null);
    black_box(bring_up(&ctx, 2));
    println!(
        "readiness of n endpoints of one range (reserve, into_endpoints, create, wait_all), Null driver"
    );
    println!(
        "{:>8} {:>12} {:>12} {:>14} {:>12}",
        "n", "live B/ep", "peak B/ep", "allocations", "ns/ep"
    );
    let mut at_max = None;
    for &n in sizes {
        let before = NOW.load(Relaxed);
        PEAK.store(before, Relaxed);
        let ready = bring_up(&ctx, n);
        let live = NOW.load(Relaxed) - before;
        let peak = PEAK.load(Relaxed) - before;
        drop(ready);
        let reps = (200_000 / n).clamp(3, 1_000);
        let mut best = Duration::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            let ready = bring_up(&ctx, n);
            best = best.min(t.elapsed());
            drop(black_box(ready));
        }
        let per = |b: usize| b as f64 / f64::from(n);
        println!(
            "{n:>8} {:>12.1} {:>12.1} {:>14} {:>12.1}",
            per(live),
            per(peak),
            allocations(&ctx, n),
            best.as_nanos() as f64 / f64::from(n)
        );
        if n == 100_000 {
            at_max = Some(per(peak));
        }
    }
    if let Some(peak) = at_max {
        assert!(
            peak <= LIMIT,
            "{peak:.1} bytes of heap per endpoint at 100 000, above {LIMIT}"
        );
        println!("peak heap per endpoint at 100 000: {peak:.1} B (bound {LIMIT} B)");
    }
}

/// How many allocations one bring-up of `n` makes (counted separately, so
/// the counting does not slow the timed runs).
fn allocations(ctx: &Context, n: u32) -> usize {
    COUNT_ALLOCS.store(true, Relaxed);
    ALLOCS.store(0, Relaxed);
    let ready = bring_up(ctx, n);
    COUNT_ALLOCS.store(false, Relaxed);
    drop(ready);
    ALLOCS.load(Relaxed)
}

static COUNT_ALLOCS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

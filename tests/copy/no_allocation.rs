//! Issue 30, item 1: a loop of small batches allocates nothing per batch.
//! The spare batch state, the inline op list and keep-alives, the stream's
//! record list and the token keep their room from one batch to the next.
//!
//! Counted by this binary's global allocator, per thread, outside driver
//! calls: the context's driver is the model behind [`Outside`], which marks
//! the thread while a call is in the model, so the model's own tables are
//! not counted. What is counted is the crate's work around the call: the
//! builder, the checks, the gate, the record, the token and the wait.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use cuda_endpoints::driver::{CopyOps, Driver, DriverResult};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Context, CopyBatch, CopyPath, Device, Private, Spec, Stream, Strided};

thread_local! {
    /// Allocations of this thread outside driver calls.
    static COUNTED: Cell<u64> = const { Cell::new(0) };
    /// Whether this thread is inside a driver call ([`Outside`]).
    static IN_DRIVER: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, counting each thread's allocations outside
/// driver calls (`alloc`, `alloc_zeroed` and a `realloc` that moves).
struct Counting;

impl Counting {
    fn count() {
        // `try_with`: a thread's last frees run after its locals are gone.
        let _ = IN_DRIVER.try_with(|inside| {
            if !inside.get() {
                let _ = COUNTED.try_with(|n| n.set(n.get() + 1));
            }
        });
    }
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counting touches only `const`-initialised thread-locals without
// destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Counting::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Counting::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Counting::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// This thread's allocations outside driver calls so far.
fn counted() -> u64 {
    COUNTED.with(Cell::get)
}

/// The model, each call marked as inside the driver on the calling thread.
#[derive(Debug)]
struct Outside(Model);

/// Clears the mark when the call returns or unwinds.
struct Mark;

impl Mark {
    fn inside() -> Mark {
        IN_DRIVER.with(|m| m.set(true));
        Mark
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        IN_DRIVER.with(|m| m.set(false));
    }
}

macro_rules! outside_driver {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        impl Driver for Outside {
            fn name(&self) -> String {
                self.0.name()
            }
            fn explain_unsupported(&self, call: cuda_endpoints::driver::Call) -> Option<&'static str> {
                self.0.explain_unsupported(call)
            }
            fn process_scope(&self) -> Option<u64> {
                self.0.process_scope()
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    let _inside = Mark::inside();
                    // SAFETY: the caller's contract, the model's.
                    unsafe { self.0.$method($($arg),*) }
                }
            )*
        }
    };
}

cuda_endpoints::driver::for_each_driver_call!(outside_driver);

const ALIGN: u64 = 2 << 20;
const OP: u64 = 64;

/// The shapes of the batches counted, each of 1 to [`CopyOps::INLINE`] ops
/// of [`OP`] bytes (`batch` in the test builds them).
const SHAPES: [&str; 8] = [
    "puts with a gap between their destinations (one piece each on the portable path)",
    "puts laid end to end (grown into one piece on the portable path)",
    "gets",
    "one put_strided",
    "puts and a get of other bytes",
    "multicast puts (two members; on the portable path one copy each, so at most 2 ops there)",
    "puts through a route (`Stream::route`), each its own batch",
    "multicast puts through a route, each its own batch",
];

/// The test's name in this binary, and the variable that makes a process
/// of it the one that counts.
const ENTRY: &str =
    "no_allocation::issue_30_a_loop_of_batches_of_up_to_four_ops_allocates_nothing_per_batch";
const CHILD: &str = "CUDA_ENDPOINTS_NO_ALLOCATION_CHILD";

/// Rounds counted after the first (in which the spare, the stream's
/// record list and the driver's inline list take their room).
const ROUNDS: usize = 8;

/// Each shape of [`SHAPES`], batches of 1 to [`CopyOps::INLINE`] ops, each
/// enqueued and waited on one stream, round after round: after a first
/// round, no round allocates, on the fabric path (the lane for one put,
/// the general path for more) and on the portable path (one
/// `cuMemcpyAsync` per piece, or one `cuMemcpyBatchAsync`). Counted in a
/// process of its own, this test alone: the spare batch state is one for
/// the process, and another test building a batch at the same moment
/// would hold it, so that a batch here made its own. Every round is
/// asked to be clean, not one of them: a list that grows with the batches
/// allocates only when it doubles, and would pass a test of one round.
#[test]
fn issue_30_a_loop_of_batches_of_up_to_four_ops_allocates_nothing_per_batch() {
    if std::env::var_os(CHILD).is_some() {
        return count_rounds();
    }
    let mut cmd = crate::children::test_binary(ENTRY);
    cmd.env(CHILD, "1");
    // A bound on the wait, not a measure: the child takes well under a
    // second.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let done = crate::children::Guard::spawn("no_allocation", &mut cmd).finish(deadline);
    assert!(
        done.code == Some(0) && done.stdout.contains("1 passed"),
        "the counting process: exit {:?}\n{}{}",
        done.code,
        done.stdout,
        done.stderr
    );
}

/// [`issue_30_a_loop_of_batches_of_up_to_four_ops_allocates_nothing_per_batch`]
/// in its own process.
fn count_rounds() {
    let n_max = CopyOps::INLINE as u64;
    for path in [CopyPath::Fabric, CopyPath::Portable] {
        let model = Model::new(ModelConfig {
            driver_version: 13050,
            ..ModelConfig::node(2)
        });
        let ctx = Context::new(Outside(model.clone()));
        ctx.set_copy_path(path);
        let t = Duration::from_secs(1);
        let ep = ctx.reserve_one().unwrap().create(Spec::unicast(0, ALIGN));
        let ep = ep.unwrap().wait(t).unwrap();
        let team = ctx.reserve_one().unwrap();
        let team = team.create(Spec::multicast(&[Device(0), Device(1)], ALIGN));
        let team = team.unwrap().wait(t).unwrap();
        let mem = |dev| crate::common::mapped::<Private>(&ctx, dev, ALIGN);
        let (dst, src, m0, m1) = (mem(0), mem(0), mem(0), mem(1));
        let bound = ep.bind(0, 0, &dst).unwrap();
        let members = [team.bind(0, 0, &m0).unwrap(), team.bind(1, 0, &m1).unwrap()];
        let stream = Stream::new(&ctx, 0).unwrap();
        let far = ALIGN / 2;
        let batch = |shape: usize, n: u64| -> CopyBatch<'_> {
            let b = CopyBatch::new();
            match shape {
                0 => (0..n).fold(b, |b, i| b.put(&src, i * OP, &ep, 2 * i * OP, OP)),
                1 => (0..n).fold(b, |b, i| b.put(&src, i * OP, &ep, i * OP, OP)),
                2 => (0..n).fold(b, |b, i| b.get(&ep, i * OP, &src, far + i * OP, OP)),
                3 => b.put_strided(&src, 0, &ep, 0, Strided::contiguous(n, OP)),
                4 => (1..n)
                    .fold(b, |b, i| b.put(&src, i * OP, &ep, i * OP, OP))
                    .get(&ep, far, &src, far, OP),
                _ => (0..n).fold(b, |b, i| b.put(&src, i * OP, &team, i * OP, OP)),
            }
        };
        // Made once, as a program would: their puts are counted.
        let mut route = stream.route(&src, &ep);
        let mut to_team = stream.route(&src, &team);
        // Allocations per shape in one round (an array: counting allocates
        // nothing).
        let mut round = || {
            let mut per_shape = [0u64; SHAPES.len()];
            for (shape, count) in per_shape.iter_mut().enumerate() {
                // On the portable path a multicast put is one copy per
                // member: the driver's list holds the copies of two.
                let most = match (shape, path) {
                    (5, CopyPath::Portable) => n_max / 2,
                    _ => n_max,
                };
                for n in 1..=most {
                    let before = counted();
                    match shape {
                        6 => {
                            for i in 0..n {
                                route.put(i * OP, 2 * i * OP, OP).unwrap().wait().unwrap();
                            }
                        }
                        7 => {
                            for i in 0..n {
                                to_team.put(i * OP, 2 * i * OP, OP).unwrap().wait().unwrap();
                            }
                        }
                        _ => {
                            stream.enqueue(batch(shape, n)).unwrap().wait().unwrap();
                        }
                    }
                    *count += counted() - before;
                }
            }
            per_shape
        };
        round();
        let rounds: Vec<_> = (0..ROUNDS).map(|_| round()).collect();
        for (shape, name) in SHAPES.iter().enumerate() {
            let per_round: Vec<u64> = rounds.iter().map(|r| r[shape]).collect();
            assert!(
                per_round.iter().all(|&n| n == 0),
                "{path:?}, {name}: allocations in each of {ROUNDS} rounds of batches of 1 to {n_max} ops: {per_round:?}"
            );
        }
        drop((route, to_team));
        drop((stream, bound, members));
        ep.destroy().unwrap().release().unwrap();
        team.destroy().unwrap().release().unwrap();
        drop((dst, src, m0, m1));
        crate::common::clean(&ctx, &model);
    }
}

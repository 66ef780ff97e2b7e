//! Shared by `benches/lifecycle.rs` (criterion, wall clock) and
//! `benches/instructions.rs` (gungraun, instruction counts): the two sides of
//! the comparison and a pass-through driver.
//!
//! One unicast lifecycle, the same on both sides: reserve one id, create a
//! unicast endpoint on device 0, wait until it is constructed, bind one
//! allocation, unbind, destroy, release.
//!
//! - [`typed`] goes through the typestate API (`Context`, `Endpoint<S, K>`,
//!   `Binding`).
//! - [`raw`] makes the same driver calls on the same `dyn Driver` by hand:
//!   `id_reserve`, `create` (with `Props::to_c()`), `query` until true,
//!   `bind_mem`, `unbind`, `destroy`, `id_release`.
//! - [`raw_with_limits`] adds the one driver call the typed `create` makes on
//!   top of those, `get_limits` with the size check it feeds (R2.3, R10), so
//!   that the typed layer's own bookkeeping can be told apart from that call.
//!
//! [`Null`] is a driver that does nothing, so that the typed layer's cost is
//! not hidden behind the model's mutex and tables.

#![allow(dead_code)] // each bench uses a part

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_endpoints::driver::{
    AllocationRequest, Driver, DriverResult, EndpointProps, FabricHandleBytes, Limits, Shape,
};
use cuda_endpoints::{
    Allocation, Binding, Context, CopyPath, Endpoint, Mapped, Pending, Private, Ready, ReadyList,
    Route, Spec, Stream, Unicast, wait_all,
};
use cuda_endpoints::{Device, Location};

/// Bytes per endpoint and per allocation: one bind alignment of the model's
/// H200-like devices and of [`Null`].
pub const SIZE: u64 = 2 << 20;

/// The owner device of the unicast endpoint and where the memory lives.
pub const OWNER: Device = Device(0);

/// The typed lifecycle.
#[inline(never)]
pub fn typed(ctx: &Context, mem: &Allocation) {
    let ep = ctx.reserve_one().expect("reserve");
    let ep = ep
        .create(Spec::unicast(OWNER, SIZE))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    let binding = ep.bind(OWNER, 0, mem).expect("bind");
    binding.unbind().expect("unbind");
    ep.destroy().expect("destroy").release().expect("release");
}

/// The same driver calls, by hand.
#[inline(never)]
pub fn raw(d: &dyn Driver, mem_handle: u64) {
    let props = EndpointProps::new(Shape::Unicast { owner: OWNER }, SIZE);
    // SAFETY: the ids are reserved here and released below; the memory (the
    // fixture's allocation) outlives the binding, unbound before `destroy`.
    unsafe {
        let id = d.id_reserve(1).expect("reserve");
        d.create(id, props).expect("create");
        while !d.query(id, 1).expect("query") {
            std::hint::spin_loop();
        }
        d.bind_mem(id, OWNER, 0, mem_handle, 0, SIZE, 0)
            .expect("bind");
        d.unbind(id, OWNER, 0, SIZE).expect("unbind");
        d.destroy(id).expect("destroy");
        d.id_release(id, 1).expect("release");
    }
}

/// [`raw`] plus the `get_limits` call (and size check) that the typed
/// `create` makes before `cuLogicalEndpointCreate`.
#[inline(never)]
pub fn raw_with_limits(d: &dyn Driver, mem_handle: u64) {
    let props = EndpointProps::new(Shape::Unicast { owner: OWNER }, SIZE);
    // SAFETY: as in `raw`.
    unsafe {
        let id = d.id_reserve(1).expect("reserve");
        let limits = d.get_limits(props).expect("limits");
        assert!(SIZE <= limits.max_size && SIZE.is_multiple_of(limits.bind_alignment.max(1)));
        d.create(id, props).expect("create");
        while !d.query(id, 1).expect("query") {
            std::hint::spin_loop();
        }
        d.bind_mem(id, OWNER, 0, mem_handle, 0, SIZE, 0)
            .expect("bind");
        d.unbind(id, OWNER, 0, SIZE).expect("unbind");
        d.destroy(id).expect("destroy");
        d.id_release(id, 1).expect("release");
    }
}

/// A context, one allocation on it and the context's driver for the raw side.
pub type Fixture = (Context, Allocation, Arc<dyn Driver>);

/// A context over `driver` and one allocation on [`OWNER`], made once outside
/// the measured loop and used by both sides (`typed` binds the `Allocation`,
/// `raw` its handle through the same driver).
pub fn fixture(driver: impl Driver + 'static) -> Fixture {
    let ctx = Context::new(driver);
    // SAFETY: the raw side names only ids it reserves itself, and binds the
    // allocation's handle only between its own bind and unbind.
    let raw = unsafe { ctx.driver_arc() };
    let mem = Allocation::on_device(&ctx, OWNER, SIZE).expect("allocation");
    // Warm the context's caches (device count, driver version) as a long-lived
    // program has them.
    black_box(ctx.device_count().expect("device count"));
    (ctx, mem, raw)
}

/// A pass-through driver: every call succeeds at once and does nothing.
/// `query` says constructed, `get_limits` says 2 MiB / 1 GiB, 4 devices.
#[derive(Debug, Default)]
pub struct Null;

/// What [`Null`] answers, per method; `Default` for the rest (so that a
/// new call of the table needs nothing here).
macro_rules! null_answer {
    (driver_version) => {
        13040
    };
    (device_count) => {
        4
    };
    (device_attribute) => {
        1
    };
    (mem_get_info) => {
        (1 << 30, 1 << 30)
    };
    (device_clique) => {
        0
    };
    (id_reserve) => {
        1
    };
    (get_limits) => {
        Limits {
            bind_alignment: 2 << 20,
            max_size: 1 << 30,
        }
    };
    (query) => {
        true
    };
    (export) => {
        FabricHandleBytes::ZERO
    };
    (mem_granularity) => {
        2 << 20
    };
    (mem_create) => {
        1
    };
    (mem_properties) => {
        AllocationRequest {
            location: Location::Device(OWNER),
            handle_types: 0,
        }
    };
    (mem_address_reserve) => {
        1 << 40
    };
    (multicast_granularity) => {
        2 << 20
    };
    (multicast_create) => {
        2
    };
    (mem_export) => {
        cuda_endpoints::driver::ShareableHandle::Fabric(FabricHandleBytes::ZERO)
    };
    (mem_import) => {
        3
    };
    (stream_create) => {
        4
    };
    (stream_query) => {
        true
    };
    (stream_end_capture) => {
        5
    };
    (graph_instantiate) => {
        6
    };
    (event_create) => {
        7
    };
    (event_query) => {
        true
    };
    ($other:ident) => {
        ()
    };
}

/// [`Null`], but each address reservation is a fresh one (the portable path
/// refuses a copy of bytes onto themselves, which one address for every
/// mapping would be). It reports 13.4: the batch call (12.8+) is there.
#[derive(Debug)]
pub struct Fresh {
    next: AtomicU64,
}

impl Fresh {
    /// Reservations from 1 TiB on, 4 GiB apart.
    pub fn new() -> Fresh {
        Fresh {
            next: AtomicU64::new(1 << 40),
        }
    }
}

impl Default for Fresh {
    fn default() -> Fresh {
        Fresh::new()
    }
}

macro_rules! fresh_answer {
    ($s:ident, mem_address_reserve, ($($arg:ident),*)) => {
        Ok($s.next.fetch_add(1 << 32, Ordering::Relaxed))
    };
    ($s:ident, $method:ident, ($($arg:ident),*)) => {
        // SAFETY: `Null` does nothing with what it is given.
        unsafe { Null.$method($($arg),*) }
    };
}

macro_rules! fresh_driver {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        #[allow(unused_variables, clippy::unit_arg)]
        impl Driver for Fresh {
            fn name(&self) -> String {
                "null, fresh addresses".into()
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    fresh_answer!(self, $method, ($($arg),*))
                }
            )*
        }
    };
}

cuda_endpoints::driver::for_each_driver_call!(fresh_driver);

/// The whole `Driver` impl, generated from the crate's table of calls.
macro_rules! null_driver {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        #[allow(unused_variables, clippy::unit_arg)]
        impl Driver for Null {
            fn name(&self) -> String {
                "null".into()
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    Ok(null_answer!($method))
                }
            )*
        }
    };
}

cuda_endpoints::driver::for_each_driver_call!(null_driver);

/// `n` ids to ready unicast endpoints, typed: `reserve(n)`, `into_endpoints`,
/// `create` on each, `wait_all` (`benches/readiness*.rs`).
pub fn bring_up(ctx: &Context, n: u32) -> ReadyList<Unicast> {
    let pending: Vec<Endpoint<Pending, Unicast>> = ctx
        .reserve(n)
        .expect("reserve")
        .into_endpoints()
        .into_iter()
        .map(|ep| ep.create(Spec::unicast(OWNER, SIZE)).expect("create"))
        .collect();
    wait_all(pending, Duration::from_secs(1)).expect("wait_all")
}

/// The caches Callgrind simulates for the cold benches ([`evict_caches`]):
/// 32 KiB L1s and a 2 MiB last level, a server core's L2 (a real driver
/// call leaves the crate's lines there or further).
pub const COLD_CACHES: [&str; 3] = ["I1=32768,8,64", "D1=32768,8,64", "LL=2097152,16,64"];

/// Evicts every line of [`COLD_CACHES`]' simulated caches, code and data:
/// writes a line of every 64 bytes of 8 MiB, then runs 4,096 multiplies
/// laid one after another (about 76 KiB of code: 19 bytes each, through
/// the stack for `black_box`). Called by a cold bench's
/// setup, outside what is counted: the bench then reads every line it
/// touches from memory once, and Callgrind's misses of the last level are
/// its footprint: of code (`ILmr`), of data read and written (`DLmr`,
/// `DLmw`; these move by a few lines with the stack's alignment, which
/// follows the length of the binary's path, so compare code lines).
#[inline(never)]
pub fn evict_caches() {
    const BYTES: usize = 8 << 20;
    static mut BUF: [u8; BYTES] = [0; BYTES];
    // SAFETY: only this function touches `BUF`, and a bench's setup runs on
    // one thread.
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(BUF) };
    for line in buf.chunks_mut(64) {
        line[0] = line[0].wrapping_add(1);
    }
    black_box(long_code(black_box(buf[0].into())));
}

/// 4,096 steps, each its own instructions (`black_box` keeps the compiler
/// from folding them into a loop).
#[inline(never)]
fn long_code(mut x: u64) -> u64 {
    macro_rules! four {
        ($($t:tt)*) => {
            $($t)* $($t)* $($t)* $($t)*
        };
    }
    four! {four! {four! {four! {four! {four! {
        x = black_box(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }}}}}}
    x
}

/// A ready unicast endpoint of [`SIZE`] owned by [`OWNER`].
pub fn ready_unicast(ctx: &Context) -> Endpoint<Ready, Unicast> {
    ctx.reserve_one()
        .expect("reserve")
        .create(Spec::unicast(OWNER, SIZE))
        .expect("create")
        .wait(Duration::ZERO)
        .expect("wait")
}

/// What the copy benches' two sides use, made once per process and kept
/// until it exits, so the typed side's borrows are `'static`: a context on
/// [`CopyWorld::new`]'s driver taking its copy path, a unicast endpoint
/// bound by address (which gives it a window) to `dst` for the whole
/// process, the source `src`, and a stream, all on [`OWNER`].
pub struct CopyWorld {
    pub fx: Fixture,
    pub ep: Endpoint<Ready, Unicast>,
    pub src: Mapped<Private>,
    pub dst: Mapped<Private>,
    pub stream: Stream,
}

/// A route of a world's one put (`Stream::route`).
pub type WorldRoute = Route<'static, Private, Ready, Unicast>;

impl CopyWorld {
    /// A route from the source to the endpoint, made once as a program
    /// would, and two of its puts waited (the stream's record list warm),
    /// leaked for a bench's one call.
    pub fn route(&'static self) -> &'static mut WorldRoute {
        let route = Box::leak(Box::new(self.stream.route(&self.src, &self.ep)));
        for _ in 0..2 {
            route.put(0, 0, 64).expect("route").wait().expect("wait");
        }
        route
    }
}

impl CopyWorld {
    /// The world on `driver`, copies on `path`.
    pub fn new(driver: impl Driver + 'static, path: CopyPath) -> &'static CopyWorld {
        let fx = fixture(driver);
        fx.0.set_copy_path(path);
        let ep = ready_unicast(&fx.0);
        let map = || {
            Allocation::<Private>::on_device(&fx.0, OWNER, SIZE)
                .expect("allocation")
                .map(&[OWNER])
                .expect("map")
        };
        let (src, dst) = (map(), map());
        let stream = Stream::new(&fx.0, OWNER).expect("stream");
        let w: &'static CopyWorld = Box::leak(Box::new(CopyWorld {
            fx,
            ep,
            src,
            dst,
            stream,
        }));
        let b: Binding<'static> = w.ep.bind(OWNER, 0, &w.dst).expect("bind");
        std::mem::forget(b); // bound for the whole process
        w
    }
}

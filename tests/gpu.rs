//! The real-hardware suite (feature `gpu`): the typed API on `libcuda`.
//!
//! Every test first denies `cuMulticastCreate` process-wide ([`guard`]): on a
//! several-GPU host that call can take the GPUs out of service (see CONTRIBUTING.md, facts of
//! the GPU machines), so the suite proves the library refuses *before* it,
//! and never makes it. Each test skips cleanly ("skipped: no driver") where
//! `libcuda` is absent, checks that device memory is back where it started
//! (`cuMemGetInfo`), and runs on one GPU or several:
//!
//! - the capability probe of every device;
//! - VMM allocations of each handle type, sized in granularities; data written
//!   by the device and by copies, read back through a mapping;
//! - 1000 allocate/map/drop cycles with no device memory lost;
//! - logical endpoints reported `Unsupported` with the driver version (on a
//!   driver before 13.3);
//! - the classic fallback refusing a team before `cuMulticastCreate` (a
//!   [`Traced`] log proves the call never reached the driver);
//! - a put and a get from a thread with no context current (the stream
//!   calls made as they are), the thread left with none;
//! - the portable data path across two processes (issue 19, item 7): classic
//!   unicast endpoints (bookkeeping, no driver object), each process puts
//!   into and gets from the other's memory through `add_peer_window` and
//!   `cuMemcpyAsync`, every byte checked, no `cuMulticast*` call in the trace;
//! - on several GPUs: allocations on each device that report their device
//!   (what the pre-driver R5.5 check reads), a runtime team from
//!   `ctx.devices()`, and backend selection with the classic path switched
//!   off.
//!
//! Build here, run on the GPU machine: `scripts/gpu-suite.sh` (see
//! CONTRIBUTING.md, "The GPU suite"). Run single-threaded (`--test-threads=1`) so the
//! memory checks see one test at a time.

#![cfg(feature = "gpu")]

#[path = "common/children.rs"]
mod children;

use std::sync::{Arc, Once};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use cuda_endpoints::Location;
use cuda_endpoints::backend::{BackendChoice, Policy, decide};
use cuda_endpoints::driver::cuda::{self, Cuda};
use cuda_endpoints::driver::{AllocationRequest, Classic, Granularity, Traced, handle_bits};
use cuda_endpoints::probe::Capabilities;
use cuda_endpoints::{
    Allocation, Context, Device, Error, FabricShareable, PosixFd, Private, Spec,
    driver::{Call, Code},
};

/// Denies `cuMulticastCreate` for the whole process, once, before anything
/// else; then checks that it is denied.
fn guard() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        cuda::deny(&[Call::MulticastCreate]);
        // `RUST_LOG=cuda_endpoints=debug` shows every driver call.
        let targets = std::env::var("RUST_LOG")
            .ok()
            .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
            .unwrap_or_default();
        let _ = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_test_writer())
            .with(targets)
            .try_init();
    });
    assert!(
        cuda::is_denied(Call::MulticastCreate),
        "cuMulticastCreate must be denied before any GPU test runs"
    );
}

/// The real driver, or `None` (printed "skipped: no driver") without one.
fn cuda_ctx() -> Option<Context> {
    guard();
    match Context::cuda() {
        Ok(ctx) => Some(ctx),
        Err(Error::NoDriver { reason }) => {
            println!("skipped: no driver ({reason})");
            None
        }
        Err(e) => panic!("Context::cuda() failed: {e}"),
    }
}

/// A second, traced instance of the real driver that also denies
/// `cuMulticastCreate` itself (belt and braces over the global deny).
fn traced_cuda() -> Arc<Traced<Cuda>> {
    let cuda = Cuda::open().unwrap_or_else(|e| panic!("Cuda::open: {e}"));
    Arc::new(Traced::new(cuda).deny([Call::MulticastCreate]))
}

/// Raw queries beside the typed API (they touch nothing a typed object owns).
fn raw(ctx: &Context) -> Arc<dyn cuda_endpoints::driver::Driver> {
    // SAFETY: the callers below only make queries through it.
    unsafe { ctx.driver_arc() }
}

fn mem_info(ctx: &Context, d: Device) -> cuda_endpoints::driver::DriverResult<(u64, u64)> {
    // SAFETY: a memory-info query touches nothing anyone owns.
    unsafe { raw(ctx).mem_get_info(d) }
}

fn mem_props(
    ctx: &Context,
    handle: u64,
) -> cuda_endpoints::driver::DriverResult<AllocationRequest> {
    // SAFETY: a property query touches nothing anyone owns.
    unsafe { raw(ctx).mem_properties(handle) }
}

fn granularity(ctx: &Context, dev: Device, bits: u32) -> u64 {
    let req = AllocationRequest {
        location: Location::Device(dev),
        handle_types: bits,
    };
    // SAFETY: a granularity query touches nothing anyone owns.
    unsafe { raw(ctx).mem_granularity(req, Granularity::Minimum) }
        .unwrap_or_else(|c| panic!("cuMemGetAllocationGranularity on {dev}: {c}"))
}

/// A per-device size valid for a classic team of `team`: the VMM
/// granularity rounded up to the classic backend's bind alignment (the
/// multicast granularity, C2) where the limits can be read — they cannot
/// where attribute 132 is 0, and nothing is asked of the driver then.
fn classic_size(classic: &Context, team: &[Device], gran: u64) -> u64 {
    let prop = Spec::multicast(team, gran).props();
    // SAFETY: a limits query touches nothing anyone owns.
    match unsafe { raw(classic).get_limits(prop) } {
        Ok(l) => gran.div_ceil(l.bind_alignment.max(1)) * l.bind_alignment.max(1),
        Err(_) => gran,
    }
}

/// Free device memory at the start of a test; [`Leak::check`] compares at
/// the end, allowing `slack` granularities for the driver's own lazily
/// allocated bookkeeping (page tables).
struct Leak {
    before: Vec<(Device, u64, u64)>,
}

impl Leak {
    fn start(ctx: &Context) -> Leak {
        let before = ctx
            .devices()
            .expect("device count")
            .into_iter()
            .map(|d| {
                let (free, _) =
                    mem_info(ctx, d).unwrap_or_else(|c| panic!("cuMemGetInfo on {d}: {c}"));
                (d, free, granularity(ctx, d, handle_bits::NONE))
            })
            .collect();
        Leak { before }
    }

    fn check(self, ctx: &Context, slack: u64) {
        assert!(
            ctx.take_teardown_errors().is_empty(),
            "teardown errors recorded"
        );
        for (d, before, gran) in self.before {
            let (after, _) = mem_info(ctx, d).expect("cuMemGetInfo");
            let lost = before.saturating_sub(after);
            println!("{d}: free before {before}, after {after} bytes");
            assert!(
                lost <= slack * gran,
                "{d}: {lost} bytes of device memory not given back (allowed {})",
                slack * gran
            );
        }
    }
}

#[test]
fn probe_every_device() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let all = Capabilities::probe_all(&ctx);
    assert_eq!(all.len() as i32, ctx.device_count().unwrap());
    for caps in &all {
        println!("{caps}\n");
        assert!(caps.driver_version.known().is_some());
        assert!(caps.classic_multicast.known().is_some());
        assert!(caps.memory.known().is_some());
        assert!(caps.vmm_granularity[0].minimum.known().is_some());
    }
    leak.check(&ctx, 1);
}

#[test]
fn allocations_of_each_handle_type() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    for dev in ctx.devices().unwrap() {
        let gran = granularity(&ctx, dev, handle_bits::NONE);
        assert!(gran > 0);
        let size = 3 * gran;
        // Private and PosixFd must work; sizes come back as asked (a
        // multiple of the granularity).
        let a = Allocation::<Private>::on_device(&ctx, dev, size).unwrap();
        assert_eq!(a.size(), size);
        let b = Allocation::<PosixFd>::on_device(&ctx, dev, size).unwrap();
        assert_eq!(b.size() % granularity(&ctx, dev, handle_bits::POSIX_FD), 0);
        println!("{dev}: Private and PosixFd allocations of {size} bytes: ok");
        drop((a, b));
        // Fabric: works with a fabric daemon; refused without one (the H200
        // test machine), either at cuMemCreate or already at the granularity
        // query.
        match Allocation::<FabricShareable>::on_device(&ctx, dev, size) {
            Ok(f) => println!("{dev}: Fabric allocation of {} bytes: ok", f.size()),
            Err(Error::FabricNotPermitted { device, call }) => {
                assert_eq!(device, dev);
                println!("{dev}: Fabric allocation refused at {call}: FabricNotPermitted");
            }
            Err(
                e @ Error::Driver {
                    call: Call::MemGetAllocationGranularity,
                    code,
                },
            ) if [
                Code::NOT_PERMITTED,
                Code::NOT_SUPPORTED,
                Code::INVALID_VALUE,
            ]
            .contains(&code) =>
            {
                println!("{dev}: Fabric granularity refused: {e}")
            }
            Err(e) => panic!("Fabric allocation on {dev}: {e}"),
        }
        // Where the driver says the memory lives, with the handle types asked.
        let a = Allocation::<PosixFd>::on_device(&ctx, dev, 1).unwrap();
        let props = mem_props(&ctx, a.handle()).unwrap();
        assert_eq!(props.location, Location::Device(dev));
        assert_eq!(
            props.handle_types & handle_bits::POSIX_FD,
            handle_bits::POSIX_FD
        );
        assert_eq!(a.size() % granularity(&ctx, dev, handle_bits::POSIX_FD), 0);
    }
    leak.check(&ctx, 2);
}

#[test]
fn device_writes_read_back_through_a_mapping() {
    use cudarc::driver::{CudaContext, result};
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    for dev in ctx.devices().unwrap() {
        let cx = CudaContext::new(dev.0 as usize).expect("cudarc context");
        let (ctx2, dev2) = Context::from_cudarc(&cx).expect("Context::from_cudarc");
        assert_eq!(dev2, dev);
        drop(ctx2);
        let gran = granularity(&ctx, dev, handle_bits::NONE);
        let mapped = Allocation::<Private>::on_device(&ctx, dev, gran)
            .unwrap()
            .map(&[dev])
            .unwrap();
        let ptr = mapped.device_ptr();
        let n = mapped.size() as usize;
        cx.bind_to_thread().unwrap();
        // The device writes (cuMemsetD8 runs on the GPU); the host reads.
        let mut back = vec![0u8; n];
        // SAFETY: `ptr` is `n` bytes of mapped device memory of `dev` with
        // read-write access, alive until `mapped` drops below; `back` holds
        // `n` bytes. The copies are synchronous (pageable host memory).
        unsafe {
            result::memset_d8_sync(ptr, 0x5a, n).unwrap();
            result::memcpy_dtoh_sync(&mut back, ptr).unwrap();
        }
        assert!(back.iter().all(|&b| b == 0x5a), "{dev}: memset not seen");
        // A pattern there and back.
        let words: Vec<u32> = (0..(n / 4) as u32)
            .map(|i| i.wrapping_mul(2654435761))
            .collect();
        let mut again = vec![0u32; words.len()];
        // SAFETY: as above; `words` and `again` are `n` bytes each.
        unsafe {
            result::memcpy_htod_sync(ptr, &words).unwrap();
            result::memcpy_dtoh_sync(&mut again, ptr).unwrap();
        }
        assert_eq!(again, words, "{dev}: pattern did not survive");
        println!("{dev}: {n} bytes written by the device and by copies, read back intact");
        drop(mapped);
        drop(cx);
    }
    leak.check(&ctx, 2);
}

/// A cudarc stream as the crate's `Stream` (feature `cudarc`): cudarc's
/// legacy NULL default stream is refused (F6), a stream of its own carries
/// events in order, and cudarc, not the crate, destroys it.
#[test]
fn cudarc_stream_interop_refuses_the_null_stream_and_orders_events() {
    use cuda_endpoints::{Event, Stream};
    use cudarc::driver::CudaContext;
    let Some(ctx) = cuda_ctx() else { return };
    let dev = ctx.devices().unwrap()[0];
    let cx = CudaContext::new(dev.0 as usize).expect("cudarc context");
    let (ctx2, _) = Context::from_cudarc(&cx).expect("Context::from_cudarc");
    assert!(matches!(
        Stream::from_cudarc(&ctx2, &cx.default_stream()),
        Err(cuda_endpoints::Error::NullStream)
    ));
    let theirs = cx.new_stream().expect("cudarc stream");
    let stream = Stream::from_cudarc(&ctx2, &theirs).expect("Stream::from_cudarc");
    assert_eq!(stream.device(), dev);
    let mut e = Event::new(&ctx2, dev).unwrap();
    e.record(&stream).unwrap();
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    drop(e);
    drop(stream);
    // Still cudarc's, still usable: it synchronizes and destroys it.
    theirs
        .synchronize()
        .expect("cudarc's stream outlives the crate's view");
    drop(theirs);
    assert!(ctx2.take_teardown_errors().is_empty());
}

#[test]
fn thousand_allocate_map_drop_cycles() {
    let Some(ctx) = cuda_ctx() else { return };
    let dev = Device(0);
    let gran = granularity(&ctx, dev, handle_bits::NONE);
    let cycle = || {
        let m = Allocation::<Private>::on_device(&ctx, dev, gran)
            .unwrap()
            .map(&[dev])
            .unwrap();
        assert_ne!(m.device_ptr(), 0);
    };
    // Warm-up: let the driver build its own structures first.
    for _ in 0..3 {
        cycle();
    }
    let (start, _) = mem_info(&ctx, dev).unwrap();
    for _ in 0..1000 {
        cycle();
    }
    let (end, _) = mem_info(&ctx, dev).unwrap();
    println!("1000 cycles of {gran} bytes: free {start} -> {end} bytes");
    assert!(
        start.abs_diff(end) <= gran,
        "free memory moved by {} bytes over 1000 cycles (granularity {gran})",
        start.abs_diff(end)
    );
    assert!(ctx.take_teardown_errors().is_empty());
}

#[test]
fn logical_endpoints_unsupported_with_the_driver_version() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let version = ctx.driver_version().expect("cuDriverGetVersion");
    match ctx.reserve(1) {
        Err(Error::Unsupported {
            feature,
            driver_version,
            detail,
        }) => {
            assert!(
                version < 13030,
                "driver {version} should have logical endpoints"
            );
            assert_eq!(driver_version, Some(version));
            assert_eq!(feature, cuda_endpoints::error::Feature::LogicalEndpoints);
            println!("reserve on driver {version}: Unsupported: {feature}: {detail}");
        }
        Ok(range) => {
            assert!(version >= 13030);
            println!("driver {version} has logical endpoints: reserved {range:?}");
            range.release().unwrap();
        }
        Err(e) => panic!("reserve on driver {version}: {e}"),
    }
    leak.check(&ctx, 1);
}

#[test]
fn classic_fallback_never_reaches_multicast_create() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let team = ctx.devices().unwrap();
    let traced = traced_cuda();
    let classic = Context::new(Classic::new(traced.clone()));
    let capable: Vec<bool> = team
        .iter()
        .map(|&d| ctx.attribute(d, 132).unwrap_or(0) == 1)
        .collect();
    assert!(cuda::is_denied(Call::MulticastCreate));
    let gran = granularity(&ctx, team[0], handle_bits::NONE);
    let size = classic_size(&classic, &team, gran);
    let e = classic
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&team, size))
        .unwrap_err();
    println!(
        "classic team of {team:?} (MULTICAST_SUPPORTED {capable:?}): {}",
        e.error
    );
    if capable.iter().all(|&c| c) {
        // The last enrollment would create: the policy refuses it, and the
        // classic backend names the call that was refused.
        assert!(
            matches!(
                e.error,
                Error::Driver {
                    call: Call::MulticastCreate,
                    code,
                } if code == Code::NOT_PERMITTED
            ),
            "{}",
            e.error
        );
        let creates = traced.entries(Call::MulticastCreate);
        assert!(!creates.is_empty() && creates.iter().all(|c| c.denied));
    } else {
        // C6: refused on attribute 132, before any cuMulticast* call that
        // could create something.
        assert!(e.error.is_unsupported(), "{}", e.error);
        assert_eq!(traced.count(Call::MulticastCreate), 0);
        assert_eq!(traced.count(Call::MulticastGetGranularity), 0);
    }
    assert!(!traced.reached(Call::MulticastCreate));
    assert!(!traced.reached(Call::MulticastAddDevice));
    e.value.release().unwrap();
    for entry in traced.log() {
        println!("  {entry}");
    }
    drop(classic);
    leak.check(&ctx, 1);
}

/// A put and a get, each waited, from a thread with no context current, as
/// a program that uses this crate alone makes them (the backend leaves no
/// context behind): the bytes come back, and the thread is left with none
/// current. (The backend makes its stream calls as they are; whether this
/// driver took them in the stream's context or refused the first, made
/// again in the device's primary context, the log says with
/// `RUST_LOG=cuda_endpoints=debug`, and `gpu_copy` prints what a raw
/// `cuMemcpyAsync` answers there.)
#[test]
fn a_put_from_a_thread_with_no_context_current_lands_and_leaves_none() {
    use cuda_endpoints::{CopyBatch, Stream};
    use cudarc::driver::result::ctx as cu_ctx;
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let dev = ctx.devices().unwrap()[0];
    let traced = traced_cuda();
    let (c, _) = Context::auto(traced.clone(), &[dev], &Policy::from_env()).expect("Context::auto");
    let gran = granularity(&ctx, dev, handle_bits::NONE);
    let t = std::time::Duration::from_secs(30);
    let ep = c
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(dev, gran))
        .unwrap()
        .wait(t)
        .unwrap();
    let own = Allocation::<Private>::on_device(&c, dev, gran)
        .unwrap()
        .map(&[dev])
        .unwrap();
    let bound = ep.bind(dev, 0, &own).unwrap();
    let stream = Stream::new(&c, dev).unwrap();
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let (back, before, after) = std::thread::scope(|s| {
        s.spawn(|| {
            // Whether one is current (the handle stays on this thread).
            let before = cu_ctx::get_current().expect("cuCtxGetCurrent").is_some();
            let put = CopyBatch::new().put_host(bytes.clone(), &ep, 0);
            stream.enqueue(put).unwrap().wait().unwrap();
            let get = CopyBatch::new().get_host(&ep, 0, 4096);
            let back = stream.enqueue(get).unwrap().wait().unwrap();
            let after = cu_ctx::get_current().expect("cuCtxGetCurrent").is_some();
            (back, before, after)
        })
        .join()
        .unwrap()
    });
    assert!(!before, "a new thread starts with no context current");
    assert_eq!(back.received.first(), Some(&bytes), "the bytes came back");
    assert!(!after, "the copies left a context current");
    println!("{dev}: 4,096 bytes put and got back from a thread with no context current");
    assert!(!traced.reached(Call::MulticastCreate));
    drop(stream);
    bound.unbind().unwrap();
    drop(own);
    ep.destroy().unwrap().release().unwrap();
    drop(c);
    leak.check(&ctx, 1);
}

// ---------------------------------------------------------------- several GPUs

/// The devices when there are at least two, else `None` (printed).
fn several(ctx: &Context) -> Option<Vec<Device>> {
    let devices = ctx.devices().unwrap();
    if devices.len() < 2 {
        println!("skipped: {} device(s), needs 2", devices.len());
        return None;
    }
    Some(devices)
}

#[test]
fn multi_gpu_allocations_report_their_device() {
    let Some(ctx) = cuda_ctx() else { return };
    let Some(devices) = several(&ctx) else { return };
    let leak = Leak::start(&ctx);
    let allocs: Vec<_> = devices
        .iter()
        .map(|&d| Allocation::<Private>::on_device(&ctx, d, 1).unwrap())
        .collect();
    for (a, &d) in allocs.iter().zip(&devices) {
        // What the R5.5 check compares with the bind's device, and the
        // driver's own answer for the handle.
        assert_eq!(a.location(), Location::Device(d));
        let props = mem_props(&ctx, a.handle()).unwrap();
        assert_eq!(props.location, Location::Device(d), "driver says otherwise");
        println!("{d}: allocation {:#x} lives on {d}", a.handle());
    }
    // A device-1 mapping readable by device 0 (peer access over NVLink).
    let m = Allocation::<Private>::on_device(&ctx, devices[1], 1)
        .unwrap()
        .map(&[devices[0], devices[1]]);
    match m {
        Ok(m) => println!(
            "{} memory mapped for {} too at {:#x}",
            devices[1],
            devices[0],
            m.device_ptr()
        ),
        Err(f) => println!("peer mapping refused: {}", f.error),
    }
    drop(allocs);
    leak.check(&ctx, 2);
}

#[test]
fn multi_gpu_backend_choice_with_classic_switched_off() {
    let Some(ctx) = cuda_ctx() else { return };
    let Some(devices) = several(&ctx) else { return };
    let leak = Leak::start(&ctx);
    let traced = traced_cuda();
    let off = Policy::new().classic(false);
    let decision = decide(&*traced, &devices, &off);
    println!("classic off:\n{decision}");
    let on = decide(&*traced, &devices, &Policy::new().classic(true));
    println!("classic opted in (decision only, nothing built):\n{on}");
    println!(
        "from the environment:\n{}",
        decide(&*traced, &devices, &Policy::from_env())
    );
    assert!(
        traced
            .calls()
            .iter()
            .all(|c| matches!(c, Call::DriverGetVersion | Call::DeviceGetAttribute)),
        "decide must only read: {:?}",
        traced.calls()
    );
    assert_ne!(decision.choice, BackendChoice::Classic);
    if decision.logical_endpoints_available {
        assert_eq!(decision.choice, BackendChoice::LogicalEndpoints);
    } else {
        assert!(matches!(decision.choice, BackendChoice::Unsupported(_)));
        if decision.classic_available {
            // The two-H200 machine: classic WOULD be chosen, but is off.
            assert_eq!(on.choice, BackendChoice::Classic);
            let BackendChoice::Unsupported(why) = &decision.choice else {
                unreachable!()
            };
            assert!(why.contains("switched off"), "{why}");
        }
        // Context::auto still gives unicast endpoints and copies there
        // (the classic emulation); only its multicast answer is refused.
        let (auto, d) = Context::auto(traced.clone(), &devices, &off).unwrap();
        assert!(matches!(d.choice, BackendChoice::Unsupported(_)), "{d}");
        drop(auto);
    }
    assert!(!traced.reached(Call::MulticastCreate));
    leak.check(&ctx, 1);
}

#[test]
fn multi_gpu_runtime_team_from_the_devices() {
    let Some(ctx) = cuda_ctx() else { return };
    let Some(devices) = several(&ctx) else { return };
    let leak = Leak::start(&ctx);
    let gran = granularity(&ctx, devices[0], handle_bits::NONE);
    // Logical endpoints on the plain driver: ids only. No multicast object
    // is ever built on these shared machines, by either API.
    match ctx.reserve_one() {
        Err(e @ Error::Unsupported { .. }) => println!("logical endpoints: {e}"),
        Ok(ep) => {
            println!("logical endpoints available; not building a team here");
            ep.release().unwrap();
        }
        Err(e) => panic!("reserve: {e}"),
    }
    // The classic path over a traced driver: refused before the driver.
    let traced = traced_cuda();
    let classic = Context::new(Classic::new(traced.clone()));
    let team = classic.devices().unwrap();
    let size = classic_size(&classic, &team, gran);
    let r = classic
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&team, size));
    let e = r.expect_err("a classic team needs cuMulticastCreate, which is denied");
    println!("classic team of {devices:?}: {}", e.error);
    e.value.release().unwrap();
    assert!(!traced.reached(Call::MulticastCreate));
    for entry in traced.entries(Call::MulticastCreate) {
        println!("  {entry}");
    }
    drop(classic);
    leak.check(&ctx, 1);
}

// ------------------------------------------------- two child ranks

/// The environment of a child rank: its rank, and the directory the two
/// ranks of one run share (the bootstrap id file).
const RANK_VAR: &str = "CUDA_ENDPOINTS_GPU_RANK";
const DIR_VAR: &str = "CUDA_ENDPOINTS_GPU_DIR";

/// Runs the test `entry` as two child ranks of this binary (with `envs`
/// besides their rank and directory), prints each rank's lines that start
/// with `tag:` (behind `label`), and asserts that both exited 0 after
/// printing `{tag}: done`.
fn two_ranks(entry: &str, tag: &str, label: &str, envs: &[(&str, String)]) {
    let dir = std::env::temp_dir().join(format!(
        "cuda-endpoints-gpu-{tag}-{}-{label}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ranks = children::Children::default();
    for r in 0..2 {
        let mut envs = envs.to_vec();
        envs.push((RANK_VAR, r.to_string()));
        envs.push((DIR_VAR, dir.display().to_string()));
        ranks.spawn(&format!("rank {r}"), entry, &envs);
    }
    let mut ok = 0;
    let prefix = format!("{tag}:");
    for d in ranks.wait_all(std::time::Duration::from_secs(120)) {
        for line in d.stdout.lines().filter(|l| l.starts_with(&prefix)) {
            println!("[{label}] {} {line}", d.name);
        }
        if d.code == Some(0) && d.stdout.contains(&format!("{tag}: done")) {
            ok += 1;
        } else {
            println!(
                "[{label}] {} failed (exit {:?}):\n{}\n{}",
                d.name, d.code, d.stdout, d.stderr
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(ok, 2, "both ranks must finish ({label})");
}

/// A child rank of [`two_ranks`], started: its rank, context and device,
/// the other rank and its device, and the TCP bootstrap on loopback that
/// joins them (rank 0 writes the id file in the run's directory, rank 1
/// reads it). Rank r is on device r % n.
struct Rank(
    usize,
    Context,
    Device,
    usize,
    Device,
    cuda_endpoints::bootstrap::Tcp,
);

impl Rank {
    /// Every wait of a child rank is bounded by this.
    const T: std::time::Duration = std::time::Duration::from_secs(30);

    /// `None` unless this process is a child rank.
    fn start() -> Option<Rank> {
        use cuda_endpoints::bootstrap::{BootstrapError, IdProblem, Tcp, UniqueId};
        let rank: usize = std::env::var(RANK_VAR).ok()?.parse().unwrap();
        let dir = std::path::PathBuf::from(std::env::var(DIR_VAR).unwrap());
        let t = Rank::T;
        let ctx = cuda_ctx().expect("a driver in the child");
        let devs = ctx.devices().unwrap();
        let id_file = dir.join("id");
        let boot = if rank == 0 {
            let (id, root) = Tcp::root("127.0.0.1:0".parse().unwrap()).unwrap();
            id.write_file(&id_file)
                .map_err(|e| BootstrapError::InvalidId {
                    what: IdProblem::File {
                        path: id_file.clone(),
                        kind: e.kind(),
                    },
                })
                .unwrap();
            root.accept(2, t).unwrap()
        } else {
            Tcp::join(&UniqueId::read_file(&id_file, t).unwrap(), 1, 2, t).unwrap()
        };
        let (dev, peer_rank) = (devs[rank % devs.len()], 1 - rank);
        let peer_dev = devs[peer_rank % devs.len()];
        Some(Rank(rank, ctx, dev, peer_rank, peer_dev, boot))
    }
}

// ------------------------------------------------- two processes share memory

/// The teardown order of a child rank of [`two_processes_share_posix_fd_memory`].
const SHARE_ORDER: &str = "CUDA_ENDPOINTS_GPU_SHARE_ORDER";

/// Two OS processes, one per GPU (both on GPU 0 where there is one), join
/// the TCP bootstrap on loopback, exchange `PosixFd` allocations (the
/// descriptor passed with `SCM_RIGHTS`), each maps the other's, writes on
/// its own GPU and reads back what the peer wrote; then they tear down in
/// one order and, in a second run, the other. Then the team bring-up call,
/// with the classic backend switched off and `cuMulticastCreate` denied,
/// fails on both ranks naming the root and the step, and the trace shows
/// that `cuMulticastCreate` never reached the driver. Free memory is back
/// to its start on every GPU.
#[test]
fn two_processes_share_posix_fd_memory() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let n = ctx.devices().unwrap().len();
    println!("two processes on {n} GPU(s): rank r uses device r % {n}");
    for order in ["importer-first", "owner-first"] {
        two_ranks(
            "share_child",
            "share",
            order,
            &[(SHARE_ORDER, order.to_owned())],
        );
    }
    leak.check(&ctx, 2);
}

/// One rank of [`two_processes_share_posix_fd_memory`]; a no-op unless run
/// as a child.
#[test]
fn share_child() {
    use cuda_endpoints::{bootstrap::Bootstrap, bootstrap::FdExchange, team};
    use cudarc::driver::{CudaContext, result};

    let Some(Rank(rank, ctx, dev, peer_rank, peer_dev, boot)) = Rank::start() else {
        return;
    };
    let t = Rank::T;
    let order = std::env::var(SHARE_ORDER).unwrap();
    let gran = granularity(&ctx, dev, handle_bits::POSIX_FD);

    // Each rank's own PosixFd allocation, exported; the descriptors cross
    // with SCM_RIGHTS; each imports the other's.
    let own = Allocation::<PosixFd>::on_device(&ctx, dev, gran).unwrap();
    let fd = own.export_fd().unwrap();
    let mut fds = FdExchange::allgather_fds(&boot, std::os::fd::AsFd::as_fd(&fd), t).unwrap();
    let theirs = fds.swap_remove(peer_rank);
    let peer = Allocation::<PosixFd>::import_fd(&ctx, &theirs, own.size()).unwrap();
    assert_eq!(peer.location(), Location::Device(peer_dev));
    println!(
        "share: {dev} exported {} bytes; imported rank {peer_rank}'s from {peer_dev}",
        own.size()
    );
    let own = own.map(&[dev]).unwrap();
    let peer = peer.map(&[dev]).unwrap();

    // Write on this rank's GPU into its own memory; read the peer's.
    let cx = CudaContext::new(dev.0 as usize).unwrap();
    cx.bind_to_thread().unwrap();
    let n = own.size() as usize;
    let mine = 0x11u8 * (rank as u8 + 1);
    let expect = 0x11u8 * (peer_rank as u8 + 1);
    // SAFETY: `own` is `n` bytes of mapped device memory with read-write
    // access for `dev`, alive until dropped below; synchronous memset.
    unsafe { result::memset_d8_sync(own.device_ptr(), mine, n).unwrap() };
    boot.barrier(t).unwrap();
    let mut back = vec![0u8; n];
    // SAFETY: `peer` is `n` bytes mapped with access for `dev`; `back` holds
    // `n` bytes; synchronous copy.
    unsafe { result::memcpy_dtoh_sync(&mut back, peer.device_ptr()).unwrap() };
    let good = back.iter().filter(|&&b| b == expect).count();
    println!(
        "share: read {good} of {n} bytes = {expect:#04x} written by rank {peer_rank} on {peer_dev}"
    );
    assert_eq!(
        good, n,
        "rank {rank} did not read what rank {peer_rank} wrote"
    );
    boot.barrier(t).unwrap();

    // Teardown in the order of this run.
    if order == "importer-first" {
        drop(peer);
        drop(theirs);
        boot.barrier(t).unwrap();
        drop(own);
    } else {
        drop(own);
        boot.barrier(t).unwrap();
        drop(peer);
        drop(theirs);
    }
    drop(fd);
    boot.barrier(t).unwrap();

    // The team bring-up with the classic backend switched off and
    // cuMulticastCreate denied: it fails on both ranks, naming the root and
    // the step, and never reaches cuMulticastCreate.
    let decision = decide(&*raw(&ctx), &[dev], &Policy::from_env());
    println!("share: backend for the team: {}", decision.choice);
    assert!(
        !matches!(decision.choice, BackendChoice::Classic),
        "classic multicast may not be chosen here"
    );
    let traced = traced_cuda();
    // `Context::auto` (issue 28): before 13.3, the classic emulation
    // without multicast, whose team is refused naming 13.3 and the version.
    let (auto, auto_decision) =
        Context::auto(traced.clone(), &[dev], &Policy::from_env()).expect("Context::auto");
    let mut backends = vec![
        ("logical endpoints", Context::new(traced.clone())),
        (
            "classic (forced)",
            Context::new(Classic::new(traced.clone())),
        ),
    ];
    if auto_decision.unicast == BackendChoice::Classic {
        backends.push(("Context::auto", auto));
    }
    for (name, backend) in backends {
        let spec = team::TeamSpec::new([dev], gran).timeout(t);
        let e = team::multicast(&backend, &boot, &spec).expect_err("no team on this driver");
        println!(
            "share: {name}: rank {} step {}: {}",
            e.rank, e.step, e.cause
        );
    }
    let creates = traced.entries(Call::MulticastCreate);
    assert!(
        creates.iter().all(|c| c.denied),
        "cuMulticastCreate reached the driver"
    );
    println!(
        "share: trace: {} cuMulticastCreate attempt(s), all denied by policy; reached the driver: {}",
        creates.len(),
        traced.reached(Call::MulticastCreate)
    );
    assert!(!traced.reached(Call::MulticastCreate));
    for entry in traced
        .log()
        .iter()
        .filter(|e| e.call.is_some_and(|c| c.name().starts_with("cuMulticast")))
    {
        println!("share:   {entry}");
    }
    boot.barrier(t).unwrap();
    drop(cx);
    println!("share: done");
}

// ------------------------------- the portable path across two processes

/// Issue 19, item 7: the portable data path for real. Two OS processes
/// (rank r on device r % n: both on GPU 0 where there is one), each with
/// `Context::auto` (issue 28: the classic fallback there) over a traced real driver that denies
/// `cuMulticastCreate`, make a unicast endpoint (bookkeeping on a driver
/// before 13.3) with their own mapped `PosixFd` allocation bound, exchange
/// the endpoint's ticket and the memory's descriptor (TCP on loopback and
/// `SCM_RIGHTS`), import the peer's endpoint and memory, map it, register
/// it with `add_peer_window`; then each puts host bytes into the peer's
/// endpoint through a `Stream` (`cuMemcpyAsync`), gets them back, and reads
/// through its own endpoint what the peer put there — every byte checked.
/// The trace proves that no `cuMulticast*` and no `cuLogicalEndpoint*`
/// call reached the driver; free memory is back to its start.
#[test]
fn portable_path_two_processes_put_and_get() {
    let Some(ctx) = cuda_ctx() else { return };
    let leak = Leak::start(&ctx);
    let n = ctx.devices().unwrap().len();
    println!("portable path, two processes on {n} GPU(s): rank r uses device r % {n}");
    two_ranks("portable_child", "portable", "", &[]);
    leak.check(&ctx, 2);
}

/// One rank of [`portable_path_two_processes_put_and_get`]; a no-op unless
/// run as a child.
#[test]
fn portable_child() {
    use cuda_endpoints::driver::Family;
    use cuda_endpoints::{
        CopyBatch, CopyPath, Exportable, FabricHandle, Stream, Unicast, bootstrap::Bootstrap,
        bootstrap::FdExchange,
    };

    let Some(Rank(rank, ctx, dev, peer_rank, peer_dev, boot)) = Rank::start() else {
        return;
    };
    let t = Rank::T;

    // The classic fallback over a traced driver that denies
    // cuMulticastCreate itself: unicast endpoints there are bookkeeping.
    // `Context::auto` alone (issue 28) over the traced driver: before 13.3
    // the classic emulation, whose unicast endpoints are bookkeeping.
    let traced = traced_cuda();
    let (classic, decision) =
        Context::auto(traced.clone(), &[], &Policy::from_env()).expect("Context::auto");
    println!(
        "portable: Context::auto chose {} ({})",
        classic.backend_name(),
        decision.unicast
    );
    let emulated = decision.unicast == BackendChoice::Classic;
    assert_eq!(classic.copy_path(), CopyPath::Portable);
    let gran = granularity(&ctx, dev, handle_bits::POSIX_FD);
    let ep = classic
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(dev, gran).exportable())
        .unwrap()
        .wait(t)
        .unwrap();
    let own = Allocation::<PosixFd>::on_device(&classic, dev, ep.size())
        .unwrap()
        .map(&[dev])
        .unwrap();
    let bound = ep.bind(dev, 0, &own).unwrap();

    // The endpoint's ticket and the memory's descriptor cross; each imports
    // the peer's, maps its memory and registers the window.
    let tickets = boot.allgather(&ep.export().unwrap().to_bytes(), t).unwrap();
    let handle = FabricHandle::<Unicast<Exportable>>::from_bytes(&tickets[peer_rank]).unwrap();
    let peer_ep = classic
        .reserve_one()
        .unwrap()
        .import(&handle)
        .unwrap()
        .wait(t)
        .unwrap();
    let fd = own.export_fd().unwrap();
    let mut fds = FdExchange::allgather_fds(&boot, std::os::fd::AsFd::as_fd(&fd), t).unwrap();
    let theirs = fds.swap_remove(peer_rank);
    let window = Allocation::<PosixFd>::import_fd(&classic, &theirs, peer_ep.size())
        .unwrap()
        .map(&[dev])
        .unwrap();
    peer_ep
        .add_peer_window(peer_rank as u32, peer_dev, 0, &window)
        .unwrap();
    drop(window); // the endpoint keeps the mapping
    drop((theirs, fds, fd));
    println!(
        "portable: {dev}: endpoint {} ({} bytes) bound; rank {peer_rank}'s imported as {} with a window on {peer_dev}",
        ep.id(),
        ep.size(),
        peer_ep.id()
    );
    // Every rank bound before any copies (R13.3).
    boot.barrier(t).unwrap();

    // Each rank writes its own half of the peer's memory.
    let half = ep.size() / 2;
    let pattern = |r: usize| -> Vec<u8> {
        (0..half)
            .map(|i| ((i % 251) as u8) ^ (0x5a_u8.wrapping_mul(r as u8 + 1)))
            .collect()
    };
    let mine = pattern(rank);
    let stream = Stream::new(&classic, dev).unwrap();
    stream
        .enqueue(CopyBatch::new().put_host(mine.clone(), &peer_ep, rank as u64 * half))
        .unwrap()
        .wait()
        .unwrap();
    let back = stream
        .enqueue(CopyBatch::new().get_host(&peer_ep, rank as u64 * half, half))
        .unwrap()
        .wait()
        .unwrap();
    let good = back
        .received
        .first()
        .map_or(0, |b| b.iter().zip(&mine).filter(|(a, b)| a == b).count());
    println!(
        "portable: put {half} bytes into rank {peer_rank}'s memory and got {good} back intact"
    );
    assert_eq!(back.received, vec![mine], "rank {rank}: get after put");
    boot.barrier(t).unwrap();
    // What the peer put into this rank's memory, read through its own endpoint.
    let theirs = pattern(peer_rank);
    let got = stream
        .enqueue(CopyBatch::new().get_host(&ep, peer_rank as u64 * half, half))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got.received, vec![theirs], "rank {rank}: the peer's put");
    println!("portable: read {half} bytes that rank {peer_rank} put into this rank's memory");
    // Every rank stops copying before any rank unbinds (R13.7).
    boot.barrier(t).unwrap();
    drop(stream);
    peer_ep.destroy().unwrap().release().unwrap();
    bound.unbind().unwrap();
    ep.destroy().unwrap().release().unwrap();
    drop(own);
    assert!(classic.take_teardown_errors().is_empty());
    boot.barrier(t).unwrap();

    let calls = traced.calls();
    let memcpys = traced.count(Call::MemcpyAsync);
    println!(
        "portable: trace: {} calls, {memcpys} cuMemcpyAsync, cuMulticastCreate reached the driver: {}",
        calls.len(),
        traced.reached(Call::MulticastCreate)
    );
    assert!(memcpys >= 3);
    assert!(!traced.reached(Call::MulticastCreate));
    assert_eq!(traced.count(Call::MulticastCreate), 0);
    for c in calls {
        assert!(
            !emulated || c.family() != Family::LogicalEndpoint,
            "{c} reached the driver"
        );
        assert!(
            !c.name().starts_with("cuMulticast"),
            "{c} reached the driver"
        );
    }
    drop(classic);
    println!("portable: done");
}

//! The portable data path (issue 19, item 4) on the reference model: on a
//! driver without `cuFabricCpyBatchAsync` (13.0, 13.3) and on the classic
//! fallback, the same typed `CopyBatch` runs as `cuMemcpyAsync` through the
//! endpoint's windows — this process's binds by address, and peers' memory
//! imported by POSIX descriptor and registered with `add_peer_window`.
//! Every byte is checked, the violation log is empty, nothing leaks, and
//! the driver's call counts show `cuMemcpyAsync` and never
//! `cuFabricCpyBatchAsync`.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the one-process
//! tests run through the real backend on the libcuda test double
//! (`common/backend.rs`), told the driver version each asks for; the
//! two-process one needs two processes of one model, so it runs on the
//! model (its OS-process twin is `portable_processes`).

use crate::backend;

use crate::common;

use std::time::Duration;

use backend::{Inspect, Probe};
use cuda_endpoints::model::{FabricConfig, Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, CopyPath, Device, Endpoint, Error, Mapped, Multicast, Private,
    Ready, Spec, Stream,
    backend::Policy,
    driver::{Call, Code},
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// A node of two devices on `version`, on the backend the environment
/// picks: the context and its probe.
fn node(version: i32) -> (Context, Probe) {
    let mut c = ModelConfig::node(2);
    c.driver_version = version;
    backend::context(c)
}

/// The copy calls so far: `(cuFabricCpyBatchAsync, cuMemcpyAsync,
/// cuMemcpyBatchAsync)`.
fn copies(p: &Probe) -> (u64, u64, u64) {
    (
        p.calls(Call::FabricCpyBatchAsync),
        p.calls(Call::MemcpyAsync),
        p.calls(Call::MemcpyBatchAsync),
    )
}

/// No teardown error, nothing left on the node, no violation.
#[track_caller]
fn clean(ctx: &Context, p: &impl Inspect) {
    let teardown = ctx.take_teardown_errors();
    assert!(teardown.is_empty(), "teardown errors: {teardown:?}");
    let live = p.live_node();
    assert!(live.is_empty(), "leak: {live:?}");
    common::no_violations(&p.violations());
}

fn mapped(ctx: &Context, dev: i32) -> Mapped<Private> {
    common::mapped(ctx, dev, ALIGN)
}

use common::portable::pattern;

/// A ready multicast team of devices 0 and 1, one `ALIGN` long.
fn team_of_two(ctx: &Context) -> Endpoint<Ready, Multicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
        .unwrap()
        .wait(T)
        .unwrap()
}

/// Since `before` (`copies`), the copies went through `memcpys`
/// `cuMemcpyAsync` and `batches` `cuMemcpyBatchAsync` calls and never
/// `cuFabricCpyBatchAsync`.
#[track_caller]
fn portable_in_trace(p: &Probe, before: (u64, u64, u64), memcpys: u64, batches: u64) {
    let (fabric, memcpy, batch) = copies(p);
    assert_eq!(
        fabric - before.0,
        0,
        "cuFabricCpyBatchAsync: {:?}",
        p.trace()
    );
    assert_eq!(memcpy - before.1, memcpys, "cuMemcpyAsync: {:?}", p.trace());
    assert_eq!(
        batch - before.2,
        batches,
        "cuMemcpyBatchAsync: {:?}",
        p.trace()
    );
}

#[test]
fn the_path_is_chosen_once_from_the_driver_and_the_backend_decision() {
    for (version, path) in [
        (13000, CopyPath::Portable),
        (13030, CopyPath::Portable),
        (13040, CopyPath::Portable),
        (13050, CopyPath::Fabric),
    ] {
        let (ctx, _) = node(version);
        assert_eq!(ctx.copy_path(), path, "driver {version}");
    }
    // The backend decision names it: logical endpoints on 13.3 copy portably.
    let mut c = ModelConfig::node(2);
    c.driver_version = 13030;
    let mut decision = None;
    let (ctx, _probe) = backend::context_over(c, |raw| {
        let (ctx, d) = Context::auto(raw, &[Device(0), Device(1)], &Policy::new()).unwrap();
        decision = Some(d);
        ctx
    });
    let d = decision.unwrap();
    assert_eq!(d.copy_path(), CopyPath::Portable);
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
    assert!(d.to_string().contains("cuMemcpyAsync"), "{d}");
    drop((ctx, _probe));
    // An explicit override, for tests.
    let (ctx, _) = node(13050);
    ctx.set_copy_path(CopyPath::Portable);
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
}

#[test]
fn unicast_put_and_get_on_13_3_move_every_byte_through_cu_memcpy_async() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 1, ALIGN, T);
    let owner = mapped(&ctx, 1);
    let bound = ep.bind(1, 0, &owner).unwrap();
    let (src, dst) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let bytes = pattern(1, 8192);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    let t = stream
        .enqueue(CopyBatch::new().put(&src, 0, &ep, 4096, 8192))
        .unwrap();
    assert_eq!(
        model.read(owner.device_ptr() + 4096, 8192).unwrap(),
        vec![0; 8192],
        "a read before the stream reached the put sees the old bytes"
    );
    t.wait().unwrap();
    assert_eq!(model.read(owner.device_ptr() + 4096, 8192).unwrap(), bytes);
    let done = stream
        .enqueue(
            CopyBatch::new()
                .get(&ep, 4096, &dst, 100, 8192)
                .get_host(&ep, 4096 + 17, 1000),
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(dst.device_ptr() + 100, 8192).unwrap(), bytes);
    assert_eq!(done.received, vec![bytes[17..1017].to_vec()]);
    portable_in_trace(&model, before, 3, 0);
    drop(stream);
    drop(bound);
    drop((owner, src, dst, ep));
    clean(&ctx, &model);
}

#[test]
fn multicast_put_on_13_3_is_one_cu_memcpy_async_per_member() {
    let (ctx, model) = node(13030);
    let ep = team_of_two(&ctx);
    let (m0, m1) = (mapped(&ctx, 0), mapped(&ctx, 1));
    let b0 = ep.bind(0, 0, &m0).unwrap();
    let b1 = ep.bind(1, 0, &m1).unwrap();
    let stream = Stream::new(&ctx, 1).unwrap();
    let bytes = pattern(2, 4096);
    let before = copies(&model);
    let done = stream
        .enqueue(CopyBatch::new().put_host(bytes.clone(), &ep, 8192))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(done.sent, vec![bytes.clone()]);
    for m in [&m0, &m1] {
        assert_eq!(model.read(m.device_ptr() + 8192, 4096).unwrap(), bytes);
    }
    // A host source: the loop, which stages pageable memory (`batchable`).
    portable_in_trace(&model, before, 2, 0);
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, ep));
    clean(&ctx, &model);
}

#[test]
fn the_classic_fallback_puts_to_a_multicast_team_through_the_portable_path() {
    let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    let mut decision = None;
    let (ctx, model) = backend::context_over(cfg, |raw| {
        let (ctx, d) =
            Context::auto(raw, &[Device(0), Device(1)], &Policy::new().classic(true)).unwrap();
        decision = Some(d);
        ctx
    });
    let d = decision.unwrap();
    assert_eq!(d.copy_path(), CopyPath::Portable, "{d}");
    assert!(ctx.backend_name().starts_with("classic"));
    let ep = team_of_two(&ctx);
    let (m0, m1, src) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    let b0 = ep.bind(0, 0, &m0).unwrap();
    let b1 = ep.bind(1, 0, &m1).unwrap();
    let bytes = pattern(3, ALIGN as usize / 2);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    stream
        .enqueue(CopyBatch::new().put(&src, 0, &ep, ALIGN / 2, ALIGN / 2))
        .unwrap()
        .wait()
        .unwrap();
    for m in [&m0, &m1] {
        assert_eq!(
            model.read(m.device_ptr() + ALIGN / 2, bytes.len()).unwrap(),
            bytes
        );
        assert_eq!(model.read(m.device_ptr(), 64).unwrap(), vec![0; 64]);
    }
    // Two members from device memory, on a 13.0 driver: one batch call.
    portable_in_trace(&model, before, 0, 1);
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, src, ep));
    clean(&ctx, &model);
}

#[test]
fn a_target_without_a_window_is_refused_before_the_driver_naming_the_fix() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, 2 * ALIGN, T);
    // Bound by handle: no address in this process, so no window.
    let by_handle = Allocation::<Private>::on_device(&ctx, 0, ALIGN).unwrap();
    let b0 = ep.bind(0, 0, &by_handle).unwrap();
    let by_addr = mapped(&ctx, 0);
    let b1 = ep.bind(0, ALIGN, &by_addr).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    let e = stream
        .enqueue(CopyBatch::new().put_host(vec![1; 64], &ep, ALIGN - 32))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyNoWindow {
                op: 0,
                offset,
                size: 64,
                known: 0,
                targets: 1,
                ..
            } if offset == ALIGN - 32
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("add_peer_window") && msg.contains(&format!("endpoint {}", ep.id())),
        "{msg}"
    );
    assert_eq!(copies(&model), before, "nothing reached the driver");
    // The bytes bound by address are reachable.
    stream
        .enqueue(CopyBatch::new().put_host(vec![7; 64], &ep, ALIGN))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(by_addr.device_ptr(), 64).unwrap(), vec![7; 64]);
    // Unbound: its window goes with the binding.
    b1.unbind().unwrap();
    let e = stream
        .enqueue(CopyBatch::new().put_host(vec![7; 64], &ep, ALIGN))
        .unwrap_err();
    assert!(matches!(e, Error::CopyNotBound { .. }), "{e}");
    drop(stream);
    drop(b0);
    drop((by_handle, by_addr, ep));
    clean(&ctx, &model);
}

#[test]
fn two_processes_put_into_and_get_from_each_other_through_posix_fd_windows() {
    if backend::is_cuda() {
        return; // two processes of one model: on the double, `portable_processes`
    }
    let mut cfg = ModelConfig::node(2);
    cfg.driver_version = 13030;
    let a = Model::fabric(FabricConfig::single(cfg));
    let b = a.spawn_process();
    let (ca, cb) = (Context::new(a.clone()), Context::new(b.clone()));
    common::portable::put_and_get_through_posix_fd_windows([&a, &b], [(&ca, 0), (&cb, 1)]);
    for ctx in [ca, cb] {
        assert!(ctx.take_teardown_errors().is_empty());
    }
    assert!(a.live().is_empty() && b.live().is_empty());
    common::fabric_idle(&a);
}

/// F9 on the portable path: a batch built while the memory was bound and
/// enqueued after its unbind is checked against the bindings at the
/// enqueue, and refused before any `cuMemcpyAsync` (it used to pass on the
/// facts read when the op was added).
#[test]
fn a_batch_built_before_an_unbind_is_refused_at_enqueue_before_any_memcpy() {
    let (ctx, model) = node(13040);
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let stream = Stream::new(&ctx, 0).unwrap();
    let bound = ep.bind(0, 0, &owner).unwrap();
    let batch = CopyBatch::new().put(&src, 0, &ep, 0, 4096);
    bound.unbind().unwrap();
    let before = copies(&model);
    let err = stream.enqueue(batch).unwrap_err();
    assert!(matches!(err, Error::CopyNotBound { op: 0, .. }), "{err:?}");
    portable_in_trace(&model, before, 0, 0);
    drop(stream);
    drop((src, owner, ep));
    clean(&ctx, &model);
}

/// `cuMemcpyAsync` forbids overlapping ranges: a get whose local memory is
/// the memory bound at its endpoint bytes would copy bytes onto themselves.
/// Refused before the driver as one op copying onto itself, naming the
/// endpoint bytes, not as two dependent ops.
#[test]
fn an_op_whose_local_memory_is_its_own_endpoint_bytes_is_refused_as_copying_onto_itself() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let owner = mapped(&ctx, 0);
    let b = ep.bind(0, 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    let e = stream
        .enqueue(CopyBatch::new().get(&ep, 4096, &owner, 4096 + 32, 64))
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyOntoItself {
                op: 0,
                offset: 4096,
                size: 64,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("onto themselves") && msg.contains(&format!("endpoint {}", ep.id())),
        "{msg}"
    );
    assert_eq!(copies(&model), before, "nothing reached the driver");
    drop(stream);
    drop(b);
    drop((owner, ep));
    clean(&ctx, &model);
}

/// A unicast endpoint this process created has one target, its own device,
/// whose memory a bind by address reaches: a peer window on it is refused
/// when added, naming what it is and the fix, and the endpoint's copies
/// go on as before.
#[test]
fn a_peer_window_on_a_unicast_endpoint_this_process_owns_is_refused_naming_the_fix() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let owner = mapped(&ctx, 0);
    let other = mapped(&ctx, 0);
    let b = ep.bind(0, 0, &owner).unwrap();
    let e = ep.add_peer_window(1, 0, 0, &other).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PeerWindowNoTarget {
                rank: 1,
                device: Device(0),
                targets: 1,
                here: 1,
                peers: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("endpoint {}", ep.id()))
            && msg.contains("all devices of this process")
            && msg.contains("bind `Mapped` memory"),
        "{msg}"
    );
    let stream = Stream::new(&ctx, 0).unwrap();
    stream
        .enqueue(CopyBatch::new().put_host(vec![5; 64], &ep, 0))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(owner.device_ptr(), 64).unwrap(), vec![5; 64]);
    drop(stream);
    drop(b);
    drop((owner, other, ep));
    clean(&ctx, &model);
}

/// Issue 30: the usual put (a batch of one put, a route's put) lands where
/// the endpoint's windows say at the put, not where they said when its
/// facts were read: the window the facts keep (`copy/portable/local.rs`)
/// is the first bound interval's, a put past it goes through the next
/// window, and after an unbind and a bind of other memory at the same
/// offsets the same route and the next batch land in the new memory, the
/// old left as it was. One `cuMemcpyAsync` a put, as a raw program's.
#[test]
fn issue_30_the_usual_put_lands_where_the_windows_say_at_the_put() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, 2 * ALIGN, T);
    let (a, b, c) = (mapped(&ctx, 0), mapped(&ctx, 0), mapped(&ctx, 0));
    let src = mapped(&ctx, 0);
    let stream = Stream::new(&ctx, 0).unwrap();
    let ba = ep.bind(0, 0, &a).unwrap();
    // Adjacent: one interval bound, two windows.
    let bb = ep.bind(0, ALIGN, &b).unwrap();
    let mut route = stream.route(&src, &ep);
    let before = copies(&model);
    // The first batch reads the facts; the next ones take them from the
    // memo, as the route does from the start.
    for (round, seed) in (1..=3u8).enumerate() {
        let bytes = pattern(seed, 256);
        model.write(src.device_ptr(), &bytes).unwrap();
        for offset in [64, ALIGN + 64] {
            stream
                .enqueue(CopyBatch::new().put(&src, 0, &ep, offset, 256))
                .unwrap()
                .wait()
                .unwrap();
            route.put(0, offset + 512, 256).unwrap().wait().unwrap();
        }
        for (mem, at) in [(&a, 64), (&a, 576), (&b, 64), (&b, 576)] {
            assert_eq!(
                model.read(mem.device_ptr() + at, 256).unwrap(),
                bytes,
                "round {round}, {at} bytes into {:#x}",
                mem.device_ptr()
            );
        }
    }
    // Other memory at the first window's offsets.
    ba.unbind().unwrap();
    let bc = ep.bind(0, 0, &c).unwrap();
    let old = model.read(a.device_ptr(), 1024).unwrap();
    for seed in 4..=5u8 {
        let bytes = pattern(seed, 256);
        model.write(src.device_ptr(), &bytes).unwrap();
        stream
            .enqueue(CopyBatch::new().put(&src, 0, &ep, 64, 256))
            .unwrap()
            .wait()
            .unwrap();
        route.put(0, 576, 256).unwrap().wait().unwrap();
        assert_eq!(model.read(c.device_ptr() + 64, 256).unwrap(), bytes);
        assert_eq!(model.read(c.device_ptr() + 576, 256).unwrap(), bytes);
        assert_eq!(
            model.read(a.device_ptr(), 1024).unwrap(),
            old,
            "the old memory"
        );
    }
    portable_in_trace(&model, before, 16, 0);
    drop(route);
    drop(stream);
    drop((bb, bc));
    drop((a, b, c, src, ep));
    clean(&ctx, &model);
}

/// Issue 30, item 5: on a driver with `cuMemcpyBatchAsync` (12.8+; here
/// 13.3), a batch of several puts, or of several gets, between device
/// memory and an endpoint's windows reaches the driver as one
/// `cuMemcpyBatchAsync`, every byte where it belongs; a batch of one piece
/// stays one `cuMemcpyAsync`, the call a raw program makes.
#[test]
fn several_pieces_reach_a_12_8_driver_as_one_cu_memcpy_batch_async_and_one_piece_as_cu_memcpy_async()
 {
    const OPS: u64 = 64;
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 1, ALIGN, T);
    let owner = mapped(&ctx, 1);
    let bound = ep.bind(1, 0, &owner).unwrap();
    let (src, dst) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let bytes = pattern(4, (OPS * 64) as usize);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    let puts = (0..OPS).fold(CopyBatch::new(), |b, k| {
        b.put(&src, k * 64, &ep, k * 128, 64)
    });
    stream.enqueue(puts).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 0, 1);
    for k in 0..OPS {
        let at = (k * 64) as usize;
        assert_eq!(
            model.read(owner.device_ptr() + k * 128, 64).unwrap(),
            bytes[at..at + 64],
            "put {k}"
        );
    }
    let before = copies(&model);
    let gets = (0..OPS).fold(CopyBatch::new(), |b, k| {
        b.get(&ep, k * 128, &dst, k * 64, 64)
    });
    stream.enqueue(gets).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 0, 1);
    assert_eq!(model.read(dst.device_ptr(), bytes.len()).unwrap(), bytes);
    let before = copies(&model);
    stream
        .enqueue(CopyBatch::new().put(&src, 0, &ep, ALIGN - 64, 64))
        .unwrap()
        .wait()
        .unwrap();
    portable_in_trace(&model, before, 1, 0);
    assert_eq!(
        model.read(owner.device_ptr() + ALIGN - 64, 64).unwrap(),
        bytes[..64]
    );
    drop(stream);
    drop(bound);
    drop((owner, src, dst, ep));
    clean(&ctx, &model);
}

/// Issue 30, item 5: puts laid end to end on both sides (and gets so) go
/// as one grown copy, one `cuMemcpyAsync`, every byte where it belongs;
/// a piece grows only inside one allocation here and one window there
/// (one mapping each), so a run across two bound memories, or from two
/// sources, stays two pieces, whatever their addresses.
#[test]
fn pieces_end_to_end_in_one_allocation_and_one_window_go_as_one_cu_memcpy_async() {
    const OPS: u64 = 64;
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 1, 2 * ALIGN, T);
    let (low, high) = (mapped(&ctx, 1), mapped(&ctx, 1));
    let b_low = ep.bind(1, 0, &low).unwrap();
    let b_high = ep.bind(1, ALIGN, &high).unwrap();
    let (src, other, dst) = (mapped(&ctx, 0), mapped(&ctx, 0), mapped(&ctx, 0));
    let bytes = pattern(7, (OPS * 64) as usize);
    model.write(src.device_ptr(), &bytes).unwrap();
    model.write(other.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // Puts, then gets, end to end: one copy each.
    let before = copies(&model);
    let puts = (0..OPS).fold(CopyBatch::new(), |b, k| {
        b.put(&src, k * 64, &ep, k * 64, 64)
    });
    stream.enqueue(puts).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 1, 0);
    assert_eq!(model.read(low.device_ptr(), bytes.len()).unwrap(), bytes);
    let before = copies(&model);
    let gets = (0..OPS).fold(CopyBatch::new(), |b, k| {
        b.get(&ep, k * 64, &dst, k * 64, 64)
    });
    stream.enqueue(gets).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 1, 0);
    assert_eq!(model.read(dst.device_ptr(), bytes.len()).unwrap(), bytes);
    // Across the two bound memories: two pieces, one batch call.
    let before = copies(&model);
    let at = ALIGN - OPS / 2 * 64;
    let across = (0..OPS).fold(CopyBatch::new(), |b, k| {
        b.put(&src, k * 64, &ep, at + k * 64, 64)
    });
    stream.enqueue(across).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 0, 1);
    let half = (OPS / 2 * 64) as usize;
    assert_eq!(
        model.read(low.device_ptr() + at, half).unwrap(),
        bytes[..half]
    );
    assert_eq!(model.read(high.device_ptr(), half).unwrap(), bytes[half..]);
    // From two sources, end to end there: two pieces.
    let before = copies(&model);
    let two = (0..OPS).fold(CopyBatch::new(), |b, k| {
        let from = if k < OPS / 2 { &src } else { &other };
        b.put(from, k * 64, &ep, 8192 + k * 64, 64)
    });
    stream.enqueue(two).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 0, 1);
    assert_eq!(
        model.read(low.device_ptr() + 8192, bytes.len()).unwrap(),
        bytes
    );
    drop(stream);
    drop((b_low, b_high));
    drop((low, high, src, other, dst, ep));
    clean(&ctx, &model);
}

/// An op across two bound memories is two pieces, which run in no order:
/// when one reads bytes the other writes, the op copies bytes onto
/// themselves, refused before the driver as one piece over its own bytes
/// is (found by the round's hostile review: the check saw each piece
/// alone).
#[test]
fn an_op_across_two_bound_memories_that_reads_what_it_writes_is_refused_as_copying_onto_itself() {
    let (ctx, model) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, 2 * ALIGN, T);
    let (a, b) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ba = ep.bind(0, 0, &a).unwrap();
    let bb = ep.bind(0, ALIGN, &b).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    // Reads the end of `a` and `b[0..64)`, writes `b[32..160)`.
    let e = stream
        .enqueue(CopyBatch::new().get(&ep, ALIGN - 64, &b, 32, 128))
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(e, Error::CopyOntoItself { op: 0, offset, size: 128, .. } if offset == ALIGN - 64),
        "{e:?}"
    );
    portable_in_trace(&model, before, 0, 0);
    // Apart, the same op across both is two pieces, every byte right.
    let bytes = pattern(8, 128);
    model
        .write(a.device_ptr() + ALIGN - 64, &bytes[..64])
        .unwrap();
    model.write(b.device_ptr(), &bytes[64..]).unwrap();
    stream
        .enqueue(CopyBatch::new().get(&ep, ALIGN - 64, &b, 1024, 128))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(b.device_ptr() + 1024, 128).unwrap(), bytes);
    drop(stream);
    drop((ba, bb));
    drop((a, b, ep));
    clean(&ctx, &model);
}

/// Issue 30, item 5: a driver before 12.8 has no `cuMemcpyBatchAsync`: the
/// portable path never calls it there, and a batch of several pieces is one
/// `cuMemcpyAsync` per piece (the classic fallback over a 12.6 driver).
#[test]
fn a_driver_before_12_8_gets_one_cu_memcpy_async_per_piece_and_no_batch_call() {
    let mut cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    cfg.driver_version = 12060;
    let (ctx, model) = backend::context_over(cfg, |raw| {
        Context::auto(raw, &[Device(0), Device(1)], &Policy::new().classic(true))
            .unwrap()
            .0
    });
    assert_eq!(ctx.driver_version(), Some(12060));
    let ep = team_of_two(&ctx);
    let (m0, m1, src) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    let b0 = ep.bind(0, 0, &m0).unwrap();
    let b1 = ep.bind(1, 0, &m1).unwrap();
    let bytes = pattern(5, 4 * 64);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    let puts = (0..4u64).fold(CopyBatch::new(), |b, k| {
        b.put(&src, k * 64, &ep, k * 64, 64)
    });
    stream.enqueue(puts).unwrap().wait().unwrap();
    // 4 puts × 2 members.
    portable_in_trace(&model, before, 8, 0);
    for m in [&m0, &m1] {
        assert_eq!(model.read(m.device_ptr(), bytes.len()).unwrap(), bytes);
    }
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, src, ep));
    clean(&ctx, &model);
}

/// Issue 30, item 5: a driver that answers `cuMemcpyBatchAsync` with
/// `NOT_SUPPORTED` (the real backend on a driver that does not export
/// `cuMemcpyBatchAsync_v2`) is asked once per context: that batch and
/// every later one go as one `cuMemcpyAsync` per piece, every byte right.
#[test]
fn a_batch_call_refused_once_sends_the_context_to_the_cu_memcpy_async_loop_for_good() {
    let (ctx, model) = node(13040);
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let owner = mapped(&ctx, 0);
    let bound = ep.bind(0, 0, &owner).unwrap();
    let src = mapped(&ctx, 0);
    let bytes = pattern(6, 4 * 64);
    model.write(src.device_ptr(), &bytes).unwrap();
    model.set_faults(&[backend::F::always(
        Call::MemcpyBatchAsync,
        Code::NOT_SUPPORTED,
    )]);
    let stream = Stream::new(&ctx, 0).unwrap();
    let before = copies(&model);
    for round in 0..3u64 {
        // A gap between the puts' destinations: four pieces, not one grown.
        let puts = (0..4u64).fold(CopyBatch::new(), |b, k| {
            b.put(&src, k * 64, &ep, round * 4096 + k * 128, 64)
        });
        stream.enqueue(puts).unwrap().wait().unwrap();
        for k in 0..4u64 {
            let at = owner.device_ptr() + round * 4096 + k * 128;
            let want = &bytes[(k * 64) as usize..][..64];
            assert_eq!(model.read(at, 64).unwrap(), want, "round {round}");
        }
    }
    portable_in_trace(&model, before, 12, 1);
    model.set_faults(&[]);
    drop(stream);
    drop(bound);
    drop((owner, src, ep));
    clean(&ctx, &model);
}

/// Issue 30, item 5: a `cuMemcpyBatchAsync` that fails is an error naming
/// it, and its stream is synchronized before the batch's memory is let go
/// (cuda.h does not say that a failed batch enqueued nothing); the
/// context keeps the batch call for the next batch.
#[test]
fn a_failed_batch_call_names_cu_memcpy_batch_async_and_the_next_batch_uses_it_again() {
    let (ctx, model) = node(13040);
    let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
    let owner = mapped(&ctx, 0);
    let bound = ep.bind(0, 0, &owner).unwrap();
    let src = mapped(&ctx, 0);
    let stream = Stream::new(&ctx, 0).unwrap();
    // A gap between the puts' destinations: four pieces, not one grown.
    let puts = || {
        (0..4u64).fold(CopyBatch::new(), |b, k| {
            b.put(&src, k * 64, &ep, k * 128, 64)
        })
    };
    model.set_faults(&[backend::F::nth(
        Call::MemcpyBatchAsync,
        1,
        Code::INVALID_VALUE,
    )]);
    let before = copies(&model);
    let e = stream.enqueue(puts()).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Driver {
                call: Call::MemcpyBatchAsync,
                ..
            }
        ),
        "{e:?}"
    );
    portable_in_trace(&model, before, 0, 1);
    let before = copies(&model);
    stream.enqueue(puts()).unwrap().wait().unwrap();
    portable_in_trace(&model, before, 0, 1);
    drop(stream);
    drop(bound);
    drop((owner, src, ep));
    clean(&ctx, &model);
}

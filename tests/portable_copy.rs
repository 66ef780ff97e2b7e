//! The portable data path (issue 19, item 4) on the reference model: on a
//! driver without `cuFabricCpyBatchAsync` (13.0, 13.3) and on the classic
//! fallback, the same typed `CopyBatch` runs as `cuMemcpyAsync` through the
//! endpoint's windows — this process's binds by address, and peers' memory
//! imported by POSIX descriptor and registered with `add_peer_window`.
//! Every byte is checked, the violation log is empty, nothing leaks, and
//! the trace shows `cuMemcpyAsync` and never `cuFabricCpyBatchAsync`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cuda_endpoints::driver::Traced;
use cuda_endpoints::model::{FabricConfig, Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Context, CopyBatch, CopyPath, Device, Endpoint, Error, Mapped, Multicast, Private,
    Ready, Spec, Stream, backend::Policy, driver::Call,
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// A node of two devices on `version`, traced: the context, the model, the trace.
fn node(version: i32) -> (Context, Model, Arc<Traced<Model>>) {
    let mut c = ModelConfig::node(2);
    c.driver_version = version;
    let model = Model::new(c);
    let traced = Arc::new(Traced::new(model.clone()));
    (Context::new(traced.clone()), model, traced)
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

/// The trace went through `cuMemcpyAsync` and never `cuFabricCpyBatchAsync`.
#[track_caller]
fn portable_in_trace(t: &Traced<Model>, memcpys: usize) {
    assert_eq!(t.count(Call::FabricCpyBatchAsync), 0, "{:?}", t.calls());
    assert_eq!(t.count(Call::MemcpyAsync), memcpys, "{:?}", t.calls());
}

#[test]
fn the_path_is_chosen_once_from_the_driver_and_the_backend_decision() {
    for (version, path) in [
        (13000, CopyPath::Portable),
        (13030, CopyPath::Portable),
        (13040, CopyPath::Portable),
        (13050, CopyPath::Fabric),
    ] {
        let (ctx, _, _) = node(version);
        assert_eq!(ctx.copy_path(), path, "driver {version}");
    }
    // The backend decision names it: logical endpoints on 13.3 copy portably.
    let (_, model, _) = node(13030);
    let (ctx, d) = Context::auto(model, &[Device(0), Device(1)], &Policy::new()).unwrap();
    assert_eq!(d.copy_path(), CopyPath::Portable);
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
    assert!(d.to_string().contains("cuMemcpyAsync"), "{d}");
    // An explicit override, for tests.
    let (ctx, _, _) = node(13050);
    ctx.set_copy_path(CopyPath::Portable);
    assert_eq!(ctx.copy_path(), CopyPath::Portable);
}

#[test]
fn unicast_put_and_get_on_13_3_move_every_byte_through_cu_memcpy_async() {
    let (ctx, model, trace) = node(13030);
    let ep = common::ready_unicast(&ctx, 1, ALIGN, T);
    let owner = mapped(&ctx, 1);
    let bound = ep.bind(1, 0, &owner).unwrap();
    let (src, dst) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let bytes = pattern(1, 8192);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    trace.clear();
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
    portable_in_trace(&trace, 3);
    drop(stream);
    drop(bound);
    drop((owner, src, dst, ep));
    common::clean(&ctx, &model);
}

#[test]
fn multicast_put_on_13_3_is_one_cu_memcpy_async_per_member() {
    let (ctx, model, trace) = node(13030);
    let ep = team_of_two(&ctx);
    let (m0, m1) = (mapped(&ctx, 0), mapped(&ctx, 1));
    let b0 = ep.bind(0, 0, &m0).unwrap();
    let b1 = ep.bind(1, 0, &m1).unwrap();
    let stream = Stream::new(&ctx, 1).unwrap();
    let bytes = pattern(2, 4096);
    trace.clear();
    let done = stream
        .enqueue(CopyBatch::new().put_host(bytes.clone(), &ep, 8192))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(done.sent, vec![bytes.clone()]);
    for m in [&m0, &m1] {
        assert_eq!(model.read(m.device_ptr() + 8192, 4096).unwrap(), bytes);
    }
    portable_in_trace(&trace, 2);
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, ep));
    common::clean(&ctx, &model);
}

#[test]
fn the_classic_fallback_puts_to_a_multicast_team_through_the_portable_path() {
    let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    let model = Model::new(cfg);
    let trace = Arc::new(Traced::new(model.clone()));
    let (ctx, d) = Context::auto(trace.clone(), &[Device(0), Device(1)], &Policy::new()).unwrap();
    assert_eq!(d.copy_path(), CopyPath::Portable, "{d}");
    assert!(ctx.backend_name().starts_with("classic"));
    let ep = team_of_two(&ctx);
    let (m0, m1, src) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    let b0 = ep.bind(0, 0, &m0).unwrap();
    let b1 = ep.bind(1, 0, &m1).unwrap();
    let bytes = pattern(3, ALIGN as usize / 2);
    model.write(src.device_ptr(), &bytes).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    trace.clear();
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
    portable_in_trace(&trace, 2);
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, src, ep));
    common::clean(&ctx, &model);
}

#[test]
fn a_target_without_a_window_is_refused_before_the_driver_naming_the_fix() {
    let (ctx, model, trace) = node(13030);
    let ep = common::ready_unicast(&ctx, 0, 2 * ALIGN, T);
    // Bound by handle: no address in this process, so no window.
    let by_handle = Allocation::<Private>::on_device(&ctx, 0, ALIGN).unwrap();
    let b0 = ep.bind(0, 0, &by_handle).unwrap();
    let by_addr = mapped(&ctx, 0);
    let b1 = ep.bind(0, ALIGN, &by_addr).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    trace.clear();
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
    assert_eq!(trace.count(Call::MemcpyAsync), 0);
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
    common::clean(&ctx, &model);
}

#[test]
fn two_processes_put_into_and_get_from_each_other_through_posix_fd_windows() {
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

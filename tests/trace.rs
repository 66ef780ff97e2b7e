//! Call tracing and call policy ([`Traced`]) over the reference model: the
//! exact driver calls the typed API and the classic fallback make, and deny
//! lists that refuse a call before it reaches the driver.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_endpoints::driver::{Classic, TraceEntry, Traced};
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Context, Device, Error, Private, Spec, Unicast,
    driver::{Call, Code},
    wait_all,
};

const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(1);

fn devs(n: i32) -> Vec<Device> {
    (0..n).map(Device).collect()
}

/// A traced model and a context over it.
fn traced(cfg: ModelConfig) -> (Context, Arc<Traced<Model>>, Model) {
    let model = Model::new(cfg);
    let t = Arc::new(Traced::new(model.clone()));
    (Context::new(t.clone()), t, model)
}

#[test]
fn one_query_per_contiguous_range() {
    let (ctx, t, model) = traced(ModelConfig::node(4).queries_to_ready(2));
    let range = ctx.reserve(4).unwrap();
    let base = range.base();
    let pending: Vec<_> = range
        .into_endpoints()
        .into_iter()
        .zip(devs(4))
        .map(|(e, d)| e.create(Spec::unicast(d, 2 * MIB)).unwrap())
        .collect();
    t.clear();
    let ready = wait_all(pending, T).unwrap();
    let queries = t.entries(Call::Query);
    // Two "pending" answers, then "ready": one query per poll for all four.
    assert_eq!(queries.len(), 3, "{queries:#?}");
    for q in &queries {
        assert_eq!(q.args, format!("base={base} count=4"));
    }
    assert_eq!(queries[2].result, Ok("ready=true".into()));
    assert_eq!(t.calls(), vec![Call::Query; 3]);
    drop(ready);
    assert!(model.live().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn one_query_per_range_when_there_are_two() {
    let (ctx, t, _model) = traced(ModelConfig::node(2).queries_to_ready(0));
    let mut pending: Vec<cuda_endpoints::Endpoint<cuda_endpoints::Pending, Unicast>> = Vec::new();
    let mut bases = Vec::new();
    for _ in 0..2 {
        let r = ctx.reserve(2).unwrap();
        bases.push(r.base());
        for (e, d) in r.into_endpoints().into_iter().zip(devs(2)) {
            pending.push(e.create(Spec::unicast(d, 2 * MIB)).unwrap());
        }
    }
    t.clear();
    let _ready = wait_all(pending, T).unwrap();
    let mut args: Vec<String> = t.entries(Call::Query).into_iter().map(|e| e.args).collect();
    args.sort();
    let mut want: Vec<String> = bases.iter().map(|b| format!("base={b} count=2")).collect();
    want.sort();
    assert_eq!(args, want);
    common::no_violations(&_model.violations());
}

#[test]
fn no_multicast_create_without_multicast_supported() {
    // Like the one-H200 test machine: driver 13.0, attribute 132 = 0.
    let model = Model::new(ModelConfig::cuda_13_0(1));
    let t = Arc::new(Traced::new(model.clone()));
    let ctx = Context::new(Classic::new(t.clone()));
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0)], 2 * MIB))
        .unwrap_err();
    assert!(matches!(e.error, Error::Unsupported { .. }), "{}", e.error);
    e.value.release().unwrap();
    for call in [
        Call::MulticastCreate,
        Call::MulticastGetGranularity,
        Call::MulticastAddDevice,
    ] {
        assert_eq!(t.count(call), 0, "{call} was called");
    }
    // What did reach the driver: reads only.
    assert!(
        t.calls().iter().all(|c| matches!(
            c,
            Call::DriverGetVersion | Call::DeviceGetCount | Call::DeviceGetAttribute
        )),
        "{:?}",
        t.calls()
    );
    assert!(model.live().is_empty() && model.violations().is_empty());
}

#[test]
fn deny_list_refuses_before_the_driver() {
    let cfg = ModelConfig::cuda_13_0(4).with_devices(|_, d| d.classic_multicast = true);
    let model = Model::new(cfg);
    let t = Arc::new(Traced::new(model.clone()).deny([Call::MulticastCreate]));
    let ctx = Context::new(Classic::new(t.clone()));
    let e = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(4), 2 * MIB))
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::Driver { code, .. } if code == Code::NOT_PERMITTED
        ),
        "{}",
        e.error
    );
    e.value.release().unwrap();
    // Asked once, refused by the wrapper, never seen by the model.
    let creates = t.entries(Call::MulticastCreate);
    assert_eq!(creates.len(), 1);
    assert!(creates[0].denied && !creates[0].reached());
    assert_eq!(creates[0].result, Err(Code::NOT_PERMITTED));
    assert!(!t.reached(Call::MulticastCreate));
    assert_eq!(model.calls(Call::MulticastCreate), 0);
    assert!(model.live().is_empty() && model.violations().is_empty());
}

#[test]
fn deny_list_on_memory() {
    let (ctx, t, model) = traced(ModelConfig::node(1));
    let t2 = Arc::new(Traced::new(t.clone()).deny([Call::MemCreate]));
    let ctx2 = Context::new(t2.clone());
    let e = Allocation::<Private>::on_device(&ctx2, Device(0), MIB).unwrap_err();
    assert_eq!(
        e,
        Error::Driver {
            call: Call::MemCreate,
            code: Code::NOT_PERMITTED
        }
    );
    assert!(e.to_string().contains("denied by policy"), "{e}");
    assert_eq!(model.calls(Call::MemCreate), 0);
    assert_eq!(t.count(Call::MemCreate), 0);
    // The same memory through the undenied context works.
    drop(Allocation::<Private>::on_device(&ctx, Device(0), MIB).unwrap());
    assert!(t.reached(Call::MemCreate));
    assert!(model.live().is_empty());
    common::no_violations(&model.violations());
}

#[test]
fn classic_lifecycle_as_the_lower_driver_sees_it() {
    let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
    let model = Model::new(cfg);
    let t = Arc::new(Traced::new(model.clone()));
    let ctx = Context::new(Classic::new(t.clone()));
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&devs(2), 2 * MIB))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, Device(1), 2 * MIB).unwrap();
    let b = team.bind(1, 0, &mem).unwrap();
    b.unbind().unwrap();
    team.destroy().unwrap().release().unwrap();
    drop(mem);
    let multicast: Vec<Call> = t
        .calls()
        .into_iter()
        .filter(|c| c.name().starts_with("cuMulticast") || *c == Call::MemRelease)
        .collect();
    assert_eq!(
        multicast,
        vec![
            Call::MulticastGetGranularity,
            Call::MulticastCreate,
            Call::MulticastAddDevice,
            Call::MulticastAddDevice,
            Call::MulticastBindMem,
            Call::MulticastUnbind,
            Call::MemRelease, // the multicast object (C5) ...
            Call::MemRelease, // ... before the memory
        ]
    );
    let create = &t.entries(Call::MulticastCreate)[0];
    assert_eq!(
        create.args,
        format!("num_devices=2 size={} handle_types=0", 2 * MIB)
    );
    let log: Vec<TraceEntry> = t.log();
    let shown = log
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(shown.contains("cuMulticastCreate(num_devices=2"), "{shown}");
    assert!(model.live().is_empty() && model.violations().is_empty());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every `tracing` event of this test binary, from the moment the first test
/// asks for it (a global subscriber: a scoped one races with the callsite
/// interest cache of events first seen on other test threads).
fn captured() -> &'static Buf {
    static BUF: std::sync::OnceLock<Buf> = std::sync::OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
        buf
    })
}

#[test]
fn calls_are_tracing_events() {
    let buf = captured();
    let model = Model::new(ModelConfig::node(1));
    let t = Traced::new(model.clone()).deny([Call::MulticastCreate]);
    let ctx = Context::new(t);
    drop(Allocation::<Private>::on_device(&ctx, Device(0), MIB).unwrap());
    // SAFETY: denied by the wrapper: the call never reaches the model.
    let _ = unsafe {
        cuda_endpoints::driver::Driver::multicast_create(&*ctx.driver_arc(), 1, 2 * MIB, 0)
    };
    let out =
        String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    assert!(out.contains("cuMemCreate"), "{out}");
    assert!(out.contains("cuMulticastCreate"), "{out}");
    assert!(out.contains("denied by the trace policy"), "{out}");
    common::no_violations(&model.violations());
}

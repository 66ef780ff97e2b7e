//! The data path on the reference model (issue 19): streams,
//! `cuFabricCpyBatchAsync` (SPEC F1–F9, R13.3) and `cuMemcpyAsync`, rule by
//! rule through the raw boundary (the model logs the rule's violation),
//! and the bytes: a unicast put lands in the owner's bound memory, a
//! multicast put in every member's, a get reads the owner's, and nothing is
//! visible before the stream reached the copy.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) every test runs
//! through the real backend on the libcuda test double (`common/backend.rs`):
//! the raw calls and the typed API cross the C ABI (`CUstream` values, the
//! `CUDA_FABRIC_COPY_BATCH_OP` list, host pointers told apart by the double
//! as unified addressing does), with the double's model behind them.

use crate::backend;

use crate::common;

use std::time::Duration;

use backend::Probe;
use cuda_endpoints::driver::{CopyOp, CopyOps, Operand, Pointer};
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{
    Binding, Context, Device, Endpoint, Mapped, Multicast, Private, Ready, Spec, Unicast,
    driver::{Code, Driver},
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(1);

/// A node of two devices on a 13.5 driver (the fabric copy exists), on the
/// backend the environment picks.
fn node() -> (Context, Probe) {
    let mut c = ModelConfig::node(2);
    c.driver_version = 13050;
    backend::context(c)
}

/// The end of every test that breaks no rule: no teardown error, nothing
/// left on the node, no violation.
#[track_caller]
fn clean(ctx: &Context, model: &Probe) {
    let teardown = ctx.take_teardown_errors();
    assert!(teardown.is_empty(), "teardown errors: {teardown:?}");
    let live = model.live_node();
    assert!(live.is_empty(), "leak: {live:?}");
    common::no_violations(&model.violations());
}

fn unicast(ctx: &Context, dev: i32, size: u64) -> Endpoint<Ready, Unicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::unicast(dev, size))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn team(ctx: &Context, size: u64) -> Endpoint<Ready, Multicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], size))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn mapped(ctx: &Context, dev: i32) -> Mapped<Private> {
    common::mapped(ctx, dev, ALIGN)
}

fn put(src: u64, id: u32, offset: u64, size: u64) -> CopyOp {
    CopyOp {
        src: Operand::Pointer(Pointer::device(src)),
        dst: Operand::LogicalEndpoint { id, offset },
        size,
    }
}

fn get(id: u32, offset: u64, dst: u64, size: u64) -> CopyOp {
    CopyOp {
        src: Operand::LogicalEndpoint { id, offset },
        dst: Operand::Pointer(Pointer::device(dst)),
        size,
    }
}

/// A stream on `dev`, made raw.
fn stream(model: &Probe, dev: i32) -> u64 {
    // SAFETY: a new stream that no typed object owns.
    unsafe { model.stream_create(Device(dev)) }.unwrap()
}

/// Synchronizes and destroys a raw stream.
fn done(model: &Probe, s: u64) {
    // SAFETY: the test's own stream, not used again.
    unsafe { model.stream_destroy(s) }.unwrap();
}

/// A unicast endpoint on device 0 with `owner` bound at 0, and a local
/// source on device 0.
struct Unicast1 {
    src: Mapped<Private>,
    owner: Mapped<Private>,
    ep: Endpoint<Ready, Unicast>,
}

impl Unicast1 {
    fn new(ctx: &Context) -> Unicast1 {
        Unicast1 {
            src: mapped(ctx, 0),
            owner: mapped(ctx, 0),
            ep: unicast(ctx, 0, ALIGN),
        }
    }

    fn bind(&self) -> Binding<'_> {
        self.ep.bind(Device(0), 0, &self.owner).unwrap()
    }
}

#[test]
fn stream_order_a_read_before_synchronize_sees_the_old_bytes() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    model.write(u.src.device_ptr(), &[7; 64]).unwrap();
    let s = stream(&model, 0);
    // SAFETY: every operand is the test's own, bound, and lives until the sync.
    unsafe { model.fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 64)].into(), 0) }
        .unwrap();
    assert_eq!(
        model.read(u.owner.device_ptr(), 64).unwrap(),
        vec![0; 64],
        "enqueued, not yet reached by the stream"
    );
    // SAFETY: the test's own stream.
    unsafe { model.stream_synchronize(s) }.unwrap();
    assert_eq!(model.read(u.owner.device_ptr(), 64).unwrap(), vec![7; 64]);
    done(&model, s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn stream_query_reports_done_only_after_the_stream_reached_every_batch() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    model.write(u.src.device_ptr(), &[1; 16]).unwrap();
    let s = stream(&model, 0);
    let (src, id) = (u.src.device_ptr(), u.ep.id());
    // SAFETY: as above; two batches on one stream, in order.
    unsafe {
        model
            .fabric_copy_batch(s, [put(src, id, 0, 16)].into(), 0)
            .unwrap();
        model
            .fabric_copy_batch(s, [put(src, id, 16, 16)].into(), 0)
            .unwrap();
        assert!(
            !model.stream_query(s).unwrap(),
            "one batch reached, one pending"
        );
        assert_eq!(model.read(u.owner.device_ptr(), 32).unwrap()[..16], [1; 16]);
        assert_eq!(model.read(u.owner.device_ptr(), 32).unwrap()[16..], [0; 16]);
        assert!(model.stream_query(s).unwrap());
    }
    assert_eq!(model.read(u.owner.device_ptr(), 32).unwrap(), vec![1; 32]);
    done(&model, s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn get_reads_the_unicast_owners_bound_memory() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let pattern: Vec<u8> = (0..=255).collect();
    model.write(u.owner.device_ptr() + 4096, &pattern).unwrap();
    let s = stream(&model, 0);
    // SAFETY: as above.
    unsafe {
        model
            .fabric_copy_batch(s, [get(u.ep.id(), 4096, u.src.device_ptr(), 256)].into(), 0)
            .unwrap();
        model.stream_synchronize(s).unwrap();
    }
    assert_eq!(model.read(u.src.device_ptr(), 256).unwrap(), pattern);
    done(&model, s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn multicast_put_reaches_every_members_bound_memory() {
    let (ctx, model) = node();
    let ep = team(&ctx, ALIGN);
    let (m0, m1) = (mapped(&ctx, 0), mapped(&ctx, 1));
    let b0 = ep.bind(Device(0), 0, &m0).unwrap();
    let b1 = ep.bind(Device(1), 0, &m1).unwrap();
    let src = mapped(&ctx, 0);
    model.write(src.device_ptr(), &[0xab; 100]).unwrap();
    let s = stream(&model, 0);
    // SAFETY: as above.
    unsafe {
        model
            .fabric_copy_batch(s, [put(src.device_ptr(), ep.id(), 8, 100)].into(), 0)
            .unwrap();
        model.stream_synchronize(s).unwrap();
    }
    for m in [&m0, &m1] {
        let got = model.read(m.device_ptr(), 108).unwrap();
        assert_eq!(got[..8], [0; 8]);
        assert_eq!(got[8..], [0xab; 100]);
    }
    done(&model, s);
    drop((b0, b1));
    drop((src, m0, m1, ep));
    clean(&ctx, &model);
}

#[test]
fn host_memory_is_read_and_written_in_stream_order() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let host_src = vec![5u8; 32];
    let mut host_dst = vec![0u8; 32];
    let s = stream(&model, 0);
    let id = u.ep.id();
    // SAFETY: both host buffers outlive the synchronize below and are not
    // touched until then.
    unsafe {
        model
            .fabric_copy_batch(
                s,
                [CopyOp {
                    src: Operand::Pointer(Pointer::host(host_src.as_ptr() as u64)),
                    dst: Operand::LogicalEndpoint { id, offset: 0 },
                    size: 32,
                }]
                .into(),
                0,
            )
            .unwrap();
        model
            .fabric_copy_batch(
                s,
                [CopyOp {
                    src: Operand::LogicalEndpoint { id, offset: 0 },
                    dst: Operand::Pointer(Pointer::host(host_dst.as_mut_ptr() as u64)),
                    size: 32,
                }]
                .into(),
                0,
            )
            .unwrap();
        model.stream_synchronize(s).unwrap();
    }
    assert_eq!(host_dst, host_src);
    done(&model, s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn memcpy_async_moves_device_and_host_bytes_in_stream_order() {
    let (ctx, model) = node();
    let (a, b) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let host = vec![9u8; 48];
    let s = stream(&model, 0);
    // SAFETY: the test's own mappings and host buffer, alive past the sync.
    unsafe {
        model
            .memcpy_async(
                Pointer::device(a.device_ptr()),
                Pointer::host(host.as_ptr() as u64),
                48,
                s,
            )
            .unwrap();
        model
            .memcpy_async(
                Pointer::device(b.device_ptr()),
                Pointer::device(a.device_ptr()),
                48,
                s,
            )
            .unwrap();
        assert_eq!(model.read(b.device_ptr(), 48).unwrap(), vec![0; 48]);
        model.stream_synchronize(s).unwrap();
    }
    assert_eq!(model.read(b.device_ptr(), 48).unwrap(), host);
    done(&model, s);
    drop((a, b));
    clean(&ctx, &model);
}

// ------------------------------------------------------- rules, raw

#[test]
fn f1_get_from_a_multicast_endpoint_and_endpoint_to_endpoint_are_refused() {
    let (ctx, model) = node();
    let ep = team(&ctx, ALIGN);
    let (m0, m1) = (mapped(&ctx, 0), mapped(&ctx, 1));
    let b0 = ep.bind(Device(0), 0, &m0).unwrap();
    let b1 = ep.bind(Device(1), 0, &m1).unwrap();
    let u = Unicast1::new(&ctx);
    let bu = u.bind();
    let s = stream(&model, 0);
    // SAFETY: refused at enqueue: nothing runs.
    unsafe {
        let r = model.fabric_copy_batch(s, [get(ep.id(), 0, m0.device_ptr(), 16)].into(), 0);
        assert_eq!(r, Err(Code::INVALID_VALUE));
        let e2e = CopyOp {
            src: Operand::LogicalEndpoint {
                id: u.ep.id(),
                offset: 0,
            },
            dst: Operand::LogicalEndpoint {
                id: ep.id(),
                offset: 0,
            },
            size: 16,
        };
        assert_eq!(
            model.fabric_copy_batch(s, [e2e].into(), 0),
            Err(Code::INVALID_VALUE)
        );
    }
    common::broke(&model.violations(), &["F1", "F1"]);
    done(&model, s);
    drop((b0, b1, bu));
}

#[test]
fn f2_a_pointer_on_another_device_than_the_streams_is_refused() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let far = mapped(&ctx, 1);
    let s = stream(&model, 0);
    // SAFETY: refused at enqueue.
    unsafe {
        let r = model.fabric_copy_batch(s, [put(far.device_ptr(), u.ep.id(), 0, 16)].into(), 0);
        assert_eq!(r, Err(Code::INVALID_VALUE));
        // An address that is no mapping and not said to be host memory.
        let r = model.fabric_copy_batch(s, [put(0x1000, u.ep.id(), 0, 16)].into(), 0);
        assert_eq!(r, Err(Code::INVALID_VALUE));
    }
    common::broke(&model.violations(), &["F2", "F2"]);
    done(&model, s);
    drop(b);
}

#[test]
fn f3_dependent_copies_in_one_batch_are_refused() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let other = mapped(&ctx, 0);
    let s = stream(&model, 0);
    let id = u.ep.id();
    // SAFETY: refused at enqueue.
    unsafe {
        // Two puts whose destinations overlap.
        let ops = CopyOps::from([
            put(u.src.device_ptr(), id, 0, 64),
            put(other.device_ptr(), id, 32, 64),
        ]);
        assert_eq!(model.fabric_copy_batch(s, ops, 0), Err(Code::INVALID_VALUE));
        // A get whose destination is another op's source.
        let ops = CopyOps::from([
            put(u.src.device_ptr(), id, 0, 64),
            get(id, 1024, u.src.device_ptr() + 16, 16),
        ]);
        assert_eq!(model.fabric_copy_batch(s, ops, 0), Err(Code::INVALID_VALUE));
        // Independent: fine.
        let ops = CopyOps::from([
            put(u.src.device_ptr(), id, 0, 64),
            put(other.device_ptr(), id, 64, 64),
        ]);
        model.fabric_copy_batch(s, ops, 0).unwrap();
        model.stream_synchronize(s).unwrap();
    }
    common::broke(&model.violations(), &["F3", "F3"]);
    done(&model, s);
    drop(b);
}

#[test]
fn f4_unbinding_while_a_copy_is_in_flight_is_caught_when_the_stream_reaches_it() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let s = stream(&model, 0);
    // SAFETY: breaks F4 on purpose: the binding goes before the sync.
    unsafe {
        model
            .fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 64)].into(), 0)
            .unwrap();
        b.unbind().unwrap();
        assert_eq!(model.stream_synchronize(s), Err(Code::ILLEGAL_ADDRESS));
    }
    common::broke(&model.violations(), &["F4"]);
    done(&model, s);
}

#[test]
fn f5_flags_must_be_zero_and_a_zero_size_op_is_still_validated() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let s = stream(&model, 0);
    let pending = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, ALIGN))
        .unwrap();
    // SAFETY: refused at enqueue.
    unsafe {
        let op = put(u.src.device_ptr(), u.ep.id(), 0, 16);
        assert_eq!(
            model.fabric_copy_batch(s, [op].into(), 1),
            Err(Code::INVALID_VALUE)
        );
        // Size 0 is a no-op, but its endpoint must still be ready (R13.1).
        let op = put(u.src.device_ptr(), pending.id(), 0, 0);
        assert_eq!(
            model.fabric_copy_batch(s, [op].into(), 0),
            Err(Code::INVALID_VALUE)
        );
        // A valid size-0 op: accepted, nothing moves.
        let op = put(u.src.device_ptr(), u.ep.id(), 0, 0);
        model.fabric_copy_batch(s, [op].into(), 0).unwrap();
        model.stream_synchronize(s).unwrap();
    }
    common::broke(&model.violations(), &["F5", "R13.1"]);
    done(&model, s);
    drop(b);
    drop(pending);
}

#[test]
fn f6_the_legacy_null_stream_is_refused() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    // SAFETY: refused at enqueue.
    let r = unsafe {
        model.fabric_copy_batch(0, [put(u.src.device_ptr(), u.ep.id(), 0, 16)].into(), 0)
    };
    assert_eq!(r, Err(Code::INVALID_VALUE));
    common::broke(&model.violations(), &["F6"]);
    drop(b);
}

#[test]
fn f7_the_fabric_copy_is_not_supported_before_13_5() {
    let (ctx, model) = backend::context(ModelConfig::node(1));
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let s = stream(&model, 0);
    // SAFETY: refused: the symbol does not exist on a 13.4 driver.
    let r = unsafe {
        model.fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 16)].into(), 0)
    };
    assert_eq!(r, Err(Code::NOT_SUPPORTED));
    common::no_violations(&model.violations());
    done(&model, s);
    drop(b);
}

#[test]
fn f9_an_endpoint_range_only_partly_bound_is_refused() {
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let owner = mapped(&ctx, 0);
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let s = stream(&model, 0);
    // SAFETY: refused at enqueue.
    unsafe {
        // Straddles the end of the bound memory.
        let r = model.fabric_copy_batch(
            s,
            [put(src.device_ptr(), ep.id(), ALIGN - 16, 32)].into(),
            0,
        );
        assert_eq!(r, Err(Code::INVALID_VALUE));
        // Past the endpoint's size.
        let r =
            model.fabric_copy_batch(s, [put(src.device_ptr(), ep.id(), 2 * ALIGN, 1)].into(), 0);
        assert_eq!(r, Err(Code::INVALID_VALUE));
    }
    common::broke(&model.violations(), &["F9", "F9"]);
    done(&model, s);
    drop(b);
}

/// A typed copy partly past this process's bound bytes is refused before
/// the driver naming what this process bound on the device and the fix;
/// with nothing bound there, it says so and that a dropped `Binding`
/// unbinds (a new user's `let _ = ep.bind(..)`).
#[test]
fn f9_a_copy_partly_past_the_bound_bytes_names_what_this_process_bound_and_the_fix() {
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let owner = mapped(&ctx, 0);
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let stream = Stream::new(&ctx, 0).unwrap();
    let put = |at: u64| {
        stream
            .enqueue(CopyBatch::new().put(&src, 0, &ep, at, 4096))
            .map(|_| ())
            .unwrap_err()
    };
    let e = put(0);
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::CopyNotBound { op: 0, offset: 0, size: 4096, bound, .. } if bound.is_empty()),
        "{e:?}"
    );
    assert!(
        msg.contains("nothing is bound there in this process")
            && msg.contains("one dropped unbinds")
            && msg.contains("`agree_bound`"),
        "{msg}"
    );
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let e = put(ALIGN - 1024);
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::CopyNotBound { device: Device(0), bound, .. } if **bound == [(0, ALIGN)]),
        "{e:?}"
    );
    assert!(
        msg.contains(&format!(
            "bytes {}..{} are not all bound on device 0",
            ALIGN - 1024,
            ALIGN + 3072
        )) && msg.contains(&format!("this process bound bytes 0..{ALIGN} there")),
        "{msg}"
    );
    common::no_violations(&model.violations());
    drop(b);
}

#[test]
fn r13_3_a_copy_the_stream_reaches_before_the_owner_bound_is_caught() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = stream(&model, 0);
    // SAFETY: breaks R13.3 on purpose: nothing is bound on the endpoint
    // when the stream reaches the put.
    unsafe {
        model
            .fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 64)].into(), 0)
            .unwrap();
        assert_eq!(model.stream_synchronize(s), Err(Code::ILLEGAL_ADDRESS));
    }
    common::broke(&model.violations(), &["R13.3"]);
    // Bound before the stream reaches it: fine.
    let b = u.bind();
    // SAFETY: the binding lives past the sync.
    unsafe {
        model
            .fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 64)].into(), 0)
            .unwrap();
        model.stream_synchronize(s).unwrap();
    }
    common::broke(&model.violations(), &["R13.3"]);
    done(&model, s);
    drop(b);
}

// ------------------------------------------------------- the typed API

use cuda_endpoints::error::ContextPair;
use cuda_endpoints::{CopyBatch, Error, Stream, Strided};

#[test]
fn typed_put_and_get_through_a_unicast_endpoint_leave_no_violation() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    model.write(u.src.device_ptr(), &[3; 128]).unwrap();
    let t = stream
        .enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 256, 128))
        .unwrap();
    assert_eq!(
        model.read(u.owner.device_ptr() + 256, 128).unwrap(),
        vec![0; 128],
        "a read before the stream reached the put sees the old bytes"
    );
    t.wait().unwrap();
    assert_eq!(
        model.read(u.owner.device_ptr() + 256, 128).unwrap(),
        vec![3; 128]
    );
    let got = stream
        .enqueue(CopyBatch::new().get_host(&u.ep, 256, 128))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got.received, vec![vec![3; 128]]);
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

/// F1: a copy takes `Mapped` memory however the caller holds it, as deref
/// coercion took it before `CopyMemory`: `&m` in a loop over `&[Mapped]`
/// or `&[Arc<Mapped>]` (its borrow ends with the iteration; the batch
/// keeps the reference inside), `&mut`, an `Arc`, a `Box`, an `Rc`; in
/// every copy method.
#[test]
#[allow(clippy::needless_borrow, clippy::needless_borrows_for_generic_args)]
fn f1_a_copy_takes_mapped_memory_through_a_reference_an_arc_a_box_or_an_rc() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    let srcs = [mapped(&ctx, 0), mapped(&ctx, 0)];
    let arcs = [std::sync::Arc::new(mapped(&ctx, 0))];
    let mut boxed = Box::new(mapped(&ctx, 0));
    let rc = std::rc::Rc::new(mapped(&ctx, 0));
    for (i, m) in [&srcs[0], &srcs[1], &*arcs[0], &*boxed]
        .into_iter()
        .enumerate()
    {
        model.write(m.device_ptr(), &[i as u8 + 1; 256]).unwrap();
    }
    let mut batch = CopyBatch::new();
    for (i, m) in srcs.iter().enumerate() {
        batch = batch.put(&m, 0, &u.ep, 64 * i as u64, 64);
    }
    for a in &arcs {
        batch = batch.put(&a, 0, &u.ep, 128, 64);
    }
    let batch = batch.put(&mut boxed, 0, &u.ep, 192, 64).put_strided(
        &&srcs[0],
        0,
        &u.ep,
        256,
        Strided::new(2, 32, 64, 64),
    );
    stream.enqueue(batch).unwrap().wait().unwrap();
    let want = [[1; 64], [2; 64], [3; 64], [4; 64]].concat();
    assert_eq!(model.read(u.owner.device_ptr(), 256).unwrap(), want);
    let strided = model.read(u.owner.device_ptr() + 256, 96).unwrap();
    assert_eq!(strided, [[1; 32], [0; 32], [1; 32]].concat());

    stream
        .enqueue(CopyBatch::new().get(&u.ep, 64, &rc, 0, 64).get_strided(
            &u.ep,
            0,
            &arcs[0],
            0,
            Strided::new(2, 16, 128, 16),
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(model.read(rc.device_ptr(), 64).unwrap(), vec![2; 64]);
    let got = model.read(arcs[0].device_ptr(), 32).unwrap();
    assert_eq!(got, [[1; 16], [3; 16]].concat());
    stream
        .route(&arcs[0], &u.ep)
        .put(0, 512, 64)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        model.read(u.owner.device_ptr() + 512, 64).unwrap(),
        [vec![1; 16], vec![3; 48]].concat()
    );
    drop((b, stream, srcs, arcs, boxed, rc));
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn typed_multicast_put_from_host_reaches_every_member() {
    let (ctx, model) = node();
    let ep = team(&ctx, ALIGN);
    let (m0, m1) = (mapped(&ctx, 0), mapped(&ctx, 1));
    let b0 = ep.bind(Device(0), 0, &m0).unwrap();
    let b1 = ep.bind(Device(1), 0, &m1).unwrap();
    let stream = Stream::new(&ctx, 1).unwrap();
    let done = stream
        .enqueue(CopyBatch::new().put_host(vec![0x5a; 4096], &ep, 8192))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(done.sent, vec![vec![0x5a; 4096]]);
    for m in [&m0, &m1] {
        assert_eq!(
            model.read(m.device_ptr() + 8192, 4096).unwrap(),
            vec![0x5a; 4096]
        );
    }
    drop(stream);
    drop((b0, b1));
    drop((m0, m1, ep));
    clean(&ctx, &model);
}

/// Refused before the driver: no fabric copy reached the model, nothing logged.
#[track_caller]
fn refused(
    model: &Probe,
    r: Result<cuda_endpoints::InFlight<'_>, Error>,
    check: impl Fn(&Error) -> bool,
) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => assert!(check(&e), "unexpected error: {e}"),
    }
    assert_eq!(
        model.calls(cuda_endpoints::driver::Call::FabricCpyBatchAsync),
        0
    );
    common::no_violations(&model.violations());
}

#[test]
fn f2_typed_memory_on_another_device_than_the_stream_is_refused_before_the_driver() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let far = mapped(&ctx, 1);
    let stream = Stream::new(&ctx, 0).unwrap();
    let r = stream.enqueue(CopyBatch::new().put(&far, 0, &u.ep, 0, 16));
    refused(&model, r, |e| {
        matches!(
            e,
            Error::CopyNotLocal {
                op: 0,
                stream_device: Device(0),
                ..
            }
        ) && e.to_string().contains("F2")
            // The device in words, not its `Debug` (a review read
            // "at Device(Device(1))").
            && e.to_string().contains("the local memory is on device 1, but the stream is on device 0")
    });
    drop(stream);
    drop(b);
    drop((far, u));
    clean(&ctx, &model);
}

/// F2 "every operand accessible from the stream's device": host memory
/// is reached by the devices its mapping gave access to alone. Mapped for
/// device 1, a put from it on a stream of device 0 is refused before the
/// driver naming the access and the fix; mapped for device 0 it runs.
#[test]
fn f2_host_memory_is_an_operand_only_on_streams_of_devices_it_is_mapped_for() {
    use cuda_endpoints::driver::Granularity;
    use cuda_endpoints::{Allocation, Location};
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let host = |access: &[i32]| {
        Allocation::<Private>::new(&ctx, Location::HostNuma(0), ALIGN, Granularity::Minimum)
            .unwrap()
            .map(access)
            .unwrap()
    };
    let far = host(&[1]);
    assert_eq!(far.access(), [Device(1)]);
    let stream = Stream::new(&ctx, 0).unwrap();
    let r = stream.enqueue(CopyBatch::new().put(&far, 0, &u.ep, 0, 16));
    refused(&model, r, |e| {
        let msg = e.to_string();
        matches!(
            e,
            Error::CopyNotAccessible {
                op: 0,
                host_numa: 0,
                stream_device: Device(0),
                access,
            } if access == &[Device(1)]
        ) && e.rule() == Some(cuda_endpoints::error::Rule::F2)
            && msg.contains("access for device 1, not for the stream's device 0")
            && msg.contains("map(&[0])")
    });
    let near = host(&[0]);
    stream
        .enqueue(CopyBatch::new().get(&u.ep, 0, &near, 0, 16))
        .unwrap()
        .wait()
        .unwrap();
    drop(stream);
    drop(b);
    drop((far, near, u));
    clean(&ctx, &model);
}

#[test]
fn f3_typed_dependent_ops_are_refused_naming_both_and_the_bytes_they_meet_in() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    let r = stream.enqueue(CopyBatch::new().put_host(vec![1; 64], &u.ep, 0).put_host(
        vec![2; 64],
        &u.ep,
        32,
    ));
    let id = u.ep.id();
    refused(&model, r, |e| {
        let bytes = |start, end| cuda_endpoints::error::CopyBytes {
            endpoint: Some(id),
            start,
            end,
        };
        let m = e.to_string();
        matches!(e, Error::CopyDependent { op: 0, other: 1, writes, bytes: b, other_writes: true }
            if *writes == bytes(0, 64) && *b == bytes(32, 96))
            && m.contains(&format!(
                "op 0 writes endpoint {id} bytes 0..64 and op 1 writes endpoint {id} bytes 32..96"
            ))
            && m.contains("F3")
            && m.contains("a stride below the size overlaps")
    });
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

/// F3 across the builder's fast path: puts laid end to end (the third
/// written by the fast path), then a put to that endpoint from another
/// memory (a cold call on the same endpoint, which reads the last put's
/// end back from the op list: `copy/hot.rs`, `Hot::park`; with a get on
/// that endpoint between, past it) over the third put's bytes: dependent,
/// naming both.
#[test]
fn f3_a_put_from_other_memory_over_the_last_fast_put_is_dependent() {
    let (ctx, model) = node();
    let (m, other) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let owner = mapped(&ctx, 0);
    let ep = unicast(&ctx, 0, ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let batch = |last: u64, get: bool| {
        let mut batch = CopyBatch::new()
            .put(&m, 0, &ep, 0, 64)
            .put(&m, 64, &ep, 64, 64)
            .put(&m, 128, &ep, 128, 64);
        if get {
            batch = batch.get(&ep, 512, &m, 1024, 64);
        }
        batch.put(&other, 0, &ep, last, 16)
    };
    for get in [false, true] {
        let r = stream.enqueue(batch(160, get));
        let last = 3 + usize::from(get);
        refused(&model, r, |e| {
            matches!(e, Error::CopyDependent { op, other, .. }
                if (*op, *other) == (2, last) || (*op, *other) == (last, 2))
        });
    }
    // At the third put's end: independent.
    for get in [false, true] {
        stream.enqueue(batch(192, get)).unwrap().wait().unwrap();
    }
    drop(stream);
    drop(b);
    drop((m, other, owner, ep));
    clean(&ctx, &model);
}

#[test]
fn f9_typed_ranges_outside_the_endpoint_or_the_bound_memory_are_refused() {
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let owner = mapped(&ctx, 0);
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let stream = Stream::new(&ctx, 0).unwrap();
    // R13.3 as this process sees it: nothing bound yet.
    let r = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 16));
    refused(&model, r, |e| {
        matches!(e, Error::CopyNotBound { op: 0, .. })
    });
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let r = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, ALIGN - 8, 16));
    refused(&model, r, |e| {
        matches!(e, Error::CopyNotBound { .. }) && e.to_string().contains("F9")
    });
    let r = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, 2 * ALIGN, 1));
    refused(&model, r, |e| matches!(e, Error::CopyOutOfRange { .. }));
    let r = stream.enqueue(CopyBatch::new().put(&src, ALIGN, &ep, 0, 1));
    refused(&model, r, |e| matches!(e, Error::CopyOutOfRange { .. }));
    drop(stream);
    drop(b);
    drop((src, owner, ep));
    clean(&ctx, &model);
}

#[test]
fn f9_an_endpoint_made_again_on_an_id_is_checked_against_its_own_size_not_the_one_befores() {
    // A batch keeps the facts of its first endpoint for the next
    // (`copy/check.rs`'s memo), keyed on the range's serial, the id and
    // the range's generation, not on the endpoint's size: a new endpoint
    // on the id moves the generation, so its own facts are read. (A
    // refused batch keeps no state for the next; the memo never outlives
    // the endpoint today, an unbind moving the generation too: this pins
    // the answer, whatever the memo comes to keep.)
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let stream = Stream::new(&ctx, 0).unwrap();
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let id = ep.id();
    for _ in 0..2 {
        let r = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, ALIGN, 16));
        refused(&model, r, |e| {
            matches!(e, Error::CopyNotBound { op: 0, .. })
        });
    }
    let reserved = ep.destroy().unwrap();
    let ep = reserved
        .create(Spec::unicast(0, ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(ep.id(), id);
    let r = stream.enqueue(CopyBatch::new().put(&src, 0, &ep, ALIGN, 16));
    refused(&model, r, |e| {
        matches!(e, Error::CopyOutOfRange { op: 0, .. })
    });
    drop(stream);
    drop((src, ep));
    clean(&ctx, &model);
}

#[test]
fn f9_puts_one_after_another_past_their_bound_interval_are_refused_naming_the_first_outside() {
    // The builder checks the end of puts laid out one after the other on
    // one memory and endpoint once, when the cursor leaves (issue 30): the
    // error still names the first op outside, and puts that move on to
    // another interval bound on every device still pass.
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let (low, high) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ep = unicast(&ctx, 0, 4 * ALIGN);
    let bl = ep.bind(Device(0), 0, &low).unwrap();
    let bh = ep.bind(Device(0), 2 * ALIGN, &high).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // Ops 2 and 3 lie in the gap `[ALIGN, 2 ALIGN)`; op 4 in `high`.
    let batch = CopyBatch::new()
        .put(&src, 0, &ep, 0, 64)
        .put(&src, 64, &ep, ALIGN - 64, 64)
        .put(&src, 128, &ep, ALIGN, 64)
        .put(&src, 192, &ep, ALIGN + 64, 64)
        .put(&src, 256, &ep, 2 * ALIGN, 64);
    let r = stream.enqueue(batch);
    refused(
        &model,
        r,
        |e| matches!(e, Error::CopyNotBound { op: 2, offset, .. } if *offset == ALIGN),
    );
    // Off the end of the endpoint, one after another: refused naming it.
    let batch =
        CopyBatch::new()
            .put(&src, 0, &ep, 2 * ALIGN, 64)
            .put(&src, 64, &ep, 4 * ALIGN - 32, 64);
    let r = stream.enqueue(batch);
    refused(&model, r, |e| {
        matches!(e, Error::CopyOutOfRange { op: 1, .. })
    });
    // The gap left out: every op passes, through both intervals.
    model.write(src.device_ptr(), &[5; 192]).unwrap();
    let batch = CopyBatch::new()
        .put(&src, 0, &ep, 0, 64)
        .put(&src, 64, &ep, ALIGN - 64, 64)
        .put(&src, 128, &ep, 2 * ALIGN, 64);
    stream.enqueue(batch).unwrap().wait().unwrap();
    assert_eq!(model.read(high.device_ptr(), 64).unwrap(), vec![5; 64]);
    drop(stream);
    drop((bl, bh));
    drop((src, low, high, ep));
    clean(&ctx, &model);
}

#[test]
fn f4_a_forgotten_token_frees_nothing_in_flight() {
    let (ctx, model) = node();
    let src = mapped(&ctx, 0);
    let owner = mapped(&ctx, 0);
    let ep = unicast(&ctx, 0, ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    model.write(src.device_ptr(), &[8; 32]).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let t = stream
        .enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 32))
        .unwrap();
    std::mem::forget(t);
    // The borrows ended; the source is dropped and the binding unbound
    // while the put is still in flight: the stream's record keeps the
    // memory, and the unbind synchronizes the stream first.
    drop(src);
    assert_eq!(
        model.live().mappings,
        2,
        "the source stays mapped until the stream passed the put"
    );
    let owner_ptr = owner.device_ptr();
    assert_eq!(model.read(owner_ptr, 32).unwrap(), vec![0; 32]);
    b.unbind().unwrap();
    assert_eq!(model.read(owner_ptr, 32).unwrap(), vec![8; 32]);
    drop(stream);
    drop((owner, ep));
    clean(&ctx, &model);
}

#[test]
fn f5_f6_the_typed_api_sends_flags_zero_on_its_own_stream() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    // Size 0 is a validated no-op.
    stream
        .enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 0))
        .unwrap()
        .wait()
        .unwrap();
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn f7_typed_copy_on_a_13_4_driver_is_unsupported_naming_the_driver_version_and_the_portable_path() {
    let (ctx, model) = backend::context(ModelConfig::node(1));
    // A 13.4 context takes the portable path by itself (tests/portable_copy.rs):
    // forced onto the fabric copy, the driver's answer is F7's.
    ctx.set_copy_path(cuda_endpoints::CopyPath::Fabric);
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    let e = stream
        .enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 16))
        .unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    // F7 by name, with the driver's version and the way out.
    assert!(
        matches!(
            e,
            cuda_endpoints::Error::Unsupported {
                feature: cuda_endpoints::error::Feature::FabricCopy,
                driver_version: Some(13040),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.rule(), Some(cuda_endpoints::error::Rule::F7));
    let text = e.to_string();
    for words in [
        "unsupported",
        "cuFabricCpyBatchAsync",
        "CUDA 13.4",
        "13.5",
        "CopyPath::Portable",
    ] {
        assert!(text.contains(words), "{words:?} not in {text}");
    }
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

// ---- F8: graphs of copies ----

#[test]
fn f8_a_graph_launched_after_its_endpoint_was_unbound_is_logged() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    model.write(u.src.device_ptr(), &[5; 32]).unwrap();
    let s = stream(&model, 0);
    // SAFETY: the test's own stream and operands; the capture records the
    // put, it does not run it.
    let (graph, exec) = unsafe {
        model.stream_begin_capture(s).unwrap();
        model
            .fabric_copy_batch(s, [put(u.src.device_ptr(), u.ep.id(), 0, 32)].into(), 0)
            .unwrap();
        let graph = model.stream_end_capture(s).unwrap();
        (graph, model.graph_instantiate(graph).unwrap())
    };
    assert_eq!(
        model.read(u.owner.device_ptr(), 32).unwrap(),
        vec![0; 32],
        "captured, not run"
    );
    common::no_violations(&model.violations());
    // A launch while bound runs the put.
    // SAFETY: bound, ready, every operand live until the sync.
    unsafe {
        model.graph_launch(exec, s).unwrap();
        model.stream_synchronize(s).unwrap();
    }
    assert_eq!(model.read(u.owner.device_ptr(), 32).unwrap(), vec![5; 32]);
    drop(b);
    // SAFETY: refused: the copy node's id is no longer bound (F8).
    let r = unsafe { model.graph_launch(exec, s) };
    assert_eq!(r, Err(Code::INVALID_VALUE));
    common::broke(&model.violations(), &["F8"]);
    // SAFETY: the test's own graph, executable graph and stream.
    unsafe {
        model.graph_exec_destroy(exec).unwrap();
        model.graph_destroy(graph).unwrap();
    }
    done(&model, s);
}

#[test]
fn f8_typed_graph_launched_twice_copies_each_time_and_leaves_no_violation() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    model.write(u.src.device_ptr(), &[9; 64]).unwrap();
    {
        let mut graph = stream
            .capture(
                CopyBatch::new()
                    .put(&u.src, 0, b.copy_through(&u.ep).unwrap(), 0, 64)
                    .get_host(&u.ep, 1024, 16),
            )
            .unwrap();
        assert_eq!(
            model.read(u.owner.device_ptr(), 64).unwrap(),
            vec![0; 64],
            "a capture runs nothing"
        );
        graph.launch().unwrap().wait().unwrap();
        assert_eq!(model.read(u.owner.device_ptr(), 64).unwrap(), vec![9; 64]);
        model.write(u.owner.device_ptr(), &[0; 64]).unwrap();
        model.write(u.owner.device_ptr() + 1024, &[4; 16]).unwrap();
        let t = graph.launch().unwrap();
        t.wait().unwrap();
        assert_eq!(model.read(u.owner.device_ptr(), 64).unwrap(), vec![9; 64]);
        assert_eq!(graph.received().unwrap(), vec![&[4u8; 16][..]]);
    }
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

/// A graph's received bytes are lent only once the last launch passed:
/// with the launch's token forgotten (safe code), `received()` waits for
/// the stream first, so the slices it lends never change under the borrow
/// (before, the stream wrote into them while they were lent).
#[test]
fn f8_a_graphs_received_bytes_never_change_while_lent() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    model.write(u.owner.device_ptr() + 1024, &[4; 16]).unwrap();
    {
        let mut graph = stream
            .capture(CopyBatch::new().get_host(&u.ep, 1024, 16))
            .unwrap();
        std::mem::forget(graph.launch().unwrap());
        let lent = graph.received().unwrap();
        let before = lent[0].to_vec();
        stream.synchronize().unwrap();
        let after = lent[0].to_vec();
        assert_eq!(before, after, "bytes under a shared borrow changed");
        assert_eq!(after, vec![4u8; 16]);
    }
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

// ---- events: F4's "or an event after it observed" ----

#[test]
fn f4_an_event_recorded_after_a_copy_completes_it_and_only_it() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    model.write(u.src.device_ptr(), &[2; 32]).unwrap();
    let s = stream(&model, 0);
    let (src, id) = (u.src.device_ptr(), u.ep.id());
    // SAFETY: the test's own stream, event and bound operands.
    unsafe {
        let e = model.event_create(Device(0)).unwrap();
        model
            .fabric_copy_batch(s, [put(src, id, 0, 16)].into(), 0)
            .unwrap();
        model.event_record(e, s).unwrap();
        model
            .fabric_copy_batch(s, [put(src, id, 16, 16)].into(), 0)
            .unwrap();
        model.event_synchronize(e).unwrap();
        let owner = model.read(u.owner.device_ptr(), 32).unwrap();
        assert_eq!(owner[..16], [2; 16], "before the event: completed");
        assert_eq!(owner[16..], [0; 16], "after the event: not reached yet");
        assert!(model.event_query(e).unwrap());
        model.stream_synchronize(s).unwrap();
        model.event_destroy(e).unwrap();
    }
    assert_eq!(model.read(u.owner.device_ptr(), 32).unwrap(), vec![2; 32]);
    done(&model, s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn f4_typed_copy_completes_through_its_event() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let stream = Stream::new(&ctx, 0).unwrap();
    let t = stream
        .enqueue(CopyBatch::new().put_host(vec![6; 32], b.copy_through(&u.ep).unwrap(), 64))
        .unwrap()
        .with_event()
        .unwrap();
    // Each query lets the stream reach one more batch: bounded, no clock.
    let mut queries = 0;
    while !t.is_done().unwrap() {
        queries += 1;
        assert!(queries < 8, "the event never completed");
    }
    assert_eq!(
        model.read(u.owner.device_ptr() + 64, 32).unwrap(),
        vec![6; 32]
    );
    let done = t.wait().unwrap();
    assert_eq!(done.sent, vec![vec![6; 32]]);
    // A standalone event on the stream.
    let mut e = cuda_endpoints::Event::new(&ctx, 0).unwrap();
    e.record(&stream).unwrap();
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    drop(e);
    drop(stream);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

// ---- events of one device, and the leak counters of streams, events, graphs ----

#[test]
fn an_event_recorded_on_a_stream_of_another_device_is_refused_invalid_handle() {
    let (ctx, model) = node();
    let s1 = stream(&model, 1);
    // SAFETY: the test's own event and stream; refused before any work.
    unsafe {
        let e0 = model.event_create(Device(0)).unwrap();
        assert_eq!(model.event_record(e0, s1), Err(Code::INVALID_HANDLE));
        model.event_destroy(e0).unwrap();
    }
    common::broke(
        &model.violations(),
        &["cuEventRecord: event and stream of different devices"],
    );
    done(&model, s1);
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

#[test]
fn the_typed_event_refuses_a_stream_of_another_device_before_the_driver() {
    let (ctx, model) = node();
    let stream = Stream::new(&ctx, 1).unwrap();
    let mut e = cuda_endpoints::Event::new(&ctx, 0).unwrap();
    let err = e.record(&stream).unwrap_err();
    assert!(
        matches!(
            err,
            Error::EventOnOtherDevice {
                event_device: Device(0),
                stream_device: Device(1)
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("Event::new(&ctx, 1)"), "{err}");
    assert_eq!(model.calls(cuda_endpoints::driver::Call::EventRecord), 0);
    drop(e);
    drop(stream);
    clean(&ctx, &model);
}

#[test]
fn live_counts_streams_events_graphs_and_graph_execs_so_a_leaked_one_shows() {
    let (ctx, model) = node();
    let s = stream(&model, 0);
    // SAFETY: the test's own stream, event, graph and executable graph,
    // each destroyed once below.
    let (e, g, x) = unsafe {
        let e = model.event_create(Device(0)).unwrap();
        model.stream_begin_capture(s).unwrap();
        let g = model.stream_end_capture(s).unwrap();
        let x = model.graph_instantiate(g).unwrap();
        (e, g, x)
    };
    let held = model.live();
    assert_eq!(
        (held.streams, held.events, held.graphs, held.graph_execs),
        (1, 1, 1, 1),
        "{held:?}"
    );
    assert!(!held.is_empty());
    // SAFETY: as above; nothing uses them after.
    unsafe {
        model.graph_exec_destroy(x).unwrap();
        model.graph_destroy(g).unwrap();
        model.event_destroy(e).unwrap();
    }
    done(&model, s);
    clean(&ctx, &model);
}

// ---- the stream, graph and event layer under concurrent and late use ----

/// The model behind a hook on `cuStreamBeginCapture`: once a capture has
/// begun, it lets another thread run (`go`) and waits, bounded, until that
/// thread says it is done (`back`), before the capture goes on. With
/// `blocked`, the other thread is expected to block until the capture
/// ends: the hook gives it a moment and goes on (on a busy machine it may
/// not have run yet: a test is then weaker, never wrong).
struct DuringCapture {
    model: cuda_endpoints::model::Model,
    go: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    back: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    blocked: bool,
}

impl DuringCapture {
    fn new(
        model: &cuda_endpoints::model::Model,
        blocked: bool,
    ) -> (
        DuringCapture,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (go, wait_go) = std::sync::mpsc::channel();
        let (done, back) = std::sync::mpsc::channel();
        let hook = DuringCapture {
            model: model.clone(),
            go: std::sync::Mutex::new(Some(go)),
            back: std::sync::Mutex::new(Some(back)),
            blocked,
        };
        (hook, wait_go, done)
    }
}

impl std::fmt::Debug for DuringCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DuringCapture")
    }
}

impl cuda_endpoints::driver::Forward for DuringCapture {
    type Inner = cuda_endpoints::model::Model;
    fn inner(&self) -> &Self::Inner {
        &self.model
    }
    unsafe fn stream_begin_capture(&self, stream: u64) -> cuda_endpoints::driver::DriverResult<()> {
        // SAFETY: the caller's contract is the inner driver's.
        let r = unsafe { Driver::stream_begin_capture(&self.model, stream) };
        if let Some(go) = self.go.lock().unwrap().take() {
            go.send(()).unwrap();
            let back = self.back.lock().unwrap().take().unwrap();
            if self.blocked {
                let _ = back.recv_timeout(Duration::from_millis(200));
            } else {
                back.recv_timeout(Duration::from_secs(10))
                    .expect("the other thread never came back");
            }
        }
        r
    }
}

/// Critical: `Stream` is `Sync`, and a capture used to begin, enqueue and
/// end on the shared stream itself, so a batch another thread enqueued in
/// between was captured into the graph: its token answered Ok with nothing
/// fetched, and the graph's launches later wrote into its completed `Vec`.
#[test]
fn a_batch_another_thread_enqueues_during_a_capture_runs_on_the_stream_and_is_not_captured() {
    let mut c = ModelConfig::node(2);
    c.driver_version = 13050;
    let model = cuda_endpoints::model::Model::new(c);
    let (hook, wait_go, done) = DuringCapture::new(&model, false);
    let ctx = Context::new(hook);
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let s = Stream::new(&ctx, 0).unwrap();
    model.write(u.owner.device_ptr(), &[0xAB; 64]).unwrap();
    std::thread::scope(|sc| {
        let (s, u) = (&s, &u);
        let other = sc.spawn(move || {
            wait_go
                .recv_timeout(Duration::from_secs(10))
                .expect("the capture never began");
            let got = s
                .enqueue(CopyBatch::new().get_host(&u.ep, 0, 64))
                .and_then(|t| t.wait());
            done.send(()).unwrap();
            got
        });
        let mut g = s
            .capture(CopyBatch::new().put(&u.src, 0, &u.ep, 4096, 64))
            .unwrap();
        let got = other.join().unwrap().unwrap();
        assert_eq!(got.received, vec![vec![0xAB; 64]], "fetched, not captured");
        model.write(u.src.device_ptr(), &[7; 64]).unwrap();
        g.launch().unwrap().wait().unwrap();
        assert_eq!(
            model.read(u.owner.device_ptr() + 4096, 64).unwrap(),
            vec![7; 64]
        );
    });
    drop(s);
    drop(b);
    let probe_clean = |m: &cuda_endpoints::model::Model| {
        assert!(ctx.take_teardown_errors().is_empty());
        common::no_violations(&m.violations());
    };
    drop(u);
    probe_clean(&model);
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
}

/// An `Event` recorded on a stream may outlive it; the stream, dropped,
/// was synchronized and destroyed, so an unbind or destroy afterwards
/// synchronizes nothing (it used to synchronize the destroyed stream and
/// fail `INVALID_HANDLE`).
#[test]
fn a_dropped_stream_is_never_synchronized_even_while_an_event_recorded_on_it_lives() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let mut e = cuda_endpoints::Event::new(&ctx, 0).unwrap();
    {
        let s = Stream::new(&ctx, 0).unwrap();
        s.enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
            .unwrap()
            .with_event()
            .unwrap()
            .wait()
            .unwrap();
        e.record(&s).unwrap();
    }
    let syncs = model.calls(cuda_endpoints::driver::Call::StreamSynchronize);
    b.unbind().unwrap();
    assert_eq!(
        model.calls(cuda_endpoints::driver::Call::StreamSynchronize),
        syncs,
        "the unbind synchronized a stream"
    );
    e.synchronize().unwrap();
    drop(e);
    drop(u);
    clean(&ctx, &model);
}

/// Batches completed through their events leave the in-flight index (it
/// used to keep one entry per batch until the stream was synchronized,
/// and every unbind then synchronized the stream): an unbind after them
/// synchronizes no stream, however many there were.
#[test]
fn batches_completed_through_events_leave_nothing_for_an_unbind_to_synchronize() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let s = Stream::new(&ctx, 0).unwrap();
    for _ in 0..64 {
        s.enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
            .unwrap()
            .with_event()
            .unwrap()
            .wait()
            .unwrap();
    }
    // One more, completed through a standalone event observed by a query.
    let t = s
        .enqueue(CopyBatch::new().put(&u.src, 0, &u.ep, 64, 64))
        .unwrap();
    let mut e = cuda_endpoints::Event::new(&ctx, 0).unwrap();
    e.record(&s).unwrap();
    let mut queries = 0;
    while !e.query().unwrap() {
        queries += 1;
        assert!(queries < 8, "the event never completed");
    }
    std::mem::forget(t); // completed: the event after it was observed
    let syncs = model.calls(cuda_endpoints::driver::Call::StreamSynchronize);
    b.unbind().unwrap();
    assert_eq!(
        model.calls(cuda_endpoints::driver::Call::StreamSynchronize),
        syncs,
        "the unbind synchronized a stream with nothing in flight"
    );
    drop(e);
    drop(s);
    drop(u);
    clean(&ctx, &model);
}

/// A range released (changed in place and kept as the spare, which the
/// next reserve changes in place) while a stream that copied to it is
/// dropped on another thread: the stream never reaches the range then. At
/// `92f6cbd` a stream listed the ranges it copied to by a `Weak`, which its
/// drop upgraded, and Miri (`ci/miri.sh`) found the data race here in
/// every schedule tried; a stream now remembers them by address and
/// serial alone. Natively it showed nothing: this test is for Miri.
#[test]
fn a_range_released_while_a_stream_that_copied_to_it_is_dropped_is_never_changed_under_it() {
    let (ctx, model) = node();
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    for _ in 0..16 {
        let ep = unicast(&ctx, 0, ALIGN);
        let s = Stream::new(&ctx, 0).unwrap();
        let b = ep.bind(Device(0), 0, &owner).unwrap();
        s.enqueue(CopyBatch::new().put(&src, 0, &ep, 0, 64))
            .unwrap()
            .wait()
            .unwrap();
        b.unbind().unwrap();
        std::thread::scope(|sc| {
            sc.spawn(move || drop(s));
            ep.destroy().unwrap().release().unwrap();
            // A reserve that takes the spare, if the release kept one.
            let again = unicast(&ctx, 0, ALIGN);
            again.bind(Device(0), 0, &owner).unwrap().unbind().unwrap();
        });
    }
    drop((src, owner));
    clean(&ctx, &model);
}

/// F8: a graph that names `&ep` (not the binding) may run again for as
/// long as it lives, so unbinding the memory under it is refused before
/// the driver and the memory stays bound; once the graph is dropped the
/// unbind goes through. (It used to unbind, and the next launch broke F8.)
#[test]
fn f8_an_unbind_under_a_live_graph_is_refused_before_the_driver_and_the_memory_stays_bound() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = Stream::new(&ctx, 0).unwrap();
    model.write(u.src.device_ptr(), &[3; 64]).unwrap();
    {
        let b = u.bind();
        let mut g = s
            .capture(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
            .unwrap();
        g.launch().unwrap().wait().unwrap();
        let unbinds = model.calls(cuda_endpoints::driver::Call::Unbind);
        let err = b.unbind().unwrap_err();
        assert!(
            err.rule().map(|r| r.name()) == Some("F8") && err.to_string().contains("CopyGraph"),
            "{err:?}"
        );
        assert_eq!(
            model.calls(cuda_endpoints::driver::Call::Unbind),
            unbinds,
            "refused before the driver"
        );
        model.write(u.owner.device_ptr(), &[0; 64]).unwrap();
        g.launch().unwrap().wait().unwrap();
        assert_eq!(model.read(u.owner.device_ptr(), 64).unwrap(), vec![3; 64]);
        // The binding token is spent: the endpoint keeps the memory bound
        // until it is destroyed.
    }
    drop(s);
    let Unicast1 { src, owner, ep } = u;
    ep.destroy().unwrap();
    drop((src, owner));
    clean(&ctx, &model);
}

#[test]
fn f8_an_unbind_after_the_graph_was_dropped_goes_through() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = Stream::new(&ctx, 0).unwrap();
    let b = u.bind();
    {
        let mut g = s
            .capture(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
            .unwrap();
        g.launch().unwrap().wait().unwrap();
    }
    b.unbind().unwrap();
    drop(s);
    drop(u);
    clean(&ctx, &model);
}

/// F9: a batch reads the endpoint's bindings when an op is added; an
/// unbind between building and enqueueing (or capturing) is seen at the
/// enqueue, before the driver. (The check used to pass on the stale
/// facts, and the model logged R13.3.) So is an unbind between two
/// batches: the facts the last batch read are kept for the next one on the
/// same endpoint, and the unbind makes them stale.
#[test]
fn f9_a_batch_built_before_an_unbind_or_after_it_is_checked_against_the_bindings_at_enqueue() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = Stream::new(&ctx, 0).unwrap();
    let b = u.bind();
    for _ in 0..2 {
        let batch = CopyBatch::new().put(&u.src, 0, &u.ep, 0, 4096);
        s.enqueue(batch).unwrap().wait().unwrap();
    }
    let batch = CopyBatch::new().put(&u.src, 0, &u.ep, 0, 4096);
    let captured = CopyBatch::new().put(&u.src, 0, &u.ep, 0, 4096);
    b.unbind().unwrap();
    let copies = model.calls(cuda_endpoints::driver::Call::FabricCpyBatchAsync);
    let err = s.enqueue(batch).unwrap_err();
    assert!(matches!(err, Error::CopyNotBound { op: 0, .. }), "{err:?}");
    let err = s.capture(captured).unwrap_err();
    assert!(matches!(err, Error::CopyNotBound { op: 0, .. }), "{err:?}");
    let after = CopyBatch::new().put(&u.src, 0, &u.ep, 0, 4096);
    let err = s.enqueue(after).unwrap_err();
    assert!(matches!(err, Error::CopyNotBound { op: 0, .. }), "{err:?}");
    assert_eq!(
        model.calls(cuda_endpoints::driver::Call::FabricCpyBatchAsync),
        copies,
        "refused before the driver"
    );
    // Bound again (the facts move the other way too): the batch goes.
    let b = u.bind();
    let batch = CopyBatch::new().put(&u.src, 0, &u.ep, 0, 4096);
    s.enqueue(batch).unwrap().wait().unwrap();
    drop(s);
    drop(b);
    drop(u);
    clean(&ctx, &model);
}

/// F2, F9 and the endpoint's range for a batch of one put (the one-put
/// lane: checked at enqueue without the batch's lists, `src/copy/one.rs`),
/// on the fabric and the portable path: each put alone passes or is
/// refused exactly as the same put followed by another, which takes the
/// general checks, with the same error naming the same op; and a refused
/// one never reaches the driver. Each put twice: after a refused batch (the
/// endpoint's facts are read again), and after a batch that went (the lane
/// takes them from it); and built before a change of its endpoint's
/// bindings (an unbind; an unbind and the same bind again; a bind of the
/// unbound half, after which a put refused when built is still refused, as
/// in a longer batch), then enqueued.
#[test]
fn f2_f9_a_batch_of_one_put_is_checked_as_the_same_put_followed_by_another() {
    use cuda_endpoints::CopyPath;
    let (ctx, model) = node();
    let s = Stream::new(&ctx, 0).unwrap();
    // Bound on [0, ALIGN) of [0, 2 ALIGN).
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let owner = mapped(&ctx, 0);
    let (src, far, half) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    let mut bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
    let offsets = if cfg!(miri) {
        vec![64, ALIGN]
    } else {
        vec![
            64,
            ALIGN - 64,
            ALIGN,
            2 * ALIGN - 64,
            2 * ALIGN,
            u64::MAX - 8,
        ]
    };
    let at = if cfg!(miri) {
        vec![0]
    } else {
        vec![0, ALIGN - 64, ALIGN, u64::MAX]
    };
    let outcome = backend::copy_outcome;
    let copies = || backend::copy_calls(&model);
    for path in [CopyPath::Fabric, CopyPath::Portable] {
        ctx.set_copy_path(path);
        for (change, mem) in [(0, &src), (1, &src), (2, &src), (3, &src), (0, &far)] {
            for &from in &at {
                for size in [0, 64, 65] {
                    for &offset in &offsets {
                        for warm in [false, true] {
                            if warm {
                                let batch = CopyBatch::new().put(&src, 0, &ep, 0, 64);
                                s.enqueue(batch).unwrap().wait().unwrap();
                            }
                            let calls = copies();
                            let one = CopyBatch::new().put(mem, from, &ep, offset, size);
                            // The second op: inside, bound (while anything
                            // is), apart from every first op's bytes.
                            let two = CopyBatch::new()
                                .put(mem, from, &ep, offset, size)
                                .put(&src, 0, &ep, 0, 64);
                            if change == 1 || change == 2 {
                                drop(bound.take());
                            }
                            if change == 2 {
                                bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
                            }
                            let other_half =
                                (change == 3).then(|| ep.bind(Device(0), ALIGN, &half).unwrap());
                            let (one, two) = (outcome(s.enqueue(one)), outcome(s.enqueue(two)));
                            drop(other_half);
                            let case = format!(
                                "{path:?}, change {change}, from {from}, size {size}, offset {offset}"
                            );
                            match (&one, &two) {
                                (Ok(()), Ok(())) => {}
                                (Err(a), Err(b)) if a == b => {}
                                _ => panic!("{case}: alone {one:?}, with another {two:?}"),
                            }
                            assert_eq!(
                                copies() > calls,
                                one.is_ok(),
                                "{case}: a refused batch never reaches the driver"
                            );
                            if bound.is_none() {
                                bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
                            }
                        }
                    }
                }
            }
        }
    }
    drop(bound);
    drop(s);
    drop((ep, owner, src, far, half));
    clean(&ctx, &model);
}

/// A route's put (`Stream::route`, `src/copy/route.rs`) is the batch of
/// that put alone: on the fabric and the portable path, for every put of
/// the sweep above and every change of the endpoint's bindings between the
/// route's making and its put, it passes or is refused exactly as that
/// put followed by another (the general checks), with the same error
/// naming the same op; it makes the batch's driver calls (none when
/// refused); and what passed put its bytes where the batch would. Two routes each time: one
/// made at the start of the path, which lives through every change (its
/// facts read again after each), and one made after the change.
#[test]
fn issue_30_a_routes_put_is_checked_as_the_batch_of_that_put() {
    use cuda_endpoints::CopyPath;
    let (ctx, model) = node();
    let s = Stream::new(&ctx, 0).unwrap();
    // Bound on [0, ALIGN) of [0, 2 ALIGN).
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let owner = mapped(&ctx, 0);
    let (src, far, half) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    for (m, byte) in [(&src, 7u8), (&far, 9)] {
        model
            .write(m.device_ptr(), &vec![byte; ALIGN as usize])
            .unwrap();
    }
    let mut bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
    let (offsets, at, sizes) = if cfg!(miri) {
        (vec![64, ALIGN], vec![0], vec![0, 64])
    } else {
        (
            vec![
                0,
                64,
                ALIGN - 64,
                ALIGN,
                2 * ALIGN - 64,
                2 * ALIGN,
                u64::MAX - 8,
            ],
            vec![0, ALIGN - 64, ALIGN, u64::MAX],
            vec![0, 64, 65],
        )
    };
    let outcome = backend::copy_outcome;
    let copies = || backend::copy_calls(&model);
    for path in [CopyPath::Fabric, CopyPath::Portable] {
        ctx.set_copy_path(path);
        let mut early = [s.route(&src, &ep), s.route(&far, &ep)];
        for (change, mem) in [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)] {
            let mem_ref = [&src, &far][mem];
            for &from in &at {
                for &size in &sizes {
                    for &offset in &offsets {
                        if change == 1 || change == 2 {
                            drop(bound.take());
                        }
                        if change == 2 {
                            bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
                        }
                        let other_half =
                            (change == 3).then(|| ep.bind(Device(0), ALIGN, &half).unwrap());
                        let case = format!(
                            "{path:?}, change {change}, memory {mem}, from {from}, size {size}, offset {offset}"
                        );
                        // The owner's bytes cleared before each put, to
                        // see where it wrote.
                        let clear = || model.write(owner.device_ptr(), &[0; 256]).unwrap();
                        clear();
                        let calls = copies();
                        let two = outcome(
                            s.enqueue(
                                CopyBatch::new()
                                    .put(mem_ref, from, &ep, offset, size)
                                    .put(&src, 0, &ep, 0, 0),
                            ),
                        );
                        let by_batch = model.read(owner.device_ptr(), 256).unwrap();
                        let batch_calls = copies() - calls;
                        let mut late = s.route(mem_ref, &ep);
                        for (name, route) in [("early", &mut early[mem]), ("late", &mut late)] {
                            clear();
                            let calls = copies();
                            let one = outcome(route.put(from, offset, size));
                            match (&one, &two) {
                                (Ok(()), Ok(())) => {}
                                (Err(a), Err(b)) if a == b => {}
                                _ => panic!("{case}, {name} route: {one:?}, as a batch {two:?}"),
                            }
                            // As many as the batch (none when refused; none
                            // for 0 bytes on the portable path).
                            assert_eq!(
                                copies() - calls,
                                batch_calls,
                                "{case}, {name} route: the driver's calls"
                            );
                            assert_eq!(
                                model.read(owner.device_ptr(), 256).unwrap(),
                                by_batch,
                                "{case}, {name} route: the bytes the batch put"
                            );
                        }
                        drop(other_half);
                        if bound.is_none() {
                            bound = Some(ep.bind(Device(0), 0, &owner).unwrap());
                        }
                    }
                }
            }
        }
    }
    drop(bound);
    drop(s);
    drop((ep, owner, src, far, half));
    clean(&ctx, &model);
}

/// A route's put into a multicast endpoint lands in every member's bound
/// memory, on both paths, as the batch of that put does; with a member
/// unbound, it is refused as the batch is, before the driver.
#[test]
fn issue_30_a_routes_multicast_put_reaches_every_member_as_the_batchs() {
    use cuda_endpoints::CopyPath;
    let (ctx, model) = node();
    let ep = team(&ctx, ALIGN);
    let (m0, m1, src) = (mapped(&ctx, 0), mapped(&ctx, 1), mapped(&ctx, 0));
    let b0 = ep.bind(Device(0), 0, &m0).unwrap();
    let mut b1 = Some(ep.bind(Device(1), 0, &m1).unwrap());
    model.write(src.device_ptr(), &[0xab; 100]).unwrap();
    let s = Stream::new(&ctx, 0).unwrap();
    for path in [CopyPath::Fabric, CopyPath::Portable] {
        ctx.set_copy_path(path);
        let mut route = s.route(&src, &ep);
        for m in [&m0, &m1] {
            model.write(m.device_ptr(), &[0; 108]).unwrap();
        }
        route.put(0, 8, 100).unwrap().wait().unwrap();
        for m in [&m0, &m1] {
            let got = model.read(m.device_ptr(), 108).unwrap();
            assert_eq!(got[..8], [0; 8], "{path:?}");
            assert_eq!(got[8..], [0xab; 100], "{path:?}");
        }
        drop(b1.take());
        let by_batch = s
            .enqueue(CopyBatch::new().put(&src, 0, &ep, 8, 100))
            .map(|_| ())
            .unwrap_err();
        let by_route = route.put(0, 8, 100).map(|_| ()).unwrap_err();
        assert_eq!(format!("{by_route:?}"), format!("{by_batch:?}"), "{path:?}");
        b1 = Some(ep.bind(Device(1), 0, &m1).unwrap());
    }
    drop(s);
    drop((b0, b1));
    drop((src, m0, m1, ep));
    clean(&ctx, &model);
}

/// F8 through the copy gate, for a batch of one put as for two (the
/// one-put lane leaves the put's endpoint out of the batch's list until
/// something reads it, and a capture enters the gate on that list): an
/// unbind from another thread during the capture waits for the graph's
/// pin, then is refused (`UnbindUnderGraph`), and the graph launches with
/// no violation. (A review found the one-put capture entering the gate on
/// no range: the unbind went through, and the launch broke F8.)
#[test]
fn f8_an_unbind_racing_the_capture_of_one_put_waits_for_the_graph_as_for_two() {
    for second in [false, true] {
        let mut c = ModelConfig::node(2);
        c.driver_version = 13050;
        let model = cuda_endpoints::model::Model::new(c);
        let (hook, wait_go, done) = DuringCapture::new(&model, true);
        let ctx = Context::new(hook);
        let ep = unicast(&ctx, 0, 2 * ALIGN);
        let (owner, owner2, src) = (mapped(&ctx, 0), mapped(&ctx, 0), mapped(&ctx, 0));
        let b = ep.bind(Device(0), 0, &owner).unwrap();
        let b2 = ep.bind(Device(0), ALIGN, &owner2).unwrap();
        let s = Stream::new(&ctx, 0).unwrap();
        // A batch on the endpoint first: the next one's first put is the
        // lane's (its facts kept from this one).
        let warm = CopyBatch::new().put(&src, 0, &ep, 0, 64);
        s.enqueue(warm).unwrap().wait().unwrap();
        std::thread::scope(|sc| {
            let other = sc.spawn(move || {
                wait_go.recv_timeout(Duration::from_secs(60)).unwrap();
                let r = b.unbind();
                let _ = done.send(());
                r
            });
            let mut batch = CopyBatch::new().put(&src, 0, &ep, 64, 64);
            if second {
                batch = batch.put(&src, 4096, &ep, ALIGN + 64, 64);
            }
            let mut graph = s.capture(batch).unwrap();
            graph.launch().unwrap().wait().unwrap();
            let unbound = other.join().unwrap();
            assert!(
                matches!(unbound, Err(Error::UnbindUnderGraph { .. })),
                "second op {second}: {unbound:?}"
            );
        });
        drop(b2);
        drop(s);
        common::no_violations(&model.violations());
    }
}

/// F9 across batches on other endpoints: the facts a batch keeps for the
/// next one are its first endpoint's only; a batch whose first endpoint is
/// another id of the same range, an endpoint of another context on the
/// same id, or a new endpoint on the id of a destroyed one reads its own
/// bindings, and is refused before the driver where they are missing.
#[test]
fn f9_a_batch_on_another_endpoint_after_batches_on_a_bound_one_reads_its_own_bindings() {
    // Two models (two nodes at once), as the other tests of two contexts.
    let (ctx, model) = model_node();
    let (ctx2, model2) = model_node();
    let s = Stream::new(&ctx, 0).unwrap();
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ids = ctx.reserve(2).unwrap().into_endpoints();
    let [a, c] = ids
        .into_iter()
        .map(|r| {
            r.create(Spec::unicast(0, 2 * ALIGN))
                .unwrap()
                .wait(T)
                .unwrap()
        })
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("two endpoints"));
    let b = a.bind(Device(0), 0, &owner).unwrap();
    let bound_batch = || CopyBatch::new().put(&src, 0, &a, 0, 4096);
    let refused = |r: cuda_endpoints::Result<cuda_endpoints::InFlight<'_>>,
                   model: &cuda_endpoints::model::Model| {
        let copies = model.calls(cuda_endpoints::driver::Call::FabricCpyBatchAsync);
        assert!(
            matches!(r, Err(Error::CopyNotBound { op: 0, .. })),
            "{:?}",
            r.map(|t| t.wait())
        );
        assert_eq!(
            model.calls(cuda_endpoints::driver::Call::FabricCpyBatchAsync),
            copies
        );
    };
    for _ in 0..2 {
        s.enqueue(bound_batch()).unwrap().wait().unwrap();
    }
    // Another id of the same range.
    refused(
        s.enqueue(CopyBatch::new().put(&src, 0, &c, 0, 4096)),
        &model,
    );
    // Another context's endpoint on the same id, as large, its range
    // with as many binding changes as `a`'s (one), elsewhere in it.
    let other = unicast(&ctx2, 0, 2 * ALIGN);
    assert_eq!(other.id(), a.id());
    let (s2, src2, owner2) = (
        Stream::new(&ctx2, 0).unwrap(),
        mapped(&ctx2, 0),
        mapped(&ctx2, 0),
    );
    let b2 = other.bind(Device(0), ALIGN, &owner2).unwrap();
    s.enqueue(bound_batch()).unwrap().wait().unwrap();
    refused(
        s2.enqueue(CopyBatch::new().put(&src2, 0, &other, 0, 4096)),
        &model2,
    );
    drop(b2);
    // A new endpoint on the id of a destroyed one, its binding forgotten
    // (the destroy unbinds it).
    s.enqueue(bound_batch()).unwrap().wait().unwrap();
    std::mem::forget(b);
    let a = a
        .destroy()
        .unwrap()
        .create(Spec::unicast(0, 2 * ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    refused(
        s.enqueue(CopyBatch::new().put(&src, 0, &a, 0, 4096)),
        &model,
    );
    drop((s2, src2, owner2, other));
    drop((a, c, s, src, owner));
    model_clean(&ctx, &model);
    model_clean(&ctx2, &model2);
}

/// A forgotten graph (`mem::forget`: never launched again) still pins its
/// ids against an unbind, but not against the endpoint's destroy, which
/// unbinds everything and lets go of the pin.
#[test]
fn f8_a_forgotten_graph_refuses_unbinds_but_not_the_endpoints_destroy() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = Stream::new(&ctx, 0).unwrap();
    let b = u.bind();
    let g = s
        .capture(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
        .unwrap();
    std::mem::forget(g);
    let err = b.unbind().unwrap_err();
    assert!(matches!(err, Error::UnbindUnderGraph { .. }), "{err:?}");
    let Unicast1 { src, owner, ep } = u;
    ep.destroy().unwrap();
    assert!(ctx.take_teardown_errors().is_empty());
    common::no_violations(&model.violations());
    // A new endpoint (perhaps on the same recycled range) unbinds freely.
    let again = unicast(&ctx, 0, ALIGN);
    again.bind(Device(0), 0, &owner).unwrap().unbind().unwrap();
    drop((again, s, src, owner));
    common::no_violations(&model.violations());
}

/// R1 under `mem::forget`: a forgotten graph keeps what it holds, as any
/// forgotten value does: its endpoint's range and its memory. The
/// endpoint's destroy and release return `Ok`, each letting go of its own
/// hold, and nothing is freed under the graph (`guide::guarantees`, "no
/// leak on any path").
#[test]
fn r1_a_forgotten_graph_keeps_its_range_and_memory_while_release_lets_go() {
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let s = Stream::new(&ctx, 0).unwrap();
    let b = u.bind();
    let g = s
        .capture(CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64))
        .unwrap();
    std::mem::forget(g);
    let err = b.unbind().unwrap_err();
    assert!(matches!(err, Error::UnbindUnderGraph { .. }), "{err:?}");
    let Unicast1 { src, owner, ep } = u;
    ep.destroy().unwrap().release().unwrap();
    drop((s, src, owner));
    assert!(ctx.take_teardown_errors().is_empty());
    common::no_violations(&model.violations());
    let live = model.live_node();
    assert_eq!(
        (live.ids, live.graphs, live.graph_execs),
        (1, 1, 1),
        "{live:?}"
    );
    assert!(live.allocations >= 1 && live.mappings >= 1, "{live:?}");
}

/// One op of a generated batch: `(kind, memory, endpoint, memory offset,
/// endpoint offset, size)`; kind 0 put, 1 get, 2 put_host, 3 get_host.
type Gen = (u8, usize, usize, u64, u64, u64);

/// The error the checks must report for `ops`, from the rules' definitions
/// op by op and pair by pair (not from the builder's shortcuts): the first
/// local range error, else the first endpoint range or F9 error, else a
/// dependent pair (F3: a destination overlapping another op's source or
/// destination in the same endpoint or address space), else none.
/// Endpoints are `2 * ALIGN` long with `[0, ALIGN)` bound; memory is
/// `ALIGN` long at `bases`.
fn expected(ops: &[Gen], ids: [u32; 2], bases: [u64; 2]) -> Option<(&'static str, usize)> {
    let local = |&(k, ..): &Gen| k < 2;
    // Inside the memory: its bytes, and a 0-byte op's address not one past
    // its end (F5).
    if let Some(i) = ops
        .iter()
        .position(|op| local(op) && (op.3 + op.5 > ALIGN || op.3 >= ALIGN))
    {
        return Some(("memory range", i));
    }
    for (i, &(_, _, _, _, off, size)) in ops.iter().enumerate() {
        if off + size > 2 * ALIGN {
            return Some(("endpoint range", i));
        }
        // A 0-byte op passes F9 wherever every device bound something.
        if size > 0 && off + size > ALIGN {
            return Some(("F9", i));
        }
    }
    // (space: Some(id) or None for addresses, start, end) of each side.
    let sides = |&(k, m, e, at, off, size): &Gen| {
        let ep = Some((Some(ids[e]), off, off + size));
        let mem = Some((None, bases[m] + at, bases[m] + at + size));
        match k {
            0 => (mem, ep),
            1 => (ep, mem),
            2 => (None, ep),
            _ => (ep, None),
        }
    };
    for (i, a) in ops.iter().enumerate().filter(|(_, op)| op.5 > 0) {
        let Some(w) = sides(a).1 else { continue };
        for (j, b) in ops.iter().enumerate().filter(|(_, op)| op.5 > 0) {
            let (s, d) = sides(b);
            let hit = [s, d]
                .into_iter()
                .flatten()
                .any(|r| r.0 == w.0 && r.1 < w.2 && w.1 < r.2);
            if i != j && hit {
                return Some(("F3", i));
            }
        }
    }
    None
}

#[test]
fn f3_f9_typed_checks_made_as_the_batch_is_built_agree_with_the_rules_op_by_op() {
    // Batches of puts and gets over two memories and two endpoints, in and
    // out of order, across the bound edge and the endpoint's end, with
    // 0-byte ops: the builder's same-as-the-last-op checks and its one-pass
    // F3 proof must give the error the definitions give, naming the op.
    let (ctx, model) = node();
    let mems = [mapped(&ctx, 0), mapped(&ctx, 0)];
    let owners = [mapped(&ctx, 0), mapped(&ctx, 0)];
    let eps = [unicast(&ctx, 0, 2 * ALIGN), unicast(&ctx, 0, 2 * ALIGN)];
    let bindings: Vec<_> = eps
        .iter()
        .zip(&owners)
        .map(|(ep, m)| ep.bind(Device(0), 0, m).unwrap())
        .collect();
    let ids = [eps[0].id(), eps[1].id()];
    let bases = [mems[0].device_ptr(), mems[1].device_ptr()];
    let stream = Stream::new(&ctx, 0).unwrap();
    let offsets = [
        0,
        8,
        16,
        24,
        48,
        ALIGN - 16,
        ALIGN - 8,
        ALIGN,
        2 * ALIGN - 8,
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % n
    };
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..600 {
        // Up to 24 ops: runs long enough for the builder's fast path,
        // which takes a run's puts from its third on.
        let n = 1 + next(24);
        let mut ops: Vec<Gen> = Vec::with_capacity(n);
        for _ in 0..n {
            // Half the time a put right after a put, on its memory and
            // endpoint, end to end on both sides (the builder's fast path,
            // from a run's third put on, with a 0-byte or shorter step now
            // and then); else any op.
            let op = match ops.last() {
                Some(&(0, m, e, at, off, size)) if next(2) == 0 => {
                    let step = [size, size, size, 0, 8][next(5)];
                    (0, m, e, at + step, off + step, [0, 8, 16, 24][next(4)])
                }
                _ => (
                    next(4) as u8,
                    next(2),
                    next(2),
                    [0, 8, 16, 24, ALIGN - 8][next(5)],
                    offsets[next(offsets.len())],
                    [0, 8, 16, 24][next(4)],
                ),
            };
            ops.push(op);
        }
        let mut batch = CopyBatch::new();
        for &(k, m, e, at, off, size) in &ops {
            batch = match k {
                0 => batch.put(&mems[m], at, &eps[e], off, size),
                1 => batch.get(&eps[e], off, &mems[m], at, size),
                2 => batch.put_host(vec![7; size as usize], &eps[e], off),
                _ => batch.get_host(&eps[e], off, size),
            };
        }
        let got = match stream.enqueue(batch) {
            Ok(t) => {
                t.wait().unwrap();
                None
            }
            Err(Error::CopyOutOfRange { op, what, .. }) => Some((
                if what == cuda_endpoints::error::Extent::Allocation {
                    "memory range"
                } else {
                    "endpoint range"
                },
                op,
            )),
            Err(Error::CopyNotBound { op, .. }) => Some(("F9", op)),
            Err(Error::CopyDependent { op, other, .. }) => {
                // Any dependent pair may be named; it must be one.
                let pair = [ops[op], ops[other]];
                assert!(
                    op != other && expected(&pair, ids, bases).is_some(),
                    "{ops:?}: ops {op} and {other} are not dependent"
                );
                Some(("F3", usize::MAX))
            }
            Err(e) => panic!("{ops:?}: unexpected error {e}"),
        };
        let want =
            expected(&ops, ids, bases).map(|(w, i)| (w, if w == "F3" { usize::MAX } else { i }));
        assert_eq!(got, want, "{ops:?}");
        *seen.entry(want.map(|w| w.0)).or_insert(0) += 1;
    }
    // Every outcome came up.
    assert_eq!(seen.len(), 5, "{seen:?}");
    drop(stream);
    drop(bindings);
    drop((eps, mems, owners));
    clean(&ctx, &model);
}

#[test]
fn f9_a_get_host_far_past_the_endpoint_is_refused_at_enqueue_with_no_buffer_of_that_size() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, ALIGN);
    let mem = mapped(&ctx, 0);
    let b = ep.bind(0, 0, &mem).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // A terabyte, and `u64::MAX`: no allocation is attempted for either
    // (one would abort the process, the other panic on capacity).
    for size in [1u64 << 40, u64::MAX] {
        let e = stream
            .enqueue(CopyBatch::new().get_host(&ep, 0, size))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, Error::CopyOutOfRange { op: 0, .. }),
            "{size}: {e}"
        );
    }
    drop((stream, b));
    drop((ep, mem));
    clean(&ctx, &model);
}

#[test]
fn f5_a_zero_byte_op_one_past_the_end_of_its_memory_is_refused_before_the_driver() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, ALIGN);
    let mem = mapped(&ctx, 0);
    let src = mapped(&ctx, 0);
    let b = ep.bind(0, 0, &mem).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let put = CopyBatch::new().put(&src, ALIGN, &ep, 0, 0);
    let e = stream.enqueue(put).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyOutOfRange {
                op: 0,
                offset: ALIGN,
                size: 0,
                ..
            }
        ),
        "{e}"
    );
    // Inside the memory, a 0-byte op goes through (F5: a no-op).
    let inside = CopyBatch::new().put(&src, ALIGN - 1, &ep, 0, 0);
    stream.enqueue(inside).unwrap().wait().unwrap();
    drop((stream, b));
    drop((ep, mem, src));
    clean(&ctx, &model);
}

/// F5 on the endpoint side: a 0-byte op names an offset inside the
/// endpoint or at its end, bound there or not (an empty range needs no
/// bound byte, as the model's F9 reads it); one past the end is refused.
#[test]
fn f5_a_zero_byte_op_at_the_endpoints_end_goes_through_bound_or_not_and_one_past_it_is_refused() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, 2 * ALIGN);
    let (owner, m) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let b = ep.bind(0, 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    for path in [
        cuda_endpoints::CopyPath::Fabric,
        cuda_endpoints::CopyPath::Portable,
    ] {
        ctx.set_copy_path(path);
        for offset in [ALIGN - 1, ALIGN, ALIGN + 64, 2 * ALIGN] {
            let put = CopyBatch::new().put(&m, 0, &ep, offset, 0);
            stream.enqueue(put).unwrap().wait().unwrap();
        }
        let past = CopyBatch::new().put(&m, 0, &ep, 2 * ALIGN + 1, 0);
        let e = stream.enqueue(past).map(|_| ()).unwrap_err();
        assert!(
            matches!(e, Error::CopyOutOfRange { op: 0, .. }),
            "{path:?}: {e}"
        );
    }
    drop((stream, b));
    drop((ep, owner, m));
    clean(&ctx, &model);
}

/// A get through an endpoint leaves the batch's cursor on it with no put
/// through it yet: a put there after it is checked as any put, to the
/// last offset too, where a put of 0 bytes once passed unchecked and
/// reached the driver (found by a hostile run, issue 30's round 25).
#[test]
fn f9_a_put_after_a_get_through_the_same_endpoint_is_checked_even_of_no_bytes_at_the_last_offset() {
    use cuda_endpoints::error::Extent;
    let (ctx, model) = node();
    let u = Unicast1::new(&ctx);
    let b = u.bind();
    let (ep, m) = (&u.ep, &u.src);
    let stream = Stream::new(&ctx, 0).unwrap();
    for path in [
        cuda_endpoints::CopyPath::Fabric,
        cuda_endpoints::CopyPath::Portable,
    ] {
        ctx.set_copy_path(path);
        let get = || CopyBatch::new().get(ep, 0, m, 0, 64);
        let batches = [
            ("put", get().put(m, 0, ep, u64::MAX, 0)),
            (
                "put_strided",
                get().put_strided(m, 0, ep, u64::MAX, Strided::new(3, 0, 0, 0)),
            ),
        ];
        for (what, batch) in batches {
            let calls = backend::copy_calls(&model);
            let e = stream.enqueue(batch).map(|_| ()).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::CopyOutOfRange {
                        op: 1,
                        what: Extent::EndpointRange,
                        ..
                    }
                ),
                "{path:?}, {what}: {e}"
            );
            assert_eq!(
                backend::copy_calls(&model),
                calls,
                "{path:?}, {what}: reached the driver"
            );
        }
        // Inside, after a get: the put goes through.
        let inside = get().put(m, 64, ep, 64, 64);
        stream.enqueue(inside).unwrap().wait().unwrap();
    }
    drop((stream, b));
    drop(u);
    clean(&ctx, &model);
}

#[test]
fn objects_of_two_contexts_are_refused_before_the_driver_naming_which_two() {
    // Two models: the check is the typed layer's, whatever the backend
    // (and the double has one node per process).
    let (ctx, model) = model_node();
    let (other, other_model) = model_node();
    let ep = unicast(&ctx, 0, ALIGN);
    let mem = mapped(&ctx, 0);
    let foreign = mapped(&other, 0);
    let b = ep.bind(0, 0, &mem).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let e = stream
        .enqueue(CopyBatch::new().put(&foreign, 0, &ep, 0, 64))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        e,
        Error::WrongContext {
            pair: ContextPair::MemoryOnStream
        }
    );
    assert!(
        e.to_string()
            .starts_with("the memory belongs to another context (driver backend) than the stream"),
        "{e}"
    );
    // Through a route, the same.
    let by_route = stream.route(&foreign, &ep).put(0, 0, 64).map(|_| ());
    assert_eq!(by_route.unwrap_err(), e);
    // An endpoint of the other context on this stream, and an event of
    // the other context recorded on it: each names its two objects.
    let far_ep = unicast(&other, 0, ALIGN);
    let far_b = far_ep.bind(0, 0, &foreign).unwrap();
    let e = stream
        .enqueue(CopyBatch::new().put(&mem, 0, &far_ep, 0, 64))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        e,
        Error::WrongContext {
            pair: ContextPair::EndpointOnStream
        }
    );
    assert!(e.to_string().contains("`Stream::new(&ctx, device)`"), "{e}");
    let mut event = cuda_endpoints::Event::new(&other, 0).unwrap();
    let e = event.record(&stream).unwrap_err();
    assert_eq!(
        e,
        Error::WrongContext {
            pair: ContextPair::EventOnStream
        }
    );
    assert!(
        e.to_string()
            .starts_with("the event belongs to another context"),
        "{e}"
    );
    assert_eq!(model.calls(cuda_endpoints::driver::Call::EventRecord), 0);
    assert_eq!(
        other_model.calls(cuda_endpoints::driver::Call::EventRecord),
        0
    );
    drop(event);
    drop(far_b);
    drop(far_ep);
    drop((stream, b));
    drop((ep, mem, foreign));
    model_clean(&ctx, &model);
    model_clean(&other, &other_model);
}

#[test]
fn an_endpoint_of_another_context_with_the_same_id_in_one_batch_is_the_wrong_context() {
    // Two models, as above.
    let (a, model_a) = model_node();
    let (b, model_b) = model_node();
    let (ea, eb) = (unicast(&a, 0, ALIGN), unicast(&b, 0, ALIGN));
    assert_eq!(ea.id(), eb.id(), "the same id in two contexts");
    let (ma, mb) = (mapped(&a, 0), mapped(&b, 0));
    let (ba, bb) = (ea.bind(0, 0, &ma).unwrap(), eb.bind(0, 0, &mb).unwrap());
    let stream = Stream::new(&a, 0).unwrap();
    let batch = CopyBatch::new()
        .put_host(vec![7; 64], &ea, 0)
        .put_host(vec![7; 64], &eb, 4096);
    let e = stream.enqueue(batch).map(|_| ()).unwrap_err();
    assert_eq!(
        e,
        Error::WrongContext {
            pair: ContextPair::EndpointOnStream
        }
    );
    drop((stream, ba, bb));
    drop((ea, eb, ma, mb));
    model_clean(&a, &model_a);
    model_clean(&b, &model_b);
}

#[test]
fn f3_ops_that_meet_in_an_endpoints_own_bound_memory_are_dependent() {
    let (ctx, model) = node();
    let ep = unicast(&ctx, 0, ALIGN);
    let mem = mapped(&ctx, 0);
    let b = ep.bind(0, 0, &mem).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // `mem` is bound on `ep` at 0. Op 0 writes ep[4K..8K) = mem[4K..8K),
    // which op 1 reads by address: puts alone, in order, yet dependent.
    let puts = CopyBatch::new()
        .put(&mem, 0, &ep, 4096, 4096)
        .put(&mem, 4096, &ep, 8192, 4096);
    let e = stream.enqueue(puts).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyDependent {
                op: 0,
                other: 1,
                other_writes: false,
                ..
            }
        ),
        "{e}"
    );
    // Each op's bytes as it names them, and where they meet.
    let (m, id) = (e.to_string(), ep.id());
    assert!(
        m.contains(&format!(
            "op 0 writes endpoint {id} bytes 4096..8192 and op 1 reads addresses"
        )) && m.contains("(the same memory, through an endpoint bound to it)"),
        "{m}"
    );
    // Gets: op 0 writes mem[4K..8K) = ep[4K..8K), which op 1 reads
    // through the endpoint.
    let gets = CopyBatch::new()
        .get(&ep, 0, &mem, 4096, 4096)
        .get(&ep, 4096, &mem, 8192, 4096);
    let e = stream.enqueue(gets).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyDependent {
                op: 0,
                other: 1,
                ..
            }
        ),
        "{e}"
    );
    // Apart in the memory too: independent.
    let apart = CopyBatch::new()
        .put(&mem, 0, &ep, 65536, 4096)
        .put(&mem, 4096, &ep, 69632, 4096);
    stream.enqueue(apart).unwrap().wait().unwrap();
    drop((stream, b));
    drop((ep, mem));
    clean(&ctx, &model);
}

/// A node of two devices on a 13.5 model, whatever the suite's backend.
fn model_node() -> (Context, cuda_endpoints::model::Model) {
    Context::model(ModelConfig {
        driver_version: 13050,
        ..ModelConfig::node(2)
    })
}

#[track_caller]
fn model_clean(ctx: &Context, model: &cuda_endpoints::model::Model) {
    assert!(ctx.take_teardown_errors().is_empty());
    assert!(model.live().is_empty(), "leak: {:?}", model.live());
    common::no_violations(&model.violations());
}

#[test]
fn f3_ops_that_meet_in_one_allocation_bound_by_handle_twice_are_dependent() {
    let (ctx, model) = node();
    let mem = cuda_endpoints::Allocation::<Private>::on_device(&ctx, 0, 2 * ALIGN).unwrap();
    let (src, dst) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let (a, b) = (unicast(&ctx, 0, 2 * ALIGN), unicast(&ctx, 0, ALIGN));
    let stream = Stream::new(&ctx, 0).unwrap();
    // Its first half at a[0..) and at a[ALIGN..): a put to a[64..) and a
    // get from a[ALIGN + 64..) are the same bytes.
    let a0 = a.bind_part(0, 0, &mem, 0, ALIGN).unwrap();
    let a1 = a.bind_part(0, ALIGN, &mem, 0, ALIGN).unwrap();
    let r =
        stream.enqueue(
            CopyBatch::new()
                .put(&src, 0, &a, 64, 64)
                .get(&a, ALIGN + 64, &dst, 0, 64),
        );
    assert!(
        matches!(
            r,
            Err(Error::CopyDependent {
                op: 0,
                other: 1,
                ..
            })
        ),
        "{r:?}"
    );
    drop(r);
    // Through two endpoints: two puts into the same bytes.
    let b0 = b.bind_part(0, 0, &mem, 0, ALIGN).unwrap();
    let r = stream.enqueue(
        CopyBatch::new()
            .put(&src, 0, &a, 128, 64)
            .put(&dst, 0, &b, 128, 64),
    );
    assert!(matches!(r, Err(Error::CopyDependent { .. })), "{r:?}");
    drop(r);
    drop((a0, a1, b0));
    // Two halves bound apart: ops on them are independent.
    let a0 = a.bind_part(0, 0, &mem, 0, ALIGN).unwrap();
    let a1 = a.bind_part(0, ALIGN, &mem, ALIGN, ALIGN).unwrap();
    stream
        .enqueue(
            CopyBatch::new()
                .put(&src, 0, &a, 64, 64)
                .get(&a, ALIGN + 64, &dst, 0, 64),
        )
        .unwrap()
        .wait()
        .unwrap();
    drop((stream, a0, a1));
    drop((a, b, mem, src, dst));
    clean(&ctx, &model);
}

/// The payload of a planned panic.
struct Planned;

/// A `tracing` layer that panics on the success event of each call that
/// makes a stream, an event, a graph or an executable graph
/// (`cuStreamCreate`, `cuEventCreate`, `cuStreamEndCapture`,
/// `cuGraphInstantiateWithFlags`): the handle never reaches the typed
/// layer, and still none is left. On the real backend the handle its
/// out-pointer got is destroyed while the panic unwinds; on the model,
/// `Traced` (which emits the event) destroys it. The capture's stream and
/// graph are destroyed by the capture; no rule is broken.
#[test]
fn a_panic_on_the_success_event_of_a_call_that_makes_a_stream_event_or_graph_leaks_none() {
    use cuda_endpoints::driver::Call;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Planned>() {
                default(info);
            }
        }));
    });
    for call in [
        Call::StreamCreate,
        Call::EventCreate,
        Call::StreamEndCapture,
        Call::GraphInstantiate,
    ] {
        let mut c = ModelConfig::node(2);
        c.driver_version = 13050;
        // The real backend traces its calls itself; the model is wrapped
        // in `Traced`, which does.
        let (ctx, model) = backend::context_over(c, |d| {
            if backend::is_cuda() {
                Context::new(d)
            } else {
                Context::new(cuda_endpoints::driver::Traced::new(d))
            }
        });
        let u = Unicast1::new(&ctx);
        let b = u.bind();
        let stream = cuda_endpoints::Stream::new(&ctx, 0).unwrap();
        let fired = std::sync::atomic::AtomicBool::new(false);
        let layer = common::layer::OnEvent(move |e: &common::layer::EventFields| {
            if e.succeeded() == Some(call) && !fired.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                std::panic::panic_any(Planned);
            }
        });
        let r = tracing::subscriber::with_default(layer, || {
            catch_unwind(AssertUnwindSafe(|| match call {
                Call::StreamCreate => drop(cuda_endpoints::Stream::new(&ctx, 0)),
                Call::EventCreate => drop(cuda_endpoints::Event::new(&ctx, 0)),
                _ => drop(
                    stream.capture(cuda_endpoints::CopyBatch::new().put(&u.src, 0, &u.ep, 0, 64)),
                ),
            }))
        });
        assert!(
            r.is_err_and(|p| p.is::<Planned>()),
            "{call}: the planned panic"
        );
        drop(stream);
        b.unbind().unwrap();
        drop(u);
        clean(&ctx, &model);
    }
}

//! Strided copies (`CopyBatch::put_strided`, `get_strided`): one builder
//! call for `count` blocks at a stride on each side is the same batch as
//! its `count` puts or gets one by one — the same bytes land, the same
//! batches are refused — on the fabric copy and on the portable path, and
//! the checks it makes once name the block that fails (F3, F9).
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) every test runs
//! through the real backend on the libcuda test double.

use crate::backend;

use crate::common;

use std::time::Duration;

use backend::Probe;
use cuda_endpoints::driver::Call;
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::{
    Context, CopyBatch, Device, Endpoint, Error, Mapped, Multicast, Private, Ready, Spec, Stream,
    Strided, Unicast,
};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// A node of two devices on `version` (13.5: the fabric copy; 13.4: the
/// portable path), on the backend the environment picks.
fn node(version: i32) -> (Context, Probe) {
    let mut c = ModelConfig::node(2);
    c.driver_version = version;
    backend::context(c)
}

/// No teardown error, nothing left on the node, no violation.
#[track_caller]
fn clean(ctx: &Context, p: &Probe) {
    let teardown = ctx.take_teardown_errors();
    assert!(teardown.is_empty(), "teardown errors: {teardown:?}");
    let live = p.live_node();
    assert!(live.is_empty(), "leak: {live:?}");
    common::no_violations(&p.violations());
}

fn unicast(ctx: &Context, size: u64) -> Endpoint<Ready, Unicast> {
    ctx.reserve_one()
        .unwrap()
        .create(Spec::unicast(0, size))
        .unwrap()
        .wait(T)
        .unwrap()
}

fn mapped(ctx: &Context, dev: i32) -> Mapped<Private> {
    common::mapped(ctx, dev, ALIGN)
}

use common::portable::pattern;

/// The bytes `blocks` move from `src` (read from `src_offset`) to a
/// destination of `len` bytes that held `before` (written from `offset`).
fn expected(src: &[u8], src_offset: u64, offset: u64, b: Strided, before: &[u8]) -> Vec<u8> {
    let mut out = before.to_vec();
    for i in 0..b.count {
        let (s, d) = (
            (src_offset + i * b.src_stride) as usize,
            (offset + i * b.dst_stride) as usize,
        );
        let n = b.size as usize;
        out[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    out
}

#[test]
fn a_strided_put_lands_every_block_at_its_stride_in_the_owners_bound_memory() {
    for version in [13050, 13040] {
        let (ctx, p) = node(version);
        let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
        let ep = unicast(&ctx, ALIGN);
        let b = ep.bind(Device(0), 0, &owner).unwrap();
        let bytes = pattern(3, ALIGN as usize);
        p.write(src.device_ptr(), &bytes).unwrap();
        let blocks = Strided::new(9, 100, 128, 4096);
        let stream = Stream::new(&ctx, 0).unwrap();
        let batch = CopyBatch::new().put_strided(&src, 40, &ep, 512, blocks);
        assert_eq!(batch.len(), 9, "one op per block");
        stream.enqueue(batch).unwrap().wait().unwrap();
        let want = expected(&bytes, 40, 512, blocks, &vec![0; ALIGN as usize]);
        assert!(
            p.read(owner.device_ptr(), ALIGN as usize).unwrap() == want,
            "driver {version}: the blocks landed elsewhere"
        );
        drop((stream, b));
        drop((src, owner, ep));
        clean(&ctx, &p);
    }
}

#[test]
fn a_strided_put_into_a_multicast_endpoint_lands_every_block_in_every_members_memory() {
    for version in [13050, 13040] {
        let (ctx, p) = node(version);
        let src = mapped(&ctx, 0);
        let members = [mapped(&ctx, 0), mapped(&ctx, 1)];
        let ep: Endpoint<Ready, Multicast> = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
            .unwrap()
            .wait(T)
            .unwrap();
        let bs: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(d, m)| ep.bind(Device(d as i32), 0, m).unwrap())
            .collect();
        let bytes = pattern(5, ALIGN as usize);
        p.write(src.device_ptr(), &bytes).unwrap();
        let blocks = Strided::contiguous(16, 256);
        let stream = Stream::new(&ctx, 0).unwrap();
        let batch = CopyBatch::new().put_strided(&src, 0, &ep, 8192, blocks);
        stream.enqueue(batch).unwrap().wait().unwrap();
        let want = expected(&bytes, 0, 8192, blocks, &vec![0; ALIGN as usize]);
        for m in &members {
            assert!(
                p.read(m.device_ptr(), ALIGN as usize).unwrap() == want,
                "driver {version}: a member misses blocks"
            );
        }
        drop((stream, bs));
        drop((src, members, ep));
        clean(&ctx, &p);
    }
}

#[test]
fn a_strided_get_reads_every_block_into_its_stride_in_local_memory() {
    for version in [13050, 13040] {
        let (ctx, p) = node(version);
        let (dst, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
        let ep = unicast(&ctx, ALIGN);
        let b = ep.bind(Device(0), 0, &owner).unwrap();
        let bytes = pattern(7, ALIGN as usize);
        p.write(owner.device_ptr(), &bytes).unwrap();
        // A stride of 0 on the endpoint: one block read into every row.
        for blocks in [Strided::new(12, 64, 192, 64), Strided::new(4, 32, 0, 96)] {
            let stream = Stream::new(&ctx, 0).unwrap();
            let before = p.read(dst.device_ptr(), ALIGN as usize).unwrap();
            let batch = CopyBatch::new().get_strided(&ep, 1000, &dst, 64, blocks);
            stream.enqueue(batch).unwrap().wait().unwrap();
            let want = expected(&bytes, 1000, 64, blocks, &before);
            assert!(
                p.read(dst.device_ptr(), ALIGN as usize).unwrap() == want,
                "driver {version}, {blocks:?}: the blocks landed elsewhere"
            );
        }
        drop(b);
        drop((dst, owner, ep));
        clean(&ctx, &p);
    }
}

/// The bytes a generated call can reach, at each memory's two ends (its
/// offsets are near them, its blocks within `6 * 100` bytes).
const EDGE: usize = 1024;
const EDGES: [u64; 2] = [0, ALIGN - EDGE as u64];

/// One generated strided call: put (`true`) or get, local offset, endpoint
/// offset, blocks.
type Call1 = (bool, u64, u64, Strided);

#[test]
fn a_strided_call_is_the_batch_of_its_ops_one_by_one_the_same_bytes_or_refused_alike() {
    // Blocks near the memory's end, across the endpoint's unbound gap
    // (`[ALIGN, 2 ALIGN)`) and its end, overlapping (a destination stride
    // below the size), 0-byte, with strides past `u64::MAX`: the strided
    // call and its ops one by one are both enqueued or both refused, and
    // move the same bytes.
    let (ctx, p) = node(13050);
    let (local, owner, far) = (mapped(&ctx, 0), mapped(&ctx, 0), mapped(&ctx, 0));
    let ep = unicast(&ctx, 3 * ALIGN);
    let bs = [
        ep.bind(Device(0), 0, &owner).unwrap(),
        ep.bind(Device(0), 2 * ALIGN, &far).unwrap(),
    ];
    let stream = Stream::new(&ctx, 0).unwrap();
    let locals = [0, 8, ALIGN - 300, ALIGN - 64];
    let offsets = [
        0,
        24,
        ALIGN - 200,
        2 * ALIGN - 64,
        2 * ALIGN,
        3 * ALIGN - 100,
    ];
    let strides = [0, 8, 64, 100, u64::MAX / 2];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % n
    };
    let mut outcomes = [0u32; 2];
    for _ in 0..300 {
        let c: Call1 = (
            next(2) == 0,
            locals[next(locals.len())],
            offsets[next(offsets.len())],
            Strided::new(
                1 + next(6) as u64,
                [0, 8, 64][next(3)],
                strides[next(strides.len())],
                strides[next(strides.len())],
            ),
        );
        let (put, at, off, blocks) = c;
        let seeds = [next(200) as u8, next(200) as u8, next(200) as u8];
        let mut moved = Vec::new();
        for one_by_one in [false, true] {
            // The same bytes before each of the two.
            for (m, &seed) in [&local, &owner, &far].iter().zip(&seeds) {
                for at in EDGES {
                    p.write(m.device_ptr() + at, &pattern(seed, EDGE)).unwrap();
                }
            }
            let mut batch = CopyBatch::new();
            if one_by_one {
                for i in 0..blocks.count {
                    let (a, o) = (
                        at.saturating_add(blocks.src_stride.saturating_mul(i)),
                        off.saturating_add(blocks.dst_stride.saturating_mul(i)),
                    );
                    batch = if put {
                        batch.put(&local, a, &ep, o, blocks.size)
                    } else {
                        let (a, o) = (
                            off.saturating_add(blocks.src_stride.saturating_mul(i)),
                            at.saturating_add(blocks.dst_stride.saturating_mul(i)),
                        );
                        batch.get(&ep, a, &local, o, blocks.size)
                    };
                }
            } else {
                batch = if put {
                    batch.put_strided(&local, at, &ep, off, blocks)
                } else {
                    batch.get_strided(&ep, off, &local, at, blocks)
                };
            }
            let ok = match stream.enqueue(batch) {
                Ok(t) => {
                    t.wait().unwrap();
                    true
                }
                Err(
                    Error::CopyOutOfRange { .. }
                    | Error::CopyNotBound { .. }
                    | Error::CopyDependent { .. },
                ) => false,
                Err(e) => panic!("{c:?}: unexpected error {e}"),
            };
            let after: Vec<Vec<u8>> = [&local, &owner, &far]
                .iter()
                .flat_map(|m| EDGES.map(|at| p.read(m.device_ptr() + at, EDGE).unwrap()))
                .collect();
            moved.push((ok, after));
        }
        let [(ok_s, after_s), (ok_o, after_o)] = <[_; 2]>::try_from(moved).unwrap();
        assert_eq!(
            ok_s, ok_o,
            "{c:?}: strided enqueued {ok_s}, one by one {ok_o}"
        );
        assert!(after_s == after_o, "{c:?}: other bytes moved");
        outcomes[usize::from(ok_s)] += 1;
    }
    assert!(outcomes.iter().all(|&n| n > 10), "{outcomes:?}");
    drop((stream, bs));
    drop((local, owner, far, ep));
    clean(&ctx, &p);
}

#[test]
fn f9_a_strided_put_past_the_bound_memory_is_refused_naming_its_first_block_outside() {
    let (ctx, p) = node(13050);
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ep = unicast(&ctx, 2 * ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // Blocks 0..=3 end at or before `ALIGN`, block 4 starts there.
    let r = stream.enqueue(CopyBatch::new().put_strided(
        &src,
        0,
        &ep,
        ALIGN - 256,
        Strided::contiguous(10, 64),
    ));
    match r {
        Err(Error::CopyNotBound {
            op: 4, offset: o, ..
        }) if o == ALIGN => {}
        other => panic!("expected F9 naming op 4: {other:?}"),
    }
    drop(r);
    assert_eq!(p.calls(Call::FabricCpyBatchAsync), 0);
    drop((stream, b));
    drop((src, owner, ep));
    clean(&ctx, &p);
}

#[test]
fn f3_a_strided_put_whose_blocks_overlap_is_refused_naming_two_of_its_blocks() {
    let (ctx, p) = node(13050);
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ep = unicast(&ctx, ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    let r =
        stream.enqueue(CopyBatch::new().put_strided(&src, 0, &ep, 0, Strided::new(3, 64, 64, 32)));
    match &r {
        Err(e @ Error::CopyDependent { op, other, .. })
            if *op < 3 && *other < 3 && op.abs_diff(*other) == 1 =>
        {
            assert!(e.to_string().contains("F3"), "{e}");
        }
        other => panic!("expected F3 naming two neighbouring blocks: {other:?}"),
    }
    drop(r);
    assert_eq!(p.calls(Call::FabricCpyBatchAsync), 0);
    drop((stream, b));
    drop((src, owner, ep));
    clean(&ctx, &p);
}

#[test]
fn a_strided_call_of_more_ops_than_the_process_can_hold_is_refused_before_the_driver() {
    let (ctx, p) = node(13050);
    let (src, owner) = (mapped(&ctx, 0), mapped(&ctx, 0));
    let ep = unicast(&ctx, ALIGN);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(&ctx, 0).unwrap();
    // 2^60 ops of 56 bytes: no list can hold them, and none is tried.
    let huge = Strided::new(1 << 60, 1, 0, 1);
    for batch in [
        CopyBatch::new().put_strided(&src, 0, &ep, 0, huge),
        CopyBatch::new().get_strided(&ep, 0, &src, 0, huge),
    ] {
        match stream.enqueue(batch) {
            Err(e @ Error::CopyTooManyOps { ops }) if ops == 1 << 60 => {
                assert!(e.to_string().contains("split it"), "{e}");
            }
            other => panic!("expected CopyTooManyOps: {other:?}"),
        }
    }
    assert_eq!(p.calls(Call::FabricCpyBatchAsync), 0);
    drop((stream, b));
    drop((src, owner, ep));
    clean(&ctx, &p);
}

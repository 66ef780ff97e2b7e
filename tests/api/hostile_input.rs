//! Hostile input: random bytes, sizes, offsets, alignments and device ids
//! (negative ids, `u64::MAX` sizes, offsets that overflow when added) to every
//! entry point of the typed API and to the reference model's [`Driver`]
//! methods directly. The answer is always an error, never a panic (debug
//! builds check every integer overflow), never a hang, and — through the
//! typed API — never a call that breaks a rule of the driver contract.
//!
//! With `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the same input
//! goes through the real backend and the C ABI to the libcuda test double;
//! the test that needs two simulated processes stays on the model.

use crate::backend;
use crate::common;

use std::time::Duration;

use backend::Probe;
use cuda_endpoints::driver::{
    AllocationRequest, EndpointProps, FabricHandleBytes, Granularity, Shape, handle_bits,
};
use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::typenum::U2;
use cuda_endpoints::{
    Allocation, Context, Device, Endpoint, Error, Exportable, FabricHandle, Location, Multicast,
    PosixFd, Private, Ready, Spec, Unicast, driver::Driver,
};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Bytes of a fabric handle's wire form (every kind's).
const WIRE_LEN: usize = FabricHandle::<Unicast<Exportable>>::WIRE_LEN;

const MIB: u64 = 1 << 20;
const ALIGN: u64 = 2 * MIB;
const MAX_SIZE: u64 = 512 * MIB;

fn config(cases: u32, seed: u64) -> Config {
    common::config(cases, seed, 2000)
}

/// Sizes and offsets that break naive arithmetic, valid ones, and anything.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => prop::sample::select(vec![
            0,
            1,
            4096,
            ALIGN - 1,
            ALIGN,
            ALIGN + 1,
            2 * ALIGN,
            4 * ALIGN,
            MAX_SIZE,
            MAX_SIZE + ALIGN,
            1 << 40,
            1 << 63,
            (1 << 63) + ALIGN,
            u64::MAX / 2,
            u64::MAX - ALIGN + 1,
            u64::MAX - 2 * ALIGN + 1,
            u64::MAX - 1,
            u64::MAX,
        ]),
        1 => (0u64..8).prop_map(|k| k * ALIGN),
        1 => any::<u64>(),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => prop::sample::select(vec![0, 1, 2, 3, 4, 5, 1 << 16, (1 << 16) + 1, 1 << 31, u32::MAX - 1, u32::MAX]),
        1 => any::<u32>(),
    ]
}

fn hostile_dev() -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => -2i32..6,
        1 => prop::sample::select(vec![i32::MIN, i32::MIN + 1, -1, i32::MAX, 1 << 20]),
        1 => any::<i32>(),
    ]
}

fn dev(d: i32) -> Device {
    Device(d)
}

// ------------------------------------------------------------ fabric handles

proptest! {
    #![proptest_config(config(2000, 0xfab1))]

    /// Arbitrary bytes (any length) are a typed `BadHandle` error, or a handle
    /// that the driver then refuses on import (R9.4).
    #[test]
    fn fabric_handle_from_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..WIRE_LEN * 2)) {
        let mc = FabricHandle::<Multicast<Exportable>>::from_bytes(&bytes);
        let uc = FabricHandle::<Unicast<Exportable>>::from_bytes(&bytes);
        if bytes.len() != WIRE_LEN {
            prop_assert!(matches!(mc, Err(Error::BadHandle { .. })), "multicast");
            prop_assert!(matches!(uc, Err(Error::BadHandle { .. })), "unicast");
        }
        // serde goes through the same check.
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&bytes).unwrap();
            let _ = serde_json::from_str::<FabricHandle<Multicast<Exportable>>>(&json);
        }
    }

    /// Well-formed wire header (magic, version, kind tag), random metadata and
    /// random driver bytes: parsing never panics, and an import of what
    /// parses is refused by the driver with a typed error naming the call;
    /// the id comes back and nothing leaks.
    #[test]
    fn fabric_handle_with_valid_header_is_refused_on_import(
        kind in 1u8..=2,
        meta in prop::collection::vec(any::<u8>(), 20),
        size in hostile_u64(),
        align in hostile_u64(),
        team in hostile_u32(),
        data in prop::collection::vec(any::<u8>(), 64),
        use_meta in any::<bool>(),
    ) {
        let mut w = vec![0u8; WIRE_LEN];
        w[..4].copy_from_slice(b"CEFH");
        w[4] = 1;
        w[5] = kind;
        if use_meta {
            w[6..26].copy_from_slice(&meta);
        } else {
            w[6..14].copy_from_slice(&size.to_le_bytes());
            w[14..22].copy_from_slice(&align.to_le_bytes());
            w[22..26].copy_from_slice(&team.to_le_bytes());
        }
        w[26..90].copy_from_slice(&data);
        // A valid checksum, so that the bytes get past the wire check.
        let sum = cuda_endpoints::driver::fnv1a(&w[..90]);
        w[90..].copy_from_slice(&sum.to_le_bytes());
        let (ctx, model) = backend::context(ModelConfig::node(2));
        if let Ok(h) = FabricHandle::<Multicast<Exportable>>::from_bytes(&w) {
            let f = ctx.reserve_one().unwrap().import(&h).unwrap_err();
            prop_assert!(
                matches!(f.error, Error::Driver { call: cuda_endpoints::driver::Call::Import, .. }
                    | Error::BadHandle { .. }),
                "{}", f.error
            );
            f.value.release().unwrap();
        }
        if let Ok(h) = FabricHandle::<Unicast<Exportable>>::from_bytes(&w) {
            let f = ctx.reserve_one().unwrap().import(&h).unwrap_err();
            prop_assert!(
                matches!(f.error, Error::Driver { call: cuda_endpoints::driver::Call::Import, .. }
                    | Error::BadHandle { .. }),
                "{}", f.error
            );
        }
        prop_assert!(model.live().is_empty());
        // Bytes the driver never issued are its refusal (R9.4), not a rule
        // the crate broke: it cannot know.
        prop_assert!(model.violations().is_empty(), "{:?}", model.violations());
    }

    /// `cuLogicalEndpointImport` on the model, directly: 64 random bytes,
    /// any id.
    #[test]
    fn model_import_of_64_random_bytes(
        data in prop::collection::vec(any::<u8>(), 64),
        id_pick in 0u8..3,
        raw_id in any::<u32>(),
    ) {
        let model = backend::raw(ModelConfig::node(2));
        // SAFETY: raw calls on a model no typed object uses.
        let base = unsafe { model.id_reserve(2) }.unwrap();
        let id = match id_pick { 0 => base, 1 => base + 1, _ => raw_id };
        let h = FabricHandleBytes(data.try_into().unwrap());
        // SAFETY: as above; the ids are the test's own.
        let r = unsafe { model.import(id, h) };
        prop_assert!(r.is_err());
        prop_assert_eq!(model.live().endpoints, 0);
        if id_pick < 2 {
            // On a free id of its own, only the bytes were wrong: R9.4.
            prop_assert!(model.violations().is_empty(), "{:?}", model.violations());
        }
    }
}

/// A real handle with one byte flipped, its metadata rewritten, or its
/// object number pointing at an endpoint that was never exported.
#[test]
fn forged_handles_are_refused() {
    let (ctx, model) = backend::context(ModelConfig::node(2));
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[dev(0)], ALIGN).exportable())
        .unwrap()
        .wait(Duration::from_secs(1))
        .unwrap();
    let good = ep.export().unwrap().to_bytes();
    for i in 0..WIRE_LEN {
        for bit in [0x01u8, 0x80] {
            let mut w = good;
            w[i] ^= bit;
            // The checksum catches every damaged byte before the driver.
            let e = FabricHandle::<Multicast<Exportable>>::from_bytes(&w).unwrap_err();
            assert!(matches!(e, Error::BadHandle { .. }), "byte {i}: {e}");
        }
    }
    drop(ep);
    assert!(model.live_node().is_empty(), "{:?}", model.live_node());
    common::no_violations(&model.violations());
}

// ------------------------------------------------------- raw Driver methods

/// One argument: a value from the setup's pool (a live id, handle or
/// address), a value near it, or a hostile number.
#[derive(Clone, Copy, Debug)]
enum Arg {
    Pool(u8),
    Near(u8, i8),
    Raw(u64),
}

fn arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        2 => any::<u8>().prop_map(Arg::Pool),
        1 => (any::<u8>(), -2i8..=2).prop_map(|(p, d)| Arg::Near(p, d)),
        2 => hostile_u64().prop_map(Arg::Raw),
    ]
}

#[derive(Clone, Copy, Debug)]
struct RawProp {
    ty: u8,
    word: u32,
    size: u64,
    ipc: u32,
    flags: u32,
}

fn raw_prop() -> impl Strategy<Value = RawProp> {
    (
        0u8..3,
        prop_oneof![hostile_u32(), hostile_dev().prop_map(|d| d as u32)],
        hostile_u64(),
        prop_oneof![Just(0u32), Just(1), Just(2), any::<u32>()],
        prop_oneof![Just(0u32), Just(1), Just(2), any::<u32>()],
    )
        .prop_map(|(ty, word, size, ipc, flags)| RawProp {
            ty,
            word,
            size,
            ipc,
            flags,
        })
}

impl RawProp {
    /// The domain properties (an INVALID type or unknown bits cannot be
    /// expressed any more: `ty` 0 becomes multicast, bits become booleans).
    fn props(self) -> EndpointProps {
        let shape = match self.ty {
            1 => Shape::Unicast {
                owner: Device(self.word as i32),
            },
            _ => Shape::Multicast {
                num_devices: self.word,
            },
        };
        EndpointProps {
            ipc_fabric: self.ipc != 0,
            counted_ops: self.flags != 0,
            ..EndpointProps::new(shape, self.size)
        }
    }
}

#[derive(Clone, Debug)]
enum RawCall {
    Attribute(i32, i32),
    MemInfo(i32),
    IdReserve(u32),
    IdRelease(Arg, u32),
    GetLimits(RawProp),
    Create(Arg, RawProp),
    AddDevice(Arg, i32),
    Query(Arg, u32),
    BindMem(Arg, i32, Arg, Arg, Arg, Arg, u64),
    BindAddr(Arg, i32, Arg, Arg, Arg, u64),
    Unbind(Arg, i32, Arg, Arg),
    Destroy(Arg),
    Export(Arg),
    Import(Arg, Vec<u8>),
    MemGranularity(i32, bool, u32, bool),
    MemCreate(Arg, i32, bool, u32),
    MemRelease(Arg),
    MemProperties(Arg),
    AddressReserve(Arg, Arg),
    AddressFree(Arg, Arg),
    Map(Arg, Arg, Arg, Arg),
    Unmap(Arg, Arg),
    SetAccess(Arg, Arg, Vec<i32>),
    McGranularity(u32, Arg, bool),
    McCreate(u32, Arg),
    McAddDevice(Arg, i32),
    McBindMem(Arg, Arg, Arg, Arg, Arg),
    McBindAddr(Arg, Arg, Arg, Arg),
    McUnbind(Arg, i32, Arg, Arg),
    Read(Arg, u16),
    Write(Arg, u16),
}

fn raw_call() -> impl Strategy<Value = RawCall> {
    let d = hostile_dev;
    prop_oneof![
        1 => (d(), prop_oneof![120i32..160, any::<i32>()]).prop_map(|(a, b)| RawCall::Attribute(a, b)),
        1 => d().prop_map(RawCall::MemInfo),
        1 => hostile_u32().prop_map(RawCall::IdReserve),
        1 => (arg(), hostile_u32()).prop_map(|(a, b)| RawCall::IdRelease(a, b)),
        1 => raw_prop().prop_map(RawCall::GetLimits),
        2 => (arg(), raw_prop()).prop_map(|(a, b)| RawCall::Create(a, b)),
        1 => (arg(), d()).prop_map(|(a, b)| RawCall::AddDevice(a, b)),
        1 => (arg(), hostile_u32()).prop_map(|(a, b)| RawCall::Query(a, b)),
        3 => (arg(), d(), arg(), arg(), arg(), arg(), prop_oneof![Just(0u64), any::<u64>()])
            .prop_map(|(a, b, c, e, f, g, h)| RawCall::BindMem(a, b, c, e, f, g, h)),
        3 => (arg(), d(), arg(), arg(), arg(), prop_oneof![Just(0u64), any::<u64>()])
            .prop_map(|(a, b, c, e, f, g)| RawCall::BindAddr(a, b, c, e, f, g)),
        3 => (arg(), d(), arg(), arg()).prop_map(|(a, b, c, e)| RawCall::Unbind(a, b, c, e)),
        1 => arg().prop_map(RawCall::Destroy),
        1 => arg().prop_map(RawCall::Export),
        1 => (arg(), prop::collection::vec(any::<u8>(), 64))
            .prop_map(|(a, b)| RawCall::Import(a, b)),
        1 => (d(), any::<bool>(), prop_oneof![Just(0u32), Just(1), Just(8), Just(9), any::<u32>()], any::<bool>())
            .prop_map(|(a, b, c, e)| RawCall::MemGranularity(a, b, c, e)),
        1 => (arg(), d(), any::<bool>(), prop_oneof![Just(0u32), Just(1), Just(8), any::<u32>()])
            .prop_map(|(a, b, c, e)| RawCall::MemCreate(a, b, c, e)),
        1 => arg().prop_map(RawCall::MemRelease),
        1 => arg().prop_map(RawCall::MemProperties),
        2 => (arg(), arg()).prop_map(|(a, b)| RawCall::AddressReserve(a, b)),
        1 => (arg(), arg()).prop_map(|(a, b)| RawCall::AddressFree(a, b)),
        2 => (arg(), arg(), arg(), arg()).prop_map(|(a, b, c, e)| RawCall::Map(a, b, c, e)),
        1 => (arg(), arg()).prop_map(|(a, b)| RawCall::Unmap(a, b)),
        1 => (arg(), arg(), prop::collection::vec(d(), 0..4)).prop_map(|(a, b, c)| RawCall::SetAccess(a, b, c)),
        1 => (hostile_u32(), arg(), any::<bool>()).prop_map(|(a, b, c)| RawCall::McGranularity(a, b, c)),
        1 => (hostile_u32(), arg()).prop_map(|(a, b)| RawCall::McCreate(a, b)),
        1 => (arg(), d()).prop_map(|(a, b)| RawCall::McAddDevice(a, b)),
        1 => (arg(), arg(), arg(), arg(), arg()).prop_map(|(a, b, c, e, f)| RawCall::McBindMem(a, b, c, e, f)),
        1 => (arg(), arg(), arg(), arg()).prop_map(|(a, b, c, e)| RawCall::McBindAddr(a, b, c, e)),
        1 => (arg(), d(), arg(), arg()).prop_map(|(a, b, c, e)| RawCall::McUnbind(a, b, c, e)),
        1 => (arg(), any::<u16>()).prop_map(|(a, b)| RawCall::Read(a, b)),
        1 => (arg(), any::<u16>()).prop_map(|(a, b)| RawCall::Write(a, b)),
    ]
}

/// Any answer is fine: only a panic is not.
fn ignore<T>(_: T) {}

/// A model with a bit of everything in it, and the numbers that name it.
struct Raw {
    model: Probe,
    pool: Vec<u64>,
}

impl Raw {
    fn new() -> Raw {
        // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
        unsafe {
            let m = backend::raw(ModelConfig::node(4).queries_to_ready(0));
            let mut pool = vec![0, ALIGN, 2 * ALIGN, 4 * ALIGN];
            let base = m.id_reserve(4).unwrap();
            pool.extend((0..5).map(|i| (base + i) as u64));
            let mc = EndpointProps {
                ipc_fabric: true,
                ..EndpointProps::new(Shape::Multicast { num_devices: 2 }, 4 * ALIGN)
            };
            m.create(base, mc).unwrap();
            m.add_device(base, Device(0)).unwrap();
            m.add_device(base, Device(1)).unwrap();
            assert!(m.query(base, 1).unwrap());
            let uc = EndpointProps {
                shape: Shape::Unicast { owner: Device(0) },
                ipc_fabric: false,
                ..mc
            };
            m.create(base + 1, uc).unwrap();
            assert!(m.query(base + 1, 1).unwrap());
            let h = m.export(base).unwrap();
            pool.extend(
                h.0.chunks(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
            );
            let req = |d, t| AllocationRequest {
                location: Location::Device(Device(d)),
                handle_types: t,
            };
            let a0 = m.mem_create(2 * ALIGN, req(0, 0)).unwrap();
            let a1 = m
                .mem_create(2 * ALIGN, req(1, handle_bits::POSIX_FD))
                .unwrap();
            let ptr = m.mem_address_reserve(4 * ALIGN, 0).unwrap();
            m.mem_map(ptr, 2 * ALIGN, 0, a0).unwrap();
            m.mem_set_access(ptr, 2 * ALIGN, vec![Device(0)]).unwrap();
            m.bind_mem(base, Device(1), 0, a1, 0, ALIGN, 0).unwrap();
            m.bind_addr(base + 1, Device(0), ALIGN, ptr, ALIGN, 0)
                .unwrap();
            let mcobj = m.multicast_create(2, 2 * ALIGN, 0).unwrap();
            m.multicast_add_device(mcobj, Device(0)).unwrap();
            pool.extend([a0, a1, ptr, ptr + ALIGN, ptr + 2 * ALIGN, mcobj]);
            Raw { model: m, pool }
        }
    }

    fn v(&self, a: Arg) -> u64 {
        match a {
            Arg::Pool(i) => self.pool[i as usize % self.pool.len()],
            Arg::Near(i, d) => {
                self.pool[i as usize % self.pool.len()].wrapping_add_signed(d as i64 * 4096)
            }
            Arg::Raw(v) => v,
        }
    }

    fn id(&self, a: Arg) -> u32 {
        self.v(a) as u32
    }

    fn call(&self, c: &RawCall) {
        // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
        unsafe {
            let m = &self.model;
            let d = Device;
            let h64 = |bytes: &[u8]| {
                let mut h = FabricHandleBytes::ZERO;
                h.0.copy_from_slice(bytes);
                h
            };
            let gran = |r: bool| {
                if r {
                    Granularity::Recommended
                } else {
                    Granularity::Minimum
                }
            };
            let loc = |dv: i32, numa: bool| {
                if numa {
                    Location::HostNuma(dv)
                } else {
                    Location::Device(Device(dv))
                }
            };
            // Each result is dropped: any answer is fine, only a panic is not.
            match c.clone() {
                RawCall::Attribute(a, b) => ignore(m.device_attribute(d(a), b)),
                RawCall::MemInfo(a) => ignore(m.mem_get_info(d(a))),
                RawCall::IdReserve(n) => ignore(m.id_reserve(n)),
                RawCall::IdRelease(b, n) => ignore(m.id_release(self.id(b), n)),
                RawCall::GetLimits(p) => ignore(m.get_limits(p.props())),
                RawCall::Create(i, p) => ignore(m.create(self.id(i), p.props())),
                RawCall::AddDevice(i, dv) => ignore(m.add_device(self.id(i), d(dv))),
                RawCall::Query(i, n) => ignore(m.query(self.id(i), n)),
                RawCall::BindMem(i, dv, o, h, mo, s, f) => ignore(m.bind_mem(
                    self.id(i),
                    d(dv),
                    self.v(o),
                    self.v(h),
                    self.v(mo),
                    self.v(s),
                    f,
                )),
                RawCall::BindAddr(i, dv, o, p, s, f) => {
                    ignore(m.bind_addr(self.id(i), d(dv), self.v(o), self.v(p), self.v(s), f))
                }
                RawCall::Unbind(i, dv, o, s) => {
                    ignore(m.unbind(self.id(i), d(dv), self.v(o), self.v(s)))
                }
                RawCall::Destroy(i) => ignore(m.destroy(self.id(i))),
                RawCall::Export(i) => ignore(m.export(self.id(i))),
                RawCall::Import(i, bytes) => ignore(m.import(self.id(i), h64(&bytes))),
                RawCall::MemGranularity(dv, numa, t, r) => ignore(m.mem_granularity(
                    AllocationRequest {
                        location: loc(dv, numa),
                        handle_types: t,
                    },
                    gran(r),
                )),
                RawCall::MemCreate(s, dv, numa, t) => ignore(m.mem_create(
                    self.v(s),
                    AllocationRequest {
                        location: loc(dv, numa),
                        handle_types: t,
                    },
                )),
                RawCall::MemRelease(h) => ignore(m.mem_release(self.v(h))),
                RawCall::MemProperties(h) => ignore(m.mem_properties(self.v(h))),
                RawCall::AddressReserve(s, a) => {
                    ignore(m.mem_address_reserve(self.v(s), self.v(a)))
                }
                RawCall::AddressFree(p, s) => ignore(m.mem_address_free(self.v(p), self.v(s))),
                RawCall::Map(p, s, o, h) => {
                    ignore(m.mem_map(self.v(p), self.v(s), self.v(o), self.v(h)))
                }
                RawCall::Unmap(p, s) => ignore(m.mem_unmap(self.v(p), self.v(s))),
                RawCall::SetAccess(p, s, devs) => {
                    let devs: Vec<Device> = devs.into_iter().map(Device).collect();
                    ignore(m.mem_set_access(self.v(p), self.v(s), devs))
                }
                RawCall::McGranularity(n, s, r) => {
                    ignore(m.multicast_granularity(n, self.v(s), 0, gran(r)))
                }
                RawCall::McCreate(n, s) => ignore(m.multicast_create(n, self.v(s), 0)),
                RawCall::McAddDevice(h, dv) => ignore(m.multicast_add_device(self.v(h), d(dv))),
                RawCall::McBindMem(h, o, mh, mo, s) => ignore(m.multicast_bind_mem(
                    self.v(h),
                    self.v(o),
                    self.v(mh),
                    self.v(mo),
                    self.v(s),
                )),
                RawCall::McBindAddr(h, o, p, s) => {
                    ignore(m.multicast_bind_addr(self.v(h), self.v(o), self.v(p), self.v(s)))
                }
                RawCall::McUnbind(h, dv, o, s) => {
                    ignore(m.multicast_unbind(self.v(h), d(dv), self.v(o), self.v(s)))
                }
                RawCall::Read(p, n) => ignore(m.read(self.v(p), n as usize)),
                RawCall::Write(p, n) => ignore(m.write(self.v(p), &vec![0xa5; n as usize])),
            }
        }
    }
}

proptest! {
    #![proptest_config(config(1500, 0xd21e))]

    /// Every `Driver` method of the model with hostile arguments, in random
    /// order, on a model that holds endpoints, bindings, mappings and classic
    /// multicast objects: an error code or success, never a panic.
    #[test]
    fn model_driver_methods_never_panic(calls in prop::collection::vec(raw_call(), 1..40)) {
        let raw = Raw::new();
        for c in &calls {
            raw.call(c);
            // The bookkeeping stays readable after every call.
            let _ = raw.model.live();
        }
        let _ = raw.model.live_node();
    }
}

// ------------------------------------------------------------ the typed API

#[derive(Clone, Debug)]
enum Op {
    Reserve(u32),
    Unicast(i32, u64),
    Multicast(Vec<i32>, u64),
    Team(i32, i32, u64),
    Spread(u32, Vec<i32>, u64, u16),
    Exportable(Vec<i32>, u64),
    Alloc {
        dev: i32,
        numa: Option<i32>,
        bytes: u64,
        recommended: bool,
        fd: bool,
        map: Option<Vec<i32>>,
    },
    Bind {
        ep: u8,
        mem: u8,
        dev: i32,
        offset: u64,
        part: Option<(u64, u64)>,
    },
    Attribute(i32, i32),
    CheckDevice(i32),
}

fn op() -> impl Strategy<Value = Op> {
    let d = hostile_dev;
    let size = || {
        prop_oneof![
            2 => (1u64..5).prop_map(|k| k * ALIGN),
            1 => hostile_u64(),
        ]
    };
    prop_oneof![
        1 => hostile_u32().prop_map(Op::Reserve),
        1 => (d(), size()).prop_map(|(a, b)| Op::Unicast(a, b)),
        1 => (prop::collection::vec(d(), 0..5), size()).prop_map(|(a, b)| Op::Multicast(a, b)),
        1 => (d(), d(), size()).prop_map(|(a, b, c)| Op::Team(a, b, c)),
        1 => (hostile_u32(), prop::collection::vec(d(), 0..4), size(), 0u16..300)
            .prop_map(|(a, b, c, e)| Op::Spread(a, b, c, e)),
        1 => (prop::collection::vec(d(), 0..4), size()).prop_map(|(a, b)| Op::Exportable(a, b)),
        3 => (
            d(),
            prop::option::weighted(0.2, prop_oneof![Just(0i32), any::<i32>()]),
            prop_oneof![3 => (1u64..9).prop_map(|k| k * MIB), 1 => hostile_u64()],
            any::<bool>(),
            any::<bool>(),
            prop::option::of(prop::collection::vec(d(), 0..3)),
        )
            .prop_map(|(dev, numa, bytes, recommended, fd, map)| Op::Alloc {
                dev,
                numa,
                bytes,
                recommended,
                fd,
                map
            }),
        6 => (
            any::<u8>(),
            any::<u8>(),
            d(),
            hostile_u64(),
            prop::option::of((hostile_u64(), hostile_u64())),
        )
            .prop_map(|(ep, mem, dev, offset, part)| Op::Bind {
                ep,
                mem,
                dev,
                offset,
                part
            }),
        1 => (d(), prop_oneof![120i32..160, any::<i32>()]).prop_map(|(a, b)| Op::Attribute(a, b)),
        1 => d().prop_map(Op::CheckDevice),
    ]
}

enum Ep {
    Uni(Endpoint<Ready, Unicast>),
    Mc(Endpoint<Ready, Multicast>),
    Exp(Endpoint<Ready, Multicast<Exportable>>),
}

enum Mem {
    Priv(Allocation<Private>),
    Fd(Allocation<PosixFd>),
    PrivMapped(cuda_endpoints::Mapped<Private>),
    FdMapped(cuda_endpoints::Mapped<PosixFd>),
}

/// Runs one bind with hostile arguments; any error is fine, a success is
/// unbound at once.
fn bind_one(ep: &Ep, mem: &Mem, dev: i32, offset: u64, part: Option<(u64, u64)>) {
    macro_rules! go {
        ($e:expr, $m:expr) => {{
            let r = match part {
                None => $e.bind(dev, offset, $m),
                Some((mo, s)) => $e.bind_part(dev, offset, $m, mo, s),
            };
            if let Ok(b) = r {
                b.unbind().unwrap();
            }
        }};
    }
    match (ep, mem) {
        (Ep::Uni(e), Mem::Priv(m)) => go!(e, m),
        (Ep::Uni(e), Mem::Fd(m)) => go!(e, m),
        (Ep::Uni(e), Mem::PrivMapped(m)) => go!(e, m),
        (Ep::Uni(e), Mem::FdMapped(m)) => go!(e, m),
        (Ep::Mc(e), Mem::Priv(m)) => go!(e, m),
        (Ep::Mc(e), Mem::Fd(m)) => go!(e, m),
        (Ep::Mc(e), Mem::PrivMapped(m)) => go!(e, m),
        (Ep::Mc(e), Mem::FdMapped(m)) => go!(e, m),
        (Ep::Exp(e), Mem::Fd(m)) => go!(e, m),
        (Ep::Exp(e), Mem::FdMapped(m)) => go!(e, m),
        // Private memory on an exportable endpoint does not compile (R5.6).
        (Ep::Exp(_), Mem::Priv(_) | Mem::PrivMapped(_)) => {}
    }
}

/// Runs hostile `ops` on the model, or (`classic`) on the classic-multicast
/// fallback over the model.
fn run_typed(ops: &[Op], classic: bool) -> Result<(), TestCaseError> {
    let mut cfg = ModelConfig::node(4).queries_to_ready(1);
    // Large id counts are refused with OUT_OF_MEMORY past this (R11).
    cfg.max_ids = 4096;
    let (ctx, model) = backend::context_over(cfg, |raw| {
        if classic {
            Context::new(cuda_endpoints::driver::Classic::new(raw))
        } else {
            Context::new(raw)
        }
    });
    let short = Duration::from_millis(50);
    let mut eps: Vec<Ep> = Vec::new();
    let mut mems: Vec<Mem> = Vec::new();
    let devs = |v: &[i32]| v.iter().map(|&d| Device(d)).collect::<Vec<_>>();
    for op in ops {
        match op.clone() {
            // The fallback's own id table allows more (see
            // `classic_refuses_hostile_id_counts`); not 65536 ids per case.
            Op::Reserve(n) if classic && n > 4096 => {}
            Op::Reserve(n) => match ctx.reserve(n) {
                Ok(r) => {
                    prop_assert!((1..=4096).contains(&n));
                    drop(r.into_endpoints());
                }
                Err(e) => prop_assert!(
                    n == 0
                        || n > 4096 - 64
                            && e.code() == Some(cuda_endpoints::driver::Code::OUT_OF_MEMORY),
                    "{}",
                    e
                ),
            },
            Op::Unicast(d, size) => {
                let r = ctx.reserve_one().unwrap().create(Spec::unicast(d, size));
                if let Ok(p) = r {
                    eps.push(Ep::Uni(p.wait(short).unwrap()));
                }
            }
            Op::Multicast(d, size) => {
                let r = ctx
                    .reserve_one()
                    .unwrap()
                    .create(Spec::multicast(&devs(&d), size));
                if let Ok(p) = r {
                    eps.push(Ep::Mc(p.wait(short).unwrap()));
                }
            }
            Op::Exportable(d, size) => {
                let r = ctx
                    .reserve_one()
                    .unwrap()
                    .create(Spec::multicast(&devs(&d), size).exportable());
                if let Ok(p) = r {
                    eps.push(Ep::Exp(p.wait(short).unwrap()));
                }
            }
            Op::Team(a, b, size) => {
                let r = ctx
                    .reserve_one()
                    .unwrap()
                    .create(Spec::team(U2::new(), size));
                if let Ok(p) = r
                    && let Ok(p) = p.add_device(a)
                    && let Ok(p) = p.add_device(b)
                {
                    eps.push(Ep::Mc(p.wait(short).unwrap()));
                }
            }
            Op::Spread(n, add, size, us) => {
                let r = ctx.reserve_one().unwrap().create(Spec::spread(n, size));
                if let Ok(mut p) = r {
                    for d in add {
                        p = match p.add_device(d) {
                            Ok(p) => p,
                            Err(f) => f.value,
                        };
                    }
                    match p.wait(Duration::from_micros(us as u64)) {
                        Ok(e) => eps.push(Ep::Mc(e)),
                        Err(f) => {
                            prop_assert!(matches!(f.error, Error::Timeout { .. }), "{}", f.error)
                        }
                    }
                }
            }
            Op::Alloc {
                dev,
                numa,
                bytes,
                recommended,
                fd,
                map,
            } => {
                let loc = match numa {
                    Some(n) => Location::HostNuma(n),
                    None => Location::Device(Device(dev)),
                };
                let g = if recommended {
                    Granularity::Recommended
                } else {
                    Granularity::Minimum
                };
                let access = map.as_deref().map(devs);
                macro_rules! alloc {
                    ($h:ty, $plain:ident, $mapped:ident) => {{
                        let a = if numa.is_none() && !recommended {
                            Allocation::<$h>::on_device(&ctx, Device(dev), bytes)
                        } else {
                            Allocation::<$h>::new(&ctx, loc, bytes, g)
                        };
                        if let Ok(a) = a {
                            match access {
                                None => mems.push(Mem::$plain(a)),
                                Some(acc) => match a.map(&acc) {
                                    Ok(m) => mems.push(Mem::$mapped(m)),
                                    Err(f) => mems.push(Mem::$plain(f.value)),
                                },
                            }
                        }
                    }};
                }
                if fd {
                    alloc!(PosixFd, Fd, FdMapped)
                } else {
                    alloc!(Private, Priv, PrivMapped)
                }
            }
            Op::Bind {
                ep,
                mem,
                dev,
                offset,
                part,
            } => {
                if !eps.is_empty() && !mems.is_empty() {
                    let e = &eps[ep as usize % eps.len()];
                    let m = &mems[mem as usize % mems.len()];
                    bind_one(e, m, dev, offset, part);
                }
            }
            Op::Attribute(d, a) => {
                let _ = ctx.attribute(Device(d), a);
            }
            Op::CheckDevice(d) => {
                prop_assert_eq!(ctx.check_device(Device(d)).is_ok(), (0..4).contains(&d));
            }
        }
        // Nothing hostile reached the model as a rule violation.
        prop_assert!(
            model.violations().is_empty(),
            "{:?} after {:?}",
            model.violations(),
            op
        );
    }
    drop(eps);
    drop(mems);
    prop_assert!(model.live().is_empty(), "{:?}", model.live());
    prop_assert!(model.violations().is_empty(), "{:?}", model.violations());
    prop_assert!(ctx.take_teardown_errors().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(config(1500, 0x7e5d))]

    /// Hostile sizes, offsets, memory offsets, device ids, team sizes, id
    /// counts, NUMA nodes and access lists through the typed API: typed
    /// errors before the driver, no panic, no violation, nothing leaked.
    #[test]
    fn typed_api_hostile_arguments(ops in prop::collection::vec(op(), 1..16)) {
        run_typed(&ops, false)?;
    }

    /// The same through the classic-multicast fallback (`cuMulticast*` on
    /// the model): it refuses or emulates, never breaks a rule.
    #[test]
    fn typed_api_hostile_arguments_on_the_classic_fallback(ops in prop::collection::vec(op(), 1..16)) {
        run_typed(&ops, true)?;
    }
}

/// The corner cases, spelled out.
#[test]
fn typed_api_corner_cases() {
    let (ctx, model) = backend::context(ModelConfig::node(2).queries_to_ready(0));
    // Allocation sizes that overflow when rounded up to the granularity.
    for bytes in [
        u64::MAX,
        u64::MAX - ALIGN + 2,
        (u64::MAX / ALIGN) * ALIGN + 1,
    ] {
        let e = Allocation::<Private>::on_device(&ctx, dev(0), bytes).unwrap_err();
        assert!(
            !matches!(e, Error::Driver { .. })
                || e.code() == Some(cuda_endpoints::driver::Code::OUT_OF_MEMORY),
            "{e}"
        );
    }
    for d in [-1, 2, i32::MIN, i32::MAX] {
        assert!(matches!(
            Allocation::<Private>::on_device(&ctx, dev(d), ALIGN),
            Err(Error::NoSuchDevice { .. })
        ));
        let f = ctx
            .reserve_one()
            .unwrap()
            .create(Spec::unicast(d, ALIGN))
            .unwrap_err();
        assert!(matches!(f.error, Error::NoSuchDevice { .. }), "{}", f.error);
    }
    let ep = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::unicast(0, 4 * ALIGN))
        .unwrap()
        .wait(Duration::ZERO)
        .unwrap();
    let mem = Allocation::<Private>::on_device(&ctx, dev(0), 2 * ALIGN).unwrap();
    for (off, mo, size) in [
        (u64::MAX - ALIGN + 1, 0, ALIGN),
        (0, u64::MAX - ALIGN + 1, ALIGN),
        (ALIGN, 0, u64::MAX - ALIGN + 1),
        (1 << 63, 1 << 63, 1 << 63),
        (0, 0, 0),
        (1, 0, ALIGN),
    ] {
        let e = ep.bind_part(0, off, &mem, mo, size).unwrap_err();
        assert!(!matches!(e, Error::Driver { .. }), "{e}");
    }
    assert!(matches!(
        ep.bind(-1, 0, &mem),
        Err(Error::WrongDevice { .. })
    ));
    // An empty `wait_all` and zero timeouts return at once.
    assert!(
        cuda_endpoints::wait_all::<Unicast>(Vec::new(), Duration::ZERO)
            .unwrap()
            .is_empty()
    );
    drop(ep);
    drop(mem);
    assert!(model.live().is_empty());
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

/// The model's virtual address space runs out with `OUT_OF_MEMORY`, not an
/// overflow: a process's own space (2^47 bytes, a GPU process's) filled,
/// then more, a reservation past it, and one aligned past the model's
/// addresses.
#[test]
fn model_address_space_exhaustion() {
    // SAFETY: raw calls on a backend no typed object uses; the test owns every id, handle and address it names.
    unsafe {
        let m = backend::raw(ModelConfig::node(1));
        let p = m.mem_address_reserve(ALIGN, 0).unwrap();
        // The model leaves one alignment of gap after each reservation.
        let next = p + 2 * ALIGN;
        let size = (1 << 47) - ALIGN;
        let big = m.mem_address_reserve(size, 0).unwrap();
        assert_eq!(big, next);
        for (size, align) in [(ALIGN, 0), (1, 0), (ALIGN, 1 << 63), (u64::MAX, 0)] {
            assert_eq!(
                m.mem_address_reserve(size, align),
                Err(cuda_endpoints::driver::Code::OUT_OF_MEMORY)
            );
        }
        m.mem_address_free(big, size).unwrap();
        m.mem_address_free(p, ALIGN).unwrap();
        assert!(m.live().is_empty());
        common::no_violations(&m.violations());
    }
}

/// Well-formed bytes (right magic, node and checksum) that name an endpoint
/// that was never exportable are refused like any forged handle (R9.4).
#[test]
fn model_refuses_forged_handle_of_non_exportable_endpoint() {
    let m = backend::raw(ModelConfig::node(1));
    // SAFETY: raw calls on a model no typed object uses; the test owns every id.
    unsafe {
        let base = m.id_reserve(3).unwrap();
        let prop = |ipc_fabric| EndpointProps {
            ipc_fabric,
            ..EndpointProps::new(Shape::Unicast { owner: Device(0) }, ALIGN)
        };
        m.create(base, prop(false)).unwrap();
        m.create(base + 1, prop(true)).unwrap();
        let mut h = m.export(base + 1).unwrap();
        let exported = u64::from_le_bytes(h.0[16..24].try_into().unwrap());
        // The object created just before: the private one.
        h.0[16..24].copy_from_slice(&(exported - 1).to_le_bytes());
        let sum = cuda_endpoints::driver::fnv1a(&h.0[..24]);
        h.0[24..32].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(
            m.import(base + 2, h),
            Err(cuda_endpoints::driver::Code::INVALID_VALUE)
        );
    }
    // The driver's refusal (R9.4): the importer cannot know.
    assert!(m.violations().is_empty(), "{:?}", m.violations());
    assert_eq!(m.live().endpoints, 2);
}

/// Hostile id counts on the classic fallback: refused with OUT_OF_MEMORY
/// before any bookkeeping (not minutes of inserting, nor an abort): a
/// refused count takes no id, so the next reservation starts where it
/// would have without them.
#[test]
fn classic_refuses_hostile_id_counts_before_taking_any_id() {
    let (ctx, _model) = backend::context_over(ModelConfig::node(2), |raw| {
        Context::new(cuda_endpoints::driver::Classic::new(raw))
    });
    let first = ctx.reserve(8).unwrap();
    let next = first.base() + first.len();
    drop(first);
    for n in [(1 << 16) + 1, 1 << 24, 1 << 31, u32::MAX] {
        let e = ctx.reserve(n).unwrap_err();
        assert_eq!(
            e.code(),
            Some(cuda_endpoints::driver::Code::OUT_OF_MEMORY),
            "{e}"
        );
    }
    let r = ctx.reserve(8).unwrap();
    assert_eq!(r.len(), 8);
    assert_eq!(r.base(), next, "a refused count took ids");
    drop(r);
    common::no_violations(&_model.violations());
}

/// A second attachment of one endpoint in one process would share its
/// bindings with the first in the driver (destroying either unbinds both):
/// the context refuses it, for an imported handle and for the exporter's own.
#[test]
fn a_second_attachment_in_one_process_is_refused() {
    let (ctx, model) = Context::model(ModelConfig::node(2));
    let peer = Context::new(model.spawn_process());
    let x = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::spread(1, ALIGN).exportable())
        .unwrap();
    let h = x.export().unwrap();
    let t = Duration::from_secs(1);
    let a = peer.reserve_one().unwrap().import(&h).unwrap();
    let a = a.add_device(0).unwrap().wait(t).unwrap();
    let f = peer.reserve_one().unwrap().import(&h).unwrap_err();
    assert!(
        matches!(f.error, Error::AlreadyAttached { id } if id == a.id()),
        "{}",
        f.error
    );
    drop(f);
    let f = ctx.reserve_one().unwrap().import(&h).unwrap_err();
    assert!(
        matches!(f.error, Error::AlreadyAttached { id } if id == x.id()),
        "{}",
        f.error
    );
    drop(f);
    let x = x.wait(t).unwrap();
    let mem = Allocation::<PosixFd>::on_device(&peer, dev(0), ALIGN).unwrap();
    let bound = a.bind(0, 0, &mem).unwrap();
    bound.unbind().unwrap();
    // Once the first attachment is gone, the handle can be imported again.
    drop(a);
    let again = peer.reserve_one().unwrap().import(&h).unwrap();
    drop((again, x, mem));
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(model.live_node().is_empty());
}

//! The model's processes (SPEC R12): exit frees what a process held, shared
//! endpoints live on, shareable handles cross processes — through the typed
//! API over `cuda_endpoints::model::Model` processes of one fabric.
use std::time::Duration;

use cuda_endpoints::driver::Code;
use cuda_endpoints::driver::{AllocationRequest, Driver, handle_bits};
use cuda_endpoints::model::{FabricConfig, Model, ShareableKind};
use cuda_endpoints::{Allocation, Context, Exportable, FabricHandle, Multicast, PosixFd, Spec};
use cuda_endpoints::{Device, Location};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

fn request(dev: i32, handle_types: u32) -> AllocationRequest {
    AllocationRequest {
        location: Location::Device(Device(dev)),
        handle_types,
    }
}

#[test]
fn r12_2_exit_frees_what_the_process_held_and_r12_3_shared_endpoints_live_on() {
    let a = Model::fabric(FabricConfig::nodes(1, 2));
    let b = a.spawn_process();
    let (ca, cb) = (Context::new(a.clone()), Context::new(b.clone()));
    let ep = ca
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, ALIGN).exportable())
        .unwrap()
        .add_device(0)
        .unwrap();
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&ep.export().unwrap().to_bytes())
        .unwrap();
    let imported = cb.reserve_one().unwrap().import(&h).unwrap();
    let imported = imported.add_device(1).unwrap().wait(T).unwrap();
    let ep = ep.wait(T).unwrap();
    let mem = Allocation::<PosixFd>::on_device(&ca, Device(0), ALIGN).unwrap();
    let bound = ep.bind(0, 0, &mem).unwrap();
    // Process a dies holding everything; its typed objects are leaked
    // here as a killed process's would be.
    std::mem::forget(bound);
    std::mem::forget(ep);
    std::mem::forget(mem);
    let held = a.exit();
    assert_eq!(
        (held.ids, held.endpoints, held.bindings, held.allocations),
        (1, 1, 1, 1)
    );
    assert!(a.live().is_empty() && a.has_exited());
    assert_eq!(
        a.live_fabric().endpoint_objects,
        1,
        "b's reference keeps it"
    );
    // b carries on: binds, unbinds, tears down.
    let mem = Allocation::<PosixFd>::on_device(&cb, Device(1), ALIGN).unwrap();
    drop(imported.bind(1, 0, &mem).unwrap());
    drop((imported, mem));
    assert!(b.live().is_empty());
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
    assert!(a.violations().is_empty(), "{:?}", a.violations());
    // The exited process makes no more calls.
    // SAFETY: a raw reserve of the exited process; nothing owns it.
    assert_eq!(unsafe { a.id_reserve(1) }, Err(Code::DEINITIALIZED));
}

#[test]
fn r12_4_posix_descriptors_reach_their_node_only() {
    let n0 = Model::fabric(FabricConfig::nodes(2, 1));
    let same = n0.spawn_process();
    let other = n0.spawn_process_on(1).unwrap();
    assert!(n0.spawn_process_on(2).is_none());
    // SAFETY: raw VMM calls on handles these tests own alone.
    unsafe {
        let mem = n0
            .mem_create(ALIGN, request(0, handle_bits::POSIX_FD))
            .unwrap();
        let fd = n0.export_shareable(mem, ShareableKind::PosixFd).unwrap();
        assert_eq!(
            other.import_shareable(fd, ShareableKind::PosixFd),
            Err(Code::INVALID_VALUE)
        );
        let mine = same.import_shareable(fd, ShareableKind::PosixFd).unwrap();
        // Not exported as a fabric handle: the wrong kind is refused.
        assert_eq!(
            n0.export_shareable(mem, ShareableKind::Fabric),
            Err(Code::INVALID_VALUE)
        );
        same.mem_release(mine).unwrap();
        n0.mem_release(mem).unwrap();
        // Freed: the descriptor is closed with it.
        assert_eq!(
            same.import_shareable(fd, ShareableKind::PosixFd),
            Err(Code::INVALID_VALUE)
        );
    }
    // Only the wrong-kind export was a rule the caller could check.
    assert_eq!(n0.violations().len(), 1, "{:?}", n0.violations());
    assert!(n0.live_fabric().is_empty());
}

#[test]
fn imported_memory_is_the_same_memory() {
    let a = Model::fabric(FabricConfig::nodes(1, 1));
    let b = a.spawn_process();
    // SAFETY: raw VMM calls on handles and ranges this test owns alone.
    unsafe {
        let map = |m: &Model, h: u64| {
            let va = m.mem_address_reserve(ALIGN, 0).unwrap();
            m.mem_map(va, ALIGN, 0, h).unwrap();
            m.mem_set_access(va, ALIGN, vec![Device(0)]).unwrap();
            va
        };
        let mem = a
            .mem_create(ALIGN, request(0, handle_bits::POSIX_FD))
            .unwrap();
        let fd = a.export_shareable(mem, ShareableKind::PosixFd).unwrap();
        let theirs = b.import_shareable(fd, ShareableKind::PosixFd).unwrap();
        let (va, vb) = (map(&a, mem), map(&b, theirs));
        b.write(vb + 64, b"written by b").unwrap();
        assert_eq!(a.read(va + 64, 12).unwrap(), b"written by b");
        // Counted once, at the exporter.
        assert_eq!(
            a.mem_get_info(Device(0)).unwrap().1 - a.mem_get_info(Device(0)).unwrap().0,
            ALIGN
        );
        for (m, v, h) in [(&a, va, mem), (&b, vb, theirs)] {
            m.mem_unmap(v, ALIGN).unwrap();
            m.mem_address_free(v, ALIGN).unwrap();
            m.mem_release(h).unwrap();
        }
    }
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
    assert!(a.violations().is_empty(), "{:?}", a.violations());
}

#[test]
fn r12_4_fabric_handles_cross_nodes_with_an_imex_channel() {
    let n0 = Model::fabric(FabricConfig::nodes(2, 1));
    let n1 = n0.spawn_process_on(1).unwrap();
    // SAFETY: raw classic calls on objects these tests own alone.
    unsafe {
        let mc = n0
            .multicast_create(2, ALIGN, u64::from(handle_bits::FABRIC))
            .unwrap();
        n0.multicast_add_device(mc, Device(0)).unwrap();
        let token = n0.export_shareable(mc, ShareableKind::Fabric).unwrap();
        n1.set_fabric_access(false);
        assert_eq!(
            n1.import_shareable(token, ShareableKind::Fabric),
            Err(Code::NOT_PERMITTED)
        );
        n1.set_fabric_access(true);
        let theirs = n1.import_shareable(token, ShareableKind::Fabric).unwrap();
        // Node 1's device 0 is another GPU than node 0's device 0.
        n1.multicast_add_device(theirs, Device(0)).unwrap();
        let mem = n1.mem_create(ALIGN, request(0, 0)).unwrap();
        n1.multicast_bind_mem(theirs, 0, mem, 0, ALIGN).unwrap();
        assert_eq!(n1.live().multicast_objects, 1);
        // The creator's release does not free the importer's object.
        n0.mem_release(mc).unwrap();
        assert_eq!(n0.live_fabric().multicast_objects, 1);
        n1.multicast_unbind(theirs, Device(0), 0, ALIGN).unwrap();
        n1.mem_release(theirs).unwrap();
        n1.mem_release(mem).unwrap();
    }
    assert!(n0.live_fabric().is_empty(), "{:?}", n0.live_fabric());
    assert!(n0.violations().is_empty(), "{:?}", n0.violations());
}

/// One process of a fabric leaves another its address space (guide,
/// `security`: one process cannot hurt another beyond what the driver
/// contract lets it): a reservation past a process's own address space
/// (2^47 bytes, a GPU process's) is refused `OUT_OF_MEMORY`, a process
/// that reserves and frees its whole space again and again, past the
/// fabric's fresh addresses, leaves the others theirs, and one that holds
/// its whole space holds no more.
#[test]
fn one_process_leaves_another_its_address_space() {
    let a = Model::fabric(FabricConfig::nodes(1, 2));
    let b = a.spawn_process();
    let whole = 1u64 << 47;
    // SAFETY: raw VMM calls on ranges this test owns alone.
    unsafe {
        assert_eq!(
            a.mem_address_reserve(u64::MAX >> 1, 0),
            Err(Code::OUT_OF_MEMORY)
        );
        for _ in 0..70_000 {
            let va = a.mem_address_reserve(whole, 0).unwrap();
            a.mem_address_free(va, whole).unwrap();
        }
        let vb = b.mem_address_reserve(ALIGN, 0).unwrap();
        b.mem_address_free(vb, ALIGN).unwrap();
        let va = a.mem_address_reserve(whole, 0).unwrap();
        assert_eq!(a.mem_address_reserve(ALIGN, 0), Err(Code::OUT_OF_MEMORY));
        let vb = b.mem_address_reserve(whole, 0).unwrap();
        assert!(va.abs_diff(vb) >= whole, "apart");
        a.mem_address_free(va, whole).unwrap();
        b.mem_address_free(vb, whole).unwrap();
    }
    assert!(a.violations().is_empty(), "{:?}", a.violations());
}

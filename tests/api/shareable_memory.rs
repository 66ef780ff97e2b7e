//! Sharing VMM memory between processes through the driver table (C5,
//! R12.4): `Allocation<PosixFd>::export_fd` / `import_fd` (a real
//! descriptor, even on the in-process model) and `Allocation<FabricShareable>`'s
//! 64 bytes, each import checked against the driver, never the bytes.
//! OS processes on the model fabric are in `tests/shareable_processes.rs`.

use crate::common;

use std::os::fd::AsFd;

use cuda_endpoints::model::{FabricConfig, Model, ModelConfig};
use cuda_endpoints::{
    Allocation, Context, Device, Error, FabricShareable, PosixFd,
    driver::{Call, Code},
};

const MIB2: u64 = 2 << 20;

fn ctx_of(m: &Model) -> Context {
    Context::new(m.clone())
}

#[test]
fn c5_a_posix_fd_export_is_a_real_descriptor_and_imports_as_the_same_memory() {
    let a = Model::new(ModelConfig::node(2));
    let b = a.spawn_process();
    let (ca, cb) = (ctx_of(&a), ctx_of(&b));
    let mem = Allocation::<PosixFd>::on_device(&ca, 0, MIB2)
        .unwrap()
        .map(&[Device(0)])
        .unwrap();
    a.write(mem.device_ptr(), b"through a descriptor").unwrap();
    let fd = mem.export_fd().unwrap();
    // A real descriptor of this OS process: it can be duplicated (as
    // `SCM_RIGHTS` does) and the copy imports as well.
    let dup = fd.try_clone().unwrap();
    drop(fd);
    let theirs = Allocation::<PosixFd>::import_fd(&cb, &dup, MIB2).unwrap();
    assert_eq!(theirs.size(), MIB2);
    assert_eq!(
        theirs.location(),
        cuda_endpoints::Location::Device(Device(0))
    );
    let theirs = theirs.map(&[Device(1)]).unwrap();
    assert_eq!(
        b.read(theirs.device_ptr(), 20).unwrap(),
        b"through a descriptor"
    );
    drop(dup);
    drop(theirs);
    drop(mem);
    common::clean(&ca, &a);
    common::clean(&cb, &b);
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
}

#[test]
fn c5_fabric_bytes_import_as_the_same_memory_on_another_node() {
    let a = Model::fabric(FabricConfig::nodes(2, 1));
    let b = a.spawn_process_on(1).unwrap();
    let (ca, cb) = (ctx_of(&a), ctx_of(&b));
    let mem = Allocation::<FabricShareable>::on_device(&ca, 0, MIB2)
        .unwrap()
        .map::<Device>(&[])
        .unwrap();
    a.write(mem.device_ptr(), b"across nodes").unwrap();
    let bytes = mem.export_fabric().unwrap();
    let theirs = Allocation::<FabricShareable>::import_fabric(&cb, &bytes, MIB2)
        .unwrap()
        .map::<Device>(&[])
        .unwrap();
    assert_eq!(b.read(theirs.device_ptr(), 12).unwrap(), b"across nodes");
    drop(theirs);
    drop(mem);
    assert!(a.violations().is_empty(), "{:?}", a.violations());
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
}

#[test]
fn r12_4_a_posix_fd_is_refused_on_another_node() {
    let a = Model::fabric(FabricConfig::nodes(2, 1));
    let b = a.spawn_process_on(1).unwrap();
    let (ca, cb) = (ctx_of(&a), ctx_of(&b));
    let mem = Allocation::<PosixFd>::on_device(&ca, 0, MIB2).unwrap();
    let fd = mem.export_fd().unwrap();
    let e = Allocation::<PosixFd>::import_fd(&cb, fd.as_fd(), MIB2).unwrap_err();
    assert_eq!(e.code(), Some(Code::INVALID_VALUE), "{e}");
    assert!(
        matches!(
            e,
            Error::Driver {
                call: Call::MemImportFromShareableHandle,
                ..
            }
        ),
        "{e}"
    );
    drop(mem);
    assert!(a.violations().is_empty(), "{:?}", a.violations());
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
}

#[test]
fn r12_4_fabric_bytes_need_an_imex_channel() {
    let a = Model::fabric(FabricConfig::nodes(2, 1));
    let b = a.spawn_process_on(1).unwrap();
    b.set_fabric_access(false);
    let (ca, cb) = (ctx_of(&a), ctx_of(&b));
    let mem = Allocation::<FabricShareable>::on_device(&ca, 0, MIB2).unwrap();
    let bytes = mem.export_fabric().unwrap();
    let e = Allocation::<FabricShareable>::import_fabric(&cb, &bytes, MIB2).unwrap_err();
    assert_eq!(e.code(), Some(Code::NOT_PERMITTED), "{e}");
    drop(mem);
    assert!(a.live_fabric().is_empty(), "{:?}", a.live_fabric());
}

#[test]
fn c5_import_checks_the_declared_size_against_the_driver_and_leaks_nothing() {
    let a = Model::new(ModelConfig::node(1));
    let b = a.spawn_process();
    let (ca, cb) = (ctx_of(&a), ctx_of(&b));
    let mem = Allocation::<PosixFd>::on_device(&ca, 0, MIB2).unwrap();
    let fd = mem.export_fd().unwrap();
    // Larger than the memory: the driver refuses to map it.
    let e = Allocation::<PosixFd>::import_fd(&cb, &fd, 2 * MIB2).unwrap_err();
    assert!(
        matches!(e, Error::ImportMismatch { declared, .. } if declared == 2 * MIB2),
        "{e}"
    );
    // Not a multiple of the granularity.
    let e = Allocation::<PosixFd>::import_fd(&cb, &fd, MIB2 - 4096).unwrap_err();
    assert!(matches!(e, Error::ImportMismatch { .. }), "{e}");
    let e = Allocation::<PosixFd>::import_fd(&cb, &fd, 0).unwrap_err();
    assert!(matches!(e, Error::ImportMismatch { .. }), "{e}");
    // Every failed import was released again.
    assert!(b.live().is_empty(), "{:?}", b.live());
    drop(fd);
    drop(mem);
    common::clean(&ca, &a);
    common::clean(&cb, &b);
}

#[test]
fn r9_4_bytes_and_descriptors_the_driver_did_not_make_are_refused() {
    let m = Model::new(ModelConfig::node(1));
    let ctx = ctx_of(&m);
    let e = Allocation::<FabricShareable>::import_fabric(&ctx, &[7; 64], MIB2).unwrap_err();
    assert_eq!(e.code(), Some(Code::INVALID_VALUE), "{e}");
    let (reader, _writer) = std::io::pipe().unwrap();
    let e = Allocation::<PosixFd>::import_fd(&ctx, &reader, MIB2).unwrap_err();
    assert_eq!(e.code(), Some(Code::INVALID_VALUE), "{e}");
    common::clean(&ctx, &m);
}

#[test]
fn c5_memory_made_without_the_handle_type_cannot_be_exported_as_it() {
    // `export_fd` exists only on `PosixFd` memory; a `FabricShareable` allocation
    // asked for a descriptor through the driver is refused there.
    let m = Model::new(ModelConfig::node(1));
    let ctx = ctx_of(&m);
    let mem = Allocation::<FabricShareable>::on_device(&ctx, 0, MIB2).unwrap();
    // SAFETY: an export changes nothing the allocation owns.
    let r = unsafe {
        cuda_endpoints::driver::Driver::mem_export(
            &m,
            mem.handle(),
            cuda_endpoints::driver::ShareableKind::PosixFd,
        )
    };
    assert_eq!(r, Err(Code::INVALID_VALUE));
    drop(mem);
    assert_eq!(m.violations().len(), 1, "the model logs the C5 violation");
}

/// F2 "the pointer must be local: on the stream's device": a POSIX
/// descriptor stays within one node (R12.4), so memory imported by one is
/// on this node's device of that ordinal, local to its streams: a put from
/// it runs and lands. (Memory imported by fabric handle never is local:
/// `copy_edges::f2_memory_of_another_nodes_device_with_the_same_ordinal_is_not_local`.)
#[test]
fn f2_memory_imported_by_posix_fd_on_the_streams_device_is_local() {
    use cuda_endpoints::{CopyBatch, Stream};
    let (ranks, model) = common::node_processes(2);
    let ((c0, p0), (c1, p1)) = (&ranks[0], &ranks[1]);
    let mem = common::mapped::<PosixFd>(c0, 0, MIB2);
    p0.write(mem.device_ptr(), b"imported by fd").unwrap();
    let fd = mem.export_fd().unwrap();
    let theirs = Allocation::<PosixFd>::import_fd(c1, &fd, MIB2)
        .unwrap()
        .map(&[0])
        .unwrap();
    let ep = common::ready_unicast(c1, 0, MIB2, std::time::Duration::from_secs(5));
    let owner = common::mapped::<PosixFd>(c1, 0, MIB2);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(c1, 0).unwrap();
    stream
        .enqueue(CopyBatch::new().put(&theirs, 0, &ep, 64, 14))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        p1.read(owner.device_ptr() + 64, 14).unwrap(),
        b"imported by fd"
    );
    drop(stream);
    drop(b);
    drop((ep, owner, theirs, fd, mem));
    common::no_violations(&model.violations());
    common::clean(c1, p1);
    common::clean(c0, p0);
}

/// F2: memory imported by fabric handle is refused as a copy's local
/// memory whatever its ordinal, and the error says why: not "at device 0,
/// but the stream is on device 0".
#[test]
fn f2_memory_imported_by_fabric_handle_is_refused_naming_the_import_and_the_fix() {
    use cuda_endpoints::{CopyBatch, Stream};
    let (ranks, model) = common::node_processes(2);
    let ((c0, _), (c1, _)) = (&ranks[0], &ranks[1]);
    let mem = common::mapped::<FabricShareable>(c0, 0, MIB2);
    let bytes = mem.export_fabric().unwrap();
    let theirs = Allocation::<FabricShareable>::import_fabric(c1, &bytes, MIB2)
        .unwrap()
        .map(&[0])
        .unwrap();
    let ep = common::ready_unicast(c1, 0, MIB2, std::time::Duration::from_secs(5));
    let owner = common::mapped::<FabricShareable>(c1, 0, MIB2);
    let b = ep.bind(Device(0), 0, &owner).unwrap();
    let stream = Stream::new(c1, 0).unwrap();
    let e = stream
        .enqueue(CopyBatch::new().get(&ep, 0, &theirs, 0, 64))
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CopyNotLocal {
                op: 0,
                fabric_import: true,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("imported by fabric handle")
            && msg.contains("F2")
            && msg.contains("import_fd"),
        "{msg}"
    );
    assert_eq!(e.rule(), Some(cuda_endpoints::error::Rule::F2));
    assert_eq!(model.calls(Call::FabricCpyBatchAsync), 0);
    drop(stream);
    drop(b);
    common::no_violations(&model.violations());
}

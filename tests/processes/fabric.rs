//! The model fabric with real OS processes (SPEC R8, R9, R12): every test
//! starts its own fabric server, runs children (this test binary again, a
//! role chosen by `CUDA_ENDPOINTS_TEST_ROLE`), bounds every wait, kills and
//! reaps every child on every path, and leaves no socket behind.
//!
//! Children talk to the parent in lines: `@@ key value` on stdout (the
//! parent ignores anything else, e.g. libtest's own lines), commands on
//! stdin.
//!
//! Under `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) the children
//! run the real backend on the libcuda test double, which joins the test's
//! fabric (`common/rank.rs`), except the `mem-*` roles: they test the
//! fabric client's own shareable-handle tokens.
#![cfg(feature = "fabric")]

use crate::children;
use crate::common;
use crate::rank;

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use children::{Guard, Lines};

use cuda_endpoints::fabric::{self, FABRIC_ENV, FabricServer, Join};
use cuda_endpoints::model::{FabricConfig, Live, ShareableKind};
use cuda_endpoints::{
    Allocation, Context, Device, Error, Exportable, FabricHandle, Multicast, PosixFd, Spec,
    driver::{Call, Code},
};

const ROLE: &str = "CUDA_ENDPOINTS_TEST_ROLE";
const HANDLE: &str = "CUDA_ENDPOINTS_TEST_HANDLE";
const ALIGN: u64 = 2 << 20;
/// The longest any one step may take, in the parent and in children.
const T: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- harness

/// A child process of this test, talking in lines: killed and reaped on
/// drop, whatever happened (the harness of `common/children.rs`).
struct Kid {
    child: Guard,
    stdin: Option<ChildStdin>,
    lines: Lines,
}

impl Kid {
    fn spawn(name: &'static str, role: &str, join: &Join, env: &[(&str, String)]) -> Kid {
        let mut cmd = children::test_binary("fabric::child_role");
        cmd.env(ROLE, role)
            .env(FABRIC_ENV, join.to_spec())
            .stdin(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = Guard::spawn(name, &mut cmd);
        let stdout = child.stdout.take().expect("child stdout");
        let stdin = child.stdin.take();
        Kid {
            lines: Lines::read(name, stdout),
            child,
            stdin,
        }
    }

    /// The next message that starts with `key`: its value.
    fn expect(&self, key: &str) -> String {
        self.lines.expect(key, T)
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().expect("flush to child");
    }

    /// Waits for a clean exit, at most [`T`].
    fn finish(mut self) {
        drop(self.stdin.take());
        let name = self.child.name.clone();
        match self.child.wait_until(Instant::now() + T) {
            Some(status) => assert!(status.success(), "{name} failed: {status}"),
            None => panic!("{name} did not exit"),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// What the fabric must look like once every process left cleanly.
fn assert_clean(server: &FabricServer) {
    assert!(server.wait_idle(T), "processes still connected");
    assert!(server.live().is_empty(), "fabric holds {:?}", server.live());
    assert!(server.leaks().is_empty(), "leaks: {:?}", server.leaks());
    assert!(
        server.violations().is_empty(),
        "violations: {:?}",
        server.violations()
    );
}

// ------------------------------------------------------------ child roles

/// The entry point of every child: does nothing in a normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let (ctx, me) = if role.starts_with("mem-") || role.starts_with("wire-") {
        rank::join_remote()
    } else {
        rank::join()
    };
    let mut stdin = std::io::stdin().lines().map_while(Result::ok);
    let mut wait_for = |word: &str| {
        for line in stdin.by_ref() {
            if line.trim() == word {
                return;
            }
        }
        panic!("stdin closed before `{word}`");
    };
    let say = |k: &str, v: &str| {
        println!("@@ {k} {v}");
        let _ = std::io::stdout().flush();
    };
    let handle = || {
        let bytes = unhex(&std::env::var(HANDLE).expect("handle in env"));
        FabricHandle::<Multicast<Exportable>>::from_bytes(&bytes).expect("valid handle bytes")
    };
    match role.as_str() {
        // Creates a team of 2 spread over processes, enrolls device 0,
        // exports; once told, waits ready and binds; then tears down.
        "creator" => {
            let ep = ctx
                .reserve_one()
                .unwrap()
                .create(Spec::spread(2, ALIGN).exportable())
                .unwrap()
                .add_device(0)
                .unwrap();
            say("handle", &hex(&ep.export().unwrap().to_bytes()));
            wait_for("imported");
            let ep = ep.wait(T).unwrap();
            let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
            let b = ep.bind(0, 0, &mem).unwrap();
            say("bound", "");
            wait_for("done");
            drop(b);
            drop((ep, mem));
        }
        // Imports the handle, enrolls its own device 0 (on its node) or 1
        // (same node), waits ready, binds; once told, tears down.
        "importer" => {
            let dev = if me.node() == 0 { 1 } else { 0 };
            let ep = ctx.reserve_one().unwrap().import(&handle()).unwrap();
            let ep = ep.add_device(dev).unwrap();
            say("imported", "");
            let ep = ep.wait(T).unwrap();
            let mem = Allocation::<PosixFd>::on_device(&ctx, Device(dev), ALIGN).unwrap();
            let b = ep.bind(dev, 0, &mem).unwrap();
            say("bound", "");
            wait_for("done");
            // The endpoint is still usable: unbind and bind again (the
            // creator may be gone by now).
            drop(b);
            let b = ep.bind(dev, 0, &mem).unwrap();
            drop(b);
            drop((ep, mem));
        }
        // Imports after the creator died: nothing is left to import (R12.3).
        "late-importer" => {
            let f = ctx.reserve_one().unwrap().import(&handle()).unwrap_err();
            assert!(
                matches!(f.error, Error::Driver { call: Call::Import, code } if code == Code::INVALID_VALUE),
                "{}",
                f.error
            );
            say("refused", "INVALID_VALUE");
            drop(f);
        }
        // Tries to import without an IMEX channel.
        "no-imex" => {
            assert!(!me.imex_channel());
            let f = ctx.reserve_one().unwrap().import(&handle()).unwrap_err();
            assert!(
                matches!(f.error, Error::Driver { call: Call::Import, code } if code == Code::NOT_PERMITTED),
                "{}",
                f.error
            );
            say("refused", "NOT_PERMITTED");
            drop(f);
        }
        // Exports device memory as a POSIX descriptor and as a fabric handle.
        "mem-exporter" => {
            let me = me.process().expect("the fabric's client");
            let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
            let fd = me
                .export_shareable(mem.handle(), ShareableKind::PosixFd)
                .unwrap();
            say("fd", &fd.to_string());
            // A real descriptor too; another process opens it through /proc
            // (as it would receive it with SCM_RIGHTS).
            let real = me.export_fd(mem.handle()).unwrap();
            let path = format!("/proc/{}/fd/{}", std::process::id(), real.as_raw_fd());
            say("fdpath", &path);
            let fab =
                Allocation::<cuda_endpoints::FabricShareable>::on_device(&ctx, Device(0), ALIGN)
                    .unwrap();
            let token = me
                .export_shareable(fab.handle(), ShareableKind::Fabric)
                .unwrap();
            say("fabric", &token.to_string());
            wait_for("done");
            drop((real, mem, fab));
        }
        // Imports both kinds: a descriptor only works on the same node.
        "mem-importer" => {
            let me = me.process().expect("the fabric's client");
            let fd: u64 = std::env::var("FD").unwrap().parse().unwrap();
            let token: u64 = std::env::var("TOKEN").unwrap().parse().unwrap();
            let file = std::fs::File::open(std::env::var("FDPATH").unwrap()).unwrap();
            let r = me.import_shareable(fd, ShareableKind::PosixFd);
            let real = me.import_fd(file.as_fd());
            if me.node() == 0 {
                release(&ctx, r.expect("a POSIX descriptor within a node"));
                release(&ctx, real.expect("a real descriptor within a node"));
            } else {
                for r in [r, real] {
                    assert!(
                        matches!(r, Err(fabric::FabricError::Driver { code, .. }) if code == Code::INVALID_VALUE),
                        "{r:?}"
                    );
                }
            }
            // Any other file is not a descriptor of the fabric.
            let other = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
            assert!(matches!(
                me.import_fd(other.as_fd()),
                Err(fabric::FabricError::Descriptor(_))
            ));
            let h = me
                .import_shareable(token, ShareableKind::Fabric)
                .expect("a fabric handle on any node");
            release(&ctx, h);
            say("checked", "");
        }
        // Run by the launcher: rank R of nodes of G GPUs runs on node R / G
        // and uses device R % G.
        "rank" => {
            let rank: u32 = std::env::var("CUDA_ENDPOINTS_RANK")
                .unwrap()
                .parse()
                .unwrap();
            let gpus: u32 = std::env::var("GPUS").unwrap().parse().unwrap();
            let dev = Device((rank % gpus) as i32);
            assert_eq!((me.node(), me.device()), (rank / gpus, Some(dev)));
            let ep = ctx
                .reserve_one()
                .unwrap()
                .create(Spec::unicast(dev, ALIGN))
                .unwrap()
                .wait(T)
                .unwrap();
            let mem = Allocation::<PosixFd>::on_device(&ctx, dev, ALIGN).unwrap();
            drop(ep.bind(dev, 0, &mem).unwrap());
            drop((ep, mem));
        }
        // F8 and events: a graph of a put and a get, launched twice, and
        // copies completed through events (`f8_graphs_and_events_...`).
        "graph" => {
            use cuda_endpoints::{CopyBatch, Mapped, Private, Stream};
            let owner: Mapped<Private> = Allocation::on_device(&ctx, 0, ALIGN)
                .unwrap()
                .map(&[0])
                .unwrap();
            let ep = common::ready_unicast(&ctx, 0, ALIGN, T);
            let b = ep.bind(0, 0, &owner).unwrap();
            let stream = Stream::new(&ctx, 0).unwrap();
            {
                let mut graph = stream
                    .capture(
                        CopyBatch::new()
                            .put_host(vec![8; 64], b.copy_through(&ep).unwrap(), 0)
                            .get_host(&ep, 4096, 64),
                    )
                    .unwrap();
                graph.launch().unwrap().wait().unwrap();
                let t = stream
                    .enqueue(CopyBatch::new().put_host(vec![3; 64], &ep, 4096))
                    .unwrap()
                    .with_event()
                    .unwrap();
                t.wait().unwrap();
                graph.launch().unwrap().wait().unwrap();
                assert_eq!(graph.received().unwrap(), vec![&[3u8; 64][..]]);
            }
            let got = stream
                .enqueue(CopyBatch::new().get_host(&ep, 0, 64))
                .unwrap()
                .with_event()
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(got.received, vec![vec![8; 64]]);
            drop(stream);
            b.unbind().unwrap();
            ep.destroy().unwrap().release().unwrap();
            assert!(ctx.take_teardown_errors().is_empty());
        }
        // A batch larger than the fabric carries, then work as usual on
        // the same connection (`a_batch_larger_than_..._keeps_its_connection`).
        "wire-oversized" => {
            use cuda_endpoints::{CopyBatch, Private, Stream};
            let size = 8 << 20;
            let ep = common::ready_unicast(&ctx, 0, size, T);
            let owner = common::mapped::<Private>(&ctx, 0, size);
            let src = common::mapped::<Private>(&ctx, 0, size);
            let b = ep.bind(0, 0, &owner).unwrap();
            let stream = Stream::new(&ctx, 0).unwrap();
            let puts = |n: u64| {
                (0..n).fold(CopyBatch::new(), |batch, i| {
                    batch.put(&src, i * 64, &ep, i * 64, 64)
                })
            };
            // The attack's batch: 100,000 ops, a request of about 2 MB.
            let e = stream.enqueue(puts(100_000)).unwrap_err();
            assert!(
                matches!(e, Error::Driver { call: Call::FabricCpyBatchAsync, code } if code == Code::INVALID_VALUE),
                "{e}"
            );
            let max = fabric::wire::MAX_BATCH_OPS;
            let text = e.to_string();
            assert!(
                text.contains("split the batch") && text.contains(&max.to_string()),
                "{text}"
            );
            say("refused", &text);
            // The connection stays: the process carries on, the largest
            // batch the fabric takes included.
            drop(ctx.reserve_one().unwrap());
            stream.enqueue(puts(max as u64)).unwrap().wait().unwrap();
            let back = stream
                .enqueue(CopyBatch::new().get_host(&ep, 0, 64))
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(back.received.len(), 1);
            drop(stream);
            b.unbind().unwrap();
            ep.destroy().unwrap().release().unwrap();
            drop((owner, src));
            assert!(ctx.take_teardown_errors().is_empty());
        }
        // Host-destination bytes within the per-stream bound, over many
        // ops, come back whole; what cannot come back is refused before the
        // driver runs it, and the process carries on (`..._returns_every_byte`).
        "wire-reply" => {
            use cuda_endpoints::{CopyBatch, Private, Stream};
            let size = 4 << 20;
            let ep = common::ready_unicast(&ctx, 0, size, T);
            let owner = common::mapped::<Private>(&ctx, 0, size);
            let b = ep.bind(0, 0, &owner).unwrap();
            let stream = Stream::new(&ctx, 0).unwrap();
            // The attack's batch: 2,000 ops of 523 bytes (1,046,000 in all).
            let (ops, each) = (2000u64, 523u64);
            let pattern: Vec<u8> = (0..ops * each).map(|i| (i % 251) as u8).collect();
            stream
                .enqueue(CopyBatch::new().put_host(pattern.clone(), &ep, 0))
                .unwrap()
                .wait()
                .unwrap();
            let gets = |n: u64| {
                (0..n).fold(CopyBatch::new(), |batch, i| {
                    batch.get_host(&ep, i * each, each)
                })
            };
            let got = stream.enqueue(gets(ops)).unwrap().wait().unwrap();
            assert_eq!(got.received.concat(), pattern);
            // One batch whose bytes could never come back in one reply:
            // refused before it is sent.
            let e = stream
                .enqueue(CopyBatch::new().get_host(&ep, 0, 2 << 20))
                .unwrap_err();
            assert!(
                matches!(e, Error::Driver { call: Call::FabricCpyBatchAsync, code } if code == Code::INVALID_VALUE),
                "{e}"
            );
            assert!(e.to_string().contains("split the batch"), "{e}");
            // In flight on top of a batch not waited yet: refused until a
            // synchronize hands the first one's bytes back.
            let first = stream.enqueue(gets(ops)).unwrap();
            let e = stream.enqueue(gets(ops)).unwrap_err();
            assert!(
                matches!(e, Error::Driver { call: Call::FabricCpyBatchAsync, code } if code == Code::OUT_OF_MEMORY),
                "{e}"
            );
            assert!(e.to_string().contains("synchronize the stream"), "{e}");
            assert_eq!(first.wait().unwrap().received.concat(), pattern);
            let again = stream.enqueue(gets(ops)).unwrap().wait().unwrap();
            assert_eq!(again.received.concat(), pattern);
            say("returned", "");
            drop(stream);
            b.unbind().unwrap();
            ep.destroy().unwrap().release().unwrap();
            drop(owner);
            assert!(ctx.take_teardown_errors().is_empty());
        }
        // Exits holding two ids.
        "leaker" => {
            std::mem::forget(ctx.reserve(2).unwrap());
            say("leaked", "");
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
    assert_eq!(me.live(), Live::default(), "{role} leaked");
    let own = me.own_violations();
    assert!(own.is_empty(), "{role}: the double saw {own:?}");
    say("clean", "");
}

/// Releases a raw handle this process imported (no typed owner holds it).
fn release(ctx: &Context, handle: u64) {
    // SAFETY: `handle` was imported by this process through the fabric's
    // shareable-handle request; no typed object of this crate owns it and
    // nothing is bound to or mapped from it.
    let r = unsafe { ctx.driver_arc().mem_release(handle) };
    assert_eq!(r, Ok(()));
}

/// A creator (joining by `creator`) exports an endpoint that an importer
/// (joining by `importer`) imports; both have bound memory to it.
fn creator_and_importer_bound(creator: &Join, importer: &Join) -> (Kid, Kid) {
    let mut a = Kid::spawn("creator", "creator", creator, &[]);
    let handle = a.expect("handle");
    let b = Kid::spawn("importer", "importer", importer, &[(HANDLE, handle)]);
    b.expect("imported");
    a.tell("imported");
    a.expect("bound");
    b.expect("bound");
    (a, b)
}

/// Both end: told, each reports itself clean and exits.
fn both_done(mut a: Kid, mut b: Kid) {
    a.tell("done");
    b.tell("done");
    a.expect("clean");
    b.expect("clean");
    a.finish();
    b.finish();
}

// ------------------------------------------------------------------ tests

#[test]
fn r9_an_endpoint_exported_by_one_os_process_is_imported_by_another() {
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let join = server.join();
    let (a, b) = creator_and_importer_bound(&join, &join);
    both_done(a, b);
    assert_eq!(server.joined(), 2);
    assert_clean(&server);
}

#[test]
fn r12_2_a_killed_process_is_cleaned_up_and_the_others_carry_on() {
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let join = server.join();
    let (mut a, mut b) = creator_and_importer_bound(&join, &join);
    // SIGKILL while holding an id, an endpoint reference, memory and a binding.
    a.kill();
    assert!(server.wait_exits(1, T));
    let exit = &server.exits()[0];
    let held = exit.held;
    assert!(
        held.ids == 1 && held.endpoints == 1 && held.bindings == 1 && held.allocations == 1,
        "{exit:?}"
    );
    // R12.3: the importer's reference keeps the endpoint alive.
    let live = server.live();
    assert_eq!((live.endpoint_objects, live.processes), (1, 1), "{live:?}");
    assert_eq!(live.held.bindings, 1);
    b.tell("done");
    b.expect("clean");
    b.finish();
    assert!(server.wait_idle(T));
    assert!(server.live().is_empty(), "{:?}", server.live());
    assert_eq!(server.leaks().len(), 1, "only the killed process leaked");
    assert!(server.violations().is_empty(), "{:?}", server.violations());
}

#[test]
fn r12_4_fabric_handles_cross_nodes() {
    // Two nodes of one GPU each: the team is one device per node.
    let server = FabricServer::start(FabricConfig::nodes(2, 1)).unwrap();
    let (a, b) = creator_and_importer_bound(&server.join().node(0), &server.join().node(1));
    both_done(a, b);
    assert_clean(&server);
}

#[test]
fn r12_4_posix_descriptors_stay_on_their_node_fabric_handles_do_not() {
    let server = FabricServer::start(FabricConfig::nodes(2, 1)).unwrap();
    let mut a = Kid::spawn("exporter", "mem-exporter", &server.join().node(0), &[]);
    let fd = a.expect("fd");
    let fdpath = a.expect("fdpath");
    let token = a.expect("fabric");
    for node in [0, 1] {
        let env = [
            ("FD", fd.clone()),
            ("FDPATH", fdpath.clone()),
            ("TOKEN", token.clone()),
        ];
        let c = Kid::spawn("importer", "mem-importer", &server.join().node(node), &env);
        c.expect("checked");
        c.expect("clean");
        c.finish();
    }
    a.tell("done");
    a.expect("clean");
    a.finish();
    assert_clean(&server);
}

#[test]
fn r12_3_a_creator_killed_before_anyone_imported_leaves_nothing_to_import() {
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let mut a = Kid::spawn("creator", "creator", &server.join(), &[]);
    let handle = a.expect("handle");
    a.kill();
    assert!(server.wait_exits(1, T));
    assert!(server.live().is_empty(), "{:?}", server.live());
    let b = Kid::spawn("late", "late-importer", &server.join(), &[(HANDLE, handle)]);
    b.expect("refused");
    b.expect("clean");
    b.finish();
    assert!(server.wait_idle(T));
    // Not a rule the importer broke: only the driver knew (R12.5).
    assert!(server.violations().is_empty(), "{:?}", server.violations());
}

#[test]
fn r9_1_import_without_an_imex_channel_is_not_permitted() {
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let mut a = Kid::spawn("creator", "creator", &server.join(), &[]);
    let handle = a.expect("handle");
    let c = Kid::spawn(
        "no-imex",
        "no-imex",
        &server.join().imex_channel(false),
        &[(HANDLE, handle)],
    );
    c.expect("refused");
    c.expect("clean");
    c.finish();
    // The creator's team never completes; it tears down pending.
    a.kill();
    assert!(server.wait_idle(T));
    assert!(server.live().is_empty(), "{:?}", server.live());
    assert!(server.violations().is_empty(), "{:?}", server.violations());
}

#[test]
fn r12_5_driver_only_refusals_are_not_violations() {
    // In one OS process: two fabric processes fill a team of 2, a third
    // cannot know and is refused by the driver, not logged as a violation.
    let server = FabricServer::start(FabricConfig::nodes(1, 3)).unwrap();
    let (c0, _p0) = fabric::connect(&server.join()).unwrap();
    let (c1, _p1) = fabric::connect(&server.join()).unwrap();
    let (c2, _p2) = fabric::connect(&server.join()).unwrap();
    let ep = c0
        .reserve_one()
        .unwrap()
        .create(Spec::spread(2, ALIGN).exportable())
        .unwrap()
        .add_device(0)
        .unwrap();
    let h = ep.export().unwrap();
    let h = FabricHandle::<Multicast<Exportable>>::from_bytes(&h.to_bytes()).unwrap();
    let i1 = c1
        .reserve_one()
        .unwrap()
        .import(&h)
        .unwrap()
        .add_device(1)
        .unwrap();
    let i2 = c2.reserve_one().unwrap().import(&h).unwrap();
    let f = i2.add_device(2).unwrap_err();
    assert!(
        matches!(f.error, Error::Driver { call: Call::AddDevice, code } if code == Code::INVALID_VALUE),
        "{}",
        f.error
    );
    drop((f, i1, ep));
    // The creator's reference is gone (R12.3): a late import is refused.
    let late = c2.reserve_one().unwrap().import(&h).unwrap_err();
    assert!(
        matches!(late.error, Error::Driver { call: Call::Import, code } if code == Code::INVALID_VALUE),
        "{}",
        late.error
    );
    drop(late);
    drop((c0, c1, c2, _p0, _p1, _p2));
    assert_clean(&server);
}

#[test]
fn hostile_peer_bytes_end_one_connection_not_the_fabric() {
    use std::os::unix::net::UnixStream;
    let server = FabricServer::start(FabricConfig::default()).unwrap();
    let frames: [&[u8]; 4] = [
        &u32::MAX.to_le_bytes(),         // a frame far past the bound
        &[3, 0, 0, 0, 0xff, 0xff, 0xff], // undecodable
        &[1, 0, 0, 0, 2],                // a request other than Hello first
        &[200, 0, 0, 0, 1, 2],           // cut short
    ];
    for bytes in frames {
        let mut s = UnixStream::connect(server.socket()).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut sink);
    }
    let (ctx, me) = fabric::connect(&server.join()).unwrap();
    assert_eq!(ctx.device_count().unwrap(), 4);
    assert!(me.live().unwrap().is_empty());
    drop((ctx, me));
    // Unknown nodes are refused with words.
    let e = fabric::connect(&server.join().node(7)).unwrap_err();
    assert!(matches!(e, fabric::FabricError::Refused { .. }), "{e}");
    assert_clean(&server);
}

#[test]
fn every_fabric_has_its_own_socket_and_leaves_none_behind() {
    let a = FabricServer::start(FabricConfig::default()).unwrap();
    let b = FabricServer::start(FabricConfig::default()).unwrap();
    assert_ne!(a.socket(), b.socket());
    let (path, dir) = (
        a.socket().to_path_buf(),
        a.socket().parent().unwrap().to_path_buf(),
    );
    assert!(path.exists());
    // A process still connected when the fabric goes is cleaned up, and its
    // driver answers DEINITIALIZED from then on.
    let (ctx, _me) = fabric::connect(&a.join()).unwrap();
    let ep = ctx.reserve_one().unwrap();
    drop(a);
    assert!(!path.exists() && !dir.exists());
    let e = ctx.reserve_one().unwrap_err();
    assert!(e.to_string().contains("DEINITIALIZED"), "{e}");
    drop(ep);
    drop(b);
}

/// Runs the launcher with `args`, bounded by [`T`]; its exit code.
fn launch(args: &[&str], env: &[(&str, &str)]) -> Option<i32> {
    let launcher = env!("CARGO_BIN_EXE_cuda-endpoints-fabric");
    let mut cmd = Command::new(launcher);
    cmd.args(args)
        .env_remove(FABRIC_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut launcher = Guard::spawn("launcher", &mut cmd);
    let status = launcher.wait_until(Instant::now() + T);
    status.expect("the launcher did not finish").code()
}

const CHILD_ARGS: [&str; 4] = [
    "fabric::child_role",
    "--exact",
    "--nocapture",
    "--test-threads=1",
];

#[test]
fn the_launcher_runs_a_job_and_fails_it_when_a_process_leaks() {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let args = |more: &[&'static str]| {
        let mut a = vec!["--nodes", "2", "--gpus", "2", "--timeout", "60", "--", exe];
        a.extend_from_slice(more);
        a
    };
    let env = [(ROLE, "rank"), ("CUDA_ENDPOINTS_RANK", "3"), ("GPUS", "2")];
    assert_eq!(launch(&args(&CHILD_ARGS), &env), Some(0));
    let env = [(ROLE, "leaker")];
    assert_eq!(
        launch(&args(&CHILD_ARGS), &env),
        Some(3),
        "a leak fails the job"
    );
    let env = [(ROLE, "no-such-role")];
    assert_eq!(
        launch(&args(&CHILD_ARGS), &env),
        Some(101),
        "the command's failure"
    );
}

#[test]
fn the_launcher_places_eight_ranks_on_two_nodes_of_four() {
    // As `mpirun -n 8` would: eight processes, each told its rank.
    let script = r#"pids=""
for r in 0 1 2 3 4 5 6 7; do
  CUDA_ENDPOINTS_RANK=$r "$0" "$@" & pids="$pids $!"
done
fail=0
for p in $pids; do wait $p || fail=1; done
exit $fail"#;
    let exe = std::env::current_exe().unwrap();
    let mut args = vec!["--nodes", "2", "--gpus", "4", "--", "sh", "-c", script];
    args.push(exe.to_str().unwrap());
    args.extend_from_slice(&CHILD_ARGS);
    assert_eq!(launch(&args, &[(ROLE, "rank"), ("GPUS", "4")]), Some(0));
}

mod hostile {
    use std::os::unix::net::UnixStream;

    use cuda_endpoints::fabric::wire::{self, PROTOCOL, Reply, Request};
    use proptest::prelude::*;

    use super::*;

    fn joined(server: &FabricServer) -> UnixStream {
        let s = UnixStream::connect(server.socket()).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut w = &s;
        let hello = Request::Hello {
            protocol: PROTOCOL,
            node: None,
            rank: None,
            imex_channel: None,
            os_pid: 0,
        };
        wire::send(&mut w, &hello).unwrap();
        assert!(matches!(wire::recv::<Reply>(&mut w), Ok(Reply::Welcome(_))));
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// Arbitrary payloads after a valid hello — arbitrary driver calls
        /// with arbitrary arguments among them — get an answer or end the
        /// connection; the fabric stays up, consistent, and cleans up.
        #[test]
        fn arbitrary_requests_never_hurt_the_fabric(
            frames in proptest::collection::vec(
                (proptest::option::of(0u8..40), proptest::collection::vec(any::<u8>(), 0..64)),
                1..8,
            ),
        ) {
            let server = FabricServer::start(FabricConfig::nodes(2, 2)).unwrap();
            let s = joined(&server);
            let mut w = &s;
            for (call, bytes) in &frames {
                // Mostly driver calls (`Request::Call`, then a call of the
                // table) with arbitrary arguments; else any bytes.
                let mut payload = call.map_or_else(Vec::new, |c| vec![1, c]);
                payload.extend_from_slice(bytes);
                let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(&payload);
                if w.write_all(&frame).is_err() {
                    break;
                }
                if wire::recv::<Reply>(&mut w).is_err() {
                    break;
                }
            }
            drop(s);
            let (ctx, me) = fabric::connect(&server.join()).unwrap();
            prop_assert_eq!(ctx.device_count().unwrap(), 2);
            drop((ctx, me));
            prop_assert!(server.wait_idle(T));
            prop_assert!(server.live().is_empty(), "{:?}", server.live());
        }
    }
}

#[test]
fn the_classic_fallback_runs_over_the_fabric() {
    use cuda_endpoints::driver::Classic;
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let (_ctx, me) = fabric::connect(&server.join()).unwrap();
    let ctx = Context::new(Classic::new(me.remote()));
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN))
        .unwrap()
        .wait(T)
        .unwrap();
    assert_eq!(me.live().unwrap().multicast_objects, 1);
    let mem = Allocation::<PosixFd>::on_device(&ctx, Device(1), ALIGN).unwrap();
    drop(team.bind(1, 0, &mem).unwrap());
    drop((team, mem, ctx, _ctx, me));
    assert_clean(&server);
}

/// A timeout too large for `Instant` (`Duration::MAX`) is no deadline, not a
/// panic: the waits of the server return as soon as their condition holds.
#[test]
fn the_server_waits_take_any_timeout_duration_max_included() {
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    assert!(server.wait_idle(Duration::MAX));
    assert!(server.wait_exits(0, Duration::MAX));
    assert!(!server.wait_exits(1, Duration::ZERO));
    assert_clean(&server);
}

/// F8 and events across the fabric wire: a process joined to a fabric (the
/// model in another place, host bytes in the messages; under
/// `ci/double.sh` the real backend on the double, which joined the fabric)
/// captures a put and a get into a graph, launches it twice, and completes
/// a copy through an event; the host bytes of the get come back at the
/// launch's wait and at the event's synchronize (role `graph`).
#[test]
fn f8_graphs_and_events_cross_the_fabric_wire() {
    let mut node = cuda_endpoints::model::ModelConfig::node(1);
    node.driver_version = 13050;
    let server = FabricServer::start(FabricConfig::single(node)).unwrap();
    let kid = Kid::spawn("graph", "graph", &server.join(), &[]);
    kid.expect("clean");
    kid.finish();
    assert_clean(&server);
}

/// A legal batch larger than one request frame (the attack's 100,000 ops)
/// used to close the process's connection for good: every later call was
/// `DEINITIALIZED` and its memory was reclaimed only at exit. Now the
/// client refuses it before sending (`INVALID_VALUE`, an error saying to
/// split the batch), and the same process carries on and cleans up (role
/// `wire-oversized`).
#[test]
fn a_batch_larger_than_the_fabric_carries_is_refused_before_sending_and_the_process_keeps_its_connection()
 {
    let mut node = cuda_endpoints::model::ModelConfig::node(1);
    node.driver_version = 13050;
    let server = FabricServer::start(FabricConfig::single(node)).unwrap();
    let kid = Kid::spawn("oversized", "wire-oversized", &server.join(), &[]);
    kid.expect("refused");
    kid.expect("clean");
    kid.finish();
    assert_clean(&server);
    assert_eq!(server.joined(), 1, "one connection all along");
}

/// 2,000 host-destination ops of 523 bytes (within the per-stream bound)
/// used to fail at the synchronize (`UNKNOWN`): the reply carrying their
/// bytes was larger than a frame. The bound now counts each write's
/// address and length, so an accepted batch returns every byte; what
/// cannot come back is refused at enqueue (role `wire-reply`).
#[test]
fn host_destination_bytes_the_fabric_accepts_in_one_batch_return_every_byte() {
    let mut node = cuda_endpoints::model::ModelConfig::node(1);
    node.driver_version = 13050;
    let server = FabricServer::start(FabricConfig::single(node)).unwrap();
    let kid = Kid::spawn("reply", "wire-reply", &server.join(), &[]);
    kid.expect("returned");
    kid.expect("clean");
    kid.finish();
    assert_clean(&server);
}

//! Hostile neighbours on one model fabric (issue 21): one fabric client
//! attacking another — a process of this test binary, started as a child,
//! is the victim; the test process itself is the attacker (it joins the
//! same fabric as any process can). Every wait is bounded, every child
//! killed and reaped on every path, every fabric removes its socket.
#![cfg(feature = "fabric")]

use crate::children;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use children::{Guard, Lines};

use cuda_endpoints::driver::{AllocationRequest, ShareableHandle};
use cuda_endpoints::fabric::{self, FABRIC_ENV, FabricServer};
use cuda_endpoints::model::{
    FabricConfig, ShareableKind,
    faults::{Fault, FaultPlan},
};
use cuda_endpoints::{
    Allocation, Device, Location, PosixFd,
    driver::{Code, Driver},
};

const ROLE: &str = "CUDA_ENDPOINTS_TEST_ROLE";
const SOCKET: &str = "CUDA_ENDPOINTS_TEST_SOCKET";
const ALIGN: u64 = 2 << 20;
/// The longest any one step may take, in the parent and in children.
const T: Duration = Duration::from_secs(20);

/// A child of this test, talking in `@@ key value` lines, told what to do
/// on stdin; killed and reaped on drop.
struct Kid {
    _child: Guard,
    stdin: ChildStdin,
    lines: Lines,
}

impl Kid {
    fn spawn(name: &str, role: &str, cmd: Option<Command>, env: &[(&str, String)]) -> Kid {
        let mut cmd = cmd.unwrap_or_else(|| children::test_binary("fabric_hostile::child_role"));
        cmd.env(ROLE, role)
            .stdin(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = Guard::spawn(name, &mut cmd);
        let stdout = child.stdout.take().expect("child stdout");
        let stdin = child.stdin.take().expect("child stdin");
        Kid {
            lines: Lines::read(name, stdout),
            _child: child,
            stdin,
        }
    }

    fn victim(server: &FabricServer) -> Kid {
        Kid::spawn(
            "victim",
            "victim",
            None,
            &[(FABRIC_ENV, server.join().timeout(T).to_spec())],
        )
    }

    fn expect(&self, key: &str) -> String {
        self.lines.expect(key, T)
    }

    fn ask(&mut self, what: &str) -> String {
        writeln!(self.stdin, "{what}").expect("write to child");
        self.expect(what)
    }
}

fn say(k: &str, v: &str) {
    println!("@@ {k} {v}");
    let _ = std::io::stdout().flush();
}

// ------------------------------------------------------------ child roles

/// The entry point of every child: does nothing in a normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        // Joins, holds exported memory, then answers what it is asked.
        "victim" => {
            let (ctx, me) = fabric::connect_env()
                .expect("fabric")
                .expect("CUDA_ENDPOINTS_FABRIC is set");
            let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
            me.export_shareable(mem.handle(), ShareableKind::PosixFd)
                .unwrap();
            let fab =
                Allocation::<cuda_endpoints::FabricShareable>::on_device(&ctx, Device(0), ALIGN)
                    .unwrap();
            me.export_shareable(fab.handle(), ShareableKind::Fabric)
                .unwrap();
            say("ready", "");
            for line in std::io::stdin().lines().map_while(Result::ok) {
                match line.trim() {
                    // SAFETY: a query of this process's driver.
                    "calls" => say(
                        "calls",
                        &format!("{:?}", unsafe { me.remote().device_count() }),
                    ),
                    "violations" => say("violations", &format!("{:?}", me.violations().is_ok())),
                    "live" => say(
                        "live",
                        &me.live()
                            .map_or_else(|e| e.to_string(), |l| l.allocations.to_string()),
                    ),
                    _ => break,
                }
            }
            drop((mem, fab));
        }
        // Opens eight connections and says its hello one byte at a time,
        // a byte every 200 ms, until the fabric has closed every one.
        "trickler" => {
            let socket = std::env::var(SOCKET).unwrap();
            let mut conns: Vec<UnixStream> = (0..8)
                .map(|_| UnixStream::connect(&socket).unwrap())
                .collect();
            for c in &mut conns {
                // A valid start: a frame of 1,000 bytes, then a byte every
                // 200 ms, so that no single read ever waits long (only a
                // deadline for the whole hello cuts it; garbage alone
                // would be refused by its decoding).
                // On a busy machine the fabric may have cut it already (the
                // hello deadline is 1 s): the loop below counts it as cut.
                let _ = c.write_all(&1000u32.to_le_bytes());
                c.set_nonblocking(true).unwrap();
            }
            say("open", "");
            let deadline = Instant::now() + T;
            let mut cut = 0;
            while !conns.is_empty() && Instant::now() < deadline {
                conns.retain_mut(|c| {
                    let mut b = [0u8; 64];
                    let closed = matches!(c.read(&mut b), Ok(0))
                        || matches!(c.write(&[0]), Err(e) if e.kind() != std::io::ErrorKind::WouldBlock);
                    cut += usize::from(closed);
                    !closed
                });
                std::thread::sleep(Duration::from_millis(200));
            }
            say("cut", &cut.to_string());
        }
        // Under umask 000: starts a fabric and says the modes of its
        // directory and socket.
        "modes" => {
            let server = FabricServer::start(FabricConfig::nodes(1, 1)).unwrap();
            let mode = |p: &std::path::Path| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(p).unwrap().permissions().mode() & 0o777
            };
            let dir = server.socket().parent().unwrap().to_path_buf();
            let modes = format!("{:o} {:o}", mode(&dir), mode(server.socket()));
            // Gone before the parent hears: nothing is left behind.
            drop(server);
            assert!(!dir.exists());
            say("modes", &modes);
        }
        other => panic!("unknown role {other}"),
    }
}

/// A raw connection that has said hello: what a hostile client speaks.
fn raw_client(server: &FabricServer) -> UnixStream {
    use fabric::wire::{self, PROTOCOL, Reply, Request};
    let stream = UnixStream::connect(server.socket()).unwrap();
    stream.set_read_timeout(Some(T)).unwrap();
    let mut s = &stream;
    let hello = Request::Hello {
        protocol: PROTOCOL,
        node: None,
        rank: None,
        imex_channel: None,
        os_pid: std::process::id(),
    };
    wire::send(&mut s, &hello).unwrap();
    assert!(matches!(wire::recv::<Reply>(&mut s), Ok(Reply::Welcome(_))));
    stream
}

// ------------------------------------------------------------------ tests

/// Item 1: a fault plan whose counters are at their end, sent by one
/// client, neither crashes the server thread of another client's next call
/// nor keeps that client's process from exiting and being cleaned up.
#[test]
fn a_fault_plan_with_counters_at_their_end_fails_the_next_call_of_another_process_with_its_code() {
    let _serial = children::serial();
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let mut victim = Kid::victim(&server);
    victim.expect("ready");
    // The attacker's plan: any call fails, with the plan's own count of
    // fired faults at u64::MAX (postcard: a varint of ten bytes).
    let plan = FaultPlan::none().with(Fault::nth_any(1, Code::NOT_INITIALIZED).times(u64::MAX));
    let mut bytes = postcard::to_stdvec(&fabric::wire::Request::SetFaults(plan)).unwrap();
    // The plan ends with `fired`, `per_call` and `history`, all zero.
    assert_eq!(bytes.split_off(bytes.len() - 3), [0, 0, 0]);
    bytes.extend_from_slice(&[0xff; 9]);
    bytes.extend_from_slice(&[0x01, 0, 0]);
    let attacker = raw_client(&server);
    let mut frame = u32::try_from(bytes.len()).unwrap().to_le_bytes().to_vec();
    frame.extend_from_slice(&bytes);
    (&attacker).write_all(&frame).unwrap();
    let reply = fabric::wire::recv::<fabric::wire::Reply>(&mut &attacker);
    assert!(
        matches!(reply, Ok(fabric::wire::Reply::Done(Ok(())))),
        "{reply:?}"
    );
    // The victim's next call fails with the planned code, not a lost fabric.
    let calls = victim.ask("calls");
    assert!(calls.contains("NOT_INITIALIZED"), "{calls}");
    assert_eq!(victim.ask("live"), "2");
    drop(attacker);
    writeln!(victim.stdin, "done").unwrap();
    assert!(
        server.wait_idle(T),
        "the victim's process never exited on the fabric"
    );
    assert!(server.live().is_empty(), "{:?}", server.live());
}

/// Item 2: forty thousand violations by one client (a log larger than a
/// frame before it was bounded) leave another's read-only `violations()`
/// answered, its connection and its memory alive.
#[test]
fn forty_thousand_violations_by_one_process_leave_another_its_violations_and_its_memory() {
    let _serial = children::serial();
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let mut victim = Kid::victim(&server);
    victim.expect("ready");
    let attacker = fabric::open(&server.join().timeout(T)).unwrap();
    let remote = attacker.remote();
    for h in 0..40_000u64 {
        // SAFETY: releasing a handle that is no allocation of this
        // process: a violation the model logs, nothing else.
        let r = unsafe { remote.mem_release(0xdead_0000 + h) };
        assert!(r.is_err());
    }
    assert_eq!(victim.ask("violations"), "true");
    assert_eq!(victim.ask("live"), "2", "the victim's memory was freed");
    let (kept, dropped) = attacker.violation_log().unwrap();
    assert_eq!(kept.len() as u64 + dropped, 40_000);
    assert_eq!(kept.len(), cuda_endpoints::model::MAX_VIOLATIONS);
    writeln!(victim.stdin, "done").unwrap();
    drop((remote, attacker));
    assert!(server.wait_idle(T));
    assert!(server.live().is_empty(), "{:?}", server.live());
}

/// Item 3: a process that was not handed a shareable handle cannot import
/// it by guessing its token next to its own, and handle strings of another
/// fabric are refused.
#[test]
fn shareable_tokens_cannot_be_guessed_and_strings_of_another_fabric_are_refused() {
    let _serial = children::serial();
    let server = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let mut victim = Kid::victim(&server);
    victim.expect("ready");
    let (ctx, me) = fabric::connect(&server.join().timeout(T)).unwrap();
    let mem = Allocation::<PosixFd>::on_device(&ctx, Device(0), ALIGN).unwrap();
    let fab =
        Allocation::<cuda_endpoints::FabricShareable>::on_device(&ctx, Device(0), ALIGN).unwrap();
    for (handle, kind) in [
        (mem.handle(), ShareableKind::PosixFd),
        (fab.handle(), ShareableKind::Fabric),
    ] {
        let mine = me.export_shareable(handle, kind).unwrap();
        for k in 1..=64u64 {
            for guess in [mine.wrapping_sub(k), mine.wrapping_add(k), k] {
                let r = me.import_shareable(guess, kind);
                assert!(
                    matches!(r, Err(fabric::FabricError::Driver { code, .. }) if code == Code::INVALID_VALUE),
                    "{kind:?} token {guess} next to {mine}: {r:?}"
                );
            }
        }
    }
    assert_eq!(victim.ask("live"), "2");
    // Bytes of another fabric: refused, not taken for this one's.
    let other = FabricServer::start(FabricConfig::nodes(1, 2)).unwrap();
    let (octx, ome) = fabric::connect(&other.join().timeout(T)).unwrap();
    let ofab =
        Allocation::<cuda_endpoints::FabricShareable>::on_device(&octx, Device(0), ALIGN).unwrap();
    // SAFETY: exporting a live allocation of this process.
    let foreign = unsafe {
        ome.remote()
            .mem_export(ofab.handle(), ShareableKind::Fabric)
    }
    .unwrap();
    // SAFETY: importing fabric bytes (no descriptor involved).
    let r = unsafe { me.remote().mem_import(foreign) };
    assert_eq!(r, Err(Code::INVALID_VALUE));
    assert!(matches!(foreign, ShareableHandle::Fabric(_)));
    drop((ofab, octx, ome, mem, fab, ctx, me));
    writeln!(victim.stdin, "done").unwrap();
    assert!(server.wait_idle(T) && other.wait_idle(T));
    assert!(server.live().is_empty() && other.live().is_empty());
}

/// Item 6: a hello trickled a byte at a time is cut at the hello's
/// deadline, and connections stalled in hello never keep an honest process
/// from joining.
#[test]
fn slow_hellos_are_cut_at_the_deadline_and_never_keep_an_honest_process_out() {
    let _serial = children::serial();
    let config = FabricConfig::nodes(1, 1)
        .hello_timeout(Duration::from_secs(1))
        .max_in_hello(4);
    let server = FabricServer::start(config).unwrap();
    let socket = server.socket().display().to_string();
    let trickler = Kid::spawn("trickler", "trickler", None, &[(SOCKET, socket)]);
    trickler.expect("open");
    // Four of the eight stalled hellos made room; an honest one joins.
    let honest = fabric::open(&server.join().timeout(T));
    assert!(honest.is_ok(), "{honest:?}");
    drop(honest);
    assert_eq!(
        trickler.expect("cut"),
        "8",
        "stalled hellos outlived the deadline"
    );
    assert!(server.hellos_cut() >= 8);
    assert!(server.wait_idle(T));
}

/// Item 7: host-NUMA memory counts against the node's host memory, and a
/// one-byte write backs one chunk, not the allocation.
#[test]
fn host_memory_is_limited_and_a_one_byte_write_backs_one_chunk() {
    let _serial = children::serial();
    let server = FabricServer::start(FabricConfig::nodes(1, 1)).unwrap();
    let me = fabric::open(&server.join().timeout(T)).unwrap();
    let remote = me.remote();
    let host = AllocationRequest {
        location: Location::HostNuma(0),
        handle_types: 0,
    };
    // SAFETY: raw VMM calls on this process's own handles.
    unsafe {
        assert_eq!(remote.mem_create(187 << 30, host), Err(Code::OUT_OF_MEMORY));
        let dev = AllocationRequest {
            location: Location::Device(Device(0)),
            handle_types: 0,
        };
        let size = 64 << 20;
        let h = remote.mem_create(size, dev).unwrap();
        let va = remote.mem_address_reserve(size, 0).unwrap();
        remote.mem_map(va, size, 0, h).unwrap();
        remote.mem_set_access(va, size, vec![Device(0)]).unwrap();
        me.write(va + (32 << 20), &[7]).unwrap();
        assert_eq!(me.read(va + (32 << 20), 1).unwrap(), [7]);
        assert!(
            server.model().backed_bytes() <= 4096,
            "{}",
            server.model().backed_bytes()
        );
        remote.mem_unmap(va, size).unwrap();
        remote.mem_address_free(va, size).unwrap();
        remote.mem_release(h).unwrap();
    }
    drop((remote, me));
    assert!(server.wait_idle(T));
    assert!(server.live().is_empty());
}

/// Item 8: the fabric's directory is 0700 and its socket 0600 whatever
/// the umask.
#[test]
fn the_fabric_directory_and_socket_are_private_under_umask_000() {
    let _serial = children::serial();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "umask 000 && exec \"$0\" \"$@\""])
        .arg(exe)
        .args([
            "fabric_hostile::child_role",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .stdout(Stdio::piped());
    let Kid {
        _child: mut child,
        lines,
        ..
    } = Kid::spawn("modes", "modes", Some(cmd), &[]);
    assert_eq!(lines.expect("modes", T), "700 600");
    let status = child.wait_until(Instant::now() + T);
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

/// Item 12: a fabric that served a hundred short-lived processes keeps no
/// record of them beyond its bounded exit log.
#[test]
fn a_hundred_processes_that_came_and_went_leave_no_process_records() {
    let _serial = children::serial();
    let server = FabricServer::start(FabricConfig::nodes(1, 1)).unwrap();
    for _ in 0..100 {
        drop(fabric::open(&server.join().timeout(T)).unwrap());
    }
    assert!(server.wait_exits(100, T));
    assert!(server.wait_idle(T));
    assert_eq!(server.model().process_records(), 0);
    assert_eq!(server.exits().len(), 100);
}

/// A forged client sending a batch of more ops than the fabric takes
/// (`wire::MAX_BATCH_OPS`, which an honest client refuses before sending)
/// gets the same `INVALID_VALUE`, and its connection stays.
#[test]
fn a_batch_of_more_ops_than_the_fabric_takes_is_refused_from_a_forged_client_too() {
    use cuda_endpoints::driver::{CopyOp, Operand, Pointer};
    use fabric::WireCall;
    use fabric::wire::{self, MAX_BATCH_OPS, Reply, Request};
    let _serial = children::serial();
    let mut node = cuda_endpoints::model::ModelConfig::node(1);
    node.driver_version = 13050;
    let server = FabricServer::start(FabricConfig::single(node)).unwrap();
    let stream = raw_client(&server);
    let mut s = &stream;
    let mut ask = |req: &Request| {
        wire::send(&mut s, req).unwrap();
        wire::recv::<Reply>(&mut s).unwrap()
    };
    let Reply::Call(Ok(bytes)) = ask(&Request::Call(WireCall::StreamCreate { dev: Device(0) }))
    else {
        panic!("no stream");
    };
    let handle: u64 = postcard::from_bytes(&bytes).unwrap();
    // Empty host-to-host copies: valid, and small on the wire.
    let batch = |n: usize| Request::HostCopy {
        call: WireCall::FabricCpyBatchAsync {
            stream: handle,
            ops: vec![
                CopyOp {
                    src: Operand::Pointer(Pointer::host(0x1000)),
                    dst: Operand::Pointer(Pointer::host(0x2000)),
                    size: 0,
                };
                n
            ]
            .into(),
            flags: 0,
        },
        staged: vec![Some(Vec::new()); n],
    };
    assert!(matches!(ask(&batch(MAX_BATCH_OPS)), Reply::Done(Ok(()))));
    assert!(
        matches!(ask(&batch(MAX_BATCH_OPS + 1)), Reply::Done(Err(c)) if c == Code::INVALID_VALUE)
    );
    assert!(matches!(ask(&Request::Live), Reply::Live(_)));
    drop(stream);
    assert!(server.wait_idle(T));
    assert!(server.live().is_empty());
}

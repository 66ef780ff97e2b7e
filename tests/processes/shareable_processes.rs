//! VMM memory shared between real OS processes on a model fabric (C5,
//! R12.4): rank 0 exports a `PosixFd` allocation as a descriptor, passed to
//! every rank with `FdExchange` (`SCM_RIGHTS`), and a `FabricShareable` allocation
//! as 64 bytes; ranks of its node import the descriptor, ranks of the
//! other node are refused it and import the fabric bytes. And the same for
//! a classic multicast team brought up with `team::multicast` on the
//! classic fallback: a POSIX descriptor within a node, fabric bytes across
//! nodes, no bind before every rank added its device (C3: no violation).
//! Every process ends with zero leak counters, and so does the fabric.
//!
//! Under `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) every child
//! runs the real backend on the libcuda test double, which joins the test's
//! fabric (`common/rank.rs`): descriptors, fabric bytes and `cuMemcpy*`
//! cross the C ABI.
#![cfg(feature = "fabric")]

use crate::job;
use crate::rank;
use crate::support;

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use cuda_endpoints::driver::{Classic, ShareableKind};
use cuda_endpoints::fabric::FabricServer;
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::team::{self, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, Device, FabricShareable, PosixFd, bootstrap::Bootstrap,
    bootstrap::FdExchange,
};
use rank::Me;
use support::report;

use job::{DIR, RANK, ROLE, SCENARIO, SIZE};
const MIB2: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);
const TEXT: &[u8] = b"written by rank 0";

#[test]
fn child_rank() {
    if std::env::var(ROLE).as_deref() != Ok("rank") {
        return; // not a child
    }
    let rank = support::env_usize(RANK);
    let size = support::env_usize(SIZE);
    let dir = std::env::var(DIR).expect("dir");
    let (ctx, me) = rank::join();
    let boot = support::file_tcp(rank, size, Path::new(&dir), T).expect("bootstrap");
    let dev = me.device().unwrap_or(Device(0));
    let scenario = std::env::var(SCENARIO).unwrap_or_default();
    if let Some(kind) = match scenario.as_str() {
        "classic-fd" => Some(ShareableKind::PosixFd),
        "classic-fabric" => Some(ShareableKind::Fabric),
        _ => None,
    } {
        match classic_team(&me, &boot, dev, kind) {
            Ok(()) => report("ok"),
            Err(e) => report(&format!("err {e}")),
        }
        drop(boot);
        let live = me.live();
        report(&format!("leaks={}", u8::from(!live.is_empty())));
        report(&format!("double-violations={:?}", me.own_violations()));
        return;
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let (fd_mem, fabric_mem) = if rank == 0 {
            let a = Allocation::<PosixFd>::on_device(&ctx, dev, MIB2)?.map(&[dev])?;
            let b = Allocation::<FabricShareable>::on_device(&ctx, dev, MIB2)?.map(&[dev])?;
            me.write(a.device_ptr(), TEXT)?;
            me.write(b.device_ptr(), TEXT)?;
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let fd = fd_mem.as_ref().map(|m| m.export_fd()).transpose()?;
        let fd = FdExchange::broadcast_fd(&boot, 0, fd.as_ref().map(AsFd::as_fd), T)?;
        let bytes = fabric_mem.as_ref().map(|m| m.export_fabric()).transpose()?;
        let bytes = boot.broadcast(0, bytes.as_ref().map_or(&[][..], |b| &b[..]), T)?;
        match Allocation::<PosixFd>::import_fd(&ctx, &fd, MIB2) {
            Ok(peer) => {
                let peer = peer.map(&[dev])?;
                let got = me.read(peer.device_ptr(), TEXT.len())?;
                report(&format!("posix={}", String::from_utf8_lossy(&got)));
            }
            Err(e) => report(&format!(
                "posix-refused code={:?}",
                e.code().map(|c| c.raw())
            )),
        }
        let bytes: [u8; 64] = bytes.as_slice().try_into()?;
        let peer = Allocation::<FabricShareable>::import_fabric(&ctx, &bytes, MIB2)?.map(&[dev])?;
        let got = me.read(peer.device_ptr(), TEXT.len())?;
        report(&format!("fabric={}", String::from_utf8_lossy(&got)));
        drop(peer);
        // The exporter keeps its memory until every rank has imported.
        boot.barrier(T)?;
        Ok(())
    };
    job::report_end(run(), boot, ctx, &me);
}

/// A classic multicast team over this process's fabric driver: bring-up,
/// bind, a barrier, unbind, teardown.
fn classic_team(
    me: &Me,
    boot: &dyn Bootstrap,
    dev: Device,
    kind: ShareableKind,
) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(Classic::new(me.driver()));
    let spec = TeamSpec::new([dev], MIB2).timeout(T).classic_handles(kind);
    let team = team::multicast(&ctx, boot, &spec)?;
    let mem = Allocation::<PosixFd>::on_device(&ctx, dev, MIB2)?.map(&[dev])?;
    let binding = team.endpoint().bind(dev, 0, &mem)?;
    // The multicast address: rank 0's store reaches every rank's memory.
    let mapping = team.multicast_mapping()?;
    boot.barrier(T)?;
    if boot.rank() == 0 {
        me.write(mapping.device_ptr(), TEXT)?;
    }
    boot.barrier(T)?;
    let got = me.read(mem.device_ptr(), TEXT.len())?;
    report(&format!("multimem={}", String::from_utf8_lossy(&got)));
    drop(mapping);
    binding.unbind()?;
    boot.barrier(T)?;
    drop(team);
    drop(mem);
    let kept = ctx.take_teardown_errors();
    if !kept.is_empty() {
        return Err(format!("teardown errors: {kept:?}").into());
    }
    Ok(())
}

/// Runs `nodes` x `gpus` ranks of `scenario` on a fresh fabric; returns
/// each rank's result lines, after every child ended and left the fabric.
fn job(scenario: &str, nodes: usize, gpus: usize) -> (Vec<Vec<String>>, FabricServer) {
    let n = nodes * gpus;
    let config = FabricConfig::nodes(nodes, gpus);
    let bound = Duration::from_secs(40);
    let (done, server) = job::run(
        "shareable_processes::child_rank",
        scenario,
        config,
        (n, n),
        |_| "",
        bound,
    );
    assert_eq!(server.joined(), n as u64, "every rank joined the fabric");
    let results = done
        .iter()
        .map(|d| {
            let res = d.results();
            assert!(
                res.contains(&"ok".to_owned()),
                "{}: {res:?}\n{}",
                d.name,
                d.stderr
            );
            assert!(res.contains(&"leaks=0".to_owned()), "{}: {res:?}", d.name);
            assert!(
                res.contains(&"double-violations=[]".to_owned()),
                "{}: {res:?}",
                d.name
            );
            res
        })
        .collect();
    assert!(server.live().is_empty(), "fabric left: {:?}", server.live());
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    (results, server)
}

#[test]
fn c5_r12_4_posix_fds_reach_their_node_and_fabric_bytes_every_node() {
    let gpus = 2;
    let (results, _server) = job("memory", 2, gpus);
    for (r, res) in results.iter().enumerate() {
        assert!(
            res.contains(&"fabric=written by rank 0".to_owned()),
            "rank {r}: {res:?}"
        );
        let posix = if r < gpus {
            "posix=written by rank 0"
        } else {
            // R12.4: a descriptor means nothing on another node.
            "posix-refused code=Some(1)"
        };
        assert!(res.contains(&posix.to_owned()), "rank {r}: {res:?}");
    }
}

#[test]
fn c5_c3_a_classic_team_of_four_processes_shares_a_posix_fd_within_a_node() {
    let (results, server) = job("classic-fd", 1, 4);
    for res in &results {
        assert!(
            res.contains(&"multimem=written by rank 0".to_owned()),
            "{res:?}"
        );
    }
    // One classic object, made by the root at create; C3 never logged.
    assert_eq!(
        server
            .model()
            .calls(cuda_endpoints::driver::Call::MulticastCreate),
        1
    );
    assert_eq!(
        server
            .model()
            .calls(cuda_endpoints::driver::Call::MulticastAddDevice),
        4
    );
}

#[test]
fn c5_c3_a_classic_team_across_two_nodes_shares_fabric_bytes() {
    let (results, server) = job("classic-fabric", 2, 2);
    for res in &results {
        assert!(
            res.contains(&"multimem=written by rank 0".to_owned()),
            "{res:?}"
        );
    }
    assert_eq!(
        server
            .model()
            .calls(cuda_endpoints::driver::Call::MulticastCreate),
        1
    );
    assert_eq!(
        server
            .model()
            .calls(cuda_endpoints::driver::Call::MulticastBindAddr),
        4
    );
}

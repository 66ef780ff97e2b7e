//! VMM memory shared between real OS processes on a model fabric (C5,
//! R12.4): rank 0 exports a `PosixFd` allocation as a descriptor, passed to
//! every rank with `FdExchange` (`SCM_RIGHTS`), and a `Fabric` allocation
//! as 64 bytes; ranks of its node import the descriptor, ranks of the
//! other node are refused it and import the fabric bytes. Every process
//! ends with zero leak counters, and so does the fabric.
#![cfg(feature = "fabric")]

#[path = "bootstrap_support/mod.rs"]
mod support;

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;
use cuda_endpoints::{
    Allocation, Bootstrap, BootstrapError, Device, Fabric, FdExchange, PosixFd, Tcp, UniqueId,
};
use support::{Children, report};

const ROLE: &str = "CESH_ROLE";
const SIZE: &str = "CESH_SIZE";
const DIR: &str = "CESH_DIR";
const RANK: &str = "CUDA_ENDPOINTS_RANK";
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
    let (ctx, me) = fabric::connect_env().expect("fabric").expect("fabric env");
    let boot = tcp(rank, size, Path::new(&dir)).expect("bootstrap");
    let dev = me.device().unwrap_or(Device(0));
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let (fd_mem, fabric_mem) = if rank == 0 {
            let a = Allocation::<PosixFd>::on_device(&ctx, dev, MIB2)?.map(&[dev])?;
            let b = Allocation::<Fabric>::on_device(&ctx, dev, MIB2)?.map(&[dev])?;
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
        let peer = Allocation::<Fabric>::import_fabric(&ctx, &bytes, MIB2)?.map(&[dev])?;
        let got = me.read(peer.device_ptr(), TEXT.len())?;
        report(&format!("fabric={}", String::from_utf8_lossy(&got)));
        drop(peer);
        // The exporter keeps its memory until every rank has imported.
        boot.barrier(T)?;
        Ok(())
    };
    match run() {
        Ok(()) => report("ok"),
        Err(e) => report(&format!("err {e}")),
    }
    drop(boot);
    let live = me.live().expect("live");
    report(&format!("leaks={}", u8::from(!live.is_empty())));
}

fn tcp(rank: usize, size: usize, dir: &Path) -> Result<Tcp, BootstrapError> {
    let id_file = dir.join("bootstrap-id");
    if rank == 0 {
        let (id, root) = Tcp::root("127.0.0.1:0".parse().expect("addr"))?;
        id.write_file(&id_file).expect("id file");
        root.accept(size, T)
    } else {
        let id = UniqueId::read_file(&id_file, T)?;
        Tcp::join(&id, rank, size, T)
    }
}

#[test]
fn c5_r12_4_posix_fds_reach_their_node_and_fabric_bytes_every_node() {
    let _serial = support::serial();
    let (nodes, gpus) = (2, 2);
    let n = nodes * gpus;
    let server = FabricServer::start(FabricConfig::nodes(nodes, gpus)).expect("fabric");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut kids = Children::default();
    for r in 0..n {
        kids.spawn(
            &format!("rank{r}"),
            "child_rank",
            &[
                (ROLE, "rank".into()),
                (RANK, r.to_string()),
                (SIZE, n.to_string()),
                (DIR, dir.path().display().to_string()),
                (
                    fabric::ENV_VAR,
                    format!("{},rank={r}", server.socket().display()),
                ),
            ],
        );
    }
    let done = kids.wait_all(Duration::from_secs(40));
    assert!(
        server.wait_idle(Duration::from_secs(10)),
        "fabric processes still connected"
    );
    for (r, d) in done.iter().enumerate() {
        let res = d.results();
        assert!(
            res.contains(&"ok".to_owned()),
            "rank {r}: {res:?}\n{}",
            d.stderr
        );
        assert!(res.contains(&"leaks=0".to_owned()), "rank {r}: {res:?}");
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
    assert_eq!(server.joined(), n as u64, "every rank joined the fabric");
    assert!(server.live().is_empty(), "fabric left: {:?}", server.live());
    assert!(server.violations().is_empty(), "{:?}", server.violations());
}

//! File-descriptor passing (`SCM_RIGHTS`) between real OS processes over the
//! TCP bootstrap: a pipe passed by the root is read by its peer; every rank
//! passes a pipe to every other; descriptors are refused across nodes with a
//! typed error; no socket or descriptor is left behind.

use crate::bootstrap_support;

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use bootstrap_support::*;
use cuda_endpoints::bootstrap::{AbortReason, NodeId, UNIQUE_ID_ENV};
use cuda_endpoints::{
    bootstrap::Bootstrap, bootstrap::BootstrapError, bootstrap::FdExchange, bootstrap::Tcp,
    bootstrap::Threads, bootstrap::UniqueId,
};

const ENTRY: &str = "bootstrap_fd::child_entry";
const T: Duration = Duration::from_secs(20);
/// Far longer than any bound under test (issue 21, item 13).
const LONG: Duration = Duration::from_secs(60);

#[test]
fn child_entry() {
    run_child(child);
}

fn child(role: &str) -> Result<(), String> {
    if role == "other_user_fetch" {
        return other_user_fetch();
    }
    let (rank, size) = (env_usize(RANK), env_usize(SIZE));
    let id = UniqueId::from_env().map_err(|e| e.to_string())?;
    let boot = Tcp::join(&id, rank, size, T).map_err(|e| e.to_string())?;
    match role {
        "read_root_pipe" => {
            let fd = FdExchange::broadcast_fd(&boot, 0, None, T).map_err(|e| e.to_string())?;
            let mut text = String::new();
            std::fs::File::from(fd)
                .read_to_string(&mut text)
                .map_err(|e| e.to_string())?;
            report(&format!("READ {text}"));
            Ok(())
        }
        "pipes_all_to_all" => pipes_all_to_all(&boot).map(|text| report(&format!("READ {text}"))),
        _ => Err(format!("unknown role {role}")),
    }
}

/// Every rank passes the write end of its pipe; every rank writes its name
/// into every other rank's pipe; each reads its own pipe to the end.
fn pipes_all_to_all(boot: &dyn Bootstrap) -> Result<String, String> {
    let (mut reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
    let writer = OwnedFd::from(writer);
    let all = FdExchange::allgather_fds(boot, writer.as_fd(), T).map_err(|e| e.to_string())?;
    drop(writer);
    for (r, fd) in all.into_iter().enumerate() {
        if r != boot.rank() {
            std::fs::File::from(fd)
                .write_all(format!("<{}>", boot.rank()).as_bytes())
                .map_err(|e| e.to_string())?;
        } // this rank's own duplicate closes here, unwritten
    }
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}

fn job(size: usize, role: &str, kids: &mut Children) -> Tcp {
    let (id, listener) = Tcp::root("127.0.0.1:0".parse().expect("loopback")).expect("bind");
    for r in 1..size {
        kids.spawn(
            &format!("rank{r}"),
            ENTRY,
            &[
                (ROLE, role.into()),
                (RANK, r.to_string()),
                (SIZE, size.to_string()),
                (UNIQUE_ID_ENV, id.to_string()),
            ],
        );
    }
    listener.accept(size, T).expect("ranks join")
}

#[test]
fn a_pipe_passed_by_the_root_is_read_by_its_peer_process() {
    let _s = serial();
    let (fds, sockets) = (open_fds(), library_sockets());
    {
        let mut kids = Children::default();
        let boot = job(2, "read_root_pipe", &mut kids);
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer
            .write_all(b"hello through SCM_RIGHTS")
            .expect("write");
        drop(writer);
        let reader = OwnedFd::from(reader);
        let mine = FdExchange::broadcast_fd(&boot, 0, Some(reader.as_fd()), T)
            .expect("root passes the pipe");
        drop((reader, mine));
        let done = kids.wait_all(T);
        assert_eq!(
            done[0].code,
            Some(0),
            "{:?} {}",
            done[0].results(),
            done[0].stderr
        );
        assert_eq!(
            done[0].results(),
            vec!["READ hello through SCM_RIGHTS".to_owned()]
        );
    }
    assert_eq!(open_fds(), fds, "no descriptor left open");
    assert_eq!(library_sockets(), sockets, "no socket left bound");
}

#[test]
fn every_rank_passes_a_pipe_to_every_other_rank() {
    let _s = serial();
    let (fds, sockets) = (open_fds(), library_sockets());
    {
        let mut kids = Children::default();
        let boot = job(3, "pipes_all_to_all", &mut kids);
        // Read in a thread so that a misbehaving child cannot hang the test:
        // the guard kills it, which closes its ends of the pipes.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = tx.send(pipes_all_to_all(&boot));
            });
            let mine = rx.recv_timeout(T);
            let done = kids.wait_all(T);
            let mut text = mine.expect("bounded").expect("rank 0's pipes").into_bytes();
            text.sort_unstable();
            assert_eq!(text, b"12<<>>".to_vec());
            for d in done {
                let mut got = d.results().join("").into_bytes();
                got.sort_unstable();
                assert_eq!(d.code, Some(0), "{} {:?} {}", d.name, d.results(), d.stderr);
                assert_eq!(got.len(), "READ <a><b>".len(), "{}", d.name);
            }
        });
    }
    assert_eq!(open_fds(), fds, "no descriptor left open");
    assert_eq!(library_sockets(), sockets, "no socket left bound");
}

#[test]
fn descriptors_are_refused_across_nodes_on_every_rank() {
    let _s = serial();
    let ranks = Threads::new(4);
    let nodes = [
        NodeId::from_parts("a", "boot-a", 1),
        NodeId::from_parts("a", "boot-a", 1),
        NodeId::from_parts("b", "boot-b", 1),
        NodeId::from_parts("b", "boot-b", 1),
    ];
    let (_r, w) = std::io::pipe().expect("pipe");
    let w = OwnedFd::from(w);
    let errs: Vec<BootstrapError> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .zip(&nodes)
            .map(|(b, n)| {
                let fd = (b.rank() == 0).then(|| w.as_fd());
                s.spawn(move || {
                    FdExchange::broadcast_fd_on(b, n, 0, fd, T)
                        .expect_err("ranks 2, 3 are on node b")
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    // Each rank names a rank of the other node: off the root's, the root;
    // on it, the first rank off it (rank 3 never names rank 2, its own
    // node's).
    for (r, e) in errs.iter().enumerate() {
        let want_peer = if r >= 2 { 0 } else { 2 };
        assert!(
            matches!(e, BootstrapError::OtherNode { rank, peer, outside, .. } if *rank == r && *peer == want_peer && *outside == 2),
            "{e}"
        );
    }
    assert!(errs[0].to_string().contains("pass only within a node"));
}

#[test]
fn a_root_without_a_descriptor_fails_every_rank_at_once() {
    let _s = serial();
    let ranks = Threads::new(2);
    let errs: Vec<BootstrapError> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|b| s.spawn(move || FdExchange::broadcast_fd(b, 0, None, T).expect_err("no fd")))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert!(
        matches!(errs[0], BootstrapError::InvalidArgument { rank: 0, .. }),
        "{:?}",
        errs[0]
    );
    assert!(
        matches!(
            errs[1],
            BootstrapError::Aborted {
                rank: 1,
                culprit: 0,
                reason: AbortReason::Io,
                ..
            }
        ),
        "{:?}",
        errs[1]
    );
}

#[test]
fn fd_passing_within_one_process_over_threads() {
    let _s = serial();
    let ranks = Threads::new(2);
    let (reader, mut writer) = std::io::pipe().expect("pipe");
    let reader = OwnedFd::from(reader);
    let got: Vec<OwnedFd> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|b| {
                let fd = (b.rank() == 0).then(|| reader.as_fd());
                s.spawn(move || FdExchange::broadcast_fd(b, 0, fd, T).expect("same node"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    writer.write_all(b"ok").expect("write");
    drop(writer);
    drop(reader);
    let mut text = String::new();
    let mut it = got.into_iter();
    let (first, second) = (it.next().expect("rank 0"), it.next().expect("rank 1"));
    drop(first);
    std::fs::File::from(second)
        .read_to_string(&mut text)
        .expect("read through the passed fd");
    assert_eq!(text, "ok");
}

/// A two-rank bootstrap whose other rank is played by hand: rank 0 hands
/// its own contribution out as both (and gives it to `offers`); rank 1
/// gets `root_offer` as rank 0's.
struct Scripted {
    rank: usize,
    root_offer: Vec<u8>,
    offers: Option<std::sync::Mutex<std::sync::mpsc::Sender<Vec<u8>>>>,
}

impl Bootstrap for Scripted {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        2
    }
    fn allgather(&self, mine: &[u8], _: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        if let Some(tx) = &self.offers {
            let _ = tx.lock().map(|tx| tx.send(mine.to_vec()));
            return Ok(vec![mine.to_vec(), mine.to_vec()]);
        }
        Ok(vec![self.root_offer.clone(), mine.to_vec()])
    }
    fn broadcast(&self, _: usize, b: &[u8], _: Duration) -> Result<Vec<u8>, BootstrapError> {
        Ok(b.to_vec())
    }
    fn barrier(&self, _: Duration) -> Result<(), BootstrapError> {
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The child of another user: rank 1 with rank 0's offer (socket name and
/// token) in hand, as if it had leaked.
fn other_user_fetch() -> Result<(), String> {
    report(&format!("EUID {}", euid().unwrap_or(u32::MAX)));
    let offer = unhex(&std::env::var(ARG).map_err(|e| e.to_string())?);
    let me = Scripted {
        rank: 1,
        root_offer: offer,
        offers: None,
    };
    match FdExchange::broadcast_fd(&me, 0, None, T) {
        Ok(_) => report("GOT a descriptor"),
        Err(e) => report(&format!("REFUSED {e:?}")),
    }
    Ok(())
}

/// Issue 21, item 5: the root's abstract socket is listed to every local
/// user, so `FdExchange` closes a connection whose peer (`SO_PEERCRED`) is
/// another user, even one that presents the right token; the real rank 1
/// is served after it. Needs root, to start a process as uid 65534.
#[test]
fn a_connection_from_another_user_is_closed_even_with_the_token() {
    let _s = serial();
    if euid() != Some(0) {
        println!("skipped: needs root to start a process of another user (uid 65534)");
        return;
    }
    let (offers_tx, offers_rx) = std::sync::mpsc::channel();
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    let writer = OwnedFd::from(writer);
    let root = Scripted {
        rank: 0,
        root_offer: Vec::new(),
        offers: Some(std::sync::Mutex::new(offers_tx)),
    };
    std::thread::scope(|s| {
        let served = s.spawn(|| FdExchange::broadcast_fd(&root, 0, Some(writer.as_fd()), LONG));
        let offer = offers_rx.recv_timeout(LONG).expect("rank 0's offer");
        // Another user with the token.
        let mut cmd = test_binary(ENTRY);
        cmd.env(ROLE, "other_user_fetch").env(ARG, hex(&offer));
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
        let other = Guard::spawn("uid 65534", &mut cmd).finish(std::time::Instant::now() + LONG);
        let said = other.results();
        assert!(
            said.iter().any(|l| l == "EUID 65534"),
            "{said:?} {}",
            other.stderr
        );
        assert!(
            said.iter().all(|l| !l.starts_with("GOT")),
            "another user was served: {said:?} {}",
            other.stderr
        );
        assert!(
            said.iter()
                .any(|l| l.starts_with("REFUSED") && l.contains("PeerClosed")),
            "{said:?} {}",
            other.stderr
        );
        // The real rank 1 (this user) is served after it.
        let rank1 = Scripted {
            rank: 1,
            root_offer: offer,
            offers: None,
        };
        let fd = FdExchange::broadcast_fd(&rank1, 0, None, T).expect("rank 1 is served");
        std::fs::File::from(fd).write_all(b"ok").expect("write");
        served.join().expect("root").expect("root served rank 1");
    });
    drop(writer);
    let mut text = String::new();
    reader.read_to_string(&mut text).expect("read");
    assert_eq!(text, "ok");
}

//! [`FdExchange`]: passes POSIX file descriptors between the ranks of one
//! node (the classic multicast API's IPC, `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
//!
//! Choice: `sendmsg`/`recvmsg` with `SCM_RIGHTS` over a Unix socket (through
//! `rustix`, no `unsafe` here), not `pidfd_getfd`: it needs no ptrace
//! permission (`PTRACE_MODE_ATTACH`, often denied by Yama or containers),
//! works on kernels before 5.6, and the sender decides what it hands out.
//!
//! One broadcast: the root binds a listener in the **abstract** socket
//! namespace (Linux; nothing is left in the file system, and the name dies
//! with the socket) under a random name, then all ranks allgather over the
//! [`Bootstrap`] their [`NodeId`] and the root's socket name and a random
//! token. If any rank is on another node than the root, every rank returns
//! [`BootstrapError::OtherNode`] at once. Otherwise each rank connects,
//! presents the token, and receives the descriptor; the root serves each rank
//! once and drops connections without the token. The abstract name is
//! visible to every local user (`/proc/net/unix`), so the root closes any
//! connection whose peer (`SO_PEERCRED`) is another user, holds at most
//! `size + 64` connections that have not presented the token, and answers
//! running out of descriptors by dropping the oldest of them. Received descriptors are
//! [`OwnedFd`]s with `FD_CLOEXEC` (closed on drop: no leak).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::api::{Bootstrap, Deadline};
use super::error::{AbortReason, Argument, BootstrapError, Exchange, FrameMismatch, Malformed, Op};
use super::node::NodeId;
use super::wire::{self, Header, Kind};

/// Passes file descriptors among the ranks of one node (see the module doc).
#[derive(Debug)]
pub struct FdExchange;

const TOKEN: usize = 16;
const STATUS_OK: u8 = 0;
const STATUS_FAILED: u8 = 1;

fn step() -> Exchange {
    Exchange {
        op: Op::FdPassing,
        seq: 0,
    }
}

fn io_err(rank: usize, peer: Option<usize>) -> impl Fn(io::Error) -> BootstrapError {
    move |source| BootstrapError::Io {
        rank,
        step: step(),
        peer,
        source,
    }
}

fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What each rank contributes to the allgather.
struct Offer {
    status: u8,
    node: NodeId,
    /// Root only: socket name and token.
    name: Vec<u8>,
    token: [u8; TOKEN],
}

/// An [`Offer`] as it travels (`postcard`).
#[derive(serde::Serialize, serde::Deserialize)]
struct OfferWire<'a> {
    status: u8,
    hostname: &'a str,
    boot_id: &'a str,
    net_ns: u64,
    token: [u8; TOKEN],
    name: &'a [u8],
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&OfferWire {
            status: self.status,
            hostname: &self.node.hostname,
            boot_id: &self.node.boot_id,
            net_ns: self.node.net_ns,
            token: self.token,
            name: &self.name,
        })
        .unwrap_or_default()
    }

    fn decode(b: &[u8]) -> Option<Offer> {
        let w: OfferWire<'_> = postcard::from_bytes(b).ok()?;
        (w.name.len() <= 108).then(|| Offer {
            status: w.status,
            node: NodeId::from_parts(w.hostname, w.boot_id, w.net_ns),
            name: w.name.to_vec(),
            token: w.token,
        })
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

impl FdExchange {
    /// Rank `root` hands `fd_if_root` to every rank of its node; every rank
    /// (the root too, as a duplicate) gets an [`OwnedFd`] for it.
    ///
    /// # Errors
    /// [`BootstrapError::OtherNode`] when a rank is on another node;
    /// [`BootstrapError::Timeout`] naming the ranks not served in time;
    /// [`BootstrapError::InvalidArgument`] when the root passes `None` (the
    /// other ranks get [`BootstrapError::Aborted`] naming the root); the
    /// bootstrap's errors.
    pub fn broadcast_fd<B: Bootstrap + ?Sized>(
        boot: &B,
        root: usize,
        fd_if_root: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<OwnedFd, BootstrapError> {
        let node = NodeId::current().map_err(io_err(boot.rank(), None))?;
        Self::broadcast_fd_on(boot, &node, root, fd_if_root, timeout)
    }

    /// [`FdExchange::broadcast_fd`] with this rank's node given, for a job
    /// that simulates several nodes on one machine (the model fabric): ranks
    /// whose `node` differs from the root's are refused as if on another host.
    ///
    /// # Errors
    /// As [`FdExchange::broadcast_fd`].
    pub fn broadcast_fd_on<B: Bootstrap + ?Sized>(
        boot: &B,
        node: &NodeId,
        root: usize,
        fd_if_root: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<OwnedFd, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let (rank, size) = (boot.rank(), boot.size());
        if root >= size {
            return Err(BootstrapError::InvalidArgument {
                rank,
                step: step(),
                what: Argument::RankOutOfRange { rank: root, size },
            });
        }
        let node = node.clone();
        // The root listens before the allgather, so peers can connect as soon as it ends.
        let mut listener = None;
        let mut failure = None;
        let mut offer = Offer {
            status: STATUS_OK,
            node: node.clone(),
            name: Vec::new(),
            token: [0; TOKEN],
        };
        if rank == root {
            match (fd_if_root, Self::listen()) {
                (Some(_), Ok((l, name, token))) => {
                    listener = Some(l);
                    offer.name = name;
                    offer.token = token;
                }
                (None, _) => {
                    failure = Some(BootstrapError::InvalidArgument {
                        rank,
                        step: step(),
                        what: Argument::NoDescriptor,
                    })
                }
                (_, Err(e)) => failure = Some(io_err(rank, None)(e)),
            }
            if failure.is_some() {
                offer.status = STATUS_FAILED;
            }
        }
        let all = boot.allgather(&offer.encode(), deadline.remaining())?;
        if let Some(e) = failure {
            return Err(e);
        }
        let mut offers = Vec::with_capacity(size);
        for (peer, bytes) in all.iter().enumerate() {
            let o = Offer::decode(bytes).ok_or(BootstrapError::Malformed {
                rank,
                step: step(),
                peer,
                what: Malformed::Truncated,
            })?;
            offers.push(o);
        }
        let root_offer = offers.get(root).ok_or(BootstrapError::Mismatch {
            rank,
            step: step(),
            peer: root,
            what: FrameMismatch::Count {
                expected: size,
                got: offers.len(),
            },
        })?;
        if root_offer.status != STATUS_OK {
            return Err(BootstrapError::Aborted {
                rank,
                step: step(),
                culprit: root,
                reason: AbortReason::Io,
            });
        }
        if let Some(p) = offers.iter().position(|o| o.node != root_offer.node) {
            // A rank off the root's node names the root; one on it names
            // the first rank off it (never a rank on this rank's own node).
            let (peer, theirs) = if node != root_offer.node {
                (root, root_offer.node.clone())
            } else {
                (p, offers[p].node.clone())
            };
            return Err(BootstrapError::OtherNode {
                rank,
                step: step(),
                peer,
                outside: p,
                mine: Box::new(node),
                theirs: Box::new(theirs),
            });
        }
        match (listener, fd_if_root) {
            (Some(l), Some(fd)) => {
                Self::serve(&l, fd, rank, size, &root_offer.token, &deadline)?;
                fd.try_clone_to_owned().map_err(io_err(rank, None))
            }
            _ => Self::fetch(
                &root_offer.name,
                &root_offer.token,
                rank,
                size,
                root,
                &deadline,
            ),
        }
    }

    /// Every rank hands `mine` to every rank of the node; entry `r` is rank
    /// `r`'s descriptor (this rank's own as a duplicate). `size` rounds of
    /// [`FdExchange::broadcast_fd`] within one `timeout`.
    ///
    /// # Errors
    /// As [`FdExchange::broadcast_fd`].
    pub fn allgather_fds<B: Bootstrap + ?Sized>(
        boot: &B,
        mine: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<Vec<OwnedFd>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        (0..boot.size())
            .map(|root| {
                Self::broadcast_fd(
                    boot,
                    root,
                    (root == boot.rank()).then_some(mine),
                    deadline.remaining(),
                )
            })
            .collect()
    }

    fn listen() -> io::Result<(UnixListener, Vec<u8>, [u8; TOKEN])> {
        let name = format!("cuda-endpoints/fd/{}", hex(&random::<16>()?)).into_bytes();
        let addr = SocketAddr::from_abstract_name(&name)?;
        let l = UnixListener::bind_addr(&addr)?;
        l.set_nonblocking(true)?;
        Ok((l, name, random::<TOKEN>()?))
    }

    fn request_header(token: &[u8; TOKEN], rank: usize, size: usize) -> Header {
        let mut job = [0u8; 8];
        job.copy_from_slice(&token[..8]);
        Header::new(Kind::FdRequest, u64::from_le_bytes(job), 0, rank, size)
    }

    /// Root: serves every other rank once.
    fn serve(
        l: &UnixListener,
        fd: BorrowedFd<'_>,
        rank: usize,
        size: usize,
        token: &[u8; TOKEN],
        deadline: &Deadline,
    ) -> Result<(), BootstrapError> {
        let mut served = vec![false; size];
        served[rank] = true;
        let mut pending: Vec<(UnixStream, Vec<u8>)> = Vec::new();
        let want = Self::request_header(token, 0, size);
        let frame_len = wire::HEADER_LEN + TOKEN;
        while served.iter().any(|s| !s) {
            if deadline.passed() {
                let waiting_for = (0..size).filter(|&r| !served[r]).collect();
                return Err(BootstrapError::Timeout {
                    rank,
                    step: step(),
                    waiting_for,
                    after: deadline.timeout(),
                });
            }
            let ready: Vec<usize> = {
                let mut pfds = vec![PollFd::new(l, PollFlags::IN)];
                pfds.extend(pending.iter().map(|(s, _)| PollFd::new(s, PollFlags::IN)));
                match rustix::event::poll(&mut pfds, Some(&timespec(deadline.remaining()))) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(io_err(rank, None)(e.into())),
                }
                pfds.iter()
                    .enumerate()
                    .filter(|(_, p)| !p.revents().is_empty())
                    .map(|(i, _)| i)
                    .collect()
            };
            let mut done: Vec<usize> = Vec::new();
            for i in ready {
                if i == 0 {
                    Self::accept_pending(l, &mut pending, &mut done, size, deadline);
                    continue;
                }
                let idx = i - 1;
                let Some((s, buf)) = pending.get_mut(idx) else {
                    continue;
                };
                let mut chunk = [0u8; 64];
                match s.read(&mut chunk) {
                    Ok(0) => {
                        done.push(idx);
                        continue;
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted =>
                    {
                        continue;
                    }
                    Err(_) => {
                        done.push(idx);
                        continue;
                    }
                }
                if buf.len() < frame_len {
                    continue;
                }
                done.push(idx);
                // Anything but an exact request with the token is dropped.
                let Ok(h) = Header::decode(buf, TOKEN) else {
                    continue;
                };
                if buf.len() != frame_len
                    || h.kind != want.kind
                    || h.job != want.job
                    || h.size != want.size
                    // In time that does not depend on where they differ.
                    || !crate::tcp::constant_time_eq(&buf[wire::HEADER_LEN..], &token[..])
                {
                    continue;
                }
                let Ok(peer) = usize::try_from(h.from) else {
                    continue;
                };
                if peer >= size || served[peer] {
                    continue;
                }
                if s.set_nonblocking(false).is_err()
                    || s.set_write_timeout(Some(deadline.remaining().max(Duration::from_millis(1))))
                        .is_err()
                {
                    continue;
                }
                let fds = [fd];
                let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut cmsg = SendAncillaryBuffer::new(&mut space);
                if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
                    return Err(io_err(rank, Some(peer))(io::Error::other(
                        "ancillary buffer too small",
                    )));
                }
                // A peer that went away gets nothing; it will not come back.
                if let Ok(1) =
                    rustix::net::sendmsg(&*s, &[IoSlice::new(&[1])], &mut cmsg, SendFlags::NOSIGNAL)
                {
                    served[peer] = true;
                }
            }
            done.sort_unstable();
            done.dedup();
            for idx in done.into_iter().rev() {
                pending.swap_remove(idx);
            }
        }
        Ok(())
    }

    /// Root: accepts what the listener holds into `pending`. The abstract
    /// name is listed to every local user, so a connection from another
    /// user (`SO_PEERCRED`) is closed at once; at most `size + 64`
    /// connections wait (the oldest dropped first, through `done`); out of
    /// descriptors (`EMFILE`, `ENFILE`), the oldest is dropped, or with
    /// none to drop this sleeps briefly instead of polling again at once.
    fn accept_pending(
        l: &UnixListener,
        pending: &mut Vec<(UnixStream, Vec<u8>)>,
        done: &mut Vec<usize>,
        size: usize,
        deadline: &Deadline,
    ) {
        let max = size.saturating_add(64);
        let me = rustix::process::geteuid();
        let drop_oldest = |pending: &[(UnixStream, Vec<u8>)], done: &mut Vec<usize>| match (0
            ..pending.len())
            .find(|i| !done.contains(i))
        {
            Some(i) => {
                done.push(i);
                true
            }
            None => false,
        };
        for _ in 0..max {
            match l.accept() {
                Ok((s, _)) => {
                    let same_user =
                        rustix::net::sockopt::socket_peercred(&s).is_ok_and(|c| c.uid == me);
                    if !same_user || s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    while pending.len().saturating_sub(done.len()) >= max {
                        if !drop_oldest(pending, done) {
                            break;
                        }
                    }
                    pending.push((s, Vec::new()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e)
                    if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error())
                        || e.raw_os_error() == Some(rustix::io::Errno::NFILE.raw_os_error()) =>
                {
                    if !drop_oldest(pending, done) {
                        std::thread::sleep(deadline.remaining().min(Duration::from_millis(20)));
                    }
                    break;
                }
                Err(_) => {
                    std::thread::sleep(deadline.remaining().min(Duration::from_millis(20)));
                    break;
                }
            }
        }
    }

    /// Other ranks: connects to the root's socket and receives the descriptor.
    fn fetch(
        name: &[u8],
        token: &[u8; TOKEN],
        rank: usize,
        size: usize,
        root: usize,
        deadline: &Deadline,
    ) -> Result<OwnedFd, BootstrapError> {
        let timed_out = || BootstrapError::Timeout {
            rank,
            step: step(),
            waiting_for: vec![root],
            after: deadline.timeout(),
        };
        let io = io_err(rank, Some(root));
        let addr = SocketAddr::from_abstract_name(name).map_err(&io)?;
        let mut s = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
                BootstrapError::PeerClosed {
                    rank,
                    step: step(),
                    peer: root,
                }
            }
            _ => io(e),
        })?;
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(timed_out());
        }
        s.set_read_timeout(Some(left)).map_err(&io)?;
        s.set_write_timeout(Some(left)).map_err(&io)?;
        let req = wire::frame(Self::request_header(token, rank, size), token).unwrap_or_default();
        s.write_all(&req).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                BootstrapError::PeerClosed {
                    rank,
                    step: step(),
                    peer: root,
                }
            }
            _ => io(e),
        })?;
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let got = loop {
            match rustix::net::recvmsg(
                &s,
                &mut [IoSliceMut::new(&mut byte)],
                &mut cmsg,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) => break r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Err(timed_out()),
                // The root closed the connection unread (it refused this
                // peer, or it is gone): as an orderly close.
                Err(rustix::io::Errno::CONNRESET) => {
                    return Err(BootstrapError::PeerClosed {
                        rank,
                        step: step(),
                        peer: root,
                    });
                }
                Err(e) => return Err(io(e.into())),
            }
        };
        if got.bytes == 0 {
            return Err(BootstrapError::PeerClosed {
                rank,
                step: step(),
                peer: root,
            });
        }
        let truncated = got.flags.contains(ReturnFlags::CTRUNC);
        let mut fd = None;
        for msg in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    // Extra descriptors from a hostile root are closed here.
                    if fd.is_none() {
                        fd = Some(f);
                    }
                }
            }
        }
        let malformed = |what| BootstrapError::Malformed {
            rank,
            step: step(),
            peer: root,
            what,
        };
        match fd {
            _ if truncated => Err(malformed(Malformed::ControlTruncated)),
            Some(fd) => Ok(fd),
            None => Err(malformed(Malformed::NoDescriptor)),
        }
    }
}

#[cfg(test)]
mod offer_tests {
    use super::*;

    #[test]
    fn an_offer_round_trips_and_refuses_truncation() {
        let o = Offer {
            status: 1,
            node: NodeId::from_parts("host-a", "1234-5678", 42),
            name: b"cuda-endpoints/x".to_vec(),
            token: [7; TOKEN],
        };
        let enc = o.encode();
        let back = Offer::decode(&enc).map(|b| (b.status, b.node, b.name, b.token));
        assert_eq!(
            back,
            Some((o.status, o.node.clone(), o.name.clone(), o.token))
        );
        for cut in 0..enc.len() {
            assert!(Offer::decode(&enc[..cut]).is_none());
        }
    }

    /// A root that attaches 250 descriptors where one is expected: the
    /// kernel truncates the control message, and the rank says so.
    #[test]
    fn a_root_sending_250_descriptors_is_reported_as_a_truncated_control_message() {
        let (l, name, token) = FdExchange::listen().expect("listen");
        l.set_nonblocking(false).expect("blocking");
        let root = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut req = [0u8; wire::HEADER_LEN + TOKEN];
            s.read_exact(&mut req).expect("request");
            let (r, _w) = std::io::pipe().expect("pipe");
            let fds: Vec<BorrowedFd<'_>> = (0..250)
                .map(|_| {
                    use std::os::fd::AsFd;
                    r.as_fd()
                })
                .collect();
            let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(250))];
            let mut cmsg = SendAncillaryBuffer::new(&mut space);
            assert!(cmsg.push(SendAncillaryMessage::ScmRights(&fds)));
            rustix::net::sendmsg(&s, &[IoSlice::new(&[1])], &mut cmsg, SendFlags::NOSIGNAL)
                .expect("sendmsg");
            // Held open until the rank has read.
            let mut end = [0u8; 1];
            let _ = s.read(&mut end);
        });
        let got = FdExchange::fetch(
            &name,
            &token,
            1,
            2,
            0,
            &Deadline::after(Duration::from_secs(20)),
        );
        root.join().expect("root thread");
        assert!(
            matches!(
                got,
                Err(BootstrapError::Malformed {
                    what: Malformed::ControlTruncated,
                    ..
                })
            ),
            "{got:?}"
        );
    }

    proptest::proptest! {
        #[test]
        fn peer_offers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = Offer::decode(&bytes);
        }
    }
}

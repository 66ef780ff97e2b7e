//! The ring among the ranks of a [`Tcp`](crate::Tcp) job of three ranks or
//! more, over which its allgather runs (as NCCL's bootstrap): each rank
//! sends only to the next rank and receives only from the previous one, so
//! every rank, rank 0 included, moves `n - 1` messages and `O(n)` bytes per
//! allgather instead of rank 0 moving `O(n²)`.
//!
//! This file owns the ring's links, their authentication and the ring
//! allgather; [`Tcp`](crate::Tcp) sets the ring up through rank 0 at the
//! first allgather (each rank's listener address in, each rank's next
//! address out: `n - 1` small messages each way at rank 0).
//!
//! The ring's links are authenticated like the link to rank 0: the
//! connecting rank and the accepting rank each prove they know the job
//! secret (HMAC-SHA-256 over both sides' fresh nonces, the job, the
//! connecting rank and the size, under labels of the ring's own so that
//! no proof of the join can be replayed here). A rank's ring listener
//! admits only its previous rank with a valid proof; it holds at most
//! [`PENDING_MAX`] other connections, each with one deadline for its whole
//! hello, and is closed once the ring stands. Every wait is bounded by the
//! collective's deadline. A rank that fails a ring allgather (its previous
//! rank closed, sent hostile bytes or was silent past the deadline) sends
//! an abort naming the culprit to the next rank, which passes it on, so
//! every live rank fails at once with [`BootstrapError::Aborted`] rather
//! than at its own deadline.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use super::api::{Deadline, Traffic};
use super::error::{AbortReason, BootstrapError, Exchange, FrameMismatch, Malformed};
use super::tcp::{
    HELLO_MAX, Link, NONCE, PROOF, constant_time_eq, evict_index, header_error, poll_timeout,
    proof, random_nonce, wait_readable, write_bounded,
};
use super::wire::{self, FrameReader, Header, Kind, MAX_PAYLOAD};

/// Connections a ring listener holds that have not proven anything.
const PENDING_MAX: usize = 64;
/// The time a connection to a ring listener has for its whole hello.
const HELLO_BUDGET: Duration = Duration::from_secs(10);
/// The connecting rank's proof label.
const FROM: &[u8] = b"ring-from";
/// The accepting rank's proof label.
const TO: &[u8] = b"ring-to";
/// Bytes of the origin rank in front of each block.
const ORIGIN: usize = 4;

/// One rank's two links of the ring.
#[derive(Debug)]
pub(crate) struct Ring {
    /// To rank `(rank + 1) % size`.
    next: Link,
    /// From rank `(rank + size - 1) % size`.
    prev: Link,
}

/// Who this rank is, and the secret its ring links prove.
pub(crate) struct Member<'a> {
    pub(crate) secret: &'a [u8],
    pub(crate) job: u64,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl Member<'_> {
    fn next(&self) -> usize {
        (self.rank + 1) % self.size
    }

    fn prev(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    fn header(&self, kind: Kind, seq: u64) -> Header {
        Header::new(kind, self.job, seq, self.rank, self.size)
    }

    fn proof(
        &self,
        label: &[u8],
        from: usize,
        connector: &[u8],
        acceptor: &[u8],
    ) -> Option<[u8; PROOF]> {
        proof(
            self.secret,
            self.job,
            label,
            u32::try_from(from).unwrap_or(u32::MAX),
            u32::try_from(self.size).unwrap_or(u32::MAX),
            connector,
            acceptor,
        )
    }
}

/// Why the ring could not be set up.
#[derive(Debug)]
pub(crate) enum SetupFailure {
    /// One of the watched descriptors (the link to rank 0) became readable:
    /// rank 0 has something to say (an abort) before the ring stands.
    Watched,
    /// A ring peer failed; `culprit` is the rank to blame.
    Peer {
        culprit: usize,
        error: BootstrapError,
    },
}

/// The connecting side's progress.
#[derive(Debug, Clone, Copy)]
enum Out {
    /// `Hello` sent with this nonce; waiting for the `Challenge`.
    Hello([u8; NONCE]),
    /// `Proof` sent; waiting for the `Welcome`.
    Proof([u8; NONCE], [u8; NONCE]),
    Done,
}

/// A connection to this rank's ring listener.
#[derive(Debug)]
struct Incoming {
    link: Link,
    /// `None` until its `Hello`; then its nonce and ours.
    nonces: Option<([u8; NONCE], [u8; NONCE])>,
    deadline: Deadline,
}

/// Binds this rank's ring listener on `ip` (the address its link to rank
/// 0 uses), on a port the system picks.
pub(crate) fn listen(ip: std::net::IpAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// Connects this rank to the next rank's listener at `next_addr` and admits
/// the previous rank on `listener`, both authenticated, in one bounded
/// loop: every rank connects and accepts at once, so no rank waits for one
/// that waits for it. Connections that do not prove they are the previous
/// rank of this job are dropped and counted
/// ([`Traffic::refused_connections`]).
pub(crate) fn connect(
    me: &Member<'_>,
    listener: &TcpListener,
    next_addr: SocketAddr,
    watch: Option<BorrowedFd<'_>>,
    step: Exchange,
    deadline: &Deadline,
    traffic: &mut Traffic,
) -> Result<Ring, SetupFailure> {
    let (rank, next, prev) = (me.rank, me.next(), me.prev());
    let fail = |culprit: usize, error| SetupFailure::Peer { culprit, error };
    let timeout = |peer: usize| {
        fail(
            peer,
            BootstrapError::Timeout {
                rank,
                step,
                waiting_for: vec![peer],
                after: deadline.timeout(),
            },
        )
    };
    let closed = |peer: usize| fail(peer, BootstrapError::PeerClosed { rank, step, peer });
    let unproven = |what: &'static str| {
        fail(
            next,
            BootstrapError::UnprovenPeer {
                rank,
                peer: next,
                addr: next_addr,
                what,
            },
        )
    };
    let io_err = |peer: usize, source: io::Error| {
        fail(
            peer,
            BootstrapError::Io {
                rank,
                step,
                peer: Some(peer),
                source,
            },
        )
    };
    let attempt = deadline.remaining().min(Duration::from_secs(5));
    if attempt.is_zero() {
        return Err(timeout(next));
    }
    // The next rank bound its listener before rank 0 handed its address
    // out, so the connection completes on its backlog at once.
    let stream = TcpStream::connect_timeout(&next_addr, attempt).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => timeout(next),
        _ => closed(next),
    })?;
    stream.set_nodelay(true).map_err(|e| io_err(next, e))?;
    let mut out_link = Link {
        stream,
        reader: FrameReader::default(),
    };
    let mine = random_nonce().map_err(|e| io_err(next, e))?;
    let hello = wire::frame(me.header(Kind::Hello, 0), &mine).unwrap_or_default();
    write_bounded(&mut out_link.stream, &hello, deadline).map_err(|_| closed(next))?;
    traffic.sent(hello.len());
    let mut out = Out::Hello(mine);
    let mut prev_link: Option<Link> = None;
    let mut pending: Vec<Option<Incoming>> = Vec::new();
    let refuse = |traffic: &mut Traffic| {
        traffic.refused_connections = traffic.refused_connections.saturating_add(1);
    };
    loop {
        if let (Out::Done, Some(_)) = (out, &prev_link) {
            break;
        }
        if deadline.passed() {
            return Err(timeout(if matches!(out, Out::Done) { prev } else { next }));
        }
        for slot in &mut pending {
            if slot.as_ref().is_some_and(|p| p.deadline.passed()) {
                *slot = None;
                refuse(traffic);
            }
        }
        pending.retain(Option::is_some);
        let mut roles: Vec<Role> = Vec::new();
        let ready = {
            let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
            if let Some(w) = watch {
                fds.push(w);
                roles.push(Role::Watch);
            }
            if !matches!(out, Out::Done) {
                fds.push(out_link.stream.as_fd());
                roles.push(Role::Out);
            }
            if prev_link.is_none() {
                fds.push(listener.as_fd());
                roles.push(Role::Listener);
            }
            for (j, p) in pending.iter().enumerate() {
                if let Some(p) = p {
                    fds.push(p.link.stream.as_fd());
                    roles.push(Role::Pending(j));
                }
            }
            let wake = pending
                .iter()
                .flatten()
                .map(|p| p.deadline.remaining())
                .fold(deadline.remaining(), Duration::min);
            wait_readable(&fds, &Deadline::after(wake)).map_err(|e| io_err(prev, e))?
        };
        for i in ready {
            match roles.get(i) {
                Some(Role::Watch) => return Err(SetupFailure::Watched),
                Some(Role::Out) => {
                    out =
                        step_out(me, &mut out_link, out, step, deadline, traffic).map_err(|e| {
                            match e {
                                OutError::Closed => closed(next),
                                OutError::Io(e) => io_err(next, e),
                                OutError::Unproven(what) => unproven(what),
                                OutError::Bad(e) => fail(next, e),
                            }
                        })?;
                }
                Some(Role::Listener) => {
                    accept_into(listener, me.job, &mut pending, deadline, traffic)
                }
                Some(&Role::Pending(j)) => {
                    if prev_link.is_some() {
                        continue;
                    }
                    let Some(slot) = pending.get_mut(j) else {
                        continue;
                    };
                    let Some(p) = slot.as_mut() else { continue };
                    match step_in(me, p, traffic) {
                        Ok(true) => {
                            prev_link = slot.take().map(|p| p.link);
                            // The previous rank is in: every other
                            // connection goes.
                            for other in pending.iter_mut().filter(|o| o.is_some()) {
                                *other = None;
                                refuse(traffic);
                            }
                        }
                        Ok(false) => {}
                        Err(()) => {
                            *slot = None;
                            refuse(traffic);
                        }
                    }
                }
                None => {}
            }
        }
    }
    let Some(prev_link) = prev_link else {
        return Err(timeout(prev));
    };
    for l in [&out_link, &prev_link] {
        l.stream
            .set_nonblocking(true)
            .map_err(|e| io_err(next, e))?;
    }
    Ok(Ring {
        next: out_link,
        prev: prev_link,
    })
}

/// What one descriptor of the setup's poll set is.
#[derive(Debug, Clone, Copy)]
enum Role {
    Watch,
    Out,
    Listener,
    Pending(usize),
}

enum OutError {
    Closed,
    Io(io::Error),
    Unproven(&'static str),
    Bad(BootstrapError),
}

/// The connecting side reads what the next rank sent and answers it.
fn step_out(
    me: &Member<'_>,
    link: &mut Link,
    out: Out,
    step: Exchange,
    deadline: &Deadline,
    traffic: &mut Traffic,
) -> Result<Out, OutError> {
    match link.reader.fill(&mut link.stream) {
        Ok(0) => return Err(OutError::Closed),
        Ok(_) => {}
        Err(e)
            if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock =>
        {
            return Ok(out);
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(OutError::Closed),
        Err(e) => return Err(OutError::Io(e)),
    }
    let (h, payload) = match link.reader.next(HELLO_MAX) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(out),
        Err(e) => {
            return Err(OutError::Bad(header_error(me.rank, step, me.next(), e)));
        }
    };
    traffic.received(wire::HEADER_LEN.saturating_add(payload.len()));
    let from_next = h.job == me.job
        && usize::try_from(h.from).is_ok_and(|f| f == me.next())
        && usize::try_from(h.size).is_ok_and(|s| s == me.size);
    match out {
        Out::Hello(mine) => {
            if h.kind != Kind::Challenge as u8 || !from_next || payload.len() != NONCE {
                return Err(OutError::Unproven("no challenge to the ring's hello"));
            }
            let mut theirs = [0u8; NONCE];
            theirs.copy_from_slice(&payload);
            let p = me
                .proof(FROM, me.rank, &mine, &theirs)
                .ok_or(OutError::Unproven("no MAC"))?;
            let bytes = wire::frame(me.header(Kind::Proof, 0), &p).unwrap_or_default();
            write_bounded(&mut link.stream, &bytes, deadline).map_err(|_| OutError::Closed)?;
            traffic.sent(bytes.len());
            Ok(Out::Proof(mine, theirs))
        }
        Out::Proof(mine, theirs) => {
            let want = me
                .proof(TO, me.rank, &mine, &theirs)
                .ok_or(OutError::Unproven("no MAC"))?;
            if h.kind != Kind::Welcome as u8 || !from_next || !constant_time_eq(&payload, &want) {
                return Err(OutError::Unproven(
                    "a welcome without a valid proof of the job secret",
                ));
            }
            Ok(Out::Done)
        }
        Out::Done => Ok(Out::Done),
    }
}

/// The accepting side: reads a pending connection's frame and answers it.
/// `Ok(true)` once it proved it is the previous rank; `Err` drops it.
fn step_in(me: &Member<'_>, p: &mut Incoming, traffic: &mut Traffic) -> Result<bool, ()> {
    match p.link.reader.fill(&mut p.link.stream) {
        Ok(0) => return Err(()),
        Ok(_) => {}
        Err(e)
            if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock =>
        {
            return Ok(false);
        }
        Err(_) => return Err(()),
    }
    let (h, payload) = match p.link.reader.next(HELLO_MAX) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(false),
        Err(_) => return Err(()),
    };
    traffic.received(wire::HEADER_LEN.saturating_add(payload.len()));
    let from_prev = h.job == me.job
        && usize::try_from(h.from).is_ok_and(|f| f == me.prev())
        && usize::try_from(h.size).is_ok_and(|s| s == me.size);
    if !from_prev {
        return Err(());
    }
    match p.nonces {
        None => {
            if h.kind != Kind::Hello as u8 || payload.len() != NONCE {
                return Err(());
            }
            let mut theirs = [0u8; NONCE];
            theirs.copy_from_slice(&payload);
            let mine = random_nonce().map_err(|_| ())?;
            let bytes = wire::frame(me.header(Kind::Challenge, 0), &mine).unwrap_or_default();
            write_bounded(&mut p.link.stream, &bytes, &p.deadline).map_err(|_| ())?;
            traffic.sent(bytes.len());
            p.nonces = Some((theirs, mine));
            Ok(false)
        }
        Some((theirs, mine)) => {
            let want = me.proof(FROM, me.prev(), &theirs, &mine).ok_or(())?;
            if h.kind != Kind::Proof as u8 || !constant_time_eq(&payload, &want) {
                return Err(());
            }
            let answer = me.proof(TO, me.prev(), &theirs, &mine).ok_or(())?;
            let bytes = wire::frame(me.header(Kind::Welcome, 0), &answer).unwrap_or_default();
            write_bounded(&mut p.link.stream, &bytes, &p.deadline).map_err(|_| ())?;
            traffic.sent(bytes.len());
            Ok(true)
        }
    }
}

/// Takes what the ring listener holds into `pending`, at most
/// [`PENDING_MAX`] (the oldest that proved least dropped first,
/// [`evict_index`]).
fn accept_into(
    listener: &TcpListener,
    job: u64,
    pending: &mut Vec<Option<Incoming>>,
    deadline: &Deadline,
    traffic: &mut Traffic,
) {
    let hello = wire::hello_prefix(job);
    for _ in 0..PENDING_MAX {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(false).is_err() || stream.set_nodelay(true).is_err() {
                    continue;
                }
                while pending.iter().flatten().count() >= PENDING_MAX {
                    match evict_index(pending, |p| p.nonces.is_none(), |p| &p.link, hello.as_ref())
                    {
                        Some(i) => {
                            pending[i] = None;
                            traffic.refused_connections =
                                traffic.refused_connections.saturating_add(1);
                        }
                        None => break,
                    }
                }
                pending.push(Some(Incoming {
                    link: Link {
                        stream,
                        reader: FrameReader::default(),
                    },
                    nonces: None,
                    deadline: Deadline::after(deadline.remaining().min(HELLO_BUDGET)),
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // Out of descriptors and the like: drop the oldest pending to
            // make room rather than spin on the listener.
            Err(_) => {
                if let Some(i) =
                    evict_index(pending, |p| p.nonces.is_none(), |p| &p.link, hello.as_ref())
                {
                    pending[i] = None;
                    traffic.refused_connections = traffic.refused_connections.saturating_add(1);
                }
                break;
            }
        }
    }
}

/// The ring allgather of step `step`: `n - 1` rounds; in each this rank
/// passes on the block it got last (its own first) and receives the next.
/// Sending and receiving interleave under one `poll`, so large blocks
/// cannot fill every socket buffer of the ring at once. On failure it
/// sends an abort naming the culprit to the next rank (best effort) and
/// returns the error; the ring is then unusable.
pub(crate) fn allgather(
    me: &Member<'_>,
    ring: &mut Ring,
    step: Exchange,
    mine: &[u8],
    deadline: &Deadline,
    traffic: &mut Traffic,
) -> Result<Vec<Vec<u8>>, BootstrapError> {
    let (rank, size, prev, next) = (me.rank, me.size, me.prev(), me.next());
    let mut all: Vec<Option<Vec<u8>>> = (0..size).map(|_| None).collect();
    all[rank] = Some(mine.to_vec());
    let mut queue: VecDeque<Vec<u8>> = VecDeque::new();
    // What of the front of `queue` is written.
    let mut written = 0usize;
    queue.push_back(block(me, step, rank, mine).map_err(|(_, e)| e)?);
    let mut received = 0usize;
    // This rank's error that a peer closed its link, or an I/O error
    // (`peer: None`: of the poll), and the rank each blames.
    let closed = |peer: usize| (peer, BootstrapError::PeerClosed { rank, step, peer });
    let failed = |culprit: usize, peer: Option<usize>, source: io::Error| {
        (
            culprit,
            BootstrapError::Io {
                rank,
                step,
                peer,
                source,
            },
        )
    };
    let result = (|| {
        loop {
            // Blocks already buffered first.
            while received + 1 < size {
                let origin = (rank + size - 1 - received) % size;
                let Some(data) = next_block(me, ring, step, origin, traffic)? else {
                    break;
                };
                received += 1;
                // The block of the next rank is the last one: it started
                // there and ends here.
                if received + 1 < size {
                    queue.push_back(block(me, step, origin, &data)?);
                }
                all[origin] = Some(data);
            }
            if received + 1 >= size && queue.is_empty() {
                return Ok(());
            }
            if deadline.passed() {
                let waiting = if received + 1 < size { prev } else { next };
                return Err((
                    waiting,
                    BootstrapError::Timeout {
                        rank,
                        step,
                        waiting_for: vec![waiting],
                        after: deadline.timeout(),
                    },
                ));
            }
            let (readable, writable) = {
                let want_in = received + 1 < size;
                let mut fds = Vec::with_capacity(2);
                if want_in {
                    fds.push(PollFd::from_borrowed_fd(
                        ring.prev.stream.as_fd(),
                        PollFlags::IN,
                    ));
                }
                if !queue.is_empty() {
                    fds.push(PollFd::from_borrowed_fd(
                        ring.next.stream.as_fd(),
                        PollFlags::OUT,
                    ));
                }
                let t = poll_timeout(deadline.remaining());
                match rustix::event::poll(&mut fds, Some(&t)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        return Err(failed(prev, None, e.into()));
                    }
                }
                let mut it = fds.iter();
                let r = want_in && it.next().is_some_and(|p| !p.revents().is_empty());
                let w = it.next().is_some_and(|p| !p.revents().is_empty());
                (r, w)
            };
            if writable && let Some(front) = queue.front() {
                match ring
                    .next
                    .stream
                    .write(front.get(written..).unwrap_or_default())
                {
                    Ok(n) => {
                        written = written.saturating_add(n);
                        if written >= front.len() {
                            traffic.sent(front.len());
                            queue.pop_front();
                            written = 0;
                        }
                    }
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if e.kind() == io::ErrorKind::BrokenPipe
                            || e.kind() == io::ErrorKind::ConnectionReset =>
                    {
                        return Err(closed(next));
                    }
                    Err(e) => {
                        return Err(failed(next, Some(next), e));
                    }
                }
            }
            if readable {
                match ring.prev.reader.fill(&mut ring.prev.stream) {
                    Ok(0) => {
                        return Err(closed(prev));
                    }
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        return Err(closed(prev));
                    }
                    Err(e) => {
                        return Err(failed(prev, Some(prev), e));
                    }
                }
            }
        }
    })();
    match result {
        Ok(()) => Ok(all.into_iter().map(Option::unwrap_or_default).collect()),
        Err((culprit, e)) => {
            // An abort that came round is passed on as it is; one of this
            // rank's own names its culprit.
            let (culprit, reason) = match &e {
                BootstrapError::Aborted {
                    culprit, reason, ..
                } => (*culprit, *reason),
                other => (culprit, other.abort_reason()),
            };
            let partial = queue
                .front()
                .and_then(|f| f.get(written..))
                .unwrap_or_default();
            pass_abort(me, ring, step, partial, culprit, reason, traffic);
            Err(e)
        }
    }
}

/// Finishes the frame half written to the next rank (so it stays in
/// step), then sends it an abort naming `culprit`, briefly bounded.
fn pass_abort(
    me: &Member<'_>,
    ring: &mut Ring,
    step: Exchange,
    partial: &[u8],
    culprit: usize,
    reason: AbortReason,
    traffic: &mut Traffic,
) {
    let Some(abort) = wire::frame(me.header(Kind::Abort, step.seq), &reason.encode(culprit)) else {
        return;
    };
    let mut bytes = partial.to_vec();
    bytes.extend_from_slice(&abort);
    let brief = Deadline::after(Duration::from_millis(100));
    if ring.next.stream.set_nonblocking(false).is_ok()
        && write_bounded(&mut ring.next.stream, &bytes, &brief).is_ok()
    {
        traffic.sent(abort.len());
    }
}

/// One block as it travels: the origin rank, then its bytes.
fn block(
    me: &Member<'_>,
    step: Exchange,
    origin: usize,
    data: &[u8],
) -> Result<Vec<u8>, (usize, BootstrapError)> {
    let mut payload = Vec::with_capacity(ORIGIN.saturating_add(data.len()));
    payload.extend_from_slice(&u32::try_from(origin).unwrap_or(u32::MAX).to_le_bytes());
    payload.extend_from_slice(data);
    wire::frame(me.header(Kind::RingBlock, step.seq), &payload).ok_or((
        me.rank,
        BootstrapError::InvalidArgument {
            rank: me.rank,
            step,
            what: super::error::Argument::TooLarge {
                len: data.len(),
                max: MAX_PAYLOAD - ORIGIN,
            },
        },
    ))
}

/// The next block from the previous rank, if one is buffered: stale frames
/// of an earlier step skipped, an abort of this step returned as
/// [`BootstrapError::Aborted`], anything else checked (job, size, sender,
/// step, type, origin).
fn next_block(
    me: &Member<'_>,
    ring: &mut Ring,
    step: Exchange,
    origin: usize,
    traffic: &mut Traffic,
) -> Result<Option<Vec<u8>>, (usize, BootstrapError)> {
    let (rank, prev) = (me.rank, me.prev());
    // The previous rank sent a frame that is not the one expected.
    let mismatch = |what: FrameMismatch| {
        (
            prev,
            BootstrapError::Mismatch {
                rank,
                step,
                peer: prev,
                what,
            },
        )
    };
    loop {
        let (h, payload) = match ring.prev.reader.next(MAX_PAYLOAD) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(None),
            Err(e) => return Err((prev, header_error(rank, step, prev, e))),
        };
        traffic.received(wire::HEADER_LEN.saturating_add(payload.len()));
        if h.job == me.job && h.seq < step.seq {
            traffic.stale_skipped = traffic.stale_skipped.saturating_add(1);
            continue;
        }
        if h.kind == Kind::Abort as u8 && h.job == me.job && h.seq == step.seq {
            let (reason, culprit) = AbortReason::decode(&payload);
            return Err((
                culprit,
                BootstrapError::Aborted {
                    rank,
                    step,
                    culprit,
                    reason,
                },
            ));
        }
        let exp = wire::expect(me.job, me.size, step, Kind::RingBlock, prev);
        if let Err(what) = exp.check(&h) {
            return Err(mismatch(what));
        }
        let Some((head, data)) = payload.split_first_chunk::<ORIGIN>() else {
            return Err((
                prev,
                BootstrapError::Malformed {
                    rank,
                    step,
                    peer: prev,
                    what: Malformed::Truncated,
                },
            ));
        };
        let theirs = u32::from_le_bytes(*head);
        if usize::try_from(theirs).ok() != Some(origin) {
            return Err(mismatch(FrameMismatch::Origin {
                expected: u32::try_from(origin).unwrap_or(u32::MAX),
                theirs,
            }));
        }
        return Ok(Some(data.to_vec()));
    }
}

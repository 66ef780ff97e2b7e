//! [`Tcp`]: the TCP backend with a unique id, as NCCL's bootstrap.
//!
//! Rank 0 binds a listener ([`Tcp::root`]) and publishes the [`UniqueId`]
//! (address, job id, job secret) out of band; ranks `1..n` [`Tcp::join`] with
//! it, retrying the connection until their timeout; rank 0 admits them
//! ([`TcpRoot::accept`]). The join is a mutual challenge-response: the
//! joining rank sends a fresh nonce (`Hello`), rank 0 answers with its own
//! (`Challenge`), the rank proves it knows the job secret with an
//! HMAC-SHA-256 over both nonces, the job, its rank and the size (`Proof`,
//! compared in constant time), and rank 0's `Welcome` carries rank 0's
//! own proof, which the rank checks before it believes anything else rank 0
//! says: a process that squats rank 0's address without the secret gets
//! no secret and fails the join at once with [`BootstrapError::Impostor`].
//! Rank 0 holds at most `size + 64` connections that have not finished
//! their join (to make room, those that sent nothing go first, then those
//! whose hello did not arrive, oldest first: a flood that only knows the
//! port never pushes out a rank that said hello), gives each one deadline for its
//! whole hello, and answers running out of descriptors (`EMFILE`) by
//! dropping the oldest of them rather than by polling again; a joining
//! rank whose connection rank 0 dropped connects again within its timeout.
//!
//! Broadcasts and barriers go through rank 0 (a broadcast `n-1` messages of
//! the payload, a barrier `2(n-1)`: linear in `n`). The allgather of three
//! ranks or more runs on a ring among the ranks, as NCCL's bootstrap
//! ([`ring`](super::ring)): every rank, rank 0 included, sends `n-1`
//! blocks of one contribution each, so no rank's messages or bytes grow
//! faster than `n` (the star had rank 0 send `n-1` results of `n`
//! contributions). The first allgather sets the ring up through rank 0
//! (`2(n-1)` small messages at rank 0, two at the others), and the ring's
//! links are authenticated as the join is. [`Bootstrap::traffic`] counts
//! every frame.
//!
//! Frames are length-prefixed (see the wire format) with a hard maximum;
//! rank 0 waits on all its peers at once with `poll(2)`, so a timeout names
//! every rank that had not answered. When a peer fails mid-collective (closed,
//! killed, hostile bytes), rank 0 closes that connection and sends the others
//! an abort naming the culprit, so every rank gets a typed error at once
//! instead of a timeout; a join it refuses aborts every other connection
//! the same way. Stale frames of an earlier, timed-out step are
//! skipped. No thread is started; dropping a [`Tcp`] closes its sockets.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

use super::api::{Bootstrap, Deadline, Traffic};
use super::error::{AbortReason, Argument, BootstrapError, Exchange, FrameMismatch, Op, Refusal};
use super::ring::{self, Member, Ring, SetupFailure};
use super::unique_id::UniqueId;
use super::wire::{self, Expect, FrameReader, Header, HeaderError, Kind, MAX_PAYLOAD};

pub(crate) const HELLO_MAX: usize = 64;

/// The TCP bootstrap of one rank.
#[derive(Debug)]
pub struct Tcp {
    rank: usize,
    size: usize,
    job: u64,
    /// The job secret, which the ring's links prove (see [`ring`](super::ring)).
    secret: Secret,
    inner: Mutex<Inner>,
}

/// The job secret, kept out of `Debug` output (as [`UniqueId`]'s).
struct Secret([u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug)]
struct Inner {
    seq: u64,
    /// Rank 0: one link per rank (`None` for itself and for closed links);
    /// other ranks: index 0 is the link to rank 0.
    links: Vec<Option<Link>>,
    traffic: Traffic,
    /// The ring the allgather runs on (three ranks or more).
    ring: RingState,
}

/// The allgather ring of a [`Tcp`] of three ranks or more.
#[derive(Debug)]
enum RingState {
    /// Not set up yet: the first allgather sets it up.
    Down,
    Up(Ring),
    /// A ring allgather failed and left a link out of step: later
    /// allgathers fail with [`BootstrapError::Broken`] naming the rank it
    /// blamed.
    Broken(usize),
}

#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) stream: TcpStream,
    pub(crate) reader: FrameReader,
}

/// A connection rank 0 accepted but has not admitted.
#[derive(Debug)]
struct Pending {
    link: Link,
    phase: Phase,
    /// One deadline for the whole hello, from the accept.
    deadline: Deadline,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for the `Hello`.
    Hello,
    /// Challenged; waiting for the `Proof`.
    Proof {
        hello: Header,
        joiner: [u8; NONCE],
        root: [u8; NONCE],
    },
}

/// Connections rank 0 holds beyond the ranks still to join.
const PENDING_SLACK: usize = 64;
/// The most connections rank 0 holds unadmitted, whatever the size.
const PENDING_MAX: usize = 4096;
/// The time a connection has for its whole hello (hello, proof), from its
/// accept: generous for a loaded machine, short for an idle squatter.
const HELLO_BUDGET: Duration = Duration::from_secs(10);

/// Rank 0's listener between [`Tcp::root`] and [`TcpRoot::accept`].
#[derive(Debug)]
pub struct TcpRoot {
    listener: TcpListener,
    id: UniqueId,
}

pub(crate) fn poll_timeout(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Waits until one of `fds` is readable (or hung up) or the deadline passes;
/// returns the readable indices.
pub(crate) fn wait_readable(
    fds: &[std::os::fd::BorrowedFd<'_>],
    deadline: &Deadline,
) -> io::Result<Vec<usize>> {
    loop {
        let mut pfds: Vec<PollFd<'_>> = fds
            .iter()
            .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
            .collect();
        let t = poll_timeout(deadline.remaining());
        match rustix::event::poll(&mut pfds, Some(&t)) {
            Ok(_) => {
                let ready = pfds
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| !p.revents().is_empty())
                    .map(|(i, _)| i)
                    .collect();
                return Ok(ready);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Rank 0's listener, when a launcher bound it and handed it down
/// ([`LISTEN_FD_ENV`](super::LISTEN_FD_ENV)): `None` without the variable.
/// Taken once per process, and only a listening TCP socket bound to the
/// id's address; it is close-on-exec again once taken.
fn inherited_listener(id: &UniqueId) -> Option<Result<TcpListener, BootstrapError>> {
    use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let text = std::env::var(super::LISTEN_FD_ENV).ok()?;
    let refuse = |why| BootstrapError::InvalidId {
        what: super::error::IdProblem::Listener { why },
    };
    Some((|| {
        let raw: i32 = text
            .trim()
            .parse()
            .map_err(|_| refuse("not a descriptor number"))?;
        if raw < 3 {
            return Err(refuse("a standard stream's number"));
        }
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Err(refuse("already taken by this process"));
        }
        // SAFETY: `raw` is checked only through calls that answer EBADF for
        // a number that is not open; the borrow ends before anything else in
        // this process could close or reuse it (the variable names a
        // descriptor the launcher left open for this process, taken once).
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        let listening = rustix::net::sockopt::socket_acceptconn(fd)
            .map_err(|_| refuse("not an open socket"))?;
        let local = rustix::net::getsockname(fd).map_err(|_| refuse("not an open socket"))?;
        let bound = SocketAddr::try_from(local).ok();
        if !listening || bound != Some(id.addr) {
            return Err(refuse(
                "not a TCP socket listening on the unique id's address",
            ));
        }
        // SAFETY: an open listening socket that nothing else in this process
        // owns: the launcher handed it to this process alone, and `TAKEN`
        // makes this the one owner.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
            .map_err(|_| refuse("its flags cannot be set"))?;
        Ok(TcpListener::from(owned))
    })())
}

impl Tcp {
    /// Rank 0: binds `bind_addr` (port 0 picks a free one) and makes the
    /// job's unique id. Publish the id (environment, file), then call
    /// [`TcpRoot::accept`].
    ///
    /// # Errors
    /// [`Argument::UnspecifiedAddress`] for `0.0.0.0`/`::` (use
    /// [`Tcp::root_advertising`]); the OS's bind errors.
    pub fn root(bind_addr: SocketAddr) -> Result<(UniqueId, TcpRoot), BootstrapError> {
        if bind_addr.ip().is_unspecified() {
            return Err(BootstrapError::InvalidArgument {
                rank: 0,
                step: JOIN,
                what: Argument::UnspecifiedAddress,
            });
        }
        Self::root_advertising(bind_addr, bind_addr.ip())
    }

    /// Rank 0: binds `bind_addr` (e.g. `0.0.0.0:0`) and puts `advertise`
    /// (the address peers reach rank 0 at) with the bound port in the id.
    ///
    /// # Errors
    /// The OS's bind errors.
    pub fn root_advertising(
        bind_addr: SocketAddr,
        advertise: std::net::IpAddr,
    ) -> Result<(UniqueId, TcpRoot), BootstrapError> {
        let io = |source| BootstrapError::Io {
            rank: 0,
            step: JOIN,
            peer: None,
            source,
        };
        let listener = TcpListener::bind(bind_addr).map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        let id = UniqueId::random(SocketAddr::new(advertise, port)).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        Ok((id.clone(), TcpRoot { listener, id }))
    }

    /// The bootstrap of this rank of a job started by a launcher
    /// (`cuda-endpoints-fabric -n N -- ./app`): reads the rank
    /// ([`RANK_ENV`](crate::RANK_ENV)), the size ([`SIZE_ENV`](crate::SIZE_ENV))
    /// and the unique id ([`UNIQUE_ID_ENV`](crate::UNIQUE_ID_ENV)); rank 0
    /// listens on the id's address and admits the others, which join. Every
    /// step within `timeout`. Rank 0 takes the listener the launcher bound
    /// and handed down ([`LISTEN_FD_ENV`](crate::LISTEN_FD_ENV)), so no
    /// other process can take the port first; without that variable it
    /// binds the id's address itself.
    ///
    /// # Errors
    /// [`BootstrapError::InvalidId`] for a variable unset or unparsable;
    /// those of [`Tcp::root`], [`TcpRoot::accept`] and [`Tcp::join`].
    pub fn from_env(timeout: Duration) -> Result<Tcp, BootstrapError> {
        use super::error::IdProblem;
        let number = |var: &'static str| {
            let v = std::env::var(var).map_err(|_| BootstrapError::InvalidId {
                what: IdProblem::Unset { var },
            })?;
            v.trim()
                .parse::<usize>()
                .map_err(|_| BootstrapError::InvalidId {
                    what: IdProblem::Syntax { part: var },
                })
        };
        let (rank, size) = (number(super::RANK_ENV)?, number(super::SIZE_ENV)?);
        let id = UniqueId::from_env()?;
        if rank >= size {
            return Err(BootstrapError::InvalidArgument {
                rank,
                step: JOIN,
                what: Argument::RankOutOfRange { rank, size },
            });
        }
        if rank != 0 {
            return Tcp::join(&id, rank, size, timeout);
        }
        let io = |source| BootstrapError::Io {
            rank: 0,
            step: JOIN,
            peer: None,
            source,
        };
        let listener = match inherited_listener(&id) {
            Some(l) => l?,
            None => TcpListener::bind(id.addr).map_err(io)?,
        };
        listener.set_nonblocking(true).map_err(io)?;
        TcpRoot { listener, id }.accept(size, timeout)
    }

    /// Ranks `1..size`: connects to rank 0 (retrying until `timeout`) and
    /// joins the job of `id`.
    ///
    /// # Errors
    /// [`BootstrapError::Timeout`] (rank 0 not reachable in time),
    /// [`BootstrapError::Refused`] (wrong secret, rank taken or out of
    /// range, other size), [`BootstrapError::Aborted`] (rank 0 refused
    /// another rank first, [`AbortReason::JoinRefused`]),
    /// [`BootstrapError::InvalidArgument`] for rank 0 or a rank out of range.
    pub fn join(
        id: &UniqueId,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<Tcp, BootstrapError> {
        let invalid = |what| {
            Err(BootstrapError::InvalidArgument {
                rank,
                step: JOIN,
                what,
            })
        };
        if rank == 0 {
            return invalid(Argument::JoinAsRoot);
        }
        if rank >= size {
            return invalid(Argument::RankOutOfRange { rank, size });
        }
        let (Ok(rank32), Ok(size32)) = (u32::try_from(rank), u32::try_from(size)) else {
            return invalid(Argument::RankOutOfRange { rank, size });
        };
        let deadline = Deadline::after(timeout);
        let timed_out = || BootstrapError::Timeout {
            rank,
            step: JOIN,
            waiting_for: vec![0],
            after: timeout,
        };
        // Connect and authenticate, retrying with backoff: rank 0 may not
        // listen yet, or may have dropped this connection while idle peers
        // pressed on it (its pending connections are bounded).
        let mut backoff = Duration::from_millis(2);
        let (link, traffic) = loop {
            let attempt = deadline.remaining().min(Duration::from_secs(1));
            if attempt.is_zero() {
                return Err(timed_out());
            }
            let stream = match TcpStream::connect_timeout(&id.addr, attempt) {
                Ok(s) => s,
                Err(_) if !deadline.passed() => {
                    std::thread::sleep(backoff.min(deadline.remaining()));
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                    continue;
                }
                Err(_) => return Err(timed_out()),
            };
            match handshake(stream, id, rank32, size32, &deadline, timeout) {
                Ok(done) => break done,
                Err(BootstrapError::PeerClosed { .. }) if !deadline.passed() => {
                    std::thread::sleep(backoff.min(deadline.remaining()));
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                Err(BootstrapError::PeerClosed { .. }) => return Err(timed_out()),
                Err(e) => return Err(e),
            }
        };
        Ok(Tcp {
            rank,
            size,
            job: id.job,
            secret: Secret(id.secret),
            inner: Mutex::new(Inner {
                seq: 0,
                links: vec![Some(link)],
                traffic,
                ring: RingState::Down,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn header(&self, kind: Kind, seq: u64) -> Header {
        Header::new(kind, self.job, seq, self.rank, self.size)
    }

    fn expect(&self, kind: Kind, op: Op, seq: u64, from: usize) -> Expect {
        Expect {
            job: self.job,
            size: u32::try_from(self.size).unwrap_or(u32::MAX),
            seq,
            kind,
            op,
            from: u32::try_from(from).unwrap_or(u32::MAX),
        }
    }

    fn frame_or_too_large(
        &self,
        step: Exchange,
        h: Header,
        payload: &[u8],
    ) -> Result<Vec<u8>, BootstrapError> {
        wire::frame(h, payload).ok_or(BootstrapError::InvalidArgument {
            rank: self.rank,
            step,
            what: Argument::TooLarge {
                len: payload.len(),
                max: MAX_PAYLOAD,
            },
        })
    }

    /// Sends one frame to `peer`; a failed or partial write closes the link.
    fn send(
        &self,
        inner: &mut Inner,
        step: Exchange,
        peer: usize,
        bytes: &[u8],
        deadline: &Deadline,
    ) -> Result<(), BootstrapError> {
        let slot = if self.rank == 0 { peer } else { 0 };
        let Some(link) = inner.links.get_mut(slot).and_then(Option::as_mut) else {
            return Err(BootstrapError::Broken {
                rank: self.rank,
                step,
                peer,
            });
        };
        match write_bounded(&mut link.stream, bytes, deadline) {
            Ok(()) => {
                inner.traffic.sent(bytes.len());
                Ok(())
            }
            Err(e) => {
                inner.links[slot] = None;
                Err(match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        BootstrapError::Timeout {
                            rank: self.rank,
                            step,
                            waiting_for: vec![peer],
                            after: deadline.timeout(),
                        }
                    }
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                        BootstrapError::PeerClosed {
                            rank: self.rank,
                            step,
                            peer,
                        }
                    }
                    _ => BootstrapError::Io {
                        rank: self.rank,
                        step,
                        peer: Some(peer),
                        source: e,
                    },
                })
            }
        }
    }

    /// Rank 0 after an error on `culprit`'s link: closes it and tells every
    /// other peer (best effort, briefly bounded).
    fn abort_all(&self, inner: &mut Inner, step: Exchange, culprit: usize, reason: AbortReason) {
        // A slow peer's stream is still in sync (its late frame will be
        // skipped as stale); any other failure leaves it unusable.
        if reason != AbortReason::Timeout
            && let Some(slot) = inner.links.get_mut(culprit)
        {
            *slot = None;
        }
        let payload = reason.encode(culprit);
        let bytes = wire::frame(self.header(Kind::Abort, step.seq), &payload).unwrap_or_default();
        let brief = Deadline::after(Duration::from_millis(100));
        for peer in 1..self.size {
            if peer != culprit && inner.links.get(peer).is_some_and(Option::is_some) {
                let _ = self.send(inner, step, peer, &bytes, &brief);
            }
        }
    }

    /// Rank 0: receives one frame of `kind` at this step from each of `from`.
    fn gather_at_root(
        &self,
        inner: &mut Inner,
        step: Exchange,
        kind: Kind,
        from: &[usize],
        deadline: &Deadline,
    ) -> Result<Vec<(usize, Vec<u8>)>, BootstrapError> {
        let rank = self.rank;
        let mut got: Vec<(usize, Vec<u8>)> = Vec::with_capacity(from.len());
        let mut missing: Vec<usize> = from.to_vec();
        let result = (|| {
            // A peer whose link is already closed fails the step at once.
            if let Some(&peer) = missing
                .iter()
                .find(|&&p| inner.links.get(p).is_none_or(Option::is_none))
            {
                return Err((peer, BootstrapError::Broken { rank, step, peer }));
            }
            loop {
                // Frames already buffered first.
                let mut i = 0;
                while i < missing.len() {
                    let peer = missing[i];
                    let exp = self.expect(kind, step.op, step.seq, peer);
                    match self.next_frame(inner, peer, step, &exp)? {
                        Some(payload) => {
                            got.push((peer, payload));
                            missing.swap_remove(i);
                        }
                        None => i += 1,
                    }
                }
                if missing.is_empty() {
                    return Ok(());
                }
                if deadline.passed() {
                    missing.sort_unstable();
                    // The others learn the culprit instead of timing out too.
                    let culprit = missing.first().copied().unwrap_or(usize::MAX);
                    return Err((
                        culprit,
                        BootstrapError::Timeout {
                            rank,
                            step,
                            waiting_for: missing.clone(),
                            after: deadline.timeout(),
                        },
                    ));
                }
                let ready = {
                    let fds: Vec<_> = missing
                        .iter()
                        .filter_map(|&p| {
                            inner
                                .links
                                .get(p)
                                .and_then(Option::as_ref)
                                .map(|l| l.stream.as_fd())
                        })
                        .collect();
                    wait_readable(&fds, deadline).map_err(|e| {
                        (
                            usize::MAX,
                            BootstrapError::Io {
                                rank,
                                step,
                                peer: None,
                                source: e,
                            },
                        )
                    })?
                };
                let peers: Vec<usize> = ready
                    .iter()
                    .filter_map(|&i| missing.get(i).copied())
                    .collect();
                for peer in peers {
                    let Some(link) = inner.links.get_mut(peer).and_then(Option::as_mut) else {
                        continue;
                    };
                    match link.reader.fill(&mut link.stream) {
                        Ok(0) => {
                            return Err((peer, BootstrapError::PeerClosed { rank, step, peer }));
                        }
                        Ok(_) => {}
                        Err(e)
                            if e.kind() == io::ErrorKind::Interrupted
                                || e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                            return Err((peer, BootstrapError::PeerClosed { rank, step, peer }));
                        }
                        Err(e) => {
                            return Err((
                                peer,
                                BootstrapError::Io {
                                    rank,
                                    step,
                                    peer: Some(peer),
                                    source: e,
                                },
                            ));
                        }
                    }
                }
            }
        })();
        match result {
            Ok(()) => {
                got.sort_by_key(|(p, _)| *p);
                Ok(got)
            }
            Err((culprit, e)) => {
                if culprit != usize::MAX {
                    self.abort_all(inner, step, culprit, e.abort_reason());
                }
                Err(e)
            }
        }
    }

    /// The next frame of this step from `peer`'s buffer, skipping stale ones.
    /// Errors carry the culprit for [`Tcp::abort_all`].
    fn next_frame(
        &self,
        inner: &mut Inner,
        peer: usize,
        step: Exchange,
        exp: &Expect,
    ) -> Result<Option<Vec<u8>>, (usize, BootstrapError)> {
        let rank = self.rank;
        let slot = if rank == 0 { peer } else { 0 };
        loop {
            let Some(link) = inner.links.get_mut(slot).and_then(Option::as_mut) else {
                return Err((peer, BootstrapError::Broken { rank, step, peer }));
            };
            let (h, payload) = match link.reader.next(MAX_PAYLOAD) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(None),
                Err(e) => return Err((peer, header_error(rank, step, peer, e))),
            };
            inner
                .traffic
                .received(wire::HEADER_LEN.saturating_add(payload.len()));
            if h.job == exp.job && h.seq < exp.seq {
                inner.traffic.stale_skipped = inner.traffic.stale_skipped.saturating_add(1);
                continue;
            }
            if rank != 0 && h.kind == Kind::Abort as u8 && h.job == exp.job && h.seq == exp.seq {
                let (reason, culprit) = AbortReason::decode(&payload);
                return Err((
                    peer,
                    BootstrapError::Aborted {
                        rank,
                        step,
                        culprit,
                        reason,
                    },
                ));
            }
            if let Err(what) = exp.check(&h) {
                return Err((
                    peer,
                    BootstrapError::Mismatch {
                        rank,
                        step,
                        peer,
                        what,
                    },
                ));
            }
            return Ok(Some(payload));
        }
    }

    /// Ranks other than 0: receives the frame of `kind` at this step from rank 0.
    fn recv_from_root(
        &self,
        inner: &mut Inner,
        step: Exchange,
        kind: Kind,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, BootstrapError> {
        let rank = self.rank;
        let exp = self.expect(kind, step.op, step.seq, 0);
        let result = (|| loop {
            if let Some(p) = self.next_frame(inner, 0, step, &exp).map_err(|(_, e)| e)? {
                return Ok(p);
            }
            if deadline.passed() {
                return Err(BootstrapError::Timeout {
                    rank,
                    step,
                    waiting_for: vec![0],
                    after: deadline.timeout(),
                });
            }
            let Some(link) = inner.links.get_mut(0).and_then(Option::as_mut) else {
                return Err(BootstrapError::Broken {
                    rank,
                    step,
                    peer: 0,
                });
            };
            let ready = wait_readable(&[link.stream.as_fd()], deadline).map_err(|e| {
                BootstrapError::Io {
                    rank,
                    step,
                    peer: Some(0),
                    source: e,
                }
            })?;
            if ready.is_empty() {
                continue;
            }
            match link.reader.fill(&mut link.stream) {
                Ok(0) => {
                    return Err(BootstrapError::PeerClosed {
                        rank,
                        step,
                        peer: 0,
                    });
                }
                Ok(_) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(BootstrapError::PeerClosed {
                        rank,
                        step,
                        peer: 0,
                    });
                }
                Err(e) => {
                    return Err(BootstrapError::Io {
                        rank,
                        step,
                        peer: Some(0),
                        source: e,
                    });
                }
            }
        })();
        // Anything but a timeout or an abort leaves the stream unusable.
        if let Err(e) = &result
            && !matches!(
                e,
                BootstrapError::Timeout { .. } | BootstrapError::Aborted { .. }
            )
        {
            inner.links[0] = None;
        }
        result
    }

    fn member(&self) -> Member<'_> {
        Member {
            secret: &self.secret.0,
            job: self.job,
            rank: self.rank,
            size: self.size,
        }
    }

    /// The allgather of three ranks or more, on the ring (set up by the
    /// first one).
    fn ring_allgather(
        &self,
        inner: &mut Inner,
        step: Exchange,
        mine: &[u8],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        if matches!(inner.ring, RingState::Down) {
            let r = self.ring_up(inner, step, deadline)?;
            inner.ring = RingState::Up(r);
        }
        let me = self.member();
        let Inner { ring, traffic, .. } = inner;
        match ring {
            RingState::Up(r) => {
                let got = ring::allgather(&me, r, step, mine, deadline, traffic);
                if let Err(e) = &got {
                    // Later allgathers name the rank this one blamed.
                    let blamed = match e {
                        BootstrapError::PeerClosed { peer, .. }
                        | BootstrapError::Broken { peer, .. }
                        | BootstrapError::Malformed { peer, .. }
                        | BootstrapError::Mismatch { peer, .. }
                        | BootstrapError::Oversized { peer, .. } => *peer,
                        BootstrapError::Aborted { culprit, .. } => *culprit,
                        BootstrapError::Timeout { waiting_for, .. } => {
                            waiting_for.first().copied().unwrap_or(self.rank)
                        }
                        _ => self.rank,
                    };
                    *ring = RingState::Broken(blamed);
                }
                got
            }
            RingState::Broken(peer) => Err(BootstrapError::Broken {
                rank: self.rank,
                step,
                peer: *peer,
            }),
            RingState::Down => Err(BootstrapError::Broken {
                rank: self.rank,
                step,
                peer: self.rank,
            }),
        }
    }

    /// Sets up the ring through rank 0, in the first allgather's step:
    /// every rank binds a listener and sends its address to rank 0
    /// (`RingAddr`), rank 0 sends each rank the address of the next
    /// (`RingNext`), every rank connects and authenticates both its links
    /// and reports (`RingReady`: empty, or the abort of its failure), and
    /// rank 0 lets them go (`RingGo`) or aborts every rank naming the
    /// culprit. Rank 0 sends and receives `2(n - 1)` small messages each
    /// way, every other rank two.
    fn ring_up(
        &self,
        inner: &mut Inner,
        step: Exchange,
        deadline: &Deadline,
    ) -> Result<Ring, BootstrapError> {
        let rank = self.rank;
        let me = self.member();
        let io = |peer: Option<usize>, source| BootstrapError::Io {
            rank,
            step,
            peer,
            source,
        };
        // The ring listens on the address this rank reaches rank 0 from.
        let towards_root = if rank == 0 { 1 } else { 0 };
        let ip = inner
            .links
            .get(towards_root)
            .and_then(Option::as_ref)
            .map(|l| l.stream.local_addr())
            .ok_or(BootstrapError::Broken {
                rank,
                step,
                peer: if rank == 0 { 1 } else { 0 },
            })?
            .map_err(|e| io(None, e))?
            .ip();
        let (listener, addr) = ring::listen(ip).map_err(|e| io(None, e))?;
        let addr_bytes = addr.to_string().into_bytes();
        let parse = |peer: usize, p: &[u8]| {
            std::str::from_utf8(p)
                .ok()
                .filter(|_| p.len() <= HELLO_MAX)
                .and_then(|t| t.parse::<SocketAddr>().ok())
                .ok_or(BootstrapError::Malformed {
                    rank,
                    step,
                    peer,
                    what: super::error::Malformed::Encoding,
                })
        };
        if rank == 0 {
            let from: Vec<usize> = (1..self.size).collect();
            let got = self.gather_at_root(inner, step, Kind::RingAddr, &from, deadline)?;
            let mut addrs = vec![addr];
            for (peer, p) in got {
                match parse(peer, &p) {
                    Ok(a) => addrs.push(a),
                    Err(e) => {
                        self.abort_all(inner, step, peer, AbortReason::BadMessage);
                        return Err(e);
                    }
                }
            }
            for peer in 1..self.size {
                let next = addrs[(peer + 1) % self.size].to_string().into_bytes();
                let bytes =
                    self.frame_or_too_large(step, self.header(Kind::RingNext, step.seq), &next)?;
                if let Err(e) = self.send(inner, step, peer, &bytes, deadline) {
                    self.abort_all(inner, step, peer, e.abort_reason());
                    return Err(e);
                }
            }
            let r = match ring::connect(
                &me,
                &listener,
                addrs[1],
                None,
                step,
                deadline,
                &mut inner.traffic,
            ) {
                Ok(r) => r,
                Err(SetupFailure::Peer { culprit, error }) => {
                    self.abort_all(inner, step, culprit, error.abort_reason());
                    return Err(error);
                }
                Err(SetupFailure::Watched) => {
                    return Err(BootstrapError::Broken {
                        rank,
                        step,
                        peer: 1,
                    });
                }
            };
            drop(listener);
            let reports = self.gather_at_root(inner, step, Kind::RingReady, &from, deadline)?;
            if let Some((_, p)) = reports.iter().find(|(_, p)| !p.is_empty()) {
                let (reason, culprit) = AbortReason::decode(p);
                self.abort_all(inner, step, culprit, reason);
                return Err(BootstrapError::Aborted {
                    rank,
                    step,
                    culprit,
                    reason,
                });
            }
            let bytes = wire::frame(self.header(Kind::RingGo, step.seq), &[]).unwrap_or_default();
            self.send_to_all(inner, step, &bytes, usize::MAX, deadline)?;
            Ok(r)
        } else {
            let bytes =
                self.frame_or_too_large(step, self.header(Kind::RingAddr, step.seq), &addr_bytes)?;
            self.send(inner, step, 0, &bytes, deadline)?;
            let next = self.recv_from_root(inner, step, Kind::RingNext, deadline)?;
            let next = parse(0, &next).inspect_err(|_| inner.links[0] = None)?;
            let connected = {
                let Inner { links, traffic, .. } = &mut *inner;
                let watch = links
                    .first()
                    .and_then(Option::as_ref)
                    .map(|l| l.stream.as_fd());
                ring::connect(&me, &listener, next, watch, step, deadline, traffic)
            };
            drop(listener);
            let report = match &connected {
                Ok(_) => Vec::new(),
                Err(SetupFailure::Peer { culprit, error }) => error.abort_reason().encode(*culprit),
                // Rank 0 spoke first: what it said is read below.
                Err(SetupFailure::Watched) => Vec::new(),
            };
            if !matches!(connected, Err(SetupFailure::Watched)) {
                let bytes =
                    self.frame_or_too_large(step, self.header(Kind::RingReady, step.seq), &report)?;
                self.send(inner, step, 0, &bytes, deadline)?;
            }
            if let Err(SetupFailure::Peer { error, .. }) = connected {
                return Err(error);
            }
            // An abort from rank 0 ends the setup here.
            self.recv_from_root(inner, step, Kind::RingGo, deadline)?;
            match connected {
                Ok(r) => Ok(r),
                // `RingGo` before this rank reported: rank 0 is not following
                // the protocol.
                Err(_) => {
                    inner.links[0] = None;
                    Err(BootstrapError::Mismatch {
                        rank,
                        step,
                        peer: 0,
                        what: FrameMismatch::Operation {
                            ours: Op::Allgather,
                            theirs: Kind::RingGo as u8,
                        },
                    })
                }
            }
        }
    }

    fn next_step(&self, inner: &mut Inner, op: Op) -> Exchange {
        let seq = inner.seq;
        inner.seq = inner.seq.wrapping_add(1);
        Exchange { op, seq }
    }

    fn send_to_all(
        &self,
        inner: &mut Inner,
        step: Exchange,
        bytes: &[u8],
        except: usize,
        deadline: &Deadline,
    ) -> Result<(), BootstrapError> {
        for peer in 1..self.size {
            if peer != except
                && let Err(e) = self.send(inner, step, peer, bytes, deadline)
            {
                self.abort_all(inner, step, peer, e.abort_reason());
                return Err(e);
            }
        }
        Ok(())
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Bytes of each side's nonce in the join.
pub(crate) const NONCE: usize = 16;
/// Bytes of an HMAC-SHA-256 proof.
pub(crate) const PROOF: usize = 32;

/// The proof that one side of a join knows the job secret: HMAC-SHA-256
/// keyed by the secret over a label naming the side (so neither proof can
/// be reflected as the other), the job, the joining rank, the size and
/// both fresh nonces. `None` only if the MAC refuses the key, which
/// HMAC never does.
pub(crate) fn proof(
    secret: &[u8],
    job: u64,
    label: &[u8],
    rank: u32,
    size: u32,
    joiner: &[u8],
    root: &[u8],
) -> Option<[u8; PROOF]> {
    use hmac::Mac;
    let mut m = <HmacSha256 as Mac>::new_from_slice(secret).ok()?;
    m.update(b"cuda-endpoints bootstrap join v2 ");
    m.update(label);
    m.update(&job.to_le_bytes());
    m.update(&rank.to_le_bytes());
    m.update(&size.to_le_bytes());
    m.update(joiner);
    m.update(root);
    let mut out = [0u8; PROOF];
    out.copy_from_slice(&m.finalize().into_bytes());
    Some(out)
}

const JOINER: &[u8] = b"rank";
const ROOT: &[u8] = b"root";

/// The join's handshake on a connected stream: `Hello` (this rank's
/// nonce), rank 0's `Challenge` (its nonce), this rank's `Proof`, rank 0's
/// `Welcome` carrying its own proof, checked before anything else rank 0
/// says is believed. [`BootstrapError::PeerClosed`] means rank 0 closed
/// the connection before answering (the caller retries).
fn handshake(
    stream: TcpStream,
    id: &UniqueId,
    rank32: u32,
    size32: u32,
    deadline: &Deadline,
    timeout: Duration,
) -> Result<(Link, Traffic), BootstrapError> {
    let rank = usize::try_from(rank32).unwrap_or(usize::MAX);
    let io = |source| BootstrapError::Io {
        rank,
        step: JOIN,
        peer: Some(0),
        source,
    };
    let timed_out = || BootstrapError::Timeout {
        rank,
        step: JOIN,
        waiting_for: vec![0],
        after: timeout,
    };
    let impostor = |what| BootstrapError::Impostor {
        rank,
        addr: id.addr,
        what,
    };
    stream.set_nodelay(true).map_err(io)?;
    let mut link = Link {
        stream,
        reader: FrameReader::default(),
    };
    let mut traffic = Traffic::default();
    let header = |kind: Kind| Header {
        kind: kind as u8,
        job: id.job,
        seq: 0,
        from: rank32,
        size: size32,
        len: 0,
    };
    let send = |link: &mut Link, traffic: &mut Traffic, bytes: &[u8]| {
        write_bounded(&mut link.stream, bytes, deadline).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                BootstrapError::PeerClosed {
                    rank,
                    step: JOIN,
                    peer: 0,
                }
            }
            _ => io(e),
        })?;
        traffic.sent(bytes.len());
        Ok::<(), BootstrapError>(())
    };
    let mine = random_nonce().map_err(io)?;
    let hello = wire::frame(header(Kind::Hello), &mine).unwrap_or_default();
    send(&mut link, &mut traffic, &hello)?;
    // Rank 0's refusals and aborts are believed unauthenticated: they can
    // only end this join, never make it take bytes as rank 0's.
    let expect = |link: &mut Link,
                  traffic: &mut Traffic,
                  want: Kind,
                  len: usize|
     -> Result<Vec<u8>, BootstrapError> {
        let (h, payload) = read_frame(link, deadline, HELLO_MAX, rank, JOIN, 0, timeout)?;
        traffic.received(wire::HEADER_LEN.saturating_add(payload.len()));
        match Kind::from_u8(h.kind) {
            Some(Kind::Reject) => {
                let reason = Refusal::from_code(payload.first().copied().unwrap_or(0));
                Err(BootstrapError::Refused { rank, reason })
            }
            // Rank 0 refused another rank before admitting this one.
            Some(Kind::Abort) => {
                let (reason, culprit) = AbortReason::decode(&payload);
                Err(BootstrapError::Aborted {
                    rank,
                    step: JOIN,
                    culprit,
                    reason,
                })
            }
            Some(k) if k == want && h.job == id.job && payload.len() == len => Ok(payload),
            Some(k) if k == want && h.job != id.job => Err(BootstrapError::Mismatch {
                rank,
                step: JOIN,
                peer: 0,
                what: FrameMismatch::Job {
                    ours: id.job,
                    theirs: h.job,
                },
            }),
            Some(k) if k == want => Err(impostor("a handshake message of the wrong length")),
            Some(Kind::Welcome) => Err(impostor("a welcome without a challenge")),
            _ => Err(impostor("a message that is not the join's next step")),
        }
    };
    let theirs = expect(&mut link, &mut traffic, Kind::Challenge, NONCE)?;
    let p = proof(&id.secret, id.job, JOINER, rank32, size32, &mine, &theirs)
        .ok_or_else(|| impostor("no MAC"))?;
    let bytes = wire::frame(header(Kind::Proof), &p).unwrap_or_default();
    send(&mut link, &mut traffic, &bytes)?;
    let welcome = expect(&mut link, &mut traffic, Kind::Welcome, PROOF)?;
    let want = proof(&id.secret, id.job, ROOT, rank32, size32, &mine, &theirs)
        .ok_or_else(|| impostor("no MAC"))?;
    if !constant_time_eq(&welcome, &want) {
        return Err(impostor("a welcome whose proof of the secret is wrong"));
    }
    Ok((link, traffic))
}

pub(crate) fn random_nonce() -> io::Result<[u8; NONCE]> {
    let mut b = [0u8; NONCE];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

const JOIN: Exchange = Exchange {
    op: Op::Rendezvous,
    seq: 0,
};

pub(crate) fn header_error(
    rank: usize,
    step: Exchange,
    peer: usize,
    e: HeaderError,
) -> BootstrapError {
    match e {
        HeaderError::Malformed(what) => BootstrapError::Malformed {
            rank,
            step,
            peer,
            what,
        },
        HeaderError::Version(v) => BootstrapError::Mismatch {
            rank,
            step,
            peer,
            what: FrameMismatch::Version {
                ours: wire::VERSION,
                theirs: v,
            },
        },
        HeaderError::Oversized(len) => BootstrapError::Oversized {
            rank,
            step,
            peer,
            len,
            max: MAX_PAYLOAD as u64,
        },
    }
}

/// Writes all of `bytes` by the deadline: each `write` gets the time left
/// (`SO_SNDTIMEO`), so a peer that stops reading cannot stretch the call.
pub(crate) fn write_bounded(
    stream: &mut TcpStream,
    bytes: &[u8],
    deadline: &Deadline,
) -> io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(rest) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one whole frame (handshake), bounded by the deadline.
fn read_frame(
    link: &mut Link,
    deadline: &Deadline,
    max: usize,
    rank: usize,
    step: Exchange,
    peer: usize,
    timeout: Duration,
) -> Result<(Header, Vec<u8>), BootstrapError> {
    loop {
        match link.reader.next(max) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(header_error(rank, step, peer, e)),
        }
        if deadline.passed() {
            return Err(BootstrapError::Timeout {
                rank,
                step,
                waiting_for: vec![peer],
                after: timeout,
            });
        }
        let ready =
            wait_readable(&[link.stream.as_fd()], deadline).map_err(|e| BootstrapError::Io {
                rank,
                step,
                peer: Some(peer),
                source: e,
            })?;
        if ready.is_empty() {
            continue;
        }
        match link.reader.fill(&mut link.stream) {
            Ok(0) => return Err(BootstrapError::PeerClosed { rank, step, peer }),
            Ok(_) => {}
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(BootstrapError::PeerClosed { rank, step, peer });
            }
            Err(e) => {
                return Err(BootstrapError::Io {
                    rank,
                    step,
                    peer: Some(peer),
                    source: e,
                });
            }
        }
    }
}

impl TcpRoot {
    /// The unique id to publish.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// Admits ranks `1..size` and becomes rank 0 of the job. Connections that
    /// present another job's secret or garbage are dropped and counted
    /// ([`Traffic::refused_connections`]); a rank of this job that declares
    /// another size, a duplicate rank or a rank out of range fails the
    /// accept (and is told why), and every other connection gets an abort
    /// naming it and the refusal, so the ranks already admitted (in their
    /// first collective) and those still joining fail at once with
    /// [`BootstrapError::Aborted`] instead of a close or a timeout.
    ///
    /// # Errors
    /// [`BootstrapError::Timeout`] naming the ranks that did not join;
    /// [`BootstrapError::Mismatch`] for a misconfigured rank of this job;
    /// [`BootstrapError::InvalidArgument`] for `size == 0`.
    pub fn accept(self, size: usize, timeout: Duration) -> Result<Tcp, BootstrapError> {
        let rank = 0;
        if size == 0 || u32::try_from(size).is_err() {
            return Err(BootstrapError::InvalidArgument {
                rank,
                step: JOIN,
                what: Argument::ZeroSize,
            });
        }
        let size32 = u32::try_from(size).unwrap_or(u32::MAX);
        let deadline = Deadline::after(timeout);
        let io = |source| BootstrapError::Io {
            rank,
            step: JOIN,
            peer: None,
            source,
        };
        let mut links: Vec<Option<Link>> = (0..size).map(|_| None).collect();
        let mut joined = 0usize;
        // Connections accepted but not yet admitted, oldest first; `None`
        // once handled. At most `max_pending`, each with one deadline for
        // its whole hello.
        let max_pending = size.saturating_add(PENDING_SLACK).min(PENDING_MAX);
        let mut pending: Vec<Option<Pending>> = Vec::new();
        let mut traffic = Traffic::default();
        let refuse = |traffic: &mut Traffic| {
            traffic.refused_connections = traffic.refused_connections.saturating_add(1);
        };
        while joined + 1 < size {
            if deadline.passed() {
                let waiting_for = (1..size).filter(|&r| links[r].is_none()).collect();
                return Err(BootstrapError::Timeout {
                    rank,
                    step: JOIN,
                    waiting_for,
                    after: timeout,
                });
            }
            // A hello past its deadline is dropped, whatever it has sent.
            for slot in pending.iter_mut() {
                if slot.as_ref().is_some_and(|p| p.deadline.passed()) {
                    *slot = None;
                    refuse(&mut traffic);
                }
            }
            pending.retain(Option::is_some);
            let ready = {
                let wake = pending
                    .iter()
                    .flatten()
                    .map(|p| p.deadline.remaining())
                    .fold(deadline.remaining(), Duration::min);
                let mut fds = vec![self.listener.as_fd()];
                fds.extend(pending.iter().flatten().map(|p| p.link.stream.as_fd()));
                wait_readable(&fds, &Deadline::after(wake)).map_err(io)?
            };
            for i in ready {
                if i == 0 {
                    self.accept_pending(&mut pending, max_pending, &deadline, &mut traffic);
                    continue;
                }
                // Every entry was live when the poll set was built (`retain`
                // above), so `i - 1` indexes `pending` directly.
                let Some(slot) = pending.get_mut(i - 1) else {
                    continue;
                };
                let Some(p) = slot.as_mut() else { continue };
                match p.link.reader.fill(&mut p.link.stream) {
                    Ok(0) => {
                        refuse(&mut traffic);
                        *slot = None;
                        continue;
                    }
                    Err(e)
                        if e.kind() == io::ErrorKind::Interrupted
                            || e.kind() == io::ErrorKind::WouldBlock =>
                    {
                        continue;
                    }
                    Err(_) => {
                        refuse(&mut traffic);
                        *slot = None;
                        continue;
                    }
                    Ok(_) => {}
                }
                let (h, payload) = match p.link.reader.next(HELLO_MAX) {
                    Ok(Some(f)) => f,
                    Ok(None) => continue,
                    Err(_) => {
                        refuse(&mut traffic);
                        *slot = None;
                        continue;
                    }
                };
                traffic.received(wire::HEADER_LEN.saturating_add(payload.len()));
                let reject = |p: &mut Link, job: u64, reason: Refusal, traffic: &mut Traffic| {
                    let r = Header {
                        kind: Kind::Reject as u8,
                        job,
                        seq: 0,
                        from: 0,
                        size: size32,
                        len: 0,
                    };
                    let bytes = wire::frame(r, &[reason.code()]).unwrap_or_default();
                    if write_bounded(
                        &mut p.stream,
                        &bytes,
                        &Deadline::after(Duration::from_millis(100)),
                    )
                    .is_ok()
                    {
                        traffic.sent(bytes.len());
                    }
                };
                let (hello, joiner, root_nonce) = match p.phase {
                    Phase::Hello => {
                        if h.kind != Kind::Hello as u8 || payload.len() != NONCE {
                            refuse(&mut traffic);
                            *slot = None;
                            continue;
                        }
                        if h.job != self.id.job {
                            reject(&mut p.link, h.job, Refusal::WrongSecret, &mut traffic);
                            refuse(&mut traffic);
                            *slot = None;
                            continue;
                        }
                        let mut joiner = [0u8; NONCE];
                        joiner.copy_from_slice(&payload);
                        let Ok(nonce) = random_nonce() else {
                            refuse(&mut traffic);
                            *slot = None;
                            continue;
                        };
                        let c = Header {
                            kind: Kind::Challenge as u8,
                            job: self.id.job,
                            seq: 0,
                            from: 0,
                            size: size32,
                            len: 0,
                        };
                        let bytes = wire::frame(c, &nonce).unwrap_or_default();
                        if write_bounded(&mut p.link.stream, &bytes, &p.deadline).is_err() {
                            refuse(&mut traffic);
                            *slot = None;
                            continue;
                        }
                        traffic.sent(bytes.len());
                        p.phase = Phase::Proof {
                            hello: h,
                            joiner,
                            root: nonce,
                        };
                        continue;
                    }
                    Phase::Proof {
                        hello,
                        joiner,
                        root,
                    } => (hello, joiner, root),
                };
                let Some(mut p) = slot.take() else { continue };
                let want = proof(
                    &self.id.secret,
                    self.id.job,
                    JOINER,
                    hello.from,
                    hello.size,
                    &joiner,
                    &root_nonce,
                );
                if h.kind != Kind::Proof as u8
                    || !want.is_some_and(|w| constant_time_eq(&payload, &w))
                {
                    reject(&mut p.link, h.job, Refusal::WrongSecret, &mut traffic);
                    refuse(&mut traffic);
                    continue;
                }
                let h = hello;
                let mut p = p.link;
                let peer = usize::try_from(h.from).unwrap_or(usize::MAX);
                // A refused rank of this job fails the accept: every other
                // connection is told why at once (an admitted rank's first
                // collective reads the abort, a rank still joining its
                // `join`) instead of timing out or seeing only a close.
                let refused_join = |refusal| AbortReason::JoinRefused {
                    refusal,
                    declared: h.size,
                    size: size32,
                };
                if h.size != size32 {
                    reject(&mut p, h.job, Refusal::SizeMismatch, &mut traffic);
                    self.abort_connections(
                        &mut links,
                        &mut pending,
                        peer,
                        refused_join(Refusal::SizeMismatch),
                        &mut traffic,
                    );
                    return Err(BootstrapError::Mismatch {
                        rank,
                        step: JOIN,
                        peer,
                        what: FrameMismatch::Size {
                            ours: size32,
                            theirs: h.size,
                        },
                    });
                }
                if peer == 0 || peer >= size {
                    reject(&mut p, h.job, Refusal::RankOutOfRange, &mut traffic);
                    self.abort_connections(
                        &mut links,
                        &mut pending,
                        peer,
                        refused_join(Refusal::RankOutOfRange),
                        &mut traffic,
                    );
                    return Err(BootstrapError::Mismatch {
                        rank,
                        step: JOIN,
                        peer,
                        what: FrameMismatch::Sender {
                            expected: size32,
                            theirs: h.from,
                        },
                    });
                }
                if links[peer].is_some() {
                    reject(&mut p, h.job, Refusal::DuplicateRank, &mut traffic);
                    self.abort_connections(
                        &mut links,
                        &mut pending,
                        peer,
                        refused_join(Refusal::DuplicateRank),
                        &mut traffic,
                    );
                    return Err(BootstrapError::Mismatch {
                        rank,
                        step: JOIN,
                        peer,
                        what: FrameMismatch::DuplicateRank { rank: h.from },
                    });
                }
                let w = Header {
                    kind: Kind::Welcome as u8,
                    job: self.id.job,
                    seq: 0,
                    from: 0,
                    size: size32,
                    len: 0,
                };
                let Some(mine) = proof(
                    &self.id.secret,
                    self.id.job,
                    ROOT,
                    h.from,
                    h.size,
                    &joiner,
                    &root_nonce,
                ) else {
                    continue;
                };
                let bytes = wire::frame(w, &mine).unwrap_or_default();
                if write_bounded(&mut p.stream, &bytes, &deadline).is_err() {
                    continue;
                }
                traffic.sent(bytes.len());
                links[peer] = Some(p);
                joined += 1;
            }
        }
        Ok(Tcp {
            rank,
            size,
            job: self.id.job,
            secret: Secret(self.id.secret),
            inner: Mutex::new(Inner {
                seq: 0,
                links,
                traffic,
                ring: RingState::Down,
            }),
        })
    }
}

impl TcpRoot {
    /// Accepts what the listener holds into `pending`, at most
    /// `max_pending` of them (the oldest that proved least dropped first,
    /// [`evict_index`]). When the process
    /// is out of descriptors (`EMFILE`, `ENFILE`) it drops the oldest
    /// pending connection to make room, or, with none to drop, sleeps
    /// briefly instead of polling a listener it cannot serve again at once.
    fn accept_pending(
        &self,
        pending: &mut Vec<Option<Pending>>,
        max_pending: usize,
        deadline: &Deadline,
        traffic: &mut Traffic,
    ) {
        let hello = wire::hello_prefix(self.id.job);
        let drop_oldest = |pending: &mut Vec<Option<Pending>>, traffic: &mut Traffic| {
            // Emptied in place: the caller's poll indices stay valid. The
            // oldest that proved least goes first (`evict_index`).
            let early = |p: &Pending| matches!(p.phase, Phase::Hello);
            match evict_index(pending, early, |p| &p.link, hello.as_ref()) {
                Some(i) => {
                    pending[i] = None;
                    traffic.refused_connections = traffic.refused_connections.saturating_add(1);
                    true
                }
                None => false,
            }
        };
        // Bounded: a flood cannot keep this loop from serving the pending.
        for _ in 0..max_pending {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // Accepted sockets do not inherit non-blocking mode on
                    // Linux, but say so for other systems.
                    if stream.set_nonblocking(false).is_err() || stream.set_nodelay(true).is_err() {
                        traffic.refused_connections = traffic.refused_connections.saturating_add(1);
                        continue;
                    }
                    while pending.iter().flatten().count() >= max_pending {
                        if !drop_oldest(pending, traffic) {
                            break;
                        }
                    }
                    pending.push(Some(Pending {
                        link: Link {
                            stream,
                            reader: FrameReader::default(),
                        },
                        phase: Phase::Hello,
                        deadline: Deadline::after(deadline.remaining().min(HELLO_BUDGET)),
                    }));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error())
                        || e.raw_os_error() == Some(rustix::io::Errno::NFILE.raw_os_error()) =>
                {
                    if !drop_oldest(pending, traffic) {
                        std::thread::sleep(deadline.remaining().min(Duration::from_millis(20)));
                    }
                    break;
                }
                // `ECONNABORTED` and the like: that connection is gone.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(_) => {
                    std::thread::sleep(deadline.remaining().min(Duration::from_millis(20)));
                    break;
                }
            }
        }
    }

    /// After a refused join fails the accept: tells every connection, the
    /// admitted ranks, those not admitted yet and those still in the
    /// listener's backlog, that `culprit` ended the job and why (best
    /// effort, briefly bounded), before they are closed.
    fn abort_connections(
        &self,
        links: &mut [Option<Link>],
        pending: &mut [Option<Pending>],
        culprit: usize,
        reason: AbortReason,
        traffic: &mut Traffic,
    ) {
        let size = u32::try_from(links.len()).unwrap_or(u32::MAX);
        let a = Header {
            kind: Kind::Abort as u8,
            job: self.id.job,
            seq: JOIN.seq,
            from: 0,
            size,
            len: 0,
        };
        let bytes = wire::frame(a, &reason.encode(culprit)).unwrap_or_default();
        let brief = Deadline::after(Duration::from_millis(100));
        let mut tell = |stream: &mut TcpStream| {
            if write_bounded(stream, &bytes, &brief).is_ok() {
                traffic.sent(bytes.len());
            }
        };
        for link in links
            .iter_mut()
            .flatten()
            .chain(pending.iter_mut().flatten().map(|p| &mut p.link))
        {
            tell(&mut link.stream);
        }
        // The listener is non-blocking: this ends with the backlog.
        while let Ok((mut stream, _)) = self.listener.accept() {
            if stream.set_nonblocking(false).is_ok() {
                tell(&mut stream);
            }
        }
    }
}

/// Which pending connection to drop to make room for a new one: the oldest
/// that has not got past its hello (`early`) and sent nothing; else the
/// oldest such that sent something that is not (yet) a hello of this job
/// (fewer bytes than its header's job id, or others than `hello`'s, the
/// first bytes of a hello of the job, [`wire::hello_prefix`]); else the
/// oldest that has not got past its hello; else the oldest. A hello
/// carries the job id, which only holders of the unique id know, so a
/// flood of connections that connect and hold, or send a few bytes, from
/// anyone who knows only the port, pushes out one another and never a
/// rank whose hello arrived, read or still waiting in the socket.
pub(crate) fn evict_index<T>(
    pending: &[Option<T>],
    early: impl Fn(&T) -> bool,
    link: impl Fn(&T) -> &Link,
    hello: Option<&[u8; wire::JOB_PREFIX]>,
) -> Option<usize> {
    let live = || {
        pending
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.as_ref()?)))
    };
    // What a connection sent so far: 0 nothing, 1 not (yet) a hello of
    // this job, 2 a hello of this job (its first bytes, up to the job id).
    let heard = |t: &T| {
        let l = link(t);
        let mut first = [0u8; wire::JOB_PREFIX];
        let have = l.reader.buffered();
        let mut n = have.len().min(wire::JOB_PREFIX);
        first[..n].copy_from_slice(&have[..n]);
        if n < wire::JOB_PREFIX {
            // Peeked without blocking, after what the reader holds; an end
            // of file or an error add nothing.
            if let Ok((k, _)) = rustix::net::recv(
                l.stream.as_fd(),
                &mut first[n..],
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            ) {
                n = n.saturating_add(k).min(wire::JOB_PREFIX);
            }
        }
        match n {
            0 => 0,
            wire::JOB_PREFIX if hello.is_some_and(|h| *h == first) => 2,
            _ => 1,
        }
    };
    // One pass, at most one peek a connection (a flood fills the queue
    // with silent ones: the first ends the pass); the oldest of the lowest
    // tier, past the hello last.
    let mut best: Option<(u8, usize)> = None;
    for (i, t) in live() {
        let tier = if early(t) { heard(t) } else { 3 };
        if tier == 0 {
            return Some(i);
        }
        if best.is_none_or(|(b, _)| tier < b) {
            best = Some((tier, i));
        }
    }
    best.map(|(_, i)| i)
}

/// Whether a presented secret is the job's, in time that does not depend on
/// where they differ (`subtle`; a length mismatch is refused at once).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

impl Bootstrap for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let step = self.next_step(inner, Op::Allgather);
        if self.size >= 3 {
            return self.ring_allgather(inner, step, mine, &deadline);
        }
        if self.rank == 0 {
            let from: Vec<usize> = (1..self.size).collect();
            let got = self.gather_at_root(inner, step, Kind::Allgather, &from, &deadline)?;
            let mut all: Vec<Vec<u8>> = Vec::with_capacity(self.size);
            all.push(mine.to_vec());
            all.extend(got.into_iter().map(|(_, p)| p));
            let Some(list) = wire::encode_list(&all) else {
                let len = all.iter().fold(0usize, |a, b| a.saturating_add(b.len()));
                self.abort_all(inner, step, 0, AbortReason::BadMessage);
                return Err(BootstrapError::InvalidArgument {
                    rank: 0,
                    step,
                    what: Argument::TooLarge {
                        len,
                        max: MAX_PAYLOAD,
                    },
                });
            };
            let bytes =
                self.frame_or_too_large(step, self.header(Kind::AllgatherResult, step.seq), &list)?;
            self.send_to_all(inner, step, &bytes, usize::MAX, &deadline)?;
            Ok(all)
        } else {
            let bytes =
                self.frame_or_too_large(step, self.header(Kind::Allgather, step.seq), mine)?;
            self.send(inner, step, 0, &bytes, &deadline)?;
            let list = self.recv_from_root(inner, step, Kind::AllgatherResult, &deadline)?;
            wire::decode_list(&list, self.size).map_err(|r| {
                inner.links[0] = None;
                refused(self.rank, step, 0, r)
            })
        }
    }

    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let step = self.next_step(inner, Op::Broadcast);
        if root >= self.size {
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::RankOutOfRange {
                    rank: root,
                    size: self.size,
                },
            });
        }
        match (self.rank == 0, self.rank == root) {
            (true, true) => {
                let bytes = self.frame_or_too_large(
                    step,
                    self.header(Kind::Broadcast, step.seq),
                    bytes_if_root,
                )?;
                self.send_to_all(inner, step, &bytes, usize::MAX, &deadline)?;
                Ok(bytes_if_root.to_vec())
            }
            (true, false) => {
                let mut got =
                    self.gather_at_root(inner, step, Kind::Broadcast, &[root], &deadline)?;
                let payload = got.pop().map(|(_, p)| p).unwrap_or_default();
                let bytes = self.frame_or_too_large(
                    step,
                    self.header(Kind::Broadcast, step.seq),
                    &payload,
                )?;
                self.send_to_all(inner, step, &bytes, root, &deadline)?;
                Ok(payload)
            }
            (false, true) => {
                let bytes = self.frame_or_too_large(
                    step,
                    self.header(Kind::Broadcast, step.seq),
                    bytes_if_root,
                )?;
                self.send(inner, step, 0, &bytes, &deadline)?;
                Ok(bytes_if_root.to_vec())
            }
            (false, false) => self.recv_from_root(inner, step, Kind::Broadcast, &deadline),
        }
    }

    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        let deadline = Deadline::after(timeout);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let step = self.next_step(inner, Op::Barrier);
        if self.rank == 0 {
            let from: Vec<usize> = (1..self.size).collect();
            self.gather_at_root(inner, step, Kind::Barrier, &from, &deadline)?;
            let bytes =
                wire::frame(self.header(Kind::BarrierRelease, step.seq), &[]).unwrap_or_default();
            self.send_to_all(inner, step, &bytes, usize::MAX, &deadline)
        } else {
            let bytes = wire::frame(self.header(Kind::Barrier, step.seq), &[]).unwrap_or_default();
            self.send(inner, step, 0, &bytes, &deadline)?;
            self.recv_from_root(inner, step, Kind::BarrierRelease, &deadline)
                .map(|_| ())
        }
    }

    fn traffic(&self) -> Traffic {
        self.lock().traffic
    }
}

pub(crate) fn refused(
    rank: usize,
    step: Exchange,
    peer: usize,
    r: wire::Refused,
) -> BootstrapError {
    match r {
        wire::Refused::Malformed(what) => BootstrapError::Malformed {
            rank,
            step,
            peer,
            what,
        },
        wire::Refused::Mismatch(what) => BootstrapError::Mismatch {
            rank,
            step,
            peer,
            what,
        },
        wire::Refused::Oversized(len) => BootstrapError::Oversized {
            rank,
            step,
            peer,
            len,
            max: MAX_PAYLOAD as u64,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21 (sustained accept-queue flood): when rank 0 or a ring
    /// listener must drop a pending connection to make room, one that
    /// connected and sent nothing goes first, then one that sent bytes that
    /// are not (yet) a hello of this job (a few bytes, the magic alone,
    /// another job's hello), and only then one whose hello arrived, however
    /// much older, waiting in its socket or read; one past its hello goes
    /// last. Real sockets on loopback; every read bounded.
    #[test]
    fn a_connection_that_sends_nothing_or_no_hello_of_the_job_is_dropped_before_one_whose_hello_arrived()
     {
        const JOB: u64 = 0x0005_eed0_f10b;
        let hello = wire::hello_prefix(JOB).expect("a header encodes");
        let other = wire::hello_prefix(JOB + 1).expect("a header encodes");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Oldest first: a hello of the job, then one of another job, the
        // magic alone, and two that hold and say nothing.
        let sent: [&[u8]; 5] = [&hello, &other, b"CEbs", b"", b""];
        let clients: Vec<TcpStream> = sent
            .iter()
            .map(|bytes| {
                let mut c = TcpStream::connect(addr).expect("connect");
                c.write_all(bytes).expect("write");
                c
            })
            .collect();
        let mut pending: Vec<Option<(Link, bool)>> = sent
            .iter()
            .map(|bytes| {
                let stream = listener.accept().expect("accept").0;
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .expect("timeout");
                let mut probe = [0u8; wire::JOB_PREFIX];
                if !bytes.is_empty() {
                    // It is there (peeked, so it stays for the reader).
                    while stream.peek(&mut probe).expect("bytes arrive") < bytes.len() {}
                }
                let reader = FrameReader::default();
                // `(link, past its hello)`.
                Some((Link { stream, reader }, false))
            })
            .collect();
        let pick = |pending: &[Option<(Link, bool)>]| {
            evict_index(pending, |p| !p.1, |p| &p.0, Some(&hello))
        };
        assert_eq!(pick(&pending), Some(3), "the oldest silent one goes first");
        pending[3] = None;
        assert_eq!(pick(&pending), Some(4));
        pending[4] = None;
        assert_eq!(pick(&pending), Some(1), "then another job's hello");
        pending[1] = None;
        assert_eq!(pick(&pending), Some(2), "then the magic alone");
        pending[2] = None;
        // The hello, read into its reader, counts the same as waiting.
        if let Some((l, _)) = pending[0].as_mut() {
            assert_eq!(
                l.reader.fill(&mut l.stream).expect("read"),
                wire::JOB_PREFIX
            );
        }
        assert_eq!(
            pick(&pending),
            Some(0),
            "the hello goes when nothing else can"
        );
        // One past its hello goes after every one that is not, even one
        // with bytes waiting.
        let late = TcpStream::connect(addr).expect("connect");
        let late_in = listener.accept().expect("accept").0;
        (&late).write_all(b"x").expect("write");
        let mut one = [0u8; 1];
        late_in
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        assert_eq!(late_in.peek(&mut one).expect("byte arrives"), 1);
        if let Some(p) = pending[0].as_mut() {
            p.1 = true;
        }
        let late_link = Link {
            stream: late_in,
            reader: FrameReader::default(),
        };
        pending.push(Some((late_link, false)));
        assert_eq!(pick(&pending), Some(5));
        pending[5] = None;
        assert_eq!(pick(&pending), Some(0));
        assert_eq!(pick(&[None::<(Link, bool)>]), None);
        // The peeks consumed nothing.
        if let Some((l, _)) = pending[0].as_ref() {
            assert_eq!(l.reader.buffered(), &hello[..]);
        }
        drop(clients);
    }
}

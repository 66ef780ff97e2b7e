//! [`FabricServer`]: the process that owns a simulated fabric's model and
//! lets OS processes join it over a Unix socket. Each connection is one
//! process of the fabric, on the node it asked for; when the connection
//! closes — the client exited, crashed or was killed — the model runs the
//! driver's process-exit cleanup for it (SPEC R12.2), and what it still held
//! is recorded as that process's leak ([`ProcessExit`]).
//!
//! The server runs on threads of the process that starts it (a test, or the
//! `cuda-endpoints-fabric` launcher): one accepting, one per connection.
//! Dropping it closes every connection (cleaning up each process), joins
//! every thread and removes the socket with its temporary directory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::FabricError;
use super::calls;
use super::join::Join;
use super::wire::{
    self, FrameError, MAX_MEMORY_IO, PROTOCOL, Reply, Request, Welcome, WireViolation,
};
use crate::driver::{Code, Device};
use crate::{FabricConfig, FabricLive, Live, Model, Violation};

/// The most processes connected at once.
pub const MAX_CONNECTIONS: usize = 4096;

/// What a process still held when it left the fabric: its leak (zero for a
/// process that cleaned up after itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessExit {
    /// Its number on the fabric.
    pub pid: u64,
    /// Its node.
    pub node: u32,
    /// Its OS process id, as it said.
    pub os_pid: u32,
    /// What the driver's cleanup had to free (R12.2).
    pub held: Live,
}

/// The most exits [`FabricServer::exits`] keeps (the most recent), and
/// the most leaking ones [`FabricServer::leaks`] keeps: a fabric that
/// serves a million short connections holds a bounded record of them.
pub const MAX_EXITS: usize = 4096;

#[derive(Default)]
struct Book {
    streams: HashMap<u64, UnixStream>,
    /// The connections that have not said hello yet, oldest first.
    hello: BTreeMap<u64, UnixStream>,
    threads: Vec<JoinHandle<()>>,
    next: u64,
    running: usize,
    joined: u64,
    exits: VecDeque<ProcessExit>,
    leaks: VecDeque<ProcessExit>,
    /// How many exits (and leaking exits) were dropped from the records.
    exits_dropped: u64,
    leaks_dropped: u64,
    /// How many connections were closed for a hello that took too long or
    /// made room for a newer one.
    hellos_cut: u64,
}

impl Book {
    fn record(&mut self, exit: ProcessExit) {
        if !exit.held.is_empty() {
            if self.leaks.len() >= MAX_EXITS {
                self.leaks.pop_front();
                self.leaks_dropped = self.leaks_dropped.saturating_add(1);
            }
            self.leaks.push_back(exit.clone());
        }
        if self.exits.len() >= MAX_EXITS {
            self.exits.pop_front();
            self.exits_dropped = self.exits_dropped.saturating_add(1);
        }
        self.exits.push_back(exit);
    }
}

struct ServerState {
    world: Model,
    stop: AtomicBool,
    book: Mutex<Book>,
    changed: Condvar,
    /// The whole hello must arrive within this.
    hello_timeout: Duration,
    /// The most connections in hello at once; a newer one closes the oldest.
    max_in_hello: usize,
}

impl ServerState {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running fabric: its model, its socket, its threads. See the module
/// docs; started by [`FabricServer::start`].
///
/// ```
/// use cuda_endpoints::fabric::{self, FabricServer};
/// use cuda_endpoints::model::FabricConfig;
///
/// let server = FabricServer::start(FabricConfig::nodes(2, 4))?;
/// // A process of the fabric (here in this OS process; a child would read
/// // `server.env_value()` from `CUDA_ENDPOINTS_FABRIC`).
/// let (ctx, me) = fabric::connect(&server.join().node(1))?;
/// assert_eq!((me.node(), ctx.device_count()?), (1, 4));
/// drop((ctx, me));
/// assert!(server.wait_idle(std::time::Duration::from_secs(5)));
/// assert!(server.live().is_empty() && server.leaks().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FabricServer {
    shared: Arc<ServerState>,
    socket: PathBuf,
    accept: Option<JoinHandle<()>>,
    /// Removed (with the socket) on drop.
    dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for FabricServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FabricServer({})", self.socket.display())
    }
}

impl FabricServer {
    /// Starts a fabric of `config` on a socket in a new private temporary
    /// directory (no fixed path: every fabric is its own).
    ///
    /// # Errors
    /// [`FabricError::Start`] when the directory or socket cannot be made.
    pub fn start(config: FabricConfig) -> Result<FabricServer, FabricError> {
        use std::os::unix::fs::PermissionsExt;
        let start = |source| FabricError::Start {
            socket: std::env::temp_dir(),
            source,
        };
        // 0700 whatever the umask: only this user reaches the socket.
        let dir = tempfile::Builder::new()
            .prefix("cuda-endpoints-fabric-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(start)?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .map_err(start)?;
        let socket = dir.path().join("fabric.sock");
        let mut server = FabricServer::start_at(config, socket)?;
        server.dir = Some(dir);
        Ok(server)
    }

    /// Starts a fabric of `config` listening at `socket`, which must not
    /// exist; the socket file is removed on drop. The socket's mode is
    /// 0600 whatever the umask (only this user may connect); its directory
    /// is the caller's to protect.
    ///
    /// # Errors
    /// [`FabricError::Start`] when the socket cannot be bound.
    pub fn start_at(
        config: FabricConfig,
        socket: impl Into<PathBuf>,
    ) -> Result<FabricServer, FabricError> {
        let socket = socket.into();
        let listener = UnixListener::bind(&socket).map_err(|source| FabricError::Start {
            socket: socket.clone(),
            source,
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(0o600);
            if let Err(source) = std::fs::set_permissions(&socket, mode) {
                let _ = std::fs::remove_file(&socket);
                return Err(FabricError::Start { socket, source });
            }
        }
        let shared = Arc::new(ServerState {
            hello_timeout: config.hello_timeout,
            max_in_hello: config.max_in_hello.max(1),
            world: Model::fabric_observer(config),
            stop: AtomicBool::new(false),
            book: Mutex::new(Book::default()),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("fabric-accept".into())
            .spawn(move || accept_loop(&s, &listener))
            .map_err(|source| FabricError::Start {
                socket: socket.clone(),
                source,
            });
        let accept = match accept {
            Ok(a) => a,
            Err(e) => {
                let _ = std::fs::remove_file(&socket);
                return Err(e);
            }
        };
        Ok(FabricServer {
            shared,
            socket,
            accept: Some(accept),
            dir: None,
        })
    }

    /// The socket processes connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A [`Join`] for this fabric (node 0 unless changed).
    pub fn join(&self) -> Join {
        Join::new(&self.socket)
    }

    /// The value of [`super::FABRIC_ENV`] for processes of this fabric (they
    /// are placed by rank, or add `,node=N`).
    pub fn env_value(&self) -> String {
        self.join().to_spec()
    }

    /// The fabric's model, for processes inside this OS process
    /// ([`Model::spawn_process_on`]) and inspection.
    pub fn model(&self) -> &Model {
        &self.shared.world
    }

    /// What the whole fabric holds now.
    pub fn live(&self) -> FabricLive {
        self.shared.world.live_fabric()
    }

    /// Every rule violation on the fabric so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.world.violations()
    }

    /// How many processes joined over the socket so far.
    pub fn joined(&self) -> u64 {
        self.shared.book().joined
    }

    /// How many processes are connected now.
    pub fn running(&self) -> usize {
        self.shared.book().running
    }

    /// The processes that left, in order, with what each still held: the
    /// most recent `MAX_EXITS` (4,096) ([`FabricServer::exits_dropped`] counts
    /// the older ones).
    pub fn exits(&self) -> Vec<ProcessExit> {
        self.shared.book().exits.iter().cloned().collect()
    }

    /// How many exits were dropped from [`FabricServer::exits`] and from
    /// [`FabricServer::leaks`].
    pub fn exits_dropped(&self) -> (u64, u64) {
        let book = self.shared.book();
        (book.exits_dropped, book.leaks_dropped)
    }

    /// The processes that left holding something (leaked, or were killed):
    /// the most recent `MAX_EXITS` (4,096) of them.
    pub fn leaks(&self) -> Vec<ProcessExit> {
        self.shared.book().leaks.iter().cloned().collect()
    }

    /// How many connections were closed before their hello was done: too
    /// slow (the whole hello must arrive within
    /// [`FabricConfig::hello_timeout`]) or the oldest of more than
    /// [`FabricConfig::max_in_hello`].
    pub fn hellos_cut(&self) -> u64 {
        self.shared.book().hellos_cut
    }

    /// Waits until no process is connected (every exit cleaned up), at
    /// most `timeout`; whether that happened.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, |b| b.running == 0)
    }

    /// Waits until at least `n` processes have left, at most `timeout`;
    /// whether that happened.
    pub fn wait_exits(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for(timeout, |b| {
            let total = (b.exits.len() as u64).saturating_add(b.exits_dropped);
            total >= n as u64
        })
    }

    fn wait_for(&self, timeout: Duration, done: impl Fn(&Book) -> bool) -> bool {
        // A timeout too large for `Instant` (`Duration::MAX`) has no
        // deadline: wait without bound.
        let deadline = Instant::now().checked_add(timeout);
        let mut book = self.shared.book();
        loop {
            if done(&book) {
                return true;
            }
            book = match deadline {
                None => self
                    .shared
                    .changed
                    .wait(book)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.shared
                        .changed
                        .wait_timeout(book, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

impl Drop for FabricServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = UnixStream::connect(&self.socket);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let threads = {
            let mut book = self.shared.book();
            for s in book.streams.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            std::mem::take(&mut book.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

fn accept_loop(shared: &Arc<ServerState>, listener: &UnixListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else {
            // Out of descriptors or the like: do not spin on it.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        // One guard per server task: a panic while taking one connection
        // costs that connection, never the accepting thread.
        let _ = catch_unwind(AssertUnwindSafe(|| take(shared, stream)));
    }
}

/// Books one new connection and starts its thread.
fn take(shared: &Arc<ServerState>, stream: UnixStream) {
    let mut book = shared.book();
    // Finished connections' threads: reap them as we go.
    book.threads.retain(|t| !t.is_finished());
    if book.streams.len() >= MAX_CONNECTIONS {
        drop(book);
        let mut s = &stream;
        let _ = wire::send(
            &mut s,
            &Reply::Refused(format!(
                "the fabric serves at most {MAX_CONNECTIONS} processes"
            )),
        );
        return;
    }
    // Connections in hello are bounded: the oldest makes room (an honest
    // hello takes microseconds, so only a stalled one is ever cut).
    while book.hello.len() >= shared.max_in_hello {
        let Some((_, oldest)) = book.hello.pop_first() else {
            break;
        };
        let _ = oldest.shutdown(std::net::Shutdown::Both);
        book.hellos_cut = book.hellos_cut.saturating_add(1);
    }
    let id = book.next;
    book.next = book.next.wrapping_add(1);
    let (Ok(clone), Ok(in_hello)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    book.streams.insert(id, clone);
    book.hello.insert(id, in_hello);
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("fabric-conn-{id}"))
        .spawn(move || {
            // One guard per connection: a panic in serving this process
            // ends its connection (its exit runs in `Member`'s drop), and
            // nothing else.
            let _ = catch_unwind(AssertUnwindSafe(|| serve(&s, id, stream)));
            let mut book = s.book();
            book.streams.remove(&id);
            book.hello.remove(&id);
            drop(book);
            s.changed.notify_all();
        });
    match spawned {
        Ok(t) => book.threads.push(t),
        Err(_) => {
            book.streams.remove(&id);
            book.hello.remove(&id);
        }
    }
}

/// Where a process joins: the node asked for, else by rank (ranks fill the
/// nodes in order, one per device, wrapping), else node 0; and the device
/// of a process placed by rank.
fn place(world: &Model, node: Option<u32>, rank: Option<u32>) -> (usize, Option<Device>) {
    if let Some(n) = node {
        return (usize::try_from(n).unwrap_or(usize::MAX), None);
    }
    let Some(rank) = rank else {
        return (0, None);
    };
    let sizes: Vec<usize> = (0..world.nodes())
        .map(|n| world.node_devices(n).unwrap_or(0).max(1))
        .collect();
    let total: usize = sizes.iter().sum();
    let mut r = usize::try_from(rank).unwrap_or(0) % total.max(1);
    for (n, &size) in sizes.iter().enumerate() {
        if r < size {
            return (n, i32::try_from(r).ok().map(Device));
        }
        r -= size;
    }
    (0, None)
}

/// A reader that gives up at a deadline for everything it reads (each
/// read's timeout is the time left), so that a peer trickling a byte at a
/// time cannot stretch a bounded exchange.
struct Deadline<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&mut &*self.stream).read(buf)
    }
}

/// A joined process: its exit (the driver's cleanup, R12.2) and its record
/// run when this is dropped — on return, and on unwind.
struct Member<'a> {
    shared: &'a ServerState,
    me: Model,
    pid: u64,
    node: u32,
    os_pid: u32,
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        let held = self.me.exit();
        // Nothing refers to an exited process's record: reclaim it.
        self.me.forget();
        let mut book = self.shared.book();
        book.running = book.running.saturating_sub(1);
        book.record(ProcessExit {
            pid: self.pid,
            node: self.node,
            os_pid: self.os_pid,
            held,
        });
    }
}

fn serve(shared: &ServerState, id: u64, stream: UnixStream) {
    let mut s = &stream;
    // A peer that connects and says nothing, or says it slowly, does not
    // hold a thread for long: the whole hello has a deadline. Once joined,
    // a process may stay idle as long as it likes.
    let deadline = Instant::now()
        .checked_add(shared.hello_timeout)
        .unwrap_or_else(Instant::now);
    let hello = wire::recv::<Request>(&mut Deadline {
        stream: &stream,
        deadline,
    });
    let _ = stream.set_read_timeout(None);
    let still_booked = shared.book().hello.remove(&id).is_some();
    let (node, rank, imex, os_pid) = match hello {
        Ok(Request::Hello {
            protocol,
            node,
            rank,
            imex_channel,
            os_pid,
        }) if still_booked => {
            if protocol != PROTOCOL {
                let why = format!("protocol {protocol}, but this fabric speaks {PROTOCOL}");
                let _ = wire::send(&mut s, &Reply::Refused(why));
                return;
            }
            (node, rank, imex_channel, os_pid)
        }
        Ok(Request::Hello { .. }) => return,
        Ok(_) => {
            let _ = wire::send(
                &mut s,
                &Reply::Refused("the first request must be Hello".into()),
            );
            return;
        }
        Err(_) => {
            if still_booked {
                // Cut by the deadline (a hello pushed out by a newer one
                // was counted when it was cut).
                let mut book = shared.book();
                book.hellos_cut = book.hellos_cut.saturating_add(1);
            }
            return;
        }
    };
    let world = &shared.world;
    let (node, device) = place(world, node, rank);
    let Some(me) = world.join_process(node, imex) else {
        let why = format!("no node {node}: this fabric has {} nodes", world.nodes());
        let _ = wire::send(&mut s, &Reply::Refused(why));
        return;
    };
    let welcome = Welcome {
        pid: me.pid() as u64,
        node: u32::try_from(node).unwrap_or(u32::MAX),
        nodes: u32::try_from(world.nodes()).unwrap_or(u32::MAX),
        devices: u32::try_from(world.node_devices(node).unwrap_or(0)).unwrap_or(u32::MAX),
        device,
        imex_channel: me.fabric_access(),
        fabric: world.fabric_tag(),
    };
    {
        let mut book = shared.book();
        book.running += 1;
        book.joined += 1;
    }
    let member = Member {
        shared,
        me,
        pid: welcome.pid,
        node: welcome.node,
        os_pid,
    };
    if wire::send(&mut s, &Reply::Welcome(welcome)).is_err() {
        return;
    }
    loop {
        let reply = match wire::recv::<Request>(&mut s) {
            Ok(req) => answer(&member.me, req),
            Err(FrameError::Closed | FrameError::Io(_)) => break,
            Err(e) => Reply::Refused(e.to_string()),
        };
        let end = matches!(reply, Reply::Refused(_));
        match wire::send(&mut s, &reply) {
            Ok(()) => {}
            // An answer too large for a frame is this request's failure,
            // not the process's end.
            Err(FrameError::TooLarge(n)) => {
                let why = format!("the answer ({n} bytes) does not fit a frame");
                if wire::send(&mut s, &Reply::Failed(why)).is_err() {
                    break;
                }
            }
            Err(_) => break,
        }
        if end {
            break;
        }
    }
    // `member` drops here: the process is gone, the driver cleans up.
}

fn answer(me: &Model, req: Request) -> Reply {
    match req {
        Request::Hello { .. } => Reply::Refused("already joined".into()),
        Request::Call(call) => Reply::Call(calls::dispatch(me, call)),
        Request::Live => Reply::Live(me.live()),
        Request::LiveFabric => Reply::LiveFabric(me.live_fabric()),
        Request::Violations => Reply::Violations {
            kept: me
                .violations()
                .into_iter()
                .map(|v| WireViolation {
                    call: v.call.name().to_string(),
                    rule: v.rule.to_string(),
                    code: v.code,
                })
                .collect(),
            dropped: me.violations_dropped(),
        },
        Request::Read { ptr, len } => {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > MAX_MEMORY_IO {
                return Reply::Bytes(Err(Code::INVALID_VALUE));
            }
            Reply::Bytes(me.read(ptr, len))
        }
        Request::Write { ptr, bytes } => Reply::Done(me.write(ptr, &bytes)),
        Request::SetFaults(plan) => {
            me.set_faults(plan);
            Reply::Done(Ok(()))
        }
        Request::SetImexChannel(granted) => {
            me.set_fabric_access(granted);
            Reply::Done(Ok(()))
        }
        Request::ExportShareable { handle, kind } => {
            Reply::Handle(me.export_shareable(handle, kind))
        }
        Request::ImportShareable { token, kind } => Reply::Handle(me.import_shareable(token, kind)),
        Request::HostCopy { call, staged } => super::data::answer_copy(me, call, staged),
        Request::HostSync { call } => super::data::answer_sync(me, call),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_fill_nodes_one_per_device() {
        let world = Model::fabric_observer(FabricConfig::nodes(2, 4));
        assert_eq!(place(&world, None, Some(0)), (0, Some(Device(0))));
        assert_eq!(place(&world, None, Some(5)), (1, Some(Device(1))));
        assert_eq!(place(&world, None, Some(8)), (0, Some(Device(0))));
        assert_eq!(place(&world, Some(1), Some(0)), (1, None));
        assert_eq!(place(&world, None, None), (0, None));
    }
}

//! The client side: [`Remote`], a [`Driver`](crate::driver::Driver) whose
//! every call goes to the fabric server, and [`Process`], this process's
//! handle on the fabric for inspection (leak counters, violations, device
//! memory, faults). Both share one connection; when the last of them is
//! dropped the connection closes, which is this process's exit on the
//! fabric (SPEC R12.2).

use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::de::DeserializeOwned;

use cuda_endpoints_bootstrap::NodeId;

use super::FabricError;
use super::calls::WireCall;
use super::join::Join;
use super::wire::{self, FrameError, PROTOCOL, Reply, Request, Welcome, WireViolation};
use crate::driver::{Code, Device, DriverResult, ShareableHandle};
use crate::shareable;
use crate::{FabricLive, Live, ShareableKind, faults::FaultPlan};

/// A driver backend that is one process of a fabric server's model: the
/// driver calls of the boundary's table, sent over the connection. Made by
/// [`open`]; name `"fabric"`.
///
/// A lost connection (the server gone, or an answer later than
/// [`Join::timeout`]) is reported once through `tracing` and every call
/// after it answers `CUDA_ERROR_DEINITIALIZED`.
pub struct Remote {
    stream: Mutex<Option<UnixStream>>,
    welcome: Welcome,
    socket: PathBuf,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Remote(process {} on node {} of {})",
            self.welcome.pid,
            self.welcome.node,
            self.socket.display()
        )
    }
}

impl Remote {
    fn open(join: &Join) -> Result<Remote, FabricError> {
        let stream = UnixStream::connect(&join.socket).map_err(|source| FabricError::Connect {
            socket: join.socket.clone(),
            source,
        })?;
        let timeout = Some(join.timeout).filter(|t| !t.is_zero());
        let io = |source| FabricError::Connect {
            socket: join.socket.clone(),
            source,
        };
        stream.set_read_timeout(timeout).map_err(io)?;
        stream.set_write_timeout(timeout).map_err(io)?;
        let mut s = &stream;
        let hello = Request::Hello {
            protocol: PROTOCOL,
            node: join.node,
            rank: join.rank,
            imex_channel: join.imex_channel,
            os_pid: std::process::id(),
        };
        wire::send(&mut s, &hello).map_err(FabricError::Protocol)?;
        match wire::recv::<Reply>(&mut s).map_err(FabricError::Protocol)? {
            Reply::Welcome(welcome) => Ok(Remote {
                stream: Mutex::new(Some(stream)),
                welcome,
                socket: join.socket.clone(),
            }),
            Reply::Refused(reason) => Err(FabricError::Refused { reason }),
            other => Err(FabricError::Unexpected {
                request: "hello",
                reply: format!("{other:?}"),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<UnixStream>> {
        // The stream is either whole or taken; a panic cannot tear it.
        self.stream.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One request, one reply. A request that does not fit a frame is
    /// refused before a byte is sent, and the connection stays
    /// ([`Unanswered::Unsent`]); a transport or protocol failure closes the
    /// connection for good: a reply lost half-way would desynchronise it.
    pub(super) fn request(&self, req: &Request) -> Result<Reply, Unanswered> {
        // Encoded before the lock and before the wire: too large is this
        // request's failure, never the process's end on the fabric.
        let body = wire::encode(req).map_err(|e| {
            tracing::warn!(error = %e, "fabric request not sent");
            Unanswered::Unsent(e)
        })?;
        let mut guard = self.lock();
        let Some(stream) = guard.as_ref() else {
            return Err(Unanswered::Lost(FrameError::Closed));
        };
        let mut s = stream;
        let r = wire::send_encoded(&mut s, &body).and_then(|()| wire::recv::<Reply>(&mut s));
        if let Err(e) = &r {
            tracing::error!(socket = %self.socket.display(), error = %e, "fabric connection lost");
            *guard = None;
        }
        r.map_err(Unanswered::Lost)
    }

    /// A driver call of the table.
    pub(super) fn call<T: DeserializeOwned>(&self, call: WireCall) -> DriverResult<T> {
        match self.request(&Request::Call(call)) {
            Ok(Reply::Call(Ok(bytes))) => postcard::from_bytes(&bytes).map_err(|e| {
                tracing::error!(error = %e, "undecodable answer from the fabric");
                Code::UNKNOWN
            }),
            Ok(Reply::Call(Err(code))) => Err(code),
            Ok(other) => {
                tracing::error!(reply = ?other, "unexpected answer from the fabric");
                Err(Code::UNKNOWN)
            }
            Err(e) => Err(e.code()),
        }
    }

    /// A token request (`ExportShareable` / `ImportShareable`) as a driver answer.
    fn token(&self, req: &Request) -> DriverResult<u64> {
        match self.request(req) {
            Ok(Reply::Handle(r)) => r,
            Ok(other) => {
                tracing::error!(reply = ?other, "unexpected answer from the fabric");
                Err(Code::UNKNOWN)
            }
            Err(e) => Err(e.code()),
        }
    }

    /// `cuMemExportToShareableHandle` made here, not on the server: a
    /// descriptor must be one of *this* OS process (an in-memory file
    /// holding the fabric's token), and fabric bytes carry the token.
    pub(super) fn mem_export_here(
        &self,
        handle: u64,
        kind: ShareableKind,
    ) -> DriverResult<ShareableHandle> {
        let token = self.token(&Request::ExportShareable { handle, kind })?;
        let tag = self.welcome.fabric;
        match kind {
            ShareableKind::Fabric => {
                Ok(ShareableHandle::Fabric(shareable::token_bytes(tag, token)))
            }
            // The token stays exported until the allocation is freed (as a
            // real export whose descriptor was lost): no leak once it is.
            ShareableKind::PosixFd => shareable::token_fd(tag, token)
                .map(|fd| ShareableHandle::PosixFd(fd.into_raw_fd()))
                .map_err(|_| Code::OUT_OF_MEMORY),
        }
    }

    /// `cuMemImportFromShareableHandle`: the descriptor or bytes are read
    /// here, the token imported on the server (R12.4 applies there).
    ///
    /// # Safety
    /// A `PosixFd` is open in this process for the call.
    pub(super) unsafe fn mem_import_here(&self, shared: ShareableHandle) -> DriverResult<u64> {
        let token = match shared {
            ShareableHandle::PosixFd(fd) if fd >= 0 => {
                // SAFETY: the caller keeps `fd` open for this call; it is
                // only read.
                shareable::fd_token(unsafe { BorrowedFd::borrow_raw(fd) })
            }
            ShareableHandle::PosixFd(_) => None,
            ShareableHandle::Fabric(bytes) => shareable::bytes_token(&bytes),
        };
        // Another fabric's (or a forged) string: not this driver's.
        let token = token
            .filter(|&(tag, _)| tag == self.welcome.fabric)
            .ok_or(Code::INVALID_VALUE)?
            .1;
        self.token(&Request::ImportShareable {
            token,
            kind: shared.kind(),
        })
    }

    fn ask(&self, what: &'static str, req: &Request) -> Result<Reply, FabricError> {
        match self.request(req) {
            Ok(Reply::Refused(reason) | Reply::Failed(reason)) => {
                Err(FabricError::Refused { reason })
            }
            Ok(r) => Ok(r),
            Err(Unanswered::Unsent(FrameError::TooLarge(len))) => Err(FabricError::TooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max: wire::MAX_FRAME,
            }),
            Err(e) => Err(FabricError::Lost {
                request: what,
                detail: e.to_string(),
            }),
        }
    }
}

/// Why [`Remote::request`] has no reply.
#[derive(Debug)]
pub(super) enum Unanswered {
    /// Not sent (larger than a frame): the connection stays.
    Unsent(FrameError),
    /// The connection is lost, for good.
    Lost(FrameError),
}

impl Unanswered {
    /// The driver's answer: a request too large is the caller's
    /// `INVALID_VALUE` (as a real driver refuses a batch it cannot take);
    /// a lost fabric is this process's driver gone, `DEINITIALIZED`.
    pub(super) fn code(&self) -> Code {
        match self {
            Unanswered::Unsent(_) => Code::INVALID_VALUE,
            Unanswered::Lost(_) => Code::DEINITIALIZED,
        }
    }
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Unsent(e) => write!(f, "not sent: {e}"),
            Unanswered::Lost(e) => e.fmt(f),
        }
    }
}

/// This process's handle on the fabric it joined: where it runs, and what
/// the tests look at (leak counters, violations, device memory, faults).
/// Cheap to clone; shares the connection with the `Context` that
/// [`open`] returned.
#[derive(Clone, Debug)]
pub struct Process {
    remote: Arc<Remote>,
}

fn unexpected(request: &'static str, reply: Reply) -> FabricError {
    FabricError::Unexpected {
        request,
        reply: format!("{reply:?}"),
    }
}

impl Process {
    /// This process's number on the fabric.
    pub fn pid(&self) -> u64 {
        self.remote.welcome.pid
    }

    /// The node it runs on.
    pub fn node(&self) -> u32 {
        self.remote.welcome.node
    }

    /// Its node as the bootstrap's descriptor passing knows nodes
    /// (`agree_bound_fds`, `grow_fds`, `FdExchange`): the processes of one
    /// model node share it, those of two differ, though every one runs on
    /// this host (where [`NodeId::current`] is the same for all of them).
    pub fn node_id(&self) -> NodeId {
        let node = self.node();
        let host = NodeId::current()
            .map(|n| n.hostname().to_owned())
            .unwrap_or_default();
        NodeId::from_parts(
            &format!("{host}/model-node-{node}"),
            &format!("model-node-{node}"),
            0,
        )
    }

    /// How many nodes the fabric has.
    pub fn nodes(&self) -> u32 {
        self.remote.welcome.nodes
    }

    /// How many devices its node has.
    pub fn devices(&self) -> u32 {
        self.remote.welcome.devices
    }

    /// The device a process placed by rank uses: its rank's index on the
    /// node. `None` when it was not placed by rank.
    pub fn device(&self) -> Option<Device> {
        self.remote.welcome.device
    }

    /// Whether it had an IMEX channel when it joined.
    pub fn imex_channel(&self) -> bool {
        self.remote.welcome.imex_channel
    }

    /// This process's driver on the fabric, to stack a wrapper on it (e.g.
    /// the classic fallback: `Context::new(Classic::new(me.remote()))`).
    /// Its calls are `unsafe`, as every driver's.
    pub fn remote(&self) -> Arc<Remote> {
        self.remote.clone()
    }

    /// The fabric's socket.
    pub fn socket(&self) -> &Path {
        &self.remote.socket
    }

    /// What this process still holds on the fabric.
    ///
    /// # Errors
    /// [`FabricError::Lost`] when the fabric is gone.
    pub fn live(&self) -> Result<Live, FabricError> {
        match self.remote.ask("live", &Request::Live)? {
            Reply::Live(l) => Ok(l),
            r => Err(unexpected("live", r)),
        }
    }

    /// What the whole fabric holds.
    ///
    /// # Errors
    /// As [`Process::live`].
    pub fn live_fabric(&self) -> Result<FabricLive, FabricError> {
        match self.remote.ask("live_fabric", &Request::LiveFabric)? {
            Reply::LiveFabric(l) => Ok(l),
            r => Err(unexpected("live_fabric", r)),
        }
    }

    /// The rule violations on the fabric so far (all processes): the most
    /// recent [`crate::MAX_VIOLATIONS`].
    ///
    /// # Errors
    /// As [`Process::live`].
    pub fn violations(&self) -> Result<Vec<WireViolation>, FabricError> {
        self.violation_log().map(|(kept, _)| kept)
    }

    /// The violations kept (as [`Process::violations`]) and how many older
    /// ones the fabric dropped.
    ///
    /// # Errors
    /// As [`Process::live`].
    pub fn violation_log(&self) -> Result<(Vec<WireViolation>, u64), FabricError> {
        match self.remote.ask("violations", &Request::Violations)? {
            Reply::Violations { kept, dropped } => Ok((kept, dropped)),
            r => Err(unexpected("violations", r)),
        }
    }

    /// Reads `len` bytes of device memory mapped in this process at `ptr`.
    ///
    /// # Errors
    /// [`FabricError::Driver`] with the model's code (`ILLEGAL_ADDRESS` for
    /// memory not mapped with access); [`FabricError::TooLarge`] past
    /// [`wire::MAX_MEMORY_IO`].
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, FabricError> {
        let len = u32::try_from(len)
            .ok()
            .filter(|&l| l as usize <= wire::MAX_MEMORY_IO)
            .ok_or(FabricError::TooLarge {
                len,
                max: wire::MAX_MEMORY_IO,
            })?;
        match self.remote.ask("read", &Request::Read { ptr, len })? {
            Reply::Bytes(r) => r.map_err(|code| FabricError::Driver {
                request: "read",
                code,
            }),
            r => Err(unexpected("read", r)),
        }
    }

    /// Writes `bytes` to device memory mapped in this process at `ptr`.
    ///
    /// # Errors
    /// As [`Process::read`].
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), FabricError> {
        if bytes.len() > wire::MAX_MEMORY_IO {
            return Err(FabricError::TooLarge {
                len: bytes.len(),
                max: wire::MAX_MEMORY_IO,
            });
        }
        let req = Request::Write {
            ptr,
            bytes: bytes.to_vec(),
        };
        self.done("write", &req)
    }

    /// Replaces the fabric's fault plan (it applies to every process).
    ///
    /// # Errors
    /// As [`Process::live`].
    pub fn set_faults(&self, plan: FaultPlan) -> Result<(), FabricError> {
        self.done("set_faults", &Request::SetFaults(plan))
    }

    /// Grants or takes this process's IMEX channel (R9.1, R12.4).
    ///
    /// # Errors
    /// As [`Process::live`].
    pub fn set_imex_channel(&self, granted: bool) -> Result<(), FabricError> {
        self.done("set_imex_channel", &Request::SetImexChannel(granted))
    }

    /// `cuMemExportToShareableHandle` of an allocation or classic multicast
    /// object of this process (C5): a token standing for the POSIX file
    /// descriptor or fabric handle, to pass to another process.
    ///
    /// # Errors
    /// [`FabricError::Driver`] with the model's code.
    pub fn export_shareable(&self, handle: u64, kind: ShareableKind) -> Result<u64, FabricError> {
        self.handle(
            "export_shareable",
            &Request::ExportShareable { handle, kind },
        )
    }

    /// `cuMemImportFromShareableHandle` (C5): this process's handle on the
    /// memory or object behind `token`.
    ///
    /// # Errors
    /// [`FabricError::Driver`]: `INVALID_VALUE` for a POSIX descriptor from
    /// another node or a closed token, `NOT_PERMITTED` for a fabric handle
    /// without an IMEX channel (R12.4).
    pub fn import_shareable(&self, token: u64, kind: ShareableKind) -> Result<u64, FabricError> {
        self.handle(
            "import_shareable",
            &Request::ImportShareable { token, kind },
        )
    }

    /// Exports an allocation or classic multicast object of this process
    /// as a real POSIX file descriptor (C5), to pass to a process of the
    /// same node with `SCM_RIGHTS` (or `pidfd_getfd`). The descriptor is an
    /// unnamed temporary file holding the fabric's token.
    ///
    /// # Errors
    /// As [`Process::export_shareable`]; [`FabricError::Descriptor`] when
    /// the file cannot be made.
    pub fn export_fd(&self, handle: u64) -> Result<OwnedFd, FabricError> {
        let token = self.export_shareable(handle, ShareableKind::PosixFd)?;
        shareable::token_fd(self.remote.welcome.fabric, token).map_err(FabricError::Descriptor)
    }

    /// Imports a descriptor made by [`Process::export_fd`] (here or, passed
    /// over a Unix socket, in another process): this process's handle on
    /// the memory or object.
    ///
    /// # Errors
    /// [`FabricError::Descriptor`] for a descriptor that is not one;
    /// otherwise as [`Process::import_shareable`] (`INVALID_VALUE` from
    /// another node, R12.4).
    pub fn import_fd(&self, fd: BorrowedFd<'_>) -> Result<u64, FabricError> {
        let token = shareable::fd_token(fd)
            .filter(|&(tag, _)| tag == self.remote.welcome.fabric)
            .ok_or_else(|| {
                FabricError::Descriptor(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a descriptor exported by this model fabric",
                ))
            })?
            .1;
        self.import_shareable(token, ShareableKind::PosixFd)
    }

    fn handle(&self, what: &'static str, req: &Request) -> Result<u64, FabricError> {
        match self.remote.ask(what, req)? {
            Reply::Handle(r) => r.map_err(|code| FabricError::Driver {
                request: what,
                code,
            }),
            r => Err(unexpected(what, r)),
        }
    }

    fn done(&self, what: &'static str, req: &Request) -> Result<(), FabricError> {
        match self.remote.ask(what, req)? {
            Reply::Done(r) => r.map_err(|code| FabricError::Driver {
                request: what,
                code,
            }),
            r => Err(unexpected(what, r)),
        }
    }
}

/// Joins the fabric as a new process: the [`Process`] handle, whose
/// [`Process::remote`] is that process's driver on the fabric's model
/// (`cuda_endpoints::fabric::connect` wraps it in a `Context`).
///
/// # Errors
/// [`FabricError::Connect`] when nothing listens at the socket;
/// [`FabricError::Refused`] when the fabric has no such node or speaks
/// another protocol version.
pub fn open(join: &Join) -> Result<Process, FabricError> {
    let remote = Arc::new(Remote::open(join)?);
    Ok(Process { remote })
}

/// Joins the fabric named by [`super::FABRIC_ENV`] ([`Join::from_env`]);
/// `Ok(None)` when the variable is not set.
///
/// # Errors
/// As [`open`] and [`Join::from_env`].
pub fn open_env() -> Result<Option<Process>, FabricError> {
    match Join::from_env()? {
        Some(join) => open(&join).map(Some),
        None => Ok(None),
    }
}

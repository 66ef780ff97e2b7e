//! [`UniqueId`]: what rank 0 of a TCP job hands to the others out of band,
//! as NCCL's unique id: the address rank 0 listens on, a random job id and a
//! random 128-bit job secret, written as one string
//! (`cebs1/<ip:port>/<job>/<secret>`) for an environment variable
//! ([`UNIQUE_ID_ENV`]) or a file.
//!
//! The secret keeps a stray or stale process (another job's id, a port
//! scanner) out of the job, and rank 0 proves it knows it too (a
//! challenge-response, see [`Tcp`](crate::Tcp)); it is not a protection
//! against an attacker who can read the id or the loopback traffic.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use super::api::Deadline;
use super::error::{BootstrapError, IdProblem};

/// The environment variable that carries a [`UniqueId`] to the ranks.
pub const UNIQUE_ID_ENV: &str = "CUDA_ENDPOINTS_BOOTSTRAP_ID";

/// This rank's rank in the job, set by a launcher ([`Tcp::from_env`](crate::Tcp::from_env)).
pub const RANK_ENV: &str = "CUDA_ENDPOINTS_RANK";
/// The number of ranks in the job, set by a launcher.
pub const SIZE_ENV: &str = "CUDA_ENDPOINTS_SIZE";
/// The (model) node this rank runs on, set by a launcher.
pub const NODE_ENV: &str = "CUDA_ENDPOINTS_NODE";
/// Rank 0's listening socket, inherited from a launcher that bound it (a
/// descriptor number): [`Tcp::from_env`](crate::Tcp::from_env) takes it
/// instead of binding the id's address again, so no other process can take
/// the port between the launcher's choice and rank 0's start.
pub const LISTEN_FD_ENV: &str = "CUDA_ENDPOINTS_BOOTSTRAP_LISTEN_FD";

const PREFIX: &str = "cebs1";

/// The unique id of a TCP bootstrap job (see the module doc).
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    pub(crate) addr: SocketAddr,
    pub(crate) job: u64,
    pub(crate) secret: [u8; 16],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("UniqueId")
            .field("addr", &self.addr)
            .field("job", &format_args!("{:016x}", self.job))
            .finish_non_exhaustive()
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}/{}/{:016x}/", self.addr, self.job)?;
        for b in self.secret {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

fn syntax(part: &'static str) -> BootstrapError {
    BootstrapError::InvalidId {
        what: IdProblem::Syntax { part },
    }
}

impl FromStr for UniqueId {
    type Err = BootstrapError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split('/');
        if parts.next() != Some(PREFIX) {
            return Err(syntax("prefix"));
        }
        let addr = parts
            .next()
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .ok_or_else(|| syntax("address"))?;
        let job = parts
            .next()
            // Hex digits only: `from_str_radix` takes a leading `+`, and one
            // id has one spelling.
            .filter(|j| j.len() == 16 && j.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|j| u64::from_str_radix(j, 16).ok())
            .ok_or_else(|| syntax("job"))?;
        let hex = parts
            .next()
            .filter(|h| h.len() == 32 && h.bytes().all(|c| c.is_ascii_hexdigit()))
            .ok_or_else(|| syntax("secret"))?;
        let mut secret = [0u8; 16];
        for (i, b) in secret.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or_else(|| syntax("secret"))?;
            *b = u8::from_str_radix(pair, 16).map_err(|_| syntax("secret"))?;
        }
        if parts.next().is_some() {
            return Err(syntax("secret"));
        }
        Ok(UniqueId { addr, job, secret })
    }
}

impl UniqueId {
    pub(crate) fn random(addr: SocketAddr) -> std::io::Result<Self> {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut job = [0u8; 8];
        job.copy_from_slice(&bytes[..8]);
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&bytes[8..]);
        Ok(UniqueId {
            addr,
            job: u64::from_le_bytes(job),
            secret,
        })
    }

    /// A fresh id for a job whose rank 0 will listen on `addr` (a random
    /// job id and secret), for a launcher that starts the ranks itself and
    /// hands them the id ([`Tcp::from_env`](crate::Tcp::from_env)).
    ///
    /// # Errors
    /// The system's random source.
    pub fn generate(addr: SocketAddr) -> std::io::Result<Self> {
        Self::random(addr)
    }

    /// The address rank 0 listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The job id carried by every message of this job.
    pub fn job(&self) -> u64 {
        self.job
    }

    /// Reads the id from [`UNIQUE_ID_ENV`].
    ///
    /// # Errors
    /// [`BootstrapError::InvalidId`] when unset or unparsable.
    pub fn from_env() -> Result<Self, BootstrapError> {
        let v = std::env::var(UNIQUE_ID_ENV).map_err(|_| BootstrapError::InvalidId {
            what: IdProblem::Unset { var: UNIQUE_ID_ENV },
        })?;
        v.parse()
    }

    /// Writes the id to `path` atomically (a temporary file renamed into
    /// place), so a reader never sees half an id. The file's mode is set to
    /// 0600 explicitly (never left to the umask), and the directory must be
    /// one [`UniqueId::read_file`] trusts: owned by this user and writable
    /// by no one else.
    ///
    /// # Errors
    /// The file system's; [`std::io::ErrorKind::PermissionDenied`] for a
    /// directory others can write.
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if let Err(why) = check_dir(path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{}: {why}", path.display()),
            ));
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let result = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc_nofollow())
                .open(&tmp)?;
            // The umask can only clear bits; set the mode outright anyway.
            rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(0o600))?;
            f.write_all(self.to_string().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Reads the id from `path`, waiting up to `timeout` for rank 0 to write it.
    ///
    /// The id is a secret and says whom to trust as rank 0, so a file that
    /// another user could have planted or changed is refused
    /// ([`IdProblem::Untrusted`]): the file must be a regular file (not a
    /// symbolic link) owned by this user and writable by no one else, in a
    /// directory owned by this user and writable by no one else (a shared
    /// sticky directory such as `/tmp` is refused: make a 0700 directory).
    ///
    /// # Errors
    /// [`BootstrapError::InvalidId`] when the file does not appear in time,
    /// cannot be read, is not trusted or does not parse.
    pub fn read_file(path: &Path, timeout: Duration) -> Result<Self, BootstrapError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let untrusted = |why: &'static str| BootstrapError::InvalidId {
            what: IdProblem::Untrusted {
                path: path.to_owned(),
                why,
            },
        };
        check_dir(path).map_err(untrusted)?;
        let deadline = Deadline::after(timeout);
        loop {
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc_nofollow())
                .open(path);
            match opened {
                Ok(mut f) => {
                    let st = rustix::fs::fstat(&f).map_err(|e| BootstrapError::InvalidId {
                        what: IdProblem::File {
                            path: path.to_owned(),
                            kind: std::io::Error::from(e).kind(),
                        },
                    })?;
                    check_owner_mode(&st, false).map_err(untrusted)?;
                    // An id is ~100 bytes; a larger file is not one.
                    let mut s = String::new();
                    let read = (&mut f).take(4096).read_to_string(&mut s);
                    if let Err(e) = read {
                        return Err(BootstrapError::InvalidId {
                            what: IdProblem::File {
                                path: path.to_owned(),
                                kind: e.kind(),
                            },
                        });
                    }
                    return s.parse();
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !deadline.passed() => {
                    std::thread::sleep(deadline.remaining().min(Duration::from_millis(10)));
                }
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                    return Err(untrusted("it is a symbolic link"));
                }
                Err(e) => {
                    return Err(BootstrapError::InvalidId {
                        what: IdProblem::File {
                            path: path.to_owned(),
                            kind: e.kind(),
                        },
                    });
                }
            }
        }
    }
}

/// `O_NOFOLLOW`: an id file is never reached through a symbolic link.
fn libc_nofollow() -> i32 {
    i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0)
}

/// Owned by this (effective) user and writable by no one else; a
/// directory must be a directory, a file a regular file.
fn check_owner_mode(st: &rustix::fs::Stat, dir: bool) -> Result<(), &'static str> {
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if dir && kind != rustix::fs::FileType::Directory {
        return Err("its directory is not a directory");
    }
    if !dir && kind != rustix::fs::FileType::RegularFile {
        return Err("it is not a regular file");
    }
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(if dir {
            "its directory is owned by another user"
        } else {
            "it is owned by another user"
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(if dir {
            "its directory is writable by group or others (use a 0700 directory)"
        } else {
            "it is writable by group or others"
        });
    }
    Ok(())
}

/// The directory of `path` is one only this user can write.
fn check_dir(path: &Path) -> Result<(), &'static str> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let st = rustix::fs::stat(dir).map_err(|_| "its directory cannot be examined")?;
    check_owner_mode(&st, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_through_its_string() {
        let id = UniqueId::random(
            "127.0.0.1:4242"
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 1))),
        );
        let id = id.unwrap_or_else(|_| UniqueId {
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            job: 7,
            secret: [3; 16],
        });
        assert_eq!(id.to_string().parse::<UniqueId>().ok(), Some(id.clone()));
        let v6 = UniqueId {
            addr: "[::1]:9".parse().unwrap_or(id.addr),
            ..id.clone()
        };
        assert_eq!(v6.to_string().parse::<UniqueId>().ok(), Some(v6));
        for bad in [
            "",
            "cebs1",
            "cebs2/127.0.0.1:1/0000000000000000/00000000000000000000000000000000",
            "cebs1/x/0/0",
            // One spelling an id: no sign before a field's hex digits.
            "cebs1/127.0.0.1:1/+000000000000007/00000000000000000000000000000000",
            "cebs1/127.0.0.1:1/0000000000000007/+0000000000000000000000000000000",
        ] {
            assert!(bad.parse::<UniqueId>().is_err(), "{bad}");
        }
        assert!(!format!("{id:?}").contains(&id.to_string()[id.to_string().len() - 32..]));
    }
}

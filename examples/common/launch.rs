//! A job of OS processes on a model fabric, bootstrapped over TCP with a
//! unique id (as NCCL's), as `tcp_team` and the data examples run it: this
//! program is the launcher and rank 0; it starts a fabric of `[nodes]` nodes
//! and `[ranks] - 1` copies of itself, which find their rank, the fabric and
//! the bootstrap id in their environment (the variables the
//! `cuda-endpoints-fabric` launcher sets) and its `--` flags (its mode).
//! Every wait is bounded; the child
//! ranks are killed and reaped on every path, the socket's directory
//! removed.

use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use cuda_endpoints::Context;
use cuda_endpoints::bootstrap::{RANK_ENV, SIZE_ENV, Tcp, TcpRoot, UNIQUE_ID_ENV};
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;

use super::Me;
use super::ranks::Ranks;

/// Every wait of a job is bounded by this.
pub const TIMEOUT: Duration = Duration::from_secs(20);

type Error = Box<dyn std::error::Error>;

/// One rank, joined: its rank, context, process and bootstrap.
pub struct Joined {
    pub rank: usize,
    pub ctx: Context,
    pub me: Me,
    pub boot: Tcp,
}

/// This process as a rank that a launcher started (a [`Launch`], or
/// `cuda-endpoints-fabric -n N`): `None` when it is not one.
pub fn child() -> Option<Result<Joined, Error>> {
    let rank = std::env::var(RANK_ENV).ok()?;
    Some((|| {
        let rank: usize = rank.parse()?;
        let (ctx, me) = super::join(rank)?;
        let boot = Tcp::from_env(TIMEOUT)?;
        Ok(Joined {
            rank,
            ctx,
            me,
            boot,
        })
    })())
}

/// The launcher's side of a job: the fabric, the other ranks, the bootstrap
/// root until rank 0 joins.
pub struct Launch {
    /// Ranks in all, and nodes (from the command line: `[ranks] [nodes]`,
    /// 4 and 1 when left out).
    pub size: usize,
    pub nodes: usize,
    /// Every rank runs the real driver (`--driver cuda`).
    pub cuda: bool,
    /// When the fabric started.
    pub start: Instant,
    server: FabricServer,
    root: Option<TcpRoot>,
    ranks: Ranks,
    dir: tempfile::TempDir,
}

impl Launch {
    /// Starts the fabric (every node on `driver_version` where given) in a
    /// fresh directory named after `prefix`, then the other ranks.
    pub fn start(prefix: &str, driver_version: Option<i32>) -> Result<Launch, Error> {
        let cuda = super::wants_cuda();
        let mut args = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with("--") && a != "cuda");
        let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
        let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
        if size == 0 || nodes == 0 {
            return Err("ranks and nodes must be at least 1".into());
        }
        // The socket's path is chosen first: with the real driver, this
        // process (rank 0) reaches the fabric through libcuda, which reads
        // the path from the environment.
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let socket: PathBuf = dir.path().join("fabric.sock");
        if cuda {
            // SAFETY: no thread has been started yet: nothing else reads or
            // writes the environment now.
            unsafe {
                std::env::set_var(fabric::FABRIC_ENV, format!("{},rank=0", socket.display()))
            };
        }
        let mut config = FabricConfig::nodes(nodes, size.div_ceil(nodes));
        if let Some(version) = driver_version {
            for n in &mut config.nodes {
                n.driver_version = version;
            }
        }
        let server = FabricServer::start_at(config, &socket)?;
        let (id, root) = Tcp::root("127.0.0.1:0".parse()?)?;
        let start = Instant::now();
        // Every rank runs the launcher's mode: its flags go to each.
        let flags: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a.starts_with("--") && !a.starts_with("--driver"))
            .collect();
        let mut ranks = Ranks(Vec::new());
        for r in 1..size {
            let mut cmd = Command::new(std::env::current_exe()?);
            if cuda {
                cmd.args(["--driver", "cuda"]);
            }
            cmd.args(&flags);
            let child = cmd
                .env(
                    fabric::FABRIC_ENV,
                    format!("{},rank={r}", server.socket().display()),
                )
                .env(UNIQUE_ID_ENV, id.to_string())
                .env(RANK_ENV, r.to_string())
                .env(SIZE_ENV, size.to_string())
                .spawn()?;
            ranks.0.push(child);
        }
        Ok(Launch {
            size,
            nodes,
            cuda,
            start,
            server,
            root: Some(root),
            ranks,
            dir,
        })
    }

    /// Rank 0 joins: its context and process, and the bootstrap once every
    /// rank joined.
    pub fn join0(&mut self) -> Result<(Context, Me, Tcp), Error> {
        let (ctx, me) = if self.cuda {
            super::join(0)?
        } else {
            let (ctx, me) = fabric::connect(&fabric::Join::new(self.server.socket()).rank(0))?;
            (ctx, Me::Fabric(me))
        };
        let root = self.root.take().ok_or("rank 0 joins once")?;
        Ok((ctx, me, root.accept(self.size, TIMEOUT)?))
    }

    /// How ranks 1.. ended, in rank order; `None` for one that did not
    /// finish in time. All are killed and reaped now.
    pub fn wait_ranks(&mut self) -> Result<Vec<Option<ExitStatus>>, Error> {
        let deadline = Instant::now() + TIMEOUT;
        let mut ended = Vec::with_capacity(self.ranks.0.len());
        for c in &mut self.ranks.0 {
            let status = loop {
                if let Some(st) = c.try_wait()? {
                    break Some(st);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            ended.push(status);
        }
        drop(std::mem::replace(&mut self.ranks, Ranks(Vec::new())));
        Ok(ended)
    }

    /// The fabric, once every other rank left it and (on the fabric's own
    /// driver) rank 0 too: with the real driver, this process's libcuda
    /// stays on the fabric until it exits, as a real driver's state does.
    pub fn settled(&self) -> &FabricServer {
        if self.cuda {
            self.server.wait_exits(self.size - 1, TIMEOUT);
        } else {
            self.server.wait_idle(TIMEOUT);
        }
        &self.server
    }

    /// Stops the fabric and removes its directory.
    pub fn close(self) -> Result<(), Error> {
        drop(self.server);
        self.dir.close()?;
        Ok(())
    }
}

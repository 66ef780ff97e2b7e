//! [`Join`]: how a process reaches a fabric — the socket, and where on the
//! fabric it runs — read from `CUDA_ENDPOINTS_FABRIC` or built in code.
//!
//! The variable reads `<socket path>[,node=N][,rank=R][,imex=0|1]`:
//! - `node`: the node to run on;
//! - `rank`: place by rank instead (ranks fill the nodes in order, one per
//!   device: with 4 GPUs per node, ranks 0–3 on node 0 and use devices 0–3,
//!   ranks 4–7 on node 1...). Without `node` or `rank` in the variable, the
//!   rank comes from the first of [`RANK_VARS`] that is set (Open MPI,
//!   PMIx, MPICH/PMI, Slurm); without any, node 0;
//! - `imex`: whether the process has an IMEX channel (default: the fabric's).
//!
//! The socket path is everything before the first comma.

use std::path::PathBuf;
use std::time::Duration;

use super::FabricError;

/// The environment variable a fabric's processes find it by.
pub const FABRIC_ENV: &str = "CUDA_ENDPOINTS_FABRIC";

/// Where the rank of a job's process is read from, first found wins:
/// `CUDA_ENDPOINTS_RANK`, then Open MPI, PMIx, PMI (MPICH) and Slurm.
pub const RANK_VARS: &[&str] = &[
    "CUDA_ENDPOINTS_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];

/// How long a client waits for any one answer of the fabric by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to join a fabric: its socket, and the new process's place on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    /// The fabric server's Unix socket.
    pub socket: PathBuf,
    /// The node to run on.
    pub node: Option<u32>,
    /// The job rank, to place the process when `node` is not given.
    pub rank: Option<u32>,
    /// Whether the process has an IMEX channel; `None`: the fabric's default.
    pub imex_channel: Option<bool>,
    /// The longest wait for one answer; past it the connection is dropped
    /// and every driver call answers `DEINITIALIZED`.
    pub timeout: Duration,
}

impl Join {
    /// Joins the fabric at `socket`, on node 0 unless told otherwise.
    pub fn new(socket: impl Into<PathBuf>) -> Join {
        Join {
            socket: socket.into(),
            node: None,
            rank: None,
            imex_channel: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Runs on `node`.
    pub fn node(mut self, node: u32) -> Join {
        self.node = Some(node);
        self
    }

    /// Placed by `rank` (when no node is given).
    pub fn rank(mut self, rank: u32) -> Join {
        self.rank = Some(rank);
        self
    }

    /// With or without an IMEX channel.
    pub fn imex_channel(mut self, granted: bool) -> Join {
        self.imex_channel = Some(granted);
        self
    }

    /// Waits at most `timeout` for each answer.
    pub fn timeout(mut self, timeout: Duration) -> Join {
        self.timeout = timeout;
        self
    }

    /// Reads a [`FABRIC_ENV`] value (see the module docs).
    ///
    /// # Errors
    /// [`FabricError::BadJoin`] naming the part that could not be read.
    pub fn parse(spec: &str) -> Result<Join, FabricError> {
        let mut parts = spec.split(',');
        let path = parts.next().unwrap_or("").trim();
        let bad = |part: &str, why: &'static str| FabricError::BadJoin {
            spec: spec.to_string(),
            part: part.to_string(),
            why,
        };
        if path.is_empty() {
            return Err(bad(path, "the socket path is empty"));
        }
        let mut join = Join::new(path);
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(part, "options read `key=value`"))?;
            let number = || {
                value
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| bad(part, "not a number"))
            };
            match key.trim() {
                "node" => join.node = Some(number()?),
                "rank" => join.rank = Some(number()?),
                "imex" => {
                    join.imex_channel = Some(match value.trim() {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(bad(part, "imex is 0 or 1")),
                    })
                }
                _ => return Err(bad(part, "known options are node, rank and imex")),
            }
        }
        Ok(join)
    }

    /// The [`FABRIC_ENV`] of this process, with the rank from [`RANK_VARS`]
    /// when the variable gives neither node nor rank; `Ok(None)` when it is
    /// not set.
    ///
    /// # Errors
    /// [`FabricError::BadJoin`] for a value that does not read.
    pub fn from_env() -> Result<Option<Join>, FabricError> {
        let Some(spec) = std::env::var_os(FABRIC_ENV) else {
            return Ok(None);
        };
        let spec = spec.to_string_lossy();
        let mut join = Join::parse(&spec)?;
        if join.node.is_none() && join.rank.is_none() {
            join.rank = RANK_VARS
                .iter()
                .find_map(|v| std::env::var(v).ok()?.trim().parse().ok());
        }
        Ok(Some(join))
    }

    /// This join as an [`FABRIC_ENV`] value.
    pub fn to_spec(&self) -> String {
        let mut s = self.socket.display().to_string();
        if let Some(n) = self.node {
            s.push_str(&format!(",node={n}"));
        }
        if let Some(r) = self.rank {
            s.push_str(&format!(",rank={r}"));
        }
        if let Some(i) = self.imex_channel {
            s.push_str(&format!(",imex={}", u8::from(i)));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_read_and_write_back() {
        let j = Join::parse("/tmp/x/fabric.sock,node=1,imex=0").unwrap();
        assert_eq!(j.socket, PathBuf::from("/tmp/x/fabric.sock"));
        assert_eq!(
            (j.node, j.rank, j.imex_channel),
            (Some(1), None, Some(false))
        );
        assert_eq!(Join::parse(&j.to_spec()).unwrap(), j);
        assert_eq!(Join::parse("/s,rank=7").unwrap().rank, Some(7));
        for bad in [
            "",
            ",node=1",
            "/s,node",
            "/s,node=x",
            "/s,imex=2",
            "/s,color=red",
        ] {
            assert!(
                matches!(Join::parse(bad), Err(FabricError::BadJoin { .. })),
                "{bad}"
            );
        }
    }
}

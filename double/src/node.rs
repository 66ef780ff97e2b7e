//! What answers the double's calls: a reference model of this OS process's
//! own (the default), or this process's place on a model fabric shared with
//! other OS processes, each loading the double, as the processes of a job
//! share a real cluster's driver state.
//!
//! The fabric is joined when the environment names one in
//! `CUDA_ENDPOINTS_FABRIC` (the variable `cuda_endpoints::fabric` clients
//! and the `cuda-endpoints-fabric` launcher use: a program run under the
//! launcher with the real backend gets the double on the launcher's
//! fabric), unless `CUDA_DOUBLE_FABRIC=0`. The fabric then decides the node
//! (devices, driver version, cliques): `CUDA_DOUBLE_CONFIG` and its sibling
//! variables are not read, and `cuDoubleReset` is refused. Closing the
//! connection (this process's exit, or its kill) is its exit on the fabric
//! (SPEC R12.2).

use std::sync::Arc;

use cuda_endpoints::driver::{Call, Code, Driver};
use cuda_endpoints::fabric::{self, FabricError, Process};
use cuda_endpoints::model::{Live, Model, faults::FaultPlan};

use crate::abi::CUresult;

/// `CUDA_ERROR_NOT_INITIALIZED`: what a fabric that could not be joined answers.
const NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_DEINITIALIZED`: the fabric went away.
const DEINITIALIZED: CUresult = 4;
const INVALID_VALUE: CUresult = 1;
const UNKNOWN: CUresult = 999;

/// The environment switch that keeps the double on its own model even where
/// a fabric is named (`0`).
pub const FABRIC_SWITCH: &str = "CUDA_DOUBLE_FABRIC";

/// The model behind the entry points. Cheap to clone: calls are made on a
/// clone, outside the double's lock (a fabric call may wait on a socket).
#[derive(Clone)]
pub enum Node {
    /// This process's own model.
    Local(Model),
    /// This process on a model fabric.
    Fabric(Process),
    /// The fabric the environment names could not be joined (the reason was
    /// logged): every call answers `NOT_INITIALIZED`.
    Unreachable(Arc<str>),
}

/// Whether the environment asks for a fabric.
pub fn fabric_requested() -> bool {
    std::env::var(FABRIC_SWITCH).map_or(true, |v| v.trim() != "0")
        && std::env::var_os(fabric::FABRIC_ENV).is_some()
}

/// Joins the fabric the environment names.
pub fn join_fabric() -> Node {
    match fabric::connect_env() {
        Ok(Some((_ctx, me))) => Node::Fabric(me),
        Ok(None) => Node::Unreachable(Arc::from(format!("{} is not set", fabric::FABRIC_ENV))),
        Err(e) => {
            let why = format!("cannot join the fabric of {}: {e}", fabric::FABRIC_ENV);
            eprintln!("libcuda test double: {why}");
            Node::Unreachable(Arc::from(why))
        }
    }
}

fn code_of(e: &FabricError) -> CUresult {
    match e {
        FabricError::Driver { code, .. } => code.raw(),
        FabricError::TooLarge { .. } => INVALID_VALUE,
        FabricError::Lost { .. } => DEINITIALIZED,
        _ => UNKNOWN,
    }
}

impl Node {
    /// Runs one driver call on the node.
    pub fn call<T>(&self, f: impl FnOnce(&dyn Driver) -> Result<T, Code>) -> Result<T, CUresult> {
        match self {
            Node::Local(m) => f(m).map_err(|c| c.raw()),
            Node::Fabric(p) => f(&*p.remote()).map_err(|c| c.raw()),
            Node::Unreachable(_) => Err(NOT_INITIALIZED),
        }
    }

    /// Writes device memory mapped in this process.
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), CUresult> {
        match self {
            Node::Local(m) => m.write(ptr, bytes).map_err(|c| c.raw()),
            Node::Fabric(p) => {
                let step = fabric::wire::MAX_MEMORY_IO;
                for (i, chunk) in bytes.chunks(step).enumerate() {
                    let at = ptr.wrapping_add((i * step) as u64);
                    p.write(at, chunk).map_err(|e| code_of(&e))?;
                }
                Ok(())
            }
            Node::Unreachable(_) => Err(NOT_INITIALIZED),
        }
    }

    /// Reads device memory mapped in this process.
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, CUresult> {
        match self {
            Node::Local(m) => m.read(ptr, len).map_err(|c| c.raw()),
            Node::Fabric(p) => {
                let step = fabric::wire::MAX_MEMORY_IO;
                let mut out = Vec::with_capacity(len.min(1 << 24));
                while out.len() < len {
                    let k = (len - out.len()).min(step);
                    let at = ptr.wrapping_add(out.len() as u64);
                    out.extend(p.read(at, k).map_err(|e| code_of(&e))?);
                }
                Ok(out)
            }
            Node::Unreachable(_) => Err(NOT_INITIALIZED),
        }
    }

    /// What this process holds (leak counters).
    pub fn live(&self) -> Result<Live, CUresult> {
        match self {
            Node::Local(m) => Ok(m.live()),
            Node::Fabric(p) => p.live().map_err(|e| code_of(&e)),
            Node::Unreachable(_) => Err(NOT_INITIALIZED),
        }
    }

    /// The model's violation log, `(call, rule, code)`: on a fabric, every
    /// process's.
    pub fn violations(&self) -> Vec<(String, String, u32)> {
        match self {
            Node::Local(m) => m
                .violations()
                .into_iter()
                .map(|v| (v.call.name().to_owned(), v.rule.to_owned(), v.code.raw()))
                .collect(),
            Node::Fabric(p) => match p.violations() {
                Ok(v) => v
                    .into_iter()
                    .map(|v| (v.call, v.rule, v.code.raw()))
                    .collect(),
                Err(e) => vec![(
                    "cuDoubleViolations".to_owned(),
                    format!("double: the fabric did not answer: {e}"),
                    code_of(&e),
                )],
            },
            Node::Unreachable(why) => vec![(
                "cuInit".to_owned(),
                format!("double: {why}"),
                NOT_INITIALIZED,
            )],
        }
    }

    /// Replaces the fault plan (on a fabric: every process's).
    pub fn set_faults(&self, plan: FaultPlan) -> bool {
        match self {
            Node::Local(m) => {
                m.set_faults(plan);
                true
            }
            Node::Fabric(p) => p.set_faults(plan).is_ok(),
            Node::Unreachable(_) => false,
        }
    }

    /// Planned faults fired (a fabric does not say: 0).
    pub fn faults_fired(&self) -> u64 {
        match self {
            Node::Local(m) => m.faults_fired(),
            _ => 0,
        }
    }

    /// The calls that reached the model (a fabric does not say: none).
    pub fn trace(&self) -> Vec<Call> {
        match self {
            Node::Local(m) => m.trace(),
            _ => Vec::new(),
        }
    }

    /// This process's place on the fabric: its fabric pid, node, the
    /// number of nodes, its node's devices, its device when placed by rank
    /// (-1: none) and whether it has an IMEX channel. `None` off a fabric.
    pub fn place(&self) -> Option<[i64; 6]> {
        let Node::Fabric(p) = self else { return None };
        Some([
            i64::try_from(p.pid()).unwrap_or(-1),
            i64::from(p.node()),
            i64::from(p.nodes()),
            i64::from(p.devices()),
            p.device().map_or(-1, |d| i64::from(d.0)),
            i64::from(p.imex_channel()),
        ])
    }
}

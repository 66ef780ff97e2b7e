//! One rank of a multi-process test on a model fabric, through whichever
//! backend the suites run (`backend::is_cuda`):
//!
//! - by default the child joins the fabric named by `CUDA_ENDPOINTS_FABRIC`
//!   itself (`fabric::connect_env`: the `Remote` driver);
//! - with `CUDA_ENDPOINTS_TEST_BACKEND=cuda` (`ci/double.sh`) it opens the
//!   real backend, `driver::cuda::Cuda`, on the libcuda test double, and the
//!   double joins that same fabric (double/src/node.rs): every call of the
//!   child crosses the C ABI, and the processes of the job share endpoints,
//!   ids, nodes and memory as on a real cluster. Memory is written and read
//!   with `cuMemcpyHtoD`/`cuMemcpyDtoH`, and the leak counters come from the
//!   double (`cuDoubleLiveCounters`: this process on the fabric).
//!
//! Included by an area's `main.rs` beside `backend` (`../common/backend.rs`).
#![allow(dead_code)]

use std::sync::Arc;

use cuda_endpoints::driver::cuda::Cuda;
use cuda_endpoints::fabric::{self, Process};
use cuda_endpoints::model::Live;
use cuda_endpoints::{Context, Device, driver::Driver};

use crate::backend::{DoubleLib, is_cuda};

/// This rank's handle: where it runs and what the tests look at.
pub enum Me {
    /// A process of the fabric through the `Remote` driver.
    Fabric(Process),
    /// The real backend on the double, which is the fabric's process.
    Double {
        lib: &'static DoubleLib,
        device: Option<Device>,
        node: u32,
        imex_channel: bool,
    },
}

/// Joins the fabric through the `Remote` driver whatever the backend (for
/// what only the fabric's own client does: its shareable-handle tokens).
pub fn join_remote() -> (Context, Me) {
    let (ctx, me) = fabric::connect_env()
        .expect("fabric")
        .expect("CUDA_ENDPOINTS_FABRIC is set");
    (ctx, Me::Fabric(me))
}

/// Joins the fabric the environment names, through the suite's backend.
/// Panics (this is a test child) when it cannot.
pub fn join() -> (Context, Me) {
    if !is_cuda() {
        return join_remote();
    }
    let ctx = Context::cuda().expect("the real backend on the libcuda test double");
    let lib = DoubleLib::load().expect("the test double");
    let place = lib
        .fabric_place()
        .expect("the double joined the fabric of CUDA_ENDPOINTS_FABRIC");
    let device = i32::try_from(place.device)
        .ok()
        .filter(|&d| d >= 0)
        .map(Device);
    let me = Me::Double {
        lib,
        device,
        node: u32::try_from(place.node).expect("node"),
        imex_channel: place.imex_channel,
    };
    (ctx, me)
}

impl Me {
    /// The device a rank placed by rank uses.
    pub fn device(&self) -> Option<Device> {
        match self {
            Me::Fabric(p) => p.device(),
            Me::Double { device, .. } => *device,
        }
    }

    /// The node it runs on.
    pub fn node(&self) -> u32 {
        match self {
            Me::Fabric(p) => p.node(),
            Me::Double { node, .. } => *node,
        }
    }

    /// Its node as descriptor passing knows nodes: the model node's, so
    /// that two model nodes on this one host differ (`Process::node_id`).
    pub fn node_id(&self) -> cuda_endpoints::bootstrap::NodeId {
        match self {
            Me::Fabric(p) => p.node_id(),
            Me::Double { node, .. } => {
                let host = cuda_endpoints::bootstrap::NodeId::current()
                    .map(|n| n.hostname().to_owned())
                    .unwrap_or_default();
                cuda_endpoints::bootstrap::NodeId::from_parts(
                    &format!("{host}/model-node-{node}"),
                    &format!("model-node-{node}"),
                    0,
                )
            }
        }
    }

    /// Whether it had an IMEX channel when it joined.
    pub fn imex_channel(&self) -> bool {
        match self {
            Me::Fabric(p) => p.imex_channel(),
            Me::Double { imex_channel, .. } => *imex_channel,
        }
    }

    /// The fabric's own client, when this rank is one.
    pub fn process(&self) -> Option<&Process> {
        match self {
            Me::Fabric(p) => Some(p),
            Me::Double { .. } => None,
        }
    }

    /// What this process still holds on the fabric.
    pub fn live(&self) -> Live {
        match self {
            Me::Fabric(p) => p.live().expect("live"),
            Me::Double { lib, .. } => {
                let (live, _contexts) = lib.live();
                live
            }
        }
    }

    /// Writes device memory mapped in this process (`cuMemcpyHtoD` in the
    /// rank's device context, through the double).
    pub fn write(&self, ptr: u64, bytes: &[u8]) -> Result<(), String> {
        match self {
            Me::Fabric(p) => p.write(ptr, bytes).map_err(|e| e.to_string()),
            Me::Double { lib, device, .. } => lib
                .memcpy_htod(device.map_or(0, |d| d.0), ptr, bytes)
                .map_err(|c| format!("cuMemcpyHtoD: {c}")),
        }
    }

    /// Reads device memory mapped in this process (`cuMemcpyDtoH`).
    pub fn read(&self, ptr: u64, len: usize) -> Result<Vec<u8>, String> {
        match self {
            Me::Fabric(p) => p.read(ptr, len).map_err(|e| e.to_string()),
            Me::Double { lib, device, .. } => lib
                .memcpy_dtoh(device.map_or(0, |d| d.0), ptr, len)
                .map_err(|c| format!("cuMemcpyDtoH: {c}")),
        }
    }

    /// This process's driver, to stack a wrapper on (the classic fallback).
    pub fn driver(&self) -> Arc<dyn Driver> {
        match self {
            Me::Fabric(p) => p.remote(),
            Me::Double { .. } => Arc::new(Cuda::open().expect("the real backend")),
        }
    }

    /// The double's own violations in this process (contexts, calls before
    /// `cuInit`: what only the C side sees); the model's log is the
    /// fabric server's, which the parent reads. Empty off the double.
    pub fn own_violations(&self) -> Vec<String> {
        match self {
            Me::Fabric(_) => Vec::new(),
            Me::Double { lib, .. } => lib
                .violations()
                .into_iter()
                .filter(|(_, rule, _)| rule.starts_with("double:"))
                .map(|(call, rule, code)| format!("{call} {rule} {code}"))
                .collect(),
        }
    }
}

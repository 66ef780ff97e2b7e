//! The simulated node, from the environment or from `cuDoubleReset`. Not
//! read when the double is a process of a model fabric ([`crate::node`]):
//! the fabric decides the node.
//!
//! Environment (read once, at the first call):
//! - `CUDA_DOUBLE_CONFIG`: a full configuration in the text form below;
//! - otherwise `CUDA_DOUBLE_DEVICES` (default 4), `CUDA_DOUBLE_VERSION`
//!   (`13000`, `13030`, `13040` or `13050`; default 13050, or 13000 in the
//!   `cuda-13000` build), `CUDA_DOUBLE_CLIQUES` (comma-separated clique id
//!   per device, e.g. `0,0,1,1`), `CUDA_DOUBLE_QUERIES` (queries until an
//!   endpoint is constructed, default 2).
//!
//! Text form (what the test fixture's encoder writes): `;`-separated
//! `key=value` with keys `version`, `queries`, `max_ids`, `fabric_memory`
//! (0/1) and `devices`: devices separated by `,`, each
//! `bind_alignment:max_size:granularity:recommended:memory:clique:numa:flags`
//! with flag bits 1 unicast, 2 multicast, 4 counted ops, 8 unicast owner
//! access, 16 classic multicast, 32 fabric, 64 FABRIC in attribute 158.

use cuda_endpoints::model::{ModelConfig, SimDevice};

fn env_num<T: std::str::FromStr>(key: &str) -> Option<T> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

/// The node the environment asks for (defaults where it says nothing or
/// says something unreadable: the double must not fail to load).
pub fn from_env() -> ModelConfig {
    if let Some(cfg) = std::env::var("CUDA_DOUBLE_CONFIG")
        .ok()
        .and_then(|s| parse(&s))
    {
        return cfg;
    }
    let n: usize = env_num::<usize>("CUDA_DOUBLE_DEVICES").unwrap_or(4).min(64);
    let default_version = if cfg!(feature = "cuda-13000") {
        13000
    } else {
        13050
    };
    let version: i32 = env_num("CUDA_DOUBLE_VERSION").unwrap_or(default_version);
    let mut cfg = if version < 13030 {
        ModelConfig::cuda_13_0(n)
    } else {
        ModelConfig::node(n)
    };
    cfg.driver_version = version;
    if let Some(q) = env_num("CUDA_DOUBLE_QUERIES") {
        cfg.queries_to_ready = q;
    }
    if let Ok(cliques) = std::env::var("CUDA_DOUBLE_CLIQUES") {
        for (d, c) in cfg.devices.iter_mut().zip(cliques.split(',')) {
            if let Ok(c) = c.trim().parse() {
                d.clique = c;
            }
        }
    }
    cfg
}

/// Parses the text form; `None` when anything is off.
pub fn parse(s: &str) -> Option<ModelConfig> {
    let mut cfg = ModelConfig::node(0);
    for kv in s.split(';').map(str::trim).filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=')?;
        match k.trim() {
            "version" => cfg.driver_version = v.parse().ok()?,
            "queries" => cfg.queries_to_ready = v.parse().ok()?,
            "max_ids" => cfg.max_ids = v.parse().ok()?,
            "fabric_memory" => cfg.fabric_memory_permitted = v == "1",
            "devices" => {
                cfg.devices = v
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(device)
                    .collect::<Option<Vec<_>>>()?;
            }
            _ => return None,
        }
    }
    (cfg.devices.len() <= 64).then_some(cfg)
}

#[allow(clippy::needless_update)]
fn device(s: &str) -> Option<SimDevice> {
    let f: Vec<&str> = s.split(':').collect();
    let [ba, ms, gr, rg, mem, clique, numa, flags] = f.as_slice() else {
        return None;
    };
    let flags: u32 = flags.parse().ok()?;
    let bit = |b: u32| flags & b != 0;
    Some(SimDevice {
        bind_alignment: ba.parse().ok()?,
        max_size: ms.parse().ok()?,
        granularity: gr.parse().ok()?,
        recommended_granularity: rg.parse().ok()?,
        memory: mem.parse().ok()?,
        clique: clique.parse().ok()?,
        host_numa_id: numa.parse().ok()?,
        unicast: bit(1),
        multicast: bit(2),
        counted_ops: bit(4),
        unicast_owner_access: bit(8),
        classic_multicast: bit(16),
        fabric: bit(32),
        le_fabric_handles: bit(64),
        // Fields added to the model later keep their defaults.
        ..SimDevice::default()
    })
}

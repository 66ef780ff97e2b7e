//! Simulated devices and the node they sit in.

/// One simulated GPU: its limits and the attributes it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDevice {
    /// `bindAlignment` from `cuLogicalEndpointGetLimits`, bytes (R10).
    pub bind_alignment: u64,
    /// `maxSize` from `cuLogicalEndpointGetLimits`, bytes per device (R10).
    pub max_size: u64,
    /// Minimum VMM allocation granularity, bytes.
    pub granularity: u64,
    /// Recommended VMM allocation granularity, bytes.
    pub recommended_granularity: u64,
    /// Device memory, bytes (`cuMemGetInfo` total).
    pub memory: u64,
    /// The clique this device belongs to (R4.5; 13.4+).
    pub clique: u32,
    /// `HOST_NUMA_ID` (attribute 134), for host-NUMA bind targets (R5.5).
    pub host_numa_id: i32,
    /// Attribute 153.
    pub unicast: bool,
    /// Attribute 154.
    pub multicast: bool,
    /// Attribute 155 (R2.4).
    pub counted_ops: bool,
    /// Attribute 156.
    pub unicast_owner_access: bool,
    /// `MULTICAST_SUPPORTED` (attribute 132), for the classic API (C6).
    pub classic_multicast: bool,
    /// `HANDLE_TYPE_FABRIC_SUPPORTED` (attribute 128).
    pub fabric: bool,
    /// `LOGICAL_ENDPOINT_SUPPORTED_HANDLE_TYPES` (attribute 158, 13.5+)
    /// includes `FABRIC`: the device can take part in an exportable endpoint.
    pub le_fabric_handles: bool,
}

impl Default for SimDevice {
    /// An H200-like device on a 13.4 driver: 2 MiB alignment and granularity,
    /// 512 MiB max endpoint size, everything supported.
    fn default() -> Self {
        SimDevice {
            bind_alignment: 2 << 20,
            max_size: 512 << 20,
            granularity: 2 << 20,
            recommended_granularity: 2 << 20,
            memory: 141 << 30,
            clique: 0,
            host_numa_id: 0,
            unicast: true,
            multicast: true,
            counted_ops: true,
            unicast_owner_access: true,
            classic_multicast: true,
            fabric: true,
            le_fabric_handles: true,
        }
    }
}

/// The simulated node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// The devices, ordinal = index.
    pub devices: Vec<SimDevice>,
    /// `cuDriverGetVersion`; 13040 by default.
    pub driver_version: i32,
    /// How many `cuLogicalEndpointQuery` calls covering an endpoint report it
    /// pending before it is constructed (R2.5, R3). 0: ready at the first
    /// query once its team is complete.
    pub queries_to_ready: u32,
    /// Largest number of ids one process may hold (R11 `OUT_OF_MEMORY` past it).
    pub max_ids: u32,
    /// Whether `cuMemCreate` with the FABRIC handle type is permitted (a
    /// machine without a fabric daemon answers `NOT_PERMITTED`).
    pub fabric_memory_permitted: bool,
    /// Host memory, bytes: what `cuMemCreate` of host-NUMA memory may take
    /// on this node, all processes together (`OUT_OF_MEMORY` past it); 64
    /// GiB by default.
    pub host_memory: u64,
}

impl ModelConfig {
    /// A node of `n` identical H200-like devices, one clique.
    pub fn node(n: usize) -> ModelConfig {
        ModelConfig {
            devices: vec![SimDevice::default(); n],
            driver_version: 13040,
            queries_to_ready: 2,
            max_ids: 1 << 16,
            fabric_memory_permitted: true,
            host_memory: 64 << 30,
        }
    }

    /// A node on a driver 580 (CUDA 13.0), as seen on an H200 machine: no logical
    /// endpoints (attributes 153-156 answer `INVALID_VALUE`), no classic
    /// multicast, fabric memory refused.
    pub fn cuda_13_0(n: usize) -> ModelConfig {
        let mut c = ModelConfig::node(n);
        c.driver_version = 13000;
        c.fabric_memory_permitted = false;
        for d in &mut c.devices {
            d.classic_multicast = false;
        }
        c
    }

    /// Sets how many queries construction takes.
    pub fn queries_to_ready(mut self, n: u32) -> Self {
        self.queries_to_ready = n;
        self
    }

    /// Changes every device with `f`.
    pub fn with_devices(mut self, f: impl Fn(usize, &mut SimDevice)) -> Self {
        for (i, d) in self.devices.iter_mut().enumerate() {
            f(i, d);
        }
        self
    }

    /// Whether this driver version has logical endpoints.
    pub fn has_logical_endpoints(&self) -> bool {
        self.driver_version >= crate::driver::LOGICAL_ENDPOINT_MIN_VERSION
    }
}

impl Default for ModelConfig {
    /// The embedded default: a 4-GPU node.
    fn default() -> Self {
        ModelConfig::node(4)
    }
}

/// A simulated fabric (one IMEX domain): one or more nodes, each with its
/// devices, and whether processes that join get an IMEX channel (R9.1,
/// R12.4). Node numbers are indices into `nodes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// The nodes; an empty list is one default node.
    pub nodes: Vec<ModelConfig>,
    /// Whether a process that joins without saying gets an IMEX channel;
    /// `true` by default.
    pub imex_channel: bool,
    /// How long a fabric server gives a new connection for its whole hello
    /// (10 s by default); a slower one is closed.
    pub hello_timeout: std::time::Duration,
    /// How many connections may be in hello at once (64 by default); a
    /// newer one closes the oldest.
    pub max_in_hello: usize,
}

impl FabricConfig {
    /// `nodes` identical nodes of `gpus` H200-like devices each, one clique
    /// across the fabric (as an NVL72 rack), IMEX channels for everyone.
    pub fn nodes(nodes: usize, gpus: usize) -> FabricConfig {
        FabricConfig {
            nodes: vec![ModelConfig::node(gpus); nodes.max(1)],
            ..FabricConfig::single(ModelConfig::default())
        }
    }

    /// One node of `config`.
    pub fn single(config: ModelConfig) -> FabricConfig {
        FabricConfig {
            nodes: vec![config],
            imex_channel: true,
            hello_timeout: std::time::Duration::from_secs(10),
            max_in_hello: 64,
        }
    }

    /// Changes every node with `f`.
    pub fn with_nodes(mut self, f: impl Fn(usize, &mut ModelConfig)) -> Self {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            f(i, n);
        }
        self
    }

    /// Sets how long a new connection has for its whole hello.
    pub fn hello_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.hello_timeout = timeout;
        self
    }

    /// Sets how many connections may be in hello at once (at least 1).
    pub fn max_in_hello(mut self, n: usize) -> Self {
        self.max_in_hello = n.max(1);
        self
    }

    /// Sets whether joining processes get an IMEX channel by default.
    pub fn imex_channel(mut self, granted: bool) -> Self {
        self.imex_channel = granted;
        self
    }
}

impl Default for FabricConfig {
    /// One default node ([`ModelConfig::default`]).
    fn default() -> Self {
        FabricConfig::single(ModelConfig::default())
    }
}

//! Probing: [`Capabilities`], what one device of a backend supports, read
//! without creating anything that matters (attribute reads, granularity
//! queries, `cuMemGetInfo`), for reports and for deciding what to run; and
//! the types of its fields ([`Probed`], [`MemInfo`], [`VmmGranularity`]),
//! which print byte counts with their unit and flags as yes/no.
//!
//! Probing never fails: every field is [`Probed::Known`] or
//! [`Probed::Unknown`] with the reason (usually the driver's code, e.g.
//! `CUDA_ERROR_INVALID_VALUE` for attributes 153–156 on a driver before 13.3).
//! `cuMulticastGetGranularity` is asked only where attribute 132 says the
//! device has classic multicast; `cuMulticastCreate` is never called.
//!
//! ```
//! # #[cfg(feature = "model")] {
//! use cuda_endpoints::{Context, Device};
//! use cuda_endpoints::model::ModelConfig;
//! use cuda_endpoints::probe::Capabilities;
//!
//! let (ctx, _model) = Context::model(ModelConfig::cuda_13_0(1));
//! let caps = Capabilities::probe(&ctx, Device(0));
//! assert_eq!(caps.classic_multicast.known(), Some(&false));
//! println!("{caps}");
//! # }
//! ```

use std::fmt;

use crate::context::Context;
use crate::driver::{
    AllocationRequest, Code, Device, DriverResult, Granularity, Location, attr, handle_bits,
};

/// A probed value, or why it is not known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed<T> {
    /// The value read.
    Known(T),
    /// Not known, with the reason in words.
    Unknown(String),
}

impl<T> Probed<T> {
    /// The value, if known.
    pub fn known(&self) -> Option<&T> {
        match self {
            Probed::Known(v) => Some(v),
            Probed::Unknown(_) => None,
        }
    }

    fn from_driver(r: DriverResult<T>) -> Probed<T> {
        match r {
            Ok(v) => Probed::Known(v),
            Err(c) => Probed::Unknown(describe(c)),
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Probed<U> {
        match self {
            Probed::Known(v) => Probed::Known(f(v)),
            Probed::Unknown(why) => Probed::Unknown(why),
        }
    }
}

fn describe(c: Code) -> String {
    if c == Code::NOT_PERMITTED {
        format!("{} (denied by policy or the driver)", c.name())
    } else if c == Code::NOT_SUPPORTED {
        format!("{} (this driver cannot answer)", c.name())
    } else {
        c.name().to_owned()
    }
}

impl<T: fmt::Display> fmt::Display for Probed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probed::Known(v) => v.fmt(f),
            Probed::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// A yes/no capability in words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct YesNo(pub(crate) bool);

impl fmt::Display for YesNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 { "yes" } else { "no" })
    }
}

/// A byte count printed with its unit (`2 MiB`, `139.8 GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if v.fract() == 0.0 {
            write!(f, "{v:.0} {}", UNITS[u])
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// VMM allocation granularity of device memory for one shareable handle type
/// (`cuMemGetAllocationGranularity`), bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmGranularity {
    /// `"Private"`, `"PosixFd"` or `"Fabric"`.
    pub handle: &'static str,
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, bytes.
    pub minimum: Probed<u64>,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`, bytes.
    pub recommended: Probed<u64>,
}

/// Device memory from `cuMemGetInfo`, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

impl fmt::Display for MemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} free of {}", Bytes(self.free), Bytes(self.total))
    }
}

/// What one device of a backend supports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend probed (`Driver::name`).
    pub backend: String,
    /// The device.
    pub device: Device,
    /// `cuDriverGetVersion`, e.g. `13000` for 13.0.
    pub driver_version: Probed<i32>,
    /// Attribute 153: logical-endpoint unicast.
    pub le_unicast: Probed<bool>,
    /// Attribute 154: logical-endpoint multicast.
    pub le_multicast: Probed<bool>,
    /// Attribute 155: counted operations (R2.4).
    pub le_counted_ops: Probed<bool>,
    /// Attribute 156: unicast access on the owner device.
    pub le_unicast_owner_access: Probed<bool>,
    /// Attribute 132: classic multicast (`MULTICAST_SUPPORTED`, C6).
    pub classic_multicast: Probed<bool>,
    /// Attribute 128: fabric handles. The attribute can say yes while
    /// `cuMemCreate` still refuses them (no fabric daemon).
    pub fabric_handles: Probed<bool>,
    /// Attribute 134: the host NUMA node of the device (R5.5).
    pub host_numa_id: Probed<i32>,
    /// VMM granularity of device memory per handle type: Private, PosixFd, Fabric.
    pub vmm_granularity: Vec<VmmGranularity>,
    /// `cuMulticastGetGranularity` (minimum, recommended) in bytes for a team
    /// of every device; asked only where attribute 132 is 1.
    pub multicast_granularity: Probed<(u64, u64)>,
    /// The device's clique (R4.5; `cuDeviceGetCliqueInfo`, 13.4+).
    pub clique: Probed<u32>,
    /// `cuMemGetInfo`.
    pub memory: Probed<MemInfo>,
}

impl Capabilities {
    /// Reads everything this crate cares about for `dev` on `ctx`'s backend.
    /// Never fails; creates no endpoint, allocation or multicast object (on
    /// the real driver the device's primary context is retained, as every
    /// device call needs).
    pub fn probe(ctx: &Context, dev: impl Into<Device>) -> Capabilities {
        let dev = dev.into();
        let d = ctx.queries();
        let flag = |a| Probed::from_driver(d.device_attribute(dev, a)).map(|v| v != 0);
        let classic_multicast = flag(attr::MULTICAST_SUPPORTED);
        let vmm_granularity = [
            ("Private", handle_bits::NONE),
            ("PosixFd", handle_bits::POSIX_FD),
            ("Fabric", handle_bits::FABRIC),
        ]
        .into_iter()
        .map(|(handle, bits)| {
            let req = AllocationRequest {
                location: Location::Device(dev),
                handle_types: bits,
            };
            VmmGranularity {
                handle,
                minimum: Probed::from_driver(d.mem_granularity(req, Granularity::Minimum)),
                recommended: Probed::from_driver(d.mem_granularity(req, Granularity::Recommended)),
            }
        })
        .collect::<Vec<_>>();
        let multicast_granularity = match classic_multicast {
            Probed::Known(true) => {
                let team = d.device_count().ok().and_then(|n| u32::try_from(n).ok());
                let team = team.unwrap_or(1).max(1);
                let size = vmm_granularity
                    .first()
                    .and_then(|g| g.minimum.known().copied())
                    .unwrap_or(2 << 20);
                let g = |k| d.multicast_granularity(team, size, 0, k);
                match (g(Granularity::Minimum), g(Granularity::Recommended)) {
                    (Ok(min), Ok(rec)) => Probed::Known((min, rec)),
                    (Err(c), _) | (_, Err(c)) => Probed::Unknown(describe(c)),
                }
            }
            Probed::Known(false) => {
                Probed::Unknown("not asked: MULTICAST_SUPPORTED (attribute 132) is 0".into())
            }
            Probed::Unknown(ref why) => Probed::Unknown(format!(
                "not asked: MULTICAST_SUPPORTED (attribute 132) is unknown ({why})"
            )),
        };
        Capabilities {
            backend: d.name(),
            device: dev,
            driver_version: Probed::from_driver(d.driver_version()),
            le_unicast: flag(attr::LE_UNICAST),
            le_multicast: flag(attr::LE_MULTICAST),
            le_counted_ops: flag(attr::LE_COUNTED_OPS),
            le_unicast_owner_access: flag(attr::LE_UNICAST_OWNER_ACCESS),
            classic_multicast,
            fabric_handles: flag(attr::FABRIC_SUPPORTED),
            host_numa_id: Probed::from_driver(d.device_attribute(dev, attr::HOST_NUMA_ID)),
            vmm_granularity,
            multicast_granularity,
            clique: Probed::from_driver(d.device_clique(dev)),
            memory: Probed::from_driver(d.mem_get_info(dev))
                .map(|(free, total)| MemInfo { free, total }),
        }
    }

    /// [`Capabilities::probe`] for every device of `ctx`; empty when the
    /// device count cannot be read.
    pub fn probe_all(ctx: &Context) -> Vec<Capabilities> {
        ctx.devices()
            .unwrap_or_default()
            .into_iter()
            .map(|dev| Capabilities::probe(ctx, dev))
            .collect()
    }

    /// Whether the driver has logical endpoints for multicast on this device
    /// (version 13.3+ and attribute 154 = 1).
    pub fn logical_multicast(&self) -> bool {
        self.driver_version
            .known()
            .is_some_and(|&v| v >= crate::driver::LOGICAL_ENDPOINT_MIN_VERSION)
            && self.le_multicast.known() == Some(&true)
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = match &self.driver_version {
            Probed::Known(v) => format!("{}.{} ({v})", v / 1000, (v % 1000) / 10),
            other => other.to_string(),
        };
        let yn = |p: &Probed<bool>| p.clone().map(YesNo).to_string();
        writeln!(
            f,
            "{} on backend {}, driver {version}",
            self.device, self.backend
        )?;
        writeln!(
            f,
            "  logical endpoints (13.3+): unicast {}, multicast {}, counted ops {}, unicast owner access {}",
            yn(&self.le_unicast),
            yn(&self.le_multicast),
            yn(&self.le_counted_ops),
            yn(&self.le_unicast_owner_access)
        )?;
        writeln!(
            f,
            "  classic multicast (attribute 132): {}",
            yn(&self.classic_multicast)
        )?;
        match &self.multicast_granularity {
            Probed::Known((min, rec)) => writeln!(
                f,
                "  multicast granularity: minimum {}, recommended {}",
                Bytes(*min),
                Bytes(*rec)
            )?,
            Probed::Unknown(why) => writeln!(f, "  multicast granularity: unknown ({why})")?,
        }
        writeln!(
            f,
            "  fabric handles (attribute 128): {}",
            yn(&self.fabric_handles)
        )?;
        writeln!(f, "  host NUMA node (attribute 134): {}", self.host_numa_id)?;
        for g in &self.vmm_granularity {
            writeln!(
                f,
                "  VMM granularity, {} device memory: minimum {}, recommended {}",
                g.handle,
                g.minimum.clone().map(Bytes),
                g.recommended.clone().map(Bytes)
            )?;
        }
        writeln!(f, "  clique (13.4+): {}", self.clique)?;
        write!(f, "  memory: {}", self.memory)
    }
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::*;
    use crate::model::ModelConfig;

    #[test]
    fn the_test_machine_as_the_model_sees_it() {
        let (ctx, model) = Context::model(ModelConfig::cuda_13_0(1));
        let c = Capabilities::probe(&ctx, Device(0));
        assert_eq!(c.driver_version, Probed::Known(13000));
        assert!(matches!(c.le_multicast, Probed::Unknown(_)));
        assert_eq!(c.classic_multicast, Probed::Known(false));
        assert!(matches!(c.multicast_granularity, Probed::Unknown(_)));
        assert!(matches!(c.clique, Probed::Unknown(_)));
        assert_eq!(model.calls(crate::Call::MulticastGetGranularity), 0);
        assert_eq!(model.calls(crate::Call::MulticastCreate), 0);
        assert!(!c.logical_multicast());
        let text = c.to_string();
        assert!(
            text.contains("classic multicast (attribute 132): no"),
            "{text}"
        );
        assert!(text.contains("2 MiB"), "{text}");
    }

    #[test]
    fn a_thirteen_four_node() {
        let (ctx, model) = Context::model(ModelConfig::node(2));
        let all = Capabilities::probe_all(&ctx);
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(Capabilities::logical_multicast));
        assert_eq!(all[1].clique, Probed::Known(0));
        assert_eq!(
            all[0].multicast_granularity,
            Probed::Known((2 << 20, 2 << 20))
        );
        assert!(model.live().is_empty());
        assert_eq!(Bytes(141 << 30).to_string(), "141 GiB");
    }
}

//! Backend selection: which implementation of multicast endpoints a machine
//! gets — the driver's logical endpoints (13.3+), the classic `cuMulticast*`
//! fallback ([`Classic`](crate::driver::Classic), rules C1–C6), or none — decided by *reading* the
//! driver, never by trying.
//!
//! [`decide`] only reads `cuDriverGetVersion` and device attributes 154
//! (logical-endpoint multicast) and 132 (`MULTICAST_SUPPORTED`): it creates
//! nothing, so it is safe on machines where a `cuMulticastCreate` could take
//! the GPUs out of service. [`Context::auto`](crate::Context::auto) applies the decision
//! (it and [`Context::decide`](crate::Context::decide) are written here, beside it).
//!
//! The order is the one cuda.core proposes: logical endpoints when the driver
//! has them and every team device says so; else classic multicast when every
//! team device reports attribute 132 and the [`Policy`] allows it; else
//! nothing, with the reasons. Like `NCCL_NVLS_ENABLE=0`, the environment
//! variable [`CLASSIC_ENV`]`=0` switches the classic path off.
//!
//! Unicast endpoints have no classic form: on the classic backend they fail
//! with `Unsupported`/`NOT_SUPPORTED`. The decision is about multicast teams.

use std::fmt;

use crate::context::{Context, shared};
use crate::driver::{Code, Device, Driver, LOGICAL_ENDPOINT_MIN_VERSION, attr};
use crate::error::{Error, Feature, Result};

/// Environment variable read by [`Policy::from_env`]: `0` (or `false`, `off`,
/// `no`) switches the classic multicast fallback off; `1` (or `true`, `on`,
/// `yes`) or unset leaves it on. Anything else also switches it off (a typo in
/// a safety switch must not enable what it meant to disable).
pub const CLASSIC_ENV: &str = "CUDA_ENDPOINTS_CLASSIC_MULTICAST";

/// The backend chosen for a multicast team.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The driver's logical endpoints (`cuLogicalEndpoint*`, 13.3+).
    LogicalEndpoints,
    /// Logical endpoints emulated on classic multicast ([`Classic`](crate::driver::Classic)).
    Classic,
    /// Neither: what is missing, in words.
    Unsupported(String),
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::LogicalEndpoints => {
                f.write_str("logical endpoints (cuLogicalEndpoint*)")
            }
            BackendChoice::Classic => f.write_str("classic multicast (cuMulticast*)"),
            BackendChoice::Unsupported(why) => write!(f, "unsupported: {why}"),
        }
    }
}

/// A backend to use whatever else is possible; never bypasses a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Force {
    /// Only logical endpoints: never fall back to classic multicast.
    LogicalEndpoints,
    /// Only classic multicast (still needs attribute 132 on every team device
    /// and [`Policy::classic_enabled`]).
    Classic,
}

/// What [`decide`] may choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Whether the classic fallback may be chosen (C1–C6).
    pub classic_enabled: bool,
    /// Narrow the choice to one backend; `None`: the best available.
    pub force: Option<Force>,
}

impl Default for Policy {
    /// Classic fallback allowed, nothing forced.
    fn default() -> Self {
        Policy::new()
    }
}

impl Policy {
    /// Classic fallback allowed, nothing forced.
    pub fn new() -> Policy {
        Policy {
            classic_enabled: true,
            force: None,
        }
    }

    /// Allows or forbids the classic fallback.
    pub fn classic(mut self, enabled: bool) -> Policy {
        self.classic_enabled = enabled;
        self
    }

    /// Narrows the choice to `backend`.
    pub fn force(mut self, backend: Force) -> Policy {
        self.force = Some(backend);
        self
    }

    /// [`Policy::new`], with the classic fallback switched by [`CLASSIC_ENV`].
    pub fn from_env() -> Policy {
        let enabled = match std::env::var(CLASSIC_ENV) {
            Err(std::env::VarError::NotPresent) => true,
            Err(std::env::VarError::NotUnicode(_)) => false,
            Ok(v) => matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "on" | "yes"
            ),
        };
        Policy::new().classic(enabled)
    }
}

/// What one team device reports, as read by [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSupport {
    /// The device.
    pub device: Device,
    /// Attribute 132 (`MULTICAST_SUPPORTED`), or the code the read failed with.
    pub classic_multicast: Result<i32, Code>,
    /// Attribute 154 (logical-endpoint multicast), or the code (a driver
    /// before 13.3 answers `INVALID_VALUE`).
    pub le_multicast: Result<i32, Code>,
    /// Attribute 153 (logical-endpoint unicast), or the code.
    pub le_unicast: Result<i32, Code>,
}

/// The outcome of [`decide`]: the choice, why, and what was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The backend.
    pub choice: BackendChoice,
    /// Each consideration, in order, in words.
    pub reasons: Vec<String>,
    /// `cuDriverGetVersion`, when it answered.
    pub driver_version: Option<i32>,
    /// What each team device reported.
    pub devices: Vec<DeviceSupport>,
    /// Whether logical endpoints would work for this team (before the policy).
    pub logical_endpoints_available: bool,
    /// Whether classic multicast would work for this team (before the policy).
    pub classic_available: bool,
}

impl Decision {
    /// How copy batches run on the chosen backend
    /// ([`Context::copy_path`](crate::Context::copy_path)): the fabric copy
    /// (`cuFabricCpyBatchAsync`) on logical endpoints of a 13.5+ driver,
    /// else the portable path (`cuMemcpyAsync` through mapped memory) —
    /// on the classic fallback, before 13.5, or when nothing was chosen.
    pub fn copy_path(&self) -> crate::CopyPath {
        match self.choice {
            BackendChoice::LogicalEndpoints => crate::context::choose(self.driver_version, None).0,
            _ => crate::CopyPath::Portable,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "backend: {}", self.choice)?;
        for r in &self.reasons {
            writeln!(f, "  - {r}")?;
        }
        writeln!(f, "copies: {}", self.copy_path())
    }
}

fn show(r: &Result<i32, Code>) -> String {
    match r {
        Ok(v) => v.to_string(),
        Err(c) => format!("unknown ({})", c.name()),
    }
}

/// Chooses the backend for a multicast team on `devices`, by reading the
/// driver only (`cuDriverGetVersion`, `cuDeviceGetAttribute` 132, 153, 154):
/// nothing is created, no context is needed beyond what attribute reads need.
///
/// - [`BackendChoice::LogicalEndpoints`] when the driver is 13.3+ (version
///   `>= 13030`) and attribute 154 is 1 on every team device;
/// - else [`BackendChoice::Classic`] when every team device reports
///   `MULTICAST_SUPPORTED` (attribute 132) = 1 and `policy` allows it (C6);
/// - else [`BackendChoice::Unsupported`] naming what is missing.
///
/// [`Policy::force`] narrows the choice; it never skips a check.
pub fn decide(driver: &dyn Driver, devices: &[Device], policy: &Policy) -> Decision {
    let mut reasons = Vec::new();
    let driver = crate::driver::Queries(driver);
    let driver_version = driver.driver_version().ok();
    let support: Vec<DeviceSupport> = devices
        .iter()
        .map(|&d| DeviceSupport {
            device: d,
            classic_multicast: driver.device_attribute(d, attr::MULTICAST_SUPPORTED),
            le_multicast: driver.device_attribute(d, attr::LE_MULTICAST),
            le_unicast: driver.device_attribute(d, attr::LE_UNICAST),
        })
        .collect();
    if devices.is_empty() {
        return Decision {
            choice: BackendChoice::Unsupported("no team devices were given".into()),
            reasons: vec!["a multicast team needs at least one device (R2.2)".into()],
            driver_version,
            devices: support,
            logical_endpoints_available: false,
            classic_available: false,
        };
    }

    // Logical endpoints.
    let version_ok = driver_version.is_some_and(|v| v >= LOGICAL_ENDPOINT_MIN_VERSION);
    let le_missing: Vec<String> = support
        .iter()
        .filter(|s| s.le_multicast != Ok(1))
        .map(|s| format!("{} (attribute 154 = {})", s.device, show(&s.le_multicast)))
        .collect();
    let le_ok = version_ok && le_missing.is_empty();
    let le_reason = match driver_version {
        None => "logical endpoints: the driver version is unknown".to_owned(),
        Some(v) if !version_ok => format!(
            "logical endpoints: need driver 13.3+ ({LOGICAL_ENDPOINT_MIN_VERSION}); this one is {}.{} ({v})",
            v / 1000,
            (v % 1000) / 10
        ),
        Some(_) if !le_missing.is_empty() => format!(
            "logical endpoints: not supported on {}",
            le_missing.join(", ")
        ),
        Some(v) => format!(
            "logical endpoints: available (driver {v}, attribute 154 = 1 on every team device)"
        ),
    };
    reasons.push(le_reason);

    // Classic multicast (C6).
    let classic_missing: Vec<String> = support
        .iter()
        .filter(|s| s.classic_multicast != Ok(1))
        .map(|s| {
            format!(
                "{} (MULTICAST_SUPPORTED, attribute 132 = {})",
                s.device,
                show(&s.classic_multicast)
            )
        })
        .collect();
    let classic_ok = classic_missing.is_empty();
    reasons.push(if classic_ok {
        "classic multicast: every team device reports MULTICAST_SUPPORTED = 1".to_owned()
    } else {
        format!(
            "classic multicast: not supported on {}",
            classic_missing.join(", ")
        )
    });
    if !policy.classic_enabled {
        reasons.push(format!(
            "classic multicast: switched off by the policy ({CLASSIC_ENV}=0)"
        ));
    }

    let want_le = policy.force != Some(Force::Classic);
    let want_classic = policy.force != Some(Force::LogicalEndpoints) && policy.classic_enabled;
    if let Some(force) = policy.force {
        reasons.push(format!("policy forces {force:?}"));
    }
    let choice = if want_le && le_ok {
        BackendChoice::LogicalEndpoints
    } else if want_classic && classic_ok {
        BackendChoice::Classic
    } else {
        let mut missing = Vec::new();
        if want_le {
            missing.push(reasons[0].clone());
        } else {
            missing.push("logical endpoints: excluded by the policy".into());
        }
        if !classic_ok {
            missing.push(reasons[1].clone());
        } else if !want_classic {
            missing.push(format!(
                "classic multicast would work but is switched off (policy / {CLASSIC_ENV}=0)"
            ));
        }
        BackendChoice::Unsupported(missing.join("; "))
    };
    tracing::debug!(%choice, ?driver_version, "backend decided");
    Decision {
        choice,
        reasons,
        driver_version,
        devices: support,
        logical_endpoints_available: le_ok,
        classic_available: classic_ok,
    }
}

impl Context {
    /// A context over `driver` with the backend [`decide`] picks for a
    /// multicast team on `devices`: the driver itself for logical endpoints,
    /// [`Classic`](crate::driver::Classic) over it for the classic fallback; and the decision.
    /// Nothing is created to decide. On the real driver:
    /// `Context::auto(Cuda::open()?, &team, &policy)`
    /// ([`Cuda`](crate::driver::cuda::Cuda)).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when neither backend works for this team (the
    /// message lists why).
    pub fn auto(
        driver: impl Driver + 'static,
        devices: &[Device],
        policy: &Policy,
    ) -> Result<(Context, Decision)> {
        let driver = shared(driver);
        let decision = decide(&*driver, devices, policy);
        let ctx = match &decision.choice {
            BackendChoice::LogicalEndpoints => Context::new(driver),
            BackendChoice::Classic => Context::new(crate::driver::Classic::new(driver)),
            BackendChoice::Unsupported(why) => {
                return Err(Error::unsupported(
                    Feature::MulticastTeam,
                    decision.driver_version,
                    format!("for {devices:?}: {why}"),
                ));
            }
        };
        ctx.set_copy_path(decision.copy_path());
        Ok((ctx, decision))
    }

    /// [`decide`] on this context's backend: which backend a multicast team
    /// on `devices` would get (queries only).
    pub fn decide(&self, devices: &[Device], policy: &Policy) -> Decision {
        decide(self.driver(), devices, policy)
    }
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::*;

    use crate::driver::Traced;
    use crate::model::{Model, ModelConfig};
    use crate::{Call, Context, Error};

    #[test]
    fn thirteen_four_picks_logical_endpoints() {
        let m = Model::new(ModelConfig::node(2));
        let d = decide(&m, &[Device(0), Device(1)], &Policy::new());
        assert_eq!(d.choice, BackendChoice::LogicalEndpoints);
        assert!(d.logical_endpoints_available && d.classic_available);
        let d = decide(&m, &[Device(0)], &Policy::new().force(Force::Classic));
        assert_eq!(d.choice, BackendChoice::Classic);
    }

    #[test]
    fn thirteen_zero_with_multicast_picks_classic_unless_switched_off() {
        let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
        let t = Traced::new(Model::new(cfg));
        let team = [Device(0), Device(1)];
        let d = decide(&t, &team, &Policy::new());
        assert_eq!(d.choice, BackendChoice::Classic, "{d}");
        let d = decide(&t, &team, &Policy::new().classic(false));
        assert!(matches!(d.choice, BackendChoice::Unsupported(_)), "{d}");
        assert!(d.classic_available && !d.logical_endpoints_available);
        // Inspect-only.
        assert!(
            t.calls()
                .iter()
                .all(|c| matches!(c, Call::DriverGetVersion | Call::DeviceGetAttribute))
        );
    }

    #[test]
    fn nothing_on_a_thirteen_zero_without_multicast() {
        let m = Model::new(ModelConfig::cuda_13_0(1));
        let d = decide(&m, &[Device(0)], &Policy::new());
        let BackendChoice::Unsupported(why) = &d.choice else {
            panic!("{d}")
        };
        assert!(
            why.contains("13.3") && why.contains("attribute 132 = 0"),
            "{why}"
        );
        let e = Context::auto(m, &[Device(0)], &Policy::new()).unwrap_err();
        assert!(matches!(
            e,
            Error::Unsupported {
                driver_version: Some(13000),
                ..
            }
        ));
    }
}

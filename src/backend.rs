//! Backend selection: which implementation of logical endpoints a context
//! gets — the driver's own (13.3+) or the classic emulation
//! ([`Classic`], rules C1–C6) — and whether a
//! multicast team may use classic `cuMulticast*`, decided by *reading* the
//! driver, never by trying.
//!
//! What this file owns: [`decide`] and what it returns ([`Decision`],
//! [`BackendChoice`], [`DeviceSupport`]), the [`Policy`] and its
//! environment variable [`CLASSIC_ENV`], and the classic emulation without
//! multicast that [`Context::auto`](crate::Context::auto) builds on a driver
//! before 13.3 when classic multicast was not opted in (`ClassicUnicast`).
//! [`Context::auto`](crate::Context::auto) and
//! [`Context::decide`](crate::Context::decide) are written here, beside it.
//!
//! [`decide`] only reads `cuDriverGetVersion` and device attributes 132
//! (`MULTICAST_SUPPORTED`), 153 and 154 (logical-endpoint unicast and
//! multicast): it creates nothing, so it is safe on machines where a
//! `cuMulticastCreate` could take the GPUs out of service.
//! [`Context::auto`](crate::Context::auto) applies the decision.
//!
//! **Unicast endpoints and copies** work on every driver: logical endpoints
//! on 13.3+, before that the classic emulation's process-local endpoints
//! with copies on the portable path (`cuMemcpyAsync` through mapped memory).
//! **Multicast teams**: logical endpoints when the driver has them and every
//! team device says so; else classic multicast only when the user **opted
//! in** ([`Policy::classic`]`(true)`, or [`CLASSIC_ENV`]`=1` with
//! [`Policy::from_env`]) and every team device reports attribute 132; else
//! refused, naming the reasons and the driver version. Classic multicast is
//! opt-in because on a shared several-GPU host `cuMulticastCreate` can take
//! the GPUs out of service (two H200 on driver 580 report attribute 132 = 1).

use std::fmt;

use crate::context::{Context, shared};
use crate::driver::{
    Call, Classic, Code, Device, Driver, DriverResult, EndpointProps, Forward,
    LOGICAL_ENDPOINT_MIN_VERSION, Limits, Shape, attr,
};
use crate::error::Result;

/// Environment variable read by [`Policy::from_env`]: `1` (or `true`, `on`,
/// `yes`) opts in to the classic multicast fallback; unset, `0` (or `false`,
/// `off`, `no`) leaves it off. Anything else also leaves it off (a typo in a
/// safety switch must not enable what it meant to disable).
pub const CLASSIC_ENV: &str = "CUDA_ENDPOINTS_CLASSIC_MULTICAST";

/// A backend: for a multicast team ([`Decision::choice`]), or for a
/// context's endpoints ([`Decision::unicast`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The driver's logical endpoints (`cuLogicalEndpoint*`, 13.3+).
    LogicalEndpoints,
    /// Logical endpoints emulated ([`Classic`]): a
    /// multicast team on classic multicast (C1–C6); unicast endpoints as
    /// process-local bookkeeping whose copies take the portable path.
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
    /// and the opt-in, [`Policy::classic_enabled`]).
    Classic,
}

/// What [`decide`] may choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Whether a multicast team may use the classic fallback (C1–C6): off
    /// unless opted in.
    pub classic_enabled: bool,
    /// Narrow the choice to one backend; `None`: the best available.
    pub force: Option<Force>,
}

impl Default for Policy {
    /// Classic multicast off (not opted in), nothing forced.
    fn default() -> Self {
        Policy::new()
    }
}

impl Policy {
    /// Classic multicast off (not opted in), nothing forced: a multicast
    /// team gets logical endpoints or nothing; unicast endpoints work
    /// either way.
    pub fn new() -> Policy {
        Policy {
            classic_enabled: false,
            force: None,
        }
    }

    /// Opts in to (`true`) or out of the classic multicast fallback for
    /// teams: with `true`, a driver before 13.3 builds teams with
    /// `cuMulticastCreate` on devices that report attribute 132.
    pub fn classic(mut self, enabled: bool) -> Policy {
        self.classic_enabled = enabled;
        self
    }

    /// Narrows the choice to `backend`.
    pub fn force(mut self, backend: Force) -> Policy {
        self.force = Some(backend);
        self
    }

    /// [`Policy::new`], opted in to classic multicast when [`CLASSIC_ENV`]
    /// says `1`.
    pub fn from_env() -> Policy {
        let enabled = match std::env::var(CLASSIC_ENV) {
            Err(_) => false,
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

/// The outcome of [`decide`]: the backend of the context's endpoints, the
/// backend of a multicast team, why, and what was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The backend of the context [`Context::auto`](crate::Context::auto)
    /// builds, which its unicast endpoints and copies use:
    /// [`BackendChoice::LogicalEndpoints`] on a 13.3+ driver,
    /// [`BackendChoice::Classic`] before (or when the team takes classic
    /// multicast). Never `Unsupported`.
    pub unicast: BackendChoice,
    /// The backend of a multicast team on the devices given.
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
        match self.unicast {
            BackendChoice::LogicalEndpoints => crate::context::choose(self.driver_version, None).0,
            _ => crate::CopyPath::Portable,
        }
    }
}

impl Decision {
    /// [`Decision::unicast`] in words.
    pub(crate) fn endpoints(&self) -> &'static str {
        match self.unicast {
            BackendChoice::LogicalEndpoints => "logical endpoints (cuLogicalEndpoint*)",
            _ => {
                "the classic emulation (process-local unicast endpoints, no driver object; logical endpoints need 13.3+)"
            }
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = match self.driver_version {
            Some(v) => format!("driver {}.{} ({v})", v / 1000, (v % 1000) / 10),
            None => "driver version unknown".to_owned(),
        };
        writeln!(f, "endpoints: {}, {version}", self.endpoints())?;
        writeln!(f, "multicast team: {}", self.choice)?;
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

/// Chooses the backend of a context's endpoints and of a multicast team on
/// `devices`, by reading the driver only (`cuDriverGetVersion`,
/// `cuDeviceGetAttribute` 132, 153, 154): nothing is created, no context is
/// needed beyond what attribute reads need.
///
/// The team ([`Decision::choice`]):
/// - [`BackendChoice::LogicalEndpoints`] when the driver is 13.3+ (version
///   `>= 13030`) and attribute 154 is 1 on every team device;
/// - else [`BackendChoice::Classic`] when `policy` opted in to classic
///   multicast and every team device reports `MULTICAST_SUPPORTED`
///   (attribute 132) = 1 (C6);
/// - else [`BackendChoice::Unsupported`] naming what is missing.
///
/// With no devices, the team's devices are checked at enrollment instead
/// (attribute 154 on 13.3+, attribute 132 by the classic fallback, C6).
///
/// The endpoints ([`Decision::unicast`]): logical endpoints on a 13.3+
/// driver, the classic emulation before (and when the team takes classic
/// multicast).
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
        Some(v) if devices.is_empty() => format!(
            "logical endpoints: available (driver {v}; each team device's attribute 154 is checked at enrollment)"
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
    reasons.push(if devices.is_empty() {
        "classic multicast: no team devices named; the fallback checks each one's MULTICAST_SUPPORTED at enrollment (C6)".to_owned()
    } else if classic_ok {
        "classic multicast: every team device reports MULTICAST_SUPPORTED = 1".to_owned()
    } else {
        format!(
            "classic multicast: not supported on {}",
            classic_missing.join(", ")
        )
    });
    if !policy.classic_enabled {
        reasons.push(format!(
            "classic multicast: switched off, not opted in (Policy::classic(true) or {CLASSIC_ENV}=1 opt in; cuMulticastCreate can take a shared host's GPUs out of service)"
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
                "classic multicast {} but is switched off: not opted in (Policy::classic(true) or {CLASSIC_ENV}=1)",
                if devices.is_empty() { "may work" } else { "would work" }
            ));
        }
        BackendChoice::Unsupported(missing.join("; "))
    };
    let unicast = if version_ok && choice != BackendChoice::Classic {
        BackendChoice::LogicalEndpoints
    } else {
        BackendChoice::Classic
    };
    tracing::debug!(%unicast, %choice, ?driver_version, "backend decided");
    Decision {
        unicast,
        choice,
        reasons,
        driver_version,
        devices: support,
        logical_endpoints_available: le_ok,
        classic_available: classic_ok,
    }
}

/// Why a [`ClassicUnicast`] context refuses multicast, in words (the error
/// adds the driver version and the fix).
const MULTICAST_OFF: &str = "logical endpoints need driver 13.3+; classic multicast is off unless opted in (Policy::classic(true), CUDA_ENDPOINTS_CLASSIC_MULTICAST=1): cuMulticastCreate can take a shared host's GPUs out of service";

/// The classic emulation with multicast refused: what
/// [`Context::auto`](crate::Context::auto) builds on a driver before 13.3
/// when the policy did not opt in to classic multicast. Unicast endpoints,
/// memory and copies go to the [`Classic`] inside; every multicast
/// property (limits, create) and every enrollment is answered
/// `NOT_SUPPORTED` here, before the fallback, so no `cuMulticast*` call
/// that makes or joins a team can be reached through it.
#[derive(Debug)]
pub(crate) struct ClassicUnicast(pub(crate) Classic);

impl ClassicUnicast {
    /// `NOT_SUPPORTED` for a multicast shape.
    fn unicast_only(props: &EndpointProps) -> DriverResult<()> {
        match props.shape {
            Shape::Multicast { .. } => Err(Code::NOT_SUPPORTED),
            Shape::Unicast { .. } => Ok(()),
        }
    }
}

impl Forward for ClassicUnicast {
    type Inner = Classic;

    fn inner(&self) -> &Classic {
        &self.0
    }

    fn name(&self) -> String {
        format!("{} unicast-only", Driver::name(&self.0))
    }

    fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
        match call {
            Call::GetLimits | Call::Create | Call::AddDevice => Some(MULTICAST_OFF),
            _ => Driver::explain_unsupported(&self.0, call),
        }
    }

    unsafe fn get_limits(&self, props: EndpointProps) -> DriverResult<Limits> {
        Self::unicast_only(&props)?;
        // SAFETY: the caller upholds `get_limits`' contract, passed on.
        unsafe { Driver::get_limits(&self.0, props) }
    }

    unsafe fn create(&self, id: u32, props: EndpointProps) -> DriverResult<()> {
        Self::unicast_only(&props)?;
        // SAFETY: the caller upholds `create`'s contract, passed on.
        unsafe { Driver::create(&self.0, id, props) }
    }

    unsafe fn add_device(&self, _id: u32, _dev: Device) -> DriverResult<()> {
        // No multicast endpoint exists here to enroll in.
        Err(Code::NOT_SUPPORTED)
    }
}

impl Context {
    /// A context over `driver` whose unicast endpoints and copies work on
    /// every driver this crate loads, with the backend [`decide`] picks, and
    /// the decision (print it: the choice and every reason):
    ///
    /// - a 13.3+ driver: the driver itself, logical endpoints;
    /// - before 13.3: the classic emulation ([`Classic`] over `driver`):
    ///   unicast endpoints are process-local bookkeeping, and copies take
    ///   the portable path (`cuMemcpyAsync` through mapped memory, bound by
    ///   address: [`CopyPath::Portable`](crate::CopyPath)). A multicast team
    ///   there is refused with [`Error::Unsupported`](crate::Error::Unsupported) naming 13.3 and the
    ///   driver version, unless `policy` opted in to classic multicast
    ///   ([`Policy::classic`], `CUDA_ENDPOINTS_CLASSIC_MULTICAST=1` with
    ///   [`Policy::from_env`]): `cuMulticastCreate` is never reached
    ///   otherwise.
    ///
    /// `devices` are the devices of a multicast team, if there will be one:
    /// the decision reads their attributes (154; 132 when opted in); `&[]`
    /// leaves the check to enrollment. Nothing is created to decide. The
    /// choice is also logged (`tracing`, target `cuda_endpoints::backend`,
    /// level info). On the real driver:
    /// `Context::auto(Cuda::open()?, &[], &Policy::from_env())`
    /// ([`Cuda`](crate::driver::cuda::Cuda)).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`](crate::Error::NoSuchDevice) for a team device the driver does not have.
    pub fn auto(
        driver: impl Driver + 'static,
        devices: &[Device],
        policy: &Policy,
    ) -> Result<(Context, Decision)> {
        let driver = shared(driver);
        let decision = decide(&*driver, devices, policy);
        let ctx = match (&decision.unicast, &decision.choice) {
            (BackendChoice::LogicalEndpoints, _) => Context::new(driver),
            (_, BackendChoice::Classic) => Context::new(Classic::new(driver)),
            _ => Context::new(ClassicUnicast(Classic::new(driver))),
        };
        for &dev in devices {
            ctx.check_device(dev)?;
        }
        ctx.set_copy_path(decision.copy_path());
        tracing::info!(
            target: "cuda_endpoints::backend",
            backend = %ctx.backend_name(),
            endpoints = decision.endpoints(),
            multicast = %decision.choice,
            driver_version = ?decision.driver_version,
            "Context::auto"
        );
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
        assert_eq!(d.unicast, BackendChoice::LogicalEndpoints);
        assert!(d.logical_endpoints_available && d.classic_available);
        let opted_in = Policy::new().classic(true);
        let d = decide(&m, &[Device(0)], &opted_in.force(Force::Classic));
        assert_eq!(d.choice, BackendChoice::Classic);
        assert_eq!(d.unicast, BackendChoice::Classic);
        // Forced but not opted in: nothing.
        let d = decide(&m, &[Device(0)], &Policy::new().force(Force::Classic));
        assert!(matches!(d.choice, BackendChoice::Unsupported(_)), "{d}");
    }

    /// The two-GPU H200 on the model: 13.0, attribute 132 = 1. Classic
    /// multicast only when opted in; the decision only reads.
    #[test]
    fn thirteen_zero_with_multicast_picks_classic_only_when_opted_in() {
        let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
        let t = Traced::new(Model::new(cfg));
        let team = [Device(0), Device(1)];
        let d = decide(&t, &team, &Policy::new().classic(true));
        assert_eq!(d.choice, BackendChoice::Classic, "{d}");
        for off in [
            Policy::new(),
            Policy::default(),
            Policy::new().classic(false),
        ] {
            let d = decide(&t, &team, &off);
            let BackendChoice::Unsupported(why) = &d.choice else {
                panic!("{d}")
            };
            assert!(
                why.contains("switched off") && why.contains(CLASSIC_ENV),
                "{why}"
            );
            assert_eq!(d.unicast, BackendChoice::Classic);
            assert!(d.classic_available && !d.logical_endpoints_available);
        }
        // Inspect-only.
        assert!(
            t.calls()
                .iter()
                .all(|c| matches!(c, Call::DriverGetVersion | Call::DeviceGetAttribute))
        );
    }

    /// Issue 28, item 1: on a 13.0 driver `Context::auto` gives the classic
    /// emulation without multicast: unicast endpoints work; a multicast
    /// create is refused naming 13.3 and the version before any
    /// `cuMulticast*` call, although attribute 132 is 1.
    #[test]
    fn thirteen_zero_auto_gives_unicast_endpoints_and_refuses_multicast() {
        let cfg = ModelConfig::cuda_13_0(2).with_devices(|_, d| d.classic_multicast = true);
        let m = Model::new(cfg);
        for team in [&[][..], &[Device(0), Device(1)][..]] {
            let (ctx, d) = Context::auto(m.clone(), team, &Policy::new()).unwrap();
            assert_eq!(d.unicast, BackendChoice::Classic, "{d}");
            assert_eq!(ctx.copy_path(), crate::CopyPath::Portable);
            let text = d.to_string();
            assert!(
                text.contains("classic emulation") && text.contains("13.0 (13000)"),
                "{text}"
            );
            let ep = ctx
                .reserve_one()
                .unwrap()
                .create(crate::Spec::unicast(0, 2 << 20))
                .unwrap()
                .wait(std::time::Duration::from_secs(1))
                .unwrap();
            ep.destroy().unwrap().release().unwrap();
            let f = ctx
                .reserve_one()
                .unwrap()
                .create(crate::Spec::multicast([0, 1], 2 << 20)) // ordinals, as everywhere
                .unwrap_err();
            assert!(
                matches!(
                    f.error,
                    Error::Unsupported {
                        feature: crate::error::Feature::MulticastTeam,
                        driver_version: Some(13000),
                        ..
                    }
                ),
                "{}",
                f.error
            );
            f.value.release().unwrap();
        }
        assert_eq!(m.calls(Call::MulticastCreate), 0);
        // Opted in: the classic fallback, multicast included.
        let (ctx, d) =
            Context::auto(m.clone(), &[Device(0)], &Policy::new().classic(true)).unwrap();
        assert_eq!(
            (d.unicast, d.choice),
            (BackendChoice::Classic, BackendChoice::Classic)
        );
        assert!(!ctx.backend_name().contains("unicast-only"));
        assert!(m.live().is_empty());
    }

    #[test]
    fn nothing_for_a_team_on_a_thirteen_zero_without_multicast() {
        let m = Model::new(ModelConfig::cuda_13_0(1));
        let d = decide(&m, &[Device(0)], &Policy::new().classic(true));
        let BackendChoice::Unsupported(why) = &d.choice else {
            panic!("{d}")
        };
        assert!(
            why.contains("13.3") && why.contains("attribute 132 = 0"),
            "{why}"
        );
        // The context still has unicast endpoints; a team device the
        // driver does not have is an error.
        let (ctx, _) = Context::auto(m.clone(), &[Device(0)], &Policy::new()).unwrap();
        assert!(ctx.backend_name().starts_with("classic"));
        let e = Context::auto(m, &[Device(3)], &Policy::new()).unwrap_err();
        assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    }
}

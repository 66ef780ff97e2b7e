//! Multicast bring-up (the NCCL pattern): the root creates an exportable team
//! spread over the ranks and broadcasts its handle; every other rank imports
//! it; every rank enrolls its own devices; all agree that every step
//! succeeded on every rank before anyone waits; the wait is bounded and its
//! outcome agreed too. Nobody binds before that, so no bind can come before
//! the whole team is in (R3.2, R4.4; C3 on the classic API).
//!
//! On the classic fallback ([`Classic`](crate::driver::Classic)) the same
//! call shares a classic multicast object instead (C5): the root creates it
//! at `create` (it must exist to be exported) and exports it as a POSIX
//! descriptor, passed to the ranks of its node with [`FdExchange`]
//! (`SCM_RIGHTS`; a rank on another node gets a typed error), or as fabric
//! bytes that travel in the envelope ([`TeamSpec::classic_handles`]). Each
//! rank imports what it received with the properties the ranks agreed on
//! (never the exporter's bytes) and adds its devices at once; only after
//! the agreement step that every rank added its devices, with every rank's
//! report matching this rank's view of the hello step ([`check_reports`]), does
//! the team count as complete, so no rank binds before then (C3).

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use crate::bootstrap::{Bootstrap, FdExchange};
use crate::context::Context;
use crate::driver::{Call, Device, ObjectExport, ObjectSharing, ShareableKind};
use crate::endpoint::Endpoint;
use crate::kind::{Exportable, SpreadTeam};
use crate::multicast_mapping::MulticastMapping;
use crate::sharing::FabricHandle;
use crate::spec::Spec;
use crate::state::{Pending, Ready, TeamReady};

use super::error::{Cause, Mismatch, Step, TeamError};
use super::retry::{Retry, agree_retrying, announce_retrying};
use super::shared::SharedMulticast;
use super::wire::{
    Carrier, Enrolled, Hello, MAX_DEVICES, decode_envelope, encode_classic_envelope,
    encode_envelope, join_digest,
};
use super::{check_devices, check_limits};
use crate::bootstrap::Deadline;

/// What a rank asks of a multicast bring-up. Every rank passes the same
/// `bytes`, `root`, options and (if given) team size; `devices` are this
/// rank's own, the ones it really uses (not ordinals `0..n`).
#[derive(Clone, Debug)]
pub struct TeamSpec {
    devices: Vec<Device>,
    bytes: u64,
    timeout: Duration,
    root: usize,
    team_size: Option<u32>,
    counted_ops: bool,
    classic_handles: ShareableKind,
    retry: Retry,
    tag: u64,
    probe: bool,
}

impl TeamSpec {
    /// This rank brings `devices` to a team of `bytes` bytes per device.
    /// Defaults: root rank 0, a 10 s timeout for the whole bring-up, team size
    /// = all devices the ranks bring.
    pub fn new<D: Into<Device>>(devices: impl IntoIterator<Item = D>, bytes: u64) -> TeamSpec {
        TeamSpec {
            devices: devices.into_iter().map(Into::into).collect(),
            bytes,
            timeout: Duration::from_secs(10),
            root: 0,
            team_size: None,
            counted_ops: false,
            classic_handles: ShareableKind::PosixFd,
            retry: Retry::default(),
            tag: 0,
            probe: true,
        }
    }

    /// Whether the bring-up first proves reachability peer to peer
    /// ([`probe`](super::probe), on every rank's first device; default on):
    /// a rank that cannot import another's trial endpoint fails every rank
    /// at [`Step::Probe`], naming both ([`Cause::Unreachable`]), before
    /// anything is created. Every rank passes the same choice.
    pub fn probe(mut self, probe: bool) -> TeamSpec {
        self.probe = probe;
        self
    }

    /// The bring-up's tag (default 0), the same on every rank: every
    /// message carries it and a message of another tag is refused
    /// ([`Mismatch::Tag`]). Bring-ups that share one bootstrap at once each
    /// take their own, over [`Tagged`](super::Tagged) channels of that tag.
    pub fn tag(mut self, tag: u64) -> TeamSpec {
        self.tag = tag;
        self
    }

    /// The whole bring-up ends, on every rank, within `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> TeamSpec {
        self.timeout = timeout;
        self
    }

    /// The rank that creates the endpoint.
    pub fn root(mut self, root: usize) -> TeamSpec {
        self.root = root;
        self
    }

    /// The team size the job expects: bring-up fails at once, on every rank,
    /// when the ranks that joined bring another number of devices.
    pub fn team_size(mut self, devices: u32) -> TeamSpec {
        self.team_size = Some(devices);
        self
    }

    /// How a step that failed with a retryable code on some rank is
    /// retried by every rank together (default [`Retry::default`]; cut to
    /// fit in the timeout, [`Retry::within`]): every step — the hello, the
    /// root's create-and-export, import-and-enroll (imports and devices
    /// already enrolled are kept) and the wait.
    pub fn retry(mut self, retry: Retry) -> TeamSpec {
        self.retry = retry;
        self
    }

    /// Counted operations (`COUNTED_OPS`, R2.4).
    pub fn counted_ops(mut self) -> TeamSpec {
        self.counted_ops = true;
        self
    }

    /// How the classic fallback shares its multicast object (C5, R12.4):
    /// [`ShareableKind::PosixFd`] (the default) within one node, the
    /// descriptor passed with [`FdExchange`]; [`ShareableKind::Fabric`]
    /// across nodes, for processes with an IMEX channel. Only the root's
    /// choice counts; logical endpoints always use their fabric handle.
    pub fn classic_handles(mut self, kind: ShareableKind) -> TeamSpec {
        self.classic_handles = kind;
        self
    }
}

/// A multicast team brought up on every rank: this rank's ready endpoint
/// (the same type on every rank) and what the ranks agreed on.
#[derive(Debug)]
pub struct SharedTeam {
    endpoint: Endpoint<Ready, SharedMulticast>,
    rank: usize,
    ranks: usize,
    team_size: u32,
    tag: u64,
}

impl SharedTeam {
    /// This rank's endpoint: bind this rank's memory on its own devices.
    /// It copies nothing until every rank bound: [`SharedTeam::agree_bound`]
    /// lends it as `Endpoint<Ready, _>` then (R13.3).
    pub fn endpoint(&self) -> &Endpoint<TeamReady, SharedMulticast> {
        self.endpoint.as_state()
    }

    pub(crate) fn ready_endpoint(&self) -> &Endpoint<Ready, SharedMulticast> {
        &self.endpoint
    }

    /// The endpoint, owned outright, still `TeamReady`: it copies nothing,
    /// since no agreement that every rank bound came with it (R13.3). For
    /// the communicator's owning form that copies, use
    /// [`SharedTeam::into_bound`], which binds and agrees.
    pub fn into_endpoint(self) -> Endpoint<TeamReady, SharedMulticast> {
        self.endpoint.cast()
    }

    pub(crate) fn into_ready_endpoint(self) -> Endpoint<Ready, SharedMulticast> {
        self.endpoint
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks share the team.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Devices in the team, over all ranks.
    pub fn team_size(&self) -> u32 {
        self.team_size
    }

    /// The bring-up's tag ([`TeamSpec::tag`]), which its later agreements
    /// (`agree_bound`) carry too.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// A multicast virtual address for this rank's team devices, on the
    /// classic fallback (`multimem` access; see [`MulticastMapping`]).
    ///
    /// # Errors
    /// As [`MulticastMapping::new`].
    pub fn multicast_mapping(&self) -> crate::Result<MulticastMapping<'_>> {
        MulticastMapping::new(&self.endpoint)
    }
}

/// Brings a multicast team up across the ranks of `boot`, in one call on
/// every rank; see the [module docs](crate::team) for the steps.
///
/// # Errors
/// A [`TeamError`] on every rank, naming the rank and step that failed first,
/// within the spec's timeout; everything made on this rank is undone first.
pub fn multicast(
    ctx: &Context,
    boot: &dyn Bootstrap,
    spec: &TeamSpec,
) -> Result<SharedTeam, TeamError> {
    let deadline = Deadline::after(spec.timeout);
    let (me, ranks) = (boot.rank(), boot.size());
    if spec.root >= ranks {
        return Err(TeamError::new(
            me,
            Step::Hello,
            Cause::Local(crate::Error::NoSuchDevice {
                device: Device(spec.root as i32),
                count: ranks as i32,
            }),
        ));
    }

    // Hello: what every rank brings, checked alike on every rank; retried
    // by every rank together when a rank's driver is not ready yet.
    let tag = spec.tag;
    let retry = spec.retry.within(spec.timeout);
    let hellos = agree_retrying(boot, tag, Step::Hello, retry, deadline, || {
        if spec.devices.len() > MAX_DEVICES {
            return Err((
                Step::Hello,
                Cause::BadMessage {
                    reason: "more devices than one rank may bring",
                },
            ));
        }
        check_devices(ctx, &spec.devices).map_err(|c| (Step::Hello, c))?;
        Ok(Hello {
            bytes: spec.bytes,
            counted_ops: spec.counted_ops,
            devices: spec.devices.clone(),
            cliques: spec.devices.iter().map(|&d| ctx.clique(d)).collect(),
            places: spec.devices.iter().map(|&d| super::place(ctx, d)).collect(),
        }
        .encode())
    })?;
    let team_size = agreed_team_size(&hellos, spec, me)?;
    if spec.probe {
        let dev = spec.devices.first().copied();
        super::probe::probe_step(ctx, boot, tag, dev, retry, deadline)?;
    }

    // Create and export on the root; the handle goes to every rank.
    let classic = ctx.object_sharing();
    let mut root_ep = None;
    let mut root_fd = None;
    let envelope = announce_retrying(boot, tag, spec.root, Step::Export, retry, deadline, || {
        (me == spec.root).then(|| {
            create_and_export(ctx, classic, spec, team_size).map(|made| {
                root_ep = Some(made.endpoint);
                root_fd = made.fd;
                made.envelope
            })
        })
    })?;

    // A classic object exported as a POSIX descriptor reaches the ranks of
    // the root's node over the bootstrap (`SCM_RIGHTS`), every rank taking
    // part so that the exchange stays in step; a rank that cannot get it
    // fails at import.
    let carrier = decode_envelope(&envelope).map(|(_, carrier)| carrier);
    let mut fd: Option<Result<OwnedFd, Cause>> = None;
    if let Ok(Carrier::ClassicFd) = carrier {
        let mine = root_fd.as_ref().map(AsFd::as_fd);
        let got = FdExchange::broadcast_fd(boot, spec.root, mine, deadline.remaining());
        fd = Some(got.map_err(Cause::Bootstrap));
    }
    drop(root_fd);

    // Import on the other ranks; check the handle against the agreement and
    // the driver; enroll this rank's devices. One outcome per rank, retried
    // as one step: what was imported stays imported, and the devices
    // already enrolled stay enrolled (a failed add hands the endpoint back).
    let mut pending: Option<Endpoint<Pending, SharedMulticast>> = root_ep.map(Endpoint::cast);
    let mut enrolled = 0usize;
    let reports = agree_retrying(boot, tag, Step::Enroll, retry, deadline, || {
        if pending.is_none() {
            pending = Some(match classic {
                Some(c) => import_classic(ctx, c, &envelope, fd.take(), spec, team_size)?,
                None => import_checked(ctx, &envelope, spec, team_size)?,
            });
        }
        let enroll = |c| (Step::Enroll, c);
        let mut ep = pending.take().ok_or(enroll(Cause::BadMessage {
            reason: "no endpoint",
        }))?;
        for &dev in spec.devices.get(enrolled..).unwrap_or(&[]) {
            ep = match ep.add_device(dev) {
                Ok(ep) => ep,
                Err(f) => {
                    pending = Some(f.value);
                    return Err(enroll(Cause::Local(f.error)));
                }
            };
            enrolled += 1;
        }
        // What this rank enrolled, as the classic backend counts it (its
        // own table, not this rank's word).
        let devices = match classic {
            Some(c) => c.enrolled_here(ep.id()),
            None => Some(spec.devices.len()),
        };
        pending = Some(ep);
        let devices =
            devices
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(enroll(Cause::BadMessage {
                    reason: "no endpoint",
                }))?;
        Ok(Enrolled {
            team_size,
            join_digest: join_digest(&hellos),
            devices,
        }
        .encode())
    })?;
    // The root keeps its reference until here: every rank has imported (R12.3).
    // The ranks' word is checked, not trusted: every rank saw the same hellos
    // and enrolled what it claimed there, so the team is complete (C3).
    check_reports(&reports, &hellos, team_size, spec.root)?;
    if let Some(c) = classic {
        let Some(ep) = &pending else {
            return Err(TeamError::new(
                me,
                Step::Enroll,
                Cause::BadMessage {
                    reason: "no endpoint",
                },
            ));
        };
        // SAFETY: every rank agreed just above that it added all its
        // devices, and the ranks bring `team_size` devices in all (the join
        // step): every device of the team is added (C3).
        if let Err(code) = unsafe { c.team_complete(ep.id()) } {
            let e = ctx.error(Call::Query, code);
            return Err(TeamError::new(me, Step::Wait, Cause::Local(e)));
        }
    }

    // Wait, bounded, and agree that every rank's endpoint is ready: the wait
    // doubles as the team barrier. A wait that failed retryably hands the
    // endpoint back, to wait again with every rank.
    let mut ready = None;
    agree_retrying(boot, tag, Step::Wait, retry, deadline, || {
        if ready.is_none() {
            let ep = pending.take().ok_or((
                Step::Wait,
                Cause::BadMessage {
                    reason: "no endpoint",
                },
            ))?;
            match ep.wait(deadline.remaining()) {
                Ok(r) => ready = Some(r),
                Err(f) => {
                    pending = Some(f.value);
                    return Err((Step::Wait, Cause::Local(f.error)));
                }
            }
        }
        Ok(Vec::new())
    })?;
    let Some(endpoint) = ready else {
        return Err(TeamError::new(
            me,
            Step::Wait,
            Cause::BadMessage {
                reason: "no endpoint",
            },
        ));
    };
    Ok(SharedTeam {
        endpoint,
        rank: me,
        ranks,
        team_size,
        tag,
    })
}

/// Checks every rank's enrollment report against this rank's view of the
/// hello step: the same team size, the same digest of the hellos, and as many
/// devices enrolled as its hello claimed. A rank that differs from the
/// root's report is named (the lowest such rank, else the root), the same
/// on every rank that received the same reports.
///
/// What a process cannot know: how many devices other processes really
/// added to the object (the classic API has no query of it, and a logical
/// endpoint's is only its readiness, R3.2). A peer whose every message
/// lies alike is not caught here; on logical endpoints its lie ends in the
/// bounded wait, on the classic fallback a bind would block (C3).
fn check_reports(
    reports: &[Vec<u8>],
    hellos: &[Vec<u8>],
    team_size: u32,
    root: usize,
) -> Result<(), TeamError> {
    let mine = join_digest(hellos);
    let mut decoded = Vec::with_capacity(reports.len());
    for (rank, bytes) in reports.iter().enumerate() {
        let e = Enrolled::decode(bytes).map_err(|c| TeamError::new(rank, Step::Enroll, c))?;
        decoded.push(e);
    }
    let claimed = |rank: usize| {
        hellos
            .get(rank)
            .and_then(|h| Hello::decode(h).ok())
            .map_or(0, |h| h.devices.len() as u64)
    };
    let differs = |rank: usize, e: &Enrolled| -> Option<(&'static str, u64, u64)> {
        if e.team_size != team_size {
            Some(("team size", e.team_size.into(), team_size.into()))
        } else if e.join_digest != mine {
            Some(("join digest", e.join_digest, mine))
        } else if u64::from(e.devices) != claimed(rank) {
            Some(("devices enrolled", e.devices.into(), claimed(rank)))
        } else {
            None
        }
    };
    let Some((field, reported, expected)) = decoded
        .iter()
        .enumerate()
        .find_map(|(rank, e)| differs(rank, e))
    else {
        return Ok(());
    };
    // Named: the lowest rank whose view is not the root's, or that enrolled
    // other than it claimed.
    let root_view = decoded.get(root).map(|e| (e.team_size, e.join_digest));
    let blamed = decoded
        .iter()
        .enumerate()
        .find(|(r, e)| {
            Some((e.team_size, e.join_digest)) != root_view || u64::from(e.devices) != claimed(*r)
        })
        .map_or(root, |(r, _)| r);
    Err(TeamError::new(
        blamed,
        Step::Enroll,
        Cause::Mismatch(Mismatch::Report {
            field,
            reported,
            expected,
        }),
    ))
}

/// The team size every rank computes from the same hellos, or the same
/// mismatch on every rank.
fn agreed_team_size(hellos: &[Vec<u8>], spec: &TeamSpec, me: usize) -> Result<u32, TeamError> {
    let mut total: u64 = 0;
    let mut brought = Vec::with_capacity(hellos.len());
    let mut root_hello = None;
    for (rank, bytes) in hellos.iter().enumerate() {
        let h = Hello::decode(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        total = total.saturating_add(h.devices.len() as u64);
        brought.push(u32::try_from(h.devices.len()).unwrap_or(u32::MAX));
        if rank == spec.root {
            root_hello = Some(h);
        }
    }
    let Some(root) = root_hello else {
        return Err(TeamError::new(
            spec.root,
            Step::Hello,
            Cause::BadMessage {
                reason: "no hello from the root",
            },
        ));
    };
    for (rank, bytes) in hellos.iter().enumerate() {
        // Decoded above: cannot fail now, but stay total.
        let h = Hello::decode(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        super::same_options(rank, &h, root.bytes, root.counted_ops)?;
        // One clique for the whole team, where the driver can tell (R4.5).
        let team_clique = root.cliques.iter().flatten().next().copied();
        for (dev, clique) in h.devices.iter().zip(&h.cliques) {
            if let (Some(c), Some(expected)) = (*clique, team_clique)
                && c != expected
            {
                return Err(TeamError::new(
                    rank,
                    Step::Hello,
                    Cause::Mismatch(Mismatch::Clique {
                        device: dev.0,
                        clique: c,
                        expected,
                    }),
                ));
            }
        }
    }
    // A physical device joins once (R4.2): two ranks of one node that bring
    // the same device would meet the driver's refusal at enrollment (R12.5),
    // after the root made the team. Every rank checks the same hellos, so
    // every rank names the same later rank.
    let mut seen: Vec<(u64, usize)> = Vec::new();
    for (rank, bytes) in hellos.iter().enumerate() {
        let h = Hello::decode(bytes).map_err(|c| TeamError::new(rank, Step::Hello, c))?;
        for (dev, place) in h.devices.iter().zip(&h.places) {
            let Some(place) = *place else { continue };
            if let Some(&(_, other_rank)) = seen.iter().find(|(p, _)| *p == place) {
                return Err(TeamError::new(
                    rank,
                    Step::Hello,
                    Cause::Mismatch(Mismatch::SameDevice {
                        device: dev.0,
                        other_rank,
                    }),
                ));
            }
            seen.push((place, rank));
        }
    }
    let declared = spec.team_size;
    match declared {
        Some(d) if u64::from(d) != total => Err(TeamError::new(
            me,
            Step::Hello,
            Cause::Mismatch(Mismatch::TeamSize {
                declared: d,
                arriving: total,
                brought,
            }),
        )),
        _ if total == 0 || total > u64::from(u32::MAX) => Err(TeamError::new(
            me,
            Step::Hello,
            Cause::Local(crate::Error::EmptyTeam),
        )),
        _ => Ok(total as u32),
    }
}

/// What the root made: its endpoint, the envelope for the other ranks,
/// and (classic, POSIX) the descriptor to pass them.
struct Made {
    endpoint: Endpoint<Pending, SpreadTeam<Exportable>>,
    envelope: Vec<u8>,
    fd: Option<OwnedFd>,
}

fn create_and_export(
    ctx: &Context,
    classic: Option<&dyn ObjectSharing>,
    spec: &TeamSpec,
    team_size: u32,
) -> Result<Made, (Step, Cause)> {
    let local = |e: crate::Error| (Step::Create, Cause::Local(e));
    let mut s = Spec::spread(team_size, spec.bytes).exportable();
    if spec.counted_ops {
        s = s.counted_ops();
    }
    let endpoint = ctx
        .reserve_one()
        .map_err(local)?
        .create(s)
        .map_err(|f| local(f.error))?;
    let export = |e| (Step::Export, Cause::Local(e));
    let Some(classic) = classic else {
        let handle = endpoint.export().map_err(export)?;
        let envelope = encode_envelope(spec.counted_ops, &handle.to_bytes());
        return Ok(Made {
            endpoint,
            envelope,
            fd: None,
        });
    };
    let object = classic
        .export_object(endpoint.id(), spec.classic_handles)
        .map_err(|code| export(ctx.error(Call::MemExportToShareableHandle, code)))?;
    let (fabric, fd) = match object {
        ObjectExport::Fd(fd) => (None, Some(fd)),
        ObjectExport::Fabric(b) => (Some(b), None),
    };
    Ok(Made {
        endpoint,
        envelope: encode_classic_envelope(spec.counted_ops, fabric.as_ref()),
        fd,
    })
}

/// Imports the root's classic object (C5): the descriptor received over the
/// bootstrap or the fabric bytes of the envelope, staged with the team size
/// and size the ranks agreed on and the bind alignment this driver reports
/// for them, never with what the root sent.
fn import_classic(
    ctx: &Context,
    classic: &dyn ObjectSharing,
    envelope: &[u8],
    fd: Option<Result<OwnedFd, Cause>>,
    spec: &TeamSpec,
    team_size: u32,
) -> Result<Endpoint<Pending, SharedMulticast>, (Step, Cause)> {
    let check = |c| (Step::Check, c);
    let import = |c| (Step::Import, c);
    let (counted, carrier) = decode_envelope(envelope).map_err(check)?;
    if counted != spec.counted_ops {
        return Err(check(Cause::Mismatch(Mismatch::CountedOps)));
    }
    let what = match carrier {
        Carrier::ClassicFd => match fd {
            Some(Ok(fd)) => ObjectExport::Fd(fd),
            Some(Err(cause)) => return Err(import(cause)),
            None => {
                return Err(import(Cause::BadMessage {
                    reason: "no descriptor",
                }));
            }
        },
        Carrier::ClassicFabric(b) => {
            ObjectExport::Fabric(<[u8; 64]>::try_from(b).map_err(|_| {
                check(Cause::BadMessage {
                    reason: "classic fabric bytes of the wrong length",
                })
            })?)
        }
        Carrier::Fabric(_) => return Err(check(Cause::Mismatch(Mismatch::Backend))),
    };
    let props = Spec::spread(team_size, spec.bytes).exportable().props();
    let limits = ctx.limits(&props).map_err(|e| check(Cause::Local(e)))?;
    let ticket = classic
        .stage_import(what, team_size, spec.bytes)
        .map_err(|code| import(Cause::Local(ctx.error(Call::Import, code))))?;
    let handle = FabricHandle::<SpreadTeam<Exportable>>::new(
        ticket.0,
        spec.bytes,
        limits.bind_alignment,
        team_size,
    );
    // Even when a driver call of the import panics: the staged descriptor
    // closes with the unwinding, not with the backend.
    let staged = crate::unwind::OnUnwind::new(|| classic.unstage(&ticket));
    let ep = ctx
        .reserve_one()
        .map_err(|e| import(Cause::Local(e)))
        .and_then(|r| r.import(&handle).map_err(|f| import(Cause::Local(f.error))));
    staged.disarm();
    // Used by the import, or dropped now (the descriptor closes).
    classic.unstage(&ticket);
    Ok(ep?.cast())
}

fn import_checked(
    ctx: &Context,
    envelope: &[u8],
    spec: &TeamSpec,
    team_size: u32,
) -> Result<Endpoint<Pending, SharedMulticast>, (Step, Cause)> {
    let check = |c| (Step::Check, c);
    let (counted, carrier) = decode_envelope(envelope).map_err(check)?;
    let Carrier::Fabric(handle) = carrier else {
        return Err(check(Cause::Mismatch(Mismatch::Backend)));
    };
    let handle = FabricHandle::<SpreadTeam<Exportable>>::from_bytes(handle)
        .map_err(|e| check(Cause::Local(e)))?;
    // What the importer relies on, against what the ranks agreed on …
    let expect = super::expect_claim;
    expect(
        "team size",
        u64::from(handle.team_size()),
        u64::from(team_size),
    )?;
    expect("size", handle.size(), spec.bytes)?;
    expect(
        "counted operations",
        u64::from(counted),
        u64::from(spec.counted_ops),
    )?;
    // … and against what this driver reports for those properties (R10).
    let mut props = Spec::spread(team_size, spec.bytes).exportable();
    if counted {
        props = props.counted_ops();
    }
    check_limits(ctx, &props.props(), handle.bind_alignment()).map_err(check)?;
    let import = |c| (Step::Import, c);
    let ep = ctx
        .reserve_one()
        .map_err(|e| import(Cause::Local(e)))?
        .import(&handle)
        .map_err(|f| import(Cause::Local(f.error)))?;
    Ok(ep.agreed_counted_ops(counted).cast())
}

//! Both sides of a job whose ranks are OS processes on a model fabric: the
//! parent starts a fabric and spawns each rank with its rank, size,
//! scenario and rendezvous directory in the environment, and waits for
//! every rank and for the fabric to go idle ([`run`]); the child reads the same
//! variables back (its role is [`ROLE`] = `rank`) and ends with the same
//! result lines ([`report_end`]).
//!
//! Included by an area's `main.rs` (`#[path = "../common/job.rs"] mod job;`)
//! beside `support` (`../bootstrap_support/mod.rs`) and `rank`
//! (`../common/rank.rs`).
#![allow(dead_code)]

use std::time::Duration;

use cuda_endpoints::Context;
use cuda_endpoints::fabric::{self, FabricServer};
use cuda_endpoints::model::FabricConfig;

use crate::rank::Me;
use crate::support::{Children, Done, report, serial};

pub const ROLE: &str = "CEJOB_ROLE";
pub const SCENARIO: &str = "CEJOB_SCENARIO";
pub const SIZE: &str = "CEJOB_SIZE";
pub const DIR: &str = "CEJOB_DIR";
/// The rank under the library's own name for it, which the fabric's join
/// (`fabric::connect_env`) reads too.
pub const RANK: &str = "CUDA_ENDPOINTS_RANK";

/// Runs ranks `0..started` of a job of `size` ranks (the test `entry` of
/// this binary, e.g. `team_processes::child_rank`, on `scenario`) on a fresh fabric of
/// `config`, rank `r` joining it with `fabric_extra(r)` appended to its
/// `CUDA_ENDPOINTS_FABRIC` (e.g. `,imex=0`); waits (within `bound`) for
/// every child, then (within 10 s) for every process to leave the fabric.
pub fn run(
    entry: &str,
    scenario: &str,
    config: FabricConfig,
    (started, size): (usize, usize),
    fabric_extra: impl Fn(usize) -> &'static str,
    bound: Duration,
) -> (Vec<Done>, FabricServer) {
    let _serial = serial();
    let server = FabricServer::start(config).expect("fabric");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut kids = Children::default();
    for r in 0..started {
        let fabric_env = format!("{},rank={r}{}", server.socket().display(), fabric_extra(r));
        kids.spawn(
            &format!("rank{r}"),
            entry,
            &[
                (ROLE, "rank".into()),
                (SCENARIO, scenario.into()),
                (RANK, r.to_string()),
                (SIZE, size.to_string()),
                (DIR, dir.path().display().to_string()),
                (fabric::FABRIC_ENV, fabric_env),
            ],
        );
    }
    let done = kids.wait_all(bound);
    assert!(
        server.wait_idle(Duration::from_secs(10)),
        "fabric processes still connected"
    );
    (done, server)
}

/// A rank's result lines: its outcome (`ok` or `err ...`); then, once its
/// bootstrap and context are gone, whether anything of it is left on the
/// fabric (`leaks=0|1`) and what the double saw broken.
pub fn report_end<E: std::fmt::Display, B>(outcome: Result<(), E>, boot: B, ctx: Context, me: &Me) {
    match outcome {
        Ok(()) => report("ok"),
        Err(e) => report(&format!("err {e}")),
    }
    drop(boot);
    drop(ctx);
    report(&format!("leaks={}", u8::from(!me.live().is_empty())));
    report(&format!("double-violations={:?}", me.own_violations()));
}

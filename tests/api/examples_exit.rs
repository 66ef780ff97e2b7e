//! Issue 21, item 11: the examples that need the real driver exit non-zero,
//! and distinctly (2), when there is none, so that a script never counts a
//! run that did not happen as passed. `cargo test` builds the examples next
//! to this binary; where a driver (or the libcuda double) loads, there is
//! nothing to check.
#![cfg(feature = "model")]

use crate::children;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_real_driver_examples_exit_2_when_there_is_no_driver() {
    if cuda_endpoints::Context::cuda().is_ok() {
        println!("skipped: a driver loads here");
        return;
    }
    let dir = std::env::current_exe().unwrap();
    let examples = dir.parent().unwrap().parent().unwrap().join("examples");
    for (name, args) in [
        ("multicast_team", &["--driver", "cuda"][..]),
        ("probe", &[][..]),
        ("driver_overhead", &["1"][..]),
    ] {
        let exe = examples.join(name);
        if !exe.exists() {
            println!("skipped: {} not built", exe.display());
            continue;
        }
        let mut cmd = Command::new(&exe);
        cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = children::Guard::spawn(name, &mut cmd);
        let status = child.wait_until(Instant::now() + Duration::from_secs(60));
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{name}");
    }
}

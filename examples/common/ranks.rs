//! The child ranks a launcher started, killed and reaped on every path
//! (the launchers of `common::launch` and `tcp_bootstrap`).

use std::process::Child;

/// Kills and reaps the child ranks on every path.
pub struct Ranks(pub Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

//! The process-wide call policy of the real backend: a deny set of
//! [`Call`]s, checked before any entry point is touched, filled by
//! [`deny`] and by the environment variable [`DENY_ENV`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;
use crate::driver::Call;

/// Environment variable read by [`Cuda::open`](super::Cuda::open): comma-separated `cuda.h`
/// names (e.g. `cuMulticastCreate`) added to the deny set.
pub const DENY_ENV: &str = "CUDA_ENDPOINTS_DENY";

pub(super) const DENY_WORDS: usize = Call::ALL.len().div_ceil(64);

/// A set of [`Call`]s as a bitset of atomics: lock-free to read on every call.
pub(super) struct DenySet([AtomicU64; DENY_WORDS]);

impl DenySet {
    pub(super) const fn new() -> DenySet {
        DenySet([const { AtomicU64::new(0) }; DENY_WORDS])
    }

    // `Call` is a fieldless enum declared in `Call::ALL` order, so its
    // discriminant is its index.
    fn slot(call: Call) -> (usize, u64) {
        let i = call as usize;
        (i / 64, 1u64 << (i % 64))
    }

    pub(super) fn add(&self, call: Call) {
        let (w, bit) = Self::slot(call);
        self.0[w].fetch_or(bit, Ordering::SeqCst);
    }

    pub(super) fn contains(&self, call: Call) -> bool {
        let (w, bit) = Self::slot(call);
        self.0[w].load(Ordering::SeqCst) & bit != 0
    }
}

pub(super) static DENY: DenySet = DenySet::new();

/// Adds `calls` to the process-wide deny set. A denied call made through any
/// [`Cuda`](super::Cuda) returns `CUDA_ERROR_NOT_PERMITTED` without reaching the driver.
/// There is no way to lift a denial: the set only grows.
pub fn deny(calls: &[Call]) {
    for &call in calls {
        DENY.add(call);
        tracing::debug!(call = call.name(), "driver call denied by policy");
    }
}

/// Whether `call` is in the process-wide deny set.
pub fn is_denied(call: Call) -> bool {
    DENY.contains(call)
}

/// Splits a deny list (`"cuMulticastCreate, cuMemCreate"`) into the calls it
/// names and the entries that name none.
pub(super) fn parse_deny_list(list: &str) -> (Vec<Call>, Vec<String>) {
    let mut calls = Vec::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match Call::from_name(name) {
            Some(call) => calls.push(call),
            None => unknown.push(name.to_owned()),
        }
    }
    (calls, unknown)
}

/// Applies [`DENY_ENV`]. An entry that names no entry point fails: a typo in
/// a safety guard must not silently let the call through.
pub(super) fn apply_env_deny() -> Result<(), Error> {
    let list = match std::env::var(DENY_ENV) {
        Ok(list) => list,
        Err(std::env::VarError::NotPresent) => return Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(Error::Unsupported {
                what: format!("{DENY_ENV} (not valid UTF-8)"),
                driver_version: None,
                hint: "set it to comma-separated cuda.h names, e.g. cuMulticastCreate".into(),
            });
        }
    };
    let (calls, unknown) = parse_deny_list(&list);
    // Deny what was understood even when something else was not.
    deny(&calls);
    if unknown.is_empty() {
        return Ok(());
    }
    let known: Vec<&str> = Call::ALL.iter().map(|c| c.name()).collect();
    Err(Error::Unsupported {
        what: format!("{DENY_ENV} entries {unknown:?} (no such driver entry point)"),
        driver_version: None,
        hint: format!("use cuda.h names from: {}", known.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_set_bits() {
        let set = DenySet::new();
        assert!(Call::ALL.iter().all(|&c| !set.contains(c)));
        set.add(Call::MulticastCreate);
        set.add(Call::MulticastUnbind);
        for &c in Call::ALL {
            let expected = matches!(c, Call::MulticastCreate | Call::MulticastUnbind);
            assert_eq!(set.contains(c), expected, "{c}");
        }
    }

    #[test]
    fn deny_list_parsing() {
        let (calls, unknown) =
            parse_deny_list(" cuMulticastCreate,,cuMemCreate , cuMulticastCreat");
        assert_eq!(calls, vec![Call::MulticastCreate, Call::MemCreate]);
        assert_eq!(unknown, vec!["cuMulticastCreat".to_owned()]);
        assert_eq!(parse_deny_list(""), (vec![], vec![]));
    }
}

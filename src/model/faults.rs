//! Fault injection: make any driver call fail with a chosen code, at the n-th
//! matching call or at random with a seed (SPEC R11, R5.10, R4.5).

use crate::driver::{Call, Code};

/// One planned failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The entry point it applies to; `None` for any call.
    pub call: Option<Call>,
    /// Fail the n-th matching call (1-based), counted from installation.
    pub nth: u64,
    /// The code returned.
    pub code: Code,
    /// How many matching calls have been seen.
    seen: u64,
    fired: bool,
}

impl Fault {
    /// Fail the `nth` (1-based) call to `call` with `code`.
    pub fn nth(call: Call, nth: u64, code: Code) -> Fault {
        Fault {
            call: Some(call),
            nth,
            code,
            seen: 0,
            fired: false,
        }
    }

    /// Fail the `nth` (1-based) driver call of any kind with `code`.
    pub fn nth_any(nth: u64, code: Code) -> Fault {
        Fault {
            call: None,
            nth,
            code,
            seen: 0,
            fired: false,
        }
    }
}

/// The codes the SPEC allows for `call`, beyond its rule errors (R11, R5.10,
/// R4.5): what random faults draw from.
pub fn allowed_codes(call: Call) -> &'static [Code] {
    const ALWAYS: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
    ];
    const WITH_OOM: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::OUT_OF_MEMORY,
    ];
    const BIND: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::OUT_OF_MEMORY,
        Code::SYSTEM_NOT_READY,
        Code::ILLEGAL_STATE,
    ];
    const ADD: &[Code] = &[
        Code::NOT_INITIALIZED,
        Code::DEINITIALIZED,
        Code::NOT_PERMITTED,
        Code::NOT_SUPPORTED,
        Code::INVALID_DEVICE,
    ];
    match call {
        Call::BindMem | Call::BindAddr => BIND,
        Call::AddDevice => ADD,
        Call::Create
        | Call::IdReserve
        | Call::IdRelease
        | Call::Unbind
        | Call::Export
        | Call::Import
        | Call::Query
        | Call::GetLimits
        | Call::MemCreate
        | Call::MemMap
        | Call::MemAddressReserve
        | Call::MulticastCreate
        | Call::MulticastBindMem
        | Call::MulticastBindAddr => WITH_OOM,
        _ => ALWAYS,
    }
}

/// The faults in force for one node.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    planned: Vec<Fault>,
    /// Random faults: (state, probability in 1/65536, only these calls or all).
    random: Option<(u64, u32, Vec<Call>)>,
    fired: u64,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Adds a planned fault.
    pub fn with(mut self, fault: Fault) -> FaultPlan {
        self.planned.push(fault);
        self
    }

    /// Fails each call among `calls` (all, if empty) with probability
    /// `per_mille / 1000`, with a code drawn from [`allowed_codes`],
    /// reproducibly from `seed`.
    pub fn random(mut self, seed: u64, per_mille: u32, calls: &[Call]) -> FaultPlan {
        let p = (per_mille.min(1000) as u64 * 65536 / 1000) as u32;
        self.random = Some((seed | 1, p, calls.to_vec()));
        self
    }

    /// How many faults fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// Whether `call` fails now, and with which code.
    pub(crate) fn check(&mut self, call: Call) -> Option<Code> {
        for f in &mut self.planned {
            if f.fired || f.call.is_some_and(|c| c != call) {
                continue;
            }
            f.seen += 1;
            if f.seen == f.nth {
                f.fired = true;
                self.fired += 1;
                return Some(f.code);
            }
        }
        if let Some((state, p, calls)) = &mut self.random
            && (calls.is_empty() || calls.contains(&call))
        {
            // xorshift64: reproducible, no dependency.
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            if ((*state >> 16) & 0xffff) < *p as u64 {
                let codes = allowed_codes(call);
                self.fired += 1;
                return Some(codes[(*state >> 40) as usize % codes.len()]);
            }
        }
        None
    }
}

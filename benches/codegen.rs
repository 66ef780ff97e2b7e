//! The codegen check's two functions (`ci/codegen.sh`): a typed state change
//! and its raw twin, each `#[inline(never)]` and `#[no_mangle]` so that the
//! script finds them in the release assembly
//! (`cargo rustc -p cuda-endpoints-benches --release --example codegen -- --emit asm`).
//!
//! - `codegen_typed_poll`: `Endpoint<Pending, Unicast>::poll`, which asks
//!   the driver once (`cuLogicalEndpointQuery`) and turns the endpoint into
//!   `Endpoint<Ready, Unicast>` (or hands it back pending).
//! - `codegen_raw_query`: the same query made by hand on a `&dyn Driver`.
//!
//! The typestate claim the script holds: the state change itself compiles to
//! nothing. Its success path makes exactly the one driver call the raw twin
//! makes, calls nothing else (no allocation, no `Drop`, no copy, no lock),
//! and adds only the loads that reach the driver through the endpoint and the
//! moves that return the endpoint in its new state.

use cuda_endpoints::driver::{Driver, DriverResult};
use cuda_endpoints::{Endpoint, Failed, Pending, Readiness, Unicast};

/// The typed poll: the endpoint comes back `Ready`, or `Pending`.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn codegen_typed_poll(
    ep: Endpoint<Pending, Unicast>,
) -> Result<Readiness<Unicast>, Failed<Endpoint<Pending, Unicast>>> {
    ep.poll()
}

/// The raw twin: one `cuLogicalEndpointQuery` over the one id.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn codegen_raw_query(d: &dyn Driver, id: u32) -> DriverResult<bool> {
    // SAFETY: a query touches nothing anyone owns.
    unsafe { d.query(id, 1) }
}

fn main() {
    // Referenced so that both functions are kept (they are also `no_mangle`).
    let typed: fn(_) -> _ = codegen_typed_poll;
    let raw: fn(_, _) -> _ = codegen_raw_query;
    std::hint::black_box((typed, raw));
}

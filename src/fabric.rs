//! The model fabric (`cuda_endpoints_model::fabric`, re-exported here), and
//! joining it as a process of this crate: [`connect`] and [`connect_env`]
//! return a [`Context`] whose driver is that process on the fabric's model.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use cuda_endpoints::fabric;
//! // In every rank of `cuda-endpoints-fabric --nodes 2 --gpus 4 -- mpirun -n 8 app`:
//! let (ctx, me) = fabric::connect_env()?.expect("run under cuda-endpoints-fabric");
//! let dev = me.device().unwrap_or(cuda_endpoints::Device(0)); // rank 5: node 1, device 1
//! # let _ = (ctx, dev);
//! # Ok(()) }
//! ```

#[doc(no_inline)]
pub use cuda_endpoints_model::fabric::*;

use crate::Context;

/// Joins the fabric as a new process: a [`Context`] whose driver is that
/// process on the fabric's model, and the [`Process`] handle.
///
/// # Errors
/// As [`open`].
pub fn connect(join: &Join) -> Result<(Context, Process), FabricError> {
    let me = open(join)?;
    Ok((Context::new(me.remote()), me))
}

/// Joins the fabric named by [`FABRIC_ENV`] ([`Join::from_env`]); `Ok(None)`
/// when the variable is not set.
///
/// # Errors
/// As [`open`] and [`Join::from_env`].
pub fn connect_env() -> Result<Option<(Context, Process)>, FabricError> {
    match Join::from_env()? {
        Some(join) => connect(&join).map(Some),
        None => Ok(None),
    }
}

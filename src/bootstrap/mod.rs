//! TEMPORARY stand-in for the bootstrap branch (replaced at merge).
mod api;
mod error;
mod node;
mod threads;
mod wire;
pub use api::{Bootstrap, Traffic};
pub use error::*;
pub use node::NodeId;
pub use threads::{ThreadRank, Threads};

//! Reading a fabric handle as a kind without fabric handles: the plain
//! `SpreadTeam` (its origin `Local`) instead of `SpreadTeam<Exportable>` (R8.1).
use cuda_endpoints::{FabricHandle, SpreadTeam};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read("team.handle")?;
    let _handle = FabricHandle::<SpreadTeam>::from_bytes(&bytes)?;
    Ok(())
}

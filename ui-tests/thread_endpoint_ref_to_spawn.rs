//! Sending a kernel reference to a `thread::spawn` thread, which may outlive
//! the endpoint (R3.4, R7).
use std::time::Duration;

use cuda_endpoints::{Context, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, _model) = Context::model(Default::default());
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 2 << 20))?
        .wait(Duration::from_secs(1))?;
    let arg = ep.kernel_ref();
    let launcher = std::thread::spawn(move || println!("launch with endpoint {}", arg.id()));
    launcher.join().unwrap();
    Ok(())
}

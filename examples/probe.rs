//! What this machine supports: driver version, logical-endpoint and classic
//! multicast attributes, VMM granularities, cliques and memory, per device,
//! and what `Context::auto` would choose: the backend of the endpoints and
//! copies, and of a multicast team of every device. Reads only:
//! nothing is created (`cuMulticastCreate` is never called).
//!
//! ```text
//! cargo run --example probe                 # the real driver
//! cargo run --example probe -- --model      # the reference model (a 4-GPU 13.4 node)
//! cargo run --example probe -- --model=13.0 # the model of a CUDA 13.0 machine (no logical endpoints)
//! ```
//!
//! Without a driver it prints one line saying so and exits 2 (not run:
//! distinct from a pass and from a failure).

use std::process::ExitCode;

use cuda_endpoints::model::ModelConfig;
use cuda_endpoints::probe::Capabilities;
use cuda_endpoints::{Context, Error, backend::Policy};

fn main() -> ExitCode {
    let model = std::env::args().skip(1).find_map(|a| match a.as_str() {
        "--model" => Some(ModelConfig::default()),
        "--model=13.0" => Some(ModelConfig::cuda_13_0(1)),
        _ => None,
    });
    let ctx = match model {
        Some(cfg) => Context::model(cfg).0,
        None => match Context::cuda() {
            Ok(ctx) => ctx,
            Err(Error::NoDriver { reason }) => {
                println!("no CUDA driver on this machine ({reason}); try `--model`");
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("error: {:?}", cuda_endpoints::Report::from(e)); // message and causes
                return ExitCode::FAILURE;
            }
        },
    };
    let devices = match ctx.devices() {
        Ok(d) => d,
        Err(e) => {
            println!("backend {}: cannot count devices: {e}", ctx.backend_name());
            return ExitCode::SUCCESS;
        }
    };
    println!(
        "backend {}: {} device(s)\n",
        ctx.backend_name(),
        devices.len()
    );
    for &dev in &devices {
        println!("{}\n", Capabilities::probe(&ctx, dev));
    }
    let policy = Policy::from_env();
    let decision = ctx.decide(&devices, &policy);
    let team: Vec<String> = devices.iter().map(|d| d.0.to_string()).collect();
    print!(
        "Context::auto for a team of every device ({}):\n{decision}",
        team.join(", ")
    );
    ExitCode::SUCCESS
}

//! The whole logical-endpoint lifecycle, step by step: reserve ids, build a
//! 4-device multicast team (counted by the compiler) and a unicast endpoint,
//! wait for readiness, bind one allocation per device, then tear it all down.
//!
//! ```text
//! cargo run --example multicast_team --features model                 # reference model, 4 GPUs
//! cargo run --example multicast_team --features model -- --driver cuda  # the real driver
//! ```
//!
//! Exits 0 when it ran (also when the machine reports logical endpoints
//! unsupported, and says so), 1 on an error, 2 when there is no driver to
//! run on.

use std::process::ExitCode;
use std::time::Duration;

use cuda_endpoints::typenum::U4;
use cuda_endpoints::{Allocation, Context, Device, Endpoint, Error, Private, Readiness, Spec};

/// The exit status when the example could not run (no driver).
const NOT_RUN: u8 = 2;

fn main() -> ExitCode {
    let real =
        std::env::args().any(|a| a == "cuda") || std::env::args().any(|a| a == "--driver=cuda");
    let (ctx, model) = if real {
        match Context::cuda() {
            Ok(ctx) => (ctx, None),
            Err(e) => {
                // Not run: distinct from a pass (0) and a failure (1), so
                // that a script never counts it as passed.
                println!("no driver to run on: {e}");
                return ExitCode::from(NOT_RUN);
            }
        }
    } else {
        let (ctx, model) = Context::model(Default::default());
        (ctx, Some(model))
    };
    println!("backend: {}", ctx.backend_name());
    match run(&ctx) {
        Ok(()) => {}
        // Not an error of this program: the machine cannot run the example.
        Err(e) if e.is_unsupported() || matches!(e, Error::NoSuchDevice { .. }) => {
            println!("\n{e}");
            print_support(&ctx);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {:?}", cuda_endpoints::Report::from(e)); // message and causes
            return ExitCode::FAILURE;
        }
    }
    let teardown = ctx.take_teardown_errors();
    if !teardown.is_empty() {
        eprintln!("teardown errors: {teardown:?}");
        return ExitCode::FAILURE;
    }
    if let Some(model) = model {
        let live = model.live();
        println!(
            "\nmodel leak counters: ids {}, endpoints {}, bindings {}, allocations {}, mappings {}, address ranges {}",
            live.ids,
            live.endpoints,
            live.bindings,
            live.allocations,
            live.mappings,
            live.address_ranges
        );
        if !live.is_empty() || !model.violations().is_empty() {
            eprintln!("leak or rule violation: {live:?} {:?}", model.violations());
            return ExitCode::FAILURE;
        }
        println!("nothing leaked");
    }
    ExitCode::SUCCESS
}

fn run(ctx: &Context) -> Result<(), Error> {
    // 1. Two contiguous ids (R1). On a driver before 13.3 this is where
    //    `Error::Unsupported` comes from.
    let range = ctx.reserve(2)?;
    println!(
        "\n1. reserved ids [{}, {})",
        range.base(),
        range.base() + range.len()
    );
    let Ok([mc_id, uc_id]) = range.into_array::<2>() else {
        unreachable!("reserved two ids")
    };
    let devices = ctx.devices()?;
    println!("   devices: {}", devices.len());
    if devices.len() < 4 {
        // The team below is devices 0..4: name the first one missing.
        return Err(Error::NoSuchDevice {
            device: Device(devices.len() as i32),
            count: devices.len() as i32,
        });
    }

    // 2. A multicast team of 4, sized by the driver's limits (R2, R10).
    let size = 64 << 20; // 64 MiB per device
    let team = mc_id.create(Spec::team(U4::new(), size))?;
    println!(
        "2. created multicast endpoint {} for a team of 4: {} bytes per device, bind alignment {} bytes",
        team.id(),
        team.size(),
        team.bind_alignment()
    );

    // 3. Enroll every device; the type counts them (R4). `team.wait(..)`
    //    here would not compile: the team is not complete.
    let team = team.add_device(devices[0])?;
    let team = team.add_device(devices[1])?;
    let team = team.add_device(devices[2])?;
    let team = team.add_device(devices[3])?;
    println!("3. enrolled {:?}", team.devices());

    // 4. A unicast endpoint owned by device 0.
    let unicast = uc_id.create(Spec::unicast(devices[0], size))?;
    println!(
        "4. created unicast endpoint {} owned by {}",
        unicast.id(),
        devices[0]
    );

    // 5. Readiness: poll without blocking, then wait with a timeout (R3).
    let mut polls = 1;
    let mut pending = unicast;
    let unicast = loop {
        match pending.poll()? {
            Readiness::Ready(ready) => break ready,
            Readiness::Pending(p) => {
                println!("5. poll {polls}: unicast endpoint still constructing");
                polls += 1;
                pending = p;
            }
        }
    };
    println!("5. unicast endpoint ready after {polls} polls");
    let team = team.wait(Duration::from_secs(5))?;
    println!(
        "5. multicast endpoint ready; kernel reference {:?}",
        team.kernel_ref()
    );

    // 6. One allocation per team device, bound at offset 0 on its device (R5).
    let allocations = devices[..4]
        .iter()
        .map(|&d| Allocation::<Private>::on_device(ctx, d, size))
        .collect::<Result<Vec<_>, _>>()?;
    let mut bindings = Vec::new();
    for (dev, mem) in devices.iter().zip(&allocations) {
        let b = team.bind(*dev, 0, mem)?;
        println!(
            "6. bound {} bytes of {dev}'s allocation at offset {} of endpoint {}",
            b.size(),
            b.offset(),
            team.id()
        );
        bindings.push(b);
    }
    let local = Allocation::<Private>::on_device(ctx, devices[0], size)?
        .map(&[devices[0]])
        .map_err(Error::from)?;
    let half = size / 2;
    let ub = unicast.bind_part(devices[0], half, &local, 0, half)?;
    println!(
        "6. bound {} bytes at {:#x} to unicast endpoint {} at offset {}",
        ub.size(),
        local.device_ptr(),
        unicast.id(),
        ub.offset()
    );

    // 7. Teardown: unbind through the tokens (R6), destroy (R7), release (R1).
    for b in bindings {
        let (dev, off) = (b.device(), b.offset());
        b.unbind()?;
        println!("7. unbound {dev} at offset {off}");
    }
    ub.unbind()?;
    println!("7. unbound the unicast binding");
    let mc_id: Endpoint = team.destroy()?;
    let uc_id: Endpoint = unicast.destroy()?;
    println!(
        "7. destroyed both endpoints; ids {} and {} stay reserved",
        mc_id.id(),
        uc_id.id()
    );
    mc_id.release()?;
    uc_id.release()?;
    println!("7. released the id range");
    drop(allocations);
    drop(local);
    println!("7. freed the allocations");
    Ok(())
}

fn print_support(ctx: &Context) {
    use cuda_endpoints::driver::attr;
    println!("what this machine supports:");
    println!("  driver version: {:?}", ctx.driver_version());
    for dev in ctx.devices().unwrap_or_default() {
        let a = |n| match ctx.attribute(dev, n) {
            Ok(v) => v.to_string(),
            Err(e) => format!("unknown ({})", e.code().map_or("error", |c| c.name())),
        };
        println!(
            "  {dev}: classic multicast {}, fabric handles {}, logical endpoints unicast {} / multicast {}",
            a(attr::MULTICAST_SUPPORTED),
            a(attr::FABRIC_SUPPORTED),
            a(attr::LE_UNICAST),
            a(attr::LE_MULTICAST)
        );
    }
}

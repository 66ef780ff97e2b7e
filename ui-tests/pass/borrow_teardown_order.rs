//! The `borrow_*` and `lint_*` cases done right: keep each `Binding` in a
//! named variable, unbind (or drop) it before destroying the endpoint and
//! before freeing or unmapping the memory (R6, R7, R7.2).
use std::time::Duration;

use cuda_endpoints::{Allocation, Context, Private, Spec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, model) = Context::model(Default::default());
    let mem = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?;
    let mapped = Allocation::<Private>::on_device(&ctx, 0, 2 << 20)?.map(&[0])?;
    let ep = ctx
        .reserve_one()?
        .create(Spec::unicast(0, 4 << 20))?
        .wait(Duration::from_secs(1))?;
    let by_handle = ep.bind(0, 0, &mem)?;
    let by_address = ep.bind(0, 2 << 20, &mapped)?;
    by_handle.unbind()?;
    drop(by_address); // unbinds too
    let id = ep.destroy()?;
    drop(mem);
    drop(mapped);
    id.release()?;
    assert!(model.live().is_empty(), "{:?}", model.live());
    Ok(())
}

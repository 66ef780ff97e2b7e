//! Loading `libcuda` at run time (once per process) and resolving the entry
//! points of [`ffi`](super::ffi) by name.
//!
//! `libcuda.so.1` (the driver's soname) is tried first, then `libcuda.so`
//! (a development symlink). The library stays loaded for the life of the
//! process, so every resolved pointer stays valid.

use std::ffi::c_void;
use std::sync::OnceLock;

use libloading::Library;

use super::ffi::Symbols;

/// The names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// The loaded library, or why none could be loaded (the first failure
/// decides for the whole process).
static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();

fn library() -> Result<&'static Library, String> {
    LIBRARY
        .get_or_init(|| {
            let mut why = Vec::new();
            for &name in LIBRARY_NAMES {
                // SAFETY: loading libcuda runs its initialisers, which is what
                // any use of the driver requires; it is never unloaded.
                match unsafe { Library::new(name) } {
                    Ok(lib) => return Ok(lib),
                    Err(e) => why.push(format!("{name}: {e}")),
                }
            }
            Err(format!(
                "libcuda was not found by the dynamic loader ({})",
                why.join("; ")
            ))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Loads `libcuda` (once) and resolves every entry point; `Err` says why
/// there is no library.
pub fn load() -> Result<Symbols, String> {
    let lib = library()?;
    // SAFETY: each name is looked up in libcuda itself, whose exported
    // symbol of that name is the `cuda.h` function declared in `ffi` (the
    // ABI check compares the declarations with the header); the library is
    // never unloaded, so the addresses stay valid.
    let symbols = unsafe {
        Symbols::resolve(|name| {
            lib.get::<*mut c_void>(name.to_bytes_with_nul())
                .map(|s| *s)
                .unwrap_or(std::ptr::null_mut())
        })
    };
    Ok(symbols)
}

//! The compile-error catalogue (`ui-tests/`, run by trybuild): every misuse
//! the types forbid, one per file, with rustc's exact message beside it
//! (`.stderr`), and the correct version of each group (`ui-tests/pass/`).
//!
//! The `.stderr` files are rustc 1.95's output: on any other compiler the test
//! prints a skip line and passes. Bless with
//! `TRYBUILD=overwrite cargo test --test ui`, then read every diff.

/// The compiler the `.stderr` files were written by.
const PINNED: &str = "rustc 1.95.";

#[test]
fn ui() {
    if !cfg!(feature = "model") {
        println!("skipping ui tests: they use the reference model (feature `model`)");
        return;
    }
    // Run from the crate root so that rustup honours rust-toolchain.toml, as
    // trybuild's own cargo invocations do.
    let version = std::process::Command::new("rustc")
        .arg("--version")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    if !version.starts_with(PINNED) {
        println!(
            "skipping ui tests: the .stderr files are {PINNED}x output, this is {:?}",
            version.trim()
        );
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/*.rs");
    t.pass("ui-tests/pass/*.rs");
}

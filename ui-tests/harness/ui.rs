//! The compile-error catalogue (`ui-tests/`): every misuse the types forbid,
//! one per file, with rustc's exact message beside it (`.stderr`), and the
//! correct version of each group (`ui-tests/pass/`).
//!
//! On every compiler, each case is proved:
//! - on the pinned one (rustc 1.95, `rust-toolchain.toml`), trybuild
//!   compares rustc's output with the `.stderr` files word for word (by
//!   `cargo check`: the refused cases only; the correct versions compile
//!   and run as the doctests of `guide::misuse_cases` in the same
//!   `cargo test`);
//! - on any other, the words are not compared (they change between
//!   compilers), but every case must still be refused with the error code
//!   its `.stderr` names, and every correct version must still compile and
//!   run: this test runs the doctests of `guide::misuse_cases`, which hold
//!   each case as a `compile_fail,EXXXX` doctest, with rustdoc's error-code
//!   check switched on (`RUSTC_BOOTSTRAP=cuda_endpoints`: stable rustdoc
//!   checks codes only when told to).
//!
//! `every_case_is_a_doctest_with_the_code_of_its_stderr` keeps that list
//! true to `ui-tests/` on every compiler.
//!
//! Bless the `.stderr` files with `TRYBUILD=overwrite cargo test -p
//! cuda-endpoints-ui` on the pinned compiler, then read every diff as a
//! user would.
//!
//! This package (`ui-tests/Cargo.toml`) depends on the library with feature
//! `model` alone, so that trybuild's project checks no more than the cases
//! need.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The compiler the `.stderr` files were written by.
const PINNED: &str = "rustc 1.95.";

/// The repository: this package is its `ui-tests/`.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The compiler this test runs under. From the crate root, so that rustup
/// honours rust-toolchain.toml (and `cargo +toolchain`), as trybuild's own
/// cargo invocations do.
fn rustc_version() -> String {
    Command::new("rustc")
        .arg("--version")
        .current_dir(ROOT)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// `name -> first error code` of every `ui-tests/*.stderr` (`"lint"` when
/// the first error has no code: a lint the case denies).
fn stderr_codes() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(Path::new(ROOT).join("ui-tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let stderr = path.with_extension("stderr");
        let text = std::fs::read_to_string(&stderr)
            .unwrap_or_else(|e| panic!("{}: {e} (bless it first)", stderr.display()));
        let first = text
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or_else(|| panic!("{}: no error in it", stderr.display()));
        let code = first
            .strip_prefix("error[")
            .and_then(|rest| rest.split_once(']'))
            .map_or("lint", |(code, _)| code);
        out.insert(name, code.to_owned());
    }
    out
}

/// The names in `ui-tests/pass/`.
fn pass_cases() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("ui-tests/pass"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The body of the macro call `name! { ... }` in `src/guide.rs`, one
/// trimmed line per entry, without the trailing comma.
fn guide_list(name: &str) -> Vec<String> {
    let guide = std::fs::read_to_string(Path::new(ROOT).join("src/guide.rs")).unwrap();
    let open = format!("{name}! {{");
    let start = guide
        .find(&open)
        .unwrap_or_else(|| panic!("src/guide.rs has no `{open}`"))
        + open.len();
    let end = start + guide[start..].find('}').unwrap();
    guide[start..end]
        .lines()
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn every_case_is_a_doctest_with_the_code_of_its_stderr() {
    let listed: BTreeMap<String, String> = guide_list("refused")
        .iter()
        .map(|l| {
            let (name, code) = l.split_once(':').expect("`case: CODE`");
            (name.trim().to_owned(), code.trim().to_owned())
        })
        .collect();
    let want = stderr_codes();
    let line = |(n, c): (&String, &String)| format!("        {n}: {c},\n");
    assert_eq!(
        listed,
        want,
        "`refused!` in src/guide.rs (guide::misuse_cases) must list every ui-tests/*.rs case \
         with the first error code of its .stderr; it should read:\n{}",
        want.iter().map(line).collect::<String>()
    );
    assert_eq!(
        guide_list("accepted"),
        pass_cases(),
        "`accepted!` in src/guide.rs must list every ui-tests/pass/*.rs case"
    );
}

#[test]
fn ui() {
    let version = rustc_version();
    if version.starts_with(PINNED) {
        // Said before the long silent part, on the process's stderr (libtest
        // captures `eprintln!`).
        let _ = writeln!(
            std::io::stderr(),
            "ui: checking the {} misuses of ui-tests/ against their .stderr with {version} \
             (trybuild; the first run also checks the crate and its dependencies in \
             target/tests/trybuild: about 20 s on an idle 2-core machine)",
            stderr_codes().len()
        );
        // Only the refused cases: `cargo check` (no code generated, nothing
        // linked) shows every error they are refused with. The correct
        // versions (`ui-tests/pass/`) compile and run as the doctests of
        // `guide::misuse_cases` in the same `cargo test`; a `t.pass` here
        // would make trybuild build, link and run every dependency again.
        let t = trybuild::TestCases::new();
        t.compile_fail("*.rs");
        return;
    }
    println!(
        "{version:?} is not the pinned {PINNED}x: .stderr not compared; proving every case \
         with its error code through the doctests of guide::misuse_cases"
    );
    every_case_refused_with_its_code();
}

/// Runs the doctests of `guide::misuse_cases` with the same cargo and
/// compiler, and checks that every case ran and passed.
fn every_case_refused_with_its_code() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(ROOT)
        .args([
            "test",
            "-p",
            "cuda-endpoints",
            "--doc",
            "--no-default-features",
            "--features",
            "model",
        ])
        .args(["--", "guide::misuse_cases"])
        // Stable and beta rustdoc check `compile_fail,EXXXX` codes only with
        // unstable checks allowed; for this crate only.
        .env("RUSTC_BOOTSTRAP", "cuda_endpoints")
        .output()
        .expect("run cargo test --doc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a misuse is no longer refused with its error code, or a correct version no longer \
         compiles:\n{stdout}\n{stderr}"
    );
    let cases = stderr_codes().len() + pass_cases().len();
    let passed = stdout
        .lines()
        .filter(|l| {
            l.starts_with("test ") && l.contains("guide::misuse_cases") && l.ends_with("ok")
        })
        .count();
    assert_eq!(passed, cases, "every case must run as a doctest:\n{stdout}");
    println!("{passed} cases proved on {}", rustc_version());
}

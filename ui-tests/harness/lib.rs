//! Nothing: this package exists for its test, `harness/ui.rs` (the
//! compile-error catalogue of `cuda-endpoints`, the cases beside it in
//! `ui-tests/`). Cargo needs a library or a binary in every package.

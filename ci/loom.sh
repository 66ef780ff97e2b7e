#!/usr/bin/env bash
# The copy gate's and the in-flight holds' interleavings under loom
# (issue 27, item 5 and its acceptance line).
#
#   ci/loom.sh [FILTER]     every interleaving of the tests of
#                           `src/ledger/gate.rs` and of
#                           `src/ledger/holds_tests.rs` (or those FILTER
#                           names), with `src/sync.rs` swapping std's
#                           atomics, mutex and condition variable for loom's
#
# Built in release with `--cfg loom` in a target directory of its own
# (target/loom), so that it never rebuilds the normal one. Two preemptions
# per execution (`LOOM_MAX_PREEMPTIONS`, loom's advice for CI) bound the
# search; a few minutes on two cores, most of it the first build.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
if [ $# -gt 0 ]; then
    cargo test -p cuda-endpoints --lib --release "$1"
    exit
fi
cargo test -p cuda-endpoints --lib --release ledger::gate::tests
# The hold/settle protocol (`src/ledger/holds.rs`) on stand-in parts.
cargo test -p cuda-endpoints --lib --release ledger::holds::tests

#!/usr/bin/env bash
# The real-hardware suite: build here, run on the GPU machine.
#
#   scripts/gpu-suite.sh build        # here (needs cargo): release-builds
#                                     # tests/gpu.rs and examples/probe.rs with
#                                     # feature `gpu`, copies them to .gpu-bin/
#   scripts/gpu-suite.sh run [ARGS]   # on the GPU machine (no Rust needed):
#                                     # probe, then the suite, one test at a
#                                     # time; ARGS go to the test binary
#                                     # (e.g. a test-name filter)
#   scripts/gpu-suite.sh bench [REPS [RUNS]]
#                                     # on the GPU machine: only the data-path
#                                     # bench (benches/gpu_copy.rs), its output
#                                     # with `# report:` lines in
#                                     # $OUT/gpu_copy.log (else .gpu-bin/), for
#                                     # `benches/report.sh --gpu LOG` here;
#                                     # with RUNS > 1, that many processes one
#                                     # after another, in gpu_copy.1.log …
#                                     # (medians move between processes more
#                                     # than within one): bring them back and
#                                     # `benches/report.sh --gpu gpu_copy.*.log`
#   scripts/gpu-suite.sh build-ab COMMIT
#                                     # here, after `build`: benches/gpu_copy.rs
#                                     # of COMMIT too (built in a worktree of
#                                     # its own under target/ab/), as
#                                     # .gpu-bin/gpu_copy.ab, its commit in
#                                     # .gpu-bin/ab
#   scripts/gpu-suite.sh ab [REPS [PAIRS]]
#                                     # on the GPU machine: PAIRS (default 4)
#                                     # pairs of processes, this build's
#                                     # gpu_copy then COMMIT's, alternating
#                                     # (side by side on one host: medians
#                                     # move between hosts and processes
#                                     # more than a round's change), each
#                                     # log with its `# report:` lines, all
#                                     # packed into $OUT/ab.tgz (the device
#                                     # tool brings back a few files a call)
#
# .gpu-bin/ is ignored through .git/info/exclude (never .gitignore), so it
# has to be carried to the GPU machine explicitly.
#
# `run` always sets CUDA_ENDPOINTS_DENY=cuMulticastCreate and
# CUDA_ENDPOINTS_CLASSIC_MULTICAST=0: cuMulticastCreate must never reach the
# driver on the shared GPU machines (on a several-GPU host it can take the
# GPUs out of service); the suite also denies it in-process before any test.
# Logs go to $OUT (when set, as on the device machine) and to .gpu-bin/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.gpu-bin"

die() {
    echo "gpu-suite: $*" >&2
    exit 1
}

# Keeps .gpu-bin/ out of git without touching the tracked .gitignore.
exclude_bin() {
    local exclude
    exclude="$(cd "$root" && git rev-parse --git-path info/exclude)"
    case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.gpu-bin/' "$exclude" 2>/dev/null || echo '/.gpu-bin/' >>"$exclude"
}

# Prints the executable of the artifact of kind $1 named $2 from cargo's JSON
# messages on stdin.
artifact() {
    grep -F '"reason":"compiler-artifact"' |
        grep -F "\"kind\":[\"$1\"]" |
        grep -F "\"name\":\"$2\"" |
        grep -o '"executable":"[^"]*"' |
        tail -n 1 |
        sed -e 's/^"executable":"//' -e 's/"$//'
}

build() {
    command -v cargo >/dev/null || die "cargo not found: build on a machine with the Rust toolchain"
    cd "$root"
    exclude_bin
    local json tests_exe probe_exe overhead_exe copy_exe
    json="$(mktemp)"
    trap 'rm -f "$json"' RETURN
    # cudarc (used by tests/gpu.rs) needs a CUDA version; the test machines run 13.0.
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    cargo test --release --features gpu --test gpu --no-run --message-format=json >"$json"
    tests_exe="$(artifact test gpu <"$json")"
    cargo build --release --features gpu --example probe --message-format=json >"$json"
    probe_exe="$(artifact example probe <"$json")"
    cargo build --release --example driver_overhead --message-format=json >"$json"
    overhead_exe="$(artifact example driver_overhead <"$json")"
    # The data path, typed against raw cuMemcpyAsync (benches/gpu_copy.rs).
    cargo bench -p cuda-endpoints-benches --bench gpu_copy --no-run --message-format=json >"$json"
    copy_exe="$(artifact bench gpu_copy <"$json")"
    [ -n "$tests_exe" ] && [ -x "$tests_exe" ] || die "no test executable for tests/gpu.rs in cargo's output"
    [ -n "$probe_exe" ] && [ -x "$probe_exe" ] || die "no executable for examples/probe.rs in cargo's output"
    mkdir -p "$bin"
    cp -f "$tests_exe" "$bin/gpu"
    cp -f "$probe_exe" "$bin/probe"
    [ -n "$overhead_exe" ] && cp -f "$overhead_exe" "$bin/driver_overhead"
    [ -n "$copy_exe" ] && [ -x "$copy_exe" ] || die "no executable for benches/gpu_copy.rs in cargo's output"
    cp -f "$copy_exe" "$bin/gpu_copy"
    # The commit the binaries were built from, for the bench's report lines.
    {
        git rev-parse --short HEAD 2>/dev/null || echo unknown
    } | tr -d '\n' >"$bin/commit"
    git diff --quiet HEAD -- . 2>/dev/null || printf ' (with uncommitted changes)' >>"$bin/commit"
    if command -v strip >/dev/null; then
        strip "$bin/gpu" "$bin/probe"
    fi
    chmod +x "$bin/gpu" "$bin/probe"
    echo "gpu-suite: built"
    ls -l "$bin/gpu" "$bin/probe" "$bin/gpu_copy"
    echo "gpu-suite: carry .gpu-bin to the GPU machine and run: scripts/gpu-suite.sh run"
}

run() {
    [ -x "$bin/gpu" ] && [ -x "$bin/probe" ] ||
        die "no binaries in $bin: run 'scripts/gpu-suite.sh build' where cargo is, and carry .gpu-bin"
    export CUDA_ENDPOINTS_DENY=cuMulticastCreate
    export CUDA_ENDPOINTS_CLASSIC_MULTICAST=0
    export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
    local logs="${OUT:-$bin}"
    mkdir -p "$logs"
    {
        echo "== host: $(uname -srm)"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi -L || true
        fi
        echo "== env: CUDA_ENDPOINTS_DENY=$CUDA_ENDPOINTS_DENY CUDA_ENDPOINTS_CLASSIC_MULTICAST=$CUDA_ENDPOINTS_CLASSIC_MULTICAST"
        echo "== probe"
    } 2>&1 | tee "$logs/gpu-suite.log"
    "$bin/probe" 2>&1 | tee -a "$logs/gpu-suite.log"
    echo "== suite" | tee -a "$logs/gpu-suite.log"
    "$bin/gpu" --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$logs/gpu-suite.log"
    if [ -x "$bin/driver_overhead" ] && [ $# -eq 0 ]; then
        echo "== the real backend's per-call overhead" | tee -a "$logs/gpu-suite.log"
        "$bin/driver_overhead" 2>&1 | tee -a "$logs/gpu-suite.log"
    fi
    if [ -x "$bin/gpu_copy" ] && [ $# -eq 0 ]; then
        echo "== the data path, typed against raw cuMemcpyAsync (benches/gpu_copy.rs)" | tee -a "$logs/gpu-suite.log"
        "$bin/gpu_copy" 2>&1 | tee -a "$logs/gpu-suite.log"
    fi
}

# Only the data-path bench, its output saved with the run's `# report:`
# lines for benches/report.sh --gpu.
bench() {
    [ -x "$bin/gpu_copy" ] ||
        die "no gpu_copy in $bin: run 'scripts/gpu-suite.sh build' where cargo is, and carry .gpu-bin"
    local reps="${1:-}" runs="${2:-1}"
    [[ $runs =~ ^[1-9][0-9]?$ ]] || die "bench: RUNS is a number from 1 to 99, not '$runs'"
    export CUDA_ENDPOINTS_DENY=cuMulticastCreate
    export CUDA_ENDPOINTS_CLASSIC_MULTICAST=0
    local logs="${OUT:-$bin}" gpu log i
    mkdir -p "$logs"
    gpu="$( (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo unknown) | head -n 1)"
    for ((i = 1; i <= runs; i++)); do
        log="$logs/gpu_copy.log"
        [ "$runs" -gt 1 ] && log="$logs/gpu_copy.$i.log"
        {
            echo "# report: date=$(date -u +%F)"
            echo "# report: commit=$(cat "$bin/commit" 2>/dev/null || echo unknown)"
            echo "# report: gpu=${gpu//,/, driver}"
            echo "# report: host=$(uname -srm)"
            echo "# report: run=$i of $runs"
            echo "# report: load_before=$(uptime | sed 's/.*load average: //')"
        } >"$log"
        "$bin/gpu_copy" ${reps:+"$reps"} 2>&1 | tee -a "$log"
        echo "# report: load_after=$(uptime | sed 's/.*load average: //')" >>"$log"
        echo "gpu-suite: saved $log"
    done
    echo "gpu-suite: benches/report.sh --gpu LOG... rewrites benches/README.md from them"
}

build_ab() {
    command -v cargo >/dev/null || die "cargo not found: build on a machine with the Rust toolchain"
    local commit="${1:-}" short tree json exe
    [ -n "$commit" ] || die "build-ab: which commit?"
    [ -x "$bin/gpu_copy" ] || die "build-ab: run 'scripts/gpu-suite.sh build' first"
    cd "$root"
    short="$(git rev-parse --short "$commit^{commit}")" || die "build-ab: no commit $commit"
    tree="$root/target/ab/$short"
    [ -d "$tree" ] || git worktree add --detach -f "$tree" "$short" >/dev/null
    json="$(mktemp)"
    trap 'rm -f "$json"' RETURN
    (cd "$tree" && CARGO_TARGET_DIR="$root/target/ab/target" cargo bench -p cuda-endpoints-benches --bench gpu_copy --no-run --message-format=json) >"$json"
    exe="$(artifact bench gpu_copy <"$json")"
    [ -n "$exe" ] && [ -x "$exe" ] || die "build-ab: no executable for benches/gpu_copy.rs of $short"
    cp -f "$exe" "$bin/gpu_copy.ab"
    command -v strip >/dev/null && strip "$bin/gpu_copy.ab"
    printf '%s' "$short" >"$bin/ab"
    echo "gpu-suite: gpu_copy of $short in $bin/gpu_copy.ab (this build: $(cat "$bin/commit"))"
}

ab() {
    [ -x "$bin/gpu_copy" ] && [ -x "$bin/gpu_copy.ab" ] ||
        die "ab: no gpu_copy and gpu_copy.ab in $bin: run 'build' and 'build-ab COMMIT' where cargo is, and carry .gpu-bin"
    local reps="${1:-1000}" pairs="${2:-4}" logs="${OUT:-$bin}" gpu i side exe commit log
    [[ $pairs =~ ^[1-9][0-9]?$ ]] || die "ab: PAIRS is a number from 1 to 99, not '$pairs'"
    export CUDA_ENDPOINTS_DENY=cuMulticastCreate
    export CUDA_ENDPOINTS_CLASSIC_MULTICAST=0
    mkdir -p "$logs/ab"
    gpu="$( (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo unknown) | head -n 1)"
    for ((i = 1; i <= pairs; i++)); do
        for side in this ab; do
            if [ "$side" = this ]; then
                exe="$bin/gpu_copy" commit="$(cat "$bin/commit")"
            else
                exe="$bin/gpu_copy.ab" commit="$(cat "$bin/ab")"
            fi
            log="$logs/ab/gpu_copy.$side.$i.log"
            {
                echo "# report: date=$(date -u +%F)"
                echo "# report: commit=$commit"
                echo "# report: gpu=${gpu//,/, driver}"
                echo "# report: host=$(uname -srm)"
                echo "# report: run=$i of $pairs ($side)"
                echo "# report: load_before=$(uptime | sed 's/.*load average: //')"
            } >"$log"
            "$exe" "$reps" >>"$log" 2>&1 || echo "# report: exit=$?" >>"$log"
            echo "# report: load_after=$(uptime | sed 's/.*load average: //')" >>"$log"
            echo "gpu-suite: $side $i of $pairs done"
        done
    done
    tar -C "$logs" -czf "$logs/ab.tgz" ab && rm -rf "$logs/ab"
    echo "gpu-suite: $logs/ab.tgz; benches/report.sh --gpu on each side's logs reads them"
}

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in
build) build ;;
run) run "$@" ;;
bench) bench "$@" ;;
build-ab) build_ab "$@" ;;
ab) ab "$@" ;;
*) die "usage: scripts/gpu-suite.sh build | build-ab COMMIT | run [test-binary args] | bench [repetitions [runs]] | ab [repetitions [pairs]]" ;;
esac

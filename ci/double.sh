#!/usr/bin/env bash
# The real-driver backend in CI, on the libcuda test double (`double/`).
#
#   ci/double.sh            build the double, check its prototypes against
#                           cuda.h 13.3 and 13.5, run the suites, the
#                           examples and the GPU suite through the real
#                           backend on it, and print the per-call counters
#   ci/double.sh build      only build; prints the LD_LIBRARY_PATH to use
#
# Layout (under target/double/):
#   13.5/libcuda.so.1   the double (CUDA_DOUBLE_VERSION picks 13.0/13.3/13.4/13.5)
#   13.0/libcuda.so.1   the `cuda-13000` build: no cuLogicalEndpoint* symbols
#   stub/libcuda.so     the double under the unversioned name: it plays the
#                       toolkit's stub library (every call CUDA_ERROR_STUB_LIBRARY)
#   abi-check.c         the generated C file that checks the double against cuda.h
# The headers (never committed) go to target/abi-check/, shared with ci/abi-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/double
mkdir -p "$out/13.5" "$out/13.0" "$out/stub"

build() {
    # The double is a workspace of its own, with a target dir of its own: a
    # `libcuda.so` in target/debug/deps would be on the path of every
    # `cargo test` (cargo puts that directory on LD_LIBRARY_PATH).
    nice cargo build --manifest-path double/Cargo.toml --target-dir "$out/build" "$@"
}
build
cp "$out/build/debug/libcuda.so" "$out/13.5/libcuda.so.1"
cp "$out/build/debug/libcuda.so" "$out/stub/libcuda.so"
build --features cuda-13000
cp "$out/build/debug/libcuda.so" "$out/13.0/libcuda.so.1"

if [ "${1:-}" = build ]; then
    echo "LD_LIBRARY_PATH=$out/13.5"
    exit 0
fi

# ---- the double's prototypes and layouts against the real cuda.h ----
# The headers: fetched into the same place as ci/abi-check.sh's (the
# boundary's check), so that CI downloads each wheel once.
headers=$root/target/abi-check
fetch_header() { # version-spec
    local dir=$headers/cu-${1//[.*]/}
    if [ ! -f "$dir/nvidia/cu13/include/cuda.h" ]; then
        mkdir -p "$dir"
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3.12 \
            "nvidia-cuda-runtime==$1" -d "$dir"
        (cd "$dir" && python3 -m zipfile -e ./*.whl .)
    fi
    echo "$dir/nvidia/cu13/include"
}
abi_c() { # library -> C text
    python3 - "$1" <<'EOF'
import ctypes, sys
f = ctypes.CDLL(sys.argv[1]).cuDoubleAbiC
f.restype = ctypes.c_size_t
n = f(None, 0)
b = ctypes.create_string_buffer(n + 1)
f(b, n + 1)
sys.stdout.write(b.value.decode())
EOF
}
abi_c "$out/13.5/libcuda.so.1" > "$out/abi-check.c"
abi_c "$out/13.0/libcuda.so.1" > "$out/abi-check-13000.c"
for version in 13.3.29 '13.5.*'; do
    inc=$(fetch_header "$version")
    for c in abi-check.c abi-check-13000.c; do
        gcc -std=c11 -Wall -Wextra -Werror -c -o /dev/null -I "$inc" "$out/$c"
    done
    echo "double ABI: prototypes and layouts match $(grep -m1 '#define CUDA_VERSION' "$inc/cuda.h")"
done
# The check can fail: one parameter narrowed must not compile.
sed 's/double_cuLogicalEndpointBindMem(CUlogicalEndpointId le_id, CUdevice dev, cuuint64_t offset/double_cuLogicalEndpointBindMem(CUlogicalEndpointId le_id, CUdevice dev, cuuint32_t offset/' \
    "$out/abi-check.c" > "$out/abi-check-broken.c"
! cmp -s "$out/abi-check.c" "$out/abi-check-broken.c"
if gcc -std=c11 -Wall -Werror -c -o /dev/null -I "$inc" "$out/abi-check-broken.c" 2>/dev/null; then
    echo "double ABI: a narrowed parameter compiled: the check checks nothing" >&2
    exit 1
fi

# ---- the suites through the real backend ----
export LD_LIBRARY_PATH=$out/13.5${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDA_ENDPOINTS_TEST_BACKEND=cuda
export CUDA_DOUBLE_DIR=$out
export CUDA_DOUBLE_COUNTS=$out/counts
rm -f "$CUDA_DOUBLE_COUNTS"
# The examples need no fixture: the double's own defaults (4 devices, 13.5).
# Proptest lifecycles with fewer cases: every case crosses the C ABI.
export PROPTEST_CASES=${PROPTEST_CASES:-16}
suites=(rules double classic hostile_input faults concurrency backend_lifecycle)
for s in "${suites[@]}"; do
    # DOUBLE_TEST_ARGS: extra libtest arguments, e.g. `--skip NAME` while debugging.
    nice cargo test --test "$s" -- ${DOUBLE_TEST_ARGS:-}
done
# The GPU suite as on a 13.5 driver, and as on the GPU machines' driver 580.
# It uses cudarc beside the library, which needs a CUDA version to build for.
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
# Two processes cannot share memory through the double: each process has
# a model of its own (the model fabric shares one across processes).
nice cargo test --features gpu --test gpu -- --test-threads=1 --skip two_processes_share
LD_LIBRARY_PATH=$out/13.0 nice cargo test --features gpu --test gpu -- --test-threads=1 --skip two_processes_share
# The examples as on 13.5 (the double's default), 13.3, and driver 580 (the
# 13.0 build: logical endpoints reported unsupported, the example still exits 0).
for pretend in 13.5: 13.5:13030 13.0:; do
    dir=${pretend%%:*} version=${pretend##*:}
    for ex in multicast_team probe; do
        LD_LIBRARY_PATH=$out/$dir CUDA_DOUBLE_VERSION=$version \
            nice cargo run --quiet --example "$ex" -- --driver cuda > "$out/example.log"
        echo "example $ex on the double $dir/${version:-default}: $(head -n1 "$out/example.log")"
        # It must have run on the double, not skipped for want of a driver.
        ! grep -q "no driver to run on" "$out/example.log"
    done
done

# ---- per-call counters, over every process above ----
# Each process's double appends its counts at exit (CUDA_DOUBLE_COUNTS). The
# `Driver` entry points are the rows of `for_each_driver_call!`; every one
# must have been called through the real backend, and succeeded, at least once.
grep -o '^ *\[[A-Za-z]*\] [A-Za-z]* "cu[A-Za-z0-9_]*"' src/driver/calls.rs \
    | sed 's/.*"\(cu[A-Za-z0-9_]*\)"/\1/' > "$out/driver-calls"
python3 - "$out/counts" "$out/driver-calls" <<'EOF'
import collections, sys
calls, failed = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    name, n, f = line.split()
    calls[name] += int(n)
    failed[name] += int(f)
entry = [l.strip() for l in open(sys.argv[2]) if l.strip()]
def row(name):
    ok = calls[name] - failed[name]
    print(f"  {name:42} {calls[name]:>8} {ok:>8} {failed[name]:>8}")
print(f"Driver entry points called through the real backend on the double ({len(entry)}):")
print(f"  {'entry point':42} {'calls':>8} {'success':>8} {'error':>8}")
for name in entry:
    row(name)
print("other cu* symbols the backend and the programs beside it called:")
for name in sorted(set(calls) - set(entry)):
    row(name)
zero = [n for n in entry if calls[n] - failed[n] == 0]
if zero or not entry:
    sys.exit(f"never called successfully through the real backend: {zero or 'no entry points found'}")
EOF

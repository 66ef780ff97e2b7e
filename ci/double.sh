#!/usr/bin/env bash
# The real-driver backend in CI, on the libcuda test double (`double/`).
#
#   ci/double.sh            build the double, check its prototypes against
#                           cuda.h 13.3 and 13.5, run the suites, the
#                           examples and the GPU suite through the real
#                           backend on it, then the multi-process suites and
#                           team examples with every process's double on a
#                           shared model fabric, and print the per-call
#                           counters of every process
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
# `portable_bring_up` (tests/team) is not here: its ranks are processes of one model in one
# OS process, which the double (one node per process) cannot be; its OS-process
# twin `portable_processes` runs below with the multi-process suites.
# Each suite is a module of an area's test binary (tests/<area>/main.rs),
# picked by its `module::` prefix, one process a module: the double's state
# (retained contexts, counters) is per process, and some suites assert on
# all of it (`double::a_call_naming_no_device_before_any_device_is_used_…`
# failed when `rules::` ran beside it in one process).
suites=("api rules double classic hostile_input faults concurrency backend_lifecycle"
    "copy data_path portable_copy copy_strided")
for s in "${suites[@]}"; do
    read -r area modules <<<"$s"
    for m in $modules; do
        # DOUBLE_TEST_ARGS: extra libtest arguments, e.g. `--skip NAME` while debugging.
        nice cargo test --features model --test "$area" -- "$m::" ${DOUBLE_TEST_ARGS:-}
    done
done
# The GPU suite as on a 13.5 driver, and as on the GPU machines' driver 580.
# It uses cudarc beside the library, which needs a CUDA version to build for.
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
# `two_processes_share` and `portable_path_two_processes` run below, with the
# multi-process suites: two processes share a model only on a fabric.
gpu_mp=(--skip two_processes_share --skip portable_path_two_processes)
nice cargo test --features gpu --test gpu -- --test-threads=1 "${gpu_mp[@]}"
LD_LIBRARY_PATH=$out/13.0 nice cargo test --features gpu --test gpu -- --test-threads=1 "${gpu_mp[@]}"
# The examples as on 13.5 (the double's default), 13.3, and driver 580 (the
# 13.0 build: logical endpoints reported unsupported, the example still exits 0).
for pretend in 13.5: 13.5:13030 13.0:; do
    dir=${pretend%%:*} version=${pretend##*:}
    for ex in multicast_team probe; do
        LD_LIBRARY_PATH=$out/$dir CUDA_DOUBLE_VERSION=$version \
            nice cargo run --quiet --features model --example "$ex" -- --driver cuda > "$out/example.log"
        echo "example $ex on the double $dir/${version:-default}: $(head -n1 "$out/example.log")"
        # It must have run on the double, not skipped for want of a driver.
        ! grep -q "no driver to run on" "$out/example.log"
    done
done

# ---- the multi-process suites through the real backend ----
# Each child process loads the double, and the double joins the test's own
# model fabric, named by CUDA_ENDPOINTS_FABRIC (double/src/node.rs): real OS
# processes share endpoints, ids, nodes and memory as on a real cluster, and
# every call of theirs crosses the C ABI. Each test starts its own fabric;
# the fabric's model keeps the rule log, which each test (and the
# launcher) asserts empty; the double's own log (contexts: what only the C
# side sees) dies with its process, so each fabric process appends it at
# exit to CUDA_DOUBLE_VIOLATIONS, which must stay empty. Everything runs
# with a private TMPDIR (sockets, bootstrap ids, MPI's session files) that
# must be empty afterwards, and no process of these programs may be left.
export CUDA_DOUBLE_VIOLATIONS=$out/violations
rm -f "$CUDA_DOUBLE_VIOLATIONS"
scratch=$out/tmp
rm -rf "$scratch" && mkdir -p "$scratch"
# Where the fabric processes' counts start in the counts file.
touch "$CUDA_DOUBLE_COUNTS"
wc -l < "$CUDA_DOUBLE_COUNTS" > "$out/counts.fabric-from"
mp_programs="$root/target/debug/(deps/(processes|gpu)-|examples/(tcp_team|mpi_team|allgather|broadcast)|cuda-endpoints-fabric)"
# The README's feature set where MPI is installed (the build CI made
# already), else the fabric alone.
if command -v mpirun > /dev/null; then mp_features=fabric,mpi; else mp_features=fabric; fi
(
    export TMPDIR=$scratch
    # `fabric`'s graph role captures a copy graph and completes copies through
    # events in a fabric process (the graph and event rows' fabric counts);
    # `portable_processes` copies on the portable path, a grown heap included.
    timeout 1200 nice cargo test --features "$mp_features" --test processes -- \
        fabric:: team_processes:: shareable_processes:: portable_processes:: ${DOUBLE_TEST_ARGS:-}
    nice cargo build --quiet --features "$mp_features" --example tcp_team --example allgather --example broadcast --bin cuda-endpoints-fabric
    # The GPU suite's two processes sharing memory (cudarc's memset and
    # copies included), and putting into and getting from each other's
    # memory through the portable path (classic unicast endpoints, windows,
    # cuMemcpyAsync), as on the GPU machines' driver 580: the 13.0 build,
    # the test and its two ranks on one fabric of 13.0 nodes.
    LD_LIBRARY_PATH=$out/13.0 timeout 300 nice "$root/target/debug/cuda-endpoints-fabric" \
        --gpus 4 --driver-version 13000 --timeout 240 -- \
        cargo test --features gpu --test gpu -- --test-threads=1 two_processes_share portable_path_two_processes
    for job in "4 1" "8 2"; do
        # shellcheck disable=SC2086 # ranks and nodes
        timeout 120 nice "$root/target/debug/examples/tcp_team" $job --driver cuda > "$out/example.log"
        echo "example tcp_team $job --driver cuda on the double: $(tail -n1 "$out/example.log")"
        # Data through endpoints, through the double's cuFabricCpyBatchAsync
        # on the fabric's 13.5 nodes; every byte checked on every rank.
        for ex in allgather broadcast; do
            # shellcheck disable=SC2086 # ranks and nodes
            timeout 120 nice "$root/target/debug/examples/$ex" $job --driver cuda > "$out/example.log"
            echo "example $ex $job --driver cuda on the double: $(tail -n1 "$out/example.log")"
        done
    done
    if command -v mpirun > /dev/null; then
        nice cargo build --quiet --features "$mp_features" --example mpi_team --example broadcast --bin cuda-endpoints-fabric
        for job in "1 4" "2 8"; do
            nodes=${job% *} ranks=${job#* }
            # As root, Open MPI wants to be told; the launcher bounds the job.
            timeout 180 nice "$root/target/debug/cuda-endpoints-fabric" --nodes "$nodes" --gpus 4 --timeout 120 -- \
                mpirun --allow-run-as-root --oversubscribe -n "$ranks" \
                "$root/target/debug/examples/mpi_team" --driver cuda > "$out/example.log" 2>&1
            echo "example mpi_team --driver cuda, $ranks ranks on $nodes node(s) under mpirun on the double: $(grep -c '^rank ' "$out/example.log") ranks; $(tail -n1 "$out/example.log")"
        done
        timeout 180 nice "$root/target/debug/cuda-endpoints-fabric" --nodes 2 --gpus 4 --driver-version 13050 --timeout 120 -- \
            mpirun --allow-run-as-root --oversubscribe -n 8 \
            "$root/target/debug/examples/broadcast" --mpi --driver cuda > "$out/example.log" 2>&1
        echo "example broadcast --mpi --driver cuda, 8 ranks on 2 nodes under mpirun on the double: $(grep -c 'all right$' "$out/example.log") ranks right; $(tail -n1 "$out/example.log")"
    else
        echo "example mpi_team: skipped (no mpirun)"
    fi
)
if [ -s "$CUDA_DOUBLE_VIOLATIONS" ]; then
    echo "the double saw violations in fabric processes:" >&2
    cat "$CUDA_DOUBLE_VIOLATIONS" >&2
    exit 1
fi
if pgrep -f "$mp_programs" > "$out/left.pids"; then
    echo "processes left behind:" >&2
    ps -o pid,args -p "$(paste -sd, "$out/left.pids")" >&2
    exit 1
fi
if [ -n "$(ls -A "$scratch")" ]; then
    echo "files left behind in TMPDIR:" >&2
    ls -la "$scratch" >&2
    exit 1
fi
rmdir "$scratch"
echo "multi-process suites on the double: no violation, no process or file left"

# ---- per-call counters, over every process above ----
# Each process's double appends its counts at exit (CUDA_DOUBLE_COUNTS). The
# `Driver` entry points are the rows of `for_each_driver_call!`; every one
# must have been called through the real backend, and succeeded, at least once.
grep -o '^ *\[[A-Za-z]*\] [A-Za-z]* "cu[A-Za-z0-9_]*"' crates/driver/src/calls.rs \
    | sed 's/.*"\(cu[A-Za-z0-9_]*\)"/\1/' > "$out/driver-calls"
python3 - "$out/counts" "$out/driver-calls" "$out/counts.fabric-from" <<'EOF'
import collections, sys
calls, failed, fabric = collections.Counter(), collections.Counter(), collections.Counter()
fabric_from = int(open(sys.argv[3]).read().strip() or 0)
for i, line in enumerate(open(sys.argv[1])):
    name, n, f = line.split()
    calls[name] += int(n)
    failed[name] += int(f)
    if i >= fabric_from:
        fabric[name] += int(n)
entry = [l.strip() for l in open(sys.argv[2]) if l.strip()]
def row(name):
    ok = calls[name] - failed[name]
    print(f"  {name:42} {calls[name]:>8} {ok:>8} {failed[name]:>8} {fabric[name]:>8}")
print(f"Driver entry points called through the real backend on the double ({len(entry)}):")
print("  (fabric: of the calls, those of processes on a shared model fabric)")
print(f"  {'entry point':42} {'calls':>8} {'success':>8} {'error':>8} {'fabric':>8}")
for name in entry:
    row(name)
print("other cu* symbols the backend and the programs beside it called:")
for name in sorted(set(calls) - set(entry)):
    row(name)
if not any(fabric[n] for n in entry):
    sys.exit("no driver entry point was called by a process on a model fabric")
zero = [n for n in entry if calls[n] - failed[n] == 0]
if zero or not entry:
    sys.exit(f"never called successfully through the real backend: {zero or 'no entry points found'}")
EOF

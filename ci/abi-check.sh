#!/usr/bin/env bash
# ABI check: the C declarations of src/driver/cuda/ffi.rs (and every CUresult
# that `Code` names) against the real cuda.h of CUDA 13.3, 13.4 and 13.5, and
# the portable path's `cuMemcpyBatchAsync_v2` against 13.0 (driver 580's).
#
# The C file is generated from the Rust declarations (src/driver/cuda/abi.rs,
# the same generator the libcuda double's check uses: one C ABI)
# and compiled with gcc against each header: sizes, field offsets, enum
# values and function prototypes must agree. The headers come from the
# `nvidia-cuda-runtime` wheels on PyPI; they are never committed.
#
# Last, the real backend runs one typed lifecycle over ci/fake-libcuda.c,
# compiled against the same header, loaded as libcuda.so.1.
#
# Usage: ci/abi-check.sh [WORKDIR]   (default: target/abi-check)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-target/abi-check}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

ABI_CHECK_OUT="$work/abi_check.c" cargo test --lib --quiet -- --ignored --exact \
    driver::cuda::tests::write_abi_check
CC="${CC:-gcc}"

for version in 13.3.29 '13.4.*' '13.5.*'; do
    dir="$work/cu-${version//[.*]/}"
    header="$dir/nvidia/cu13/include/cuda.h"
    if [ ! -f "$header" ]; then
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3.12 \
            "nvidia-cuda-runtime==$version" -d "$dir"
        (cd "$dir" && python3 -m zipfile -e ./*.whl .)
    fi
    echo "abi-check: $(grep -m1 '#define CUDA_VERSION' "$header")"
    "$CC" -fsyntax-only -std=c11 -Wall -Werror=incompatible-pointer-types \
        -I "$dir/nvidia/cu13/include" "$work/abi_check.c"
    # The header's cuLogicalEndpoint* entry points are exactly the table's
    # rows. 13.3-13.5 have no call that reports an imported endpoint's type
    # or team size (README "Guarantees": forged handle metadata); a header
    # that adds one fails here, so that the import learns to check it.
    if ! diff <(grep -o 'CUresult CUDAAPI cuLogicalEndpoint[A-Za-z0-9_]*' "$header" \
                    | sed 's/.* //' | sort -u) \
              <(grep -o '^ *\[[A-Za-z]*\] [A-Za-z]* "cuLogicalEndpoint[A-Za-z0-9_]*"' \
                    crates/driver/src/calls.rs | sed 's/.*"\(cu[A-Za-z0-9_]*\)"/\1/' | sort -u); then
        echo "abi-check: cuLogicalEndpoint* entry points of the header and of crates/driver/src/calls.rs differ" >&2
        exit 1
    fi
done

# The 13.5 data path is covered: the operand union (its members by path),
# the batch op and the prototype are checked by the compiler above, not
# skipped by a version guard that the newest header fails to meet.
grep -q '#define CUDA_VERSION 1305' "$header" || { echo "abi-check: the newest header is not 13.5" >&2; exit 1; }
for item in 'offsetof(CUfabricCpyOperand, op.ptr.locHint)' 'offsetof(CUfabricCpyOperand, op.le.offset)' \
            'sizeof(CUDA_FABRIC_COPY_BATCH_OP)' 'cuFabricCpyBatchAsync' 'cuStreamCreate' 'cuMemcpyAsync' \
            'CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT' 'cuStreamBeginCapture_v2' 'cuGraphLaunch' \
            'cuGraphInstantiateWithFlags' 'cuEventRecord' 'cuEventDestroy_v2' \
            'check_cuMemcpyBatchAsync_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t, CUstream)' \
            'offsetof(CUmemcpyAttributes, dstLocHint)' 'CU_MEMCPY_SRC_ACCESS_ORDER_STREAM'; do
    grep -qF "$item" "$work/abi_check.c" || { echo "abi-check: $item is not checked" >&2; exit 1; }
done

# The portable path's batch call as driver 580 (CUDA 13.0, the GPU machines)
# declares it: `cuMemcpyBatchAsync_v2` without 12.8's `failIdx`, and
# `CUmemcpyAttributes`. The 13.0 header has no logical endpoints, so only
# those checks (and the base types they use) are compiled against it.
dir13="$work/cu-130"
if [ ! -f "$dir13/nvidia/cu13/include/cuda.h" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3.12 \
        'nvidia-cuda-runtime==13.0.*' -d "$dir13"
    (cd "$dir13" && python3 -m zipfile -e ./*.whl .)
fi
{ sed -n '1,/^#define CHECK/p' "$work/abi_check.c"
  grep -E 'CUmemcpy|MEMCPY|CUmemLocation|cuMemcpyAsync|\(CUdeviceptr\)|\(CUstream\)' "$work/abi_check.c"; } > "$work/abi_check_13000.c"
grep -qF 'check_cuMemcpyBatchAsync_v2' "$work/abi_check_13000.c"
echo "abi-check: $(grep -m1 '#define CUDA_VERSION' "$dir13/nvidia/cu13/include/cuda.h") (cuMemcpyBatchAsync_v2)"
"$CC" -fsyntax-only -std=c11 -Wall -Werror=incompatible-pointer-types \
    -I "$dir13/nvidia/cu13/include" "$work/abi_check_13000.c"

# Every CUresult of the newest header has a name in `Code`.
missing=$(awk '/typedef enum cudaError_enum/,/} CUresult;/' "$header" \
    | grep -o 'CUDA_ERROR_[A-Z0-9_]*' | sort -u \
    | while read -r name; do grep -q "CHECK($name ==" "$work/abi_check.c" || echo "$name"; done)
if [ -n "$missing" ]; then
    echo "abi-check: CUresult codes without a name in crates/driver/src/code.rs:" >&2
    echo "$missing" >&2
    exit 1
fi
# The real backend end to end over a stand-in libcuda built from the header.
"$CC" -shared -fPIC -Werror -I "$dir/nvidia/cu13/include" -o "$work/libcuda.so.1" ci/fake-libcuda.c
LD_LIBRARY_PATH="$work" cargo test --lib --quiet -- --ignored --exact \
    driver::cuda::tests::fake_libcuda_lifecycle
echo "abi-check: ok"

#!/usr/bin/env bash
# Codegen check: "the state change compiles to nothing", held in CI.
#
# Builds benches/codegen.rs in release with `--emit asm` and compares two
# functions after normalising them (directives, labels, comments, symbol
# hashes stripped; registers and stack slots left as they are):
#
#   codegen_typed_poll  `Endpoint<Pending, Unicast>::poll`: one query, then
#                       the endpoint comes back `Ready` (or `Pending`)
#   codegen_raw_query   the same `cuLogicalEndpointQuery` by hand on a
#                       `&dyn Driver`
#
# The two cannot be identical, and the script does not pretend they are: the
# raw twin is handed the driver and tail-calls it (4 instructions); the typed
# poll reaches the driver through the endpoint (`Arc<RangeInner>` → context →
# `Arc<dyn Driver>`), keeps the endpoint for its unwind path, and writes its
# answer — `Result<Readiness<_>, Failed<_>>`, a tag and the 16-byte endpoint —
# through the return pointer. What is compared is what can honestly be:
#
#   1. Both make exactly one driver call, through the same vtable slot, with
#      the same count argument (1): the typed layer asks the driver nothing
#      more (no limits, no device query, no second query).
#   2. The typed function calls nothing else on any path but the error
#      mapping (`Context::error` and `Failure::new`, which boxes it with
#      the endpoint, only when the driver failed) and, on
#      unwinding, the endpoint's `drop_in_place`: no allocation, no copy
#      (`memcpy`), no lock, no reference count, no `Drop` of the endpoint on
#      the success path. The state change (`Pending` → `Ready`, a type-level
#      cast of the same pointer and id) therefore adds no call at all.
#   3. Instruction budgets, pinned at today's code: before the driver call
#      (reaching the driver through the endpoint) and in all. A regression
#      of either fails CI; a deliberate change updates the number here, with
#      the reason in the commit.
#
# Usage: ci/codegen.sh            (from anywhere in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

# Budgets (rustc 1.95.0, x86-64; see 3. above). 14 and 56 since issue 22
# (`Failed` one pointer: its error built out of line, in `Failure::new`).
TYPED_BEFORE_CALL_MAX=14
TYPED_TOTAL_MAX=56

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# The assembly lands beside the example (target/release/examples/codegen-HASH.s),
# rewritten whenever cargo rebuilds the example (the flags are in its fingerprint).
cargo rustc -q -p cuda-endpoints-benches --release --example codegen -- --emit asm
asm="$(ls -t target/release/examples/codegen-*.s | head -n 1)"

# The body of function $1, normalised: one instruction per line.
body() {
    awk -v f="$1" '$0 ~ "^"f":" {p = 1; next} p && /\.cfi_endproc/ {exit} p {print}' "$asm" |
        sed -E 's/#.*$//; s/^[[:space:]]+//; s/[[:space:]]+$//; s/17h[0-9a-f]{16}E/E/g; s/[[:space:]]+/ /g' |
        grep -Ev '^$|^\.|^[^ ]+:$'
}

body codegen_typed_poll >"$out/typed.s"
body codegen_raw_query >"$out/raw.s"
for f in typed raw; do
    if [ ! -s "$out/$f.s" ]; then
        echo "codegen: function of '$f' not found in $asm" >&2
        exit 1
    fi
done

fail=0
complain() {
    echo "codegen: $*" >&2
    fail=1
}

# 1. One driver call each, through the same vtable slot. The raw twin loads
#    the slot (`movq OFF(%reg), %reg`) and jumps or calls through it; the
#    typed side calls `*OFF(%reg)` directly.
typed_slots="$(grep -Eo '^call[q]? \*[0-9]+\(%[a-z0-9]+\)' "$out/typed.s" | grep -Eo '[0-9]+' || true)"
raw_slot="$(grep -Eo '^(call|jmp)[q]? \*[0-9]+\(%[a-z0-9]+\)' "$out/raw.s" | grep -Eo '[0-9]+' || true)"
if [ -z "$raw_slot" ]; then
    reg="$(grep -Eo '^(call|jmp)[q]? \*%[a-z0-9]+$' "$out/raw.s" | grep -Eo '%[a-z0-9]+' || true)"
    [ -n "$reg" ] && raw_slot="$(grep -E "^movq [0-9]+\(%[a-z0-9]+\), $reg$" "$out/raw.s" | grep -Eo '^movq [0-9]+' | grep -Eo '[0-9]+' || true)"
fi
[ "$(wc -w <<<"$raw_slot")" -eq 1 ] || complain "the raw twin should make one driver call, found slots: '$raw_slot'"
[ "$(wc -w <<<"$typed_slots")" -eq 1 ] || complain "the typed poll should make one driver call, found slots: '$typed_slots'"
[ "$typed_slots" = "$raw_slot" ] || complain "different driver entries: typed slot '$typed_slots', raw slot '$raw_slot'"
# The count argument: `movl $1, %edx` (the third argument) in both.
grep -qx 'movl $1, %edx' "$out/typed.s" || complain "typed: no count of 1 passed to the query"
grep -qx 'movl $1, %edx' "$out/raw.s" || complain "raw: no count of 1 passed to the query"

# 2. Nothing else called: every other call is the error mapping or unwinding.
others="$(grep -E '^(call|jmp)[q]? ' "$out/typed.s" | grep -Ev '^call[q]? \*[0-9]+\(%[a-z0-9]+\)$|^jmp[q]? \.L' || true)"
while IFS= read -r c; do
    [ -z "$c" ] && continue
    case "$c" in
    *Context5error*) ;;                                     # the driver failed: its error
    *Failure*3new*) ;;                                      # the driver failed: `Failed` boxed
    *drop_in_place*Endpoint*Pending*) ;;                    # unwinding only (a panicking driver)
    *_Unwind_Resume*) ;;                                    # unwinding only
    *panic_in_cleanup*) ;;                                  # unwinding only
    *) complain "typed: unexpected call: $c" ;;
    esac
done <<<"$others"
if grep -Eiq 'memcpy|memmove|alloc|free|lock|futex|drop_slow' "$out/typed.s"; then
    complain "typed: an allocation, copy, lock or reference count: $(grep -Ei 'memcpy|memmove|alloc|free|lock|futex|drop_slow' "$out/typed.s" | tr '\n' ';')"
fi

# 3. Budgets.
before="$(awk '/^call[q]? \*[0-9]+\(%[a-z0-9]+\)$/ {print NR - 1; exit}' "$out/typed.s")"
total="$(wc -l <"$out/typed.s")"
raw_total="$(wc -l <"$out/raw.s")"
[ "${before:-999}" -le "$TYPED_BEFORE_CALL_MAX" ] ||
    complain "typed: $before instructions before the driver call (budget $TYPED_BEFORE_CALL_MAX)"
[ "$total" -le "$TYPED_TOTAL_MAX" ] ||
    complain "typed: $total instructions in all (budget $TYPED_TOTAL_MAX)"

echo "codegen: driver slot typed ${typed_slots:-?} raw ${raw_slot:-?}; typed $total instructions" \
    "($before before the driver call), raw $raw_total"
if [ "$fail" -ne 0 ]; then
    echo "--- typed (normalised)" >&2
    cat "$out/typed.s" >&2
    echo "--- raw (normalised)" >&2
    cat "$out/raw.s" >&2
    exit 1
fi

#!/usr/bin/env bash
# Regenerates the marked tables of benches/README.md from one run of every
# bench, so that no figure there is copied by hand.
#
#   benches/report.sh           run `cargo bench -p cuda-endpoints-benches`
#                               (needs Valgrind and gungraun-runner 0.20.0 on
#                               PATH), keep its output under
#                               target/bench-report/, then rewrite the tables
#   benches/report.sh LOG       rewrite the tables from a saved output (one
#                               this script wrote: it starts with the run's
#                               `# report:` lines)
#   benches/report.sh --bench bring_up [LOG]
#                               the same for the bring-up bench alone: runs
#                               only it (or reads LOG) and rewrites only its
#                               tables (bring_up, bring_up_fit) and its run
#                               line (bring_up_run); it needs no Valgrind
#   benches/report.sh --gpu LOG [LOG...]
#                               the GPU tables (gpu: bandwidth and small puts,
#                               typed against raw) and their run line
#                               (gpu_run) from a saved output of
#                               benches/gpu_copy.rs on the GPU machine
#                               (`scripts/gpu-suite.sh bench` writes one, with
#                               its `# report:` lines), the first LOG; with
#                               several (`bench REPS RUNS` writes them), the
#                               table across the runs too (gpu_runs: each
#                               ratio's median over the runs, with their
#                               least and greatest); nothing is run
#
# Only the text between `<!-- report:NAME -->` and `<!-- /report:NAME -->`
# is rewritten; the prose around it is written by hand and names the commit
# it was read off. Nothing is written unless every table was found in the
# output. Run from anywhere in the repository; the machine should be idle
# (the load average before and after the run goes into the README).
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
readme=$root/benches/README.md

only=
gpu_logs=()
if [[ ${1:-} == --gpu ]]; then
    [[ $# -ge 2 ]] || { echo "benches/report.sh: --gpu takes the saved output of gpu_copy, one file a run" >&2; exit 2; }
    only=gpu
    shift
    for f in "$@"; do
        [[ -f $f ]] || { echo "benches/report.sh: --gpu: no file $f" >&2; exit 2; }
    done
    # One file a run: the same run twice would count twice.
    dup=$(for f in "$@"; do realpath "$f"; done | sort | uniq -d | head -n 1)
    [[ -z $dup ]] || { echo "benches/report.sh: --gpu: $dup given twice (one file a run)" >&2; exit 2; }
    gpu_logs=("$@")
    set -- "$1"
elif [[ ${1:-} == --bench ]]; then
    [[ ${2:-} == bring_up ]] || { echo "benches/report.sh: --bench takes bring_up" >&2; exit 2; }
    only=bring_up
    shift 2
fi

if [[ $# -ge 1 ]]; then
    log=$1
else
    mkdir -p "$root/target/bench-report"
    commit=$(git -C "$root" rev-parse --short HEAD)
    git -C "$root" diff --quiet HEAD -- . || commit="$commit (with uncommitted changes)"
    log=$root/target/bench-report/bench-$(date -u +%Y%m%dT%H%M%SZ).log
    {
        echo "# report: date=$(date -u +%F)"
        echo "# report: commit=$commit"
        echo "# report: rustc=$(rustc --version | cut -d' ' -f2)"
        echo "# report: arch=$(uname -m)"
        echo "# report: cores=$(nproc)"
        echo "# report: valgrind=$(valgrind --version 2>/dev/null | sed 's/^valgrind-//' || echo none)"
        echo "# report: gungraun=$(gungraun-runner --version 2>/dev/null | awk '{print $NF}' || echo none)"
        echo "# report: load_before=$(uptime | sed 's/.*load average: //')"
    } > "$log"
    echo "benches/report.sh: running every bench, output in $log" >&2
    (cd "$root" && GUNGRAUN_COLOR=never CARGO_TERM_COLOR=never \
        cargo bench -p cuda-endpoints-benches ${only:+--bench "$only"}) 2>&1 | tee -a "$log"
    echo "# report: load_after=$(uptime | sed 's/.*load average: //')" >> "$log"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The GPU run (benches/gpu_copy.rs): its own rows, its own sections.
gpu_tables() {
    sed 's/\x1b\[[0-9;]*m//g' "$log" | awk -v out="$out" -v nlogs="${#gpu_logs[@]}" '
function emit(name, text,   file) { file = out "/" name; printf "%s", text > file; close(file) }
function range(r) { gsub(/[()]/, "", r); sub(/-/, "–", r); return r }
function commas(x,   s, r) { s = sprintf("%d", x); r = ""; while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) } return s r }
/^# report: / { sub(/^# report: /, ""); k = $0; sub(/=.*/, "", k); v = $0; sub(/^[^=]*=/, "", v); META[k] = v; next }
/^context: Context::auto\(\)/ { ctx = $0; sub(/^context: Context::auto\(\), /, "", ctx); sub(/Some\(/, "", ctx); sub(/\), copy path/, ", copy path", ctx); sub(/^driver /, "cuDriverGetVersion ", ctx); next }
/^typed batch of [0-9]+ put\(s\) reaches the driver as:/ { n = $4; v = $0; sub(/.*as: /, "", v); CALLS[n] = v; next }
/^== bandwidth:/ { sec = "bw"; reps = $0; sub(/.*median of /, "", reps); sub(/,.*/, "", reps); next }
/^== small puts: a batch/ { sec = "small"; next }
/^== small puts: the typed batch/ { sec = "over"; next }
/^==/ { sec = ""; next }
sec == "bw" && /^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ / { BW[++nbw] = $0; next }
sec == "small" && /^ *[0-9]+ +(typed|raw_loop|raw_batch|route) / {
    k = $1 SUBSEP $2; HAVE[k] = 1; OPS[$1] = 1
    E[k] = $3; ER[k] = range($4); W[k] = $5; WR[k] = range($6); EQ[k] = $7; WQ[k] = $8; next
}
sec == "over" && /^ *[0-9]+ +-?[0-9.]+ / { OB[$1] = $2; OP[$1] = $3; BB[$1] = $4; BP[$1] = $5; next }
END {
    if (nbw == 0) missing = missing " bandwidth"
    t = "| bytes | typed GB/s | raw GB/s | typed / raw | typed µs (min–max) | raw µs (min–max) | through a route / raw | route µs (min–max) |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    for (i = 1; i <= nbw; i++) {
        split(BW[i], c, " +"); o = (c[1] == "" ? 1 : 0)
        if (c[9+o] == "") missing = missing " route-bandwidth"
        t = t sprintf("| %s | %s | %s | %s | %s (%s) | %s (%s) | %s | %s (%s) |\n", commas(c[1+o]), c[2+o], c[3+o], c[4+o], c[5+o], range(c[6+o]), c[7+o], range(c[8+o]), c[9+o], c[10+o], range(c[11+o]))
    }
    t = t "\n| puts of 64 B | typed enqueue µs (min–max) | raw `cuMemcpyAsync` loop | raw `cuMemcpyBatchAsync` | typed / loop | typed / batch call | typed + wait | loop + sync | batch call + sync | typed over the loop, ns per batch | … per put |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    nops = 0
    split("1 64 1024", ops, " ")
    for (i = 1; i <= 3; i++) {
        n = ops[i]
        if (!((n SUBSEP "typed") in HAVE) || !((n SUBSEP "raw_loop") in HAVE)) { missing = missing " small@" n; continue }
        ty = n SUBSEP "typed"; lo = n SUBSEP "raw_loop"; ba = n SUBSEP "raw_batch"
        hb = (ba in HAVE)
        t = t sprintf("| %s | %s (%s) | %s (%s) | %s | %.3f | %s | %s | %s | %s | %s | %s |\n", commas(n), E[ty], ER[ty], E[lo], ER[lo], \
            hb ? E[ba] " (" ER[ba] ")" : "—", EQ[ty], hb && E[ba] > 0 ? sprintf("%.3f", E[ty] / E[ba]) : "—", \
            W[ty], W[lo], hb ? W[ba] : "—", (n in OB) ? OB[n] : "—", (n in OP) ? OP[n] : "—")
    }
    # One put through a route (`Stream::route`), against the same raw call.
    ro = 1 SUBSEP "route"; lo = 1 SUBSEP "raw_loop"
    if ((ro in HAVE) && (lo in HAVE)) {
        t = t sprintf("| 1, through a route (`Route::put`) | %s (%s) | %s (%s) | — | %.3f | — | %s | %s | — | — | — |\n", E[ro], ER[ro], E[lo], ER[lo], EQ[ro], W[ro], W[lo])
    } else missing = missing " route@1"
    emit("gpu", t)
    if (!("date" in META)) missing = missing " run"
    calls = ""
    split("1 64", cn, " ")
    for (i = 1; i <= 2; i++) {
        n = cn[i]
        if (!(n in CALLS)) { missing = missing " calls@" n; continue }
        calls = calls sprintf("%sa typed batch of %s put%s reached the driver as %s", calls == "" ? "" : "; ", n, n == 1 ? "" : "s", CALLS[n])
    }
    which = nlogs > 1 ? sprintf("The two GPU tables are from the first of %d `gpu_copy` runs, the table after them from all %d", nlogs, nlogs) : "Every figure of the GPU tables is from one `gpu_copy` run"
    emit("gpu_run", sprintf("%s (`scripts/gpu-suite.sh bench`, read by `benches/report.sh --gpu`): %s, commit `%s`, %s, %s, medians of %s interleaved repetitions; %s (counted on a traced context, untimed).\n", \
        which, META["date"], META["commit"], META["gpu"], ctx, reps, calls))
    if (missing != "") { print "benches/report.sh: not in the GPU output:" missing > "/dev/stderr"; exit 1 }
}
'
}

# The GPU runs side by side (several `gpu_copy` processes): per row, the
# median of the runs' ratios, and their least and greatest.
gpu_runs_table() {
    for f in "${gpu_logs[@]}"; do
        echo "# file"
        sed 's/\x1b\[[0-9;]*m//g' "$f"
    done | awk -v out="$out" '
function emit(name, text,   file) { file = out "/" name; printf "%s", text > file; close(file) }
function commas(x,   s, r) { s = sprintf("%d", x); r = ""; while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) } return s r }
function med(key,   n, i, j, t, v) {
    n = CNT[key]
    for (i = 1; i <= n; i++) v[i] = VAL[key, i]
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    LO = v[1]; HI = v[n]
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function add(key, x) { CNT[key]++; VAL[key, CNT[key]] = x; if (!(key in SEEN)) { SEEN[key] = 1; ORDER[++NK] = key } }
/^# file$/ { runs++; sec = ""; next }
/^# report: commit=/ { c = $0; sub(/.*=/, "", c); COMMITS[c] = 1; next }
/^# report: date=/ { d = $0; sub(/.*=/, "", d); DATES[d] = 1; next }
/^== bandwidth:/ { sec = "bw"; next }
/^== small puts: a batch/ { sec = "small"; next }
/^== small puts: the typed batch/ { sec = "over"; next }
/^== small puts end to end/ { sec = "e2e"; next }
/^==/ { sec = ""; next }
sec == "e2e" && /^ *[0-9]+ +typed / { add("e2e " $1, $7); next }
sec == "bw" && /^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ / { add("bw " $1, $4); if ($9 != "") add("rbw " $1, $9); next }
sec == "small" && /^ *[0-9]+ +typed / { add("enq " $1, $7); add("wait " $1, $8); next }
sec == "small" && /^ *1 +route / { add("renq 1", $7); add("rwait 1", $8); next }
sec == "over" && /^ *[0-9]+ +-?[0-9.]+ / { add("ns " $1, $2); next }
/^cuCtxGetCurrent: [0-9.]+ ns per call/ { add("ctx 0", $2); next }
END {
    if (runs < 2) { print "benches/report.sh: --gpu: the table across runs needs two runs or more" > "/dev/stderr"; exit 1 }
    t = sprintf("Across %d `gpu_copy` processes run one after another (the median of each run’s ratio, then the least and the greatest run):\n\n", runs)
    t = t "| measure | median of the runs | least run | greatest run |\n| --- | ---: | ---: | ---: |\n"
    for (i = 1; i <= NK; i++) {
        k = ORDER[i]; split(k, p, " ")
        if (CNT[k] != runs) { missing = missing " " k; continue }
        m = med(k)
        if (p[1] == "bw") t = t sprintf("| single put of %s B, typed / raw bandwidth | %.3f | %.3f | %.3f |\n", commas(p[2]), m, LO, HI)
        else if (p[1] == "enq") t = t sprintf("| %s put%s of 64 B, typed enqueue / raw `cuMemcpyAsync` loop | %.3f | %.3f | %.3f |\n", commas(p[2]), p[2] == 1 ? "" : "s", m, LO, HI)
        else if (p[1] == "wait") t = t sprintf("| %s put%s of 64 B, with the wait | %.3f | %.3f | %.3f |\n", commas(p[2]), p[2] == 1 ? "" : "s", m, LO, HI)
        else if (p[1] == "rbw") t = t sprintf("| single put of %s B through a route, route / raw bandwidth | %.3f | %.3f | %.3f |\n", commas(p[2]), m, LO, HI)
        else if (p[1] == "renq") t = t sprintf("| one put of 64 B through a route (`Route::put`), enqueue / raw `cuMemcpyAsync` | %.3f | %.3f | %.3f |\n", m, LO, HI)
        else if (p[1] == "rwait") t = t sprintf("| one put of 64 B through a route, with the wait | %.3f | %.3f | %.3f |\n", m, LO, HI)
        else if (p[1] == "e2e") t = t sprintf("| %s put%s of 64 B laid end to end (grown into one copy), typed enqueue / raw `cuMemcpyAsync` loop | %.3f | %.3f | %.3f |\n", commas(p[2]), p[2] == 1 ? "" : "s", m, LO, HI)
        else if (p[1] == "ns" && p[2] == 1) t = t sprintf("| one put: the typed enqueue over the raw, ns | %d | %d | %d |\n", m, LO, HI)
        else if (p[1] == "ctx") t = t sprintf("| `cuCtxGetCurrent`, ns per call (raw; the backend asked it before each stream call up to `c0c1d8f`, and from `361c3f0` only once the driver refused a stream call for want of a context) | %.1f | %.1f | %.1f |\n", m, LO, HI)
    }
    nc = 0; for (c in COMMITS) { nc++; cm = c }
    if (nc != 1) missing = missing " one-commit"
    emit("gpu_runs", t)
    if (missing != "") { print "benches/report.sh: --gpu: not in every run:" missing > "/dev/stderr"; exit 1 }
}
'
}

if [[ $only == gpu ]]; then
    gpu_tables
    if [[ ${#gpu_logs[@]} -gt 1 ]]; then
        gpu_runs_table
    else
        # No table across runs from one run: the one there before goes, so
        # that no figure of another run stays beside this one's.
        echo "One run only (\`benches/report.sh --gpu\` was given one LOG): no table across processes; \`scripts/gpu-suite.sh bench REPS RUNS\` makes several." > "$out/gpu_runs"
    fi
else
# Strip colours, then read the figures each bench prints. gungraun prints a
# header `file::group::function id:setup(args)` and, under it,
# `Instructions:   N|OLD   (change)`; readiness_heap, bring_up and
# lifecycle print their own rows.
sed 's/\x1b\[[0-9;]*m//g' "$log" | awk -v out="$out" -v only="$only" '
function commas(x,   s, neg, r) {
    s = sprintf("%d", x); neg = ""; r = ""
    if (s ~ /^-/) { neg = "-"; s = substr(s, 2) }
    while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
    return neg s r
}
function round(x) { return int(x + 0.5) }
function ratio(a, b) { if (b == 0) return "—"; r = a / b; return (r >= 2 ? sprintf("%.1f", r) : sprintf("%.2f", r)) "×" }
function num(x) { return (x == int(x) ? commas(x) : sprintf("%.2f", x)) }
function lin(b) { return (b < 0 ? "− " num(-b) : "+ " num(b)) }
function signed(x) { return (x >= 0 ? "+" : "") commas(x) }
function dur(s,   v, u) {
    # A Rust `{:.2?}` Duration: "191.23µs", "1.86ms", "640.00ns", "1.20s".
    v = s; sub(/[a-zµ]+$/, "", v); u = substr(s, length(v) + 1)
    if (u == "ms" || u == "s") return sprintf("%.2f %s", v, u)
    return round(v) " " u
}
function ir(key) { if (!(key in IR)) { missing = missing " " key; return 0 } return IR[key] }
function lines(key, k) { if (!((key, k) in LINES)) { missing = missing " " k ":" key; return 0 } return LINES[key, k] }
function emit(name, text) { f = out "/" name; printf "%s", text > f; close(f) }

/^# report: / { sub(/^# report: /, ""); k = $0; sub(/=.*/, "", k); v = $0; sub(/^[^=]*=/, "", v); META[k] = v; next }

# gungraun: a benchmark header, then its instruction count.
/^[A-Za-z0-9_]+::[A-Za-z0-9_]+::[A-Za-z0-9_]+( |$)/ {
    split($1, p, "::"); cur = p[2] "::" p[3]
    id = $2; arg = ""
    if (match(id, /\([0-9_]+\)/)) { arg = substr(id, RSTART + 1, RLENGTH - 2); gsub(/_/, "", arg) }
    sub(/:.*/, "", id)
    cur = cur (arg != "" ? "@" arg : " " id)
    next
}
/^ *Instructions:/ && cur != "" {
    v = $0; sub(/^ *Instructions: */, "", v); sub(/[|].*/, "", v); gsub(/ /, "", v)
    IR[cur] = v; ramkey = cur; cur = ""; next
}
# The simulated caches of Callgrind: the lines a cold bench read from
# memory, of code (ILmr), data read (DLmr) and data written (DLmw).
/^ *(ILmr|DLmr|DLmw):/ && ramkey != "" {
    k = $1; sub(/:$/, "", k)
    v = $0; sub(/^ *[A-Za-z]+: */, "", v); sub(/[|].*/, "", v); gsub(/ /, "", v)
    LINES[ramkey, k] = v; if (k == "DLmw") ramkey = ""; next
}

# readiness_heap
/^readiness of n endpoints/ { heap = 1; next }
heap && /^ +n +live/ { next }
heap && /^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ *$/ { N[$1] = 1; LIVE[$1] = $2; PEAK[$1] = $3; ALLOC[$1] = $4; NS[$1] = $5; next }
heap { heap = 0 }

# bring_up
/^team bring-up per rank/ { bu = 1; next }
bu && /^(multicast|unicast_peers) +(threads|tcp|tcp-procs) / { BU[++nbu] = $0; next }
bu && /^bring-up/ { next }
bu && /^fitted per rank/ { next }
bu && /^fit +over/ { next }
bu && /^fit +(multicast|unicast_peers) / { FIT[++nfit] = $0; next }
bu { bu = 0 }

# lifecycle
/^typed \/ raw \(same driver/ { wc = "crit"; next }
/^typed \/ raw interleaved/ { wc = "inter"; next }
wc != "" && /^ +lifecycle_(model|null) +typed / {
    g = $1; WC[wc, g] = 1; WT[wc, g] = $3; WR[wc, g] = $6; WL[wc, g] = $9
    WQ[wc, g] = $12; WQL[wc, g] = $14; sub(/x$/, "×", WQ[wc, g]); sub(/x$/, "×", WQL[wc, g]); next
}

END {
    # The run.
    if (!("commit" in META)) missing = missing " run"
    t = sprintf("Every figure of the marked tables is from one `cargo bench -p cuda-endpoints-benches` run: %s, commit `%s`, rustc %s, %s, Valgrind %s, gungraun %s, %s cores; load average before %s, after %s (`uptime`: 1, 5, 15 minutes).\n", \
        META["date"], META["commit"], META["rustc"], META["arch"], META["valgrind"], META["gungraun"], META["cores"], META["load_before"], META["load_after"])
    if (only == "") emit("run", t)
    else t = sprintf("Every figure of the three bring-up sections is from one `cargo bench -p cuda-endpoints-benches --bench bring_up` run (`benches/report.sh --bench bring_up`): %s, commit `%s`, rustc %s, %s, %s cores; load average before %s, after %s (`uptime`: 1, 5, 15 minutes).\n", \
        META["date"], META["commit"], META["rustc"], META["arch"], META["cores"], META["load_before"], META["load_after"])
    emit("bring_up_run", t)

    # Team bring-up (bring_up): TCP first, then threads, as the prose reads.
    if (nbu == 0) missing = missing " bring_up"
    t = "| bring-up | over | ranks (nodes) | rank 0 | slowest rank | messages, rank 0 | messages, other | bytes, rank 0 | bytes, other |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    split("multicast tcp;multicast tcp-procs;multicast threads;unicast_peers tcp;unicast_peers tcp-procs;unicast_peers threads", order, ";")
    for (o = 1; o <= 6; o++) {
        split(order[o], want, " "); first = 1
        for (i = 1; i <= nbu; i++) {
            split(BU[i], fl, " +")
            if (fl[1] != want[1] || fl[2] != want[2]) continue
            pat = (o == 1 || o == 4) && first ? "`team::" fl[1] "`" : ""
            over = first ? (fl[2] == "tcp" ? "TCP, threads" : fl[2] == "tcp-procs" ? "TCP, processes" : "threads") : ""
            t = t sprintf("| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", pat, over, fl[3], fl[4], dur(fl[5]), dur(fl[6]), commas(fl[7]), commas(fl[8]), commas(fl[9]), commas(fl[10]))
            first = 0
        }
    }
    emit("bring_up", t)

    # The lines fitted through the bring-up cases.
    if (nfit == 0) missing = missing " bring_up_fit"
    t = "| bring-up | over | messages, rank 0 | messages, other | bytes, rank 0 | bytes, other | slowest rank | R² traffic | R² time |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    for (i = 1; i <= nfit; i++) {
        split(FIT[i], fq, " +")
        # fit PATTERN OVER m0a m0b moa mob b0a b0b boa bob ta tb r2 r2t
        over = fq[3] == "tcp" ? "TCP, threads" : fq[3] == "tcp-procs" ? "TCP, processes" : "threads"
        ta = fq[12]; sub(/us$/, "", ta); tb = fq[13]; sub(/us$/, "", tb)
        t = t sprintf("| `team::%s` | %s | %s n %s | %s n %s | %s n %s | %s n %s | %.2f ms n %s %.0f ms | %s | %s |\n", fq[2], over, \
            num(fq[4]), lin(fq[5]), num(fq[6]), lin(fq[7]), num(fq[8]), lin(fq[9]), num(fq[10]), lin(fq[11]), ta / 1000, (tb < 0 ? "−" : "+"), (tb < 0 ? -tb : tb) / 1000, fq[14], fq[15])
    }
    emit("bring_up_fit", t)
    if (only != "") {
        if (missing != "") { print "benches/report.sh: not in the output:" missing > "/dev/stderr"; exit 1 }
        exit 0
    }

    # Per transition (group transitions, Null).
    t = "| transition (typed vs raw) | typed | raw | typed − raw |\n| --- | ---: | ---: | ---: |\n"
    n["reserve"] = "`ctx.reserve_one()` vs `id_reserve(1)`"
    rs = ir("transitions::reserve_one_typed null"); rr = ir("transitions::reserve_one_raw null")
    t = t sprintf("| %s | %s | %s | %s |\n", n["reserve"], commas(rs), commas(rr), signed(rs - rr))
    x = ir("transitions::reserve_one_no_spare_typed null")
    t = t sprintf("| … with no spare range (several endpoints alive) | %s | %s | %s |\n", commas(x), commas(rr), signed(x - rr))
    ct = ir("transitions::create_typed null"); cr = ir("transitions::create_raw null"); cl = ir("transitions::create_raw_with_limits null")
    t = t sprintf("| `create(Spec::unicast(..))` vs `create` | %s | %s (%s with `get_limits`) | %s (%s) |\n", commas(ct), commas(cr), commas(cl), signed(ct - cr), signed(ct - cl))
    wt = ir("transitions::wait_typed null"); wr = ir("transitions::wait_raw null")
    t = t sprintf("| `wait(timeout)`, ready at the first query, vs `query` | %s | %s | %s (%s) |\n", commas(wt), commas(wr), signed(wt - wr), ratio(wt, wr))
    wa = ir("transitions::wait_all_one_typed null")
    t = t sprintf("| `wait_all(vec![ep], ..)` | %s | %s | %s (%s `wait`) |\n", commas(wa), commas(wr), signed(wa - wr), ratio(wa, wt))
    split("bind:`ep.bind(dev, 0, &mem)` vs `bind_mem`;unbind:`binding.unbind()` vs `unbind`;destroy:`ep.destroy()` vs `destroy`;release:`ep.release()` vs `id_release`", rows, ";")
    for (i = 1; i <= 4; i++) {
        k = rows[i]; lbl = k; sub(/^[a-z]+:/, "", lbl); sub(/:.*/, "", k)
        a = ir("transitions::" k "_typed null"); b = ir("transitions::" k "_raw null")
        t = t sprintf("| %s | %s | %s | %s |\n", lbl, commas(a), commas(b), signed(a - b))
    }
    x = ir("transitions::release_spare_full_typed null"); b = ir("transitions::release_raw null")
    t = t sprintf("| … with the spare slot already taken (frees the older one) | %s | %s | %s |\n", commas(x), commas(b), signed(x - b))
    emit("transitions", t)

    # Whole lifecycle (group lifecycle).
    t = "| driver | typed | raw | raw + `get_limits` | typed / raw | typed / (raw + `get_limits`) |\n| --- | ---: | ---: | ---: | ---: | ---: |\n"
    split("null:`Null`;model:reference model (4-GPU node)", drv, ";")
    for (i = 1; i <= 2; i++) {
        k = drv[i]; lbl = k; sub(/^[a-z]+:/, "", lbl); sub(/:.*/, "", k)
        a = ir("lifecycle::bench_typed " k); b = ir("lifecycle::bench_raw " k); c = ir("lifecycle::bench_raw_with_limits " k)
        t = t sprintf("| %s | %s | %s | %s | %s | %s |\n", lbl, commas(a), commas(b), commas(c), ratio(a, b), ratio(a, c))
    }
    emit("lifecycle", t)

    # Copy batch (bench copy_batch, Null): instructions per op, typed vs raw.
    t = "| ops per batch | typed, `put` per op | typed, one `put_strided` | raw | per op: `put` | `put_strided` | raw | `put` / raw | `put_strided` / raw |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    split("1 64 1024", cn, " ")
    for (i = 1; i <= 3; i++) {
        k = cn[i]; a = ir("copy_batch::copy_batch_typed@" k); sd = ir("copy_batch::copy_batch_strided@" k); b = ir("copy_batch::copy_batch_raw@" k)
        t = t sprintf("| %s | %s | %s | %s | %.1f | %.1f | %.1f | %s | %s |\n", commas(k), commas(a), commas(sd), commas(b), a / k, sd / k, b / k, ratio(a, b), ratio(sd, b))
    }
    emit("copy_batch", t)

    # The wait (bench copy_batch, Null): InFlight::wait vs raw stream_synchronize.
    t = "| puts in the batch | typed `InFlight::wait` | raw `stream_synchronize` | typed − raw |\n| ---: | ---: | ---: | ---: |\n"
    for (i = 1; i <= 3; i++) {
        k = cn[i]; a = ir("copy_batch::copy_batch_wait@" k); b = ir("copy_batch::copy_batch_sync@" k)
        t = t sprintf("| %s | %s | %s | %s |\n", commas(k), commas(a), commas(b), signed(a - b))
    }
    emit("copy_wait", t)

    # The portable path (bench copy_portable, Null): typed on CopyPath::Portable vs raw memcpy_batch_async.
    t = "| puts per batch | typed | raw `memcpy_batch_async` | typed − raw | per op: typed | raw | (typed − raw) per op |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    for (i = 1; i <= 3; i++) {
        k = cn[i]; a = ir("copy_portable::copy_portable_typed@" k); b = ir("copy_portable::copy_portable_raw@" k)
        t = t sprintf("| %s | %s | %s | %s | %.1f | %.1f | %.1f |\n", commas(k), commas(a), commas(b), signed(a - b), a / k, b / k, (a - b) / k)
    }
    emit("copy_portable", t)

    # One put through a route (Stream::route, benches copy_batch and
    # copy_portable, Null): against the batch of that put and raw. (Not
    # r: ratio() writes the global r.)
    t = "| one put of 64 B | a `CopyBatch` of it | `Route::put` | raw | batch / raw | route / raw | route − raw |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    a = ir("copy_batch::copy_batch_typed@1"); rt = ir("copy_batch::copy_batch_route@1"); b = ir("copy_batch::copy_batch_raw@1")
    t = t sprintf("| fabric path (`cuFabricCpyBatchAsync`) | %s | %s | %s | %s | %s | %s |\n", commas(a), commas(rt), commas(b), ratio(a, b), ratio(rt, b), signed(rt - b))
    a = ir("copy_portable::copy_portable_typed@1"); rt = ir("copy_portable::copy_portable_route@1"); b = ir("copy_portable::copy_portable_raw@1")
    t = t sprintf("| portable path (`cuMemcpyAsync`) | %s | %s | %s | %s | %s | %s |\n", commas(a), commas(rt), commas(b), ratio(a, b), ratio(rt, b), signed(rt - b))
    emit("copy_route", t)

    # One put after the caches were emptied (bench copy_cold, Fresh: Null
    # with a fresh address per reservation): instructions and the lines
    # read from memory, code apart from data.
    t = "| one put, caches emptied first | typed: instructions | lines of code | of data (read + written) | raw: instructions | lines of code | of data | typed − raw: lines of code |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    split("typed fabric:fabric path (`cuFabricCpyBatchAsync`);typed portable:portable path (`cuMemcpyAsync`, as on the H200);route fabric:fabric path, through a route (`Route::put`);route portable:portable path, through a route", cc, ";")
    for (i = 1; i <= 4; i++) {
        k = cc[i]; lbl = k; sub(/^[a-z_ ]+:/, "", lbl); sub(/:.*/, "", k); split(k, kw, " ")
        ty = "copy_cold::copy_cold_" kw[1] " " kw[2]; rw = "copy_cold::copy_cold_raw " kw[2]
        a = ir(ty); b = ir(rw)
        ca = lines(ty, "ILmr"); cb = lines(rw, "ILmr")
        da = lines(ty, "DLmr") + lines(ty, "DLmw"); db = lines(rw, "DLmr") + lines(rw, "DLmw")
        t = t sprintf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", lbl, commas(a), commas(ca), commas(da), commas(b), commas(cb), commas(db), signed(ca - cb))
    }
    emit("copy_cold", t)

    # Wall clock (bench lifecycle).
    t = "| measure | driver | typed | raw | raw + `get_limits` | typed / raw | typed / (raw + `get_limits`) |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n"
    split("crit:criterion'"'"'s estimates;inter:medians of 1,000 interleaved rounds", ms, ";")
    for (i = 1; i <= 2; i++) {
        m = ms[i]; lbl = m; sub(/^[a-z]+:/, "", lbl); sub(/:.*/, "", m)
        split("lifecycle_model:reference model;lifecycle_null:`Null`", gs, ";")
        for (j = 1; j <= 2; j++) {
            g = gs[j]; gl = g; sub(/^[a-z_]+:/, "", gl); sub(/:.*/, "", g)
            if (!((m, g) in WC)) { missing = missing " wall-clock:" m ":" g; continue }
            t = t sprintf("| %s | %s | %s ns | %s ns | %s ns | %s | %s |\n", lbl, gl, round(WT[m, g]), round(WR[m, g]), round(WL[m, g]), WQ[m, g], WQL[m, g])
        }
    }
    emit("wall_clock", t)

    # Readiness at scale (readiness, readiness_heap).
    t = "| endpoints | `wait_all` | per endpoint | bring-up typed | per endpoint | bring-up raw | per endpoint | heap live / peak per endpoint | allocations | ns per endpoint |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    split("1 10 100 1000 10000 100000", ns_, " ")
    for (i = 1; i <= 6; i++) {
        k = ns_[i]
        a = ir("readiness::wait_all_n@" k); b = ir("readiness::bring_up_n@" k); c = ir("readiness::bring_up_raw_n@" k)
        if (!(k in N)) missing = missing " readiness_heap@" k
        t = t sprintf("| %s | %s | %s | %s | %s | %s | %s | %s / %s B | %s | %s |\n", commas(k), commas(a), commas(round(a / k)), commas(b), commas(round(b / k)), commas(c), commas(round(c / k)), round(LIVE[k]), round(PEAK[k]), ALLOC[k], round(NS[k]))
    }
    emit("readiness", t)


    if (missing != "") { print "benches/report.sh: not in the output:" missing > "/dev/stderr"; exit 1 }
}
'
fi

# Rewrite the marked sections.
awk -v out="$out" '
/^<!-- report:[a-z_]+ -->$/ {
    print; name = $0; sub(/^<!-- report:/, "", name); sub(/ -->$/, "", name)
    f = out "/" name
    # A section this run did not produce (--bench) keeps its text.
    if ((getline line < f) > 0) {
        print line
        while ((getline line < f) > 0) print line
        close(f); skip = 1
    }
    next
}
/^<!-- \/report:[a-z_]+ -->$/ { skip = 0 }
!skip { print }
' "$readme" > "$out/README.md"
mv "$out/README.md" "$readme"
echo "benches/report.sh: rewrote the marked tables of $readme from $log" >&2

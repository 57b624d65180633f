#!/usr/bin/env bash
# Re-measure the figures of docs/PERFORMANCE.md's table on this machine, side by side in
# one run, and print them as that table (figure | value | command | load | machine |
# date) in Markdown on standard output. Progress goes to standard error; every command's
# raw output is kept under $PERF_OUT (default: a fresh temporary folder, named at the end).
#
#   scripts/perf-table.sh [--quick] [--no-build]
#
#   --quick     a subset, about 3 to 5 minutes on a quiet 2-core machine after the build:
#               the incident run, the default suite (and its bug-matrix and isolation
#               rows), the mixed-faults sweeps at --jobs 2 and 1, the handoff checks
#               (DFS and BFS, against 2PC, peak RSS), `kvsim audit` on a 100 MB trace.
#   (default)   every row. By the figures in docs/PERFORMANCE-LOG.md, about 35 to 50
#               minutes on a quiet 2-core machine: the full bug matrix (about 1 to 7
#               minutes), the 16 GB audit through a pipe (about 4 to 6 minutes, bound by
#               the trace's writer), the loom models (about 2 minutes, plus a cold build
#               of target-loom of 2 to 3 minutes), `cargo test --workspace` (its debug
#               build, then the tests), the criterion benches (about 2 minutes), the
#               serve/HTTP benches (about 5 minutes, 2 of them the real router's
#               48 ms streams), the KV path (about 2 minutes) and the real topology's
#               model check (about 3 minutes); the rest is seconds.
#   --only "S..."  run just these sections of the full run (names as in the list at the
#               end: incident suite sweeps check_rows rss_row sweep_10k other_sweeps
#               check_all two_by_two audit_file audit_pipe sweep_audit kv_path serve_loopback
#               http_front invariants_cost bugs_full ttc stalls criterion loom tests), e.g. to
#               finish a run that was cut.
#   --no-build  use the binaries already built (target/release/kvsim and, in the full
#               run, the test, bench and loom builds are still made by cargo as needed).
#
# Environment: PERF_OUT (where raw outputs go), PY (python with sglang_router for the
# real-router rows, as scripts/bench-http.sh), KV (the kvsim binary, default
# target/release/kvsim; scripts/bench-serve.sh always runs that one). Nothing here
# asserts a time; a row whose
# figure cannot be read from its command's output says `n/a (why)` and the run goes on.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
BUILD=1
ONLY=
while [ $# -gt 0 ]; do
    a=$1
    shift
    case $a in
        --quick) QUICK=1 ;;
        --no-build) BUILD=0 ;;
        --only) ONLY=${1:?--only needs a list of sections}; shift ;;
        -h | --help) sed -n '2,33p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a (see --help)" >&2; exit 2 ;;
    esac
done

KV=${KV:-target/release/kvsim}
OUT=${PERF_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/perf-table.XXXXXX")}
mkdir -p "$OUT"
MACHINE="$(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)"
ROWS=()
LOAD=-
RC=0
SPIDS=()
trap 'for p in ${SPIDS[@]+"${SPIDS[@]}"}; do kill "$p" 2>/dev/null || true; done' EXIT

say() { printf '%s\n' "$*" >&2; }
# either X A B: A when X is not empty, else B.
either() { if [ -n "$1" ]; then printf '%s' "$2"; else printf '%s' "$3"; fi; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# Markdown cell: a `|` in a value or command would end the cell.
cell() { printf '%s' "$1" | sed 's/|/\\|/g'; }

# add_row FIGURE VALUE COMMAND: one row of the table, with the load read before the
# command (LOAD, set by `run`), this machine and today's UTC date.
add_row() {
    local v=${2:-}
    [ -n "$v" ] || v="n/a (no figure read)"
    ROWS+=("| $(cell "$1") | $(cell "$v") | \`$(cell "$3")\` | $LOAD | $MACHINE | $(date -u +%F) |")
    say "  row: $1 = $v"
}

# run NAME COMMAND...: run with the 1-minute load read just before it; stdout to
# $OUT/NAME.out, stderr to $OUT/NAME.err, "wall user sys maxrss_kib" to $OUT/NAME.time;
# its exit status in RC. Never fails.
run() {
    local name=$1
    shift
    LOAD=$(load1)
    RC=0
    say "-- $name: $* (load $LOAD)"
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -o "$OUT/$name.time" -f '%e %U %S %M' "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || RC=$?
    else
        local t0 t1
        t0=$(date +%s.%N)
        "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || RC=$?
        t1=$(date +%s.%N)
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f - - -\n", b - a }' >"$OUT/$name.time"
    fi
}
# Fields of the last line of NAME.time (GNU time writes "Command exited with non-zero
# status N" first when the command failed).
timef() { tail -n1 "$OUT/$1.time" 2>/dev/null | awk -v f="$2" '{ print $f }'; }
wall() { timef "$1" 1; }
cpu() { tail -n1 "$OUT/$1.time" 2>/dev/null | awk '$2 != "-" { printf "%.2f", $2 + $3 }'; }
rss_mib() { timef "$1" 4 | awk '$1 != "-" && $1 != "" { printf "%.0f", $1 / 1024 }'; }
# na NAME WHAT: the value of a row whose figure could not be read.
na() { echo "n/a ($2 not found in the output; exit $RC; $OUT/$1.out)"; }
# median of numbers on stdin (the upper middle of an even count, as kvsim's --repeat).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int(NR / 2) + 1] }'; }

# The sweep's last line: "speed N seeds/s, N events/s, simulated time Nx faster than
# real time (N.NNs wall, N jobs)" -> "seeds/s events/s ratio wall".
sweep_speed() {
    sed -nE 's/^ *speed +([0-9]+) seeds\/s, ([0-9]+) events\/s, simulated time ([0-9]+)x faster than real time \(([0-9.]+)s wall.*/\1 \2 \3 \4/p' "$OUT/$1.out" | tail -n1
}

build() {
    say "-- building (release kvsim$([ $QUICK = 1 ] || echo ', benches, tests, loom'))"
    cargo build --release --bin kvsim >&2
    if [ $QUICK = 0 ]; then
        cargo bench -p kvsim-engine --no-run >&2
    fi
}

# ---------------------------------------------------------------------------- rows

incident() {
    local c="kvsim run scenarios/glm53-incident.toml" w
    run incident "$KV" run scenarios/glm53-incident.toml
    w=$(sed -nE 's/^\(([0-9.]+)s wall\)$/\1/p' "$OUT/incident.out")
    local ev
    ev=$(sed -nE 's/^([0-9]+ events, .* simulated)$/\1/p' "$OUT/incident.out" | head -n1)
    add_row "full-scale incident scenario, defended engine" \
        "$(either "$w" "$w s wall ($ev)" "$(na incident '"(Ns wall)"')")" "$c"
}

suite() {
    run suite "$KV" suite --quiet
    local w r res
    w=$(wall suite)
    r=$(rss_mib suite)
    res=$(sed -nE 's/^([0-9]+ passed, [0-9]+ failed)$/\1/p' "$OUT/suite.out")
    add_row "default suite, wall time" \
        "$(either "$res" "$w s wall, $res, peak RSS $r MiB" "$(na suite '"N passed, M failed"')")" \
        "cargo run --release (target/release/kvsim suite --quiet)"
    # Rows of the suite's own summary: "LABEL  PASS  12.34s  observed".
    local m iso
    m=$(sed -nE 's/^bug matrix \(quick\).*  (PASS|FAIL) +([0-9.]+)s  (.*)$/\2 s (\1; \3)/p' "$OUT/suite.out")
    add_row "bug matrix, quick pass (the suite's row)" "${m:-$(na suite 'the "bug matrix (quick)" row')}" \
        "kvsim suite --quiet (row \"bug matrix (quick)\")"
    iso=$(sed -nE 's/^defense isolation.*  (PASS|FAIL) +([0-9.]+)s  ([^;]*);.*$/\2 s (\1; \3)/p' "$OUT/suite.out")
    add_row "defense isolation matrix, 5 seeds a cell (the suite's row)" \
        "${iso:-$(na suite 'the "defense isolation" row')}" "kvsim suite --quiet (row \"defense isolation\")"
}

sweeps() {
    local c2="kvsim sweep scenarios/mixed-faults.toml --seeds 0..4000 --jobs 2 --quiet" i s
    local seeds="" ratios="" l2
    for i in 1 2 3; do
        run "sweep-j2-$i" "$KV" sweep scenarios/mixed-faults.toml --seeds 0..4000 --jobs 2 --quiet
        [ "$i" = 1 ] && l2=$LOAD
        s=$(sweep_speed "sweep-j2-$i")
        if [ -n "$s" ]; then
            seeds="$seeds $(echo "$s" | cut -d' ' -f1)"
            ratios="$ratios $(echo "$s" | cut -d' ' -f3)"
        fi
    done
    LOAD=$l2
    local ms mr
    ms=$(echo "$seeds" | tr ' ' '\n' | sed '/^$/d' | median)
    mr=$(echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | median)
    add_row "sweep mixed-faults, --jobs 2: seeds/s (median of 3)" \
        "$(either "$ms" "$ms seeds/s (runs:$seeds)" "$(na sweep-j2-1 'the speed line')")" "$c2"
    add_row "sweep mixed-faults, --jobs 2: simulated time over wall time (median of 3; goal 50,000x)" \
        "$(either "$mr" "${mr}x (runs:$ratios)" "$(na sweep-j2-1 'the speed line')")" "$c2"

    local c1="kvsim sweep scenarios/mixed-faults.toml --seeds 0..2000 --jobs 1 --quiet"
    run sweep-j1 "$KV" sweep scenarios/mixed-faults.toml --seeds 0..2000 --jobs 1 --quiet
    s=$(sweep_speed sweep-j1)
    local sps eps ratio w
    read -r sps eps ratio w <<<"$s" || true
    add_row "sweep mixed-faults, --jobs 1: seeds/s" \
        "$(either "$s" "$sps seeds/s, $eps events/s ($w s wall)" "$(na sweep-j1 'the speed line')")" "$c1"
    add_row "sweep mixed-faults, --jobs 1: simulated time over wall time" \
        "$(either "$s" "${ratio}x" "$(na sweep-j1 'the speed line')")" "$c1"
}

sweep_10k() {
    local c="kvsim sweep scenarios/mixed-faults.toml --seeds 0..10000 --jobs 2 --quiet" s
    run sweep-10k "$KV" sweep scenarios/mixed-faults.toml --seeds 0..10000 --jobs 2 --quiet
    s=$(sweep_speed sweep-10k)
    local sps eps ratio w
    read -r sps eps ratio w <<<"$s" || true
    add_row "10,000 seeds of mixed-faults, 64 requests each (goal: at most 60 s on 2 cores)" \
        "$(either "$s" "$w s wall, $sps seeds/s, ${ratio}x ($(cpu sweep-10k) s CPU)" "$(na sweep-10k 'the speed line')")" "$c"
}

other_sweeps() {
    local v="" sc s n l0=""
    for sc in abort-storm client-disconnects data-faults disconnect-mid-transfer partition transfer-failures glm53-incident glm53-truncate; do
        n=2000
        case $sc in glm53-*) n=20 ;; esac
        run "sweep-$sc" "$KV" sweep "scenarios/$sc.toml" --seeds "0..$n" --jobs 2 --quiet
        [ -n "$l0" ] || l0=$LOAD
        s=$(sweep_speed "sweep-$sc")
        v="$v${v:+; }$sc ${s%% *}"
        [ -n "$s" ] || v="$v n/a (exit $RC)"
        [ "$n" = 2000 ] || v="$v ($n seeds)"
    done
    LOAD=$l0
    add_row "sweeps of the other scenarios, seeds/s" "$v" \
        "kvsim sweep scenarios/X.toml --seeds 0..2000 --jobs 2 --quiet (glm53-*: --seeds 0..20)"
}

# stalls: every scenario swept with pauses and skewed clocks laid over its faults
# (`--faults`), and one switch the stalls find sooner, side by side.
stalls() {
    local ov=(--faults 'pause = { count = 3, max_ms = 2000 }' --faults clock_skew_permille=300)
    local v="" sc n f
    for sc in abort-storm client-disconnects data-faults disconnect-mid-transfer mixed-faults partition stalls transfer-failures glm53-incident glm53-truncate; do
        n=2000
        case $sc in glm53-*) n=200 ;; esac
        run "stalls-$sc" "$KV" sweep "scenarios/$sc.toml" --seeds "0..$n" --jobs 2 --quiet --allow-expensive "${ov[@]}"
        f=$(sed -nE 's/^ +violations +(.*)/\1/p' "$OUT/stalls-$sc.out" | cut -d';' -f1)
        v="$v${v:+; }$sc ($n seeds): ${f:-n/a (exit $RC)}"
    done
    add_row "every scenario with stalls and skew laid over its faults: violations on the defended engine" "$v" \
        "kvsim sweep scenarios/X.toml --seeds 0..2000 --faults 'pause = { count = 3, max_ms = 2000 }' --faults clock_skew_permille=300 (glm53-*: 0..200)"
    local off=(--faults 'pause = { count = 0, max_ms = 0 }') on off1
    run stalls-ack-on "$KV" sweep scenarios/partition.toml --seeds 0..2000 --jobs 2 --quiet --bugs ack-ignores-generation
    run stalls-ack-off "$KV" sweep scenarios/partition.toml --seeds 0..2000 --jobs 2 --quiet --bugs ack-ignores-generation "${off[@]}"
    on=$(sed -nE 's/^ +violations +([0-9]+) failing seeds.*/\1/p' "$OUT/stalls-ack-on.out")
    off1=$(sed -nE 's/^ +violations +([0-9]+) failing seeds.*/\1/p' "$OUT/stalls-ack-off.out")
    add_row "ack-ignores-generation in partition.toml, 2000 seeds: failing seeds with its pauses against without" \
        "with pauses ${on:-n/a}, without ${off1:-n/a}" \
        "kvsim sweep scenarios/partition.toml --seeds 0..2000 --bugs ack-ignores-generation [--faults 'pause = { count = 0, max_ms = 0 }']"
}

# check_rows NAME LABEL ARGS...: the handoff model against stateright's 2PC, 3 runs.
check_rows() {
    local name=$1 label=$2
    shift 2
    local c="kvsim check --model handoff --threads 1${*:+ $*} --repeat 3 --vs-2pc --quiet"
    run "$name" "$KV" check --model handoff --threads 1 "$@" --repeat 3 --vs-2pc --quiet
    local rate vs states
    rate=$(sed -nE 's/^rate over [0-9]+ runs: median ([0-9]+), best ([0-9]+), worst ([0-9]+) unique states\/s.*/\1 unique states\/s (\3-\2)/p' "$OUT/$name.out")
    vs=$(sed -nE 's/^vs 2pc: .* median ([0-9]+) unique states\/s; this model \/ 2pc, pair by pair: median ([0-9.]+), lowest ([0-9.]+), highest ([0-9.]+)$/\2 (\3-\4); 2PC median \1 unique states\/s/p' "$OUT/$name.out")
    states=$(sed -nE 's/^states: ([0-9]+) generated, ([0-9]+) unique, max depth ([0-9]+); ([0-9.]+) s, .*/\2 unique, \1 generated, max depth \3; \4 s (median run)/p' "$OUT/$name.out")
    add_row "model checker, handoff, $label, 1 thread: unique states/s (median of 3)" \
        "${rate:-$(na "$name" '"rate over 3 runs"')}" "$c"
    add_row "model checker, handoff, $label: ratio to stateright's 2PC example, same run (goal 2.0 in DFS)" \
        "${vs:-$(na "$name" '"vs 2pc"')}" "$c"
    add_row "model checker, handoff, $label, 1 thread: exhaustive check, states and time" \
        "${states:-$(na "$name" '"states:"')}" "$c"
}

# rss_row NAME LABEL ARGS...: one quiet check under /usr/bin/time for its peak RSS.
rss_row() {
    local name=$1 label=$2
    shift 2
    run "$name" "$KV" check --model handoff "$@" --quiet
    local kib u rate
    kib=$(timef "$name" 4)
    u=$(sed -nE 's/^states: [0-9]+ generated, ([0-9]+) unique.*/\1/p' "$OUT/$name.out")
    rate=$(sed -nE 's/^states: .*; ([0-9.]+) s, ([0-9]+) unique states\/s.*/\2 unique states\/s, \1 s/p' "$OUT/$name.out")
    local v=""
    if [ -n "$u" ] && [ -n "$kib" ] && [ "$kib" != "-" ]; then
        v=$(awk -v k="$kib" -v u="$u" -v r="$rate" 'BEGIN { printf "%d KiB (%.0f MiB, %.0f B a unique state); %s", k, k / 1024, k * 1024 / u, r }')
    fi
    add_row "model checker, handoff, $label: peak RSS" "${v:-$(na "$name" 'the state count or /usr/bin/time RSS')}" \
        "/usr/bin/time -v kvsim check --model handoff $* --quiet"
}

check_all() {
    local c="kvsim check --model all --threads 2"
    run check-all "$KV" check --model all --threads 2 --quiet
    local per
    per=$(awk '/^model /{ m = $2 } /^states: /{ for (i = 1; i <= NF; i++) if ($(i + 1) == "s,") t = $i; printf "%s%s %s s", sep, m, t; sep = ", " }' "$OUT/check-all.out")
    add_row "model checker, the four standard models exhausted (goal: each in at most 60 s on 2 cores)" \
        "$(either "$per" "$(wall check-all) s wall ($per), peak RSS $(rss_mib check-all) MiB" "$(na check-all '"states:" lines')")" "$c"
}

# The real topology (issue 39): two-by-two exhausted with the symmetry reduction over
# requests (about 3 minutes; without it, about 15: not run here, docs/PERFORMANCE.md).
two_by_two() {
    local c="kvsim check --model two-by-two --symmetry --threads 2 --quiet"
    run two-by-two "$KV" check --model two-by-two --symmetry --threads 2 --quiet
    local st
    st=$(sed -nE 's/^states: [0-9]+ generated, ([0-9]+) unique, max depth [0-9]+; ([0-9.]+) s, ([0-9]+) unique states\/s.*/\2 s, \1 unique states, \3 unique states\/s/p' "$OUT/two-by-two.out")
    add_row "model checker, the real topology two-by-two (2 prefill, 2 decode, sglang-router, 3 requests; goal: exhausted in under 10 min on 2 cores), with the symmetry reduction over requests" \
        "$(either "$st" "$st; $(cpu two-by-two) CPU s, peak RSS $(rss_mib two-by-two) MiB" "$(na two-by-two '"states:" line')")" "$c"
}

# big_toml REPEAT FILE: glm53-incident with tenant 1's request repeated, 20 ms apart
# (each long request's trace is about 4.5 MB of page lists; 250 make about 1 GB).
big_toml() {
    sed -e "s/^repeat = 2\$/repeat = $1/" -e 's/^every_us = 100$/every_us = 20000/' \
        scenarios/glm53-incident.toml >"$2"
    grep -q "^repeat = $1\$" "$2"
}

# audit_file REPEAT LABEL: write the trace to a file, then audit it.
audit_file() {
    local n=$1 label=$2 name=audit-$1
    if ! big_toml "$n" "$OUT/big-$n.toml"; then
        LOAD=$(load1)
        add_row "kvsim audit, $label" "n/a (scenarios/glm53-incident.toml no longer has 'repeat = 2')" "kvsim audit"
        return
    fi
    run "write-$n" "$KV" run "$OUT/big-$n.toml" --trace-json "$OUT/big-$n.jsonl" --allow-expensive
    run "$name" "$KV" audit "$OUT/big-$n.jsonl"
    local s
    s=$(sed -nE 's/^audit speed: ([0-9.]+) MB in ([0-9.]+) s wall, ([0-9.]+) MB\/s; peak RSS (.*)$/\3 MB\/s (\1 MB in \2 s), peak RSS \4/p' "$OUT/$name.err")
    add_row "kvsim audit, $label: throughput and memory" \
        "$(either "$s" "$s; $(cpu "$name") s CPU" "$(na "$name" '"audit speed" (stderr)')")" \
        "kvsim run BIG.toml --trace-json BIG.jsonl --allow-expensive; kvsim audit BIG.jsonl (BIG: glm53-incident, tenant 1 repeat = $n, every_us = 20000)"
    rm -f "$OUT/big-$n.jsonl"
}

# The 16 GB trace streamed through a named pipe, not kept.
audit_pipe() {
    local n=4000 name=audit-16g
    big_toml "$n" "$OUT/big-$n.toml" || true
    rm -f "$OUT/big16.fifo"
    mkfifo "$OUT/big16.fifo"
    "$KV" run "$OUT/big-$n.toml" --trace-json "$OUT/big16.fifo" --allow-expensive >"$OUT/write-16g.out" 2>&1 &
    local w=$!
    SPIDS+=("$w")
    run "$name" "$KV" audit "$OUT/big16.fifo"
    kill "$w" 2>/dev/null || true
    wait "$w" 2>/dev/null || true
    rm -f "$OUT/big16.fifo"
    local s
    s=$(sed -nE 's/^audit speed: ([0-9.]+) MB in ([0-9.]+) s wall, ([0-9.]+) MB\/s; peak RSS (.*)$/\1 \2 \3 \4/p' "$OUT/$name.err")
    local v=""
    if [ -n "$s" ]; then
        v=$(echo "$s" | awk -v c="$(cpu "$name")" '{ printf "%.0f MB/s per CPU second (%.1f MB, %s s CPU); %s MB/s wall (the pace of the writer); peak RSS %s %s", (c > 0 ? $1 / c : 0), $1, c, $3, $4, $5 }')
    fi
    add_row "kvsim audit, 16 GB trace through a pipe: throughput per core and memory" \
        "${v:-$(na "$name" '"audit speed" (stderr)')}" \
        "mkfifo F; kvsim run BIG16.toml --trace-json F --allow-expensive & kvsim audit F (BIG16: glm53-incident, tenant 1 repeat = 4000, every_us = 20000)"
}

sweep_audit() {
    local i ratios="" l0="" p a
    for i in 1 2 3; do
        run "plain-$i" "$KV" sweep scenarios/mixed-faults.toml --seeds 0..1000 --jobs 1 --quiet
        [ -n "$l0" ] || l0=$LOAD
        run "audited-$i" "$KV" sweep scenarios/mixed-faults.toml --seeds 0..1000 --jobs 1 --audit --quiet
        p=$(cpu "plain-$i")
        a=$(cpu "audited-$i")
        if [ -n "$p" ] && [ -n "$a" ]; then
            ratios="$ratios $(awk -v a="$a" -v p="$p" 'BEGIN { if (p > 0) printf "%.2f", a / p }')"
        fi
    done
    LOAD=$l0
    local m
    m=$(echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | median)
    add_row "sweep --audit over plain sweep, CPU (median of 3 pairs; goal at most 1.5)" \
        "$(either "$m" "$m (pairs:$ratios)" "n/a (no CPU time from /usr/bin/time; $OUT/audited-1.time)")" \
        "kvsim sweep scenarios/mixed-faults.toml --seeds 0..1000 --jobs 1 [--audit] --quiet"
}

kv_path() {
    local p c w name s
    for p in 16 64; do
        for c in 1 4 16 64; do
            if [ "$p" = 16 ]; then w=$((192000 / c)); else w=$((24000 / c)); fi
            name="transfer-$p-$c"
            run "$name" "$KV" bench-transfer --page-size "$p" --chunk "$c" --writes "$w" --repeat 7
            s=$(sed -nE 's/^page size [0-9]+, chunk [0-9]+: transfer path \/ plain TCP copy, run by run: median ([0-9.]+), lowest ([0-9.]+), highest ([0-9.]+); best run \/ best run ([0-9.]+)$/\1 (\2-\3); best run \/ best run \4/p' "$OUT/$name.out")
            local g
            g=$(sed -nE 's/^run [0-9]+\/[0-9]+: .* transfer path ([0-9.]+) GB\/s landed.*/\1/p' "$OUT/$name.out" | median)
            add_row "KV path: transfer path over plain TCP copy, page size $p, chunk $c (goal at least 0.8)" \
                "$(either "$s" "$s; path median $g GB/s" "$(na "$name" 'the median line')")" \
                "kvsim bench-transfer --page-size $p --chunk $c --writes $w --repeat 7"
        done
    done
}

# Lines "LABEL concurrency C: N requests in T s = R req/s, p50 A ms, p99 B ms[, first
# byte p50 X ms p99 Y ms], not 200: [..][; server cpu ...]" -> "LABEL<TAB>C<TAB>R<TAB>A<TAB>B<TAB>X<TAB>Y<TAB>NOTOK".
bench_lines() {
    awk '/concurrency [0-9]+: [0-9]+ requests in/ {
        l = $0; sub(/ *concurrency [0-9]+:.*/, "", l)
        c = $0; sub(/.*concurrency /, "", c); sub(/:.*/, "", c)
        r = $0; sub(/.* = /, "", r); sub(/ req\/s.*/, "", r)
        a = $0; sub(/.*, p50 /, "", a); sub(/ ms.*/, "", a)
        b = $0; sub(/.*, p99 /, "", b); sub(/ ms.*/, "", b)
        x = "-"; y = "-"
        if ($0 ~ /first byte p50/) { x = $0; sub(/.*first byte p50 /, "", x); sub(/ ms.*/, "", x)
            y = $0; sub(/.*first byte p50 [0-9.]+ ms p99 /, "", y); sub(/ ms.*/, "", y) }
        n = $0; sub(/.*not 200: \[/, "", n); sub(/\].*/, "", n)
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l, c, r, a, b, x, y, n }' "$1"
}

# per_c FILE LABEL FORMAT: "C=1: ...; C=8: ...; C=64: ..." of the lines of LABEL, the
# median req/s of its runs and the p50/p99 (or first byte) of the first run.
per_c() {
    local file=$1 label=$2 kind=$3 c v="" r x
    for c in 1 8 64; do
        r=$(bench_lines "$file" | awk -F'\t' -v l="$label" -v c="$c" '$1 == l && $2 == c { print $3 }' | median)
        [ -n "$r" ] || continue
        x=$(bench_lines "$file" | awk -F'\t' -v l="$label" -v c="$c" -v k="$kind" '$1 == l && $2 == c {
            n = ($8 == "" ? "" : ", not 200: " $8)
            if (k == "first") print "first event p50 " $6 " / p99 " $7 " ms" n; else print "p50 " $4 " / p99 " $5 " ms" n; exit }')
        v="$v${v:+; }C=$c: $r req/s, $x"
    done
    echo "$v"
}

serve_loopback() {
    run bench-serve scripts/bench-serve.sh host
    local label v
    for label in "1 process, tags on, no trace" "1 process, tags off, no trace" "1 process, tags on, trace on" "3 processes, tags on, no trace"; do
        v=$(per_c "$OUT/bench-serve.out" "$label" lat)
        add_row "kvsim serve over loopback (line endpoint, host GPU), $label: req/s, p50 / p99" \
            "${v:-$(na bench-serve "\"$label\" lines")}" "scripts/bench-serve.sh host"
    done
}

http_front() {
    run bench-http env BENCH_REPS=3 scripts/bench-http.sh
    local f="$OUT/bench-http.out" c="BENCH_REPS=3 scripts/bench-http.sh" v
    v=$(per_c "$f" "line endpoint" lat)
    add_row "kvsim serve --http: line endpoint, req/s (median of 3), p50 / p99 (first run)" \
        "${v:-$(na bench-http '"line endpoint" lines')}" "$c"
    v=$(per_c "$f" "http front" lat)
    add_row "kvsim serve --http: HTTP front (hyper, kept-alive raw client), req/s (median of 3), p50 / p99 (first run)" \
        "${v:-$(na bench-http '"http front" lines')}" "$c"
    # The ratio per interleaved pair (line, then front), median of the pairs.
    local cc rl
    v=""
    for cc in 1 8 64; do
        rl=$(bench_lines "$f" | awk -F'\t' -v c="$cc" '
            $2 == c && $1 == "line endpoint" { l[++nl] = $3 }
            $2 == c && $1 == "http front" { h[++nh] = $3 }
            END { for (i = 1; i <= nl && i <= nh; i++) if (l[i] > 0) printf "%.2f\n", h[i] / l[i] }' | median)
        [ -z "$rl" ] || v="$v${v:+; }C=$cc: $rl"
    done
    add_row "kvsim serve --http: HTTP front over line endpoint, req/s (median of 3 pairs; goal at least 0.9)" \
        "${v:-$(na bench-http 'line and front pairs')}" "$c"
    v=$(per_c "$f" "http front, stream" first)
    add_row "kvsim serve --http: streamed, time to the first token's event" \
        "${v:-$(na bench-http '"http front, stream" lines')}" "$c"
    local skip
    skip=$(grep -m1 '^SKIPPED' "$f" || true)
    v=$(per_c "$f" "real router (PD)" lat)
    add_row "SGLang's router (PD mode) in front of kvsim workers, JSON: req/s, p50 / p99" \
        "${v:-${skip:+n/a ($skip)}}" "$c"
    v=$(per_c "$f" "real router, stream" first)
    add_row "SGLang's router (PD mode), streamed: first event (the router's Nagle on kept-alive connections)" \
        "${v:-${skip:+n/a ($skip)}}" "$c"
}

# One `kvsim serve --http` per run, invariants on and off alternating, 3 times each.
invariants_cost() {
    local sc="$OUT/bench-256.toml" mode i cc v="" l0=""
    sed 's/^\[engine\]$/[engine]\nmax_rooms = 256/' tests/serve/loopback.toml >"$sc"
    for i in 1 2 3; do
        for mode in on off; do
            local extra=()
            [ "$mode" = on ] || extra=(--no-invariants)
            "$KV" serve "$sc" --http 127.0.0.1:0 ${extra[@]+"${extra[@]}"} >"$OUT/inv-server-$mode-$i.out" 2>&1 &
            local spid=$!
            SPIDS+=("$spid")
            local _t http
            for _t in $(seq 100); do grep -q "http on" "$OUT/inv-server-$mode-$i.out" && break; sleep 0.05; done
            http=$(sed -n 's/^kvsim serve: http on //p' "$OUT/inv-server-$mode-$i.out")
            for cc in 1 8; do
                run "inv-$mode-$i-c$cc" "$KV" bench-http "http://$http" --concurrency "$cc" \
                    --requests $((cc == 1 ? 2000 : 400)) --prompt-len 64 --max-new-tokens 4
                [ -n "$l0" ] || l0=$LOAD
            done
            kill -TERM "$spid" 2>/dev/null || true
            wait "$spid" 2>/dev/null || true
        done
    done
    LOAD=$l0
    for cc in 1 8; do
        local on off
        on=$(cat "$OUT"/inv-on-*-c"$cc".out 2>/dev/null | sed -nE 's/.* = ([0-9]+) req\/s.*/\1/p' | median)
        off=$(cat "$OUT"/inv-off-*-c"$cc".out 2>/dev/null | sed -nE 's/.* = ([0-9]+) req\/s.*/\1/p' | median)
        [ -z "$on" ] || [ -z "$off" ] || v="$v${v:+; }C=$cc: on $on, off $off req/s"
    done
    add_row "kvsim serve: each node's invariants after every input, on against off (median of 3)" \
        "${v:-n/a (no bench-http figures; $OUT/inv-*.out)}" \
        "kvsim serve BENCH.toml --http 127.0.0.1:0 [--no-invariants]; kvsim bench-http URL --concurrency 1|8 --requests 2000|400 --prompt-len 64 --max-new-tokens 4"
}

bugs_full() {
    run bugs "$KV" bugs --seeds 300 --out "$OUT/bugs"
    local w
    w=$(wall bugs)
    add_row "bug matrix, full (every switch, both tools, isolation at 20 seeds)" \
        "$(either "$w" "$w s wall (exit $RC), peak RSS $(rss_mib bugs) MiB" "$(na bugs 'a wall time')")" \
        "kvsim bugs --seeds 300 --out DIR"
}

ttc() {
    run ttc "$KV" bugs --time-to-counterexample --runs 3 --out "$OUT/ttc"
    local f="$OUT/ttc/ttc.md" met total
    met=$(grep -c '| met |$' "$f" 2>/dev/null)
    total=$(grep -c '^| [a-z].* |$' "$f" 2>/dev/null)
    total=$((${total:-1} - 1))
    add_row "time to a counterexample, every switch (median of 3 runs, each a new process)" \
        "$(either "$met" "$met of $total rows meet both goals (simulator under 1 s, model checker under 10 s); the table: $f" "$(na ttc 'a table')")" \
        "kvsim bugs --time-to-counterexample --runs 3"
}

# crit FILE ID: criterion's middle estimate of ID, in ns.
crit() {
    awk -v id="$2" 'index($0, id) == 1 { f = 1 }
        f && /time: *\[/ { s = $0; sub(/.*time: *\[/, "", s); split(s, a, " ")
            u = a[4]; m = (u == "ps" ? 0.001 : u == "ns" ? 1 : (u == "us" || u == "µs") ? 1000 : u == "ms" ? 1e6 : u == "s" ? 1e9 : -1)
            if (m > 0) printf "%.1f", a[3] * m; exit }' "$1"
}

criterion() {
    local c="cargo bench -p kvsim-engine --bench shared_pool"
    run bench-shared cargo bench -p kvsim-engine --bench shared_pool
    local f="$OUT/bench-shared.out" a b d e
    a=$(crit "$f" one_thread/shared_hold_unhold)
    add_row "kv::shared: hold + unhold, one thread (goal under 20 ns)" "$(either "$a" "$a ns" "$(na bench-shared one_thread/shared_hold_unhold)")" "$c"
    a=$(crit "$f" one_thread/shared_begin_read_drop)
    b=$(crit "$f" one_thread/shared_begin_write_drop)
    d=$(crit "$f" one_thread/page_pool_hold_unhold)
    e=$(crit "$f" one_thread/shared_stale_write_refused)
    add_row "kv::shared: through the guards, begin_read / begin_write + drop; stale write refused; PagePool floor" \
        "$(either "$a" "$a / $b ns; $e ns; floor $d ns" "$(na bench-shared one_thread/shared_begin_read_drop)")" "$c"
    a=$(crit "$f" two_threads/same_page)
    b=$(crit "$f" two_threads/adjacent_pages_one_cache_line)
    d=$(crit "$f" two_threads/pages_on_separate_cache_lines)
    add_row "kv::shared: two threads, same page / adjacent pages (one cache line) / separate lines" \
        "$(either "$a" "$a / $b / $d ns" "$(na bench-shared two_threads/same_page)")" "$c"

    c="cargo bench -p kvsim-engine --bench tag_check -- --warm-up-time 1 --measurement-time 4"
    run bench-tags cargo bench -p kvsim-engine --bench tag_check -- --warm-up-time 1 --measurement-time 4
    f="$OUT/bench-tags.out"
    a=$(crit "$f" "decode step, host backend/check only/64x256p")
    b=$(crit "$f" "decode step, host backend/tags on/64x256p")
    d=$(crit "$f" "decode step, host backend/tags off/64x256p")
    local per
    per=$(awk -v a="$a" 'BEGIN { if (a != "") printf "%.1f", a / (64 * 256) }')
    add_row "read-time tag check, per page of a request's table (64 requests x 256 pages)" \
        "$(either "$per" "$per ns a page (check alone $(awk -v a="$a" 'BEGIN{printf "%.1f", a/1000}') us; step tags on / off $(awk -v a="$b" -v b="$d" 'BEGIN{printf "%.1f / %.1f", a/1000, b/1000}') us)" "$(na bench-tags 'check only/64x256p')")" "$c"
}

loom() {
    local c='CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" cargo test -p kvsim-engine --release loom'
    say "-- building the loom tests (target-loom)"
    CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" cargo test -p kvsim-engine --release loom --no-run >&2 || true
    run loom env CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" cargo test -p kvsim-engine --release loom
    local v
    v=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i + 1) ~ /^passed/) p += $i; if ($(i + 1) ~ /^failed/) f += $i
            if ($i == "in") { t = $(i + 1); sub(/s$/, "", t); s += t } } n++ }
        END { if (n) printf "%d passed, %d failed in %.1f s of test time", p, f, s }' "$OUT/loom.out")
    add_row "loom models of kv::shared, bounded as in CI (warm build)" \
        "$(either "$v" "$v ($(wall loom) s wall)" "$(na loom '"test result:" lines')")" "$c"
}

tests() {
    say "-- building the workspace's tests"
    CI=true cargo test --workspace --no-run >&2 || true
    run tests env CI=true cargo test --workspace
    local v
    v=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i + 1) ~ /^passed/) p += $i; if ($(i + 1) ~ /^failed/) f += $i
            if ($i == "in") { t = $(i + 1); sub(/s$/, "", t); s += t } } n++ }
        END { if (n) printf "%d passed, %d failed in %d test binaries, %.1f s summed test time", p, f, n, s }' "$OUT/tests.out")
    add_row "cargo test --workspace, already built" \
        "$(either "$v" "$(wall tests) s wall; $v" "$(na tests '"test result:" lines')")" "CI=true cargo test --workspace"
}

# -------------------------------------------------------------------------- main

say "perf-table: $MACHINE; raw outputs in $OUT; $([ $QUICK = 1 ] && echo quick || echo full) run"
[ $BUILD = 0 ] || build
if [ ! -x "$KV" ]; then
    echo "no $KV: build it (cargo build --release --bin kvsim) or drop --no-build" >&2
    exit 2
fi
# section NAME ARGS...: one group of rows (with --only, just the named groups).
section() {
    case " $ONLY " in "  " | *" $1 "*) ;; *) return 0 ;; esac
    "$@" || say "!! $1: a step failed; its rows say n/a"
}

section incident
section suite
section sweeps
section check_rows check-dfs DFS --dfs
section check_rows check-bfs BFS
section rss_row rss-dfs "DFS, 1 thread" --threads 1 --dfs
section rss_row rss-bfs "BFS, 1 thread" --threads 1
if [ $QUICK = 1 ]; then
    section audit_file 25 "100 MB trace (glm53-incident x 25 requests)"
else
    section sweep_10k
    section other_sweeps
    section rss_row rss-dfs2 "DFS, 2 threads" --threads 2 --dfs
    section rss_row rss-bfs2 "BFS, 2 threads" --threads 2
    section check_all
    section two_by_two
    section audit_file 250 "1 GB trace (glm53-incident x 250 requests)"
    section audit_pipe
    section sweep_audit
    section kv_path
    section serve_loopback
    section http_front
    section invariants_cost
    section bugs_full
    section ttc
    section stalls
    section criterion
    section loom
    section tests
fi

echo "| figure | value | command | load | machine | date |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
say "perf-table: done; raw outputs in $OUT"

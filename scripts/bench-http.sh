#!/usr/bin/env bash
# Figures for docs/PERFORMANCE.md (its table; history: docs/PERFORMANCE-LOG.md, "The HTTP
# front ..."): on one `kvsim serve --http`
# server, requests/s and p50/p99 latency at concurrency 1, 8 and 64 of the line
# endpoint (`bench-client`) and of the HTTP front over kept-alive connections
# (`bench-http`), and the time to the first token's event of a stream; then the same
# load through SGLang's real router in PD mode in front of kvsim's prefill and decode
# processes (worker mode), against the workers' decode directly is not possible (a
# worker needs the router's bootstrap fields), so against kvsim's own router front.
# Needs a release build and the router in PY's environment (PY, default
# target/pyclients/bin/python):
#   cargo build --release && scripts/bench-http.sh
# Benchmarks only: nothing here asserts a time.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KV:-target/release/kvsim}
PY=${PY:-target/pyclients/bin/python}
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
# The loopback scenario with a room table of 256 (its default, 64, is C=64's whole
# table: the router then sheds with 503 whichever front is faster at reusing a room, so
# the two fronts would not run the same accepted load). Every row reports what was
# not 200; the figures compare like with like only where both are 0.
SC=$TMP/bench.toml
sed 's/^\[engine\]$/[engine]\nmax_rooms = 256/' tests/serve/loopback.toml > "$SC"
# Requests per client (BENCH_N scales them: 1 is 2,000 at C=1, 400 at C=8, 50 at C=64).
N() { echo $(( (${BENCH_N:-1} * ($1 == 1 ? 2000 : ($1 == 8 ? 400 : 50))) / ${BENCH_DIV:-1} )); }

echo "machine: $(nproc) cores, $(uname -srm); $(date -u +%F)"
"$KV" serve "$SC" --http 127.0.0.1:0 > "$TMP/out" 2>&1 &
SPID=$!
# The server's CPU time (user + system, from /proc) per request of the run `row` times.
ticks() { awk '{print $14 + $15}' "/proc/$SPID/stat"; }
row() { # LABEL REQUESTS COMMAND...
    local label=$1 n=$2 a b; shift 2
    a=$(ticks); printf '%-22s ' "$label"; "$@" | tr -d '\n'; b=$(ticks)
    echo "; server cpu $(( (b - a) * 10000 / n )) us per request (10 ms ticks)"
}
for _ in $(seq 100); do grep -q "http on" "$TMP/out" && break; sleep 0.05; done
line=$(sed -n 's/^kvsim serve: client endpoint on //p' "$TMP/out")
http=http://$(sed -n 's/^kvsim serve: http on //p' "$TMP/out")
for c in 1 8 64; do
    n=$(( c * $(N $c) ))
    for rep in $(seq "${BENCH_REPS:-1}"); do
        row "line endpoint" "$n" "$KV" bench-client "$line" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4
        row "http front" "$n" "$KV" bench-http "$http" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4
    done
    row "http front, stream" "$n" "$KV" bench-http "$http" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4 --stream
    row "http front, ureq" "$n" "$KV" bench-http "$http" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4 --client ureq
done

# The real router (PD mode) in front of a prefill and a decode process (BENCH_ROUTER=0
# leaves it out).
[ "${BENCH_ROUTER:-1}" = 1 ] || exit 0
if ! "$PY" -c 'import sglang_router' 2>/dev/null; then
    echo "SKIPPED: $PY has no sglang_router"; exit 0
fi
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
boot=$(port); ph=$(port); dh=$(port); rp=$(port); mp=$(port)
printf 'n1 127.0.0.1:%s\nn2 127.0.0.1:%s\nbootstrap n1 127.0.0.1:%s\n' "$(port)" "$(port)" "$boot" > "$TMP/peers"
"$KV" serve "$SC" --node n1 --peers "$TMP/peers" --worker-http "127.0.0.1:$ph" > "$TMP/n1.out" 2>&1 &
"$KV" serve "$SC" --node n2 --peers "$TMP/peers" --worker-http "127.0.0.1:$dh" > "$TMP/n2.out" 2>&1 &
sleep 1
"$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$rp" --pd-disaggregation \
    --prefill "http://127.0.0.1:$ph" "$boot" --decode "http://127.0.0.1:$dh" --policy round_robin \
    --prometheus-host 127.0.0.1 --prometheus-port "$mp" > "$TMP/router.log" 2>&1 &
for _ in $(seq 100); do curl -s "127.0.0.1:$rp/workers" | grep -q '"decode_count":1' && break; sleep 0.1; done
# The router (0.3.2) leaves Nagle on for its clients' sockets: a stream on a kept-alive
# connection waits for the client's delayed ACK, about 40 ms a request (the router's, see
# docs/PERFORMANCE-LOG.md, "The 48 ms stream through the router: cause").
for c in 1 8 64; do
    printf '%-22s ' "real router (PD)"; "$KV" bench-http "http://127.0.0.1:$rp" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4
    printf '%-22s ' "real router, stream"; "$KV" bench-http "http://127.0.0.1:$rp" --concurrency "$c" --requests "$(N $c)" --prompt-len 64 --max-new-tokens 4 --stream
done

#!/usr/bin/env bash
# Figures for docs/PERFORMANCE.md (its table; history: docs/PERFORMANCE-LOG.md, "`kvsim
# serve` over loopback"): requests/s and p50/p99 latency of
# `kvsim serve` over loopback at concurrency 1, 8 and 64, for tags on/off, tracing
# on/off, and one process vs one process per node. Needs a release build:
#   cargo build --release && scripts/bench-serve.sh [--gpu host|symbolic]
# Benchmarks only: nothing here asserts a time.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=target/release/kvsim
GPU=${1:-host}
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

bench() { # ADDR LABEL
    for c in 1 8 64; do
        n=$(( c == 1 ? 2000 : (c == 8 ? 400 : 50) ))
        printf '%-34s ' "$2"
        "$KV" bench-client "$1" --concurrency "$c" --requests "$n" --prompt-len 64 --max-new-tokens 4
    done
}

single() { # SCENARIO LABEL [extra args]
    local sc=$1 label=$2; shift 2
    "$KV" serve "$sc" --gpu "$GPU" "$@" > "$TMP/out" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do grep -q "client endpoint" "$TMP/out" && break; sleep 0.05; done
    local addr; addr=$(sed -n 's/^kvsim serve: client endpoint on //p' "$TMP/out")
    bench "$addr" "$label"
    kill -TERM "$pid"; wait "$pid" || true
}

echo "machine: $(nproc) cores, $(uname -srm); gpu backend: $GPU; $(date -u +%F)"
single tests/serve/loopback.toml "1 process, tags on, no trace"
single tests/serve/incident.toml "1 process, tags off, no trace"
single tests/serve/loopback.toml "1 process, tags on, trace on" --trace-json "$TMP/trace"

# One process per node.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
{
    echo "n0 127.0.0.1:$(port)"; echo "n1 127.0.0.1:$(port)"; echo "n2 127.0.0.1:$(port)"
    echo "client 127.0.0.1:$(port)"
} > "$TMP/peers"
pids=()
for n in n0 n1 n2; do
    "$KV" serve tests/serve/loopback.toml --gpu "$GPU" --node $n --peers "$TMP/peers" > "$TMP/$n.out" 2>&1 &
    pids+=($!)
done
for n in n0 n1 n2; do
    for _ in $(seq 200); do grep -q "connected to every peer" "$TMP/$n.out" && break; sleep 0.05; done
done
bench "$(sed -n 's/^client //p' "$TMP/peers")" "3 processes, tags on, no trace"
kill -TERM "${pids[@]}"; wait || true

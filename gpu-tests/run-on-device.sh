#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (CUDA backend of kvsim: kvsim-cuda in cuda/, its checks in gpu-tests/).
#
# A lent machine has no network and receives at most 64 MiB of untracked files, so
# nothing is built there: build the release binaries here, carry gpu-tests/bin/ (an
# ignored folder, about 15 MB), and run this script there. Not a CI script: CI runs
# `cargo test --workspace`, where the CUDA tests skip.
#
#   gpu-tests/run-on-device.sh --build     # here: release binaries into gpu-tests/bin/
#   gpu-tests/run-on-device.sh --dry-run   # here: everything present, CPU parts pass
#   gpu-tests/run-on-device.sh             # on the device, at most 8 minutes
#
# With the device tool: run(command="gpu-tests/run-on-device.sh",
#                           carry=["gpu-tests/bin"], timeout_s=540)
#
# The device run: the CUDA tests (KVSIM_GPU_SEEDS random workloads), CudaGpu against
# HostGpu on 3,000 random workloads, the full-scale incident scenario on CudaGpu
# (bugs and defended, equal to HostGpu), the attention benchmark (8 GiB pool,
# with and without the tag check), and the decode step through one attend_batch
# against one call per request (batches of 1 to 256). Reports go to $OUT (default: a temp folder); the
# summary table is printed last. Exit status 0 only if every part passed.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=gpu-tests/bin
PARTS=(cuda-tests cpu-tests gpu-device)
SCENARIO=scenarios/glm53-incident.toml
CARRY_LIMIT=$((64 * 1024 * 1024))

die() { echo "run-on-device: $*" >&2; exit 1; }

sources_hash() {
    cat cuda/kernels/kv.cu cuda/kernels/kv.ptx | sha256sum | cut -d' ' -f1
}

build() {
    set -e
    cargo build --release -p kvsim-gpu-tests --bin gpu-device
    local json
    json=$(mktemp)
    cargo test --release -p kvsim-gpu-tests --no-run --message-format=json >"$json"
    mkdir -p "$BIN"
    for t in cuda cpu; do
        local exe
        exe=$(python3 - "$json" "$t" <<'EOF'
import json, sys
path, name = sys.argv[1], sys.argv[2]
for line in open(path):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])
EOF
        )
        [ -n "$exe" ] || die "no test binary '$t' in cargo's output"
        cp "$exe" "$BIN/$t-tests"
    done
    rm -f "$json"
    cp target/release/gpu-device "$BIN/gpu-device"
    strip "$BIN"/* 2>/dev/null || true
    {
        echo "commit $(git rev-parse HEAD)"
        echo "kernels $(sources_hash)"
        echo "built $(date -u +%FT%TZ)"
    } >"$BIN/BUILD-INFO"
    ls -l "$BIN"
    echo "carry gpu-tests/bin: $(du -sb "$BIN" | cut -f1) bytes (limit $CARRY_LIMIT)"
}

check_present() {
    for p in "${PARTS[@]}"; do
        [ -x "$BIN/$p" ] || die "$BIN/$p missing: run gpu-tests/run-on-device.sh --build first"
    done
    [ -f "$BIN/BUILD-INFO" ] || die "$BIN/BUILD-INFO missing: rebuild with --build"
    grep -q "^kernels $(sources_hash)$" "$BIN/BUILD-INFO" ||
        die "kv.cu or kv.ptx changed since the binaries were built: rebuild with --build"
    [ -f cuda/kernels/kv.ptx ] || die "cuda/kernels/kv.ptx missing"
    grep -q '^.target sm_90' cuda/kernels/kv.ptx || die "kv.ptx does not target sm_90"
    [ -f "$SCENARIO" ] || die "$SCENARIO missing"
    local size
    size=$(du -sb "$BIN" | cut -f1)
    [ "$size" -le "$CARRY_LIMIT" ] || die "$BIN is $size bytes, over the 64 MiB carry limit"
    echo "present: ${PARTS[*]}, kv.ptx, $SCENARIO; $BIN is $size bytes"
}

# step NAME SECONDS COMMAND...: runs with a time limit, output to $OUT/NAME.txt.
declare -a SUMMARY=()
FAILED=0
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    rc=${PIPESTATUS[0]}
    local status=passed
    if [ "$rc" -eq 124 ]; then status="timed out"; elif [ "$rc" -ne 0 ]; then status="failed ($rc)"; fi
    [ "$status" = passed ] || FAILED=1
    SUMMARY+=("| $name | $status | $((SECONDS - t0)) s |")
}

summary() {
    echo
    echo "| part | result | wall |"
    echo "|---|---|---|"
    printf '%s\n' "${SUMMARY[@]}"
    if [ -f "$OUT/bench.txt" ]; then
        echo
        grep -E '^\||share' "$OUT/bench.txt" || true
    fi
    if [ -f "$OUT/step.txt" ]; then
        echo
        grep -E '^\|' "$OUT/step.txt" || true
    fi
    echo "reports: $OUT"
}

OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

case "${1:-}" in
--build)
    build
    ;;
--dry-run)
    check_present
    step probe 30 "$BIN/gpu-device" probe
    step ptx 60 "$BIN/gpu-device" ptx
    step cpu-tests 120 "$BIN/cpu-tests" --test-threads=2
    step cuda-tests-skip 60 "$BIN/cuda-tests" --test-threads=1
    step compare-cpu 120 "$BIN/gpu-device" compare --cpu --seeds 300 --ops 150
    step incident-cpu 240 "$BIN/gpu-device" incident --cpu --scenario "$SCENARIO"
    step step-cpu 60 "$BIN/gpu-device" step --cpu --runs 5
    summary
    [ "$FAILED" -eq 0 ] || die "dry run failed"
    echo "dry run passed"
    ;;
"")
    check_present
    "$BIN/gpu-device" probe | tee "$OUT/probe.txt"
    grep -q '^CUDA: [0-9]' "$OUT/probe.txt" || die "no CUDA device here (see $OUT/probe.txt)"
    step cuda-tests 120 env KVSIM_GPU_SEEDS=500 "$BIN/cuda-tests" --test-threads=1 --nocapture
    step compare 120 "$BIN/gpu-device" compare --seeds 3000 --ops 100
    step incident 150 "$BIN/gpu-device" incident --scenario "$SCENARIO"
    step bench 90 "$BIN/gpu-device" bench --pool-gib 8 --runs 25
    step step 60 "$BIN/gpu-device" step --runs 50
    summary
    [ "$FAILED" -eq 0 ] || die "device run failed"
    ;;
*)
    die "usage: $0 [--build | --dry-run]"
    ;;
esac

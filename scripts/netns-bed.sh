#!/usr/bin/env bash
# The real-fault bed of `kvsim serve`: router, prefill and decode processes in their own
# network namespaces (veth pairs to a bridge), a canary workload from the host, and a
# seeded, printed schedule of real faults: packet loss and one- and two-way partitions
# (nftables inside a namespace), a slow link (tbf), a link taken down and up, a paused
# prefill (SIGSTOP/SIGCONT), and SIGKILL of the decode and of the prefill process
# (mid-transfer under load) with a restart at a new epoch. Afterwards: `kvsim audit` over every node's trace, and every pool's pages at
# exit.
#
# With `--router PY`: the PD topology behind SGLang's real router (`sglang-router`,
# from PY's environment): prefill and decode in worker mode (`--worker-http`, prefill's
# bootstrap endpoint) in their namespaces, the router in PD mode in its own, and
# `kvsim canary` (with client disconnects) through the router from the host. The faults
# are on the links (loss on the router's and on decode's link, one- and two-way
# partitions between prefill and decode and between the router and decode, a slow
# link, a link down and up), a paused prefill, and SIGKILL of the decode and of the
# prefill worker with a restart at a new epoch at the same address (the router keeps
# its worker list: it finds the restarted worker by its health checks and retries).
#
# With `--transport nixl`: prefill's KV writes go over NIXL (the `nixl-cu12` wheel's
# UCX backend over TCP, `kvsim serve --transport nixl`) between the namespaces, UCX on
# each namespace's own interface (`UCX_TLS=tcp`, `UCX_NET_DEVICES=v<k><id>`), the
# wheel's libraries from `KVSIM_NIXL_LIB_DIR` (SKIPPED without it); the schedule also
# stops the decode process (SIGSTOP/SIGCONT: NIXL has no transport timeout, so its
# writes wait for it).
#
#   scripts/netns-bed.sh SEED [--bugs LIST] [--scenario FILE] [--router PY] [--transport nixl]
#
# Environment: KVSIM (the kvsim binary; default target/debug/kvsim), BED_DIR (where
# traces and logs go; default a temporary folder, kept), BED_SECONDS (canary load,
# default 8). Exit: 0 when the canary saw no leak, the audit is clean and every pool
# drained; 1 otherwise; 77 (SKIPPED) when namespaces are not available here.
set -uo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: netns-bed.sh SEED [--bugs LIST] [--scenario FILE]}
shift
BUGS=""
SC=tests/serve/loopback.toml
ROUTER_PY=""
TRANSPORT=tcp
while [ $# -gt 0 ]; do
    case $1 in
        --bugs) BUGS=$2; shift 2 ;;
        --scenario) SC=$2; shift 2 ;;
        --router) ROUTER_PY=$2; shift 2 ;;
        --transport) TRANSPORT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
KVSIM=${KVSIM:-target/debug/kvsim}
SECONDS_LOAD=${BED_SECONDS:-8}

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_NET_ADMIN)"
command -v ip >/dev/null || skip "no \`ip\` command (package iproute2)"
command -v nft >/dev/null || skip "no \`nft\` command (package nftables)"
command -v tc >/dev/null || skip "no \`tc\` command (package iproute2)"
ip netns add "kvprobe$$" 2>/dev/null || skip "cannot create a network namespace here"
ip netns del "kvprobe$$"
case $TRANSPORT in
    tcp) ;;
    nixl) [ -f "${KVSIM_NIXL_LIB_DIR:-}/libnixl_capi.so" ] \
              || skip "--transport nixl: KVSIM_NIXL_LIB_DIR names no folder with libnixl_capi.so" ;;
    *) echo "unknown transport $TRANSPORT (tcp or nixl)" >&2; exit 2 ;;
esac
if [ -n "$ROUTER_PY" ]; then
    "$ROUTER_PY" -c 'import sglang_router' 2>/dev/null \
        || skip "\`$ROUTER_PY\` cannot import sglang_router (pip install sglang-router==0.3.2)"
fi

ID=$$
DIR=${BED_DIR:-$(mktemp -d /tmp/kvsim-bed.XXXXXX)}
mkdir -p "$DIR/traces"
BR=kvbr$ID
NET=10.$(( 100 + ID % 100 )).$(( ID / 100 % 250 ))
declare -A NS=([r]=kvr$ID [p]=kvp$ID [d]=kvd$ID)
declare -A IP=([r]=$NET.1 [p]=$NET.2 [d]=$NET.3)
declare -A PID
RANDOM=$SEED

cleanup() {
    for k in r p d; do [ -n "${PID[$k]:-}" ] && kill -9 "${PID[$k]}" 2>/dev/null; done
    for k in r p d; do ip netns del "${NS[$k]}" 2>/dev/null; done
    ip link del "$BR" 2>/dev/null
    true
}
trap cleanup EXIT

ip link add "$BR" type bridge && ip addr add "$NET.254/24" dev "$BR" && ip link set "$BR" up || exit 1
for k in r p d; do
    ns=${NS[$k]}
    ip netns add "$ns"
    ip link add "h$k$ID" type veth peer name "v$k$ID"
    ip link set "v$k$ID" netns "$ns"
    ip link set "h$k$ID" master "$BR" up
    ip netns exec "$ns" ip addr add "${IP[$k]}/24" dev "v$k$ID"
    ip netns exec "$ns" ip link set "v$k$ID" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" nft add table inet bed
    ip netns exec "$ns" nft add chain inet bed out '{ type filter hook output priority 0; }'
done
if [ -n "$ROUTER_PY" ]; then
    cat > "$DIR/peers" <<PEERS
n1 ${IP[p]}:7001
n2 ${IP[d]}:7002
bootstrap n1 ${IP[p]}:8998
PEERS
else
    cat > "$DIR/peers" <<PEERS
n0 ${IP[r]}:7000
n1 ${IP[p]}:7001
n2 ${IP[d]}:7002
client ${IP[r]}:7100
PEERS
fi
declare -A HTTP=([p]=${IP[p]}:30001 [d]=${IP[d]}:30002)
ROUTER_URL=http://${IP[r]}:30000

start() { # KEY NODE EPOCH
    local more=()
    [ -n "$BUGS" ] && more=(--bugs "$BUGS")
    if [ -n "$ROUTER_PY" ]; then more+=(--worker-http "${HTTP[$1]}"); else more+=(--prompts canary); fi
    local envs=()
    if [ "$TRANSPORT" = nixl ]; then
        more+=(--transport nixl --gpu host)
        envs=(LD_LIBRARY_PATH="$KVSIM_NIXL_LIB_DIR" UCX_TLS=tcp UCX_NET_DEVICES="v$1$ID")
    fi
    ip netns exec "${NS[$1]}" env "${envs[@]}" "$KVSIM" serve "$SC" --node "$2" --peers "$DIR/peers" \
        --epoch "$3" --trace-json "$DIR/traces" --drain-secs 20 "${more[@]}" \
        > "$DIR/$2-e$3.out" 2>&1 &
    PID[$1]=$!
}
start_router() { # the real router, PD mode, in its own namespace
    ip netns exec "${NS[r]}" "$ROUTER_PY" -m sglang_router.launch_router --host "${IP[r]}" --port 30000 \
        --pd-disaggregation --prefill "http://${HTTP[p]}" 8998 --decode "http://${HTTP[d]}" \
        --policy round_robin --prometheus-host "${IP[r]}" --prometheus-port 29000 \
        > "$DIR/router.out" 2>&1 &
    PID[r]=$!
    for _ in $(seq 300); do
        curl -s --max-time 1 "$ROUTER_URL/workers" 2>/dev/null | grep -q '"decode_count":1' && return 0
        sleep 0.1
    done
    echo "the router never listed both workers"; cat "$DIR/router.out"; return 1
}
wait_line() { # FILE TEXT
    for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "timeout waiting for '$2' in $1"; cat "$1"; return 1
}
READY="running"
[ -n "$ROUTER_PY" ] && READY="worker http on"
if [ -n "$ROUTER_PY" ]; then
    start p n1 0; start d n2 0
    for f in n1-e0 n2-e0; do wait_line "$DIR/$f.out" "worker http on" || exit 1; done
    start_router || exit 1
else
    start r n0 0; start p n1 0; start d n2 0
    for f in n0-e0 n1-e0 n2-e0; do wait_line "$DIR/$f.out" "connected to every peer" || exit 1; done
fi

# The fault schedule, drawn from the seed and printed so a failing run can be repeated.
ms() { echo $(( $1 + RANDOM % $2 )); }
SCHEDULE=(
    "loss d $(( 10 + RANDOM % 30 )) $(ms 600 900)"
    "partition-oneway p d $(ms 400 800)"
    "slow d $(ms 500 800)"
    "partition p d $(ms 400 800)"
    "linkdown d $(ms 300 600)"
    "pause p $(ms 300 700)"
    "kill d $(ms 200 400)"
    "kill p $(ms 200 400)"
)
if [ -n "$ROUTER_PY" ]; then
    SCHEDULE=(
        "loss r $(( 10 + RANDOM % 30 )) $(ms 600 900)"
        "loss d $(( 10 + RANDOM % 30 )) $(ms 600 900)"
        "partition-oneway p d $(ms 400 800)"
        "partition-oneway d p $(ms 400 800)"
        "partition r d $(ms 400 800)"
        "slow d $(ms 500 800)"
        "partition p d $(ms 400 800)"
        "linkdown p $(ms 300 600)"
        "pause p $(ms 300 700)"
        "kill d $(ms 200 400)"
        "kill p $(ms 200 400)"
    )
fi
# Over NIXL a stopped decode holds prefill's writes (no transport timeout).
[ "$TRANSPORT" = nixl ] && SCHEDULE+=("pause d $(ms 300 700)")
# Shuffle the order by the seed.
for (( i=${#SCHEDULE[@]}-1; i>0; i-- )); do
    j=$(( RANDOM % (i + 1) )); t=${SCHEDULE[$i]}; SCHEDULE[$i]=${SCHEDULE[$j]}; SCHEDULE[$j]=$t
done
echo "bed seed $SEED, scenario $SC, bugs '${BUGS:-none}', transport $TRANSPORT, dir $DIR"
printf 'schedule: %s\n' "${SCHEDULE[@]}"

ip netns exec "${NS[r]}" true
if [ -n "$ROUTER_PY" ]; then
    # 16 new tokens (the scenarios' limit): a short request's 32 + 16 tokens fill its
    # three pages with its marker, and an over-length reply echoes 16 positions spread
    # over its pages, the first at page 2. With 8, a 513-token prompt read positions 0,
    # 73, 146, ... (pages 0, 4, 9, ...), and on a slow machine, where few short requests
    # overlap and LIFO reuse keeps the written pages few, its 200 reply could carry
    # only unwritten slots (`<unk>`): the leak was in the audit (S3) but not in the reply.
    # Two over-length prompts a round (1025 and 513 tokens), not more: two 513-token
    # prompts in flight at once split the stale pages, and the second often reads only
    # unwritten ones (measured: 3 of 10 such replies carried no marker).
    "$KVSIM" canary --url "$ROUTER_URL" --duration "$SECONDS_LOAD" --seed "$SEED" --concurrency 4 \
        --requests 16 --over-length 2 --max-new-tokens 16 --disconnect-rate 0.1 --timeout 30 --quiet \
        --json "$DIR/canary.json" > "$DIR/canary.out" 2>&1 &
else
    "$KVSIM" canary-client "${IP[r]}:7100" --seconds "$SECONDS_LOAD" --seed "$SEED" --concurrency 4 \
        > "$DIR/canary.out" 2>&1 &
fi
CANARY=$!
sleep 0.5
nexec() { ip netns exec "${NS[$1]}" "${@:2}"; }
declare -A EPOCH=([r]=0 [p]=0 [d]=0)
declare -A NODE=([r]=n0 [p]=n1 [d]=n2)
for f in "${SCHEDULE[@]}"; do
    set -- $f
    dur=$(echo "scale=3; ${!#} / 1000" | bc)
    echo "fault: $f"
    case $1 in
        loss) nexec "$2" nft add rule inet bed out numgen random mod 100 '<' "$3" drop
              sleep "$dur"; nexec "$2" nft flush chain inet bed out ;;
        partition-oneway) nexec "$2" nft add rule inet bed out ip daddr "${IP[$3]}" drop
              sleep "$dur"; nexec "$2" nft flush chain inet bed out ;;
        partition) nexec "$2" nft add rule inet bed out ip daddr "${IP[$3]}" drop
              nexec "$3" nft add rule inet bed out ip daddr "${IP[$2]}" drop
              sleep "$dur"; nexec "$2" nft flush chain inet bed out; nexec "$3" nft flush chain inet bed out ;;
        slow) nexec "$2" tc qdisc add dev "v$2$ID" root tbf rate 256kbit burst 16kb latency 300ms
              sleep "$dur"; nexec "$2" tc qdisc del dev "v$2$ID" root ;;
        linkdown) nexec "$2" ip link set "v$2$ID" down
              sleep "$dur"; nexec "$2" ip link set "v$2$ID" up ;;
        pause) kill -STOP "${PID[$2]}"; sleep "$dur"; kill -CONT "${PID[$2]}" ;;
        kill) kill -9 "${PID[$2]}"; wait "${PID[$2]}" 2>/dev/null; sleep "$dur"
              EPOCH[$2]=$(( EPOCH[$2] + 1 )); start "$2" "${NODE[$2]}" "${EPOCH[$2]}"
              wait_line "$DIR/${NODE[$2]}-e${EPOCH[$2]}.out" "$READY" || exit 1 ;;
    esac
    sleep 0.2
done
wait "$CANARY"; CANARY_RC=$?
cat "$DIR/canary.out"
sleep 1
if [ -n "$ROUTER_PY" ]; then
    # The workers must be whole before they stop: nothing live, no page held.
    for k in p d; do
        for _ in $(seq 200); do
            m=$(curl -s --max-time 2 "http://${HTTP[$k]}/metrics")
            echo "$m" | grep -q '^kvsim_pool_pages_held{.* 0$' && echo "$m" | grep -q '^kvsim_live_requests{.* 0$' && break
            sleep 0.1
        done
        echo "$m" | grep -E '^kvsim_(pool_pages_(free|held|quarantined)|live_requests)\{' | sed "s/^/$k metrics: /"
    done
    kill -TERM "${PID[r]}" 2>/dev/null; wait "${PID[r]}" 2>/dev/null; PID[r]=""
    echo "router log (tail):"; tail -3 "$DIR/router.out"
fi
for k in r p d; do [ -n "${PID[$k]}" ] && kill -TERM "${PID[$k]}" 2>/dev/null; done
DRAINED=1
for k in r p d; do
    [ -n "${PID[$k]}" ] || continue
    wait "${PID[$k]}" || DRAINED=0
    PID[$k]=""
done
cat "$DIR"/n*-e*.out | grep -E "pages free|no pool|did NOT|FAULT|WARNING" || true
"$KVSIM" audit "$DIR"/traces/*.jsonl > "$DIR/audit.out" 2>&1; AUDIT_RC=$?
head -20 "$DIR/audit.out"
echo "bed result: canary rc $CANARY_RC, audit rc $AUDIT_RC, drained $DRAINED (seed $SEED, dir $DIR)"
[ "$CANARY_RC" = 0 ] && [ "$AUDIT_RC" = 0 ] && [ "$DRAINED" = 1 ]

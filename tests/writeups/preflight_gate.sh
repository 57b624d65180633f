# Pre-flight gate for a disaggregated SGLang rollout.
# Four conditions; fail the deploy if any is missing.
set -euo pipefail

POOL=$(sglang_pool_tokens prefill)      # from startup log or metric
CTX=$(sglang_context_length prefill)
[ "$POOL" -ge "$CTX" ] || { echo "pool $POOL < context $CTX"; exit 1; }

# deferred KV release must be on for BOTH roles
sglang_flag_on prefill deferred_release
sglang_flag_on decode  deferred_release

# bounded transfer batches so one timed-out call cannot leave
# an unbounded tail of writes in flight
sglang_flag_le mooncake_transfer_batch_max 64

# corruption detection where the architecture supports it
sglang_flag_on decode kv_checksum  # --disaggregation-enable-kv-checksum
echo "pre-flight ok: pool=$POOL ctx=$CTX"

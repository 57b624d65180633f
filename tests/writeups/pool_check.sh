# The check Cloudflare now runs before any disaggregated deployment change.
# SGLang does NOT force the KV pool size to match the context length,
# so read both numbers from the running engine and compare them.

# 1) startup log prints the pool size it sized from leftover GPU memory
kubectl -n workers-ai logs deploy/glm-prefill | grep -iE "kv.?cache|pool|max_total_tokens"
#   -> max_total_num_tokens: 681280

# 2) context length is a separate config value you set yourself
curl -s localhost:30000/get_model_info | jq '.max_context_length'
#   -> 1048576   <-- 681280 < 1048576: this deployment is unsafe

# 3) the metric mirror of the same number, for alerting
curl -s localhost:30000/metrics | grep sglang:max_total_num_tokens

# Rule: pool >= context, on BOTH prefill and decode nodes,
# re-checked after every change to weights, quantization,
# tensor parallelism or memory fraction.

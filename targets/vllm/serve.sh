#!/bin/sh
# Launch config of the vllm target: one `vllm serve` process. target.toml runs it from
# a systemd unit (systemd/vllm.service); target-k8s.toml ships it to a Kubernetes
# Deployment as a ConfigMap (deployment.yaml), whose container runs it. bisect edits the
# options below in place (docs/design.md 3.3); the flags are in flags/*.toml:
#   KV_CACHE_DTYPE      --kv-cache-dtype auto | fp8
#   ATTENTION_BACKEND   --attention-backend FLASH_ATTN | FLASHINFER
#   NO_PREFIX_CACHING   --no-enable-prefix-caching absent (vLLM's default: on) | present
#   NO_CHUNKED_PREFILL  --no-enable-chunked-prefill absent (default: on) | present
#   MAX_NUM_SEQS        --max-num-seqs 256 | 16
# Adapt: the model, --served-model-name (the profile's model), the tool-call parser of
# your model, --tensor-parallel-size, the port (the profile's URLs). Keep the flags'
# options written out, even at their defaults, so `bisect check` shows each edit as a
# replaced line. --max-num-batched-tokens covers --max-model-len so that the
# NO_CHUNKED_PREFILL arm can start (vLLM refuses unchunked prefill otherwise).
export VLLM_LOGGING_LEVEL=INFO
exec vllm serve Qwen/Qwen3-8B \
    --served-model-name qwen3-8b \
    --host 0.0.0.0 --port 8000 \
    --tensor-parallel-size 1 \
    --enable-auto-tool-choice --tool-call-parser hermes \
    --max-model-len 16384 \
    --max-num-batched-tokens 16384 \
    --kv-cache-dtype auto \
    --attention-backend FLASH_ATTN \
    --max-num-seqs 256

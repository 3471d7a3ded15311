#!/bin/sh
# llama.cpp issue 12253 (KV-cache defragmentation with a quantized cache overran its
# destination into other sequences' cache: ggml's CPU same-type copy of quantized
# tensors counted elements instead of blocks; fixed by PR 12310, build b4941) on a
# llama-server built from the llama.cpp a llama-cpp-python sdist vendors:
#   BISECT_LLAMA_CPP_PYTHON_VERSION=0.3.8 BISECT_LLAMA_BUILD_EXAMPLES=ON scripts/llama-server.sh
# (0.3.8 vendors 7841fc7, before the fix; 0.3.9 vendors 8733e0c, after it). Its path is
# LLAMA_SERVER, the model LLAMA_MODEL (Qwen2.5-Coder-1.5B, as targets/llama-cpp/).
#
# What this old server needs, found by hand (docs/real-engines.md, "Issue 12253"): flash
# attention as LLAMA_ARG_FLASH_ATTN=1 (it reads only 1/true; without it a quantized V
# cache is refused), the KV cache types as arguments (no environment variable for them
# in this build), --log-verbosity 1 for the "requesting defrag" line in the log, and the
# model's own chat template (its Hermes-style <tool_call> format, which this build's
# Hermes 2 Pro parser reads): with targets/llama-cpp/'s fenced-JSON template this build
# showed the model no tools and it answered "DONE" to every task (bisect's tool-call
# probe refused the run, rightly).
# Flags (flags/): DEFRAG (the threshold: 0.1, the default, vs -1, off) and KV_TYPE
# (q8_0 vs f16, K and V together).
export LLAMA_ARG_DEFRAG_THOLD=0.1
export KV_TYPE=q8_0
export LLAMA_ARG_FLASH_ATTN=1
export LLAMA_ARG_N_PARALLEL=4
export LLAMA_ARG_CTX_SIZE=32768
export LLAMA_ARG_THREADS=2
# The server: LLAMA_SERVER, else the release scripts/llama-12253-release.sh last pointed
# its link at (the release search's `--artifact`).
SERVER="${LLAMA_SERVER:-${XDG_CACHE_HOME:-$HOME/.cache}/bisect/llama-12253/llama-server}"
[ -x "$SERVER" ] || { echo "serve.sh: no llama-server at $SERVER: set LLAMA_SERVER to the 0.3.8 (or 0.3.9) llama-server, or run scripts/llama-12253-release.sh 0.3.8" >&2; exit 1; }
exec "$SERVER" \
    --model "${LLAMA_MODEL:?set LLAMA_MODEL to a .gguf model: eval \"\$(scripts/llama-server.sh)\"}" \
    --alias qwen2.5-coder-1.5b \
    --host 127.0.0.1 --port 8094 \
    --jinja --metrics \
    --cache-type-k "$KV_TYPE" --cache-type-v "$KV_TYPE" \
    --log-verbosity 1

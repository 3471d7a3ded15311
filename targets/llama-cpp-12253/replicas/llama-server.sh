#!/bin/sh
# The llama-server of targets/llama-cpp-12253/serve.sh (see there for why each option),
# started by a replica set's launch config (serve-a.sh, serve-b.sh) after its flags and
# its PORT: two replica sets of one thread each, for `bisect run` on replicas
# (docs/real-engines.md, "Replicas"). Holds no flag: bisect edits the serve-*.sh files.
export LLAMA_ARG_FLASH_ATTN=1
export LLAMA_ARG_N_PARALLEL=4
SERVER="${LLAMA_SERVER:-${XDG_CACHE_HOME:-$HOME/.cache}/bisect/llama-12253/llama-server}"
[ -x "$SERVER" ] || { echo "llama-server.sh: no llama-server at $SERVER: set LLAMA_SERVER to the 0.3.8 (or 0.3.9) llama-server, or run scripts/llama-12253-release.sh 0.3.8" >&2; exit 1; }
exec "$SERVER" \
    --model "${LLAMA_MODEL:?set LLAMA_MODEL to a .gguf model: eval \"\$(scripts/llama-server.sh)\"}" \
    --alias qwen2.5-coder-1.5b \
    --host 127.0.0.1 --port "${PORT:?the launch config sets PORT}" \
    --jinja --metrics \
    --cache-type-k "$KV_TYPE" --cache-type-v "$KV_TYPE" \
    --log-verbosity 1

#!/bin/sh
# Launch config of the llama-cpp target (target.toml): llama-server on 127.0.0.1:8093.
# bisect edits the LLAMA_ARG_* lines below (llama-server reads every option from its
# LLAMA_ARG_* variable too) and runs this script from its own directory.
# LLAMA_SERVER and LLAMA_MODEL come from the environment: scripts/llama-server.sh
# prints them (the model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M). The chat template is what
# makes llama-server offer the tools and parse the model's calls (see its header).
export LLAMA_ARG_CACHE_TYPE_K=f16
export LLAMA_ARG_CACHE_TYPE_V=f16
export LLAMA_ARG_FLASH_ATTN=auto
# RAM prompt cache in MiB (llama-server's default): flag CACHE_RAM.
export LLAMA_ARG_CACHE_RAM=8192
# No speculative decoding (the default): flag SPEC_NGRAM_CACHE.
export LLAMA_ARG_SPEC_TYPE=none
# Four slots: four requests decode together, the rest wait (llamacpp:requests_deferred).
export LLAMA_ARG_N_PARALLEL=4
# One compute thread. ggml's threads spin-wait for each other at every graph node; on a
# machine whose cores are also busy (bisect's own client, a build, other tests) a
# descheduled thread stalls the others for a whole timeslice per node. Measured on two
# busy cores: 0.6 tokens/s with the default 2 threads, 5.2 with 1. Raise it on a machine
# with cores to spare.
export LLAMA_ARG_THREADS=1
# Trace-level log (llama-server's default verbosity is 3): flag CACHE_RAM's witness, the
# prompt-cache restore line (" - found better prompt with f_keep", SRV_TRC in
# tools/server/server-task.cpp), is printed only at 4 or more; bisect counts it in the
# server's log per block (docs/real-engines.md, "Mechanism witnesses"). Builds before
# the variable's rename (0.3.8's common/arg.cpp) read LLAMA_LOG_VERBOSITY.
export LLAMA_ARG_LOG_VERBOSITY=4
export LLAMA_LOG_VERBOSITY=4
# Context for all slots together: 4 x 4096 tokens.
# The exec line's --slot-prompt-similarity is flag SLOT_SIMILARITY (llama-server reads no
# variable for it); 0.10 is its default.
export LLAMA_ARG_CTX_SIZE=16384
exec "${LLAMA_SERVER:?set LLAMA_SERVER to the llama-server binary: eval \"\$(scripts/llama-server.sh)\"}" \
    --model "${LLAMA_MODEL:?set LLAMA_MODEL to a .gguf model: eval \"\$(scripts/llama-server.sh)\"}" \
    --alias qwen2.5-coder-1.5b \
    --host 127.0.0.1 --port 8093 \
    --jinja --chat-template-file qwen2.5-coder-tools.jinja --metrics \
    --slot-prompt-similarity 0.10

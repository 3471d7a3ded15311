#!/bin/sh
# Replica set a of the issue 12253 server: one thread, port 8094; the flags
# (../flags/: DEFRAG, KV_TYPE, CTX_SIZE) are the exports bisect edits.
export LLAMA_ARG_DEFRAG_THOLD=0.1
export KV_TYPE=q8_0
export LLAMA_ARG_CTX_SIZE=32768
export LLAMA_ARG_THREADS=1
export PORT=8094
exec sh "$(dirname "$0")/llama-server.sh"

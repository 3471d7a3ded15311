#!/usr/bin/env bash
# The hunt on a real vLLM (docs/real-engines.md, "vLLM on CPU"): each flag of
# targets/vllm-cpu/ A/B'd with `bisect run` on the `tiny` workload, at the load the
# machine carries and at 1 in flight, then one table row per run (scripts/llama-hunt.sh's
# table, with what the engine counted itself: preemptions, its tool-call parser's
# outcomes). Sets vLLM up first (scripts/vllm-server.sh: cached after the first time,
# ~12 min and ~6.5 GB then).
#
# Usage: scripts/vllm-hunt.sh
#        FLAGS="MAX_NUM_SEQS" LOADS="4" scripts/vllm-hunt.sh
#        scripts/vllm-hunt.sh --table DIR
# Settings (environment): BISECT (default target/release/bisect), FLAGS (default
# "KV_BLOCKS NO_CHUNKED_PREFILL NO_PREFIX_CACHING MAX_NUM_SEQS"), LOADS (default
# "4 1"), SESSIONS (per arm, default 8), WORKLOAD (default tiny), RESULTS (default
# results/vllm-hunt), TIMEOUT (per request, default 600: 8 replies at once take ~64 s
# here), EXTRA (more `bisect run` options). A failed run is reported and the next starts;
# exit 1 when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--table" ]; then
    exec bash scripts/llama-hunt.sh --table "${2:?--table DIR}"
fi
BISECT="${BISECT:-target/release/bisect}"
FLAGS="${FLAGS:-KV_BLOCKS NO_CHUNKED_PREFILL NO_PREFIX_CACHING MAX_NUM_SEQS}"
LOADS="${LOADS:-4 1}"
SESSIONS="${SESSIONS:-8}"
WORKLOAD="${WORKLOAD:-tiny}"
RESULTS="${RESULTS:-results/vllm-hunt}"
TIMEOUT="${TIMEOUT:-600}"
EXTRA="${EXTRA:-}"
PROFILE=targets/vllm-cpu/target.toml

[ -x "$BISECT" ] || cargo build --release || exit 1
paths=$(bash scripts/vllm-server.sh) || { echo "vllm-hunt.sh: vLLM setup failed" >&2; exit 1; }
eval "$paths"
export VLLM_PYTHON VLLM_MODEL
"$BISECT" check --target "$PROFILE" --offline >&2 || exit 1
mkdir -p "$RESULTS"
failed=0
for load in $LOADS; do
    for flag in $FLAGS; do
        echo "vllm-hunt.sh: $(date -u +%H:%M:%S) $flag at $load in flight, $SESSIONS sessions per arm" >&2
        # shellcheck disable=SC2086 # EXTRA is a list of words
        if ! "$BISECT" run --target "$PROFILE" --flag "$flag" --workload "$WORKLOAD" \
            --sessions "$SESSIONS" --concurrency "$load" --timeout "$TIMEOUT" \
            --results "$RESULTS" $EXTRA >&2; then
            echo "vllm-hunt.sh: $flag at $load in flight failed (its run.json, if any, says why)" >&2
            failed=1
        fi
    done
done
bash scripts/llama-hunt.sh --table "$RESULTS"
exit "$failed"

#!/usr/bin/env bash
# The hunt of llama.cpp issue 12253 (KV-cache defragmentation with a quantized cache
# corrupted other sequences' cache; fixed by PR 12310) from nothing: builds llama-server
# from the llama.cpp the llama-cpp-python 0.3.8 sdist vendors (7841fc7, before the fix)
# and 0.3.9's (8733e0c, after it), then A/Bs the flags of targets/llama-cpp-12253/
# (DEFRAG: threshold 0.1 vs -1; KV_TYPE: q8_0 vs f16) with `bisect run` on the
# tool-call-required `tiny` workload, on each build, at the load the machine carries and
# at 1 in flight, and prints one table row per run (scripts/llama-hunt.sh's table).
# docs/real-engines.md "Issue 12253" has what it measured.
#
# Usage: scripts/llama-12253.sh          (builds: ~20 min each on 2 cores, cached after)
# Settings (environment): BISECT (default target/release/bisect), SESSIONS (per arm,
# default 24), LOADS (default "4 1": 4 is the slots; at 8 in flight half the requests
# queue and time out on 2 cores), CTX (filler tokens, default 600: at 0 the occupied
# cache never reaches the 2048 cells a defrag needs), RUNS (default "0.3.8:DEFRAG
# 0.3.8:KV_TYPE 0.3.9:DEFRAG"), RESULTS (default results/llama-12253), TIMEOUT (default
# 900), RELEASES (default "0.3.8,0.3.9": then the release search, `bisect commits
# --releases $RELEASES --find fix`, each release made the one serve.sh runs by
# scripts/llama-12253-release.sh; 0.3.36 is left out: with the model's own template its
# server answered the tool-call probe without a call; empty: no search; RUNS= (empty)
# runs only the search), BLOCK (sessions per block of the
# search, default 12), LOAD_LEVELS (default "1,4": `bisect load --flag DEFRAG` over
# these levels on 0.3.8, 12 sessions per arm per level; empty: none), CRASH_CTX (default
# 8192: the DEFRAG A/B on 0.3.8 at this cache size, where the overrun kills the server;
# empty: none), CRASH_REPEATS (blocks per arm of that A/B, default 1; about 4 would give
# a verdict on deaths alone).
set -uo pipefail
cd "$(dirname "$0")/.."

BISECT="${BISECT:-target/release/bisect}"
SESSIONS="${SESSIONS:-24}"
LOADS="${LOADS:-4 1}"
CTX="${CTX:-600}"
RUNS="${RUNS-0.3.8:DEFRAG 0.3.8:KV_TYPE 0.3.9:DEFRAG}"
RESULTS="${RESULTS:-results/llama-12253}"
TIMEOUT="${TIMEOUT:-900}"
RELEASES="${RELEASES-0.3.8,0.3.9}"
BLOCK="${BLOCK:-12}"
LOAD_LEVELS="${LOAD_LEVELS-1,4}"
CRASH_CTX="${CRASH_CTX-8192}"
CRASH_REPEATS="${CRASH_REPEATS:-1}"
PROFILE=targets/llama-cpp-12253/target.toml
WORKLOAD=targets/llama-cpp-12253/tiny-required.toml

[ -x "$BISECT" ] || cargo build --release
failed=0
# Build (cached) the llama-server a llama-cpp-python release vendors and export its
# LLAMA_SERVER and the model's LLAMA_MODEL.
use_build() {
    local paths
    paths=$(BISECT_LLAMA_CPP_PYTHON_VERSION="$1" BISECT_LLAMA_BUILD_EXAMPLES=ON \
        bash scripts/llama-server.sh) || { echo "build of $1 failed" >&2; exit 1; }
    eval "$paths"
    export LLAMA_SERVER LLAMA_MODEL
}
for run in $RUNS; do
    version="${run%%:*}"
    flag="${run#*:}"
    use_build "$version"
    for load in $LOADS; do
        dir="$RESULTS/$version"
        echo "== llama.cpp from llama-cpp-python $version, $flag, $load in flight" >&2
        "$BISECT" run --target "$PROFILE" --flag "$flag" --workload "$WORKLOAD" \
            --sessions "$SESSIONS" --concurrency "$load" --timeout "$TIMEOUT" --ctx "$CTX" \
            --results "$dir" >&2 || { echo "run failed: $version $flag $load" >&2; failed=1; }
    done
done
if [ -n "$LOAD_LEVELS$CRASH_CTX" ]; then
    use_build 0.3.8
fi
if [ -n "$LOAD_LEVELS" ]; then
    echo "== where it starts: bisect load --flag DEFRAG --levels $LOAD_LEVELS on 0.3.8" >&2
    "$BISECT" load --target "$PROFILE" --flag DEFRAG --levels "$LOAD_LEVELS" \
        --workload "$WORKLOAD" --sessions 12 --timeout "$TIMEOUT" --ctx "$CTX" \
        --results "$RESULTS/load-0.3.8" >&2 || { echo "load sweep: exit $?" >&2; failed=1; }
fi
if [ -n "$CRASH_CTX" ]; then
    echo "== the crash: DEFRAG on 0.3.8 with a $CRASH_CTX-cell cache, $CRASH_REPEATS block(s) per arm" >&2
    "$BISECT" run --target "$PROFILE" --flag DEFRAG --set "CTX_SIZE=$CRASH_CTX" \
        --workload "$WORKLOAD" --sessions 12 --concurrency 4 --repeats "$CRASH_REPEATS" \
        --timeout "$TIMEOUT" --ctx "$CTX" --results "$RESULTS/crash-0.3.8" >&2 ||
        { echo "crash A/B: exit $?" >&2; failed=1; }
fi
if [ -n "$RELEASES" ]; then
    # serve.sh needs the model; with RUNS= no build above has printed its path.
    if [ -z "${LLAMA_MODEL:-}" ]; then
        use_build "${RELEASES%%,*}"
    fi
    # serve.sh runs the release the artifact links, not a fixed LLAMA_SERVER.
    echo "== the release that fixed it: bisect commits --releases $RELEASES --find fix" >&2
    env -u LLAMA_SERVER "$BISECT" commits --releases "$RELEASES" --find fix \
        --artifact "$PWD/scripts/llama-12253-release.sh {release}" \
        --target "$PROFILE" --workload "$WORKLOAD" --sessions "$BLOCK" --concurrency 4 \
        --timeout "$TIMEOUT" --ctx "$CTX" --results "$RESULTS/releases" >&2 ||
        { echo "release search: exit $?" >&2; failed=1; }
fi
for version_dir in "$RESULTS"/*/; do
    case "$(basename "$version_dir")" in releases | load-*) continue ;; esac
    echo "### $(basename "$version_dir")"
    bash scripts/llama-hunt.sh --table "$version_dir"
done
for summary in "$RESULTS"/load-*/*/summary.md "$RESULTS"/releases/*/summary.md; do
    [ -f "$summary" ] && sed -n '1,12p' "$summary"
done
exit "$failed"

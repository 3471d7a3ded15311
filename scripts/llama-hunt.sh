#!/usr/bin/env bash
# The real-engine hunt of docs/real-engines.md: each llama.cpp flag A/B'd with
# `bisect run` on the shipped target (targets/llama-cpp/, Qwen2.5-Coder-1.5B) and the
# `tiny` workload, once at the load the machine can carry and once at 1 in flight, then
# one table row per run (verdict, judged counts, client and engine-side peak running,
# wall time) on stdout, ready for the doc.
#
# Usage:
#   eval "$(scripts/llama-server.sh)"; export LLAMA_SERVER LLAMA_MODEL
#   scripts/llama-hunt.sh                      # every flag below, both loads
#   FLAGS="CACHE_RAM" LOADS="4" SESSIONS=12 scripts/llama-hunt.sh
#   scripts/llama-hunt.sh --table DIR          # only the table, from runs already in DIR
#
# Settings (environment): BISECT (the binary; default target/release/bisect), FLAGS,
# LOADS (sessions in flight, one run per value; default "4 1"), SESSIONS (per arm,
# default 8), WORKLOAD (default tiny), RESULTS (default results/llama-hunt), TIMEOUT (per
# request, seconds, default 300), EXTRA (more `bisect run` options, e.g. "--repeats 2").
# A run that fails is reported and the next one starts: one broken arm must not cost
# the rest of the hunt. Exit 1 when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

BISECT="${BISECT:-target/release/bisect}"
FLAGS="${FLAGS:-CACHE_RAM CACHE_TYPE_K N_PARALLEL SPEC_NGRAM_CACHE}"
LOADS="${LOADS:-4 1}"
SESSIONS="${SESSIONS:-8}"
RESULTS="${RESULTS:-results/llama-hunt}"
WORKLOAD="${WORKLOAD:-tiny}"
TIMEOUT="${TIMEOUT:-300}"
EXTRA="${EXTRA:-}"

table() {
    python3 - "$1" <<'PY'
import json, pathlib, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/run.json")):
    run = json.loads(path.read_text())
    if run.get("status") != "finished":
        rows.append(f"| {run.get('flag', {}).get('name', '?')} | ? | {run.get('status')} | {run.get('error', '')} |")
        continue
    w = run["workload"]
    conc = w.get("concurrency", w["sessions"])
    cells = []
    for arm in run["arms"]:
        c = arm["counts"]
        judged = arm["sessions"] - c.get("error", 0) - c.get("timeout", 0) - c.get("truncated", 0) - c.get("crashed", 0)
        peaks = arm.get("peak_running", {})
        engine = max((v for k, v in peaks.items() if k != "client"), default=None)
        other = ", ".join(
            f"{k} {v}" for k, v in c.items()
            if v and k not in ("done",)
        )
        # What the engine counted itself (vLLM: preemptions, its parser's outcomes).
        counted = {}
        for e in arm.get("engine_counts", []):
            counted[e["counter"]] = counted.get(e["counter"], 0) + e["count"]
        engine_said = ""
        if counted:
            engine_said = "; engine: " + ", ".join(
                f"{name.replace('_', ' ')} {n}" for name, n in sorted(counted.items())
            )
        cells.append(
            f"{arm['label']}={arm['value']}: {arm['corrupted']}/{judged} corrupted, "
            f"done {c.get('done', 0)}/{arm['sessions']}" + (f" ({other})" if other else "")
            + f"; peak {peaks.get('client')}/{engine}; {arm['wall_s']:.0f} s" + engine_said
        )
    v = run["verdict"]
    wall = run.get("phases", {}).get("wall_s")
    rows.append(
        f"| {run['flag']['name']} | {conc} | {v['status']} | "
        + " <br> ".join(cells)
        + f" | p = {run['comparison']['p_value']:.3g} | "
        + (f"{wall / 60:.1f} min" if wall else "?")
        + f" | `{run['id']}` |"
    )
print("| flag | in flight | verdict | per arm: corrupted/judged, done, peak running client/engine, arm wall | Fisher | run wall | run |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
PY
}

if [ "${1:-}" = "--table" ]; then
    table "${2:?--table DIR}"
    exit $?
fi

if [ ! -x "$BISECT" ]; then
    echo "llama-hunt.sh: no bisect binary at $BISECT: cargo build --release, or set BISECT" >&2
    exit 1
fi
: "${LLAMA_SERVER:?set LLAMA_SERVER and LLAMA_MODEL: eval \"\$(scripts/llama-server.sh)\"; export LLAMA_SERVER LLAMA_MODEL}"
: "${LLAMA_MODEL:?set LLAMA_MODEL: eval \"\$(scripts/llama-server.sh)\"; export LLAMA_SERVER LLAMA_MODEL}"
export LLAMA_SERVER LLAMA_MODEL

mkdir -p "$RESULTS"
failed=0
for load in $LOADS; do
    for flag in $FLAGS; do
        echo "llama-hunt.sh: $(date -u +%H:%M:%S) $flag at $load in flight, $SESSIONS sessions per arm" >&2
        # shellcheck disable=SC2086 # EXTRA is a list of words
        if ! "$BISECT" run --target targets/llama-cpp/target.toml --flag "$flag" \
            --workload "$WORKLOAD" --sessions "$SESSIONS" --concurrency "$load" \
            --timeout "$TIMEOUT" --results "$RESULTS" $EXTRA >&2; then
            echo "llama-hunt.sh: $flag at $load in flight failed (its run.json, if any, says why)" >&2
            failed=1
        fi
    done
done
table "$RESULTS"
exit "$failed"

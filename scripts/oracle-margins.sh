#!/usr/bin/env bash
# The solo oracle's threshold from measurement (docs/oracle.md): on a real llama-server
# with the real model (CPU, not batch-invariant) and no known bug (the llama.cpp that
# llama-cpp-python 0.3.9 vendors, after issue 12253's fix), run `bisect run --oracle solo`
# with threshold 0 (every parting with a known positive margin is reported as diverged,
# none excused) and print every first parting between a session under load and the same
# session alone: its margin in nats, and the tokens on each side. The distribution says
# where near-ties end; a second SEED is the fresh sample the chosen threshold is checked on.
#
# Usage: scripts/oracle-margins.sh
# Settings (environment): BISECT (default target/release/bisect), SESSIONS (per arm,
# default 16), LOAD (in flight, default 4: the target's slots), SEED (default 1),
# FLAG (default DEFRAG: a flag with no known bug on this build, both arms clean),
# RESULTS (default results/oracle-margins).
set -euo pipefail
cd "$(dirname "$0")/.."

BISECT="${BISECT:-target/release/bisect}"
SESSIONS="${SESSIONS:-16}"
LOAD="${LOAD:-4}"
SEED="${SEED:-1}"
FLAG="${FLAG:-DEFRAG}"
RESULTS="${RESULTS:-results/oracle-margins}"
PROFILE=targets/llama-cpp-12253/target.toml
WORKLOAD=targets/llama-cpp-12253/tiny-required.toml

[ -x "$BISECT" ] || cargo build --release
paths=$(BISECT_LLAMA_CPP_PYTHON_VERSION=0.3.9 BISECT_LLAMA_BUILD_EXAMPLES=ON \
    bash scripts/llama-server.sh)
eval "$paths"
export LLAMA_SERVER LLAMA_MODEL

"$BISECT" run --target "$PROFILE" --flag "$FLAG" --workload "$WORKLOAD" \
    --sessions "$SESSIONS" --concurrency "$LOAD" --seed "$SEED" --timeout 600 \
    --oracle solo --oracle-threshold 0 --results "$RESULTS" --json > "$RESULTS.seed$SEED.json" ||
    echo "bisect run: exit $?" >&2
run_dir="$RESULTS/$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$RESULTS.seed$SEED.json")"
python3 - "$run_dir" <<'EOF'
import json, sys
run_dir = sys.argv[1]
rows, same = [], 0
for line in open(f"{run_dir}/sessions.jsonl"):
    s = json.loads(line)
    o = s.get("oracle")
    if not o:
        continue
    if o["outcome"] == "same":
        same += 1
        # Tokens that parted though the reply the client reads stayed the same.
        p = o.get("token_parting")
        if p:
            rows.append((p["margin"], s["label"], s["index"], p["round"], p["position"], p["reference"], p["loaded"], "same reply"))
        continue
    p = o["parting"]
    rows.append((p["margin"], s["label"], s["index"], p["round"], p["position"], p["reference"], p["loaded"], s["class"]))
print(f"{run_dir}: {same} sessions with the same replies alone, {len(rows)} parted on tokens")
print("margin (nats) | arm | session | round | token | alone | under load | class")
for r in sorted(rows, key=lambda r: (r[0] is None, r[0] or 0)):
    m = "unknown" if r[0] is None else f"{r[0]:.3f}"
    print(f"{m} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]!r} | {r[6]!r} | {r[7]}")
EOF

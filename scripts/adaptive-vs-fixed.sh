#!/bin/sh
# Sequential vs fixed A/B on the embedded engine, one script, same machine, same build:
#   N x `bisect run --flag FLAG --adaptive` and M x `bisect run --flag FLAG` (80 + 80),
# then per design: verdicts, sessions per arm (mean, max), wall seconds (mean), the
# overhead fraction and health-poll padding per restart from run.json's `phases`.
# Usage: scripts/adaptive-vs-fixed.sh [N adaptive] [M fixed] [FLAG]   (needs jq)
# Prints the load average before and after: the race's rate drops when the CPUs are
# shared, so figures from a busy machine say so.
set -eu
N=${1:-10}
M=${2:-5}
FLAG=${3:-BF16_INDEX_K}
BIN=${BISECT:-target/release/bisect}
OUT=$(mktemp -d)
export XDG_STATE_HOME="$OUT/state"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # tag, extra args...
    tag=$1; shift
    "$BIN" run --flag "$FLAG" --results "$OUT/$tag" --json "$@" >/dev/null 2>"$OUT/$tag.log" ||
        { echo "run $tag failed, see $OUT/$tag.log" >&2; exit 1; }
}
i=1; while [ "$i" -le "$N" ]; do run "adaptive-$i" --adaptive; i=$((i + 1)); done
i=1; while [ "$i" -le "$M" ]; do run "fixed-$i"; i=$((i + 1)); done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
summary() { # glob label
    # shellcheck disable=SC2086
    jq -s -r --arg name "$2" '
      def mean(f): (map(f) | add / length);
      "\($name): \(length) runs; verdicts: \(map(.verdict.status) | group_by(.) | map("\(.[0]) \(length)") | join(", "));"
      + " sessions per arm: mean \(mean(.arms[0].sessions) | . * 10 | round / 10), max \(map(.arms[0].sessions) | max);"
      + " wall s: mean \(mean(.phases.wall_s) | . * 100 | round / 100), max \(map(.phases.wall_s) | max | . * 100 | round / 100);"
      + " overhead outside restart+drive: mean \(mean(.phases.overhead_fraction * 100) | . * 100 | round / 100)%;"
      + " health padding per restart: mean \(mean(.phases.health_padding_s / .phases.restarts * 1000) | . * 10 | round / 10) ms;"
      + " on corrupted: \(map("\(.arms[] | select(.label == "on") | "\(.corrupted)/\(.sessions)")") | join(" "))"
    ' $1
}
summary "$OUT/adaptive-*/*/run.json" "adaptive"
[ "$M" -gt 0 ] && summary "$OUT/fixed-*/*/run.json" "fixed 80+80"
echo "results: $OUT"

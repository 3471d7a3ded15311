#!/usr/bin/env bash
# A history of nights on the embedded engine (docs/history.md, "The shipped history"):
# a throwaway repository of the engine's launch scripts gets a few commits a day; each
# night runs the nightly matrix on that day's head (--night DATE --build SHA) and reads
# the history with --auto-bisect, as a nightly CI job would. The commits plant real
# mechanisms, not random numbers:
#   - day 4: the nightly does not run (an absent night);
#   - day 5: runs with one repeat instead of three (an under-sampled night);
#   - day 8: "trim the prefill pool to 28.2 MB": 64 sessions in flight overflow it a
#     little more, and the unsynced HiCache load-back corrupts about 3% of them: a
#     persistent 3-point regression, found by accumulation;
#   - day 14: the trim is reverted (the regression is mended once the evidence says so);
#   - day 20: the trim lands for one night only, day 21 reverts it: a single noisy night
#     of the persistent regression's size;
#   - day 22: "turn the bf16 index-K default on": 56 sessions overflow too (a large
#     regression on the 56-session cell, flagged that night; a further one on 64).
# Measured rates under these nights' conditions (three blocks back to back per cell):
# docs/history.md.
#
# usage: scripts/nightly-history.sh [BISECT] [WORKDIR]
#   BISECT   the binary (default target/release/bisect, built if absent)
#   WORKDIR  where the repository, plan and results go (default a new temp dir)
# Prints each night's history exit code; the history is WORKDIR/results/history.html.
set -euo pipefail

bisect=${1:-target/release/bisect}
work=${2:-$(mktemp -d -t bisect-history.XXXXXX)}
if [ ! -x "$bisect" ]; then
  cargo build --release --bin bisect >&2
fi
bisect=$(cd "$(dirname "$bisect")" && pwd)/$(basename "$bisect")
mkdir -p "$work"
work=$(cd "$work" && pwd)
engine="$work/engine"
results="$work/results"
rm -rf "$engine" "$results" "$work/state"
mkdir -p "$engine" "$results"
# This history's own state (locks, launch-config journals): never the user's.
export XDG_STATE_HOME="$work/state"

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
pick_port() {
  local p=$1
  while ! port_free "$p"; do p=$((p + 1)); done
  [ "$p" -lt "$ephemeral_low" ] || { echo "no free port below $ephemeral_low" >&2; exit 1; }
  echo "$p"
}
prefill_port=$(pick_port 22100)
decode_port=$(pick_port $((prefill_port + 1)))

# The engine's launch scripts at the good end: fp8 index-K, HiCache without the sync
# fix, the default prefill pool (29 MiB).
cat >"$engine/prefill.sh" <<EOF
#!/bin/sh
export SGLANG_DSV4_BF16_INDEX_K=0
export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=0
export SGLANG_OPT_USE_TOPK_V2=1
exec $bisect engine --role prefill --host 127.0.0.1 --port $prefill_port --enable-hierarchical-cache --pool-bytes 30408704
EOF
cat >"$engine/decode.sh" <<EOF
#!/bin/sh
export SGLANG_DSV4_BF16_INDEX_K=0
export SGLANG_SM120_MMA_FLASHMLA=1
export SGLANG_OPT_USE_TOPK_V2=1
exec $bisect engine --role decode --host 127.0.0.1 --port $decode_port --prefill-url http://127.0.0.1:$prefill_port --cuda-graph-max-bs 32
EOF
cat >"$work/target.toml" <<EOF
name = "engine-repo"
api = "http://127.0.0.1:$decode_port/v1"
model = "bisect-mini-dsv4"
engine = "embedded"
[[role]]
name = "prefill"
launch = "$engine/prefill.sh"
health = "http://127.0.0.1:$prefill_port/health"
metrics = "http://127.0.0.1:$prefill_port/metrics"
[[role]]
name = "decode"
launch = "$engine/decode.sh"
health = "http://127.0.0.1:$decode_port/health"
metrics = "http://127.0.0.1:$decode_port/metrics"
EOF

# The nightly plan: 32, 56 and 64 sessions in flight, three blocks each (TOPK_V2 = 1 is
# the deployment's value of a control flag); [commits] tells --auto-bisect how to search
# the builds.
plan_text() {
  cat <<EOF
name = "nightly-history"
target = "target.toml"
workload = "agentic"
ctx = 450
sessions = [32, 56, 64]
repeats = $1
alpha = 0.01
min_effect = 0.05
tokens_per_s_noise = 0.5
[axes]
TOPK_V2 = ["1"]
[commits]
repo = "engine"
build = "sh -n prefill.sh && sh -n decode.sh"
max_sessions = 2000
EOF
}
plan_text 3 >"$work/plan.toml"
plan_text 1 >"$work/plan-one-repeat.toml"

g() { git -C "$engine" -c user.name=ci -c user.email=ci@example.invalid -c commit.gpgsign=false "$@"; }
g init -q -b main
echo notes >"$engine/NOTES"
g add -A
g commit -qm "good: the engine's launch scripts"

# day N: two unrelated commits, then the day's change (if any) between them.
unrelated() { echo "day $1 change $2" >>"$engine/NOTES"; g commit -qam "day $1: change $2"; }
set_pool() { sed -i "s/--pool-bytes [0-9]*/--pool-bytes $1/" "$engine/prefill.sh"; g commit -qam "$2"; }
bf16_on() {
  sed -i 's/SGLANG_DSV4_BF16_INDEX_K=0/SGLANG_DSV4_BF16_INDEX_K=1/' "$engine/prefill.sh" "$engine/decode.sh"
  g commit -qam "turn the bf16 index-K default on (needle recall)"
}

echo "night        build       history exit"
for day in $(seq 1 23); do
  date=$(date -u -d "2026-11-12 + $day day" +%F)
  unrelated "$day" 1
  case $day in
    8) set_pool 28200000 "prefill: trim the pool to 28.2 MB (headroom for the sampler)" ;;
    14) set_pool 30408704 "revert the prefill pool trim" ;;
    20) set_pool 28200000 "prefill: trim the pool to 28.2 MB again" ;;
    21) set_pool 30408704 "revert the prefill pool trim again" ;;
    22) bf16_on ;;
  esac
  unrelated "$day" 2
  sha=$(g rev-parse HEAD)
  if [ "$day" = 4 ]; then
    echo "$date   (absent: the nightly did not run)"
    continue
  fi
  plan="$work/plan.toml"
  [ "$day" = 5 ] && plan="$work/plan-one-repeat.toml"
  (cd "$work" && "$bisect" matrix "$plan" --night "$date" --build "$sha" \
    --results "$results" >"$work/night-$date.out" 2>"$work/night-$date.err") || true
  set +e
  (cd "$work" && "$bisect" history "$results" --auto-bisect \
    >"$work/history-$date.out" 2>"$work/history-$date.err")
  rc=$?
  set -e
  echo "$date   ${sha:0:10}  $rc"
done
echo "history: $results/history.html"

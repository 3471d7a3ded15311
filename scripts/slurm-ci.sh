#!/usr/bin/env bash
# The matrix's Slurm path, for real (docs/matrix.md, "Slurm job array"): starts a
# one-node Slurm cluster (munged, slurmctld, slurmd) from a generated slurm.conf in a
# temporary directory, submits a plan's shards as a job array with the documented
# scripts (scripts/slurm/*.sbatch, the very files docs/matrix.md shows), the merge job
# with --dependency=afterok on the array, prints the array's task ids and exit codes,
# then runs the same plan unsharded and compares the merged matrix.json with it, cell
# for cell, measurement fields excepted; then runs `bisect commits --parallel 3` on a
# throwaway engine repository, each round an array bisect submits itself, and checks
# that it names the culprit commit. Exits non-zero on any difference or failure;
# stops the daemons and removes the directory on every path.
#
# Usage (as root, Debian 12; installs slurm-wlm, munge and jq when missing):
#   scripts/slurm-ci.sh BISECT [PLAN]      BISECT: a release build of bisect
#                                          PLAN: default plans/ci-slurm.toml
# Environment: BISECT and SLURM_CI_PLAN instead of the arguments; SLURM_CI_KEEP=1 keeps
# the directory; SLURM_CI_TIMEOUT (seconds, default 240) bounds the wait for the jobs.
# It builds nothing. Nothing outside its temporary directory is written.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bisect=${1:-${BISECT:-}}
plan=${2:-${SLURM_CI_PLAN:-$repo/plans/ci-slurm.toml}}
shards=3
timeout_s=${SLURM_CI_TIMEOUT:-240}

die() {
  echo "slurm-ci: $*" >&2
  exit 2
}
[ -n "$bisect" ] || die "no bisect binary: pass its path (e.g. target/release/bisect) or set BISECT"
bisect=$(realpath "$bisect")
[ -x "$bisect" ] || die "$bisect is not an executable: build it first (cargo build --release)"
plan=$(realpath "$plan")
[ -f "$plan" ] || die "$plan: no such plan"
[ "$(id -u)" = 0 ] || die "run as root: it starts munged, slurmctld and slurmd"

started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started))s"; }

missing=()
for tool in munged mungekey slurmctld slurmd sbatch squeue scontrol jq; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing slurm-wlm, munge, jq (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge jq >/dev/null
fi
slurmctld -V

work=$(mktemp -d /tmp/bisect-slurm-ci.XXXXXX)
# munged runs as the munge user, which must reach its directory below this one.
chmod 755 "$work"
daemons=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${night:-}" ] && [ -z "${jobs_done:-}" ]; then
    scancel --quiet "$night" ${merge:+"$merge"} >/dev/null 2>&1 || true
  fi
  # Reverse start order: slurmd, slurmctld, munged.
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    kill -TERM "${daemons[$i]}" 2>/dev/null || true
  done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$rc" != 0 ]; then
    for log in "$work"/log/* "$work"/munge/munged.log "$work"/run/slurm-*.out; do
      [ -f "$log" ] || continue
      echo "--- $log (last 40 lines)" >&2
      tail -n 40 "$log" >&2
    done
  fi
  if [ "${SLURM_CI_KEEP:-0}" = 1 ]; then
    echo "kept $work"
  else
    rm -rf "$work"
  fi
  echo "slurm-ci: exit $rc after $(elapsed)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work"/{munge,munge-socket,log,state,spool,run}

# A port pair nothing listens on (6817/6818 unless a Slurm already runs here).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ctld_port=6817
while ! port_free "$ctld_port" || ! port_free $((ctld_port + 1)); do
  ctld_port=$((ctld_port + 1000))
  [ "$ctld_port" -lt 40000 ] || die "no free port pair for slurmctld/slurmd"
done

echo "== munge"
# Key private to munge; the socket's directory open to every client (munged insists).
chown munge:munge "$work/munge" "$work/munge-socket"
chmod 700 "$work/munge"
chmod 755 "$work/munge-socket"
mungekey --create --keyfile="$work/munge/munge.key"
chown munge:munge "$work/munge/munge.key"
chmod 400 "$work/munge/munge.key"
socket="$work/munge-socket/munge.socket"
setpriv --reuid=munge --regid=munge --init-groups \
  munged --foreground --key-file="$work/munge/munge.key" --socket="$socket" \
  --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/munged.seed" \
  --log-file="$work/munge/munged.log" >"$work/log/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
[ -S "$socket" ] || die "munged did not create $socket (log: $work/munge/munged.log)"

echo "== slurm.conf (one node, this machine's CPUs and memory)"
node=ci-node
# slurmctld runs only on the host slurm.conf names as the controller: this one.
ctld_host=$(hostname -s)
# `slurmd -C` prints this machine's NodeName line; keep its CPU layout and memory.
hw=$(slurmd -C | head -n 1 | cut -d' ' -f2-)
export SLURM_CONF="$work/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=bisectci
SlurmctldHost=$ctld_host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$work/log/jobcomp.txt
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
grep '^NodeName' "$SLURM_CONF"

echo "== slurmctld, slurmd"
slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -N "$node" -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
daemons+=($!)
for _ in $(seq 300); do
  state=$(scontrol show node "$node" 2>/dev/null | sed -n 's/.*State=\([A-Z+]*\).*/\1/p' | head -n 1)
  [ "$state" = IDLE ] && break
  sleep 0.2
done
[ "${state:-}" = IDLE ] || die "node $node never became idle (state ${state:-unknown}); see $work/log"
sinfo
echo "cluster up after $(elapsed)"

echo "== sbatch: the shard array, then the merge (afterok)"
# The documented scripts as they are; where they read the binary, the plan and the
# shard count from the environment (sbatch exports it), this run sets them.
export BISECT="$bisect" PLAN="$plan" SHARDS="$shards" BISECT_NODE_STATE="$work/node-state"
run="$work/run"
submit_started=$(date +%s)
night=$(sbatch --parsable --chdir="$run" --output="$run/slurm-%A_%a.out" \
  "$repo/scripts/slurm/nightly-shards.sbatch")
night=${night%%;*}
merge=$(sbatch --parsable --dependency="afterok:$night" --export="ALL,NIGHT=$night" \
  --chdir="$run" --output="$run/slurm-%j-merge.out" "$repo/scripts/slurm/nightly-merge.sbatch")
merge=${merge%%;*}
echo "array job $night, merge job $merge"
scontrol show job -o "$merge" | tr ' ' '\n' | grep -E '^(JobId|JobName|JobState|Reason|Dependency)=' | paste -sd' '
seen=""
deadline=$(($(date +%s) + timeout_s))
while :; do
  queue=$(squeue -h -r -j "$night,$merge" -o '%i %T %R' 2>/dev/null || true)
  if [ "$queue" != "$seen" ] && [ -n "$queue" ]; then
    echo "[$(($(date +%s) - submit_started))s] squeue:"
    sed 's/^/  /' <<<"$queue"
    seen=$queue
  fi
  [ -z "$queue" ] && break
  # A shard failed: the merge can never run (Slurm keeps it pending); stop waiting.
  grep -q DependencyNeverSatisfied <<<"$queue" && break
  [ "$(date +%s)" -lt "$deadline" ] || die "jobs still queued or running after ${timeout_s}s"
  sleep 0.5
done
slurm_s=$(($(date +%s) - submit_started))
jobs_done=1

echo "== array tasks (scontrol and the job completion log)"
scontrol show job -o "$night" | tr ' ' '\n' |
  grep -E '^(JobId|ArrayJobId|ArrayTaskId|JobState|ExitCode|StartTime|EndTime|NodeList)=' |
  paste -sd' ' | sed 's/ JobId=/\nJobId=/g'
scontrol show job -o "$merge" | tr ' ' '\n' |
  grep -E '^(JobId|JobName|JobState|ExitCode|Dependency)=' | paste -sd' '
echo "jobcomp.txt:"
grep -E "ArrayJobId=$night " "$work/log/jobcomp.txt" |
  sed -E 's/^(JobId=[0-9]+).* (JobState=[A-Z]+).* (ArrayJobId=[0-9]+) (ArrayTaskId=[0-9]+).* (ExitCode=[0-9:]+).*/  \1 \3 \4 \2 \5/' || true
failed=$({ scontrol show job -o "$night"; scontrol show job -o "$merge"; } | grep -cv 'JobState=COMPLETED' || true)
for out in "$run"/slurm-*.out; do
  echo "${out#"$run"/}: $(grep -E 'cells, results:|^results:' "$out" | head -n 1)"
done
[ "$failed" = 0 ] || die "$failed job(s) of the array or the merge did not complete"
merged="$run/results/night-$night"
[ -f "$merged/matrix.json" ] || die "the merge job wrote no $merged/matrix.json"
echo "shards + merge through Slurm: ${slurm_s}s"

echo "== the same plan unsharded"
unsharded_started=$(date +%s)
XDG_STATE_HOME="$work/node-state" "$bisect" matrix "$plan" --results "$run/unsharded" \
  --no-baseline >"$run/unsharded.out" 2>&1 || {
  cat "$run/unsharded.out" >&2
  die "the unsharded run failed"
}
whole=$(echo "$run"/unsharded/*-matrix-*/matrix.json)
[ -f "$whole" ] || die "the unsharded run wrote no matrix.json"
echo "unsharded: $(($(date +%s) - unsharded_started))s"

echo "== merged vs unsharded"
# What must be equal (docs/matrix.md, merge.rs): the plan's identity and cell list, the
# workload hash and every cell field except the measurements of one execution (wall,
# tokens/s, health wait, peak concurrency, connect times, the load gap, the trend's bins,
# a canary's task and times, how often the poller found a role busy, how long the engine
# counted itself busy, what the flags' mechanism witnesses counted) and the baseline
# comparison.
cells='{plan: {name: .plan.name, hash: .plan.hash, cells: .plan.cells},
        workload_hash, shard,
        cells: [.cells[] | del(.wall_s, .tokens_per_s, .health_wait_s, .peak_running, .comparison, .transport, .load_gap, .trend, .canaries, .busy_samples, .mechanisms)
                | if .engine_counts then .engine_counts |= map(select(.counter != "busy_ms")) else . end]}'
jq -S "$cells" "$merged/matrix.json" >"$run/merged.cells.json"
jq -S "$cells" "$whole" >"$run/unsharded.cells.json"
n=$(jq '.cells | length' "$run/merged.cells.json")
sessions=$(jq '[.cells[].counts | add] | add' "$run/merged.cells.json")
if diff -u "$run/unsharded.cells.json" "$run/merged.cells.json"; then
  echo "identical: $n cells ($sessions sessions) of the merged matrix equal the unsharded run's"
else
  die "the merged matrix differs from the unsharded run (diff above: - unsharded, + merged)"
fi
jq -r '.cells[] | "  \(.id): \(.status), \(.corrupted)/\(.counts | add) corrupted, engines report \(.effective | tostring)"' \
  "$run/merged.cells.json"
echo "== bisect commits --parallel 3: rounds as job arrays on the same cluster"
# A throwaway engine repository (docs/commits.md, "Slurm"): the embedded engine's two
# launch scripts at the good end with bf16 index-K off, 16 commits, commit 11 turning it
# on. Each round of the search is one array that bisect submits itself. --exclusive:
# the scripts carry fixed ports and this cluster is one node (on a cluster, tasks on
# separate nodes run side by side).
engine="$work/engine"
mkdir -p "$engine"
# Below the kernel's ephemeral range: a port in it can be any connection's local end
# (slurmd's, munge's, a driver's), and the engine could not bind it.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
pick_port() {
  local p=$1
  while ! port_free "$p"; do p=$((p + 1)); done
  [ "$p" -lt "$ephemeral_low" ] || die "no free port below the ephemeral range ($ephemeral_low)"
  echo "$p"
}
prefill_port=$(pick_port 21100)
decode_port=$(pick_port $((prefill_port + 1)))
cat >"$engine/prefill.sh" <<EOF
#!/bin/sh
export SGLANG_DSV4_BF16_INDEX_K=0
export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=0
export SGLANG_OPT_USE_TOPK_V2=1
exec $bisect engine --role prefill --host 127.0.0.1 --port $prefill_port --enable-hierarchical-cache
EOF
cat >"$engine/decode.sh" <<EOF
#!/bin/sh
export SGLANG_DSV4_BF16_INDEX_K=0
export SGLANG_SM120_MMA_FLASHMLA=1
export SGLANG_OPT_USE_TOPK_V2=1
exec $bisect engine --role decode --host 127.0.0.1 --port $decode_port --prefill-url http://127.0.0.1:$prefill_port --cuda-graph-max-bs 32
EOF
cat >"$work/engine-target.toml" <<EOF
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
g() { git -C "$engine" -c user.name=ci -c user.email=ci@example.invalid -c commit.gpgsign=false "$@"; }
g init -q -b main
echo notes >"$engine/NOTES"
g add -A
g commit -qm "good: the engine's launch scripts"
for i in $(seq 1 16); do
  if [ "$i" = 11 ]; then
    sed -i 's/SGLANG_DSV4_BF16_INDEX_K=0/SGLANG_DSV4_BF16_INDEX_K=1/' "$engine/prefill.sh" "$engine/decode.sh"
    g commit -qam "turn the bf16 index-K default on"
    culprit_sha=$(g rev-parse HEAD)
  else
    echo "change $i" >>"$engine/NOTES"
    g commit -qam "change $i"
  fi
done
commits_started=$(date +%s)
set +e
(cd "$run" && XDG_STATE_HOME="$work/node-state" timeout 900 "$bisect" commits --repo "$engine" \
  main~16 main --build 'sh -n prefill.sh && sh -n decode.sh' --target "$work/engine-target.toml" \
  --concurrency 80 --parallel 3 --sbatch=--exclusive --results "$run/commits" --json \
  >"$run/commits.json" 2>"$run/commits.err")
commits_rc=$?
set -e
grep -E 'Slurm array job|raises|untestable' "$run/commits.err" | sed 's/^/  /' | head -n 60
[ "$commits_rc" = 0 ] || {
  tail -n 40 "$run/commits.err" >&2
  jq -r '"verdict: \(.verdict)", (.steps[] | "  step \(.step) commit \(.commit): \(.observation | tostring)")' \
    "$run/commits.json" >&2 || true
  for out in "$run"/commits/*/rounds/*/task-*.out; do
    [ -f "$out" ] && { echo "--- $out" >&2; tail -n 5 "$out" >&2; }
  done
  die "bisect commits --parallel exited $commits_rc (0: culprit found and verified)"
}
search=$(dirname "$(echo "$run"/commits/*/commits.json)")
echo "rounds (one job array each):"
for r in "$search"/rounds/s*; do
  echo "  $(basename "$r"): $(jq -r '[.steps[] | "commit \(.commit) (\(.purpose))"] | join(", ")' "$r/tasks.json")"
done
jq -r '"answer: \(.answer); \(.verdict)"' "$run/commits.json"
[ "$(jq -r .culprit.sha "$run/commits.json")" = "$culprit_sha" ] ||
  die "bisect commits named $(jq -r .culprit.sha "$run/commits.json"), the culprit is $culprit_sha"
steps=$(jq '.steps | length' "$run/commits.json")
rounds=$(find "$search/rounds" -mindepth 1 -maxdepth 1 -type d | wc -l)
[ -z "$(git -C "$engine" worktree list | sed -n 2p)" ] || die "worktrees were left in $engine"
echo "bisect commits --parallel 3: culprit commit 11 found and verified, $steps blocks in $rounds rounds through Slurm, $(($(date +%s) - commits_started))s"
echo "slurm-ci: OK in $(elapsed)"

#!/bin/bash
# Replicas vs serial arms on a latency-bound engine, one script, same machine, same build.
#
# The engine is the mock (`bisect mock-engine --token-delay-ms D`): each reply sleeps D ms
# per token of its call, so its time is decode latency, not this machine's CPU, and two of
# them run side by side at their own pace. Two targets over the same two launch configs:
#   serial:   one set (serve-a.sh), --repeats 2: on, off, off, on, one after another;
#   replicas: sets a and b ([[replica]]), --repeats 2: (on a | off b), then (off a | on b).
# Same flag (LEAK: a third of the sessions leak markup in round 1, a known implicated), same
# sessions and load. Pairs run alternately, serial first, PAIRS times; prints each pair's
# wall seconds and ratio (replicas / serial), the median ratio, and both designs' verdicts.
# Then the planted difference: replica b's build corrupts a quarter of its sessions
# whatever the flag (--wrong-args-every 4), flag NOTHING (read by no one): the replica
# confound and the arms' rates, with and without the plant. Between them, a matrix of four
# restart groups on one set and on both at once (its groups dealt to the sets): walls,
# engine-seconds and each cell's corrupted count (the same sessions: the same counts).
# Then a fixed A/B load sweep on one set and on both (its levels dealt to the sets), a
# culprit search (LEAK and NOTHING found at their `on` values, at 8 in flight) on one set
# and with every block split over both, and
# a commits search over a scripted repository of both sets' launch scripts (LEAK
# turned on by commit 11 of 16) on one set and on both (each round's commits dealt to
# the sets): answers, steps, sessions, restarts, walls and engine-seconds.
#
# Usage: scripts/bench-replicas.sh [PAIRS] [TOKEN_DELAY_MS] [SESSIONS]   (needs jq)
# PARTS=run,matrix,load,culprit,commits,planted (the default: all) picks the parts, in that order.
set -euo pipefail
PAIRS=${1:-3}
DELAY=${2:-20}
SESSIONS=${3:-24}
PARTS=${PARTS:-run,matrix,load,culprit,commits,planted}
BIN=$(realpath "${BISECT:-target/release/bisect}")
OUT=$(mktemp -d)
export XDG_STATE_HOME="$OUT/state"
port() { # a free loopback port below the ephemeral range
    python3 -c 'import socket,random
for _ in range(200):
    p=random.randint(20000,30000); s=socket.socket()
    try: s.bind(("127.0.0.1",p)); s.close(); print(p); break
    except OSError: pass'
}
make_target() { # DIR PLANT_B [LEAK NOTHING]: the flags' values in the launch configs (0 0)
    local dir=$1 plant=$2 leak=${3:-0} nothing=${4:-0} a b
    mkdir -p "$dir/flags"
    a=$(port); b=$(port)
    while [ "$b" = "$a" ]; do b=$(port); done
    for set in a b; do
        local p=$a extra=""
        [ "$set" = b ] && p=$b && extra=$plant
        printf '#!/bin/sh\nexport BISECT_MOCK_LEAK_FIRST_ROUND=%s\nexport BISECT_MOCK_NOTHING=%s\nexec %s mock-engine --port %s --token-delay-ms %s %s\n' \
            "$leak" "$nothing" "$BIN" "$p" "$DELAY" "$extra" >"$dir/serve-$set.sh"
    done
    printf 'doc = "round 1 of the sessions with crc32 %% M == 0 leaks DSML markup"\nenv = "BISECT_MOCK_LEAK_FIRST_ROUND"\nroles = ["server"]\non = "3"\noff = "0"\n' >"$dir/flags/LEAK.toml"
    printf 'doc = "read by no one"\nenv = "BISECT_MOCK_NOTHING"\nroles = ["server"]\non = "1"\noff = "0"\n' >"$dir/flags/NOTHING.toml"
    role() { # SET PORT
        printf 'name = "server"\nlaunch = "serve-%s.sh"\nhealth = "http://127.0.0.1:%s/health"\nmetrics = "http://127.0.0.1:%s/metrics"\nhealth_timeout_s = 30\n' "$1" "$2" "$2"
    }
    { printf 'name = "mock-serial"\napi = "http://127.0.0.1:%s/v1"\nmodel = "mock"\nflags_dir = "flags"\n\n[[role]]\n' "$a"; role a "$a"; } >"$dir/serial.toml"
    { printf 'name = "mock-replicas"\napi = "http://127.0.0.1:%s/v1"\nmodel = "mock"\nflags_dir = "flags"\n\n[[role]]\n' "$a"; role a "$a"
      printf '\n[[replica]]\nname = "b"\napi = "http://127.0.0.1:%s/v1"\n\n[[replica.role]]\n' "$b"; role b "$b"; } >"$dir/replicas.toml"
}
run() { # TARGET FLAG TAG [REPEATS]
    local target=$1 flag=$2 tag=$3 repeats=${4:-2}
    "$BIN" run --flag "$flag" --workload smoke --sessions "$SESSIONS" --concurrency 6 --repeats "$repeats" \
        --target "$target" --results "$OUT/results" --tag "$tag" --json >"$OUT/$tag.json" 2>"$OUT/$tag.log" ||
        { echo "run $tag failed, see $OUT/$tag.log" >&2; exit 1; }
}
median() { # LABEL RATIO...: the median ratio, its count and range
    local label=$1
    shift
    printf '%s\n' "$@" | sort -g | awk -v label="$label" '{a[NR]=$1} END {printf "median %s: %.3f over %d (min %.3f, max %.3f)\n", label, a[int((NR+1)/2)], NR, a[1], a[NR]}'
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mock engine: ${DELAY} ms per token; smoke workload, $SESSIONS sessions x 4 rounds per block at 6 in flight, 2 pairs"
make_target "$OUT/t" ""
part_run() {
ratios=()
for i in $(seq "$PAIRS"); do
    run "$OUT/t/serial.toml" LEAK "serial-$i"
    run "$OUT/t/replicas.toml" LEAK "replicas-$i"
    s=$(jq '.phases.wall_s' "$OUT/serial-$i.json")
    r=$(jq '.phases.wall_s' "$OUT/replicas-$i.json")
    ratio=$(jq -n "$r / $s")
    ratios+=("$ratio")
    printf 'pair %s: serial %.1f s (%s), replicas %.1f s (%s), ratio %.3f\n' "$i" "$s" \
        "$(jq -r '.verdict.status' "$OUT/serial-$i.json")" "$r" "$(jq -r '.verdict.status' "$OUT/replicas-$i.json")" "$ratio"
done
median "ratio (replicas / serial wall)" "${ratios[@]}"
for d in serial replicas; do
    jq -s -r --arg d "$d" '"\($d): verdicts \(map(.verdict.status) | group_by(.) | map("\(.[0]) \(length)") | join(", ")); on \(.[0].arms[0].counts | tostring), off \(.[0].arms[1].counts | tostring); cost \(.[0].cost.restarts) restarts, \(.[0].cost.engine_hours * 3600 | . * 10 | round / 10) engine-seconds"' "$OUT"/$d-*.json
done
}
part_matrix() {
echo "== a matrix (LEAK x NOTHING, 4 restart groups of $SESSIONS sessions all in flight): one set vs both sets at once"
for d in serial replicas; do
    printf 'name = "bench-%s"\ntarget = "%s.toml"\nworkload = "smoke"\nflags_dir = ["flags"]\nsessions = [%s]\n\n[axes]\nLEAK = ["3", "0"]\nNOTHING = ["0", "1"]\n' \
        "$d" "$d" "$SESSIONS" >"$OUT/t/plan-$d.toml"
done
mratios=()
for i in $(seq "$PAIRS"); do
    for d in serial replicas; do
        "$BIN" matrix "$OUT/t/plan-$d.toml" --results "$OUT/matrix" --no-baseline --json >"$OUT/matrix-$d-$i.json" 2>"$OUT/matrix-$d-$i.log" ||
            { echo "matrix $d failed, see $OUT/matrix-$d-$i.log" >&2; exit 1; }
    done
    s=$(jq '.cost.wall_s' "$OUT/matrix-serial-$i.json")
    r=$(jq '.cost.wall_s' "$OUT/matrix-replicas-$i.json")
    ratio=$(jq -n "$r / $s")
    mratios+=("$ratio")
    printf 'matrix %s: one set %.1f s (%s engine-seconds), two sets %.1f s (%s engine-seconds), ratio %.3f; cells corrupted %s vs %s\n' "$i" "$s" \
        "$(jq '.cost.engine_hours * 3600 | round' "$OUT/matrix-serial-$i.json")" "$r" \
        "$(jq '.cost.engine_hours * 3600 | round' "$OUT/matrix-replicas-$i.json")" "$ratio" \
        "$(jq -c '[.cells[] | .corrupted]' "$OUT/matrix-serial-$i.json")" "$(jq -c '[.cells[] | .corrupted]' "$OUT/matrix-replicas-$i.json")"
done
median "matrix ratio (two sets / one set wall)" "${mratios[@]}"
}
part_load() {
echo "== a load sweep (--flag LEAK, levels 2,4,6,8, $SESSIONS sessions a block): one set vs two sets, the levels dealt to the sets"
lratios=()
for i in $(seq "$PAIRS"); do
    for d in serial replicas; do
        "$BIN" load --flag LEAK --levels 2,4,6,8 --sessions "$SESSIONS" --workload smoke --target "$OUT/t/$d.toml" \
            --results "$OUT/load" --json >"$OUT/load-$d-$i.json" 2>"$OUT/load-$d-$i.log" ||
            { echo "load $d failed, see $OUT/load-$d-$i.log" >&2; exit 1; }
    done
    s=$(jq '.cost.wall_s' "$OUT/load-serial-$i.json")
    r=$(jq '.cost.wall_s' "$OUT/load-replicas-$i.json")
    ratio=$(jq -n "$r / $s")
    lratios+=("$ratio")
    printf 'load %s: one set %.1f s (%s engine-seconds), two sets %.1f s (%s engine-seconds), ratio %.3f; levels (on, off corrupted) %s vs %s; answers: %s | %s\n' "$i" "$s" \
        "$(jq '.cost.engine_hours * 3600 | round' "$OUT/load-serial-$i.json")" "$r" \
        "$(jq '.cost.engine_hours * 3600 | round' "$OUT/load-replicas-$i.json")" "$ratio" \
        "$(jq -c '[.report.levels[] | [.arm.corrupted, .off.corrupted]]' "$OUT/load-serial-$i.json")" \
        "$(jq -c '[.report.levels[] | [.arm.corrupted, .off.corrupted]]' "$OUT/load-replicas-$i.json")" \
        "$(jq -r '.report.answer.kind + " " + (.report.answer.level // "-" | tostring)' "$OUT/load-serial-$i.json")" \
        "$(jq -r '.report.answer.kind + " " + (.report.answer.level // "-" | tostring)' "$OUT/load-replicas-$i.json")"
done
median "load ratio (two sets / one set wall)" "${lratios[@]}"
}
part_culprit() {
echo "== a culprit search (--flags LEAK,NOTHING, found at 3 and 1; blocks of 80 sessions at 8 in flight): one set vs every block split over two sets"
make_target "$OUT/c" "" 3 1
cratios=()
for i in $(seq "$PAIRS"); do
    for d in serial replicas; do
        "$BIN" culprit --flags LEAK,NOTHING --workload smoke --concurrency 8 --target "$OUT/c/$d.toml" \
            --results "$OUT/culprit" --json >"$OUT/culprit-$d-$i.json" 2>"$OUT/culprit-$d-$i.log" ||
            { echo "culprit $d failed, see $OUT/culprit-$d-$i.log" >&2; exit 1; }
    done
    s=$(jq '.cost.wall_s' "$OUT/culprit-serial-$i.json")
    r=$(jq '.cost.wall_s' "$OUT/culprit-replicas-$i.json")
    ratio=$(jq -n "$r / $s")
    cratios+=("$ratio")
    summary() { jq -r '"\(.blocks | length) blocks, \(.sessions_spent) sessions, \(.restarts) restarts, \(.cost.engine_hours * 3600 | round) engine-seconds; \(.answer) \([.culprit[].flag] | join(","))"' "$1"; }
    printf 'culprit %s: one set %.1f s (%s), two sets %.1f s (%s), ratio %.3f\n' "$i" "$s" \
        "$(summary "$OUT/culprit-serial-$i.json")" "$r" "$(summary "$OUT/culprit-replicas-$i.json")" "$ratio"
done
median "culprit ratio (two sets / one set wall)" "${cratios[@]}"
}
part_commits() {
echo "== a commits search (16 commits, LEAK turned on by commit 11): one set vs two sets, each round's commits dealt to the sets"
repo="$OUT/repo"
make_target "$repo" ""
git -C "$repo" init -q -b main
git_c() { git -C "$repo" -c user.name=b -c user.email=b@example.invalid -c commit.gpgsign=false "$@"; }
echo notes >"$repo/NOTES"
git_c add -A
git_c commit -q -m good
for i in $(seq 16); do
    if [ "$i" = 11 ]; then
        sed -i 's/BISECT_MOCK_LEAK_FIRST_ROUND=0/BISECT_MOCK_LEAK_FIRST_ROUND=3/' "$repo/serve-a.sh" "$repo/serve-b.sh"
    else
        echo "change $i" >"$repo/NOTES"
    fi
    git_c commit -q -am "change $i"
done
cratios=()
for i in $(seq "$PAIRS"); do
    for d in serial replicas; do
        (cd "$OUT" && "$BIN" commits --repo repo main~16 main --build 'sh -n serve-a.sh && sh -n serve-b.sh' \
            --target "repo/$d.toml" --workload smoke --sessions "$SESSIONS" --concurrency 6 \
            --results "$OUT/commits" --json >"$OUT/commits-$d-$i.json" 2>"$OUT/commits-$d-$i.log") ||
            { echo "commits $d failed, see $OUT/commits-$d-$i.log" >&2; exit 1; }
    done
    s=$(jq '.cost.wall_s' "$OUT/commits-serial-$i.json")
    r=$(jq '.cost.wall_s' "$OUT/commits-replicas-$i.json")
    ratio=$(jq -n "$r / $s")
    cratios+=("$ratio")
    for d in serial replicas; do
        jq -r --arg d "$d" '"commits \($d): \(.answer) \(.culprit.subject // "-"); \(.steps | length) steps, \(.sessions_spent) sessions, \(.cost.restarts) restarts, \(.cost.wall_s | round) s wall, \(.cost.engine_hours * 3600 | round) engine-seconds"' "$OUT/commits-$d-$i.json"
    done
    printf 'commits %s: ratio %.3f (two sets / one set wall)\n' "$i" "$ratio"
done
median "commits ratio (two sets / one set wall)" "${cratios[@]}"
}
part_planted() {
echo "== planted difference: replica b corrupts a quarter of its sessions whatever the flag"
make_target "$OUT/p" "--wrong-args-every 4"
run "$OUT/t/replicas.toml" NOTHING "clean-nothing"
run "$OUT/p/replicas.toml" NOTHING "planted-nothing"
run "$OUT/p/replicas.toml" LEAK "planted-leak"
run "$OUT/p/replicas.toml" NOTHING "planted-nothing-one-pair" 1
for tag in clean-nothing planted-nothing planted-leak planted-nothing-one-pair; do
    jq -r --arg t "$tag" '"\($t): \(.verdict.status); on \(.arms[0].corrupted)/\(.arms[0].sessions) off \(.arms[1].corrupted)/\(.arms[1].sessions); replica confound [\(.confounds[] | select(.name == "replica") | .severity)]: \(.confounds[] | select(.name == "replica") | .note)"' "$OUT/$tag.json"
done
}
for part in ${PARTS//,/ }; do "part_$part"; done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${KEEP:-}" ] && echo "kept: $OUT" || rm -rf "$OUT"

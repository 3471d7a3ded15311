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
# confound and the arms' rates, with and without the plant.
#
# Usage: scripts/bench-replicas.sh [PAIRS] [TOKEN_DELAY_MS] [SESSIONS]   (needs jq)
set -euo pipefail
PAIRS=${1:-3}
DELAY=${2:-20}
SESSIONS=${3:-24}
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
make_target() { # DIR PLANT_B
    local dir=$1 plant=$2 a b
    mkdir -p "$dir/flags"
    a=$(port); b=$(port)
    while [ "$b" = "$a" ]; do b=$(port); done
    for set in a b; do
        local p=$a extra=""
        [ "$set" = b ] && p=$b && extra=$plant
        printf '#!/bin/sh\nexport BISECT_MOCK_LEAK_FIRST_ROUND=0\nexport BISECT_MOCK_NOTHING=0\nexec %s mock-engine --port %s --token-delay-ms %s %s\n' \
            "$BIN" "$p" "$DELAY" "$extra" >"$dir/serve-$set.sh"
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
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mock engine: ${DELAY} ms per token; smoke workload, $SESSIONS sessions x 4 rounds per block at 6 in flight, 2 pairs"
make_target "$OUT/t" ""
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
printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {printf "median ratio (replicas / serial wall): %.3f over %d pairs (min %.3f, max %.3f)\n", a[int((NR+1)/2)], NR, a[1], a[NR]}'
for d in serial replicas; do
    jq -s -r --arg d "$d" '"\($d): verdicts \(map(.verdict.status) | group_by(.) | map("\(.[0]) \(length)") | join(", ")); on \(.[0].arms[0].counts | tostring), off \(.[0].arms[1].counts | tostring); cost \(.[0].cost.restarts) restarts, \(.[0].cost.engine_hours * 3600 | . * 10 | round / 10) engine-seconds"' "$OUT"/$d-*.json
done
echo "== planted difference: replica b corrupts a quarter of its sessions whatever the flag"
make_target "$OUT/p" "--wrong-args-every 4"
run "$OUT/t/replicas.toml" NOTHING "clean-nothing"
run "$OUT/p/replicas.toml" NOTHING "planted-nothing"
run "$OUT/p/replicas.toml" LEAK "planted-leak"
run "$OUT/p/replicas.toml" NOTHING "planted-nothing-one-pair" 1
for tag in clean-nothing planted-nothing planted-leak planted-nothing-one-pair; do
    jq -r --arg t "$tag" '"\($t): \(.verdict.status); on \(.arms[0].corrupted)/\(.arms[0].sessions) off \(.arms[1].corrupted)/\(.arms[1].sessions); replica confound [\(.confounds[] | select(.name == "replica") | .severity)]: \(.confounds[] | select(.name == "replica") | .note)"' "$OUT/$tag.json"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${KEEP:-}" ] && echo "kept: $OUT" || rm -rf "$OUT"

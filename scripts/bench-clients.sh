#!/usr/bin/env bash
# bisect's workload driver vs a Python asyncio client (benches/python/client.py), against
# the same zero-work mock engine (`bisect mock-engine`), in one go (issue: the harness is
# never the bottleneck). Both clients run the same sessions (the driver bench's --dump),
# at 100, 1000 and 5000 sessions, all in flight at once (closed loop, C = sessions) unless
# CONCURRENCY is set: one C, or several ("100 1000"), run in turn within each repeat, so a
# rate at one load is compared with the other measured minutes, not runs, apart. Where the machine has 2+ cores the mock is pinned to the last core
# and the clients to the others (taskset), so a client never shares its core with the
# server; on a 2-core machine that leaves each client exactly one core.
#
# Figures per client and size: sessions/s, client CPU seconds per 1000 requests, round
# latency p50/p99 (client side), think time p50/p99 as the *server* sees it (a reply
# leaving the mock to the same session's next request arriving: both kernel crossings,
# the client's event loop and its per-round work), peak in-flight vs target, peak RSS.
#
# With a zero-work mock one side is always saturated, and at C in flight the replies
# queue at whichever it is, so think time there measures throughput, not reaction. The
# second phase (ENGINE_SIZES, default 1000) runs the same sessions against a second mock
# that answers each request after a deterministic 0..DELAY_MS ms (default 200, about what
# a real engine's round takes), where neither side is saturated: its think time is the
# client's scheduling lag at that many sessions in flight.
#
# Each client runs each size REPEATS times (default 3), alternating with the other client;
# the table shows the run with the median sessions/s and the range over the repeats.
#
# The floor (benches/floor.rs; FLOOR=0 skips it): what the machine itself costs at each
# load. First the driver's own requests are recorded at concurrency 1 through `floor
# record`, a recording proxy in front of a zero-work mock. In the zero-work phase a third
# client, `floor`, replays exactly those bytes over its C connections and does nothing
# else (no JSON, no classification, no HTTP library). A last phase runs the same floor
# client against `floor serve`, a server that answers every request with one recorded
# reply (mock label "bytes-only"): neither side does any work beyond the sockets, so its
# loss from 100 to 1000 in flight is the kernel's, loopback TCP's and the scheduler's.
# That server has no /stats: its rows have no think time, and its CPU is per request the
# client sent.
#
#   scripts/bench-clients.sh               # SIZES="100 1000 5000"
#   SIZES="100 1000" CONCURRENCY=100 ENGINE_SIZES="" scripts/bench-clients.sh
#   SIZES=5000 CONCURRENCY="100 1000" ENGINE_SIZES="" scripts/bench-clients.sh  # same sessions, two loads
#   FLOOR=0 scripts/bench-clients.sh        # no floor rows
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"100 1000 5000"}
ENGINE_SIZES=${ENGINE_SIZES-"1000"}
DELAY_MS=${DELAY_MS:-200}
REPEATS=${REPEATS:-3}
CONCURRENCY=${CONCURRENCY:-0}
FLOOR=${FLOOR:-1}
PORT=${PORT:-18937}
OUT=${OUT_DIR:-target/bench-clients}
. scripts/bench-lib.sh
bench_build
# The driver bench's ROUNDS: the floor client groups the recorded requests by this many.
floor_rounds=4
if [ "$FLOOR" != 0 ]; then
  # The floor bench's executable itself, so its pid is the server's (no cargo in between).
  floor_bin=$(cargo bench --bench floor --no-run --message-format=json | python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "floor" and m.get("executable")]
print(exes[-1])')
  [ -x "$floor_bin" ] || { echo "no floor bench executable" >&2; exit 1; }
fi

echo "== Python client environment" >&2
VENV=target/bench-python
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q -r benches/python/requirements.txt >&2

cores=$(nproc)
if [ "$cores" -ge 2 ]; then
  server_cpus=$((cores - 1))
  client_cpus="0-$((cores - 2))"
  pin_server=(taskset -c "$server_cpus")
  pin_client=(taskset -c "$client_cpus")
  echo "mock on CPU $server_cpus, clients on CPU $client_cpus" >&2
else
  pin_server=()
  pin_client=()
  echo "one core: mock and client share it" >&2
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

largest=0
for n in $SIZES $ENGINE_SIZES; do [ "$n" -gt "$largest" ] && largest=$n; done
dump="$OUT/sessions.jsonl"
cargo bench --bench driver -- --dump "$dump" "$largest" >&2

# Every server and proxy started here is killed on exit (bench_started); wait_ready works
# for the floor proxy and server too (they answer /health).
start_mock() { # port jitter-ms
  "${pin_server[@]}" target/release/bisect mock-engine --port "$1" --jitter-ms "$2" >"$OUT/mock-$1.log" 2>&1 &
  bench_started $!
  mock_pid=$!
  has_stats=1
  wait_ready "$1"
}
start_floor_server() { # port reply-file
  "${pin_server[@]}" "$floor_bin" serve --port "$1" --reply "$2" >"$OUT/floor-serve-$1.log" 2>&1 &
  bench_started $!
  mock_pid=$!
  has_stats=0
  wait_ready "$1"
}

# The driver's requests, recorded at concurrency 1 (so consecutive requests are one
# session's rounds), for the floor client to replay: the largest zero-work size.
floor_requests="$OUT/floor-requests.bin"
if [ "$FLOOR" != 0 ]; then
  floor_largest=0
  for n in $SIZES; do [ "$n" -gt "$floor_largest" ] && floor_largest=$n; done
  PORT=$((PORT + 1))
  start_mock "$PORT" 0
  upstream=$PORT
  PORT=$((PORT + 1))
  rm -f "$floor_requests" "$floor_requests.reply"
  "$floor_bin" record --upstream "http://127.0.0.1:$upstream" --listen-port "$PORT" --out "$floor_requests" >"$OUT/floor-record.log" 2>&1 &
  bench_started $!
  recorder=$!
  wait_ready "$PORT"
  echo "== recording the driver's requests: $floor_largest sessions, 1 in flight" >&2
  cargo bench -q --bench driver -- --url "http://127.0.0.1:$PORT/v1" --concurrency 1 --json "$floor_largest" >&2
  kill "$recorder" "$mock_pid"
  wait "$recorder" "$mock_pid" 2>/dev/null || true
  cat "$OUT/floor-record.log" >&2
  if [ ! -s "$floor_requests" ] || [ ! -s "$floor_requests.reply" ]; then
    echo "recording failed: $floor_requests or its .reply is empty" >&2
    exit 1
  fi
fi

results="$OUT/results.jsonl"
: >"$results"
run_one() { # mock-label client size command...
  local mock=$1 client=$2 n=$3
  shift 3
  # The floor server keeps no statistics (has_stats=0): no think time, and its CPU is
  # divided by the requests the client sent.
  [ "$has_stats" = 1 ] && curl -sf -X POST "$base/stats/reset" >/dev/null
  local line ticks_before ticks_after
  # The mock's own CPU (utime + stime, clock ticks): it must stay below the clients'.
  ticks_before=$(awk '{print $14 + $15}' "/proc/$mock_pid/stat")
  line=$("$@" | tail -n 1)
  ticks_after=$(awk '{print $14 + $15}' "/proc/$mock_pid/stat")
  local server=null
  [ "$has_stats" = 1 ] && server=$(curl -sf "$base/stats")
  python3 - "$line" "$server" "$client" "$mock" "$((ticks_after - ticks_before))" "$(getconf CLK_TCK)" >>"$results" <<'PY'
import json, sys
row = json.loads(sys.argv[1]); server = json.loads(sys.argv[2])
row["client"] = sys.argv[3]
row["mock"] = sys.argv[4]
served = server["requests"] if server else row["requests"]
row["mock_cpu_s_per_1000_requests"] = int(sys.argv[5]) / int(sys.argv[6]) * 1000.0 / max(served, 1)
row["server_requests"] = server["requests"] if server else None
row["think_p50_ms"] = server["think"]["p50_us"] / 1000.0 if server else None
row["think_p99_ms"] = server["think"]["p99_us"] / 1000.0 if server else None
print(json.dumps(row))
PY
}
floor_row() { # mock-label size concurrency: the floor client against $base
  run_one "$1" floor "$2" "${pin_client[@]}" "$floor_bin" drive --url "$base" --requests "$floor_requests" \
    --rounds "$floor_rounds" --sessions "$2" --concurrency "$3" --json
}

phase() { # mock-label jitter-ms floor-rows(0/1) sizes...
  local label=$1 jitter=$2 floor=$3
  shift 3
  PORT=$((PORT + 1))
  start_mock "$PORT" "$jitter"
  base="http://127.0.0.1:$PORT"
  for n in "$@"; do
    for r in $(seq "$REPEATS"); do
      for c in $CONCURRENCY; do
        [ "$c" -eq 0 ] && c=$n
        echo "== $label mock: $n sessions, $c in flight (run $r of $REPEATS)" >&2
        run_one "$label" bisect "$n" "${pin_client[@]}" cargo bench -q --bench driver -- --url "$base/v1" --concurrency "$c" --json "$n"
        run_one "$label" python-aiohttp "$n" "${pin_client[@]}" "$VENV/bin/python" benches/python/client.py --url "$base/v1" --dump "$dump" --sessions "$n" --concurrency "$c"
        if [ "$floor" = 1 ]; then
          floor_row "$label" "$n" "$c"
        fi
      done
    done
  done
}
floor_rows=1
[ "$FLOOR" = 0 ] && floor_rows=0
# shellcheck disable=SC2086 # the size lists are meant to split
phase zero-work 0 "$floor_rows" $SIZES
if [ -n "$ENGINE_SIZES" ]; then
  # shellcheck disable=SC2086
  phase "0-${DELAY_MS} ms" "$DELAY_MS" 0 $ENGINE_SIZES
fi
if [ "$FLOOR" != 0 ]; then
  # The floor client against the bytes-only server, pinned where the mock was.
  PORT=$((PORT + 1))
  start_floor_server "$PORT" "$floor_requests.reply"
  base="http://127.0.0.1:$PORT"
  for n in $SIZES; do
    for r in $(seq "$REPEATS"); do
      for c in $CONCURRENCY; do
        [ "$c" -eq 0 ] && c=$n
        echo "== bytes-only server: $n sessions, $c in flight (run $r of $REPEATS)" >&2
        floor_row bytes-only "$n" "$c"
      done
    done
  done
fi

python3 - "$results" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in runs:
    groups.setdefault((r["mock"], r["client"], r["sessions"], r["target_inflight"]), []).append(r)
rows = []
for group in groups.values():
    group.sort(key=lambda r: r["sessions_per_s"])
    row = dict(group[len(group) // 2])
    row["range"] = f'{group[0]["sessions_per_s"]:.0f}-{group[-1]["sessions_per_s"]:.0f}'
    rows.append(row)
by = {(r["mock"], r["client"], r["sessions"], r["target_inflight"]): r for r in rows}
print("| mock | client | sessions | done | sessions/s (median, range) | vs python | vs own 100 | CPU s / 1000 req (mock's) | round p50 / p99 ms | think p50 / p99 ms (server-side) | in-flight peak / target | peak RSS MiB |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    py = by.get((r["mock"], "python-aiohttp", r["sessions"], r["target_inflight"]))
    first = min((x for x in rows if x["client"] == r["client"] and x["mock"] == r["mock"]), key=lambda x: (x["sessions"], x["target_inflight"]))
    vs_py = f'{r["sessions_per_s"] / py["sessions_per_s"]:.2f}x' if py else "-"
    def fig(key, fmt):  # "-" where the figure is absent (the bytes-only server keeps no stats)
        return "-" if r.get(key) is None else format(r[key], fmt)
    print(f'| {r["mock"]} | {r["client"]} | {r["sessions"]} | {r["done"]} | {r["sessions_per_s"]:.0f} ({r["range"]}) | {vs_py} | '
          f'{r["sessions_per_s"] / first["sessions_per_s"]:.2f} | {r["cpu_s_per_1000_requests"]:.3f} ({fig("mock_cpu_s_per_1000_requests", ".3f")}) | '
          f'{r["round_p50_ms"]:.1f} / {r["round_p99_ms"]:.1f} | {fig("think_p50_ms", ".2f")} / {fig("think_p99_ms", ".2f")} | '
          f'{r["peak_inflight"]} / {r["target_inflight"]} | {r["peak_rss_mib"]:.0f} |')
PY

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
#   scripts/bench-clients.sh               # SIZES="100 1000 5000"
#   SIZES="100 1000" CONCURRENCY=100 ENGINE_SIZES="" scripts/bench-clients.sh
#   SIZES=5000 CONCURRENCY="100 1000" ENGINE_SIZES="" scripts/bench-clients.sh  # same sessions, two loads
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"100 1000 5000"}
ENGINE_SIZES=${ENGINE_SIZES-"1000"}
DELAY_MS=${DELAY_MS:-200}
REPEATS=${REPEATS:-3}
CONCURRENCY=${CONCURRENCY:-0}
PORT=${PORT:-18937}
OUT=${OUT_DIR:-target/bench-clients}
mkdir -p "$OUT"

echo "== build (release)" >&2
cargo build --release --bin bisect >&2
cargo bench --bench driver --no-run >&2

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

mocks=()
trap 'for m in "${mocks[@]}"; do kill "$m" 2>/dev/null || true; done' EXIT
start_mock() { # port jitter-ms
  "${pin_server[@]}" target/release/bisect mock-engine --port "$1" --jitter-ms "$2" >"$OUT/mock-$1.log" 2>&1 &
  mocks+=($!)
  mock_pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && break
    sleep 0.1
  done
}

results="$OUT/results.jsonl"
: >"$results"
run_one() { # mock-label client size command...
  local mock=$1 client=$2 n=$3
  shift 3
  curl -sf -X POST "$base/stats/reset" >/dev/null
  local line ticks_before ticks_after
  # The mock's own CPU (utime + stime, clock ticks): it must stay below the clients'.
  ticks_before=$(awk '{print $14 + $15}' "/proc/$mock_pid/stat")
  line=$("$@" | tail -n 1)
  ticks_after=$(awk '{print $14 + $15}' "/proc/$mock_pid/stat")
  local server
  server=$(curl -sf "$base/stats")
  python3 - "$line" "$server" "$client" "$mock" "$((ticks_after - ticks_before))" "$(getconf CLK_TCK)" >>"$results" <<'PY'
import json, sys
row = json.loads(sys.argv[1]); server = json.loads(sys.argv[2])
row["client"] = sys.argv[3]
row["mock"] = sys.argv[4]
row["mock_cpu_s_per_1000_requests"] = int(sys.argv[5]) / int(sys.argv[6]) * 1000.0 / max(server["requests"], 1)
row["server_requests"] = server["requests"]
row["think_p50_ms"] = server["think"]["p50_us"] / 1000.0
row["think_p99_ms"] = server["think"]["p99_us"] / 1000.0
print(json.dumps(row))
PY
}

phase() { # mock-label jitter-ms sizes...
  local label=$1 jitter=$2
  shift 2
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
      done
    done
  done
}
# shellcheck disable=SC2086 # the size lists are meant to split
phase zero-work 0 $SIZES
if [ -n "$ENGINE_SIZES" ]; then
  # shellcheck disable=SC2086
  phase "0-${DELAY_MS} ms" "$DELAY_MS" $ENGINE_SIZES
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
    vs_py = r["sessions_per_s"] / py["sessions_per_s"] if py else float("nan")
    print(f'| {r["mock"]} | {r["client"]} | {r["sessions"]} | {r["done"]} | {r["sessions_per_s"]:.0f} ({r["range"]}) | {vs_py:.2f}x | '
          f'{r["sessions_per_s"] / first["sessions_per_s"]:.2f} | {r["cpu_s_per_1000_requests"]:.3f} ({r["mock_cpu_s_per_1000_requests"]:.3f}) | '
          f'{r["round_p50_ms"]:.1f} / {r["round_p99_ms"]:.1f} | {r["think_p50_ms"]:.2f} / {r["think_p99_ms"]:.2f} | '
          f'{r["peak_inflight"]} / {r["target_inflight"]} | {r["peak_rss_mib"]:.0f} |')
PY

#!/usr/bin/env bash
# bisect's driver against a simple server, beside a plain client (issue: bisect puts any
# server under the load a plain client can). The server is benches/python/threaded_server.py:
# Python's ThreadingHTTPServer, a thread per connection, HTTP/1.1 keep-alive, the standard
# library's listen backlog of 5, at least DELAY_MS (default 20) per reply, answering each
# round with the call the task asks for (through the zero-work mock, `bisect mock-engine`).
# Clients, alternating within each repeat, all sessions at once, ROUNDS rounds, TIMEOUT s
# per round:
#   bisect           the driver bench (`cargo bench --bench driver -- --url ...`), paced connects
#   bisect-unpaced   the same with every connect at once (`--unpaced`, the old opening)
#   python-threads   benches/python/threaded_client.py: a thread and an http.client
#                    keep-alive connection per session, no connection opened before the clock
# Per run: sessions/s, errors and timeouts, the kernel's listen-queue overflows during the
# run (TcpExtListenOverflows, /proc/net/netstat: machine-wide, so run it on a quiet
# machine), and the server's own peak of requests in progress (exact, and as a 10 ms
# sampler sees it).
#
#   scripts/bench-servers.sh                  # SIZES="40 60" REPEATS=3
#   SIZES=60 REPEATS=5 DELAY_MS=20 scripts/bench-servers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"40 60"}
REPEATS=${REPEATS:-3}
ROUNDS=${ROUNDS:-5}
TIMEOUT=${TIMEOUT:-5}
DELAY_MS=${DELAY_MS:-20}
BACKLOG=${BACKLOG:-5}
MOCK_PORT=${MOCK_PORT:-18951}
PORT=${PORT:-18952}
OUT=${OUT_DIR:-target/bench-servers}
. scripts/bench-lib.sh
bench_build
bench=$(find target/release/deps -maxdepth 1 -name 'driver-*' -type f -perm -u+x | xargs ls -t | head -n 1)
largest=$(echo "$SIZES" | tr ' ' '\n' | sort -n | tail -n 1)
"$bench" --dump "$OUT/sessions.jsonl" "$largest" >/dev/null

overflows() {
  awk '/^TcpExt:/ { if (!h) { for (i = 1; i <= NF; i++) name[i] = $i; h = 1 } else { for (i = 1; i <= NF; i++) if (name[i] == "ListenOverflows") print $i } }' /proc/net/netstat
}

target/release/bisect mock-engine --port "$MOCK_PORT" >"$OUT/mock.log" 2>&1 &
bench_started $!
python3 benches/python/threaded_server.py --port "$PORT" --mock "http://127.0.0.1:$MOCK_PORT" \
  --delay-ms "$DELAY_MS" --backlog "$BACKLOG" >"$OUT/server.log" 2>&1 &
bench_started $!
wait_ready "$MOCK_PORT"
wait_ready "$PORT"

api="http://127.0.0.1:$PORT/v1"
results="$OUT/runs.jsonl"
: >"$results"
for repeat in $(seq 1 "$REPEATS"); do
  for n in $SIZES; do
    for client in bisect bisect-unpaced python-threads; do
      curl -fsS "http://127.0.0.1:$PORT/peak/reset" >/dev/null
      sleep 0.5
      before=$(overflows)
      case $client in
        bisect) line=$("$bench" --url "$api" --rounds "$ROUNDS" --timeout "$TIMEOUT" --json "$n" 2>/dev/null) ;;
        bisect-unpaced) line=$("$bench" --url "$api" --rounds "$ROUNDS" --timeout "$TIMEOUT" --unpaced --json "$n" 2>/dev/null) ;;
        python-threads) line=$(python3 benches/python/threaded_client.py --url "$api" --dump "$OUT/sessions.jsonl" \
            --sessions "$n" --rounds "$ROUNDS" --timeout "$TIMEOUT") ;;
      esac
      after=$(overflows)
      peak=$(curl -fsS "http://127.0.0.1:$PORT/peak")
      python3 - "$client" "$repeat" "$((after - before))" "$peak" "$line" >>"$results" <<'PY'
import json, sys
client, repeat, overflows, peak, line = sys.argv[1:]
row = json.loads(line)
row.update({"client": client, "repeat": int(repeat), "listen_overflows": int(overflows)})
row.update({"server_" + k: v for k, v in json.loads(peak).items()})
print(json.dumps(row))
PY
      tail -n 1 "$results" >&2
    done
  done
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| client | sessions | sessions/s (median, range) | errors+timeouts | listen overflows | server peak (exact) | server peak (10 ms sampler) |")
print("|---|---:|---|---:|---|---|---|")
for n in sorted({r["sessions"] for r in rows}):
    for client in ("bisect", "bisect-unpaced", "python-threads"):
        rs = [r for r in rows if r["client"] == client and r["sessions"] == n]
        if not rs:
            continue
        rates = sorted(r["sessions_per_s"] for r in rs)
        median = rates[len(rates) // 2]
        bad = [r.get("errors", 0) + r.get("timeouts", 0) for r in rs]
        ov = [r["listen_overflows"] for r in rs]
        pk = [r["server_peak"] for r in rs]
        sp = [r["server_sampled_peak_10ms"] for r in rs]
        rng = lambda v: f"{min(v)}-{max(v)}" if min(v) != max(v) else f"{v[0]}"
        print(f"| {client} | {n} | {median:.1f} ({rates[0]:.1f}-{rates[-1]:.1f}) | {rng(bad)} | {rng(ov)} | {rng(pk)} | {rng(sp)} |")
PY

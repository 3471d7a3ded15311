# Shell functions the bench scripts share (scripts/bench-clients.sh, scripts/bench-servers.sh);
# sourced from the repository root, not run.

# Builds the release binary and the driver bench; creates "$OUT".
bench_build() {
  mkdir -p "$OUT"
  echo "== build (release)" >&2
  cargo build --release --bin bisect >&2
  cargo bench --bench driver --no-run >&2
}

# Every process started in the background and recorded with `bench_started $!` is killed
# when the script exits.
bench_pids=()
bench_started() { bench_pids+=("$1"); }
bench_kill_started() { for p in "${bench_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap bench_kill_started EXIT

# wait_ready PORT: until GET /health on 127.0.0.1:PORT answers (10 s at most).
wait_ready() {
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2
  return 1
}

#!/bin/sh
# GPU checks of the CUDA backend, run on a machine with an NVIDIA GPU from binaries
# built elsewhere (the device machine has no cargo). Two steps:
#
#   scripts/gpu-check.sh bundle [DIR]   # here, with cargo: release builds, stripped,
#                                       # copied into DIR (default target/gpu-bundle)
#   scripts/gpu-check.sh run [DIR]      # there: every check below, figures to $OUT
#
# `run` writes to $OUT (default ./gpu-check-out), in this order:
#   device.txt       nvidia-smi
#   kernels.txt      `bisect kernels` (when the bundle has the bisect binary)
#   parity.txt       the engine's backend tests, GPU ones included (NVRTC compile of
#                    every kernel, CUDA == CPU for quantize bytes, indexer selections,
#                    attention, the paged pools through page tables, the gated
#                    load-back, the prefill gather after a batched load-back, resident
#                    decode); fails if any GPU test skipped
#   race.txt         the load-back race on the GPU's pools: stale index-K page reads
#                    counted by the kernels and wrong selections, ungated vs gated
#   race-served.txt  the served prefill's race in process (the engine's load simulation,
#                    80 sessions x 4 rounds, prefill's prefix cache in a CUDA pool,
#                    load-backs on the copy stream): `race-served` lines per config
#                    (defaults, SYNC=1, fp8, HiCache off): corrupted sessions, stale
#                    requests, the gather kernel's stale page reads
#   served.txt       the served race over HTTP: `bisect run` with the engines on
#                    --device cuda (BISECT_ENGINE_DEVICE=cuda) for BF16_INDEX_K,
#                    INDEX_K_HICACHE_SYNC and HICACHE, then BF16_INDEX_K on the CPU for
#                    the wall-time comparison; each arm's last `prefill counters` line
#                    (stale requests, kernel stale index-K reads, load-back waits)
#   throughput.md    decode tokens/s CUDA vs CPU at batch 1/16/64/256 x ctx 8192/32768
#                    and the indexer call's bandwidth against HBM peak
#   summary.txt      each step's exit status and seconds, and the key lines above
# Each step has its own time limit; all of them together stay under 6 minutes.
# Calibration without a rebuild: GPU_RACE_FORWARD_NS=0,20,100 makes race-served try
# those modelled forward times (ns per prompt token) at the defaults;
# BISECT_PREFILL_FORWARD_NS_PER_TOKEN=N sets it for the served engines (both are 0 by
# default: the gather follows the step's writes at once).
# GPU_CHECK_STEPS picks steps (default: "kernels parity race race-served served
# throughput"), e.g. to rerun one that failed. GPU_CHECK_BENCH_ARGS adds arguments to
# the throughput run (e.g. "--batches 1,16 --contexts 1024" for a dry run).
#
# NVRTC: /usr/local/cuda/lib64 when it has libnvrtc (the device image has CUDA 13),
# else a CUDA_HOME or a Python environment's nvidia-cuda-nvrtc, else
# scripts/install-nvrtc.sh (PyPI; needs the network).
set -u

mode=${1:-}
dir=${2:-target/gpu-bundle}

bundle() {
    set -e
    mkdir -p "$dir"
    cargo build --release --bin bisect
    tests=$(cargo test --release -p bisect-engine --lib --no-run 2>&1 |
        sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))$/\1/p' | tail -n 1)
    bench=$(cargo bench --bench engine_decode --no-run 2>&1 |
        sed -n 's/.*Executable benches\/engine_decode.rs (\(.*\))$/\1/p' | tail -n 1)
    [ -n "$tests" ] && [ -n "$bench" ] || {
        echo "gpu-check bundle: could not find the test or bench executable in cargo's output" >&2
        exit 1
    }
    cp target/release/bisect "$dir/bisect"
    cp "$tests" "$dir/engine-tests"
    cp "$bench" "$dir/engine-decode"
    strip "$dir/bisect" "$dir/engine-tests" "$dir/engine-decode"
    du -sh "$dir"/*
}

find_nvrtc_dir() {
    for candidate in /usr/local/cuda/lib64 ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda-*/lib64 \
        /usr/lib/x86_64-linux-gnu; do
        if ls "$candidate"/libnvrtc.so* >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    for python in python3 python; do
        command -v "$python" >/dev/null 2>&1 || continue
        found=$("$python" - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for lib in glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")):
        print(os.path.dirname(lib)); raise SystemExit
PY
)
        if [ -n "$found" ]; then
            echo "$found"
            return 0
        fi
    done
    "$(dirname "$0")/install-nvrtc.sh"
}

# step NAME LIMIT_S OUTFILE COMMAND...: runs COMMAND under a time limit, output to OUTFILE.
step() {
    name=$1
    limit=$2
    file=$3
    shift 3
    started=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$file" 2>&1
    status=$?
    echo "$name: exit $status, $(($(date +%s) - started)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
    return $status
}

run() {
    OUT=${OUT:-$PWD/gpu-check-out}
    mkdir -p "$OUT"
    : >"$OUT/summary.txt"
    date -u '+%Y-%m-%dT%H:%M:%SZ' >>"$OUT/summary.txt"
    nvidia-smi >"$OUT/device.txt" 2>&1 || echo "nvidia-smi failed" >>"$OUT/summary.txt"
    nvrtc=$(find_nvrtc_dir) || nvrtc=""
    if [ -n "$nvrtc" ]; then
        LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LD_LIBRARY_PATH
        # The compile test fails rather than skips when this is set and NVRTC is not loadable.
        BISECT_NVRTC_DIR="$nvrtc"
        export BISECT_NVRTC_DIR
    fi
    echo "NVRTC: ${nvrtc:-not found}" | tee -a "$OUT/summary.txt"
    failed=0
    steps=${GPU_CHECK_STEPS:-kernels parity race race-served served throughput}
    wants() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    if wants kernels && [ -x "$dir/bisect" ]; then
        step kernels 20 kernels.txt "$dir/bisect" kernels || failed=1
    fi
    if wants parity; then
        step parity 50 parity.txt "$dir/engine-tests" backend:: decode:: prefill:: --test-threads=1 --nocapture || failed=1
        if grep -q "skipped: no CUDA device\|skipped: libnvrtc" "$OUT/parity.txt"; then
            echo "parity: GPU tests SKIPPED (no device or no NVRTC seen by the tests)" | tee -a "$OUT/summary.txt"
            failed=1
        fi
    fi
    if wants race; then
        step race 30 race.txt "$dir/engine-tests" gpu_paged_load_back_race --ignored --nocapture || failed=1
        grep '^race ' "$OUT/race.txt" | tee -a "$OUT/summary.txt"
    fi
    if wants race-served; then
        step race-served 60 race-served.txt "$dir/engine-tests" gpu_served_prefill_race --ignored --nocapture || failed=1
        grep '^race-served ' "$OUT/race-served.txt" | tee -a "$OUT/summary.txt"
    fi
    if wants served && [ -x "$dir/bisect" ]; then
        step served 120 served.txt sh "$0" served "$dir" || failed=1
        grep '^served \|counters:' "$OUT/served.txt" | tee -a "$OUT/summary.txt"
    fi
    if wants throughput; then
        # shellcheck disable=SC2086 # GPU_CHECK_BENCH_ARGS is a list of arguments
        step throughput 70 throughput.md "$dir/engine-decode" --paged ${GPU_CHECK_BENCH_ARGS:-} || failed=1
        cat "$OUT/throughput.md"
    fi
    echo "load average: $(cat /proc/loadavg)" >>"$OUT/summary.txt"
    echo "== summary" && cat "$OUT/summary.txt"
    return $failed
}

# The served race over HTTP: the embedded engines started by `bisect run` (their launch
# scripts pass no --device; BISECT_ENGINE_DEVICE reaches `bisect engine` through the
# environment), default workload (80 sessions x 4 rounds). Results and engine logs go
# to a temporary directory; only the printed tables and counter lines are kept.
served() {
    results=$(mktemp -d)
    status=0
    # GPU_CHECK_SERVED_RUNS: DEVICE:FLAG pairs (a CPU-only dry run: "cpu:BF16_INDEX_K").
    for run in ${GPU_CHECK_SERVED_RUNS:-cuda:BF16_INDEX_K cuda:INDEX_K_HICACHE_SYNC cuda:HICACHE cpu:BF16_INDEX_K}; do
        device=${run%%:*}
        flag=${run#*:}
        started=$(date +%s)
        BISECT_ENGINE_DEVICE=$device XDG_STATE_HOME="$results/state" \
            "$dir/bisect" run --flag "$flag" --results "$results/$device-$flag"
        code=$?
        # 0: finished, whatever the verdict (README, exit codes).
        [ $code -eq 0 ] || status=1
        echo "served $device $flag: exit $code, $(($(date +%s) - started)) s wall"
        find "$results/$device-$flag" -name '*prefill*.log' | sort | while read -r log; do
            echo "  $(basename "$log") $(grep 'prefill counters' "$log" | tail -n 1 | sed 's/.*prefill counters: /counters: /')"
            grep -m 1 'prefix cache in a' "$log" | sed 's/^/    /'
        done
    done
    rm -rf "$results"
    return $status
}

case "$mode" in
bundle) bundle ;;
run) run ;;
served) served ;;
*)
    echo "usage: scripts/gpu-check.sh bundle [DIR] | run [DIR]   (see the header)" >&2
    exit 2
    ;;
esac

#!/bin/sh
# GPU checks of the CUDA backend, run on a machine with an NVIDIA GPU from binaries
# built elsewhere (the device machine has no cargo). Two steps:
#
#   scripts/gpu-check.sh bundle [DIR]   # here, with cargo: release builds, stripped,
#                                       # copied into DIR (default target/gpu-bundle)
#   scripts/gpu-check.sh run [DIR]      # there: every check below, figures to $OUT
#
# `run` writes to $OUT (default ./gpu-check-out), at most 6 files, in this order:
#   device.txt       nvidia-smi
#   parity.txt       the engine's backend tests, GPU ones included (NVRTC compile of
#                    every kernel, CUDA == CPU for quantize bytes, indexer selections,
#                    attention, the paged pools through page tables, the gated
#                    load-back, resident decode); fails if any GPU test skipped
#   race.txt         the load-back race on the GPU: stale index-K page reads counted by
#                    the kernels and wrong selections, ungated vs gated, bf16 and fp8
#   throughput.md    decode tokens/s CUDA vs CPU at batch 1/16/64/256 x ctx 8192/32768
#                    and the indexer call's bandwidth against HBM peak
#   kernels.txt      `bisect kernels` (when the bundle has the bisect binary)
#   summary.txt      each step's exit status and seconds
# Each step has its own time limit; all of them together stay under 6 minutes.
# GPU_CHECK_BENCH_ARGS adds arguments to the throughput run (e.g. "--batches 1,16
# --contexts 1024" for a dry run on a small machine).
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
    if [ -x "$dir/bisect" ]; then
        step kernels 30 kernels.txt "$dir/bisect" kernels || failed=1
    fi
    step parity 80 parity.txt "$dir/engine-tests" backend:: decode:: --test-threads=1 --nocapture || failed=1
    if grep -q "skipped: no CUDA device\|skipped: libnvrtc" "$OUT/parity.txt"; then
        echo "parity: GPU tests SKIPPED (no device or no NVRTC seen by the tests)" | tee -a "$OUT/summary.txt"
        failed=1
    fi
    step race 80 race.txt "$dir/engine-tests" gpu_paged_load_back_race --ignored --nocapture || failed=1
    grep '^race ' "$OUT/race.txt" | tee -a "$OUT/summary.txt"
    # shellcheck disable=SC2086 # GPU_CHECK_BENCH_ARGS is a list of arguments
    step throughput 160 throughput.md "$dir/engine-decode" --paged ${GPU_CHECK_BENCH_ARGS:-} || failed=1
    cat "$OUT/throughput.md"
    echo "load average: $(cat /proc/loadavg)" >>"$OUT/summary.txt"
    echo "== summary" && cat "$OUT/summary.txt"
    return $failed
}

case "$mode" in
bundle) bundle ;;
run) run ;;
*)
    echo "usage: scripts/gpu-check.sh bundle [DIR] | run [DIR]   (see the header)" >&2
    exit 2
    ;;
esac

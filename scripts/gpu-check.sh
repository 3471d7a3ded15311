#!/bin/sh
# GPU checks of the CUDA backend, for a machine with an NVIDIA GPU: parity of every
# kernel with the CPU backend, the gated HiCache load-back, and the decode-step
# throughput benchmark (CPU vs CUDA tokens/s). Run from the repository root:
#   scripts/gpu-check.sh            # tests + benchmark
#   scripts/gpu-check.sh --no-bench # tests only
# NVRTC is looked up where a CUDA install or a Python environment keeps it; the PyPI
# package is installed (scripts/install-nvrtc.sh) only when none is found.
set -eu

find_nvrtc_dir() {
    if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
        return 0
    fi
    for dir in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 \
        /usr/lib/x86_64-linux-gnu; do
        if ls "$dir"/libnvrtc.so* >/dev/null 2>&1; then
            echo "$dir"
            return 0
        fi
    done
    for python in python3 python; do
        command -v "$python" >/dev/null 2>&1 || continue
        dir=$("$python" - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for lib in glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")):
        print(os.path.dirname(lib)); raise SystemExit
PY
)
        if [ -n "$dir" ]; then
            echo "$dir"
            return 0
        fi
    done
    "$(dirname "$0")/install-nvrtc.sh"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
NVRTC_DIR=$(find_nvrtc_dir)
if [ -n "$NVRTC_DIR" ]; then
    echo "NVRTC from $NVRTC_DIR"
    LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
fi

cargo test --release --lib engine::backend::cuda -- --nocapture --test-threads=1
if [ "${1:-}" != "--no-bench" ]; then
    cargo test --release --lib engine::backend::cuda::tests::decode_step_throughput -- --ignored --nocapture
fi

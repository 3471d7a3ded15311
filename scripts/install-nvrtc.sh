#!/bin/sh
# Install NVRTC from PyPI (package nvidia-cuda-nvrtc-cu12) so the CUDA kernels in
# kernels/*.cu can be compile-checked without a GPU or a CUDA toolkit, and print the
# directory holding libnvrtc.so.12 on stdout (everything else goes to stderr).
#
# Usage (CI):
#   NVRTC_DIR=$(scripts/install-nvrtc.sh)
#   LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --lib kernels_compile_with_nvrtc
#
# The package goes into its own prefix (not the system site-packages), default
# $XDG_CACHE_HOME/bisect/nvrtc or ~/.cache/bisect/nvrtc; override with BISECT_NVRTC_PREFIX.
# Running it again is cheap: an existing install is reused.
#
# cudarc (dynamic loading) dlopens "libnvrtc.so.12" among other names, and the wheel
# ships exactly that file, so putting the directory on LD_LIBRARY_PATH is enough; no
# libnvrtc.so symlink is needed. libnvrtc-builtins.so.12.* sits next to it and is found
# through the library's own search path.
set -eu

PACKAGE="${BISECT_NVRTC_PACKAGE:-nvidia-cuda-nvrtc-cu12}"
PREFIX="${BISECT_NVRTC_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/bisect/nvrtc}"
LIB_DIR="$PREFIX/nvidia/cuda_nvrtc/lib"

find_lib() {
    for candidate in "$LIB_DIR"/libnvrtc.so.1[0-9] "$LIB_DIR"/libnvrtc.so; do
        if [ -f "$candidate" ]; then
            return 0
        fi
    done
    return 1
}

if ! find_lib; then
    PYTHON="${PYTHON:-}"
    if [ -z "$PYTHON" ]; then
        for p in python3 python; do
            if command -v "$p" >/dev/null 2>&1; then PYTHON="$p"; break; fi
        done
    fi
    if [ -z "$PYTHON" ]; then
        echo "install-nvrtc: no python3 found (set PYTHON=...)" >&2
        exit 1
    fi
    mkdir -p "$PREFIX"
    echo "install-nvrtc: installing $PACKAGE into $PREFIX" >&2
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps \
        --upgrade --target "$PREFIX" "$PACKAGE" >&2
    if ! find_lib; then
        echo "install-nvrtc: $PACKAGE installed but no libnvrtc.so* under $LIB_DIR" >&2
        exit 1
    fi
fi

echo "$LIB_DIR"

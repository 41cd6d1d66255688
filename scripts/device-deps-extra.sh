#!/usr/bin/env bash
# The build dependencies the GPU machine lacks, gathered into DEST (default .deps, git-ignored):
# the shared tool's packages (../shared/tools/device-deps.sh) plus what configuring this project
# and linking the CUDA check programs need there: the shared libraries behind fmt and Google
# Benchmark (their CMake configs refuse dangling .so links), utf8proc (configure requires it) and
# pkg-config (pkgconf). The HTTP server's Boost and OpenSSL are left out: configure skips the
# server without them, and nothing built there links it. OpenBLAS is left out too: no target
# built on the GPU machine links it, so scripts/gpu-check.sh hands CMake a placeholder for it.
#
#   scripts/device-deps-extra.sh [DEST]     then run the device command with carry=[".deps"]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.deps}
SHARED_TOOL=${SHARED_TOOL:-../shared/tools/device-deps.sh}
[[ -x "$SHARED_TOOL" ]] || SHARED_TOOL=/work/shared/tools/device-deps.sh
"$SHARED_TOOL" "$DEST" >/dev/null
EXTRA=(libfmt9 libbenchmark1debian libutf8proc-dev libutf8proc2 pkgconf-bin libpkgconf3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download "${EXTRA[@]}" >/dev/null 2>&1 )
for deb in "$work"/*.deb; do dpkg -x "$deb" "$DEST"; done
rm -rf "$DEST/usr/share/doc" "$DEST/usr/share/man" "$DEST/usr/share/lintian"
du -sh "$DEST"

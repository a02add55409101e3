#!/usr/bin/env bash
# Throughput of `laoyao preprocess-data` (MB of JSON text per second, per worker) on real
# English text: Debian's fortunes, wrapped as JSON lines, repeated to about 20 MB.
# Usage: bench/preprocess_throughput.sh [laoyao binary]   (needs scripts/fetch_test_vocabs.sh run first)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/default/laoyao}"
vocabs="${LAOYAO_TEST_VOCABS:-$root/build/test-vocabs}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One JSON document per fortune, text escaped for JSON.
node -e '
const fs = require("fs");
const dir = "/usr/share/games/fortunes";
let docs = [];
for (const f of fs.readdirSync(dir)) {
  if (f.includes(".")) continue;
  for (const d of fs.readFileSync(dir + "/" + f, "utf8").split("\n%\n")) if (d.trim()) docs.push(d);
}
let out = [], size = 0;
while (size < 20e6) for (const d of docs) { const l = JSON.stringify({text: d}); out.push(l); size += l.length + 1; }
fs.writeFileSync(process.argv[1], out.join("\n") + "\n");
' "$work/input.jsonl"
mb=$(awk -v b="$(stat -c %s "$work/input.jsonl")" 'BEGIN{printf "%.1f", b/1e6}')
printf '%-22s %-8s %10s %12s %14s\n' tokenizer workers MB MB/s MB/s/worker
run() {  # run NAME WORKERS ARGS...
  local name=$1 workers=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" preprocess-data --input "$work/input.jsonl" --output-prefix "$work/out_${name}_${workers}" \
    --json-keys text --append-eod --workers "$workers" "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  awk -v n="$name" -v w="$workers" -v mb="$mb" -v s="$(echo "$t1 - $t0" | bc)" \
    'BEGIN{printf "%-22s %-8d %10.1f %12.2f %14.2f\n", n, w, mb, mb/s, mb/s/w}'
}
for w in 1 "$(nproc)"; do
  run GPT2BPETokenizer "$w" --tokenizer-type GPT2BPETokenizer --vocab-file "$vocabs/gpt2/vocab.json" \
    --merge-file "$vocabs/gpt2/merges.txt"
  run HF-Llama3 "$w" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$vocabs/llama3"
done

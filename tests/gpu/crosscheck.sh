#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with build/gpu-carry carried:
# the laoyao binary and the shared libraries that differ there (`scripts/gpu_check.sh stage`),
# plus, copied in by hand, the test vocabularies (build/test-vocabs) and a JSON-lines text. Checks that the binary starts and sees
# the GPU, then cross-checks the tokenizers against the Python packages installed there.
set -uo pipefail
C=build/gpu-carry
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/$C/lib"  # carried libraries last
out="${OUT:-/tmp/out}"
mkdir -p "$out" /tmp/tok
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$C/laoyao" --help | head -3
V="$C/vocabs"
pp() { "$C/laoyao" preprocess-data --input "$C/text.jsonl" --output-prefix "/tmp/tok/$1" --json-keys text \
         --append-eod --workers 8 "${@:2}" > "/tmp/tok/$1.log" 2>&1 || { echo "preprocess $1 failed"; tail -5 "/tmp/tok/$1.log"; }; }
pp gpt2 --tokenizer-type GPT2BPETokenizer --vocab-file "$V/gpt2/vocab.json" --merge-file "$V/gpt2/merges.txt"
pp llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$V/llama3"
pp qwen3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$V/qwen3"
pp llama2_spm --tokenizer-type SentencePieceTokenizer --tokenizer-model "$V/sentencepiece/llama2.model"
pp llama2_gptspm --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$V/sentencepiece/llama2.model"
python3 tests/gpu/tokenizer_crosscheck.py "$V" "$C/text.jsonl" "/tmp/tok" 2>&1 | tee "$out/crosscheck.txt"

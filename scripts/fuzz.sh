#!/usr/bin/env bash
# Fuzzes the readers of untrusted input (config front ends, .idx/.bin, safetensors, tokenizer
# files, training logs and checkpoint metadata, Hugging Face config.json and index, chat templates) with libFuzzer under AddressSanitizer and UBSan,
# each for a bounded time, starting from the seed corpus in fuzz/corpus/. Installs clang if needed
# and builds the `fuzz` preset (build/fuzz). Exit status non-zero on any crash, sanitizer report,
# escaped exception, leak or timeout; the input that caused it is kept as
# build/fuzz/findings/<target>-crash-* (replay: build/fuzz/laoyao_fuzz_<target> FILE).
# Usage: scripts/fuzz.sh [seconds per target, default 60] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
per_target=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config indexed_dataset safetensors tokenizer_files run_records hf_folder chat_template)

LAOYAO_FUZZ_DEPS=1 scripts/setup.sh fuzz
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
out=build/fuzz/findings
mkdir -p "$out"
failed=()
for t in "${targets[@]}"; do
  corpus=build/fuzz/corpus/$t  # grows across runs here; the committed seeds are read alongside
  mkdir -p "$corpus"
  echo "== fuzz $t for ${per_target}s"
  if build/fuzz/laoyao_fuzz_"$t" -max_total_time="$per_target" -timeout=20 -rss_limit_mb=3072 -max_len=16384 \
       -print_final_stats=1 -artifact_prefix="$out/$t-" "$corpus" "fuzz/corpus/$t" > "$out/$t.log" 2>&1; then
    grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$out/$t.log" | tr '\n' ' '
    echo
  else
    echo "fuzz $t FAILED; the end of $out/$t.log:"
    tail -60 "$out/$t.log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs in $out)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${per_target}s each, no findings"

#!/usr/bin/env bash
# Stages and runs bench/finetune_bench.py (fine-tuning at real size beside transformers + PEFT).
#   bash bench/finetune_bench.sh stage [BUILD_DIR]   here: laoyao, the GPU test binaries, the
#                                                    libraries the GPU machine lacks and the real
#                                                    Llama 3 tokenizer into build/ft-carry (about 45 MB)
#   bash bench/finetune_bench.sh run [CASE ...]      there (device tool, carry ["build/ft-carry"]):
#                                                    the cases, logs and the table under $OUT
#   bash bench/finetune_bench.sh tests [FILTER]      there: the GPU tests FILTER selects (gtest's)
#   bash bench/finetune_bench.sh fp8-gemm            there: laoyao's FP8 GEMMs beside bf16 and beside
#                                                    torch._scaled_mm on the same operands (issue #39)
set -euo pipefail
C=build/ft-carry
case "${1:-}" in
  stage)
    B="${2:-build/default}"
    cmake --build "$B" --target laoyao laoyao_tests_kernels_cuda laoyao_tests_model_cuda laoyao_bench_fp8_gemm -j2
    [ -f build/test-vocabs/llama3/tokenizer.json ] || bash scripts/fetch_test_vocabs.sh
    rm -rf "$C" && mkdir -p "$C/lib" "$C/llama3"
    cp "$B/laoyao" "$B/laoyao_tests_kernels_cuda" "$B/laoyao_tests_model_cuda" "$B/laoyao_bench_fp8_gemm" "$C/"
    cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$C/lib/"
    for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$C/lib/"; done
    cp build/test-vocabs/llama3/tokenizer.json build/test-vocabs/llama3/tokenizer_config.json "$C/llama3/"
    du -sh "$C" ;;
  run | tests | fp8-gemm)
    what="$1"
    shift
    sp=$(python3 -c 'import site;print(site.getsitepackages()[0])')
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}:$PWD/$C/lib"
    OUT="${OUT:-/tmp/out}"
    mkdir -p "$OUT"
    if [ "$what" = fp8-gemm ]; then
      mkdir -p /tmp/fp8_gemm
      "$C/laoyao_bench_fp8_gemm" /tmp/fp8_gemm | tee "$OUT/fp8_gemm_bench.txt"
      python3 bench/fp8_gemm_vs_torch.py /tmp/fp8_gemm | tee "$OUT/fp8_gemm_vs_torch.txt"
      exit 0
    fi
    if [ "$what" = tests ]; then
      rc=0
      for t in laoyao_tests_kernels_cuda laoyao_tests_model_cuda; do
        timeout 300 "$C/$t" --gtest_filter="${1:-*}" > "$OUT/$t.txt" 2>&1 || rc=1
        grep -E "^\[  (PASSED|FAILED) |^\[==========\]|Failure|exception" "$OUT/$t.txt" | tail -12
      done
      exit "$rc"
    fi
    python3 bench/finetune_bench.py "$C/laoyao" "$OUT" "$@" 2>&1 | tee "$OUT/finetune_bench.txt" ;;
  *) echo "usage: bash bench/finetune_bench.sh stage [BUILD_DIR] | run [CASE ...] | tests [FILTER] | fp8-gemm" >&2; exit 2 ;;
esac

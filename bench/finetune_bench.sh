#!/usr/bin/env bash
# Stages and runs bench/finetune_bench.py (fine-tuning at real size beside transformers + PEFT).
#   bash bench/finetune_bench.sh stage [BUILD_DIR]   here: laoyao, the GPU test binaries, the
#                                                    libraries the GPU machine lacks and the real
#                                                    Llama 3 tokenizer into build/ft-carry (about 45 MB)
#   bash bench/finetune_bench.sh run [CASE ...]      there (device tool, carry ["build/ft-carry"]):
#                                                    the cases, logs and the table under $OUT
#   bash bench/finetune_bench.sh tests [FILTER]      there: the GPU tests FILTER selects (gtest's)
#   (FT_CARRY=DIR: the staged files from DIR instead of build/ft-carry, e.g. a stripped subset)
#   bash bench/finetune_bench.sh fp8-gemm            there: laoyao's FP8 GEMMs beside bf16 and beside
#                                                    torch._scaled_mm on the same operands (issue #39)
#   bash bench/finetune_bench.sh fp8-speed [CASE ...] there: bench/gpu_train_bench.sh's cases (default
#                                                    llama3_8b_4l_s8k qwen3_8b_4l_s4k) in BF16 beside
#                                                    the PyTorch peer, then in FP8 (hybrid, delayed and
#                                                    tensorwise; FP8_RUNS="bf16 delayed blockwise" picks
#                                                    the recipes); a table of FP8 / BF16 last (#39)
#   bash bench/finetune_bench.sh fp8-grouped        there: bench/grouped_fp8_bench.cpp (the experts' FP8
#                                                    casts and GEMMs piece by piece beside BF16's, #39)
#   bash bench/finetune_bench.sh fp8-curves [ITERS]  there: bench/fp8_curves.sh (BF16 and both FP8
#                                                    recipes on real text; ITERS 500), its data staged
#   bash bench/finetune_bench.sh grouped-speed [SET ...] there: the flagship (gpu_train_bench.sh's moe_2b,
#                                                    no peer) with each LAOYAO_GROUPED_GEMM set (default
#                                                    tma portable), one table row each (#39)
#   bash bench/finetune_bench.sh stage-sft [BUILD_DIR] here: laoyao, its libraries, Qwen3's tokenizer and
#                                                    Megatron-LM's sft_tokenizer.py (from the tool
#                                                    library's Megatron-LM mirror) into build/sft-carry
#   bash bench/finetune_bench.sh mlm-sft             there (carry ["build/sft-carry"]):
#                                                    tests/gpu/mlm_sft_check.py, pretrain-gpt --sft's
#                                                    rows against Megatron-LM's SFTTokenizer
set -euo pipefail
C="${FT_CARRY:-build/ft-carry}"  # (a leaner copy elsewhere when a call must carry more)
case "${1:-}" in
  stage)
    B="${2:-build/default}"
    # The GPU here is Hopper: device code for sm_90a alone keeps the carry under the 64 MiB a run takes.
    grep -q "^LAOYAO_CUDA_ARCHS:STRING=90a$" "$B/CMakeCache.txt" || cmake "$B" -DLAOYAO_CUDA_ARCHS=90a > /dev/null
    cmake --build "$B" --target laoyao laoyao_tests_kernels_cuda laoyao_tests_model_cuda laoyao_bench_fp8_gemm \
      laoyao_bench_grouped_fp8 -j2
    [ -f build/test-vocabs/llama3/tokenizer.json ] || bash scripts/fetch_test_vocabs.sh
    rm -rf "$C" && mkdir -p "$C/lib" "$C/llama3"
    cp "$B/laoyao" "$B/laoyao_tests_kernels_cuda" "$B/laoyao_tests_model_cuda" "$B/laoyao_bench_fp8_gemm" \
      "$B/laoyao_bench_grouped_fp8" "$C/"
    cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$C/lib/"
    for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$C/lib/"; done
    cp build/test-vocabs/llama3/tokenizer.json build/test-vocabs/llama3/tokenizer_config.json "$C/llama3/"
    mkdir -p "$C/peers" "$C/fp8data"
    cp ../shared/peers/pytorch_gpt.py ../shared/peers/pytorch_moe.py "$C/peers/"
    cp -r build/test-vocabs/llama2-hf "$C/"
    # fp8_curves.sh's real text (Debian's fortunes, which the GPU machine lacks), preprocessed here.
    FP8_CURVES_WORK="$PWD/$C/fp8data" FP8_CURVES_PREPARE_ONLY=1 bash bench/fp8_curves.sh "$B/laoyao"
    rm -f "$C/fp8data/input.jsonl"
    du -sh "$C" ;;
  stage-sft)
    B="${2:-build/default}"
    S=build/sft-carry
    cmake --build "$B" --target laoyao -j2
    [ -f build/test-vocabs/qwen3/tokenizer.json ] || bash scripts/fetch_test_vocabs.sh
    rm -rf "$S" && mkdir -p "$S/lib"
    cp "$B/laoyao" "$S/"
    cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$S/lib/"
    for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$S/lib/"; done
    cp -r build/test-vocabs/qwen3 "$S/"
    git --git-dir=../.mirror/NVIDIA+Megatron-LM/repo show \
      HEAD:megatron/core/tokenizers/text/libraries/sft_tokenizer.py > "$S/megatron_sft_tokenizer.py"
    du -sh "$S" ;;
  run | tests | fp8-gemm | fp8-grouped | fp8-speed | fp8-curves | mlm-sft | grouped-speed)
    what="$1"
    shift
    sp=$(python3 -c 'import site;print(site.getsitepackages()[0])')
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}:$PWD/$C/lib:$PWD/build/sft-carry/lib"
    OUT="${OUT:-/tmp/out}"
    mkdir -p "$OUT"
    if [ "$what" = fp8-gemm ]; then
      mkdir -p /tmp/fp8_gemm
      "$C/laoyao_bench_fp8_gemm" /tmp/fp8_gemm | tee "$OUT/fp8_gemm_bench.txt"
      python3 bench/fp8_gemm_vs_torch.py /tmp/fp8_gemm | tee "$OUT/fp8_gemm_vs_torch.txt"
      exit 0
    fi
    if [ "$what" = fp8-grouped ]; then
      "$C/laoyao_bench_grouped_fp8" | tee "$OUT/grouped_fp8_bench.txt"
      exit 0
    fi
    if [ "$what" = fp8-speed ]; then
      cases="${*:-llama3_8b_4l_s8k qwen3_8b_4l_s4k}"
      read -ra runs <<< "${FP8_RUNS:-bf16 delayed tensorwise}"  # (a shorter set when device time is short)
      for r in "${runs[@]}"; do
        if [ "$r" = bf16 ]; then
          OUT="$OUT/$r" bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" $cases > "$OUT/fp8_speed_$r.md" 2>&1
        else
          OUT="$OUT/$r" NO_PEER=1 LAOYAO_ARGS="--fp8-format hybrid --fp8-recipe $r" \
            bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" $cases > "$OUT/fp8_speed_$r.md" 2>&1
        fi
        tail -n +2 "$OUT/fp8_speed_$r.md" | grep -v "^| case\|^|---" | grep "^|" | sed "s/^/$r /"
      done | python3 -c '
import sys
rows, recipes, B, NA = {}, [], "bf16", "n/a"
for line in sys.stdin:
    run, cells = line.split(" ", 1)
    c = [x.strip() for x in cells.strip().strip("|").split("|")]
    rows.setdefault(c[0], {})[run] = c
    if run != "bf16" and run not in recipes:
        recipes.append(run)
print("| case | BF16 tokens/s | PyTorch BF16 peer | BF16 / peer | " + " | ".join(f"FP8 {r} | vs BF16" for r in recipes)
      + " | mem GB (" + " / ".join(["bf16"] + recipes) + ") |")
print("|---|---|---|---|" + "---|---|" * len(recipes) + "---|")
for case, r in rows.items():
    b = r.get(B)
    tok = lambda k: float(r[k][1]) if k in r else float("nan")
    print(f"| {case} | {tok(B):.0f} | {b[2] if b else NA} | {b[3] if b else NA} | "
          + "".join(f"{tok(k):.0f} | {tok(k) / tok(B):.2f}x | " for k in recipes)
          + " / ".join(r[k][7] if k in r else NA for k in [B] + recipes) + " |")
' | tee "$OUT/fp8_speed.md"
      exit 0
    fi
    if [ "$what" = grouped-speed ]; then  # the flagship with each grouped-GEMM kernel set (docs/blackwell.md)
      for g in ${*:-tma portable}; do
        OUT="/tmp/grouped_$g" NO_PEER=1 LAOYAO_GROUPED_GEMM=$g \
          timeout 240 bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" moe_2b > "$OUT/grouped_$g.md" 2>&1
        grep "^| moe_2b" "$OUT/grouped_$g.md" | sed "s/^/LAOYAO_GROUPED_GEMM=$g /"
      done | tee "$OUT/grouped_speed.md"
      exit 0
    fi
    if [ "$what" = fp8-curves ]; then
      LAOYAO_TEST_VOCABS="$PWD/$C" FP8_CURVES_WORK="$PWD/$C/fp8data" LAOYAO_DEVICE=cuda \
        bash bench/fp8_curves.sh "$C/laoyao" "${1:-500}" | tee "$OUT/fp8_curves.txt"
      cp "$C"/fp8data/*.log "$OUT/" 2>/dev/null || true
      exit 0
    fi
    if [ "$what" = mlm-sft ]; then
      mkdir -p /tmp/mlm_sft
      S=build/sft-carry
      python3 tests/gpu/mlm_sft_check.py "$S/laoyao" "$S/qwen3" "$S/megatron_sft_tokenizer.py" /tmp/mlm_sft |
        tee "$OUT/mlm_sft_check.txt"
      exit "${PIPESTATUS[0]}"
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
  *) echo "usage: bash bench/finetune_bench.sh stage [BUILD_DIR] | run [CASE ...] | tests [FILTER] | fp8-gemm |" \
          "fp8-speed [CASE ...] | fp8-curves [ITERS] | grouped-speed [SET ...] | stage-sft | mlm-sft" >&2; exit 2 ;;
esac

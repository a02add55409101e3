#!/usr/bin/env bash
# Everything #5 asks of the GPU machine, in one call: doctor (on every visible GPU, with an NCCL
# all-reduce on the two-GPU kind), the GPU tests (every CUDA op against
# the CPU op, the CUDA model against the CPU model), a CPU-vs-GPU training run of the same config
# compared with `laoyao compare-logs`, and the benchmarks against the PyTorch peer.
#   scripts/gpu_check.sh stage [BUILD_DIR]   here: build laoyao and the GPU tests, copy them, the
#                                            shared libraries the GPU machine lacks (yaml-cpp 0.7)
#                                            and the peers (../shared/peers) to build/gpu-carry
#   scripts/gpu_check.sh run [PARTS]         there (device tool, carry ["build/gpu-carry"]); PARTS is
#                                            any of doctor tests parity parity_llama parity_fused
#                                            attention gemm profile memory_ops ncu
#                                            kernel_profile graph_gaps clocks phases
#                                            bench moe moe_quick grouped recipes
#                                            moe_dp2 moe_ep_speed dp2 dp2_speed tp2 four four_moe
#                                            (default: the first eight and bench; moe_dp2, moe_ep_speed, dp2* and tp2 need
#                                            nvidia-h200-x2, four and four_moe nvidia-h200-x4; BENCH_CASES picks
#                                            the bench cases, MOE_SPEED_ROUTING=natural|forced the
#                                            moe_2b throughput runs' routing (MOE_SPEED_RUNS picks
#                                            them: 1gpu dp2_overlap dp2_distopt ep2_overlap
#                                            ep2_distopt ep2_a2a ep2_both dp2_both), DP2_SPEED=0 drops dp2's
#                                            throughput runs, FOUR_SPEED=0 four's, PHASES_CASES
#                                            the phases part's cases, GROUPED_TESTS / GROUPED_BENCH
#                                            / GROUPED_FLAGSHIP the grouped part's kernel sets). Full logs go to
#                                            $OUT; a summary table is
#                                            printed last.
set -uo pipefail
C=build/gpu-carry
case "${1:-}" in
  stage)
    set -e
    B="${2:-build/main}"
    [ -f "$B/build.ninja" ] || cmake --preset default -B "$B"
    cmake --build "$B" --target laoyao laoyao_tests_kernels_cuda laoyao_tests_model_cuda laoyao_bench_attention laoyao_bench_step_breakdown \
      laoyao_bench_gemm laoyao_bench_grouped_gemm laoyao_bench_memory_ops -j2
    mkdir -p "$C/lib" "$C/peers"  # not emptied: tests/gpu/crosscheck.sh keeps its vocabularies there too
    cp "$B/laoyao" "$B/laoyao_tests_kernels_cuda" "$B/laoyao_tests_model_cuda" "$B/laoyao_bench_attention" "$B/laoyao_bench_step_breakdown" \
      "$B/laoyao_bench_gemm" "$B/laoyao_bench_grouped_gemm" "$B/laoyao_bench_memory_ops" "$C/"
    cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$C/lib/"
    # Gloo and what it pulls in (hiredis, ibverbs, libnl) are Debian's, absent on the GPU machine.
    for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$C/lib/"; done
    cp ../shared/peers/*.py "$C/peers/"
    du -sh "$C"
    ;;
  run)
    SP=$(python3 -c 'import site;print(site.getsitepackages()[0])')
    # The carried libraries last: where the machine has its own (libibverbs, say), its own win.
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$SP/nvidia/cudnn/lib:$SP/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}:$PWD/$C/lib"
    export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared hosts (.library/device/KINDS.md)
    OUT="${OUT:-/tmp/out}"
    mkdir -p "$OUT"
    parts="${*:2}"
    [ -n "$parts" ] || parts="doctor tests parity parity_llama parity_fused attention gemm profile bench"
    summary=()
    note() { summary+=("$1"); echo "$1"; }  # printed as it happens (a run cut short keeps what it has)
    # gpu_tests LIMIT FILTER: the CUDA kernels' tests, then the CUDA model's, under a gtest filter,
    # each under a time limit; the output of both on stdout (gtest's summary lines per binary).
    gpu_tests() {
      local limit=$1 filter=$2 bin
      for bin in laoyao_tests_kernels_cuda laoyao_tests_model_cuda; do
        timeout "$limit" "$C/$bin" --gtest_filter="$filter" || return $?
      done
    }
    # Nsight Compute's duration of each kernel (or graph), clocks and caches left alone, as CSV.
    nm=(--metrics gpu__time_duration.sum --clock-control none --cache-control none --csv --print-units base)
    # The small MoE model of the multi-GPU MoE parts (dropout off; a later repeat of a flag wins).
    moe_args=(pretrain-gpt --num-layers 2 --hidden-size 128 --num-attention-heads 2 --group-query-attention
              --num-query-groups 1 --ffn-hidden-size 256 --normalization RMSNorm --swiglu
              --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
              --attention-dropout 0 --hidden-dropout 0 --num-experts 8 --moe-router-topk 2
              --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --seq-length 128
              --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16 --eval-iters 2
              --eval-interval 10 --mock-data --bf16 --tokenizer-type NullTokenizer --vocab-size 4096 --lr 1e-3
              --min-lr 1e-4 --lr-warmup-iters 5 --lr-decay-iters 40 --seed 1234 --log-interval 1 --train-iters 20)
    # The last "elapsed time per iteration (ms)" of a training log.
    ms() { grep 'elapsed time per iteration' "$1" | tail -1 | sed -n 's|.*elapsed time per iteration (ms): *\([0-9.]*\).*|\1|p'; }
    # parity_run NAME LABEL MODEL-FLAGS...: the config on the CPU and on the GPU, then compare-logs.
    parity_run() {
      local name=$1 label=$2
      local args=(pretrain-gpt "${@:3}" --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4
                  --global-batch-size 16 --eval-iters 2 --eval-interval 10 --mock-data --bf16
                  --tokenizer-type NullTokenizer --vocab-size 4096 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5
                  --seed 1234 --log-interval 1)
      LAOYAO_DEVICE=cpu "$C/laoyao" "${args[@]}" > "$OUT/${name}_cpu.log" 2>&1
      LAOYAO_DEVICE=cuda "$C/laoyao" "${args[@]}" > "$OUT/${name}_gpu.log" 2>&1
      "$C/laoyao" compare-logs "$OUT/${name}_cpu.log" "$OUT/${name}_gpu.log" > "$OUT/${name}_compare.txt" 2>&1
      note "cpu-vs-gpu $label training: compare-logs exit $?: $(grep -i verdict "$OUT/${name}_compare.txt" | head -1)"
    }
    for part in $parts; do
      case "$part" in
        doctor)
          "$C/laoyao" doctor ${DOCTOR_ARGS:-} > "$OUT/doctor.txt" 2>&1  # e.g. DOCTOR_ARGS="--seed 7"
          note "doctor: exit $? ($(grep -c PASS "$OUT/doctor.txt") PASS lines)"
          ;;
        tests)
          # Each under a time limit (a hang must cost minutes, not the session's device time); the
          # NCCL timeout test, which exercises a hang on purpose, alone and shorter.
          gpu_tests 900 '-NcclTimeout.*' > "$OUT/gpu_tests.txt" 2>&1
          rc=$?
          note "gpu tests: exit $rc, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests.txt" | tr '\n' ' ')"
          # The tensor-parallel tests three more times (one failed once, its message lost): on two GPUs over
          # NCCL, on one with both ranks as threads on it.
          timeout 300 "$C/laoyao_tests_model_cuda" --gtest_filter='CudaGptModelTp.*' --gtest_repeat=3 \
            > "$OUT/gpu_tests_tp_repeat.txt" 2>&1
          note "tensor-parallel GPU tests x3: exit $?, $(grep -c '^\[       OK \]' "$OUT/gpu_tests_tp_repeat.txt") OK, \
$(grep -c "^\[  FAILED  \] CudaGptModelTp" "$OUT/gpu_tests_tp_repeat.txt") FAILED lines"
          timeout 120 "$C/laoyao_tests_model_cuda" --gtest_filter='NcclTimeout.*' > "$OUT/gpu_tests_nccl_timeout.txt" 2>&1
          rc=$?
          note "nccl timeout test: exit $rc (124: it hung), $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' \
            "$OUT/gpu_tests_nccl_timeout.txt" | tr '\n' ' ')"
          # What failed, in the failing tests' own words (the log itself may not come back).
          while read -r line; do note "  $line"; done < <(grep -h -E -A6 '(Failure|error:)' "$OUT/gpu_tests.txt" \
            "$OUT/gpu_tests_tp_repeat.txt" "$OUT/gpu_tests_nccl_timeout.txt" | head -40)
          ;;
        parity)
          # A small GPT (dropout on) trained on the CPU and on the GPU from the same initial
          # weights; compare-logs judges the per-iteration losses against BF16 tolerance.
          parity_run parity "GPT" --num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512 \
            --train-iters 30
          # Megatron's per-token loss (the step's summed gradients over its tokens), micro-batches
          # of different token counts (--eod-mask-loss).
          parity_run parity_per_token "GPT, --calculate-per-token-loss" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 4 --ffn-hidden-size 512 --eod-mask-loss --calculate-per-token-loss --train-iters 20
          # --decoupled-lr: the embeddings' (here untied from the output layer) AdamW runs at their own rate.
          parity_run parity_decoupled_lr "GPT, --decoupled-lr" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 4 --ffn-hidden-size 512 --untie-embeddings-and-output-weights --decoupled-lr 3e-3 \
            --decoupled-min-lr 3e-5 --train-iters 20
          # --reset-attention-mask: attention within documents (our flash kernels: head dim 64), positions reset.
          parity_run parity_documents "GPT, --reset-attention-mask (flash)" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 2 --ffn-hidden-size 512 --reset-attention-mask --reset-position-ids --transformer-impl local \
            --no-masked-softmax-fusion --train-iters 20
          ;;
        parity_llama)
          # The same with Llama's pieces: RMSNorm, SwiGLU, RoPE (Llama 3 scaling), GQA, no biases, untied.
          parity_run parity_llama "Llama-style" --num-layers 2 --hidden-size 128 --num-attention-heads 2 \
            --group-query-attention --num-query-groups 1 --ffn-hidden-size 256 --normalization RMSNorm --swiglu \
            --position-embedding-type rope --rotary-base 500000 --use-rope-scaling --disable-bias-linear \
            --untie-embeddings-and-output-weights --train-iters 20
          # Qwen3's: QK layernorm, whose GPU kernels apply RoPE in the same pass.
          parity_run parity_qwen3 "Qwen3-style (QK norm + RoPE fused)" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 2 --group-query-attention --num-query-groups 1 --ffn-hidden-size 256 \
            --normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 1000000 --qk-layernorm \
            --disable-bias-linear --untie-embeddings-and-output-weights --train-iters 20
          # The same with documents (--reset-attention-mask): GQA and RoPE on our flash kernels.
          parity_run parity_qwen3_documents "Qwen3-style, --reset-attention-mask" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 2 --group-query-attention --num-query-groups 1 --ffn-hidden-size 256 \
            --normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 1000000 --qk-layernorm \
            --disable-bias-linear --untie-embeddings-and-output-weights --reset-attention-mask --transformer-impl local \
            --no-masked-softmax-fusion --train-iters 20
          ;;
        parity_fused)
          # The Llama-style config without attention dropout: auto picks cuDNN's fused attention
          # (query heads gathered: 2 heads share one group), hidden dropout still on.
          parity_run parity_fused "Llama-style, cuDNN attention" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 2 --group-query-attention --num-query-groups 1 --ffn-hidden-size 256 \
            --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
            --untie-embeddings-and-output-weights --attention-dropout 0 --train-iters 20
          ;;
        moe|moe_quick)
          # Mixture of Experts: its GPU tests (kernels, grouped GEMMs, layer and model against the CPU),
          # a small MoE model trained on the CPU and on the GPU (compare-logs, load_balancing_loss
          # included; also with token dropping and random router logits, and with an expert bias),
          # then (not in moe_quick) the
          # grouped GEMMs against cuBLASLt and the 2B flagship against the PyTorch MoE peer.
          # (The tests part runs these too: not twice in one call.)
          if [[ " $parts " != *" tests "* ]]; then
            gpu_tests 300 'CudaMoe*:CudaGroupedGemm*' > "$OUT/gpu_tests_moe.txt" 2>&1
            note "MoE GPU tests: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests_moe.txt" | tr '\n' ' ')"
            while read -r line; do note "  $line"; done < <(grep -h -E -A6 '(Failure|error:)' "$OUT/gpu_tests_moe.txt" | head -30)
          fi
          parity_run parity_moe "MoE (8 experts, top-2, aux + z loss)" --num-layers 2 --hidden-size 128 \
            --num-attention-heads 2 --group-query-attention --num-query-groups 1 --ffn-hidden-size 256 \
            --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
            --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 --num-experts 8 \
            --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 \
            --train-iters 20
          small_moe=(--num-layers 2 --hidden-size 128 --num-attention-heads 2 --group-query-attention
                     --num-query-groups 1 --ffn-hidden-size 256 --normalization RMSNorm --swiglu
                     --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
                     --attention-dropout 0 --hidden-dropout 0 --num-experts 8 --moe-router-topk 2
                     --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2 --train-iters 20)
          parity_run parity_moe_capacity "MoE token dropping (capacity 0.5, probs, padded)" "${small_moe[@]}" \
            --moe-expert-capacity-factor 0.5 --moe-pad-expert-input-to-capacity
          parity_run parity_moe_capacity_position "MoE token dropping (capacity 1.0, position) + random logits" \
            "${small_moe[@]}" --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position \
            --moe-router-force-load-balancing
          # Aux-loss-free balancing: a sigmoid router's expert bias moved after every step.
          parity_run parity_moe_expert_bias "MoE sigmoid router with an expert bias (aux-loss-free)" \
            "${small_moe[@]:0:${#small_moe[@]}-4}" --moe-router-score-function sigmoid \
            --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 \
            --moe-router-load-balancing-type none --train-iters 20
          # DeepSeek-V3's routing: sigmoid, expert bias, group-limited (4 groups, 2 chosen), seq_aux_loss.
          parity_run parity_moe_groups "MoE sigmoid router, 4 groups / 2, expert bias, seq_aux_loss" \
            "${small_moe[@]:0:${#small_moe[@]}-4}" --moe-router-score-function sigmoid \
            --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 --moe-router-num-groups 4 \
            --moe-router-group-topk 2 --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-2 \
            --train-iters 20
          # DeepSeek-V4's score function: sqrt(softplus), an expert bias, seq_aux_loss.
          parity_run parity_moe_sqrtsoftplus "MoE sqrtsoftplus router, expert bias, seq_aux_loss" \
            "${small_moe[@]:0:${#small_moe[@]}-4}" --moe-router-score-function sqrtsoftplus \
            --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 \
            --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-2 --train-iters 20
          # global_aux_loss: the tokens per expert averaged over the step's 4 micro-batches.
          parity_run parity_moe_global "MoE global_aux_loss (running counts over micro-batches) + z-loss" \
            "${small_moe[@]:0:${#small_moe[@]}-4}" --moe-router-load-balancing-type global_aux_loss \
            --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --train-iters 20
          [ "$part" = moe_quick ] && continue
          timeout 120 "$C/laoyao_bench_grouped_gemm" > "$OUT/grouped_gemm.txt" 2>&1
          note "grouped GEMM bench (exit $?):"
          while read -r line; do note "  $line"; done < <(tail -14 "$OUT/grouped_gemm.txt")
          bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" moe_2b 2>&1 | tee "$OUT/bench.txt" | tail -3
          note "moe_2b: $(grep -E 'load_balancing_loss' "$OUT/bench_moe_2b.log" | tail -1 | cut -c1-400)"
          ;;
        grouped)
          # The grouped GEMMs' kernel sets (LAOYAO_GROUPED_GEMM): TMA-fed, persistent blocks, 128 x 256
          # tiles where they fit, bulk-stored epilogues (tma, the default) and cp.async-fed (cp_async).
          # GROUPED_TESTS: the sets the MoE and grouped-GEMM tests run with (the tests part runs the
          # default); GROUPED_BENCH: the grouped-GEMM bench's; GROUPED_FLAGSHIP: the flagship's step
          # (8 micro-batches of 2 x 4096).
          for v in ${GROUPED_TESTS:-cp_async}; do
            LAOYAO_GROUPED_GEMM=$v gpu_tests 300 'CudaMoe*:CudaGroupedGemm*' > "$OUT/gpu_tests_$v.txt" 2>&1
            note "MoE + grouped GEMM GPU tests, set $v: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests_$v.txt" | tr '\n' ' ')"
          done
          for v in ${GROUPED_BENCH:-cp_async tma}; do
            LAOYAO_GROUPED_GEMM=$v timeout 150 "$C/laoyao_bench_grouped_gemm" $([ $v != tma ] && echo --ours-only) \
              > "$OUT/grouped_gemm_$v.txt" 2>&1
            note "grouped GEMM bench, set $v (exit $?):"
            while read -r line; do note "  $line"; done < <(grep '^|' "$OUT/grouped_gemm_$v.txt")
          done
          for v in ${GROUPED_FLAGSHIP:-tma}; do
            LAOYAO_GROUPED_GEMM=$v bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" moe_2b_gbs16 \
              > "$OUT/flagship_$v.txt" 2>&1
            note "flagship, 16 x 4096 tokens a step, set $v: $(grep '^| moe_2b_gbs16' "$OUT/flagship_$v.txt")"
          done
          # The flagship's memory-bound kernels alone against a copy of the same bytes
          # (bench/memory_ops_bench.cpp): how far each is from the memory's speed.
          timeout 240 "$C/laoyao_bench_memory_ops" > "$OUT/memory_ops.txt" 2>&1
          note "memory-bound kernels (exit $?):"
          while read -r line; do note "  $line"; done < <(grep -E '^\||^Sum' "$OUT/memory_ops.txt")
          ;;
        ncu)
          # Nsight Compute on chosen kernels of a bench (NCU_BIN, default the memory-bound kernels'
          # bench; NCU_KERNELS, space-separated name regexes, one profiled launch each): speed of
          # light, occupancy, warp stall reasons, memory workload. Needs ncu on the machine and
          # profiling permission; the reports go to $OUT/ncu_<i>.txt.
          i=0
          for kr in ${NCU_KERNELS:-norm_backward_fused qk_rmsnorm_backward qk_rmsnorm_forward moe_perm_assign moe_permute_forward}; do
            i=$((i + 1))
            timeout 240 ncu -k "regex:$kr" --launch-skip 3 --launch-count 1 --section SpeedOfLight \
              --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
              "$C/${NCU_BIN:-laoyao_bench_memory_ops}" > "$OUT/ncu_$i.txt" 2>&1
            note "ncu $kr (exit $?):"
            while read -r line; do note "  $line"; done < <(grep -E '^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|ERR|Warp Cycles Per Issued|stalled|cycles being' "$OUT/ncu_$i.txt" | cut -c1-400 | head -24)
          done
          ;;
        kernel_profile)
          # Every kernel of a step, ours beside the compiled peer's (KPROF_CASES, default gpt2_124m):
          # Nsight Compute's durations (clocks and caches left alone; kernels run one at a time).
          # Ours: iterations 3 and 4, CUDA graphs off (a 2-iteration run counts the kernels to skip:
          # set-up and the GEMMs' timing runs); the peer: 2 steps inside bench/peer_profile_step.py's
          # NVTX range. Tables in $OUT/kprof_*.txt.
          for c in ${KPROF_CASES:-gpt2_124m}; do
            read -r -a shape <<< "$(bash bench/gpu_train_bench.sh --shape-args "$c")"
            run_ours() {
              LAOYAO_CUDA_GRAPHS=0 LAOYAO_DEVICE=cuda timeout 240 ncu "${nm[@]}" "${@:2}" "$C/laoyao" pretrain-gpt \
                --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 --eval-interval 100000 \
                --log-interval 1 "${shape[@]}" --train-iters "$1"
            }
            run_ours 2 > "$OUT/kprof_${c}_setup.csv" 2>&1
            skip=$(grep -c gpu__time_duration "$OUT/kprof_${c}_setup.csv")
            run_ours 4 --launch-skip "$skip" > "$OUT/kprof_${c}.csv" 2>&1
            python3 bench/kernel_profile_summary.py "$OUT/kprof_${c}.csv" 2 > "$OUT/kprof_$c.txt" 2>&1
            note "kernel profile, laoyao $c (exit $?, $skip kernels skipped):"
            while read -r line; do note "  $line"; done < <(head -16 "$OUT/kprof_$c.txt")
            peer="$C/peers/pytorch_gpt.py"
            case "$c" in moe_*) peer="$C/peers/pytorch_moe.py" ;; esac
            timeout 420 ncu --nvtx --nvtx-include "profile" "${nm[@]}" python3 bench/peer_profile_step.py "$peer" \
              "${c%%_gbs*}" --compile --steps 2 > "$OUT/kprof_peer_$c.csv" 2>&1
            python3 bench/kernel_profile_summary.py "$OUT/kprof_peer_$c.csv" 2 > "$OUT/kprof_peer_$c.txt" 2>&1
            note "kernel profile, peer $c (exit $?):"
            while read -r line; do note "  $line"; done < <(head -16 "$OUT/kprof_peer_$c.txt")
          done
          ;;
        graph_gaps)
          # How much of a CUDA-graph step is gaps between its kernels (GAPS_CASES, default
          # gpt2_124m): ncu on 6 iterations, each graph replay as one result, then each kernel alone
          # (clocks and caches left alone); bench/graph_gaps_summary.py compares the two.
          for c in ${GAPS_CASES:-gpt2_124m}; do
            read -r -a shape <<< "$(bash bench/gpu_train_bench.sh --shape-args "$c")"
            for mode in graph node; do
              LAOYAO_DEVICE=cuda timeout 200 ncu --graph-profiling $mode "${nm[@]}" "$C/laoyao" pretrain-gpt --mock-data \
                --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 --eval-interval 100000 --log-interval 1 \
                "${shape[@]}" --train-iters 6 > "$OUT/gaps_${c}_$mode.csv" 2>&1
            done
            python3 bench/graph_gaps_summary.py "$OUT/gaps_${c}_graph.csv" "$OUT/gaps_${c}_node.csv" \
              > "$OUT/gaps_$c.txt" 2>&1
            note "graph gaps $c (exit $?):"
            while read -r line; do note "  $line"; done < "$OUT/gaps_$c.txt"
          done
          ;;
        clocks)
          # The SM clock and board power while ours and the compiled peer train (CLOCKS_CASES,
          # default gpt2_124m): nvidia-smi sampled every 100 ms, the mean over ours' iterations after
          # the first logged (200 in all) and the peer's 300 timed steps (bench/peer_profile_step.py).
          # Whether a run is held back by the power limit: a lower clock for the same kernels.
          for c in ${CLOCKS_CASES:-gpt2_124m}; do
            read -r -a shape <<< "$(bash bench/gpu_train_bench.sh --shape-args "$c")"
            for who in laoyao peer; do
              nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
                -lms 100 > "$OUT/clocks_${who}_$c.csv" 2>&1 &
              smi=$!
              if [ $who = laoyao ]; then
                LAOYAO_DEVICE=cuda timeout 300 "$C/laoyao" pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer \
                  --lr 3e-4 --seed 1234 --eval-iters 0 --eval-interval 100000 --log-interval 10 "${shape[@]}" --train-iters 200 \
                  > "$OUT/clocks_run_${who}_$c.log" 2>&1
              else
                timeout 300 python3 bench/peer_profile_step.py "$C/peers/pytorch_gpt.py" "$c" --compile --steps 300 \
                  > "$OUT/clocks_run_${who}_$c.log" 2>&1
              fi
              kill $smi; wait $smi 2>/dev/null
              note "clocks $who $c: $(python3 bench/clock_samples.py "$OUT/clocks_${who}_$c.csv" \
                "$OUT/clocks_run_${who}_$c.log" 2>&1 | tail -1)"
            done
          done
          ;;
        phases)
          # Where each case's step goes by kind of op (LAOYAO_MODEL_PHASES, LAOYAO_MOE_PHASES and
          # LAOYAO_STEP_PHASES: CUDA events, graphs off), 6 iterations, the last step's lines.
          # PHASES_CASES picks the bench cases (default: the flagship MoE, Llama-3.2-1B, GPT-2 124M).
          for c in ${PHASES_CASES:-moe_2b llama32_1b_s8k gpt2_124m}; do
            read -r -a shape <<< "$(bash bench/gpu_train_bench.sh --shape-args "$c")"
            LAOYAO_DEVICE=cuda LAOYAO_MODEL_PHASES=1 LAOYAO_MOE_PHASES=1 LAOYAO_STEP_PHASES=1 "$C/laoyao" \
              pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 --eval-interval 100000 \
              --log-interval 1 "${shape[@]}" --train-iters 6 > "$OUT/phases_$c.log" 2>&1
            note "phases $c (exit $?):"
            while read -r line; do note "  $line"; done < <(grep -E 'laoyao: (model|MoE|step) phases' "$OUT/phases_$c.log" | tail -3)
          done
          ;;
        bench)
          bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" ${BENCH_CASES:-} 2>&1 |
            tee "$OUT/bench.txt" | tail -20
          ;;
        *) echo "unknown part $part" >&2; exit 2 ;;
      esac
    done
    echo "==== summary"
    printf '%s\n' "${summary[@]}" | tee "$OUT/00_summary.txt"
    [ -f "$OUT/bench.txt" ] && sed -n '/^| case/,$p' "$OUT/bench.txt"
    ;;
  *)
    echo "usage: $0 stage [BUILD_DIR] | run [doctor|tests|parity|bench ...]" >&2
    exit 2
    ;;
esac

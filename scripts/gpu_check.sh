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
          ;;
        recipes)
          # #6's and #9's recipes at their real size on one H200 (mock data, 200 iterations): the loss
          # falls; time per iteration and device memory from the log.
          for recipe in llama32_1b_pretrain_config moe_2b_pretrain_config; do
            mbs=1
            [ "$recipe" = moe_2b_pretrain_config ] && mbs=2
            LAOYAO_DEVICE=cuda "$C/laoyao" run-recipe --recipe "$recipe" train.train_iters=200 train.global_batch_size=2 \
              train.micro_batch_size=$mbs validation.eval_interval=200 validation.eval_iters=1 logger.log_interval=50 \
              checkpoint.save=null checkpoint.load=null scheduler.lr_warmup_iters=20 model.context_parallel_size=1 \
              > "$OUT/recipe_$recipe.log" 2>&1
            rc=$?
            losses=$(grep -o 'lm loss: [0-9.E+-]*' "$OUT/recipe_$recipe.log" | head -5 | sed 's/lm loss: //' | tr '\n' ' ')
            note "$recipe (200 its, 2 x seq a step): exit $rc; lm loss every 50 its: $losses; $(ms "$OUT/recipe_$recipe.log") ms/it; $(grep -o 'device memory held: *[0-9.]* GB' "$OUT/recipe_$recipe.log" | tail -1)"
          done
          ;;
        moe_dp2|moe_ep_speed)
          # The small MoE model (dropout off) on two GPUs against one GPU: data-parallel, expert-parallel
          # and tensor-parallel (moe_ep_speed: only the flagship's throughput runs below).
          [ "$part" = moe_dp2 ] && {
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe_args[@]}" > "$OUT/moe_dp1.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" > "$OUT/moe_dp2.log" 2>&1
          note "MoE DP=2 launch exit $?"
          "$C/laoyao" compare-logs "$OUT/moe_dp1.log" "$OUT/moe_dp2.log" > "$OUT/compare_moe_dp1_dp2.txt" 2>&1
          note "MoE dp1 vs dp2 on GPUs: compare-logs exit $?: $(grep -i verdict "$OUT/compare_moe_dp1_dp2.txt" | head -1)"
          # Expert parallelism over the two GPUs (NCCL all-to-all, 4 experts each), against one GPU;
          # with the distributed optimizer too (the dense parameters sharded over both GPUs, each
          # GPU's experts whole), whose checkpoint (every expert under its global number, the whole
          # moments) resumes on one GPU.
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" \
            --expert-model-parallel-size 2 > "$OUT/moe_ep2.log" 2>&1
          note "MoE EP=2 (all-gather dispatcher, Megatron's default) launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" \
            --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall > "$OUT/moe_ep2_a2a.log" 2>&1
          note "MoE EP=2 all-to-all dispatcher launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" \
            --expert-model-parallel-size 2 --use-distributed-optimizer --save /tmp/moe_ep2_ckpt --save-interval 20 \
            > "$OUT/moe_ep2_distopt.log" 2>&1
          note "MoE EP=2 distributed optimizer launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe_args[@]}" --train-iters 22 > "$OUT/moe_dp1_22.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe_args[@]}" --train-iters 22 --load /tmp/moe_ep2_ckpt \
            > "$OUT/moe_ep2_resumed.log" 2>&1
          note "MoE EP=2 distributed-optimizer checkpoint resumed on one GPU: exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" \
            --expert-model-parallel-size 2 --overlap-grad-reduce > "$OUT/moe_ep2_overlap.log" 2>&1
          note "MoE EP=2 --overlap-grad-reduce launch exit $?"
          # Tensor parallelism (sequence parallel; 4 heads in 2 query groups, so that TP=2 splits them)
          # against one GPU on the same model.
          moe_tp=("${moe_args[@]}" --num-attention-heads 4 --num-query-groups 2)
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe_tp[@]}" > "$OUT/moe_tp1.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_tp[@]}" \
            --tensor-model-parallel-size 2 --sequence-parallel > "$OUT/moe_tp2.log" 2>&1
          note "MoE TP=2 (sequence parallel) launch exit $?"
          # Random router logits (--moe-router-force-load-balancing): the CPU, one GPU and EP=2 draw the same.
          LAOYAO_DEVICE=cpu "$C/laoyao" "${moe_args[@]}" --moe-router-force-load-balancing > "$OUT/moe_fb_cpu.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe_args[@]}" --moe-router-force-load-balancing > "$OUT/moe_fb_dp1.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${moe_args[@]}" \
            --moe-router-force-load-balancing --expert-model-parallel-size 2 > "$OUT/moe_fb_ep2.log" 2>&1
          note "MoE force-balanced runs exit $?"
          for pair in "moe_dp1 moe_ep2" "moe_dp1 moe_ep2_a2a" "moe_dp1 moe_ep2_distopt" "moe_dp1 moe_ep2_overlap" "moe_dp1_22 moe_ep2_resumed" \
                      "moe_tp1 moe_tp2" "moe_fb_cpu moe_fb_dp1" \
                      "moe_fb_dp1 moe_fb_ep2"; do
            read -r a b <<< "$pair"
            "$C/laoyao" compare-logs "$OUT/$a.log" "$OUT/$b.log" > "$OUT/compare_${a}_${b}.txt" 2>&1
            note "$a vs $b on GPUs: compare-logs exit $?: $(grep -i verdict "$OUT/compare_${a}_${b}.txt" | head -1)"
          done
          }
          # Throughput: the flagship's model at one global batch of 4 sequences of 4096: one GPU (two
          # micro-batches), two GPUs data-parallel, two GPUs expert-parallel (EP=2, DP=2).
          read -r -a flagship <<< "$(bash bench/gpu_train_bench.sh --shape-args moe_2b)"
          tput=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234
                --eval-iters 0 --eval-interval 100000 --log-interval 5 --log-throughput "${flagship[@]}" --global-batch-size 4)
          # The same with --moe-router-force-load-balancing (random router logits, as Megatron's
          # benchmarks): an untrained router sends most tokens of a layer to a few experts, which
          # under EP leaves one rank waiting for the other. Each with --overlap-grad-reduce,
          # --use-distributed-optimizer or both (_both); ep2_a2a: the all-to-all dispatcher.
          # MOE_SPEED_ROUTING=natural|forced|both (default both) picks the sets.
          export LAOYAO_STEP_PHASES=1 LAOYAO_MOE_PHASES=1
          fb=--moe-router-force-load-balancing
          sets=("" _fb)
          [ "${MOE_SPEED_ROUTING:-both}" = natural ] && sets=("")
          [ "${MOE_SPEED_ROUTING:-both}" = forced ] && sets=(_fb)
          speed_runs=()
          for set in "${sets[@]}"; do
            f=""
            [ -n "$set" ] && f=$fb
            speed_runs+=("1gpu$set $f" "dp2_overlap$set --overlap-grad-reduce $f" "dp2_distopt$set --use-distributed-optimizer $f"
                         "ep2_overlap$set --expert-model-parallel-size 2 --overlap-grad-reduce $f"
                         "ep2_distopt$set --expert-model-parallel-size 2 --use-distributed-optimizer $f"
                         "ep2_a2a$set --expert-model-parallel-size 2 --use-distributed-optimizer --moe-token-dispatcher-type alltoall $f"
                         "ep2_both$set --expert-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce $f"
                         "dp2_both$set --use-distributed-optimizer --overlap-grad-reduce $f")
          done
          # MOE_SPEED_RUNS="1gpu ep2_distopt" (names without the _fb suffix) runs only those.
          if [ -n "${MOE_SPEED_RUNS:-}" ]; then
            kept=()
            for run in "${speed_runs[@]}"; do
              base=${run%% *}
              [[ " $MOE_SPEED_RUNS " == *" ${base%_fb} "* ]] && kept+=("$run")
            done
            speed_runs=("${kept[@]}")
          fi
          for run in "${speed_runs[@]}"; do
            read -r name flags <<< "$run"
            launch=(launch --nproc-per-node 2 -- "$C/laoyao")
            [[ $name == 1gpu* ]] && launch=()
            # shellcheck disable=SC2086  # flags: several words
            LAOYAO_DEVICE=cuda "$C/laoyao" "${launch[@]}" pretrain-gpt "${tput[@]}" $flags > "$OUT/moe2b_$name.log" 2>&1
            note "moe_2b $name exit $?"
          done
          unset LAOYAO_STEP_PHASES LAOYAO_MOE_PHASES
          for set in "${sets[@]}"; do
            ms1=$(ms "$OUT/moe2b_1gpu$set.log")
            line="moe_2b${set:+ force-balanced}, 4 x 4096 tokens a step: 1 GPU ${ms1:-?} ms/step"
            for name in dp2_overlap dp2_distopt dp2_both ep2_overlap ep2_distopt ep2_a2a ep2_both; do
              [ -f "$OUT/moe2b_$name$set.log" ] || continue
              m=$(ms "$OUT/moe2b_$name$set.log")
              line+="; $name ${m:-?} ms ($(python3 -c "print(f'{$ms1/$m:.2f}x')" 2>/dev/null || echo n/a))"
            done
            note "$line"
          done
          for run in "${speed_runs[@]}"; do
            run=${run%% *}
            f="$OUT/moe2b_$run.log"
            note "  $run: $(grep -o 'device memory held: *[0-9.]* GB' "$f" | tail -1); $(grep -o 'lm loss: [0-9.E+-]*' "$f" | tail -1); $(grep -o 'load_balancing_loss: [0-9.E+-]*' "$f" | tail -1)"
            note "    $(grep 'step phases' "$f" | tail -1 | sed 's/.*step phases/step phases/')"
            note "    $(grep 'MoE phases' "$f" | tail -1 | sed 's/.*MoE phases/MoE phases/')"
          done
          ;;
        dp2|dp2_speed)
          # Data parallelism over two GPUs (nvidia-h200-x2; NCCL gradients, Gloo host values): the GPT
          # parity config (dropout on) at DP=2 through `laoyao launch` against DP=1, same global batch
          # (dp2_speed: only the throughput runs below).
          [ "$part" = dp2 ] && {
          dp_args=(pretrain-gpt --num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512
                   --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16
                   --eval-iters 2 --eval-interval 10 --mock-data --bf16 --tokenizer-type NullTokenizer
                   --vocab-size 4096 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5 --lr-decay-iters 40 --seed 1234
                   --log-interval 1 --train-iters 30)
          LAOYAO_DEVICE=cuda "$C/laoyao" "${dp_args[@]}" > "$OUT/dp1.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${dp_args[@]}" > "$OUT/dp2.log" 2>&1
          note "DP=2 launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${dp_args[@]}" --overlap-grad-reduce \
            > "$OUT/dp2_overlap.log" 2>&1
          note "DP=2 --overlap-grad-reduce launch exit $?"
          # The distributed optimizer (reduce-scattered gradients, sharded Adam, all-gathered bf16
          # parameters); its checkpoint (whole tensors) resumes on one GPU for two more iterations.
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" "${dp_args[@]}" \
            --use-distributed-optimizer --save /tmp/dp2_distopt_ckpt --save-interval 30 > "$OUT/dp2_distopt.log" 2>&1
          note "DP=2 distributed optimizer launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" "${dp_args[@]}" --train-iters 32 > "$OUT/dp1_32.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" "${dp_args[@]}" --train-iters 32 --load /tmp/dp2_distopt_ckpt \
            > "$OUT/dp2_distopt_resumed.log" 2>&1
          note "DP=2 distributed-optimizer checkpoint resumed on one GPU: exit $?"
          for pair in "dp1 dp2" "dp1 dp2_overlap" "dp1 dp2_distopt" "dp1_32 dp2_distopt_resumed"; do
            read -r a b <<< "$pair"
            "$C/laoyao" compare-logs "$OUT/$a.log" "$OUT/$b.log" > "$OUT/compare_${a}_${b}.txt" 2>&1
            note "$a vs $b on GPUs: compare-logs exit $?: $(grep -i verdict "$OUT/compare_${a}_${b}.txt" | head -1)"
          done
          }
          # Throughput: the Llama-3.2-1B shape at seq 8192, one sequence per GPU a step, 1 GPU vs 2,
          # with each step's GPU phases (LAOYAO_STEP_PHASES) to see where DP=2's extra time goes.
          # DP2_SPEED=0 leaves it out of dp2.
          [ "$part" = dp2 ] && [ "${DP2_SPEED:-1}" = 0 ] && continue
          export LAOYAO_STEP_PHASES=1
          read -r -a llama <<< "$(bash bench/gpu_train_bench.sh --shape-args llama32_1b_s8k)"
          tput=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234
                --eval-iters 0 --eval-interval 100000 --log-interval 5 --log-throughput "${llama[@]}")
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${tput[@]}" --global-batch-size 1 > "$OUT/dp1_llama.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" pretrain-gpt "${tput[@]}" \
            --global-batch-size 2 > "$OUT/dp2_llama.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao" pretrain-gpt "${tput[@]}" \
            --global-batch-size 2 --overlap-grad-reduce > "$OUT/dp2_overlap_llama.log" 2>&1
          ms1=$(ms "$OUT/dp1_llama.log"); ms2=$(ms "$OUT/dp2_llama.log"); ms3=$(ms "$OUT/dp2_overlap_llama.log")
          note "Llama-3.2-1B s8k: DP=1 ${ms1:-?} ms/step (1 x 8192 tokens), DP=2 ${ms2:-?} ms/step (2 x 8192): $(python3 -c "print(f'{2*$ms1/$ms2:.2f}x tokens/s')" 2>/dev/null || echo n/a)"
          note "  DP=2 --overlap-grad-reduce ${ms3:-?} ms/step: $(python3 -c "print(f'{2*$ms1/$ms3:.2f}x tokens/s')" 2>/dev/null || echo n/a)"
          for run in dp1_llama dp2_llama dp2_overlap_llama; do
            note "  $run: $(grep 'step phases' "$OUT/$run.log" | tail -1 | sed 's/.*step phases/step phases/')"
          done
          unset LAOYAO_STEP_PHASES
          ;;
        four)
          # Four GPUs (nvidia-h200-x4, #8): the Llama-3.2-1B shape at seq 8192, TP=2 x DP=2 with
          # sequence parallelism and the distributed optimizer against one GPU (22 iterations of 4
          # sequences, the same initial weights); its checkpoint of iteration 20 (whole tensors, whole
          # moments) resumed on one GPU and at TP=2 on two, against its own iterations 21-22; then
          # throughput against one GPU: DP=4 (plain, --overlap-grad-reduce, --use-distributed-optimizer)
          # and TP=2 x DP=2 (FOUR_SPEED=0 leaves it out).
          read -r -a llama <<< "$(bash bench/gpu_train_bench.sh --shape-args llama32_1b_s8k)"
          L4=("$C/laoyao" launch --nproc-per-node 4 -- "$C/laoyao")
          L2=("$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao")
          run4=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 1e-4 --min-lr 1e-5 --lr-warmup-iters 5
                --lr-decay-iters 40 --seed 1234 --log-interval 1 --eval-interval 10 --eval-iters 1 "${llama[@]}"
                --global-batch-size 4 --train-iters 22)
          tp2dp2=(--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer)
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${run4[@]}" > "$OUT/four_tp1.log" 2>&1
          LAOYAO_DEVICE=cuda "${L4[@]}" pretrain-gpt "${run4[@]}" "${tp2dp2[@]}" --save /tmp/four_ckpt \
            --save-interval 20 > "$OUT/four_tp2dp2.log" 2>&1
          note "TP=2 x DP=2 (SP, distributed optimizer) launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${run4[@]}" --load /tmp/four_ckpt --ckpt-step 20 \
            > "$OUT/four_resumed_1gpu.log" 2>&1
          note "TP=2 x DP=2 checkpoint resumed on one GPU: exit $?"
          LAOYAO_DEVICE=cuda "${L2[@]}" pretrain-gpt "${run4[@]}" --load /tmp/four_ckpt --ckpt-step 20 \
            --tensor-model-parallel-size 2 --sequence-parallel > "$OUT/four_resumed_tp2.log" 2>&1
          note "TP=2 x DP=2 checkpoint resumed at TP=2 on two GPUs: exit $?"
          rm -rf /tmp/four_ckpt
          for pair in "four_tp1 four_tp2dp2" "four_tp2dp2 four_resumed_1gpu" "four_tp2dp2 four_resumed_tp2"; do
            read -r a b <<< "$pair"
            "$C/laoyao" compare-logs "$OUT/$a.log" "$OUT/$b.log" > "$OUT/compare_${a}_${b}.txt" 2>&1
            note "$a vs $b: compare-logs exit $?: $(grep -i verdict "$OUT/compare_${a}_${b}.txt" | head -1)"
          done
          [ "${FOUR_SPEED:-1}" = 0 ] && continue
          export LAOYAO_STEP_PHASES=1
          tput=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234
                --eval-iters 0 --eval-interval 100000 --log-interval 5 --log-throughput "${llama[@]}")
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${tput[@]}" --global-batch-size 1 > "$OUT/four_speed_1gpu.log" 2>&1
          for run in "dp4 4" "dp4_overlap 4 --overlap-grad-reduce" "dp4_distopt 4 --use-distributed-optimizer" \
                     "tp2dp2 2 ${tp2dp2[*]}"; do
            read -r name gbs flags <<< "$run"
            # shellcheck disable=SC2086  # flags: several words
            LAOYAO_DEVICE=cuda "${L4[@]}" pretrain-gpt "${tput[@]}" --global-batch-size "$gbs" $flags \
              > "$OUT/four_speed_$name.log" 2>&1
            rc=$?
            ms1=$(ms "$OUT/four_speed_1gpu.log"); m=$(ms "$OUT/four_speed_$name.log")
            note "Llama-3.2-1B s8k $name ($gbs x 8192 tokens a step): exit $rc; ${m:-?} ms/step against 1 GPU's ${ms1:-?} (1 x 8192): $(python3 -c "print(f'{$gbs*$ms1/$m:.2f}x tokens/s')" 2>/dev/null || echo n/a); $(grep -o 'device memory held: *[0-9.]* GB' "$OUT/four_speed_$name.log" | tail -1)"
            note "  $(grep 'step phases' "$OUT/four_speed_$name.log" | tail -1 | sed 's/.*step phases/step phases/')"
          done
          unset LAOYAO_STEP_PHASES
          ;;
        four_moe)
          # Four GPUs (nvidia-h200-x4): the small MoE model (4 heads in 2 query groups, so that TP=2
          # splits them) at TP=2 x EP=2 with sequence parallelism (the EP pairs are the data-parallel
          # ones) against one GPU: both token dispatchers, the distributed optimizer, and that run's
          # checkpoint of iteration 20 resumed on one GPU against one GPU's iterations 21-22.
          moe4=("${moe_args[@]}" --num-attention-heads 4 --num-query-groups 2)
          tpep=(--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2)
          L4=("$C/laoyao" launch --nproc-per-node 4 -- "$C/laoyao")
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe4[@]}" > "$OUT/four_moe_1gpu.log" 2>&1
          LAOYAO_DEVICE=cuda "${L4[@]}" "${moe4[@]}" "${tpep[@]}" > "$OUT/four_moe_tp2ep2.log" 2>&1
          note "MoE TP=2 x EP=2 (all-gather dispatcher) launch exit $?"
          LAOYAO_DEVICE=cuda "${L4[@]}" "${moe4[@]}" "${tpep[@]}" --moe-token-dispatcher-type alltoall \
            > "$OUT/four_moe_tp2ep2_a2a.log" 2>&1
          note "MoE TP=2 x EP=2 all-to-all dispatcher launch exit $?"
          LAOYAO_DEVICE=cuda "${L4[@]}" "${moe4[@]}" "${tpep[@]}" --use-distributed-optimizer --save /tmp/four_moe_ckpt \
            --save-interval 20 > "$OUT/four_moe_tp2ep2_distopt.log" 2>&1
          note "MoE TP=2 x EP=2 distributed optimizer launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe4[@]}" --train-iters 22 > "$OUT/four_moe_1gpu_22.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" "${moe4[@]}" --train-iters 22 --load /tmp/four_moe_ckpt \
            > "$OUT/four_moe_resumed.log" 2>&1
          note "MoE TP=2 x EP=2 checkpoint resumed on one GPU: exit $?"
          rm -rf /tmp/four_moe_ckpt
          for pair in "four_moe_1gpu four_moe_tp2ep2" "four_moe_1gpu four_moe_tp2ep2_a2a" \
                      "four_moe_1gpu four_moe_tp2ep2_distopt" "four_moe_1gpu_22 four_moe_resumed"; do
            read -r a b <<< "$pair"
            "$C/laoyao" compare-logs "$OUT/$a.log" "$OUT/$b.log" > "$OUT/compare_${a}_${b}.txt" 2>&1
            note "$a vs $b: compare-logs exit $?: $(grep -i verdict "$OUT/compare_${a}_${b}.txt" | head -1)"
          done
          ;;
        tp2)
          # Tensor parallelism over two GPUs (nvidia-h200-x2): the seed's two-GPU pair, MLM flags and
          # their Bridge twin (tests/config/test_util.hpp: TP=2 with sequence parallelism, dropout on),
          # each against the same config at TP=1 on one GPU, then MLM against Bridge.
          seed=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 --seq-length 1024
                --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 32 --train-iters 10
                --eval-iters 2 --eval-interval 10 --mock-data --bf16 --use-mcore-models --tokenizer-type NullTokenizer
                --vocab-size 1024 --lr 1e-4 --min-lr 1e-5 --seed 1234 --log-interval 1)
          twin=(model.num_layers=4 model.hidden_size=256 model.num_attention_heads=4 model.ffn_hidden_size=1024
                model.seq_length=1024 dataset.seq_length=1024 train.train_iters=10 train.global_batch_size=32
                train.micro_batch_size=4 validation.eval_interval=10 validation.eval_iters=2 optimizer.lr=1e-4
                optimizer.min_lr=1e-5 scheduler.lr_warmup_iters=1 scheduler.lr_decay_iters=10 rng.seed=1234
                logger.log_interval=1 tokenizer.vocab_size=1024)
          L2=("$C/laoyao" launch --nproc-per-node 2 -- "$C/laoyao")
          # (The MLM run saves, for its run_config.yaml; Bridge pads the vocabulary (1025 with its
          # NullTokenizer) to a multiple of 128 x TP, so its TP=1 runs ask for 256 to be the same model.)
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${seed[@]}" > "$OUT/tp1_mlm.log" 2>&1
          LAOYAO_DEVICE=cuda "${L2[@]}" pretrain-gpt --tensor-model-parallel-size 2 --sequence-parallel "${seed[@]}" \
            --save /tmp/tp2_mlm_ckpt --save-interval 10 > "$OUT/tp2_mlm.log" 2>&1
          note "MLM TP=2 SP launch exit $?"
          LAOYAO_DEVICE=cuda "$C/laoyao" run-recipe --recipe vanilla_gpt_pretrain_config "${twin[@]}" \
            model.make_vocab_size_divisible_by=256 checkpoint.save=/tmp/tp1_bridge_ckpt > "$OUT/tp1_bridge.log" 2>&1
          LAOYAO_DEVICE=cuda "${L2[@]}" run-recipe --recipe vanilla_gpt_pretrain_config "${twin[@]}" \
            model.tensor_model_parallel_size=2 model.sequence_parallel=true checkpoint.save=/tmp/tp2_bridge_ckpt \
            > "$OUT/tp2_bridge.log" 2>&1
          note "Bridge TP=2 SP launch exit $?"
          # The checkpoint the TP=2 Bridge run saved (whole tensors) resumes at TP=1 on one GPU: its
          # iterations 11-12 against a TP=1 run of 12 iterations straight through.
          LAOYAO_DEVICE=cuda "$C/laoyao" run-recipe --recipe vanilla_gpt_pretrain_config "${twin[@]}" \
            train.train_iters=12 model.make_vocab_size_divisible_by=256 checkpoint.save=/tmp/tp1_12_ckpt \
            > "$OUT/tp1_bridge_12.log" 2>&1
          LAOYAO_DEVICE=cuda "$C/laoyao" run-recipe --recipe vanilla_gpt_pretrain_config "${twin[@]}" \
            train.train_iters=12 model.make_vocab_size_divisible_by=256 checkpoint.load=/tmp/tp2_bridge_ckpt \
            checkpoint.save=/tmp/tp_resumed_ckpt > "$OUT/tp2_resumed_at_tp1.log" 2>&1
          note "TP=2 checkpoint resumed at TP=1: exit $? ($(grep -c ' iteration ' "$OUT/tp2_resumed_at_tp1.log") iterations logged)"
          for pair in "tp1_mlm tp2_mlm" "tp1_bridge tp2_bridge" "tp1_bridge_12 tp2_resumed_at_tp1"; do
            read -r a b <<< "$pair"
            "$C/laoyao" compare-logs "$OUT/$a.log" "$OUT/$b.log" > "$OUT/compare_${a}_${b}.txt" 2>&1
            note "$a vs $b: compare-logs exit $?: $(grep -i verdict "$OUT/compare_${a}_${b}.txt" | head -1)"
          done
          # MLM against its Bridge twin: not the same run (Bridge's recipe keeps its own schedule,
          # optimizer and tokenizer settings); compare-logs names the config fields that differ.
          "$C/laoyao" compare-logs "$OUT/tp2_mlm.log" "$OUT/tp2_bridge.log" --config-a /tmp/tp2_mlm_ckpt/run_config.yaml \
            --config-b /tmp/tp2_bridge_ckpt/run_config.yaml > "$OUT/compare_tp2_mlm_tp2_bridge.txt" 2>&1
          note "tp2_mlm vs tp2_bridge: compare-logs exit $?; $(sed -n '/^config/,/^verdict/p' "$OUT/compare_tp2_mlm_tp2_bridge.txt" | head -30 | tr '\n' ';')"
          # Throughput: the Llama-3.2-1B shape at seq 8192, one sequence a step, TP=1 vs TP=2 (+SP).
          read -r -a llama <<< "$(bash bench/gpu_train_bench.sh --shape-args llama32_1b_s8k)"
          tput=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234
                --eval-iters 0 --eval-interval 100000 --log-interval 5 --log-throughput --global-batch-size 1 "${llama[@]}")
          LAOYAO_DEVICE=cuda "$C/laoyao" pretrain-gpt "${tput[@]}" > "$OUT/tp1_llama.log" 2>&1
          LAOYAO_DEVICE=cuda "${L2[@]}" pretrain-gpt "${tput[@]}" --tensor-model-parallel-size 2 \
            --sequence-parallel > "$OUT/tp2_llama.log" 2>&1
          ms1=$(ms "$OUT/tp1_llama.log"); ms2=$(ms "$OUT/tp2_llama.log")
          note "Llama-3.2-1B s8k, 1 x 8192 tokens a step: TP=1 ${ms1:-?} ms/step, TP=2+SP ${ms2:-?} ms/step: $(python3 -c "print(f'{$ms1/$ms2:.2f}x tokens/s')" 2>/dev/null || echo n/a)"
          ;;
        ckpt)
          # Checkpoints on one GPU: a dense GPT and the small MoE model saved at iteration 20 (plain
          # and --async-save) and resumed to 23 give iterations 21-23 bit for bit as the run that
          # never stopped: the logged losses at 21 and 23, the grad norms at 21-23 (a resumed run's
          # line 22 shows the losses' mean over 21 and 22: Megatron-LM's first-interval quirk, #6237).
          dense_args=(pretrain-gpt --num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512
                      --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16
                      --eval-iters 2 --eval-interval 10 --mock-data --bf16 --tokenizer-type NullTokenizer
                      --vocab-size 4096 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5 --lr-decay-iters 40 --seed 1234
                      --log-interval 1 --attention-dropout 0 --hidden-dropout 0)
          tail_numbers() {
            grep -E ' iteration +2[123]/' "$1" | while read -r line; do
              it=$(echo "$line" | sed -n 's|.* iteration *\([0-9]*\)/.*|\1|p')
              echo "$it $(echo "$line" | grep -oE '(lm loss|grad norm|load_balancing_loss|z_loss): [^|]*' |
                { if [ "$it" = 22 ]; then grep 'grad norm'; else cat; fi; } | tr '\n' ' ')"
            done
          }
          for model in dense moe; do
            if [ $model = dense ]; then args=("${dense_args[@]}"); else args=("${moe_args[@]}"); fi
            LAOYAO_DEVICE=cuda "$C/laoyao" "${args[@]}" --train-iters 23 > "$OUT/ckpt_${model}_23.log" 2>&1
            for mode in sync async; do
              extra=(); [ $mode = async ] && extra=(--async-save)
              rm -rf "/tmp/ckpt_${model}_$mode"
              LAOYAO_DEVICE=cuda "$C/laoyao" "${args[@]}" --train-iters 23 --exit-interval 20 --save-interval 20 \
                --save "/tmp/ckpt_${model}_$mode" "${extra[@]}" > "$OUT/ckpt_${model}_$mode.log" 2>&1
              note "$model saved at 20 ($mode): exit $?: $(ls "/tmp/ckpt_${model}_$mode/iter_0000020" 2>&1 | tr '\n' ' ')"
              LAOYAO_DEVICE=cuda "$C/laoyao" "${args[@]}" --train-iters 23 --load "/tmp/ckpt_${model}_$mode" \
                > "$OUT/ckpt_${model}_${mode}_resumed.log" 2>&1
              status=$?
              want=$(tail_numbers "$OUT/ckpt_${model}_23.log"); got=$(tail_numbers "$OUT/ckpt_${model}_${mode}_resumed.log")
              if [ -n "$want" ] && [ "$want" = "$got" ]; then verdict="bit-identical"; else verdict="DIFFER"; fi
              note "$model resumed ($mode): exit $status, iterations 21-23 $verdict ($(echo $got | head -c 100))"
            done
          done
          ;;
        attention)
          # Flash attention alone against PyTorch's SDPA, fwd+bwd, same shapes (device.md's).
          { "$C/laoyao_bench_attention" ${ATTN_BENCH_UNDER_LOAD:+--under-load}; python3 bench/attention_sdpa.py; } > "$OUT/attention.txt" 2>&1
          note "attention TFLOP/s, fwd and fwd+bwd: laoyao flash / laoyao via cuDNN / PyTorch sdpa:"
          while read -r line; do note "  $line"; done < <(grep '^ATTN_DOCS' "$OUT/attention.txt")
          while read -r line; do note "  $line"; done < <(python3 - "$OUT/attention.txt" <<'PY'
import re, sys
rows = {}
for l in open(sys.argv[1]):
    m = re.match(r"ATTN (\w+) (b=\d+ H=\d+(?: G=\d+)? s=\d+ D=\d+) fwd_TFLOPs=([\d.]+) fwdbwd_TFLOPs=([\d.]+)", l)
    if m: rows.setdefault(m.group(2), {})[m.group(1)] = (float(m.group(3)), float(m.group(4)))
for shape, r in rows.items():
    lo, cu, sd = r.get("laoyao", (0, 0)), r.get("cudnn", (0, 0)), r.get("sdpa", (0, 0))
    print(f"{shape}: fwd {lo[0]:.0f} / {cu[0]:.0f} / {sd[0]:.0f}, fwd+bwd {lo[1]:.0f} / {cu[1]:.0f} / {sd[1]:.0f}"
          f" (cudnn/sdpa {cu[1] / max(sd[1], 1e-9):.2f}x)")
PY
)
          ;;
        gemm)
          # The 8192-class layers' GEMMs: the kept algorithm against cuBLASLt's best candidate.
          "$C/laoyao_bench_gemm" > "$OUT/gemm.txt" 2>&1
          note "gemm (exit $?):"
          while read -r line; do note "  $line"; done < "$OUT/gemm.txt"
          ;;
        profile)
          # Where a GPT-2 124M step's GPU time goes, op by op (bench/step_breakdown_bench.cpp) ...
          "$C/laoyao_bench_step_breakdown" > "$OUT/step_breakdown.txt" 2>&1
          note "profile (exit $?):"
          while read -r line; do note "  $line"; done < <(head -40 "$OUT/step_breakdown.txt")
          # ... and of the seed model's (2 layers, hidden 256, vocab 32000, 4 x 512 tokens).
          "$C/laoyao_bench_step_breakdown" 2 256 4 1024 32000 512 4 > "$OUT/step_breakdown_seed.txt" 2>&1
          while read -r line; do note "  $line"; done < <(head -40 "$OUT/step_breakdown_seed.txt")
          ;;
        memory_ops)
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

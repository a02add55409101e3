# shellcheck shell=bash
# Every check of the GPU machine, declared (declare_case, scripts/gpu_lib.sh):
#   declare_case PARTS NAME KIND GPUS LIMIT RULE -- COMMAND...
# KIND is TEST (RULE: the verdict_* rule that says PASS or FAIL) or MEASUREMENT (RULE: the figures_*
# reader of what it measured; it ran or failed to run). scripts/gpu_check.sh runs the cases of the
# parts asked for, lists them (`list`) or prints their commands (DRY_RUN=1). The cases of a part run
# in the order declared: a comparison reads the log of the reference run declared before it.
# shellcheck source=scripts/gpu_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"

declare_parts doctor tests parity parity_llama parity_fused moe moe_quick peft grouped recipes moe_dp2 \
  moe_ep_speed dp2 dp2_speed four four_moe tp2 ckpt attention gemm profile memory_ops ncu \
  kernel_profile graph_gaps clocks phases bench hf mla host_memory hf_convert
# shellcheck disable=SC2034  # read by scripts/gpu_check.sh
DEFAULT_PARTS=(doctor tests parity parity_llama parity_fused attention gemm profile bench)

# ---- The models and runs the cases share

# A small GPT and the Llama-style pieces (RMSNorm, SwiGLU, RoPE, GQA), dropout on.
small_gpt=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512)
small_llama=(--num-layers 2 --hidden-size 128 --num-attention-heads 2 --group-query-attention --num-query-groups 1
             --ffn-hidden-size 256 --normalization RMSNorm --swiglu --position-embedding-type rope)
untied=(--disable-bias-linear --untie-embeddings-and-output-weights)
# The small MoE model (dropout off): 8 experts, top-2; each case adds its routing and loss flags.
small_moe=("${small_llama[@]}" "${untied[@]}" --attention-dropout 0 --hidden-dropout 0 --num-experts 8
           --moe-router-topk 2 --moe-ffn-hidden-size 64)
# The small models' training run (mock data, BF16, 16 sequences of 128 a step).
small_run=(--seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16 --eval-iters 2
           --eval-interval 10 --mock-data --bf16 --tokenizer-type NullTokenizer --vocab-size 4096 --lr 1e-3
           --min-lr 1e-4 --lr-warmup-iters 5 --lr-decay-iters 40 --seed 1234 --log-interval 1)
# The multi-GPU and checkpoint parts' small MoE run (a later repeat of a flag wins).
moe_args=(pretrain-gpt "${small_moe[@]}" --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 "${small_run[@]}"
          --train-iters 20)
# The same with 4 heads in 2 query groups, so that TP=2 splits them.
moe_tp=("${moe_args[@]}" --num-attention-heads 4 --num-query-groups 2)
# Throughput runs: mock data, no evaluation, the bench shapes' flags added.
throughput=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234 --eval-iters 0
            --eval-interval 100000 --log-interval 5 --log-throughput)
read -r -a flagship <<< "$(shape_args moe_2b)"
read -r -a llama_s8k <<< "$(shape_args llama32_1b_s8k)"

# then_remove_dir DIR COMMAND...: COMMAND, then DIR removed (a checkpoint no later case reads).
then_remove_dir() {
  "${@:2}"
  local rc=$?
  x rm -rf "$1"
  return "$rc"
}

# ---- doctor

# laoyao doctor on every visible GPU (with its NCCL all-reduce where there are two); DOCTOR_ARGS adds
# flags (e.g. "--seed 7").
# shellcheck disable=SC2086  # DOCTOR_ARGS: several words
declare_case doctor doctor TEST 1 300 checks:doctor.txt -- run_to "$OUT/doctor.txt" "$C/laoyao" doctor ${DOCTOR_ARGS:-}

# ---- tests: every CUDA op against the CPU op, the CUDA model against the CPU model

# Each binary under a time limit; the NCCL timeout test, which hangs on purpose, apart and shorter.
declare_case tests gpu_tests TEST 1 1860 gtest:gpu_tests.txt -- gpu_tests "$OUT/gpu_tests.txt" 900 '-NcclTimeout.*'
# The tensor-parallel tests three more times (one failed once, its message lost): on two GPUs over
# NCCL, on one with both ranks as threads on it.
declare_case tests gpu_tests_tp_repeat TEST 1 360 gtest:gpu_tests_tp_repeat.txt -- \
  run_to "$OUT/gpu_tests_tp_repeat.txt" timeout 300 "$C/laoyao_tests_model_cuda" --gtest_filter='CudaGptModelTp.*' \
  --gtest_repeat=3
declare_case tests nccl_timeout TEST 1 180 gtest:gpu_tests_nccl_timeout.txt -- \
  run_to "$OUT/gpu_tests_nccl_timeout.txt" timeout 120 "$C/laoyao_tests_model_cuda" --gtest_filter='NcclTimeout.*'

# ---- parity, parity_llama, parity_fused: a small model trained on the CPU and on the GPU from the
# same initial weights; compare-logs judges the per-iteration losses against BF16 tolerance

declare_case parity parity TEST 1 900 compare:parity_compare.txt -- parity_run parity "${small_gpt[@]}" --train-iters 30
# Megatron's per-token loss (the step's summed gradients over its tokens), micro-batches of
# different token counts (--eod-mask-loss).
declare_case parity parity_per_token TEST 1 900 compare:parity_per_token_compare.txt -- \
  parity_run parity_per_token "${small_gpt[@]}" --eod-mask-loss --calculate-per-token-loss --train-iters 20
# --decoupled-lr: the embeddings' (here untied from the output layer) AdamW runs at their own rate.
declare_case parity parity_decoupled_lr TEST 1 900 compare:parity_decoupled_lr_compare.txt -- \
  parity_run parity_decoupled_lr "${small_gpt[@]}" --untie-embeddings-and-output-weights --decoupled-lr 3e-3 \
  --decoupled-min-lr 3e-5 --train-iters 20
# --reset-attention-mask: attention within documents (our flash kernels: head dim 64), positions reset.
declare_case parity parity_documents TEST 1 900 compare:parity_documents_compare.txt -- \
  parity_run parity_documents --num-layers 2 --hidden-size 128 --num-attention-heads 2 --ffn-hidden-size 512 \
  --reset-attention-mask --reset-position-ids --transformer-impl local --no-masked-softmax-fusion --train-iters 20

# Llama's pieces: RMSNorm, SwiGLU, RoPE (Llama 3 scaling), GQA, no biases, untied.
declare_case parity_llama parity_llama TEST 1 900 compare:parity_llama_compare.txt -- \
  parity_run parity_llama "${small_llama[@]}" --rotary-base 500000 --use-rope-scaling "${untied[@]}" --train-iters 20
# Qwen3's: QK layernorm, whose GPU kernels apply RoPE in the same pass.
declare_case parity_llama parity_qwen3 TEST 1 900 compare:parity_qwen3_compare.txt -- \
  parity_run parity_qwen3 "${small_llama[@]}" --rotary-base 1000000 --qk-layernorm "${untied[@]}" --train-iters 20
# The same with documents (--reset-attention-mask): GQA and RoPE on our flash kernels.
declare_case parity_llama parity_qwen3_documents TEST 1 900 compare:parity_qwen3_documents_compare.txt -- \
  parity_run parity_qwen3_documents "${small_llama[@]}" --rotary-base 1000000 --qk-layernorm "${untied[@]}" \
  --reset-attention-mask --transformer-impl local --no-masked-softmax-fusion --train-iters 20

# YaRN positions (--position-embedding-type yarn): its frequencies and concentration factor in the
# table both backends use.
declare_case parity_llama parity_yarn TEST 1 900 compare:parity_yarn_compare.txt -- \
  parity_run parity_yarn "${small_llama[@]}" --position-embedding-type yarn --rotary-scaling-factor 4 \
  --yarn-original-max-position-embeddings 32 "${untied[@]}" --train-iters 20

# LoRA (peft.scheme lora) from the same pretrained base: the adapters' GEMMs, the frozen base.
declare_case parity_llama,peft parity_lora TEST 1 900 compare:parity_lora_compare.txt -- \
  lora_parity_run parity_lora 0.1 "${small_llama[@]}" --rotary-base 500000 "${untied[@]}"

# ---- mla: multi-latent attention (DeepSeek's) on the GPU: its kernel and model tests, then a
# small MLA model (query latent, YaRN) trained on the CPU and the GPU, dense and with DeepSeek's
# MoE layers (dense first layer, sigmoid routing with the expert bias, a shared expert).
small_mla=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 256 --normalization RMSNorm
           --swiglu --position-embedding-type yarn --rotary-scaling-factor 4 --multi-latent-attention
           --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 --qk-pos-emb-head-dim 16 --v-head-dim 32
           --attention-dropout 0 "${untied[@]}")
declare_case mla mla_gpu_tests TEST 1 600 gtest:gpu_tests_mla.txt -- \
  gpu_tests "$OUT/gpu_tests_mla.txt" 300 '*Mla*:*Mtp*:*Separate*:*DeepseekHeadDims*:*UnequalHeadDims*'
declare_case mla parity_mla TEST 1 900 compare:parity_mla_compare.txt -- \
  parity_run parity_mla "${small_mla[@]}" --train-iters 20
declare_case mla parity_mla_moe TEST 1 900 compare:parity_mla_moe_compare.txt -- \
  parity_run parity_mla_moe "${small_mla[@]}" --hidden-dropout 0 --num-experts 8 --moe-router-topk 2 \
  --moe-ffn-hidden-size 64 --moe-layer-freq '[0,1]' --moe-router-score-function sigmoid \
  --moe-router-enable-expert-bias --moe-shared-expert-intermediate-size 64 --moe-router-topk-scaling-factor 2.5 \
  --train-iters 20
# Multi-token prediction (DeepSeek-V3's MTP block) on the MLA model: the lm loss compared; the logs'
# mtp_1 loss lines beside it.
declare_case mla parity_mtp TEST 1 900 compare:parity_mtp_compare.txt -- \
  parity_run parity_mtp "${small_mla[@]}" --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --train-iters 20

# The Llama-style config without attention dropout: auto picks cuDNN's fused attention (query heads
# gathered: 2 heads share one group), hidden dropout still on.
declare_case parity_fused parity_fused TEST 1 900 compare:parity_fused_compare.txt -- \
  parity_run parity_fused "${small_llama[@]}" "${untied[@]}" --attention-dropout 0 --train-iters 20

# ---- moe, moe_quick: Mixture of Experts on one GPU

# The MoE GPU tests (kernels, grouped GEMMs, layer and model against the CPU), unless the tests part
# runs them in the same call.
declare_case moe,moe_quick moe_gpu_tests TEST 1 660 gtest:gpu_tests_moe.txt -- \
  gpu_tests "$OUT/gpu_tests_moe.txt" 300 'CudaMoe*:CudaGroupedGemm*'
skip_moe_gpu_tests() { part_selected tests && echo "the tests part runs them"; }
# The small MoE model trained on the CPU and on the GPU (load_balancing_loss compared too).
declare_case moe,moe_quick parity_moe TEST 1 900 compare:parity_moe_compare.txt -- \
  parity_run parity_moe "${small_moe[@]}" --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --train-iters 20
# Token dropping: capacity 0.5 by probabilities, padded.
declare_case moe,moe_quick parity_moe_capacity TEST 1 900 compare:parity_moe_capacity_compare.txt -- \
  parity_run parity_moe_capacity "${small_moe[@]}" --moe-aux-loss-coeff 1e-2 --train-iters 20 \
  --moe-expert-capacity-factor 0.5 --moe-pad-expert-input-to-capacity
# Token dropping: capacity 1.0 by position, with random router logits.
declare_case moe,moe_quick parity_moe_capacity_position TEST 1 900 compare:parity_moe_capacity_position_compare.txt -- \
  parity_run parity_moe_capacity_position "${small_moe[@]}" --moe-aux-loss-coeff 1e-2 --train-iters 20 \
  --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position --moe-router-force-load-balancing
# Aux-loss-free balancing: a sigmoid router's expert bias moved after every step.
declare_case moe,moe_quick parity_moe_expert_bias TEST 1 900 compare:parity_moe_expert_bias_compare.txt -- \
  parity_run parity_moe_expert_bias "${small_moe[@]}" --moe-router-score-function sigmoid \
  --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 --moe-router-load-balancing-type none \
  --train-iters 20
# DeepSeek-V3's routing: sigmoid, expert bias, group-limited (4 groups, 2 chosen), seq_aux_loss.
declare_case moe,moe_quick parity_moe_groups TEST 1 900 compare:parity_moe_groups_compare.txt -- \
  parity_run parity_moe_groups "${small_moe[@]}" --moe-router-score-function sigmoid \
  --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 --moe-router-num-groups 4 \
  --moe-router-group-topk 2 --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-2 --train-iters 20
# DeepSeek-V4's score function: sqrt(softplus), an expert bias, seq_aux_loss.
declare_case moe,moe_quick parity_moe_sqrtsoftplus TEST 1 900 compare:parity_moe_sqrtsoftplus_compare.txt -- \
  parity_run parity_moe_sqrtsoftplus "${small_moe[@]}" --moe-router-score-function sqrtsoftplus \
  --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 --moe-router-load-balancing-type seq_aux_loss \
  --moe-aux-loss-coeff 1e-2 --train-iters 20
# global_aux_loss: the tokens per expert averaged over the step's 4 micro-batches; with z-loss.
declare_case moe,moe_quick parity_moe_global TEST 1 900 compare:parity_moe_global_compare.txt -- \
  parity_run parity_moe_global "${small_moe[@]}" --moe-router-load-balancing-type global_aux_loss \
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --train-iters 20
# LoRA from a pretrained MoE base (a dense first layer, a shared expert): the routed experts' shared
# adapter pair on the grouped GEMMs' rows, the shared expert's, the frozen router and experts.
declare_case moe,moe_quick,peft parity_lora_moe TEST 1 900 compare:parity_lora_moe_compare.txt -- \
  lora_parity_run parity_lora_moe 0 "${small_moe[@]}" --moe-aux-loss-coeff 1e-2 --moe-layer-freq '[0,1]' \
  --moe-shared-expert-intermediate-size 64
# (moe only) The grouped GEMMs against cuBLASLt, and the 2B flagship against the PyTorch MoE peer.
declare_case moe grouped_gemm_bench MEASUREMENT 1 180 table:grouped_gemm.txt -- \
  run_to "$OUT/grouped_gemm.txt" timeout 120 "$C/laoyao_bench_grouped_gemm"
declare_case moe moe_2b_bench MEASUREMENT 1 1200 moe_2b_bench:moe_2b_bench.txt -- bench_run moe_2b_bench.txt moe_2b
figures_moe_2b_bench() {
  figures_bench "$1"
  echo "moe_2b: $(grep -E 'load_balancing_loss' "$OUT/bench_moe_2b.log" 2> /dev/null | tail -1 | cut -c1-400)"
}

# ---- grouped: the grouped GEMMs' kernel sets (LAOYAO_GROUPED_GEMM): tma (the default; TMA-fed,
# persistent blocks, 128 x 256 tiles where they fit, bulk-stored epilogues), cp_async, and portable
# (warp-level MMAs: what auto takes off Hopper, docs/blackwell.md)

# GROUPED_TESTS: the sets the MoE and grouped-GEMM tests run with (the tests part runs the default).
for set in ${GROUPED_TESTS:-cp_async portable}; do
  declare_case grouped "grouped_tests_$set" TEST 1 660 "gtest:gpu_tests_$set.txt" -- \
    gpu_tests "$OUT/gpu_tests_$set.txt" 300 'CudaMoe*:CudaGroupedGemm*' "LAOYAO_GROUPED_GEMM=$set"
done
# GROUPED_BENCH: the grouped-GEMM bench's sets (cuBLASLt beside tma only).
for set in ${GROUPED_BENCH:-cp_async portable tma}; do
  ours_only=()
  [ "$set" != tma ] && ours_only=(--ours-only)
  declare_case grouped "grouped_bench_$set" MEASUREMENT 1 210 "table:grouped_gemm_$set.txt" -- \
    run_to "$OUT/grouped_gemm_$set.txt" "LAOYAO_GROUPED_GEMM=$set" timeout 150 "$C/laoyao_bench_grouped_gemm" \
    "${ours_only[@]}"
done
# GROUPED_FLAGSHIP: the flagship's step (8 micro-batches of 2 x 4096) with each set.
for set in ${GROUPED_FLAGSHIP:-tma portable}; do
  declare_case grouped "flagship_$set" MEASUREMENT 1 900 "bench:flagship_$set.txt" -- \
    bench_run "flagship_$set.txt" "LAOYAO_GROUPED_GEMM=$set" moe_2b_gbs16
done

# ---- recipes: #6's and #9's recipes at their real size on one H200 (mock data, 200 iterations):
# the loss every 50 iterations, time per iteration, device memory

for recipe in llama32_1b_pretrain_config moe_2b_pretrain_config; do
  mbs=1
  [ "$recipe" = moe_2b_pretrain_config ] && mbs=2
  declare_case recipes "recipe_${recipe%_pretrain_config}" MEASUREMENT 1 1200 "recipe:recipe_$recipe.log" -- \
    train "recipe_$recipe" 1 run-recipe --recipe "$recipe" train.train_iters=200 train.global_batch_size=2 \
    train.micro_batch_size=$mbs validation.eval_interval=200 validation.eval_iters=1 logger.log_interval=50 \
    checkpoint.save=null checkpoint.load=null scheduler.lr_warmup_iters=20 model.context_parallel_size=1
done
figures_recipe() {
  local f=$OUT/$1
  echo "lm loss every 50 its: $(grep -o 'lm loss: [0-9.E+-]*' "$f" 2> /dev/null | head -5 | sed 's/lm loss: //' | tr '\n' ' ')\
; $(ms "$f") ms/it; $(last_match "$f" 'device memory held: *[0-9.]* GB')"
}

# ---- moe_dp2: the small MoE model on two GPUs against one GPU (nvidia-h200-x2)

# Data parallelism.
declare_case moe_dp2 moe_dp1 TEST 1 600 exit -- train moe_dp1 1 "${moe_args[@]}"
declare_case moe_dp2 moe_dp2 TEST 2 600 compare:compare_moe_dp1_moe_dp2.txt -- \
  train_and_compare moe_dp1 moe_dp2 2 "${moe_args[@]}"
# Expert parallelism (4 experts a GPU): the all-gather dispatcher (Megatron's default), all-to-all,
# the distributed optimizer (dense parameters sharded, each GPU's experts whole), whose checkpoint
# (every expert under its global number, the whole moments) resumes on one GPU.
declare_case moe_dp2 moe_ep2 TEST 2 600 compare:compare_moe_dp1_moe_ep2.txt -- \
  train_and_compare moe_dp1 moe_ep2 2 "${moe_args[@]}" --expert-model-parallel-size 2
declare_case moe_dp2 moe_ep2_a2a TEST 2 600 compare:compare_moe_dp1_moe_ep2_a2a.txt -- \
  train_and_compare moe_dp1 moe_ep2_a2a 2 "${moe_args[@]}" --expert-model-parallel-size 2 \
  --moe-token-dispatcher-type alltoall
declare_case moe_dp2 moe_ep2_distopt TEST 2 600 compare:compare_moe_dp1_moe_ep2_distopt.txt -- \
  train_and_compare moe_dp1 moe_ep2_distopt 2 "${moe_args[@]}" --expert-model-parallel-size 2 \
  --use-distributed-optimizer --save /tmp/moe_ep2_ckpt --save-interval 20
declare_case moe_dp2 moe_dp1_22 TEST 1 600 exit -- train moe_dp1_22 1 "${moe_args[@]}" --train-iters 22
declare_case moe_dp2 moe_ep2_resumed TEST 2 600 compare:compare_moe_dp1_22_moe_ep2_resumed.txt -- \
  train_and_compare moe_dp1_22 moe_ep2_resumed 1 "${moe_args[@]}" --train-iters 22 --load /tmp/moe_ep2_ckpt
declare_case moe_dp2 moe_ep2_overlap TEST 2 600 compare:compare_moe_dp1_moe_ep2_overlap.txt -- \
  train_and_compare moe_dp1 moe_ep2_overlap 2 "${moe_args[@]}" --expert-model-parallel-size 2 --overlap-grad-reduce
# Tensor parallelism with sequence parallelism.
declare_case moe_dp2 moe_tp1 TEST 1 600 exit -- train moe_tp1 1 "${moe_tp[@]}"
declare_case moe_dp2 moe_tp2 TEST 2 600 compare:compare_moe_tp1_moe_tp2.txt -- \
  train_and_compare moe_tp1 moe_tp2 2 "${moe_tp[@]}" --tensor-model-parallel-size 2 --sequence-parallel
# Random router logits (--moe-router-force-load-balancing): the CPU, one GPU and EP=2 draw the same.
declare_case moe_dp2 moe_fb_cpu TEST 1 600 exit -- train moe_fb_cpu cpu "${moe_args[@]}" --moe-router-force-load-balancing
declare_case moe_dp2 moe_fb_dp1 TEST 1 600 compare:compare_moe_fb_cpu_moe_fb_dp1.txt -- \
  train_and_compare moe_fb_cpu moe_fb_dp1 1 "${moe_args[@]}" --moe-router-force-load-balancing
declare_case moe_dp2 moe_fb_ep2 TEST 2 600 compare:compare_moe_fb_dp1_moe_fb_ep2.txt -- \
  train_and_compare moe_fb_dp1 moe_fb_ep2 2 "${moe_args[@]}" --moe-router-force-load-balancing \
  --expert-model-parallel-size 2

# ---- moe_dp2, moe_ep_speed: the flagship's throughput at one global batch of 4 sequences of 4096:
# one GPU (two micro-batches), two GPUs data-parallel, two expert-parallel (EP=2, DP=2), each with
# --overlap-grad-reduce, --use-distributed-optimizer or both (_both); ep2_a2a: the all-to-all
# dispatcher. _fb: random router logits, as Megatron's benchmarks (an untrained router sends most
# tokens of a layer to a few experts, which under EP leaves one rank waiting for the other).
# MOE_SPEED_ROUTING=natural|forced keeps one set (default both); MOE_SPEED_RUNS="1gpu ep2_distopt"
# (names without _fb) only those runs.

moe_speed_routings=("" _fb)
[ "${MOE_SPEED_ROUTING:-both}" = natural ] && moe_speed_routings=("")
[ "${MOE_SPEED_ROUTING:-both}" = forced ] && moe_speed_routings=(_fb)
for routing in "${moe_speed_routings[@]}"; do
  forced=()
  [ -n "$routing" ] && forced=(--moe-router-force-load-balancing)
  for run in "1gpu" "dp2_overlap --overlap-grad-reduce" "dp2_distopt --use-distributed-optimizer" \
             "ep2_overlap --expert-model-parallel-size 2 --overlap-grad-reduce" \
             "ep2_distopt --expert-model-parallel-size 2 --use-distributed-optimizer" \
             "ep2_a2a --expert-model-parallel-size 2 --use-distributed-optimizer --moe-token-dispatcher-type alltoall" \
             "ep2_both --expert-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce" \
             "dp2_both --use-distributed-optimizer --overlap-grad-reduce"; do
    read -r -a flags <<< "$run"
    [ -z "${MOE_SPEED_RUNS:-}" ] || [[ " $MOE_SPEED_RUNS " == *" ${flags[0]} "* ]] || continue
    name=moe2b_${flags[0]}$routing
    if [ "${flags[0]}" = 1gpu ]; then gpus=1 rule=speed:$name.log; else gpus=2 rule=speed:$name.log,moe2b_1gpu$routing.log,1; fi
    declare_case moe_dp2,moe_ep_speed "$name" MEASUREMENT "$gpus" 900 "$rule" -- \
      train "$name" "$gpus" LAOYAO_STEP_PHASES=1 LAOYAO_MOE_PHASES=1 pretrain-gpt "${throughput[@]}" \
      "${flagship[@]}" --global-batch-size 4 "${flags[@]:1}" "${forced[@]}"
  done
done

# ---- dp2: data parallelism over two GPUs (nvidia-h200-x2; NCCL gradients, Gloo host values): the
# small GPT (dropout on) at DP=2 through `laoyao launch` against DP=1, same global batch

dp_args=(pretrain-gpt "${small_gpt[@]}" "${small_run[@]}" --train-iters 30)
declare_case dp2 dp1 TEST 1 600 exit -- train dp1 1 "${dp_args[@]}"
declare_case dp2 dp2 TEST 2 600 compare:compare_dp1_dp2.txt -- train_and_compare dp1 dp2 2 "${dp_args[@]}"
declare_case dp2 dp2_overlap TEST 2 600 compare:compare_dp1_dp2_overlap.txt -- \
  train_and_compare dp1 dp2_overlap 2 "${dp_args[@]}" --overlap-grad-reduce
# The distributed optimizer (reduce-scattered gradients, sharded Adam, all-gathered bf16 parameters);
# its checkpoint (whole tensors) resumes on one GPU for two more iterations.
declare_case dp2 dp2_distopt TEST 2 600 compare:compare_dp1_dp2_distopt.txt -- \
  train_and_compare dp1 dp2_distopt 2 "${dp_args[@]}" --use-distributed-optimizer --save /tmp/dp2_distopt_ckpt \
  --save-interval 30
declare_case dp2 dp1_32 TEST 1 600 exit -- train dp1_32 1 "${dp_args[@]}" --train-iters 32
declare_case dp2 dp2_distopt_resumed TEST 2 600 compare:compare_dp1_32_dp2_distopt_resumed.txt -- \
  train_and_compare dp1_32 dp2_distopt_resumed 1 "${dp_args[@]}" --train-iters 32 --load /tmp/dp2_distopt_ckpt

# dp2, dp2_speed: throughput of the Llama-3.2-1B shape at seq 8192, one sequence per GPU a step, 1 GPU
# against 2, with each step's GPU phases to see where DP=2's extra time goes. DP2_SPEED=0 leaves them
# out of dp2.
dp_speed_parts=dp2,dp2_speed
[ "${DP2_SPEED:-1}" = 0 ] && dp_speed_parts=dp2_speed
declare_case "$dp_speed_parts" dp1_llama MEASUREMENT 1 900 speed:dp1_llama.log -- \
  train dp1_llama 1 LAOYAO_STEP_PHASES=1 pretrain-gpt "${throughput[@]}" "${llama_s8k[@]}" --global-batch-size 1
declare_case "$dp_speed_parts" dp2_llama MEASUREMENT 2 900 speed:dp2_llama.log,dp1_llama.log,2 -- \
  train dp2_llama 2 LAOYAO_STEP_PHASES=1 pretrain-gpt "${throughput[@]}" "${llama_s8k[@]}" --global-batch-size 2
declare_case "$dp_speed_parts" dp2_overlap_llama MEASUREMENT 2 900 speed:dp2_overlap_llama.log,dp1_llama.log,2 -- \
  train dp2_overlap_llama 2 LAOYAO_STEP_PHASES=1 pretrain-gpt "${throughput[@]}" "${llama_s8k[@]}" \
  --global-batch-size 2 --overlap-grad-reduce

# ---- four: four GPUs (nvidia-h200-x4, #8): the Llama-3.2-1B shape at seq 8192, TP=2 x DP=2 with
# sequence parallelism and the distributed optimizer against one GPU (22 iterations of 4 sequences,
# the same initial weights); its checkpoint of iteration 20 (whole tensors, whole moments) resumed on
# one GPU and at TP=2 on two, against its own iterations 21-22

run4=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 1e-4 --min-lr 1e-5 --lr-warmup-iters 5 --lr-decay-iters 40
      --seed 1234 --log-interval 1 --eval-interval 10 --eval-iters 1 "${llama_s8k[@]}" --global-batch-size 4
      --train-iters 22)
tp2dp2=(--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer)
declare_case four four_tp1 TEST 1 900 exit -- train four_tp1 1 pretrain-gpt "${run4[@]}"
declare_case four four_tp2dp2 TEST 4 900 compare:compare_four_tp1_four_tp2dp2.txt -- \
  train_and_compare four_tp1 four_tp2dp2 4 pretrain-gpt "${run4[@]}" "${tp2dp2[@]}" --save /tmp/four_ckpt \
  --save-interval 20
declare_case four four_resumed_1gpu TEST 4 600 compare:compare_four_tp2dp2_four_resumed_1gpu.txt -- \
  train_and_compare four_tp2dp2 four_resumed_1gpu 1 pretrain-gpt "${run4[@]}" --load /tmp/four_ckpt --ckpt-step 20
declare_case four four_resumed_tp2 TEST 4 600 compare:compare_four_tp2dp2_four_resumed_tp2.txt -- \
  then_remove_dir /tmp/four_ckpt train_and_compare four_tp2dp2 four_resumed_tp2 2 pretrain-gpt "${run4[@]}" \
  --load /tmp/four_ckpt --ckpt-step 20 --tensor-model-parallel-size 2 --sequence-parallel
# Throughput against one GPU: DP=4 (plain, --overlap-grad-reduce, --use-distributed-optimizer) and
# TP=2 x DP=2. FOUR_SPEED=0 leaves them out.
if [ "${FOUR_SPEED:-1}" != 0 ]; then
  declare_case four four_speed_1gpu MEASUREMENT 1 900 speed:four_speed_1gpu.log -- \
    train four_speed_1gpu 1 LAOYAO_STEP_PHASES=1 pretrain-gpt "${throughput[@]}" "${llama_s8k[@]}" --global-batch-size 1
  for run in "dp4 4" "dp4_overlap 4 --overlap-grad-reduce" "dp4_distopt 4 --use-distributed-optimizer" \
             "tp2dp2 2 ${tp2dp2[*]}"; do
    read -r -a flags <<< "$run"
    declare_case four "four_speed_${flags[0]}" MEASUREMENT 4 900 \
      "speed:four_speed_${flags[0]}.log,four_speed_1gpu.log,${flags[1]}" -- \
      train "four_speed_${flags[0]}" 4 LAOYAO_STEP_PHASES=1 pretrain-gpt "${throughput[@]}" "${llama_s8k[@]}" \
      --global-batch-size "${flags[1]}" "${flags[@]:2}"
  done
fi

# ---- four_moe: four GPUs (nvidia-h200-x4): the small MoE model at TP=2 x EP=2 with sequence
# parallelism (the EP pairs are the data-parallel ones) against one GPU: both token dispatchers, the
# distributed optimizer, and that run's checkpoint of iteration 20 resumed on one GPU against one
# GPU's iterations 21-22

tpep=(--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2)
declare_case four_moe four_moe_1gpu TEST 1 600 exit -- train four_moe_1gpu 1 "${moe_tp[@]}"
declare_case four_moe four_moe_tp2ep2 TEST 4 600 compare:compare_four_moe_1gpu_four_moe_tp2ep2.txt -- \
  train_and_compare four_moe_1gpu four_moe_tp2ep2 4 "${moe_tp[@]}" "${tpep[@]}"
declare_case four_moe four_moe_tp2ep2_a2a TEST 4 600 compare:compare_four_moe_1gpu_four_moe_tp2ep2_a2a.txt -- \
  train_and_compare four_moe_1gpu four_moe_tp2ep2_a2a 4 "${moe_tp[@]}" "${tpep[@]}" --moe-token-dispatcher-type alltoall
declare_case four_moe four_moe_tp2ep2_distopt TEST 4 600 compare:compare_four_moe_1gpu_four_moe_tp2ep2_distopt.txt -- \
  train_and_compare four_moe_1gpu four_moe_tp2ep2_distopt 4 "${moe_tp[@]}" "${tpep[@]}" --use-distributed-optimizer \
  --save /tmp/four_moe_ckpt --save-interval 20
declare_case four_moe four_moe_1gpu_22 TEST 1 600 exit -- train four_moe_1gpu_22 1 "${moe_tp[@]}" --train-iters 22
declare_case four_moe four_moe_resumed TEST 4 600 compare:compare_four_moe_1gpu_22_four_moe_resumed.txt -- \
  then_remove_dir /tmp/four_moe_ckpt train_and_compare four_moe_1gpu_22 four_moe_resumed 1 "${moe_tp[@]}" \
  --train-iters 22 --load /tmp/four_moe_ckpt

# ---- tp2: tensor parallelism over two GPUs (nvidia-h200-x2): the seed's two-GPU pair, MLM flags and
# their Bridge twin (tests/config/test_util.hpp: TP=2 with sequence parallelism, dropout on), each
# against the same config at TP=1 on one GPU

seed=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 --seq-length 1024
      --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 32 --train-iters 10
      --eval-iters 2 --eval-interval 10 --mock-data --bf16 --use-mcore-models --tokenizer-type NullTokenizer
      --vocab-size 1024 --lr 1e-4 --min-lr 1e-5 --seed 1234 --log-interval 1)
twin=(run-recipe --recipe vanilla_gpt_pretrain_config model.num_layers=4 model.hidden_size=256
      model.num_attention_heads=4 model.ffn_hidden_size=1024 model.seq_length=1024 dataset.seq_length=1024
      train.train_iters=10 train.global_batch_size=32 train.micro_batch_size=4 validation.eval_interval=10
      validation.eval_iters=2 optimizer.lr=1e-4 optimizer.min_lr=1e-5 scheduler.lr_warmup_iters=1
      scheduler.lr_decay_iters=10 rng.seed=1234 logger.log_interval=1 tokenizer.vocab_size=1024)
# (The MLM run saves, for its run_config.yaml; Bridge pads the vocabulary (1025 with its NullTokenizer)
# to a multiple of 128 x TP, so its TP=1 runs ask for 256 to be the same model.)
declare_case tp2 tp1_mlm TEST 1 600 exit -- train tp1_mlm 1 pretrain-gpt "${seed[@]}"
declare_case tp2 tp2_mlm TEST 2 600 compare:compare_tp1_mlm_tp2_mlm.txt -- \
  train_and_compare tp1_mlm tp2_mlm 2 pretrain-gpt --tensor-model-parallel-size 2 --sequence-parallel "${seed[@]}" \
  --save /tmp/tp2_mlm_ckpt --save-interval 10
declare_case tp2 tp1_bridge TEST 1 600 exit -- \
  train tp1_bridge 1 "${twin[@]}" model.make_vocab_size_divisible_by=256 checkpoint.save=/tmp/tp1_bridge_ckpt
declare_case tp2 tp2_bridge TEST 2 600 compare:compare_tp1_bridge_tp2_bridge.txt -- \
  train_and_compare tp1_bridge tp2_bridge 2 "${twin[@]}" model.tensor_model_parallel_size=2 \
  model.sequence_parallel=true checkpoint.save=/tmp/tp2_bridge_ckpt
# The checkpoint the TP=2 Bridge run saved (whole tensors) resumes at TP=1 on one GPU: its iterations
# 11-12 against a TP=1 run of 12 iterations straight through.
declare_case tp2 tp1_bridge_12 TEST 1 600 exit -- \
  train tp1_bridge_12 1 "${twin[@]}" train.train_iters=12 model.make_vocab_size_divisible_by=256 \
  checkpoint.save=/tmp/tp1_12_ckpt
declare_case tp2 tp2_resumed_at_tp1 TEST 2 600 compare:compare_tp1_bridge_12_tp2_resumed_at_tp1.txt -- \
  train_and_compare tp1_bridge_12 tp2_resumed_at_tp1 1 "${twin[@]}" train.train_iters=12 \
  model.make_vocab_size_divisible_by=256 checkpoint.load=/tmp/tp2_bridge_ckpt checkpoint.save=/tmp/tp_resumed_ckpt
# MLM against its Bridge twin: not the same run (Bridge's recipe keeps its own schedule, optimizer
# and tokenizer settings), so no verdict; compare-logs names the config fields that differ.
declare_case tp2 tp2_mlm_vs_bridge MEASUREMENT 2 120 config_differences:compare_tp2_mlm_tp2_bridge.txt -- \
  config_differences tp2_mlm tp2_bridge
config_differences() {  # compare-logs ran (0: within tolerance, 1: not) on the two runs and their configs
  compare_logs "$1" "$2" --config-a "/tmp/$1_ckpt/run_config.yaml" --config-b "/tmp/$2_ckpt/run_config.yaml"
  [ $? -le 1 ]
}
figures_config_differences() {
  local f=$OUT/$1
  echo "$(grep -c '^config' "$f" 2> /dev/null) config lines; $(grep -i -m1 verdict "$f" 2> /dev/null)"
  sed -n '/^config/,/^verdict/p' "$f" 2> /dev/null | head -30
}
# Throughput: the Llama-3.2-1B shape at seq 8192, one sequence a step, TP=1 against TP=2 (+SP).
declare_case tp2 tp1_llama MEASUREMENT 1 900 speed:tp1_llama.log -- \
  train tp1_llama 1 pretrain-gpt "${throughput[@]}" --global-batch-size 1 "${llama_s8k[@]}"
declare_case tp2 tp2_llama MEASUREMENT 2 900 speed:tp2_llama.log,tp1_llama.log,1 -- \
  train tp2_llama 2 pretrain-gpt "${throughput[@]}" --global-batch-size 1 "${llama_s8k[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel

# ---- ckpt: checkpoints on one GPU: a dense GPT and the small MoE model saved at iteration 20 (plain
# and --async-save) and resumed to 23 give iterations 21-23 bit for bit as the run that never stopped

dense_args=(pretrain-gpt "${small_gpt[@]}" "${small_run[@]}" --attention-dropout 0 --hidden-dropout 0)
# save_and_resume MODEL MODE ARG...: saved at 20 of 23 (MODE: sync or async), then resumed to 23.
save_and_resume() {
  local model=$1 mode=$2 dir=/tmp/ckpt_$1_$2 async=()
  shift 2
  [ "$mode" = async ] && async=(--async-save)
  x rm -rf "$dir"
  train "ckpt_${model}_$mode" 1 "$@" --train-iters 23 --exit-interval 20 --save-interval 20 --save "$dir" "${async[@]}" &&
    x ls "$dir/iter_0000020" && train "ckpt_${model}_${mode}_resumed" 1 "$@" --train-iters 23 --load "$dir"
}
declare_case ckpt ckpt_dense_23 TEST 1 600 exit -- train ckpt_dense_23 1 "${dense_args[@]}" --train-iters 23
declare_case ckpt ckpt_dense_sync TEST 1 600 identical:ckpt_dense_23.log,ckpt_dense_sync_resumed.log -- \
  save_and_resume dense sync "${dense_args[@]}"
declare_case ckpt ckpt_dense_async TEST 1 600 identical:ckpt_dense_23.log,ckpt_dense_async_resumed.log -- \
  save_and_resume dense async "${dense_args[@]}"
declare_case ckpt ckpt_moe_23 TEST 1 600 exit -- train ckpt_moe_23 1 "${moe_args[@]}" --train-iters 23
declare_case ckpt ckpt_moe_sync TEST 1 600 identical:ckpt_moe_23.log,ckpt_moe_sync_resumed.log -- \
  save_and_resume moe sync "${moe_args[@]}"
declare_case ckpt ckpt_moe_async TEST 1 600 identical:ckpt_moe_23.log,ckpt_moe_async_resumed.log -- \
  save_and_resume moe async "${moe_args[@]}"

# ---- attention: flash attention alone against PyTorch's SDPA, fwd+bwd, same shapes (device.md's);
# ATTN_BENCH_UNDER_LOAD=1 times each cuDNN call beside a GEMM

declare_case attention attention MEASUREMENT 1 900 attention:attention.txt -- \
  attention_bench ${ATTN_BENCH_UNDER_LOAD:+--under-load}
attention_bench() {  # attention_bench [FLAG...]: ours, then PyTorch's, into attention.txt
  run_to "$OUT/attention.txt" "$C/laoyao_bench_attention" "$@"
  local rc=$?
  run_append "$OUT/attention.txt" python3 bench/attention_sdpa.py || return
  return "$rc"
}
figures_attention() {
  echo "TFLOP/s, fwd and fwd+bwd: laoyao flash / laoyao via cuDNN / PyTorch sdpa, $(grep -c '^ATTN sdpa' "$OUT/$1" \
    2> /dev/null) shapes"
  grep '^ATTN_DOCS' "$OUT/$1" 2> /dev/null
  python3 - "$OUT/$1" <<'PY'
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
}

# ---- gemm: the 8192-class layers' GEMMs, the kept algorithm against cuBLASLt's best candidate

declare_case gemm gemm MEASUREMENT 1 600 table:gemm.txt -- run_to "$OUT/gemm.txt" "$C/laoyao_bench_gemm"

# ---- profile: where a GPT-2 124M step's GPU time goes, op by op (bench/step_breakdown_bench.cpp),
# and the seed model's (2 layers, hidden 256, vocab 32000, 4 x 512 tokens)

declare_case profile step_breakdown MEASUREMENT 1 600 step_breakdown:step_breakdown.txt -- \
  run_to "$OUT/step_breakdown.txt" "$C/laoyao_bench_step_breakdown"
declare_case profile step_breakdown_seed MEASUREMENT 1 600 step_breakdown:step_breakdown_seed.txt -- \
  run_to "$OUT/step_breakdown_seed.txt" "$C/laoyao_bench_step_breakdown" 2 256 4 1024 32000 512 4
figures_step_breakdown() {
  awk '$1 == "sum" { print "ops timed alone, summed: " $2 " ms a step" }' "$OUT/$1" 2> /dev/null
  head -40 "$OUT/$1" 2> /dev/null
}

# ---- memory_ops: the flagship's memory-bound kernels alone against a copy of the same bytes
# (bench/memory_ops_bench.cpp): how far each is from the memory's speed

declare_case memory_ops memory_ops MEASUREMENT 1 300 memory_ops:memory_ops.txt -- \
  run_to "$OUT/memory_ops.txt" timeout 240 "$C/laoyao_bench_memory_ops"
figures_memory_ops() {
  grep '^Sum' "$OUT/$1" 2> /dev/null
  grep -E '^\||^Sum' "$OUT/$1" 2> /dev/null
}

# ---- ncu: Nsight Compute on chosen kernels of a bench (NCU_BIN, default the memory-bound kernels'
# bench; NCU_KERNELS, space-separated name regexes, one profiled launch each): speed of light,
# occupancy, warp stall reasons, memory workload. Needs ncu and profiling permission.

kernel_number=0
for kernel in ${NCU_KERNELS:-norm_backward_fused qk_rmsnorm_backward qk_rmsnorm_forward moe_perm_assign moe_permute_forward}; do
  kernel_number=$((kernel_number + 1))
  declare_case ncu "ncu_${kernel//[^A-Za-z0-9_]/_}" MEASUREMENT 1 300 "ncu:ncu_$kernel_number.txt" -- \
    run_to "$OUT/ncu_$kernel_number.txt" timeout 240 ncu -k "regex:$kernel" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis "$C/${NCU_BIN:-laoyao_bench_memory_ops}"
done
figures_ncu() {
  grep -m1 'Duration' "$OUT/$1" 2> /dev/null | tr -s ' '
  grep -E '^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|ERR|Warp Cycles Per Issued|stalled|cycles being' \
    "$OUT/$1" 2> /dev/null | cut -c1-400 | head -24
}

# Nsight Compute's duration of each kernel (or graph), clocks and caches left alone, as CSV.
ncu_durations=(--metrics gpu__time_duration.sum --clock-control none --cache-control none --csv --print-units base)

# ---- kernel_profile: every kernel of a step, ours beside the compiled peer's (KPROF_CASES, default
# gpt2_124m; tables in $OUT/kprof_*.txt). Ours: iterations 3 and 4, CUDA graphs off (a 2-iteration
# run counts the kernels to skip: set-up and the GEMMs' timing runs); the peer: 2 steps inside
# bench/peer_profile_step.py's NVTX range.

for bench_case in ${KPROF_CASES:-gpt2_124m}; do
  declare_case kernel_profile "kprof_$bench_case" MEASUREMENT 1 600 "head:kprof_$bench_case.txt,16" -- \
    kernel_profile_ours "$bench_case"
  declare_case kernel_profile "kprof_peer_$bench_case" MEASUREMENT 1 480 "head:kprof_peer_$bench_case.txt,16" -- \
    kernel_profile_peer "$bench_case"
done
kernel_profile_ours() {
  local c=$1 shape skip
  read -r -a shape <<< "$(shape_args "$c")"
  local ncu_run=(LAOYAO_CUDA_GRAPHS=0 LAOYAO_DEVICE=cuda timeout 240 ncu "${ncu_durations[@]}")
  local train_run=("$C/laoyao" pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234
                   --eval-iters 0 --eval-interval 100000 --log-interval 1 "${shape[@]}")
  run_to "$OUT/kprof_${c}_setup.csv" "${ncu_run[@]}" "${train_run[@]}" --train-iters 2 || return
  if dry; then skip="<kernels in kprof_${c}_setup.csv>"; else skip=$(grep -c gpu__time_duration "$OUT/kprof_${c}_setup.csv"); fi
  run_to "$OUT/kprof_$c.csv" "${ncu_run[@]}" --launch-skip "$skip" "${train_run[@]}" --train-iters 4 &&
    run_to "$OUT/kprof_$c.txt" python3 bench/kernel_profile_summary.py "$OUT/kprof_$c.csv" 2
}
kernel_profile_peer() {
  local c=$1 peer="$C/peers/pytorch_gpt.py"
  case "$c" in moe_*) peer="$C/peers/pytorch_moe.py" ;; esac
  run_to "$OUT/kprof_peer_$c.csv" timeout 420 ncu --nvtx --nvtx-include profile "${ncu_durations[@]}" python3 \
    bench/peer_profile_step.py "$peer" "${c%%_gbs*}" --compile --steps 2 &&
    run_to "$OUT/kprof_peer_$c.txt" python3 bench/kernel_profile_summary.py "$OUT/kprof_peer_$c.csv" 2
}

# ---- graph_gaps: how much of a CUDA-graph step is gaps between its kernels (GAPS_CASES, default
# gpt2_124m): ncu on 6 iterations, each graph replay as one result, then each kernel alone (clocks
# and caches left alone); bench/graph_gaps_summary.py compares the two

for bench_case in ${GAPS_CASES:-gpt2_124m}; do
  declare_case graph_gaps "gaps_$bench_case" MEASUREMENT 1 450 "graph_gaps:gaps_$bench_case.txt" -- \
    graph_gaps "$bench_case"
done
graph_gaps() {
  local c=$1 shape mode
  read -r -a shape <<< "$(shape_args "$c")"
  for mode in graph node; do
    run_to "$OUT/gaps_${c}_$mode.csv" LAOYAO_DEVICE=cuda timeout 200 ncu --graph-profiling "$mode" "${ncu_durations[@]}" \
      "$C/laoyao" pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 \
      --eval-interval 100000 --log-interval 1 "${shape[@]}" --train-iters 6 || return
  done
  run_to "$OUT/gaps_$c.txt" python3 bench/graph_gaps_summary.py "$OUT/gaps_${c}_graph.csv" "$OUT/gaps_${c}_node.csv"
}
figures_graph_gaps() {
  grep -m1 '^| gaps' "$OUT/$1" 2> /dev/null | tr -d '|' | tr -s ' '
  cat "$OUT/$1" 2> /dev/null
}

# ---- clocks: the SM clock and board power while ours and the compiled peer train (CLOCKS_CASES,
# default gpt2_124m): nvidia-smi sampled every 100 ms, the mean over ours' iterations after the first
# logged (200 in all) and the peer's 300 timed steps. Whether a run is held back by the power limit:
# a lower clock for the same kernels.

for bench_case in ${CLOCKS_CASES:-gpt2_124m}; do
  declare_case clocks "clocks_laoyao_$bench_case" MEASUREMENT 1 360 \
    "clocks:clocks_laoyao_$bench_case.csv,clocks_run_laoyao_$bench_case.log" -- clocks_ours "$bench_case"
  declare_case clocks "clocks_peer_$bench_case" MEASUREMENT 1 360 \
    "clocks:clocks_peer_$bench_case.csv,clocks_run_peer_$bench_case.log" -- clocks_peer "$bench_case"
done
clocks_ours() {
  local shape
  read -r -a shape <<< "$(shape_args "$1")"
  sample_gpu_while "$OUT/clocks_laoyao_$1.csv" run_to "$OUT/clocks_run_laoyao_$1.log" LAOYAO_DEVICE=cuda timeout 300 \
    "$C/laoyao" pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 \
    --eval-interval 100000 --log-interval 10 "${shape[@]}" --train-iters 200
}
clocks_peer() {
  sample_gpu_while "$OUT/clocks_peer_$1.csv" run_to "$OUT/clocks_run_peer_$1.log" timeout 300 python3 \
    bench/peer_profile_step.py "$C/peers/pytorch_gpt.py" "$1" --compile --steps 300
}
figures_clocks() { python3 bench/clock_samples.py "$OUT/$1" "$OUT/$2" 2>&1 | tail -1; }

# ---- phases: where each case's step goes by kind of op (LAOYAO_MODEL_PHASES, LAOYAO_MOE_PHASES and
# LAOYAO_STEP_PHASES: CUDA events, graphs off), 6 iterations, the last step's lines. PHASES_CASES picks
# the bench cases (default: the flagship MoE, Llama-3.2-1B, GPT-2 124M); PHASES_ARGS adds laoyao flags
# (e.g. "--fp8-format hybrid --fp8-recipe delayed": the same step in FP8).

for bench_case in ${PHASES_CASES:-moe_2b llama32_1b_s8k gpt2_124m}; do
  declare_case phases "phases_$bench_case" MEASUREMENT 1 600 "phases:phases_$bench_case.log" -- phases_run "$bench_case"
done
# shellcheck disable=SC2086  # PHASES_ARGS: several words
phases_run() {
  local shape
  read -r -a shape <<< "$(shape_args "$1")"
  train "phases_$1" 1 LAOYAO_MODEL_PHASES=1 LAOYAO_MOE_PHASES=1 LAOYAO_STEP_PHASES=1 pretrain-gpt --mock-data --bf16 \
    --tokenizer-type NullTokenizer --lr 3e-4 --seed 1234 --eval-iters 0 --eval-interval 100000 --log-interval 1 \
    "${shape[@]}" --train-iters 6 ${PHASES_ARGS:-}
}
figures_phases() {
  grep 'laoyao: step phases' "$OUT/$1" 2> /dev/null | tail -1 | sed 's/.*step phases/step phases/'
  grep -E 'laoyao: (model|MoE|step) phases' "$OUT/$1" 2> /dev/null | tail -3
}

# ---- bench: training against the PyTorch peer (BENCH_CASES picks the cases; BASELINE, NO_PEER and
# LAOYAO_ARGS as bench/gpu_train_bench.sh reads them)

# shellcheck disable=SC2086  # BENCH_CASES: several words
declare_case bench bench MEASUREMENT 1 3600 bench:bench.txt -- bench_run bench.txt ${BENCH_CASES:-}

# ---- hf: Hugging Face checkpoints against transformers itself

# Small random models of each architecture saved by transformers: import-hf, laoyao's first loss on
# the CPU (1e-4) and the GPU (bf16) against transformers' on the same tokens, export-hf loaded back by
# from_pretrained with no missing or unexpected keys and the same logits.
declare_case hf hf_transformers TEST 1 900 exit -- run_to "$OUT/hf_transformers.txt" python3 \
  tests/gpu/hf_transformers_check.py "$C/laoyao" "$OUT"
# LoRA against peft: a LoRA run on the GPU from an imported random Llama and Qwen3, its adapters
# exported in PEFT's format loaded by peft onto the transformers model, whose logits equal the
# merged export's.
declare_case hf peft_lora TEST 1 600 exit -- run_to "$OUT/peft_lora.txt" python3 \
  tests/gpu/peft_lora_check.py "$C/laoyao" "$OUT"

# ---- hf_convert: import-hf and export-hf of an 8B-size folder (random BF16 weights written by the
# bench itself), GB/s, CPU seconds and peak host memory (#35 asks >= 1 GB/s)
declare_case hf_convert hf_convert MEASUREMENT 1 400 table:hf_convert.txt -- run_to "$OUT/hf_convert.txt" python3 \
  bench/hf_convert_bench.py "$C/laoyao" /tmp llama3_8b

# ---- host_memory: a GPU rank's host memory under TP and EP, where one GPU is lent

# The trainer's ranks as threads sharing the GPU (bench/thread_ranks_bench.cpp: collectives through
# the host, so no speed): the process's peak resident set per rank against 0.5 B/param + 3 GB
# (#34); exit 1 when over. One rank first, the harness's own cost beside a process of one rank.
read -r -a llama_8b_4l <<< "$(shape_args llama3_8b_4l_s8k)"
host_memory_args=(--mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234 --eval-iters 0
                  --eval-interval 100000 --log-interval 1 --train-iters 3)
declare_case host_memory host_memory_1rank TEST 1 300 exit -- run_to "$OUT/host_memory_1rank.txt" \
  "$C/laoyao_bench_thread_ranks" 1 "${llama_8b_4l[@]}" "${host_memory_args[@]}"
declare_case host_memory host_memory_tp2 TEST 1 420 exit -- run_to "$OUT/host_memory_tp2.txt" \
  "$C/laoyao_bench_thread_ranks" 2 "${llama_8b_4l[@]}" "${host_memory_args[@]}" --tensor-model-parallel-size 2 \
  --sequence-parallel
declare_case host_memory host_memory_ep2 TEST 1 420 exit -- run_to "$OUT/host_memory_ep2.txt" \
  "$C/laoyao_bench_thread_ranks" 2 "${flagship[@]}" "${host_memory_args[@]}" --expert-model-parallel-size 2 \
  --global-batch-size 4

check_declarations

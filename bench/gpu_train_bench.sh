#!/usr/bin/env bash
# laoyao against the PyTorch peer (shared/peers/pytorch_gpt.py: bf16 autocast, fused AdamW, SDPA
# flash attention, torch.compile) on the same GPU in the same call, on the same shapes and tokens per
# optimizer step. Prints one table: tokens/s of each, the ratio, laoyao's Megatron-formula TFLOP/s
# and MFU against 989 TFLOP/s, memory (laoyao: device memory held; peer: torch's peak allocated) and
# laoyao's host memory (the process's peak resident set, and per parameter of the rank: a GPU rank
# keeps its state on the GPU, at most 0.5 bytes a parameter + 3 GB is the target).
# With BASELINE=ANOTHER_LAOYAO_BINARY (the previous code) it runs each case on that binary too, in
# the same call, and adds its tokens/s, the ratio to it, its device and host memory.
# NO_PEER=1 leaves the peer out (its columns n/a). LAOYAO_ARGS adds flags to laoyao's runs only (a
# checkpoint save or load: its host memory then shows in the host column).
#   [BASELINE=BIN] bash bench/gpu_train_bench.sh LAOYAO_BINARY PEER_SCRIPT [CASE ...]
#   bash bench/gpu_train_bench.sh --shape-args CASE      (the case's laoyao flags, printed)
# Cases: vanilla_seed gpt2_124m seed_command llama32_1b_s8k llama3_8b_4l_s8k qwen3_8b_4l_s4k moe_2b moe_2b_gbs16
# moe_2b_mbsM_gbsG deepseek_v2_lite_4l CASE_gbsG (default: the first three; moe_2b runs beside
# pytorch_moe.py, deepseek_v2_lite_4l beside bench/peers/pytorch_deepseek.py, both found next to
# PEER_SCRIPT; seed_command, the moe_2b_* and the *_gbsG cases have no peer). Run on the GPU machine
# (scripts/gpu_check.sh run bench does it with the staged binary).
set -uo pipefail
BIN="$1"; PEER="$2"; shift 2
cases="${*:-vanilla_seed gpt2_124m seed_command}"
LOGS="${OUT:-/tmp/out}"
mkdir -p "$LOGS"

common=(pretrain-gpt --mock-data --bf16 --tokenizer-type NullTokenizer --lr 3e-4 --min-lr 3e-5 --seed 1234
        --eval-iters 0 --eval-interval 100000 --log-interval 10 --log-throughput)
shape_args() {  # the peer's CFG rows (pytorch_gpt.py), as Megatron-LM flags, no dropout like the peer
  case "$1" in
    vanilla_seed) echo --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 \
                    --seq-length 512 --max-position-embeddings 512 --micro-batch-size 4 --global-batch-size 4 \
                    --vocab-size 32000 --hidden-dropout 0 --attention-dropout 0 --train-iters 60 ;;
    gpt2_124m) echo --num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072 \
                 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 16 --global-batch-size 16 \
                 --vocab-size 50304 --hidden-dropout 0 --attention-dropout 0 --train-iters 40 ;;
    # Llama 3.2 1B's shape at seq 8192 (the peer's llama32_1b_s8k: RoPE base 500000, untied).
    llama32_1b_s8k) echo --num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention \
                      --num-query-groups 8 --ffn-hidden-size 8192 --normalization RMSNorm --swiglu \
                      --position-embedding-type rope --rotary-base 500000 --disable-bias-linear \
                      --untie-embeddings-and-output-weights --seq-length 8192 --max-position-embeddings 8192 \
                      --micro-batch-size 1 --global-batch-size 1 --vocab-size 128256 --hidden-dropout 0 \
                      --attention-dropout 0 --train-iters 20 ;;
    # Llama 3 8B's layer shape, 4 layers, at seq 8192 (the peer's llama3_8b_4l_s8k).
    llama3_8b_4l_s8k) echo --num-layers 4 --hidden-size 4096 --num-attention-heads 32 --group-query-attention \
                        --num-query-groups 8 --ffn-hidden-size 14336 --normalization RMSNorm --swiglu \
                        --position-embedding-type rope --rotary-base 500000 --disable-bias-linear \
                        --untie-embeddings-and-output-weights --seq-length 8192 --max-position-embeddings 8192 \
                        --micro-batch-size 1 --global-batch-size 1 --vocab-size 128256 --hidden-dropout 0 \
                        --attention-dropout 0 --train-iters 20 ;;
    # Qwen3 8B's layer shape, 4 layers, at seq 4096 (the peer's qwen3_8b_4l_s4k): Llama's pieces plus QK
    # layernorm. RoPE base 500000 and norm eps 1e-5 as the peer has them for every arch (Qwen3 itself
    # uses 1000000 and 1e-6; neither changes the work).
    qwen3_8b_4l_s4k) echo --num-layers 4 --hidden-size 4096 --num-attention-heads 32 --group-query-attention \
                       --num-query-groups 8 --ffn-hidden-size 12288 --normalization RMSNorm --swiglu --qk-layernorm \
                       --position-embedding-type rope --rotary-base 500000 --disable-bias-linear \
                       --untie-embeddings-and-output-weights --seq-length 4096 --max-position-embeddings 4096 \
                       --micro-batch-size 1 --global-batch-size 1 --vocab-size 151936 --hidden-dropout 0 \
                       --attention-dropout 0 --train-iters 20 ;;
    # The flagship MoE (moe_2b_pretrain_config's model, the peer pytorch_moe.py's moe_2b): 24 layers, 64
    # experts of ffn 384, top-8, 2 sequences of 4096 a step. The peer has no aux loss; ours keeps the recipe's.
    moe_2b) echo --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --group-query-attention \
              --num-query-groups 4 --kv-channels 64 --ffn-hidden-size 3072 --normalization RMSNorm --norm-epsilon 1e-6 \
              --swiglu --qk-layernorm --position-embedding-type rope --rotary-base 1000000 --disable-bias-linear \
              --untie-embeddings-and-output-weights --seq-length 4096 --max-position-embeddings 4096 \
              --micro-batch-size 2 --global-batch-size 2 --vocab-size 151936 --num-experts 64 --moe-router-topk 8 \
              --moe-ffn-hidden-size 384 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \
              --moe-router-dtype fp32 --moe-grouped-gemm --hidden-dropout 0 --attention-dropout 0 --train-iters 20 ;;
    # The flagship at a training-sized step: 8 micro-batches of 2 sequences (the optimizer's 2.2B
    # fp32 AdamW parameters once per 16 sequences, as a real run's global batch amortises it). No
    # peer: pytorch_moe.py takes one micro-batch a step.
    moe_2b_gbs16) shape_args moe_2b | sed 's/--global-batch-size 2 /--global-batch-size 16 /' ;;
    # moe_2b_mbsM_gbsG: the flagship at micro-batch M and global batch G (the recipe's own is 512
    # sequences of 1 a step; a larger micro-batch gives each expert's GEMMs more rows).
    moe_2b_mbs*_gbs*) local mg="${1#moe_2b_mbs}"
      shape_args moe_2b | sed "s/--micro-batch-size 2 --global-batch-size 2 /--micro-batch-size ${mg%_gbs*} --global-batch-size ${mg#*_gbs} /" |
        # 256 sequences a step and more (the recipe's 512): 4 steps, the last two timed (a later flag wins)
        if [ "${mg#*_gbs}" -ge 256 ]; then sed 's/$/ --train-iters 4 --log-interval 2/'; else cat; fi ;;
    # DeepSeek-V2-Lite's layers (deepseek_v2_lite_pretrain_config's model), 4 of them (the first dense):
    # multi-latent attention (no query latent, kv latent 512, head dims 192 / 128, YaRN), 64 experts of
    # ffn 1408, top-6, two shared experts' width, at seq 4096. The peer (pytorch_deepseek.py) has no aux
    # loss and plain RoPE; ours keeps the recipe's seq_aux_loss and YaRN.
    deepseek_v2_lite_4l) echo --num-layers 4 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 10944 \
                           --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear \
                           --untie-embeddings-and-output-weights --multi-latent-attention --kv-lora-rank 512 \
                           --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --position-embedding-type yarn \
                           --rotary-base 10000 --rotary-scaling-factor 40 --yarn-original-max-position-embeddings 4096 \
                           --mscale 0.707 --mscale-all-dim 0.707 --seq-length 4096 --max-position-embeddings 4096 \
                           --micro-batch-size 1 --global-batch-size 4 --vocab-size 102400 --num-experts 64 \
                           --moe-router-topk 6 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 2816 \
                           --moe-layer-freq '[0,1,1,1]' --moe-router-load-balancing-type seq_aux_loss \
                           --moe-aux-loss-coeff 1e-3 --moe-router-pre-softmax --moe-grouped-gemm --hidden-dropout 0 \
                           --attention-dropout 0 --train-iters 20 ;;
    # CASE_gbsG (a dense case): G micro-batches a step, the optimizer and FP8's weight casts once per
    # G sequences as a real run's global batch amortises them. No peer (it takes one micro-batch a step).
    *_gbs[0-9]*) shape_args "${1%_gbs*}" | sed "s/--global-batch-size [0-9]* /--global-batch-size ${1##*_gbs} /" ;;
    # The README's seed command as it is (32 sequences of 512 an iteration, dropout 0.1).
    seed_command) echo --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 \
                    --seq-length 512 --max-position-embeddings 512 --micro-batch-size 4 --global-batch-size 32 \
                    --vocab-size 32000 --train-iters 40 ;;
  esac
}
field() { sed -n "s|.*$1 *\([0-9.]*\).*|\1|p" | tail -1; }
# laoyao_run BIN NAME CASE: one run of a case, its log and metrics under $LOGS/NAME_CASE*; prints
# "ms tflops device_GB host_bytes parameters" (the host's peak resident set, measured from outside
# so that any binary can be measured; the rank's parameters from Megatron's line).
laoyao_run() {
  local bin=$1 name=$2 c=$3 log="$LOGS/$2_$3.log" shape
  read -r -a shape <<< "$(shape_args "$c")"
  rm -rf "$LOGS/tb_${name}_$c"
  LAOYAO_DEVICE=cuda python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=open(sys.argv[1], "w"), stderr=subprocess.STDOUT)
open(sys.argv[1] + ".rss", "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)' "$log" "$bin" "${common[@]}" "${shape[@]}" ${LAOYAO_ARGS:-} --tensorboard-dir "$LOGS/tb_${name}_$c" ||
    { echo "$name failed on $c:" >&2; tail -5 "$log" >&2; return 1; }
  # The last logged interval's time per iteration, unrounded (metrics.jsonl beside the run config).
  local ms tf mem params
  ms=$(python3 -c "import json;print(round([json.loads(l) for l in open('$LOGS/tb_${name}_$c/metrics.jsonl')][-1]['elapsed_ms_per_iteration'],3))")
  tf=$(grep 'elapsed time per iteration' "$log" | field 'throughput per GPU (TFLOP/s/GPU):')
  [ -n "$ms" ] || { echo "$name: no metrics for $c" >&2; return 1; }
  mem=$(field 'device memory held:' < "$log")
  params=$(sed -n 's/.*number of parameters on (tensor, gtp_remat, pipeline) model parallel rank ([0-9, ]*): \([0-9]*\).*/\1/p' "$log" | head -1)
  echo "$ms $tf $mem $(cat "$log.rss") $params"
}
# "GB (B/param, ok|over)": host bytes against the target of 0.5 bytes a parameter + 3 GB.
host_cell() {
  python3 -c "h,p=$1,$2;print(f'{h/1e9:.2f} ({h/p:.2f}, {\"ok\" if h <= 0.5*p + 3e9 else \"over\"})')"
}
# `--shape-args CASE`: print a case's flags and stop (scripts/gpu_check.sh's dp2 part uses them).
[ "$BIN" = --shape-args ] && { shape_args "$PEER"; exit 0; }

header="| case | laoyao tokens/s | peer tokens/s (compiled) | ratio | laoyao ms/step | laoyao TFLOP/s | MFU | laoyao mem GB | peer mem GB | laoyao host GB (B/param, target) |"
rule="|---|---|---|---|---|---|---|---|---|---|"
if [ -n "${BASELINE:-}" ]; then
  header+=" baseline tokens/s | vs baseline | baseline mem GB | baseline host GB (B/param) |"
  rule+="---|---|---|---|"
fi
echo "$header"
rows=()
for c in $cases; do
  read -r -a shape <<< "$(shape_args "$c")"
  read -r ms tf mem host params <<< "$(laoyao_run "$BIN" bench "$c")" || continue
  [ -n "${ms:-}" ] || continue
  gbs=$(printf '%s\n' "${shape[@]}" | grep -A1 -- --global-batch-size | tail -1)
  seq=$(printf '%s\n' "${shape[@]}" | grep -A1 -- --seq-length | tail -1)
  tok=$(python3 -c "print(round($gbs*$seq/($ms/1000)))")
  peer_tok=n/a; peer_mem=n/a; ratio=n/a
  if [ -z "${NO_PEER:-}" ] && [ "$c" != seed_command ] && [ "${c#moe_2b_}" = "$c" ] && [ "${c%_gbs*}" = "$c" ]; then
    peer="$PEER"
    [ "$c" = moe_2b ] && peer="$(dirname "$PEER")/pytorch_moe.py"  # the MoE peer beside the dense one
    [ "$c" = deepseek_v2_lite_4l ] && peer="$(dirname "$PEER")/pytorch_deepseek.py"  # (bench/peers/, staged beside)
    PYTHONUNBUFFERED=1 python3 "$peer" "$c" --compile > "$LOGS/peer_$c.log" 2>&1
    peer_tok=$(sed -n 's/.*tokens\/s=\([0-9,]*\).*/\1/p' "$LOGS/peer_$c.log" | tr -d , | tail -1)
    peer_mem=$(sed -n 's/.*mem_GB=\([0-9.]*\).*/\1/p' "$LOGS/peer_$c.log" | tail -1)
    [ -n "$peer_tok" ] && ratio=$(python3 -c "print(f'{$tok/$peer_tok:.2f}x')")
  fi
  mfu=$(python3 -c "print(f'{100*$tf/989:.1f}%')")
  row="| $c | $tok | ${peer_tok:-n/a} | $ratio | $ms | $tf | $mfu | $mem | ${peer_mem:-n/a} | $(host_cell "$host" "$params") |"
  if [ -n "${BASELINE:-}" ]; then
    if read -r bms _ bmem bhost bparams <<< "$(laoyao_run "$BASELINE" baseline "$c")" && [ -n "${bms:-}" ]; then
      btok=$(python3 -c "print(round($gbs*$seq/($bms/1000)))")
      row+=" $btok | $(python3 -c "print(f'{$tok/$btok:.3f}x')") | $bmem | $(host_cell "$bhost" "$bparams") |"
    else
      row+=" failed | n/a | n/a | n/a |"
    fi
  fi
  rows+=("$row")
done
echo
echo "$header"
echo "$rule"
printf '%s\n' "${rows[@]}"

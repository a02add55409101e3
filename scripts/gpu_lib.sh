# shellcheck shell=bash
# What the GPU cases (scripts/gpu_cases.sh) are made of: declaring a case; running a command, or
# printing it under DRY_RUN; the training runs, comparisons and benches the cases share; the rules
# that turn a finished case into a verdict (verdict_*, tests) or figures (figures_*, measurements).
# Sourced, never run: scripts/gpu_check.sh sets C (the staged binaries) and OUT (the logs).

die() { echo "$*" >&2; exit 2; }

# ---- Declaring cases

declare -gA CASE_PARTS=() CASE_KIND=() CASE_GPUS=() CASE_LIMIT=() CASE_RULE=() CASE_CMD=()
declare -ga CASE_NAMES=() KNOWN_PARTS=()

# declare_parts PART...: the part names `run` and `list` accept (a part may have no case when its
# knobs leave them all out).
declare_parts() { KNOWN_PARTS+=("$@"); }
known_part() { [[ " ${KNOWN_PARTS[*]} " == *" $1 "* ]]; }
# part_selected PART: whether this call runs PART (SELECTED_PARTS, set by scripts/gpu_check.sh).
part_selected() { [[ " ${SELECTED_PARTS[*]:-} " == *" $1 "* ]]; }

# declare_case PARTS NAME KIND GPUS LIMIT RULE -- COMMAND...
#   PARTS   the parts that run it, comma-separated
#   KIND    TEST: RULE names a verdict_* function (PASS or FAIL);
#           MEASUREMENT: RULE names a figures_* function (its first line is the case's figure), and
#           the case either ran (COMMAND's status 0) or failed to run
#   GPUS    the GPUs it needs (1, 2 or 4; a case that resumes another's checkpoint needs that one's)
#   LIMIT   seconds before it is stopped
#   RULE    FUNCTION[:ARG,ARG...], the ARGs files under $OUT (or a number the function takes)
#   COMMAND what runs (its words expanded now, so the knobs' values are part of the declaration)
declare_case() {
  local parts=$1 name=$2 kind=$3 gpus=$4 limit=$5 rule=$6 part
  [ "${7:-}" = -- ] || die "case $name: no -- before its command"
  [ -z "${CASE_KIND[$name]:-}" ] || die "case $name is declared twice"
  [[ $kind == TEST || $kind == MEASUREMENT ]] || die "case $name: kind $kind is neither TEST nor MEASUREMENT"
  [[ $gpus =~ ^[124]$ ]] || die "case $name: needs $gpus GPUs (1, 2 or 4)"
  [[ $limit =~ ^[0-9]+$ ]] || die "case $name: limit $limit is not a number of seconds"
  for part in ${parts//,/ }; do known_part "$part" || die "case $name: part $part is not declared"; done
  CASE_NAMES+=("$name")
  # shellcheck disable=SC2034  # read by scripts/gpu_check.sh
  CASE_PARTS[$name]=$parts CASE_KIND[$name]=$kind CASE_GPUS[$name]=$gpus CASE_LIMIT[$name]=$limit
  CASE_RULE[$name]=$rule
  CASE_CMD[$name]=$(printf '%q ' "${@:8}")
}

# rule_function NAME: the verdict_* or figures_* function that judges the case.
rule_function() {
  local rule=${CASE_RULE[$1]}
  if [ "${CASE_KIND[$1]}" = TEST ]; then echo "verdict_${rule%%:*}"; else echo "figures_${rule%%:*}"; fi
}
# rule_args NAME: the rule's arguments, one a line.
rule_args() {
  local rule=${CASE_RULE[$1]}
  [[ $rule == *:* ]] && tr , '\n' <<< "${rule#*:}"
}

# Every rule names a function that exists (checked once all cases are declared).
check_declarations() {
  local name
  for name in "${CASE_NAMES[@]}"; do
    declare -F "$(rule_function "$name")" > /dev/null || die "case $name: no function $(rule_function "$name")"
  done
}

run_declared_case() { eval "${CASE_CMD[$1]}"; }

# ---- Running (or, under DRY_RUN, printing) commands

dry() { [ -n "${DRY_RUN:-}" ] && [ "$DRY_RUN" != 0 ]; }

# gpus_text N: "1 GPU", "2 GPUs".
gpus_text() { if [ "$1" = 1 ]; then echo "1 GPU"; else echo "$1 GPUs"; fi; }

# shown WORD...: the words as one shell line, quoted only where the shell would need it.
shown() {
  local w words=() plain='^[A-Za-z0-9_./:=,+@%-]+$'
  for w in "$@"; do
    if [[ $w =~ $plain ]]; then words+=("$w"); else words+=("'${w//\'/\'\\\'\'}'"); fi
  done
  echo "${words[*]}"
}

# run_to LOG [VAR=VALUE...] COMMAND...: COMMAND with those variables set, its output in LOG (run_append:
# added to LOG). The line goes to the case's own log first, and a failure after it; under DRY_RUN the
# line is printed and nothing runs.
run_to() { run_logged '>' "$@"; }
run_append() { run_logged '>>' "$@"; }
run_logged() {
  local mode=$1 log=$2 line rc
  shift 2
  line="$(shown "$@") $mode $log 2>&1"
  if dry; then echo "  $line"; return 0; fi
  echo "+ $line"
  if [ "$mode" = '>' ]; then env "$@" > "$log" 2>&1; else env "$@" >> "$log" 2>&1; fi
  rc=$?
  [ "$rc" = 0 ] || echo "! exit $rc: $line"
  return "$rc"
}
# x COMMAND...: COMMAND, its output in the case's own log; under DRY_RUN printed.
x() {
  if dry; then echo "  $(shown "$@")"; return 0; fi
  echo "+ $(shown "$@")"
  "$@" || { local rc=$?; echo "! exit $rc: $(shown "$@")"; return "$rc"; }
}

# sample_gpu_while CSV COMMAND...: nvidia-smi samples the SM clock, power and temperature every
# 100 ms into CSV while COMMAND runs.
sample_gpu_while() {
  # shellcheck disable=SC2054  # the commas are nvidia-smi's
  local csv=$1 smi=(nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu
                    --format=csv,noheader,nounits -lms 100) pid rc
  shift
  if dry; then echo "  $(shown "${smi[@]}") > $csv 2>&1 &   (stopped after the next line)"; "$@"; return 0; fi
  "${smi[@]}" > "$csv" 2>&1 &
  pid=$!
  "$@"
  rc=$?
  kill "$pid"
  wait "$pid" 2> /dev/null
  return "$rc"
}

# ---- What the cases are made of

# train NAME WHERE [VAR=VALUE...] ARG...: `laoyao ARG...`, logged to $OUT/NAME.log. WHERE: cpu, 1 (one
# GPU) or N (N GPUs, through `laoyao launch`).
train() {
  local name=$1 where=$2 envs=()
  shift 2
  while [[ ${1:-} =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("$1"); shift; done
  case "$where" in
    cpu) run_to "$OUT/$name.log" LAOYAO_DEVICE=cpu "${envs[@]}" "$C/laoyao" "$@" ;;
    1) run_to "$OUT/$name.log" LAOYAO_DEVICE=cuda "${envs[@]}" "$C/laoyao" "$@" ;;
    *) run_to "$OUT/$name.log" LAOYAO_DEVICE=cuda "${envs[@]}" "$C/laoyao" launch --nproc-per-node "$where" -- \
         "$C/laoyao" "$@" ;;
  esac
}
# compare_logs A B [FLAG...]: `laoyao compare-logs` on $OUT/A.log and $OUT/B.log, into
# $OUT/compare_A_B.txt; its status: 0 within BF16 tolerance.
compare_logs() {
  run_to "$OUT/compare_$1_$2.txt" "$C/laoyao" compare-logs "$OUT/$1.log" "$OUT/$2.log" "${@:3}"
}
# train_and_compare REFERENCE NAME WHERE ARG...: train NAME, then compare its log with REFERENCE's.
train_and_compare() { train "$2" "$3" "${@:4}" && compare_logs "$1" "$2"; }

# parity_run NAME MODEL-FLAG...: the config on the CPU and on the GPU (same initial weights), then
# compare-logs, into $OUT/NAME_compare.txt.
parity_args() {
  echo "$@" --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16 \
    --eval-iters 2 --eval-interval 10 --mock-data --bf16 --tokenizer-type NullTokenizer --vocab-size 4096 \
    --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5 --seed 1234 --log-interval 1
}
parity_run() {
  local name=$1 args
  read -r -a args <<< "pretrain-gpt $(parity_args "${@:2}")"
  train "${name}_cpu" cpu "${args[@]}" && train "${name}_gpu" 1 "${args[@]}" &&
    run_to "$OUT/${name}_compare.txt" "$C/laoyao" compare-logs "$OUT/${name}_cpu.log" "$OUT/${name}_gpu.log"
}
# lora_parity_run NAME DROPOUT ARG...: parity_run's model pretrained 10 iterations on the CPU and
# saved, then LoRA from it (Bridge's run-recipe of the same model, convert-args', with peft.scheme
# lora and peft.dropout DROPOUT) for 20 iterations on the CPU and on the GPU, their logs compared.
lora_parity_run() {
  local name=$1 dropout=$2 base=/tmp/${1}_base args recipe
  read -r -a args <<< "$(parity_args "${@:3}")"
  x rm -rf "$base"
  train "${name}_base" cpu pretrain-gpt "${args[@]}" --train-iters 10 --save "$base" --save-interval 10 || return
  if dry; then  # (the binary may not be here)
    x "$C/laoyao" convert-args --emit overrides "${args[@]}" --train-iters 20
    recipe=(laoyao run-recipe --recipe vanilla_gpt_pretrain_config "(its overrides)")
  else
    recipe=$("$C/laoyao" convert-args --emit overrides "${args[@]}" --train-iters 20 | grep -v '^#' |
             sed 's/ *\\$//' | tr '\n' ' ') || return
    eval "recipe=($recipe)"
  fi
  local lora=(peft.scheme=lora peft.dim=8 peft.alpha=16 peft.dropout=$dropout "checkpoint.pretrained_checkpoint=$base")
  train "${name}_cpu" cpu "${recipe[@]:1}" "${lora[@]}" && train "${name}_gpu" 1 "${recipe[@]:1}" "${lora[@]}" &&
    run_to "$OUT/${name}_compare.txt" "$C/laoyao" compare-logs "$OUT/${name}_cpu.log" "$OUT/${name}_gpu.log"
}

# gpu_tests LOG LIMIT FILTER [VAR=VALUE...]: the CUDA kernels' tests, then the CUDA model's, under a
# gtest filter, each under a time limit (a hang must cost minutes, not the session's device time).
gpu_tests() {
  local log=$1 limit=$2 filter=$3
  shift 3
  run_to "$log" "$@" timeout "$limit" "$C/laoyao_tests_kernels_cuda" --gtest_filter="$filter" &&
    run_append "$log" "$@" timeout "$limit" "$C/laoyao_tests_model_cuda" --gtest_filter="$filter"
}

# shape_args CASE: a bench case's model and batch flags (bench/gpu_train_bench.sh).
shape_args() { bash bench/gpu_train_bench.sh --shape-args "$1"; }

# bench_run FILE [VAR=VALUE...] [CASE...]: laoyao against the PyTorch peer (bench/gpu_train_bench.sh,
# its default cases when none), the table into $OUT/FILE; BASELINE, NO_PEER and LAOYAO_ARGS reach the
# bench. Fails unless every case (or, with none named, some case) has a row.
bench_run() {
  local file=$1 envs=() var
  shift
  while [[ ${1:-} =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("$1"); shift; done
  for var in BASELINE NO_PEER LAOYAO_ARGS; do [ -n "${!var:-}" ] && envs+=("$var=${!var}"); done
  run_to "$OUT/$file" "${envs[@]}" bash bench/gpu_train_bench.sh "$C/laoyao" "$C/peers/pytorch_gpt.py" "$@" || return
  if dry; then echo "  (ran: a row in the table for each case)"; return 0; fi
  local rows missing=() c
  rows=$(bench_rows "$OUT/$file" | cut -d' ' -f1)
  [ -n "$rows" ] || { echo "! no case measured"; return 1; }
  for c in "$@"; do grep -qx "$c" <<< "$rows" || missing+=("$c"); done
  [ ${#missing[@]} = 0 ] || { echo "! no row for ${missing[*]}"; return 1; }
}
# bench_rows FILE: "case tokens/s ratio" for each row of the bench's final table.
bench_rows() {
  awk -F'|' '/^\|---/ { table = 1; next }
             table && /^\|/ { for (i = 2; i <= 5; i++) gsub(/^ +| +$/, "", $i); print $2, $3, $5 }' "$1" 2> /dev/null
}

# ms LOG: the last "elapsed time per iteration (ms)" of a training log.
ms() { grep 'elapsed time per iteration' "$1" 2> /dev/null | tail -1 | sed -n 's|.*elapsed time per iteration (ms): *\([0-9.]*\).*|\1|p'; }
# last_match LOG REGEX: the last part of a line of LOG that matches REGEX (grep -o).
last_match() { grep -o "$2" "$1" 2> /dev/null | tail -1; }

# ---- Verdicts (tests): verdict_RULE STATUS [FILE...] prints a one-line detail, then any lines that
# say what failed (a log may not come back from the GPU machine), and returns 0 for PASS.

verdict_exit() { echo "exit $1"; [ "$1" = 0 ]; }

# laoyao doctor's checks: exit 0 and every check PASS.
verdict_checks() {
  local f=$OUT/$2
  echo "exit $1, $(grep -c '^  PASS' "$f" 2> /dev/null) PASS, $(grep -c '^  FAIL' "$f" 2> /dev/null) FAIL"
  grep '^  FAIL' "$f" 2> /dev/null
  [ "$1" = 0 ]
}

# GoogleTest: exit 0, a PASSED summary and no FAILED line.
verdict_gtest() {
  local f=$OUT/$2
  echo "exit $1: $(grep -E '^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \]' "$f" 2> /dev/null | tr '\n' ' ' | sed 's/ *$//')"
  [ "$1" = 0 ] && grep -q '^\[  PASSED  \]' "$f" && ! grep -q '^\[  FAILED  \]' "$f" && return 0
  grep -h -E -A6 '(Failure|error:)' "$f" 2> /dev/null | head -40  # the failing tests in their own words
  return 1
}

# compare-logs: every run and the comparison exit 0 (compare-logs: within BF16 tolerance).
verdict_compare() {
  echo "exit $1: $(grep -i verdict "$OUT/$2" 2> /dev/null | head -1)"
  [ "$1" = 0 ]
}

# A resumed run against the run that never stopped: exit 0 and iterations 21-23 bit for bit the same
# (the logged losses at 21 and 23, the grad norms at 21-23: a resumed run's line 22 shows the
# losses' mean over 21 and 22, Megatron-LM's first-interval quirk, #6237).
verdict_identical() {
  local want got
  want=$(tail_numbers "$OUT/$2")
  got=$(tail_numbers "$OUT/$3")
  if [ -n "$want" ] && [ "$want" = "$got" ]; then
    echo "exit $1, iterations 21-23 bit-identical ($(one_line "$got" | head -c 100))"
    [ "$1" = 0 ]
  else
    echo "exit $1, iterations 21-23 DIFFER: want $(one_line "$want" | head -c 100); got $(one_line "$got" | head -c 100)"
    return 1
  fi
}
one_line() { tr -s '\n ' '  ' <<< "$1"; }
tail_numbers() {
  grep -E ' iteration +2[123]/' "$1" 2> /dev/null | while read -r line; do
    local it
    it=$(echo "$line" | sed -n 's|.* iteration *\([0-9]*\)/.*|\1|p')
    echo "$it $(echo "$line" | grep -oE '(lm loss|grad norm|load_balancing_loss|z_loss): [^|]*' |
      { if [ "$it" = 22 ]; then grep 'grad norm'; else cat; fi; } | tr '\n' ' ')"
  done
}

# ---- Figures (measurements): figures_RULE [FILE...] prints the case's figure on its first line,
# then the lines worth reading without the log.

# A table: how many rows, then its lines.
figures_table() {
  echo "$(awk '/^\|---/ { table = 1; next } table && /^\|/ { n++ } END { print n + 0 }' "$OUT/$1" 2> /dev/null) rows: $OUT/$1"
  grep '^|' "$OUT/$1" 2> /dev/null
}

# The first N lines of a file (the first its figure).
figures_head() { head -"$2" "$OUT/$1" 2> /dev/null; }

# bench/gpu_train_bench.sh's table: each case's tokens/s and ratio to the peer, then the table (and
# any failure printed inside it).
figures_bench() {
  local line
  line=$(bench_rows "$OUT/$1" | awk '{ printf "%s%s %s tokens/s (%s)", (NR > 1 ? "; " : ""), $1, $2, $3 }')
  echo "${line:-no case measured}"
  sed -n '/^| case/,$p' "$OUT/$1" 2> /dev/null
}

# A throughput run: ms a step, tokens/s against BASE's log (scaled by TOKENS, the ratio of tokens a
# step), memory, the last losses; then the step's phases where logged.
figures_speed() {
  local f=$OUT/$1 m base ratio="" balance
  m=$(ms "$f")
  balance=$(last_match "$f" 'load_balancing_loss: [0-9.E+-]*')
  if [ $# -ge 3 ]; then
    base=$(ms "$OUT/$2")
    ratio=", $(python3 -c "print(f'{$3*$base/$m:.2f}x')" 2> /dev/null || echo n/a) the tokens/s of ${2%.log} (${base:-?} ms/step)"
  fi
  echo "${m:-?} ms/step$ratio; $(last_match "$f" 'device memory held: *[0-9.]* GB'); $(last_match "$f" 'lm loss: [0-9.E+-]*')${balance:+; $balance}"
  grep 'step phases' "$f" 2> /dev/null | tail -1 | sed 's/.*step phases/step phases/'
  grep 'MoE phases' "$f" 2> /dev/null | tail -1 | sed 's/.*MoE phases/MoE phases/'
}

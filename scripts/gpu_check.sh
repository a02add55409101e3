#!/usr/bin/env bash
# Everything #5 asks of the GPU machine, in one call: doctor (on every visible GPU, with an NCCL
# all-reduce on the two-GPU kind), the GPU tests (every CUDA op against the CPU op, the CUDA model
# against the CPU model), CPU-vs-GPU training runs of the same config compared with `laoyao
# compare-logs`, the multi-GPU and checkpoint checks, and the benchmarks against the PyTorch peer.
# Each check is a case declared in scripts/gpu_cases.sh: its parts, TEST (a verdict, PASS or FAIL, by
# a declared rule) or MEASUREMENT (figures; it ran or failed to run), the GPUs it needs, its time
# limit, its command.
#   scripts/gpu_check.sh stage [BUILD_DIR]   here: build laoyao and the GPU tests, copy them, the
#                                            shared libraries the GPU machine lacks (yaml-cpp 0.7)
#                                            and the peers (../shared/peers) to build/gpu-carry
#   scripts/gpu_check.sh run [PARTS]         there (device tool, carry ["build/gpu-carry"], from the
#                                            repository root): the cases of PARTS (default: doctor
#                                            tests parity parity_llama parity_fused attention gemm
#                                            profile bench), each part's in declared order, each case
#                                            once. A case needing more GPUs than are visible is
#                                            skipped (moe_dp2, moe_ep_speed, dp2*, tp2: nvidia-h200-x2;
#                                            four, four_moe: nvidia-h200-x4). Each result is printed
#                                            as the case finishes, then a table: tests, then
#                                            measurements. In $OUT (default /tmp/out): the results in
#                                            00_results.txt, the table in 00_summary.txt, every other
#                                            log (each case's own case_NAME.txt among them) packed into
#                                            logs.tgz at the end (the device tool returns at most 8
#                                            files). The cases share RUN_SECONDS (default 540: a device
#                                            call's 600 less the packing): each runs under its own limit
#                                            or what is left, whichever is less; once none is left the
#                                            rest are reported as not started. Exit 1 when a test
#                                            failed, 2 for an unknown part.
#   DRY_RUN=1 scripts/gpu_check.sh run [PARTS]   each case's commands, printed, nothing run
#   scripts/gpu_check.sh list [PARTS]        the declared cases (all parts when none): part, name,
#                                            kind, GPUs, limit, rule
# Knobs (read when the cases are declared): BENCH_CASES the bench cases (BASELINE, NO_PEER and
# LAOYAO_ARGS reach bench/gpu_train_bench.sh); MOE_SPEED_ROUTING=natural|forced the moe_2b throughput
# runs' routing, MOE_SPEED_RUNS which of them (1gpu dp2_overlap dp2_distopt ep2_overlap ep2_distopt
# ep2_a2a ep2_both dp2_both); DP2_SPEED=0 drops dp2's throughput runs, FOUR_SPEED=0 four's;
# PHASES_CASES, KPROF_CASES, GAPS_CASES, CLOCKS_CASES the bench cases of phases, kernel_profile,
# graph_gaps, clocks; GROUPED_TESTS / GROUPED_BENCH / GROUPED_FLAGSHIP the grouped part's kernel
# sets; NCU_KERNELS, NCU_BIN the ncu part's kernels and bench; ATTN_BENCH_UNDER_LOAD=1,
# DOCTOR_ARGS.
set -uo pipefail
C=build/gpu-carry
SCRIPTS=$(dirname "${BASH_SOURCE[0]}")

stage() {
  set -e
  B="${1:-build/main}"
  [ -f "$B/build.ninja" ] || cmake --preset default -B "$B"
  # The GPU here is Hopper: device code for sm_90a alone keeps the carry under the 64 MiB a run takes.
  grep -q "^LAOYAO_CUDA_ARCHS:STRING=90a$" "$B/CMakeCache.txt" || cmake "$B" -DLAOYAO_CUDA_ARCHS=90a > /dev/null
  cmake --build "$B" --target laoyao laoyao_tests_kernels_cuda laoyao_tests_model_cuda laoyao_bench_attention laoyao_bench_step_breakdown \
    laoyao_bench_gemm laoyao_bench_grouped_gemm laoyao_bench_memory_ops laoyao_bench_thread_ranks -j2
  mkdir -p "$C/lib" "$C/peers"  # not emptied: tests/gpu/crosscheck.sh keeps its vocabularies there too
  cp "$B/laoyao" "$B/laoyao_tests_kernels_cuda" "$B/laoyao_tests_model_cuda" "$B/laoyao_bench_attention" "$B/laoyao_bench_step_breakdown" \
    "$B/laoyao_bench_gemm" "$B/laoyao_bench_grouped_gemm" "$B/laoyao_bench_memory_ops" "$B/laoyao_bench_thread_ranks" "$C/"
  cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$C/lib/"
  # Gloo and what it pulls in (hiredis, ibverbs, libnl) are Debian's, absent on the GPU machine.
  for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$C/lib/"; done
  cp ../shared/peers/*.py bench/peers/*.py "$C/peers/"  # (the shared peers, and ours: bench/peers)
  du -sh "$C"
}

# select_cases PART...: SELECTED, the cases of those parts in the order given, each once. An unknown
# part stops everything before anything runs.
select_cases() {
  local part name
  SELECTED_PARTS=("$@")
  SELECTED=()
  for part in "$@"; do
    known_part "$part" || { echo "unknown part $part; the parts are: ${KNOWN_PARTS[*]}" >&2; exit 2; }
    for name in "${CASE_NAMES[@]}"; do
      [[ ",${CASE_PARTS[$name]}," == *",$part,"* && " ${SELECTED[*]} " != *" $name "* ]] && SELECTED+=("$name")
    done
  done
}

visible_gpus() {
  local n ids
  n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
    [ "${#ids[@]}" -lt "$n" ] && n=${#ids[@]}
  fi
  echo "$n"
}

# skip_reason NAME: why the case does not run here, if it does not.
skip_reason() {
  local gpus=${CASE_GPUS[$1]}
  if declare -F "skip_$1" > /dev/null && "skip_$1"; then return; fi
  [ "$gpus" -le "$VISIBLE_GPUS" ] || echo "needs $(gpus_text "$gpus")"
}

list_cases() {
  if [ $# = 0 ]; then select_cases "${KNOWN_PARTS[@]}"; else select_cases "$@"; fi
  local name
  printf '# %-24s %-32s %-11s %4s %6s  %s\n' parts case kind GPUs limit rule
  for name in "${SELECTED[@]}"; do
    printf '%-26s %-32s %-11s %4s %5ss  %s\n' "${CASE_PARTS[$name]}" "$name" "${CASE_KIND[$name]}" \
      "${CASE_GPUS[$name]}" "${CASE_LIMIT[$name]}" "${CASE_RULE[$name]}"
  done
  echo "# default parts: ${DEFAULT_PARTS[*]}"
}

run_cases() {
  if [ $# = 0 ]; then select_cases "${DEFAULT_PARTS[@]}"; else select_cases "$@"; fi
  VISIBLE_GPUS=$(visible_gpus)
  [ ${#SELECTED[@]} -gt 0 ] || echo "no case in ${SELECTED_PARTS[*]} (their knobs leave none)"
  if dry; then print_commands; return; fi
  local sp name
  sp=$(python3 -c 'import site;print(site.getsitepackages()[0])')
  # The carried libraries last: where the machine has its own (libibverbs, say), its own win.
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}:$PWD/$C/lib"
  export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared hosts (.library/device/KINDS.md)
  mkdir -p "$OUT"
  : > "$OUT/00_results.txt"
  RUN_END=$((SECONDS + ${RUN_SECONDS:-540}))
  for name in "${SELECTED[@]}"; do run_case "$name"; done
  summary_table | tee "$OUT/00_summary.txt"
  pack_logs
  ! any_test_failed
}

# Every file of $OUT but the results and the table into $OUT/logs.tgz (then removed).
pack_logs() {
  (
    cd "$OUT" || exit 1
    local files
    mapfile -t files < <(find . -mindepth 1 -maxdepth 1 ! -name 00_results.txt ! -name 00_summary.txt ! -name logs.tgz)
    [ ${#files[@]} -gt 0 ] || exit 0
    tar czf logs.tgz.part "${files[@]}" && rm -rf "${files[@]}" && mv logs.tgz.part logs.tgz
  ) || echo "could not pack the logs in $OUT" >&2
}
any_test_failed() {
  local name
  for name in "${SELECTED[@]}"; do [[ ${VERDICT_OF[$name]} == FAIL* ]] && return 0; done
  return 1
}

print_commands() {
  local name why
  echo "# DRY_RUN: ${#SELECTED[@]} cases of ${SELECTED_PARTS[*]}; run with NCCL_NVLS_ENABLE=0, the carried libraries on LD_LIBRARY_PATH"
  for name in "${SELECTED[@]}"; do
    why=$(skip_reason "$name")
    echo "== $name (${CASE_PARTS[$name]}): ${CASE_KIND[$name]}, $(gpus_text "${CASE_GPUS[$name]}"), limit ${CASE_LIMIT[$name]} s, \
rule ${CASE_RULE[$name]}${why:+; skipped here: $why}"
    (run_declared_case "$name")
  done
}

# run_case NAME: the case under its time limit, its output in $OUT/case_NAME.txt, then judged.
declare -A VERDICT_OF=() SECONDS_OF=() FIGURE_OF=()
run_case() {
  local name=$1 why start status limit
  why=$(skip_reason "$name")
  if [ -n "$why" ]; then record "$name" "skipped ($why)" "" ""; return; fi
  limit=$((RUN_END - SECONDS))
  if [ "$limit" -le 0 ]; then record "$name" "not started (RUN_SECONDS spent)" "" ""; return; fi
  [ "${CASE_LIMIT[$name]}" -lt "$limit" ] && limit=${CASE_LIMIT[$name]}
  start=$SECONDS
  # shellcheck disable=SC2016  # expanded by the case's own shell
  timeout -k 30 "$limit" bash -c 'set -uo pipefail; source "$0" && run_declared_case "$1"' \
    "$SCRIPTS/gpu_cases.sh" "$name" > "$OUT/case_$name.txt" 2>&1
  status=$?
  judge "$name" "$status" $((SECONDS - start))
}

# judge NAME STATUS SECONDS: a test's verdict by its rule, or whether a measurement ran and its figures.
judge() {
  local name=$1 status=$2 rule args lines verdict
  rule=$(rule_function "$name")
  mapfile -t args < <(rule_args "$name")
  if [ "${CASE_KIND[$name]}" = TEST ]; then
    if lines=$("$rule" "$status" "${args[@]}"); then verdict=PASS; else verdict=FAIL; fi
  else
    lines=$("$rule" "${args[@]}")
    if [ "$status" = 0 ]; then verdict=ran; else verdict="failed to run"; fi
  fi
  [[ $status == 124 || $status == 137 ]] && verdict+=" (timed out)"
  [[ $verdict == PASS || $verdict == ran ]] || lines+=$'\n'$(grep '^! ' "$OUT/case_$name.txt")
  record "$name" "$verdict" "$3" "$lines"
}

# record NAME VERDICT SECONDS LINES: printed as it happens (a run cut short keeps what it has); the
# first of LINES is the case's figure (a test's detail) in the table, the others are printed under it.
record() {
  local name=$1 first=${4%%$'\n'*} rest=""
  [[ $4 == *$'\n'* ]] && rest=${4#*$'\n'}
  VERDICT_OF[$name]=$2 SECONDS_OF[$name]=$3 FIGURE_OF[$name]=$first
  {
    printf '%-24s %-30s %6s  %s\n' "$2" "$name" "${3:+$3 s}" "$first"
    [ -z "$rest" ] || grep -v '^$' <<< "$rest" | sed 's/^/    /'
  } | tee -a "$OUT/00_results.txt"
}

# The table printed last: the tests (verdict, seconds, detail), then the measurements (ran or not,
# seconds, figure).
summary_table() {
  local kind name
  for kind in TEST MEASUREMENT; do
    if [ $kind = TEST ]; then printf '\n==== tests\n| case | verdict | s | detail |\n'
    else printf '\n==== measurements\n| case | ran | s | figure |\n'; fi
    echo "|---|---|---|---|"
    for name in "${SELECTED[@]}"; do
      [ "${CASE_KIND[$name]}" = $kind ] || continue
      printf '| %s | %s | %s | %s |\n' "$name" "${VERDICT_OF[$name]}" "${SECONDS_OF[$name]}" \
        "$(cut -c1-200 <<< "${FIGURE_OF[$name]//|//}")"
    done
  done
}

case "${1:-}" in
  stage) stage "${2:-}" ;;
  run | list)
    OUT="${OUT:-/tmp/out}"
    export C OUT
    # shellcheck source=scripts/gpu_cases.sh
    source "$SCRIPTS/gpu_cases.sh"
    "$1_cases" "${@:2}"
    ;;
  *)
    echo "usage: $0 stage [BUILD_DIR] | run [PART ...] | list [PART ...]   (DRY_RUN=1 run: the commands only)" >&2
    exit 2
    ;;
esac

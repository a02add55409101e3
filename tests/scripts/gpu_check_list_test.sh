#!/usr/bin/env bash
# CI's check of scripts/gpu_check.sh, which only the GPU machine runs for real: its cases are
# declared (every part CI relies on has some, each a TEST or a MEASUREMENT), `list` and DRY_RUN=1
# work without a GPU and without build/gpu-carry, each test's verdict reads a file its commands
# write, a case needing GPUs that are not there is skipped (never passed), and an unknown part is
# refused with exit status 2, naming it and the known parts.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# A copy of the runner and what it reads, without build/ (so no staged binaries) and with no GPU
# visible, in a folder of its own.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/scripts" "$work/bench"
cp "$root"/scripts/gpu_check.sh "$root"/scripts/gpu_cases.sh "$root"/scripts/gpu_lib.sh "$work/scripts/"
cp "$root/bench/gpu_train_bench.sh" "$work/bench/"
cd "$work" || exit 1
export CUDA_VISIBLE_DEVICES="" OUT="$work/out"
gpu_check() { bash scripts/gpu_check.sh "$@"; }

# `list`: one line a case, "PARTS NAME KIND GPUS LIMIT RULE"; # lines are comments.
listing=$(gpu_check list) || { echo "FAIL: gpu_check.sh list exited $? (its message above)" >&2; exit 1; }
cases=$(grep -v '^#' <<< "$listing")
[ -n "$cases" ] || { echo "FAIL: gpu_check.sh list printed no case" >&2; exit 1; }
while read -r parts name kind gpus limit rule; do
  [[ $kind == TEST || $kind == MEASUREMENT ]] || fail "case $name: kind '$kind' is neither TEST nor MEASUREMENT"
  [[ $gpus =~ ^[124]$ ]] || fail "case $name: needs '$gpus' GPUs (1, 2 or 4)"
  [[ $limit =~ ^[0-9]+s$ ]] || fail "case $name: limit '$limit' is not a number of seconds"
  [ -n "$rule" ] || fail "case $name: no rule"
  [ -n "$parts" ] || fail "case $name: no part"
done <<< "$cases"
for part in doctor tests parity parity_llama ckpt bench; do
  awk -v part="$part" '{ n = split($1, p, ","); for (i = 1; i <= n; i++) if (p[i] == part) found = 1 }
                       END { exit !found }' <<< "$cases" || fail "part $part has no declared case"
done

# DRY_RUN=1 over every part: a block ("== NAME ...") for each case listed, with its commands; a
# test's verdict reads files (the RULE's arguments) that its commands, or an earlier case's, write.
all_parts=$(awk '{ gsub(",", "\n", $1); print $1 }' <<< "$cases" | awk '!seen[$0]++' | tr '\n' ' ')
# shellcheck disable=SC2086  # all_parts: one word a part
dry=$(DRY_RUN=1 gpu_check run $all_parts) || fail "DRY_RUN=1 gpu_check.sh run (every part) exited $?"
[ "$(grep -c '^== ' <<< "$dry")" = "$(wc -l <<< "$cases")" ] ||
  fail "the dry run shows $(grep -c '^== ' <<< "$dry") cases, list $(wc -l <<< "$cases")"
while read -r _ name kind _ _ rule; do
  block=$(awk -v name="$name" '/^== / { inside = ($2 == name) } inside' <<< "$dry")
  [ "$(grep -vc '^== ' <<< "$block")" -gt 0 ] || fail "case $name: the dry run shows no command"
  [[ $kind == TEST && $rule == *:* ]] || continue
  so_far=$(awk -v name="$name" '/^== / { if (done) exit; if ($2 == name) done = 1 } 1' <<< "$dry")
  IFS=, read -r -a files <<< "${rule#*:}"
  for file in "${files[@]}"; do
    grep -q -- "$OUT/$file" <<< "$so_far" ||
      fail "case $name: its rule reads $file, which neither its commands nor an earlier case's write"
  done
done <<< "$cases"
default_dry=$(DRY_RUN=1 gpu_check run) || fail "DRY_RUN=1 gpu_check.sh run (default parts) exited $?"
grep -q '^== doctor ' <<< "$default_dry" || fail "the default parts' dry run has no doctor case"

# A real run with no GPU visible: every case skipped, none passed, exit 0, the table printed.
run_output=$(gpu_check run doctor dp2 four) || fail "gpu_check.sh run with no GPU exited $?"
grep -q 'skipped (needs 2 GPUs)' <<< "$run_output" || fail "a two-GPU case was not reported as skipped"
grep -q 'skipped (needs 4 GPUs)' <<< "$run_output" || fail "a four-GPU case was not reported as skipped"
! grep -qE '^(PASS|ran) ' <<< "$run_output" || fail "a case passed or ran with no GPU visible"
grep -q '^==== tests' <<< "$run_output" || fail "the run printed no table of tests"

# The run's time budget and its packed logs, with one GPU faked: RUN_SECONDS=0 starts nothing (each
# case reported as not started, none passed), and everything in $OUT but the results and the table
# ends up in logs.tgz.
mkdir -p "$work/fakebin"
printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (fake)"\n' > "$work/fakebin/nvidia-smi"
chmod +x "$work/fakebin/nvidia-smi"
rm -rf "$OUT" && mkdir -p "$OUT" && echo "an earlier log" > "$OUT/leftover.txt"
budget_output=$(PATH="$work/fakebin:$PATH" CUDA_VISIBLE_DEVICES=0 RUN_SECONDS=0 gpu_check run doctor ckpt) ||
  fail "gpu_check.sh run with RUN_SECONDS=0 exited $?"
[ "$(grep -c 'not started (RUN_SECONDS spent)' <<< "$budget_output")" -ge 2 ] ||
  fail "with RUN_SECONDS=0 the cases were not reported as not started"
! grep -qE '^(PASS|ran) ' <<< "$budget_output" || fail "a case passed or ran with RUN_SECONDS=0"
[ "$(cd "$OUT" && ls | tr '\n' ' ')" = "00_results.txt 00_summary.txt logs.tgz " ] ||
  fail "after a run \$OUT holds $(cd "$OUT" && ls | tr '\n' ' '), not the results, the table and logs.tgz"
tar tzf "$OUT/logs.tgz" 2> /dev/null | grep -q 'leftover.txt' || fail "logs.tgz does not hold the other logs"

# An unknown part: exit 2, the part named, the known parts listed.
for command in run list; do
  message=$(gpu_check $command doctor no_such_part 2>&1)
  status=$?
  [ "$status" = 2 ] || fail "gpu_check.sh $command no_such_part exited $status, not 2"
  grep -q 'no_such_part' <<< "$message" || fail "gpu_check.sh $command no_such_part: the message does not name it"
  for part in doctor tests parity bench four_moe; do
    grep -qw "$part" <<< "$message" || fail "gpu_check.sh $command no_such_part: the message does not list part $part"
  done
done

if [ "$failures" = 0 ]; then echo "gpu_check.sh: $(wc -l <<< "$cases") declared cases, all checks passed"; fi
[ "$failures" = 0 ]

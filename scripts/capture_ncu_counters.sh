#!/usr/bin/env bash
# The Nsight Compute counters behind measured puzzles (transpose v1-v7, reduce_sum v1-v4, strided_copy
# past stride 8, hopper_gemm v1-v7; and, for issue 17, "gemms" and "rows": the missed goals beside their library
# versions), captured on the GPU runner into OUTDIR as ncu_counters_<group>.txt,
# each with its record
# (commit them as benchmarks/results/outputs/<gpu>/; `<!-- bench:output ncu_counters_transpose -->` renders one).
#
#   bash scripts/capture_ncu_counters.sh OUTDIR
#
# A separate script from capture_profiles.sh on purpose: a capture's hash covers the script that wrote it, so
# adding these targets there would mark every capture of the profiling chapter stale without changing them.
# KM_NCU_GROUPS (default "transpose reduce strided hopper") captures part of it. One ncu run per launch: the sections
# (warp stall reasons, scheduler, memory tables) plus the counters that scripts/ncu_counters.py tabulates
# (`--metrics` prints them). The profiled call runs between cudaProfilerStart/Stop (--profile-from-start off),
# so --launch-count 1 takes the first matching launch of that call. GPU clocks are left as they are, as in
# capture_profiles.sh. Best effort: every launch is tried; the exit status is non-zero if any step failed.
set -uo pipefail
OUTDIR=${1:?usage: capture_ncu_counters.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
CNT=("$PY" -W ignore::DeprecationWarning scripts/ncu_counters.py)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
status=0
GROUPS_WANTED=" ${KM_NCU_GROUPS:-transpose reduce strided hopper} "
command -v ncu > /dev/null || { echo "capture_ncu_counters: ncu is not on PATH" >&2; exit 1; }
METRICS=$("${CNT[@]}" --metrics) || exit 1

declare -A shown_cmd
while IFS=$'\t' read -r group name regex; do
  [[ $GROUPS_WANTED == *" $group "* ]] || continue
  mkdir -p "$TMP/$group"
  cmd=(ncu --clock-control none --profile-from-start off --kernel-name-base demangled
       --kernel-name "regex:$regex" --launch-count 1
       --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
       --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis
       --metrics "$METRICS"
       --export "$TMP/$group/$name" --force-overwrite
       "${CNT[@]}" --kernel "$name")
  # the command as the capture shows it: the group's first launch (the others differ in target and regex)
  shown=""
  for arg in "${cmd[@]}"; do
    [ "$arg" = "$METRICS" ] && { shown+="<the metrics under the table> "; continue; }
    [[ $arg =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]] && shown+="$arg " || shown+="'$arg' "
  done
  shown=${shown//"$TMP"/\$TMP}
  [ -n "${shown_cmd[$group]:-}" ] || shown_cmd[$group]="${shown% }  (and likewise for each column)"
  if ! "${cmd[@]}" > "$TMP/$group/$name.log" 2>&1; then
    echo "capture_ncu_counters: ncu failed for $name:" >&2
    tail -n 20 "$TMP/$group/$name.log" >&2
    status=1
    continue
  fi
  ncu --import "$TMP/$group/$name.ncu-rep" --csv --page raw --print-units base --print-kernel-base demangled \
    > "$TMP/$group/$name.csv" 2> /dev/null || status=1
  if ! grep -q '^"[0-9]' "$TMP/$group/$name.csv"; then
    echo "capture_ncu_counters: ncu profiled no kernel for $name (kernel regex $regex)" >&2
    status=1
  fi
done < <("${CNT[@]}" --targets)

for group in $GROUPS_WANTED; do
  [ -d "$TMP/$group" ] || continue
  out="$OUTDIR/ncu_counters_$group.txt"
  impls=$("${CNT[@]}" --impls "$group") || { status=1; continue; }
  "${CNT[@]}" --text "$group" "$TMP/$group" "${shown_cmd[$group]}" > "$out" \
    && "$PY" -m snippets.bench.captures record "$out" --param "impls=$impls" || status=1
done

exit $status

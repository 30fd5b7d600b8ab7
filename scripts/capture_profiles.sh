#!/usr/bin/env bash
# Profiler and sanitizer outputs of the profiling chapter, captured on the GPU runner into OUTDIR
# (commit them as benchmarks/results/outputs/<gpu>/NAME.txt; `<!-- bench:output NAME -->` renders them).
#
#   bash scripts/capture_profiles.sh OUTDIR
#
# - torch_profiler.txt: torch.profiler's table for a small workload of the book's kernels, and the top kernels
#   (the Chrome trace is megabytes: it is written to a temporary folder and dropped);
# - with ncu on PATH: ncu_<target>.txt for every target that `python scripts/profile_kernels.py --targets`
#   lists (one version, one call at the op's headline size, a few sections only, so the whole capture stays
#   within a few minutes), and ncu_summary.txt, a kernel x metric table parsed from `ncu --csv --page raw`;
# - with nvcc and compute-sanitizer on PATH: sanitizer_memcheck.txt and sanitizer_racecheck.txt, the tools'
#   reports on the planted bugs of csrc/part3/planted_bugs.cu and on their fixed versions.
#
# To capture part of it: KM_PROFILE_STEPS (default "torch ncu sanitizer"), KM_NCU_TARGETS (target names, default
# all) and KM_NCU_SUMMARY (the summary's file name without .txt, default ncu_summary), e.g.
#   KM_PROFILE_STEPS=ncu KM_NCU_TARGETS="rope_v3 rope_v2" KM_NCU_SUMMARY=ncu_summary_part5 bash ... OUTDIR
#
# GPU clocks are left as they are (--clock-control none): the numbers are those of the clocks the benchmarks
# ran at. Best effort: every step runs; the exit status is non-zero if any step failed. Each file a step wrote
# gets its record, NAME.meta.json (the hash of the code that produced it; snippets.bench.captures).
set -uo pipefail
OUTDIR=${1:?usage: capture_profiles.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
PROF=("$PY" -W ignore::DeprecationWarning scripts/profile_kernels.py)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
status=0
STEPS=" ${KM_PROFILE_STEPS:-torch ncu sanitizer} "
ONLY=${KM_NCU_TARGETS:-}
record() { "$PY" -m snippets.bench.captures record "$@"; }

# 1. torch.profiler
if [[ $STEPS == *" torch "* ]]; then
  "${PROF[@]}" "$OUTDIR" --trace "$TMP/trace.json" > /dev/null && record "$OUTDIR/torch_profiler.txt" || status=1
fi

# 2. Nsight Compute: one profile per target, printed twice from the saved report: the sections as text (for the
#    reader) and every raw metric as CSV (for the summary; the warp stall reasons are only there).
if [[ $STEPS == *" ncu "* ]] && command -v ncu > /dev/null; then
  profiled=""  # the targets of the summary
  while IFS=$'\t' read -r name regex launches; do
    [ -z "$ONLY" ] || [[ " $ONLY " == *" $name "* ]] || continue
    cmd=(ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$regex"
         --launch-skip "$launches" --launch-count "$launches"
         --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
         --metrics dram__bytes.sum.per_second
         --export "$TMP/$name" --force-overwrite
         "${PROF[@]}" --kernel "$name")
    shown=""  # the command as the report shows it: arguments with shell metacharacters in single quotes
    for arg in "${cmd[@]}"; do
      [[ $arg =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]] && shown+="$arg " || shown+="'$arg' "
    done
    shown=${shown//"$TMP"/\$TMP}
    if ! "${cmd[@]}" > "$TMP/$name.log" 2>&1; then
      echo "capture_profiles: ncu failed for $name:" >&2
      tail -n 20 "$TMP/$name.log" >&2
      status=1
      continue
    fi
    ncu --import "$TMP/$name.ncu-rep" > "$TMP/$name.details.txt" 2>&1 || status=1
    ncu --import "$TMP/$name.ncu-rep" --csv --page raw --print-units base --print-kernel-base demangled \
      > "$TMP/$name.csv" 2> /dev/null || status=1
    if ! grep -q '^"[0-9]' "$TMP/$name.csv"; then
      echo "capture_profiles: ncu profiled no kernel for $name (kernel regex $regex)" >&2
      status=1
    fi
    "${PROF[@]}" --ncu-text "$name" "$TMP/$name.details.txt" "$TMP/$name.csv" "${shown% }" \
      > "$OUTDIR/ncu_$name.txt" && record "$OUTDIR/ncu_$name.txt" || status=1
    profiled+="$name "
  done < <("${PROF[@]}" --targets)
  summary="$OUTDIR/${KM_NCU_SUMMARY:-ncu_summary}.txt"
  "${PROF[@]}" --ncu-summary "$TMP" > "$summary" \
    && record "$summary" --param "targets=${profiled% }" || status=1
fi

# 3. compute-sanitizer on the planted bugs: memcheck for the out-of-bounds write, racecheck for the missing
#    barrier; the program exits 0 either way, so the tool's report is the verdict.
if [[ $STEPS == *" sanitizer "* ]] && command -v nvcc > /dev/null && command -v compute-sanitizer > /dev/null; then
  if nvcc -std=c++17 -O2 -lineinfo -arch=native -I csrc/common -o "$TMP/planted_bugs" \
       csrc/part3/planted_bugs.cu; then
    for pair in "memcheck oob oob-fixed" "racecheck race race-fixed"; do
      read -r tool buggy fixed <<< "$pair"
      : > "$TMP/$tool.log"
      for mode in "$buggy" "$fixed"; do
        echo "\$ compute-sanitizer --tool $tool --show-backtrace no ./planted_bugs $mode" >> "$TMP/$tool.log"
        (cd "$TMP" && compute-sanitizer --tool "$tool" --show-backtrace no ./planted_bugs "$mode") \
          >> "$TMP/$tool.log" 2>&1 || status=1
        echo >> "$TMP/$tool.log"
      done
      "${PROF[@]}" --trim-sanitizer < "$TMP/$tool.log" > "$OUTDIR/sanitizer_$tool.txt" \
        && record "$OUTDIR/sanitizer_$tool.txt" || status=1
    done
  else
    status=1
  fi
fi

exit $status

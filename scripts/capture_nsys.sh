#!/usr/bin/env bash
# The streams chapter's overlap example (stream_overlap v0 and v3 at the headline size) under Nsight Systems,
# captured on the GPU runner into OUTDIR/nsys_stream_overlap.txt with its record (commit it as
# benchmarks/results/outputs/<gpu>/; `<!-- bench:output nsys_stream_overlap -->` renders it next to the
# torch.profiler timeline).
#
#   bash scripts/capture_nsys.sh OUTDIR
#
# For each version: nsys profile records only the profiled call (scripts/nsys_streams.py brackets it with
# cudaProfilerStart/Stop; --capture-range=cudaProfilerApi), `nsys stats --report cuda_gpu_trace` exports every
# copy and kernel as CSV (the report is `gputrace` in Nsight Systems before 2023), and scripts/nsys_streams.py
# --summary turns it into per-stream counts, busy time, time with k operations in flight, and the operations in
# start order. The .nsys-rep files (megabytes) are dropped; run the same command to open one in the Nsight Systems
# GUI. A machine without nsys (the lent runner) can use the archive scripts/nsys_bundle.sh builds.
set -uo pipefail
OUTDIR=${1:?usage: capture_nsys.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
NS=("$PY" -W ignore::DeprecationWarning scripts/nsys_streams.py)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v nsys > /dev/null || { echo "capture_nsys: nsys is not on PATH (scripts/nsys_bundle.sh)" >&2; exit 1; }
# the GPU trace report: cuda_gpu_trace since Nsight Systems 2023, gputrace before (Debian 12's 2022.4), same columns
REPORT=cuda_gpu_trace
nsys stats --help-reports 2>&1 | grep -q "^ *cuda_gpu_trace" || REPORT=gputrace
status=0
out="$OUTDIR/nsys_stream_overlap.txt"
{
  nsys --version 2>&1 | head -n 1
  for v in v0 v3; do
    cmd=(nsys profile --trace=cuda --capture-range=cudaProfilerApi --capture-range-end=stop
         --output "$TMP/$v" --force-overwrite true "${NS[@]}" --run "$v")
    echo
    if ! "${cmd[@]}" > "$TMP/$v.log" 2>&1; then
      echo "nsys profile failed for $v:"; tail -n 20 "$TMP/$v.log"; status=1; continue
    fi
    if ! nsys stats --report $REPORT --format csv --force-export true "$TMP/$v.nsys-rep" \
         > "$TMP/$v.csv" 2> "$TMP/$v.stats.log"; then
      echo "nsys stats failed for $v:"; tail -n 20 "$TMP/$v.stats.log"; status=1; continue
    fi
    shown="nsys profile --trace=cuda --capture-range=cudaProfilerApi --capture-range-end=stop"
    shown+=" --output $v python scripts/nsys_streams.py --run $v"
    shown+=" && nsys stats --report $REPORT --format csv $v.nsys-rep"
    "${NS[@]}" --summary "$v" "$TMP/$v.csv" "$shown" || status=1
  done
} > "$out"
grep -q "GPU operations" "$out" || status=1
if [ $status -eq 0 ]; then "$PY" -m snippets.bench.captures record "$out" || status=1; fi
exit $status

#!/usr/bin/env bash
# Two timelines under Nsight Systems, captured on the GPU runner into OUTDIR with their records (commit them as
# benchmarks/results/outputs/<gpu>/): the streams chapter's overlap example (stream_overlap v0 and v3 at the
# headline size; nsys_stream_overlap.txt, rendered next to the torch.profiler timeline) and the capstone's decode
# step (capstone_decode v2 and v3; nsys_capstone_decode.txt). KM_NSYS_TARGETS (default "streams capstone").
#
#   bash scripts/capture_nsys.sh OUTDIR
#
# For each version: nsys profile records only the profiled calls (scripts/nsys_streams.py and
# scripts/nsys_capstone.py bracket them with cudaProfilerStart/Stop; --capture-range=cudaProfilerApi), `nsys stats`
# exports every copy and kernel (`--report cuda_gpu_trace`, `gputrace` in Nsight Systems before 2023) and the CUDA
# API calls (`cuda_api_sum`, `cudaapisum` before 2023) as CSV, and each script's --summary turns them into text:
# for the streams, per-stream counts, busy time, time with k operations in flight and the operations in start
# order; for the capstone, per step the GPU's busy time against its span, the launch calls and the kernels that
# take the most time. The .nsys-rep files (megabytes) are dropped; run the same command to open one in the Nsight
# Systems GUI. A machine without nsys (the lent runner) can use the archive scripts/nsys_bundle.sh builds.
set -uo pipefail
OUTDIR=${1:?usage: capture_nsys.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
NS=("$PY" -W ignore::DeprecationWarning scripts/nsys_streams.py)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v nsys > /dev/null || { echo "capture_nsys: nsys is not on PATH (scripts/nsys_bundle.sh)" >&2; exit 1; }
# the reports' names: cuda_gpu_trace and cuda_api_sum since Nsight Systems 2023, gputrace and cudaapisum before
# (Debian 12's 2022.4, which scripts/nsys_bundle.sh packs), with the same columns
REPORTS=$(nsys stats --help-reports 2>&1)
REPORT=cuda_gpu_trace
grep -q "^ *cuda_gpu_trace" <<< "$REPORTS" || REPORT=gputrace
API_SUM=cuda_api_sum
grep -q "^ *cuda_api_sum" <<< "$REPORTS" || API_SUM=cudaapisum
TARGETS=" ${KM_NSYS_TARGETS:-streams capstone} "
status=0

# trace NAME SCRIPT VERSION [nsys profile options]: profile one version into NAME.nsys-rep and export its GPU
# trace (NAME.csv); on failure print why and return 1
trace() {
  local name=$1 script=$2 v=$3
  shift 3
  if ! nsys profile --trace=cuda "$@" --capture-range=cudaProfilerApi --capture-range-end=stop \
       --output "$TMP/$name" --force-overwrite true "$PY" -W ignore::DeprecationWarning "$script" --run "$v" \
       > "$TMP/$name.log" 2>&1; then
    echo "nsys profile failed for $v:"; tail -n 20 "$TMP/$name.log"; return 1
  fi
  export_csv "$name" "$REPORT" csv
}

# export_csv NAME REPORT SUFFIX: nsys stats' REPORT of NAME.nsys-rep as CSV, into NAME.SUFFIX
export_csv() {
  nsys stats --report "$2" --format csv --force-export true "$TMP/$1.nsys-rep" > "$TMP/$1.$3" \
    2> "$TMP/$1.stats.log" || { echo "nsys stats failed for $1:"; tail -n 20 "$TMP/$1.stats.log"; return 1; }
}

# finish FILE OK: record FILE if every version of it was summarised (OK = 1), else mark the run failed
finish() {
  if [ "$2" = 1 ] && grep -q "GPU operations" "$1"; then
    "$PY" -m snippets.bench.captures record "$1" || status=1
  else
    status=1
  fi
}

if [[ $TARGETS == *" streams "* ]]; then
  out="$OUTDIR/nsys_stream_overlap.txt" ok=1
  {
    nsys --version 2>&1 | head -n 1
    for v in v0 v3; do
      echo
      trace "$v" scripts/nsys_streams.py "$v" || { ok=0; continue; }
      shown="nsys profile --trace=cuda --capture-range=cudaProfilerApi --capture-range-end=stop"
      shown+=" --output $v python scripts/nsys_streams.py --run $v"
      shown+=" && nsys stats --report $REPORT --format csv $v.nsys-rep"
      "${NS[@]}" --summary "$v" "$TMP/$v.csv" "$shown" || ok=0
    done
  } > "$out"
  finish "$out" $ok
fi

# The capstone's decode step (capstone_decode v2, the book's kernels eager, and v3, the same step in a CUDA graph;
# --cuda-graph-trace=node shows the kernels inside the graph): the GPU's idle time between kernels, the launches.
if [[ $TARGETS == *" capstone "* ]]; then
  out="$OUTDIR/nsys_capstone_decode.txt" ok=1
  {
    nsys --version 2>&1 | head -n 1
    for v in v2 v3; do
      echo
      trace "capstone_$v" scripts/nsys_capstone.py "$v" --cuda-graph-trace=node \
        && export_csv "capstone_$v" "$API_SUM" api.csv || { ok=0; continue; }
      shown="nsys profile --trace=cuda --cuda-graph-trace=node --capture-range=cudaProfilerApi"
      shown+=" --capture-range-end=stop --output $v python scripts/nsys_capstone.py --run $v"
      shown+=" && nsys stats --report $REPORT,$API_SUM --format csv $v.nsys-rep"
      "$PY" -W ignore::DeprecationWarning scripts/nsys_capstone.py --summary "$v" "$TMP/capstone_$v.csv" \
        "$TMP/capstone_$v.api.csv" "$shown" || ok=0
    done
  } > "$out"
  finish "$out" $ok
fi
exit $status

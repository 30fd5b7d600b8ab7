#!/usr/bin/env bash
# The stream-overlap timeline and the launch-latency summary that docs/part3/streams.md shows, captured on the GPU
# runner into OUTDIR (commit them as benchmarks/results/outputs/<gpu>/stream_overlap.json and launch_latency.txt;
# `<!-- bench:timeline stream_overlap -->` and `<!-- bench:output launch_latency -->` render them).
#
#   bash scripts/capture_streams.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: capture_streams.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
status=0

# v0 and v3 of stream_overlap under torch.profiler (copies and kernels with their streams), then one launch
# round trip per launcher and every launch_overhead version at 10,000 launches; the script writes each file's
# record (NAME.meta.json: the hash of the code that produced it).
$PY -W ignore::DeprecationWarning scripts/capture_streams.py "$OUTDIR" || status=1

for f in stream_overlap.json launch_latency.txt; do
  if [ ! -s "$OUTDIR/$f" ]; then
    echo "capture_streams.sh: $OUTDIR/$f was not written" >&2
    status=1
  fi
done
# The timeline must stay small enough to commit (the chapter draws it from this file).
if [ -s "$OUTDIR/stream_overlap.json" ] && [ "$(wc -c < "$OUTDIR/stream_overlap.json")" -ge 200000 ]; then
  echo "capture_streams.sh: $OUTDIR/stream_overlap.json is 200 KB or more" >&2
  status=1
fi

exit $status

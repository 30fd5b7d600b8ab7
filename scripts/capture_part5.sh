#!/usr/bin/env bash
# Part 5 outputs the chapters show, captured on the GPU runner into OUTDIR (default gpu-out/outputs):
# the Triton code torch.compile generates for blocks of this book (inductor_*.txt) and the chunk-size sweep of
# the fused linear + cross-entropy (linear_ce_chunks.txt).
#   bash scripts/capture_part5.sh OUTDIR
set -uo pipefail
OUT=${1:-gpu-out/outputs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
$PY scripts/capture_inductor.py "$OUT" || status=1
$PY scripts/capture_linear_ce_chunks.py "$OUT/linear_ce_chunks.txt" || status=1   # chunk size against time and memory
exit $status

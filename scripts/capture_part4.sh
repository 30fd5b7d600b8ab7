#!/usr/bin/env bash
# Part 4 outputs the chapters show, captured on the GPU runner into OUTDIR (default gpu-out/outputs):
# Triton compile metadata of the book's kernels, dropout peak memory, and the matmul autotuning sweep.
#   bash scripts/capture_part4.sh OUTDIR
set -uo pipefail
OUT=${1:-gpu-out/outputs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
$PY scripts/capture_triton.py "$OUT/triton_metadata.txt" || status=1
$PY scripts/capture_dropout_memory.py "$OUT/dropout_memory.txt" || status=1
$PY scripts/capture_autotune.py "$OUT/autotune_matmul.json" || status=1
$PY scripts/capture_matmul_shapes.py "$OUT" || status=1   # matmul_shapes.txt: odd and small-M shapes, every version
exit $status

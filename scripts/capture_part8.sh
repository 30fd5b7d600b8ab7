#!/usr/bin/env bash
# Part 8's capstone profiled on the GPU runner: where the time of one decode step goes, component by
# component, for the four rows of the capstone chapter's predictions (captured into OUTDIR as
# capstone_<row>.txt, each with its record; commit them as benchmarks/results/outputs/<gpu>/, and
# `<!-- bench:output capstone_<row> -->` renders one).
#
#   bash scripts/capture_part8.sh OUTDIR
#
# Llama 3 8B's shapes with random bf16 weights are 16 GB, and batch 32 at context 4096 adds 17 GB of
# KV cache: one H100 or H200 holds either row. Each row is its own process, so the next one starts
# with the memory free; a row that fails is logged and the next one runs.
set -uo pipefail
OUTDIR=${1:?usage: capture_part8.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
record() { "$PY" -m snippets.bench.captures record "$@"; }
row() {  # row NAME ARGS...: one profile, its record
  local name=$1
  shift
  $PY -W ignore::DeprecationWarning -m snippets.part8.capstone "$@" > "$OUTDIR/capstone_$name.txt" 2>&1 \
    && record "$OUTDIR/capstone_$name.txt" --param args="$*" || status=1
}
row 8b_b1 --config llama_8b --batch 1 --context 1024
row 8b_b32 --config llama_8b --batch 32 --context 4096
row 8b_b1_torch --config llama_8b --batch 1 --context 1024 --backend torch
row 1b_b1 --config llama_1b --batch 1 --context 1024
exit $status

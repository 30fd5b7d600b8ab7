#!/usr/bin/env bash
# cuda-gdb stopped inside the off-by-one kernel of csrc/part3/planted_bugs.cu, captured on the GPU
# runner into OUTDIR/cuda_gdb_oob.txt with its record (snippets.bench.captures). The program is
# built with -g -G (device debug information, optimisation off); the commands are
# scripts/cuda_gdb_oob.gdb. The debugger's lines about host threads are left out.
#
#   bash scripts/capture_cuda_gdb.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: capture_cuda_gdb.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
BIN=$(mktemp -d)/planted_bugs
nvcc -std=c++17 -g -G -arch=native -I csrc/common -o "$BIN" csrc/part3/planted_bugs.cu || exit 1
timeout 300 cuda-gdb -batch -x scripts/cuda_gdb_oob.gdb --args "$BIN" oob 2>&1 \
  | grep -vE "^\[New Thread|^\[Thread .* exited\]|libthread_db|^\[Detaching after|^\[New process|^\[Inferior" \
  | sed "s|$BIN|./planted_bugs|" > "$OUTDIR/cuda_gdb_oob.txt" \
  && grep -q "CUDA thread hit Breakpoint" "$OUTDIR/cuda_gdb_oob.txt" \
  && "$PY" -m snippets.bench.captures record "$OUTDIR/cuda_gdb_oob.txt"

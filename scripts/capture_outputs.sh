#!/usr/bin/env bash
# Program and profiler outputs the chapters show, captured on the GPU runner into OUTDIR
# (commit them as benchmarks/results/outputs/<gpu>/NAME.txt; `<!-- bench:output NAME -->` renders them).
# Each file that a step wrote gets its record, NAME.meta.json (the hash of the code that produced it: commit it
# too; snippets.bench.captures).
#
#   bash scripts/capture_outputs.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: capture_outputs.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
status=0
record() { "$PY" -m snippets.bench.captures record "$@"; }

# Registers and spills: the compiler's report for the spill kernels.
nvcc -std=c++17 -c -arch=sm_90a -Xptxas -v -I csrc/common csrc/part2/spill.cu -o /tmp/spill.o 2>&1 \
  | grep -v "^$" > "$OUTDIR/ptxas_spill.txt" && record "$OUTDIR/ptxas_spill.txt" || status=1

# Bank conflicts: Nsight Compute's counters for every pattern of the micro-benchmark (GPU clocks untouched).
if command -v ncu >/dev/null; then
  ncu --clock-control none --kernel-name regex:smem_read --metrics \
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed_op_shared_ld.sum \
    $PY scripts/profile_banks.py 2>&1 | grep -vE "^==PROF==|^\s*$" > "$OUTDIR/ncu_banks.txt" \
    && record "$OUTDIR/ncu_banks.txt" || status=1
fi

# Unified memory: on-demand page migration against a prefetch, 256 MiB.
$PY -W ignore::DeprecationWarning - > "$OUTDIR/unified_memory.txt" 2>&1 <<'PYEOF' \
  && record "$OUTDIR/unified_memory.txt" || status=1
import torch
from snippets.part2.host_transfer import unified_memory_timings
t = unified_memory_timings(256 * 2**20)
print(f"GPU: {torch.cuda.get_device_name(0)}; 256 MiB of managed memory, CUDA events on torch's stream")
for key, value in t.items():
    print(f"{key:>20}: {value:.4f}" if isinstance(value, float) else f"{key:>20}: {value}")
PYEOF
# Measuring GPU code: the same work timed the wrong ways and the right way.
$PY -W ignore::DeprecationWarning scripts/capture_timing_pitfalls.py > "$OUTDIR/timing_pitfalls.txt" 2>&1 \
  && record "$OUTDIR/timing_pitfalls.txt" || status=1

exit $status

#!/usr/bin/env bash
# Everything that needs the GPU, in one run: the GPU test suite (REQUIRE_GPU=1), a compute-sanitizer pass over
# the CUDA programs and kernels, the benchmarks, and the captured program outputs the chapters show.
#
#   bash scripts/gpu_run.sh [OUTDIR] [bench args...]     e.g. bash scripts/gpu_run.sh out --quick vector_add
#
# To measure one part only (the whole run takes longer than one device call allows):
#   KM_CAPTURES="part4" KM_TESTS="tests/test_part4_*.py" bash scripts/gpu_run.sh out softmax matmul ...
# KM_CAPTURES: which capture scripts run (outputs profiles streams part4; default all, "none" for none);
# KM_TESTS: the test files (default: all; "none" skips the tests), run by scripts/gpu_tests.sh one pytest per
# file in parallel (logs in OUTDIR/tests/, the summary in OUTDIR/outputs/gpu_tests.txt; KM_SHARD=i/n runs a
# shard of them, see CONTRIBUTING.md); KM_SANITIZE=0 skips the compute-sanitizer pass. Every captured file gets
# its record, NAME.meta.json (snippets.bench.captures): commit it with the file.
#
# Logs and results land in OUTDIR (default ./gpu-out); copy OUTDIR/results.json over
# benchmarks/results/<gpu>.json (or run with --out) and commit it.
set -uo pipefail
OUTDIR=${1:-gpu-out}
shift || true
mkdir -p "$OUTDIR/outputs"
# Program outputs the chapters show go to OUTDIR/outputs/; commit them as benchmarks/results/outputs/<gpu>/.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 REQUIRE_GPU=1 KM_OUTPUT_DIR=$OUTDIR/outputs
PY=${PYTHON:-python3}
# Without .git here, pass the commit being measured: KM_COMMIT=$(git rev-parse HEAD) KM_DIRTY=0|1
status=0
# Liger-Kernel, a baseline of Part 4, is a pure-Python wheel: the runner has no network, so a wheel downloaded
# beforehand into .whl/ (pip download liger-kernel --no-deps -d .whl) is installed from there if present.
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-deps --no-index --target /tmp/km-wheels .whl/liger_kernel-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/km-wheels
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
$PY -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"

echo "== compiler and profiler outputs the chapters show"
CAPTURES=${KM_CAPTURES:-outputs profiles streams part4 part5}
# outputs: compiler reports, device query; profiles: torch.profiler, Nsight Compute, sanitizers;
# streams: stream timeline, launch latency; part4: Triton metadata, dropout memory, autotuning, odd matmul shapes;
# part5: the Triton code torch.compile generates
for c in $CAPTURES; do
  [ "$c" = none ] || bash "scripts/capture_$c.sh" "$OUTDIR/outputs" || status=1
done

echo "== GPU test suite"
if [ "${KM_TESTS:-}" = none ]; then
  echo "skipped (KM_TESTS=none)" | tee "$OUTDIR/pytest.log"
else
  bash scripts/gpu_tests.sh "$OUTDIR" ${KM_TESTS:-} 2>&1 | tee "$OUTDIR/pytest.log" || status=1
fi

echo "== compute-sanitizer"
if [ "${KM_SANITIZE:-1}" = 0 ]; then
  echo "skipped (KM_SANITIZE=0)" | tee "$OUTDIR/sanitizer.log"
elif command -v compute-sanitizer >/dev/null; then
  $PY scripts/sanitize.py 2>&1 | tee "$OUTDIR/sanitizer.log" || status=1
else
  echo "compute-sanitizer not found: skipped" | tee "$OUTDIR/sanitizer.log"
fi

echo "== benchmarks"
$PY -m snippets bench --out "$OUTDIR/results.json" "$@" 2>&1 | tee "$OUTDIR/bench.log" || status=1
exit $status

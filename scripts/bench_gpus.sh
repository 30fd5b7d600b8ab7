#!/usr/bin/env bash
# The benchmarks on every GPU of one machine at once: one `python -m snippets bench` process per GPU
# (CUDA_VISIBLE_DEVICES), sharing a claim folder so each op is measured once, by whichever process is free
# (the op with the most jobs first). Each process measures its own ceilings and writes its own results file;
# they are merged into OUTDIR/results.json at the end. The GPUs must be of one model (one results file).
#
#   bash scripts/bench_gpus.sh OUTDIR [bench args...]    e.g. bash scripts/bench_gpus.sh out --stale-only
#
# KM_GPUS: how many GPUs (default: all that nvidia-smi lists). KM_BUDGET: seconds before the processes are
# stopped (default 560, under one 600 s device call); an op cut short is lost, every finished op is kept. With
# --stale-only, a second call with the same OUTDIR carries on where the first stopped (an op is fresh if any
# results file of this GPU in OUTDIR, or the committed one, holds it fresh).
set -uo pipefail
OUTDIR=${1:?usage: bench_gpus.sh OUTDIR [bench args...]}
shift
rm -rf "$OUTDIR/claims"  # claims are per call: an op cut short last time is free again
mkdir -p "$OUTDIR/claims"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ls .whl/liger_kernel-*.whl > /dev/null 2>&1 && ! $PY -c "import liger_kernel" 2> /dev/null; then
  $PY -m pip install -q --no-deps --no-index --target /tmp/km-wheels .whl/liger_kernel-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/km-wheels
fi
N=${KM_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
status=0
pids=()
for ((g = 0; g < N; g++)); do
  CUDA_VISIBLE_DEVICES=$g timeout "${KM_BUDGET:-560}" $PY -m snippets bench --claim "$OUTDIR/claims" \
    --out "$OUTDIR/results.gpu$g.json" "$@" > "$OUTDIR/bench.gpu$g.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
$PY - "$OUTDIR" "$N" <<'PYEOF' || status=1
import json, sys
from pathlib import Path
from snippets.bench.harness import merge
out, n = Path(sys.argv[1]), int(sys.argv[2])
for g in range(n):
    part = out / f"results.gpu{g}.json"
    if part.exists():
        data = json.loads(part.read_text())
        merge(out / "results.json", data["gpu"], data["ops"], data.get("ceilings", {}))
        print(f"GPU {g}: {', '.join(data['ops'])}")
PYEOF
grep -h "jobs in" "$OUTDIR"/bench.gpu*.log
exit $status

#!/usr/bin/env bash
# The benchmarks on every GPU of one machine at once: one `python -m snippets bench` process per GPU
# (CUDA_VISIBLE_DEVICES), sharing a claim folder so each op is measured once, by whichever process is free
# (the op with the most jobs first). Each process measures its own ceilings and writes its own results file;
# they are merged into OUTDIR/results.json at the end. The GPUs must be of one model (one results file).
#
#   bash scripts/bench_gpus.sh OUTDIR [bench args...]    e.g. bash scripts/bench_gpus.sh out --stale-only
#
# KM_GPUS: how many GPUs (default: all that nvidia-smi lists); KM_GPU_IDS: which ones (their indices, separated by
# spaces; default 0 to KM_GPUS - 1), to leave the others to other work. KM_BUDGET: seconds before the processes are
# stopped (default 560, under one 600 s device call; the ops measured alone, below, come out of it first); an
# op cut short is lost, every finished op is kept. With
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
read -r -a IDS <<< "${KM_GPU_IDS:-$(seq -s ' ' 0 $((N - 1)))}"
N=${#IDS[@]}
BUDGET=${KM_BUDGET:-560}
status=0
# Ops that a busy host perturbs are measured first, alone, on GPU 0, and claimed so that no parallel process
# takes them: a version timed on the host or run on the CPU (NumPy baselines), and ops whose eager versions are
# bound by launches (KM_ALONE_EXTRA). Four processes compiling kernels on the same host spread such timings
# several-fold. KM_ALONE=0 switches this off.
FLAGS=() NAMES=()
for a in "$@"; do if [[ $a == -* ]]; then FLAGS+=("$a"); else NAMES+=("$a"); fi; done
ALONE=()
if [ "${KM_ALONE:-1}" != 0 ]; then
  EXTRA=${KM_ALONE_EXTRA:-"capstone_decode launch_overhead"}
  mapfile -t ALONE < <(KM_ALONE_EXTRA=$EXTRA $PY - "${NAMES[@]}" <<'PYEOF'
import os, sys
from snippets.op_index import load_all
registry = load_all()
extra = set(os.environ["KM_ALONE_EXTRA"].split())
for name in sys.argv[1:] or sorted(registry):
    op = registry[name]
    if name in extra or any(i.timer == "host" or i.device == "cpu" for i in op.impls.values()):
        print(name)
PYEOF
  )
fi
if [ ${#ALONE[@]} -gt 0 ]; then
  echo "alone on GPU ${IDS[0]} first: ${ALONE[*]}"
  CUDA_VISIBLE_DEVICES=${IDS[0]} timeout "$BUDGET" $PY -m snippets bench \
    --out "$OUTDIR/results.alone.json" "${FLAGS[@]}" "${ALONE[@]}" > "$OUTDIR/bench.alone.log" 2>&1 \
    || status=1
  for op in "${ALONE[@]}"; do touch "$OUTDIR/claims/$op.claimed"; done
fi
LEFT=$((BUDGET - SECONDS))
pids=()
if [ "$LEFT" -lt 30 ]; then
  echo "no time left for the parallel processes after the ops measured alone"; status=1
elif [ ${#ALONE[@]} -eq 0 ] || [ ${#NAMES[@]} -eq 0 ] || [ ${#NAMES[@]} -gt ${#ALONE[@]} ]; then
  for ((g = 0; g < N; g++)); do
    CUDA_VISIBLE_DEVICES=${IDS[$g]} timeout "$LEFT" $PY -m snippets bench --claim "$OUTDIR/claims" \
      --out "$OUTDIR/results.gpu$g.json" "$@" > "$OUTDIR/bench.gpu$g.log" 2>&1 &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p" || status=1; done
$PY - "$OUTDIR" "$N" <<'PYEOF' || status=1
import json, sys
from pathlib import Path
from snippets.bench.harness import merge
out, n = Path(sys.argv[1]), int(sys.argv[2])
for g in [*range(n), "alone"]:
    part = out / (f"results.gpu{g}.json" if g != "alone" else "results.alone.json")
    if part.exists():
        data = json.loads(part.read_text())
        merge(out / "results.json", data["gpu"], data["ops"], data.get("ceilings", {}))
        print(f"{'GPU ' + str(g) if g != 'alone' else 'GPU 0, alone'}: {', '.join(data['ops'])}")
PYEOF
grep -h "jobs in" "$OUTDIR"/bench.*.log
exit $status

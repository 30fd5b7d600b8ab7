#!/usr/bin/env bash
# The GPU test suite (REQUIRE_GPU=1): one pytest per test file, several at once (the runner has 16 cores; Triton's
# compiles are the slow part and run on the host), each job's log in OUTDIR/tests/, a summary line per job at the
# end, also written to OUTDIR/outputs/gpu_tests.txt with the GPU, the commit and the versions (commit it as
# benchmarks/results/outputs/<gpu>/gpu_tests.txt, with its record gpu_tests.meta.json).
#
#   bash scripts/gpu_tests.sh OUTDIR [test files...]       (default: every tests/test_*.py but KM_CPU_ONLY's)
#   KM_SHARD=2/4 bash scripts/gpu_tests.sh OUTDIR           the second of four shards, one device call each
#
# Jobs: one per file, except that a file named in KM_SPLIT (FILE:N, default "tests/test_ops.py:16
# tests/test_part5_lora.py:3 tests/test_part4_matmul.py:3 tests/test_part5_epilogue.py:3") is N jobs, each the
# k-th share of its tests (KM_SPLIT_PART=k/N, tests/conftest.py; a version's cases stay in one job). Split jobs
# start first, then the files in KM_SLOW (minutes each on an H100), then the rest. KM_SHARD=i/n keeps every n-th
# job starting at the i-th (the longest first), so n calls run the whole suite; merge their summaries with
#   python -m snippets.bench.captures merge-tests OUT1/outputs/gpu_tests.txt ... -o FILE.
# Files in KM_ALONE (default tests/test_part2_memory.py: it reads the device's free memory, which other processes
# move) run one at a time after the others, in the shard their job falls in.
#
# pyproject.toml's addopts (the docs plugin) are switched off: the GPU image has no pytest-markdown-docs. Tests
# marked cpu_only (transcriptions and models of kernels on the CPU, in files that also have GPU tests) are left
# to the CPU suite, like the files of KM_CPU_ONLY below; each job's log lists its 25 slowest tests.
# KM_TEST_GPUS (default: every GPU nvidia-smi lists): jobs go round-robin to the GPUs, one each (Part 7's files see
# all of them). KM_JOBS: jobs at once (default 16); KM_FILE_TIMEOUT: seconds per job (default 500); KM_BUDGET: seconds for the
# whole run (default 560, under one 600 s device call): a job that starts late gets what is left, so the summary
# is always written. Liger-Kernel (a baseline the tests compare against) is installed from .whl/ when a wheel is
# there (the runner has no network), and the nvidia-cutlass wheel that hopper_gemm v8 unpacks is taken from .whl/
# too (or from build/, where cute_gemm looks first): without it v8's GPU tests fail. Exit status 1 if any job failed or timed out.
set -uo pipefail
OUTDIR=${1:-gpu-out}
shift || true
mkdir -p "$OUTDIR/tests" "$OUTDIR/outputs"
: > "$OUTDIR/tests/rc.txt"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 REQUIRE_GPU=1
PY=${PYTHON:-python3}
START=$(date +%s)
DEADLINE=$((START + ${KM_BUDGET:-560}))
# hopper_gemm v8 (CuTe's C++) needs the nvidia-cutlass wheel's headers: from build/ (carried), or from .whl/ here
CUTLASS_WHL=$(ls .whl/nvidia_cutlass-*.whl 2> /dev/null | head -1)
[ -z "${KM_CUTLASS_WHEEL:-}" ] && [ -n "$CUTLASS_WHL" ] && export KM_CUTLASS_WHEEL=$PWD/$CUTLASS_WHL
if ls .whl/liger_kernel-*.whl > /dev/null 2>&1 && ! $PY -c "import liger_kernel" 2> /dev/null; then
  $PY -m pip install -q --no-deps --no-index --target /tmp/km-wheels .whl/liger_kernel-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/km-wheels
fi

# Files with no GPU code path: Part 7's gloo ranks on the CPU, the mutation campaign (the interpreter, GPUs
# hidden), and checks of text, records and the site. On the GPU runner they would do exactly what the CPU suite
# does (CI on every push, and the weekly run at the oldest and newest supported versions), for a large share of the
# suite's CPU time, so the whole-suite run leaves them out and its summary names them; a file named on the command
# line runs. tests/test_gpu_suite.py checks that none of them uses the GPU (KM_CPU_ONLY="" runs everything).
CPU_ONLY=" ${KM_CPU_ONLY-tests/test_part7_pipeline.py tests/test_part7_tensor_parallel.py tests/test_part7_zero.py
tests/test_part7_context_expert.py tests/test_part7_fsdp.py tests/test_part7_ddp.py tests/test_part7_transformer_dp.py
tests/test_part7_calculator.py tests/test_mutate.py tests/test_gpu_suite.py tests/test_listing_width.py
tests/test_contract.py tests/test_browser.py tests/test_readme.py tests/test_workflows.py tests/test_diagrams.py
tests/test_no_measured_figures.py tests/test_ncu_counters.py tests/test_captures.py tests/test_hashing.py
tests/test_site_render.py tests/test_site_assets.py tests/test_plots.py tests/test_timeline.py
tests/test_nsys_capture.py} "
CPU_ONLY=$(tr '\n' ' ' <<< "$CPU_ONLY")
FILES=("$@") LEFT_OUT=()
if [ ${#FILES[@]} -eq 0 ]; then
  for f in tests/test_*.py; do
    if [[ $CPU_ONLY == *" $f "* ]]; then LEFT_OUT+=("$f"); else FILES+=("$f"); fi
  done
fi
SPLIT=" ${KM_SPLIT-tests/test_ops.py:16 tests/test_part5_lora.py:3 tests/test_part4_matmul.py:3 tests/test_part5_epilogue.py:3} "
# Files that took minutes on an H100 (after the split ones; Part 7's spawn process groups): started next, so none
# starts last and runs alone
SLOW=" ${KM_SLOW-tests/test_part5_epilogue.py tests/test_part3_profiling.py tests/test_part5_flash_attention.py
tests/test_cuda_compile.py tests/test_gradients.py tests/test_export.py tests/test_part6_hopper_attention.py
tests/test_exercises.py} "
SLOW=$(tr '\n' ' ' <<< "$SLOW")
ALONE=" ${KM_ALONE-tests/test_part2_memory.py} "
# Jobs as FILE or FILE@k/N, split files first (they are the longest), the files that run alone last.
JOBS=()
for f in "${FILES[@]}"; do
  n=$(sed -n "s|.* $f:\([0-9][0-9]*\) .*|\1|p" <<< "$SPLIT")
  if [ -n "$n" ] && [ "$n" -gt 1 ]; then
    for ((k = 1; k <= n; k++)); do JOBS+=("$f@$k/$n"); done
  fi
done
for f in "${FILES[@]}"; do
  [[ $SLOW == *" $f "* && $SPLIT != *" $f:"* && $ALONE != *" $f "* ]] && JOBS+=("$f")
done
for f in "${FILES[@]}"; do
  [[ $SPLIT == *" $f:"* || $SLOW == *" $f "* || $ALONE == *" $f "* ]] || JOBS+=("$f")
done
for f in "${FILES[@]}"; do
  [[ $ALONE == *" $f "* ]] && JOBS+=("$f")
done
SHARD=${KM_SHARD:-1/1}
if ! [[ $SHARD =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] \
    || [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
  echo "gpu_tests.sh: KM_SHARD must be i/n with 1 <= i <= n, got $SHARD" >&2
  exit 2
fi
I=${BASH_REMATCH[1]} N=${BASH_REMATCH[2]}
PARALLEL=() SERIAL=()
for ((j = 0; j < ${#JOBS[@]}; j++)); do
  [ $((j % N + 1)) -eq "$I" ] || continue
  job=${JOBS[j]}
  if [[ $ALONE == *" ${job%@*} "* ]]; then SERIAL+=("$job"); else PARALLEL+=("$job"); fi
done

# One job: pytest on its file (its share of it), under the smaller of its timeout and the time left.
run_job() {
  local job=$1 f=${1%@*} part="" b left t
  [[ $job == *@* ]] && part=${job#*@}
  b=$(basename "$f" .py)${part:+.${part/\//of}}
  left=$((DEADLINE - $(date +%s)))
  t=$((left < ${KM_FILE_TIMEOUT:-500} ? left : ${KM_FILE_TIMEOUT:-500}))
  if [ "$t" -le 0 ]; then
    echo "not started: no time left in KM_BUDGET" > "$OUTDIR/tests/$b.log"
    echo "$b rc 124" >> "$OUTDIR/tests/rc.txt"
    return
  fi
  # several GPUs: job k on GPU k mod KM_TEST_GPUS, except Part 7's files (their multi-GPU tests need all of them)
  local env=()
  [ "${KM_TEST_GPUS:-1}" -gt 1 ] && [[ $f != tests/test_part7_* ]] \
    && env=("CUDA_VISIBLE_DEVICES=$(($2 % KM_TEST_GPUS))")
  env "${env[@]}" KM_SPLIT_PART=$part timeout "$t" $PY -m pytest "$f" -q -p no:cacheprovider -o addopts= --tb=short -rfE \
    -m "not cpu_only" --durations=25 > "$OUTDIR/tests/$b.log" 2>&1
  local rc=$?
  # no test ran: a share with none (fewer groups than shares), or a file whose every test is marked cpu_only
  [ $rc = 5 ] && { [ -n "$part" ] || grep -q "deselected" "$OUTDIR/tests/$b.log"; } && rc=0
  echo "$b rc $rc" >> "$OUTDIR/tests/rc.txt"
}
export -f run_job
KM_TEST_GPUS=${KM_TEST_GPUS:-$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || echo 1)}
[ "$KM_TEST_GPUS" -ge 1 ] 2> /dev/null || KM_TEST_GPUS=1
# The host's cores shared out among the jobs at once (KM_THREADS to override): torch's CPU work (references,
# transcriptions) would otherwise start a thread per core in every job, and 16 jobs on 16 or 32 cores run their
# CPU tests several times slower than one job alone.
THREADS=${KM_THREADS:-$(($(nproc) / ${KM_JOBS:-16}))}
[ "$THREADS" -ge 1 ] 2> /dev/null || THREADS=1
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export OUTDIR DEADLINE PY KM_FILE_TIMEOUT KM_TEST_GPUS
if [ ${#PARALLEL[@]} -gt 0 ]; then
  for ((j = 0; j < ${#PARALLEL[@]}; j++)); do echo "${PARALLEL[j]} $j"; done \
    | xargs -P "${KM_JOBS:-16}" -L1 bash -c 'run_job "$1" "$2"' _
fi
for job in "${SERIAL[@]}"; do run_job "$job" 0; done

# The summary: one line per job, with the GPU, the commit and the versions first.
SUMMARY=$OUTDIR/outputs/gpu_tests.txt
COMMIT=${KM_COMMIT:-$(git rev-parse HEAD 2> /dev/null || echo unknown)}
DIRTY=${KM_DIRTY:-$([ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ] && echo 1 || echo 0)}
{
  echo "GPU tests (bash scripts/gpu_tests.sh, REQUIRE_GPU=1), shard $I/$N of ${#JOBS[@]} jobs; commit $COMMIT" \
    "$([ "$DIRTY" = 1 ] && echo "(uncommitted changes)")"
  $PY -c "import torch, triton; print(f'{torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\"}; '
f'torch {torch.__version__}, triton {triton.__version__}')" 2>&1 | tail -1
  echo "started $(date -u -d "@$START" +%Y-%m-%dT%H:%M:%SZ 2> /dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)," \
    "$(($(date +%s) - START)) s"
  [ ${#LEFT_OUT[@]} -eq 0 ] \
    || echo "left to the CPU suite (no GPU code path), ${#LEFT_OUT[@]} files: $(basename -a -s .py "${LEFT_OUT[@]}" | tr '\n' ' ')"
  echo "left to the CPU suite too: the tests marked cpu_only (pytest -m \"not cpu_only\")"
} > "$SUMMARY"
status=0 failed=()
for job in "${PARALLEL[@]}" "${SERIAL[@]}"; do
  f=${job%@*} part=""
  [[ $job == *@* ]] && part=${job#*@}
  b=$(basename "$f" .py)${part:+.${part/\//of}}
  summary=$(grep -E "^[0-9]+ (passed|failed|skipped|deselected)|^=+ .*(passed|failed|error|skipped)" \
    "$OUTDIR/tests/$b.log" 2> /dev/null | tail -1)
  [ -n "$summary" ] || summary="no summary (timed out or crashed)"
  label=$(basename "$f" .py)${part:+[$part]}
  echo "$label: $summary" >> "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUTDIR/tests/$b.log" 2> /dev/null | head -5 | sed 's/^/    /' >> "$SUMMARY"
  if ! grep -q "^$b rc 0$" "$OUTDIR/tests/rc.txt"; then
    status=1
    failed+=("$label")
  fi
done
if [ $status = 0 ]; then
  echo "result: passed (${#PARALLEL[@]} + ${#SERIAL[@]} jobs)" >> "$SUMMARY"
else
  echo "result: FAILED: ${failed[*]}" >> "$SUMMARY"
fi
cat "$SUMMARY"
$PY -m snippets.bench.captures record "$SUMMARY" || status=1
exit $status

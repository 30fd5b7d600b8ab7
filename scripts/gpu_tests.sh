#!/usr/bin/env bash
# The GPU test suite, one pytest per test file, several at once (the runner has 16 cores; Triton's compiles are
# the slow part and run on the host), each file's log in OUTDIR/tests/, a summary line per file at the end.
#
#   bash scripts/gpu_tests.sh OUTDIR [test files...]       (default: every tests/test_*.py)
#
# pyproject.toml's addopts (the docs plugin) are switched off: the GPU image has no pytest-markdown-docs.
# KM_JOBS: files at once (default 16); KM_FILE_TIMEOUT: seconds per file (default 500). Exit status 1 if any
# file failed or timed out.
set -uo pipefail
OUTDIR=${1:-gpu-out}
shift || true
mkdir -p "$OUTDIR/tests"
: > "$OUTDIR/tests/rc.txt"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 REQUIRE_GPU=1
PY=${PYTHON:-python3}
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(tests/test_*.py)
printf '%s\n' "${FILES[@]}" | xargs -P "${KM_JOBS:-16}" -I{} sh -c '
  f={}; b=$(basename "$f" .py)
  timeout '"${KM_FILE_TIMEOUT:-500}"' '"$PY"' -m pytest "$f" -q -p no:cacheprovider -o addopts= --tb=short -rfE --durations=5 \
    > "'"$OUTDIR"'/tests/$b.log" 2>&1
  echo "$b rc $?" >> "'"$OUTDIR"'/tests/rc.txt"'
status=0
for f in "$OUTDIR"/tests/test_*.log; do
  b=$(basename "$f" .log)
  summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$f" | tail -1)
  [ -n "$summary" ] || summary="no summary (timed out or crashed)"
  echo "$b: $summary"
  grep -E "^(FAILED|ERROR)" "$f" | head -5
  grep -q "^$b rc 0$" "$OUTDIR/tests/rc.txt" || status=1
done
exit $status

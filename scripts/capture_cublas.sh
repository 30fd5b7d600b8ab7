#!/usr/bin/env bash
# The SGEMM chapter's cuBLAS baseline from C, without PyTorch: builds csrc/standalone/cublas_sgemm.cu with nvcc
# and runs it on the GPU runner at 4096^3 and 8192^3 (the chapter's goal sizes), into OUTDIR/cublas_sgemm.txt
# with its record (commit it as benchmarks/results/outputs/<gpu>/cublas_sgemm.txt;
# `<!-- bench:output cublas_sgemm -->` renders it).
#
#   bash scripts/capture_cublas.sh OUTDIR
#
# cuBLAS comes from the toolkit when it has it (CUDA_HOME, /usr/local/cuda), else from the NVIDIA wheel that
# torch installed (site-packages/nvidia/cu13 or nvidia/cublas), which then also goes on LD_LIBRARY_PATH.
set -uo pipefail
OUTDIR=${1:?usage: capture_cublas.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v nvcc > /dev/null || { echo "capture_cublas: nvcc is not on PATH" >&2; exit 1; }

# the folder that holds include/cublas_v2.h and lib*/libcublas.so*
root=""
for r in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc)")")" \
         $("$PY" -c 'import nvidia, pathlib; print(*[p for b in nvidia.__path__ for p in pathlib.Path(b).iterdir()])' \
           2> /dev/null); do
  [ -n "$r" ] && [ -f "$r/include/cublas_v2.h" ] && { root=$r; break; }
done
[ -n "$root" ] || { echo "capture_cublas: no cublas_v2.h found (toolkit or pip nvidia wheel)" >&2; exit 1; }
lib=$(ls "$root"/lib64/libcublas.so* "$root"/lib/libcublas.so* 2> /dev/null | head -n 1)
[ -n "$lib" ] || { echo "capture_cublas: no libcublas.so under $root" >&2; exit 1; }
export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

out="$OUTDIR/cublas_sgemm.txt"
build=(nvcc -std=c++17 -O2 -arch=native -I csrc/common -I "$root/include" -o "$TMP/cublas_sgemm"
       csrc/standalone/cublas_sgemm.cu -L "$(dirname "$lib")" "-l:$(basename "$lib")")
status=0
{
  echo "\$ nvcc -std=c++17 -O2 -arch=native -I csrc/common -o cublas_sgemm" \
       "csrc/standalone/cublas_sgemm.cu -lcublas"
  if "${build[@]}" 2>&1; then
    for n in 4096 8192; do
      echo
      echo "\$ ./cublas_sgemm $n"
      "$TMP/cublas_sgemm" "$n" 2>&1 || { echo "(exit status $?)"; status=1; }
    done
  else
    echo "(build failed)"
    status=1
  fi
} > "$out"
if [ $status -eq 0 ]; then "$PY" -m snippets.bench.captures record "$out" || status=1; fi
exit $status

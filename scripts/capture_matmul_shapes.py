"""Time every ``matmul`` version in bf16 at the odd shapes of the matmul chapter
(``snippets.part4.matmul.odd_shapes``: one token and a small batch against a big weight, sizes one
off a power of two) with the harness's timer, and write a text table (GPU only).

    python scripts/capture_matmul_shapes.py OUTDIR

writes OUTDIR/matmul_shapes.txt; commit it as
``benchmarks/results/outputs/<gpu>/matmul_shapes.txt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402

from snippets.bench.captures import record  # noqa: E402
from snippets.bench.timing import rotation, time_device  # noqa: E402
from snippets.common.gemm import gemm_flops, make_operands  # noqa: E402
from snippets.part4.matmul import matmul, odd_shapes  # noqa: E402


def capture_shapes(outdir: Path) -> Path:
    """Time every matmul version in bf16 at odd_shapes() with the harness's timer and write a text
    table to OUTDIR/matmul_shapes.txt."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    lines = [(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"triton {triton.__version__}, bf16"),
             f"{'M x N x K':>20} {'version':>8} {'ms':>9} {'TFLOP/s':>9} {'% of v0':>8}"]
    gen = torch.Generator().manual_seed(0)
    for size in odd_shapes():
        sets, flush = rotation(matmul.bytes_moved(size, torch.bfloat16), l2)
        arg_sets = [make_operands(size, torch.bfloat16, "cuda", gen) for _ in range(sets)]
        flush_buf = torch.empty(2 * l2 // 4, device="cuda") if flush else None
        label = f"{size['m']} x {size['n']} x {size['k']}"
        base = None
        for name, impl in matmul.impls.items():
            try:
                impl.fn(*arg_sets[0])
            except ValueError as e:
                lines.append(f"{label:>20} {name:>8}   refused: {e}")
                continue
            t = time_device(impl.fn, arg_sets, flush=flush_buf)
            rate = gemm_flops(size, torch.bfloat16) / (t.median * 1e-3) / 1e12
            base = base or rate
            lines.append(f"{label:>20} {name:>8} {t.median:9.4f} {rate:9.1f} "
                         f"{100 * rate / base:7.1f}%")
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "matmul_shapes.txt"
    path.write_text("\n".join(lines) + "\n")
    record(path)  # matmul_shapes.meta.json: the hash of the code that produced it
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/capture_matmul_shapes.py OUTDIR")
    print(capture_shapes(Path(sys.argv[1])).read_text())

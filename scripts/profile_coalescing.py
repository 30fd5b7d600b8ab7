"""Run ``strided_copy`` v1 once at every benchmark point of the coalescing chapter (both sweeps:
strides and offsets), for a profiler (GPU only):

    ncu --clock-control none --kernel-name strided_copy_v1 --metrics ... \\
        python scripts/profile_coalescing.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from snippets.part2.coalescing import (  # noqa: E402
    make_strided_input,
    offset_copy,
    strided_copy,
    strided_copy_cuda,
)

# --8<-- [start:profile]
# python scripts/profile_coalescing.py: each benchmark point once, for a profiler
if __name__ == "__main__":
    gen = torch.Generator().manual_seed(0)
    for size in [*strided_copy.sweep, *offset_copy.sweep]:
        x = make_strided_input(size["n"], size["stride"], size["offset"], gen, "cuda")
        # v1: one 4-byte load per thread
        strided_copy_cuda(x, size["n"], size["stride"], size["offset"])
        del x
    torch.cuda.synchronize()
# --8<-- [end:profile]

"""SGEMM v15: v12's template with unchecked loads on the tiles that need no check
(``csrc/sgemm/v15_interior.cu``: v12's template copied, with the unchecked loads added).

A version of Part 3's ``sgemm`` op, registered from its own module.

- v15 CUDA, v12's loop, tiles, grouped order and autotuning over the same configurations. A block
      whose tile lies inside C, with 16-byte aligned rows of A and B, loads every whole K-step with
      plain float4 loads from one pointer per operand, planned once and stepped by a constant: no
      bounds check, no branch, no scalar fallback. Edge blocks, a ragged last step and unaligned
      rows keep v12's checked loads. In a loop that is nearly all FFMAs, every other instruction
      takes an issue slot an FFMA does not get.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.gemm import check_operands
from snippets.part3.sgemm import GRID_Y_MAX, TUNED, sgemm
from snippets.registry import Impl

V15_FILE = "sgemm/v15_interior.cu"

# --8<-- [start:configs]
# v12's configurations (TUNED, as (bm, bn, bk, wm, wn, threads, group, pad)), one kernel each
V15_OPTIONS = cuda.defines(
    V15_FILE, SGEMM_INTERIOR_CONFIGS="".join(f"SGEMM_INTERIOR({','.join(map(str, c))})"
                                             for c in TUNED))


def kernel_name(bm: int, bn: int, bk: int, wm: int, wn: int, threads: int, group: int,
                pad: int) -> str:
    """The kernel v15_interior.cu instantiates for one configuration."""
    return f"sgemm_i_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{threads}_g{group}_p{pad}"
# --8<-- [end:configs]


# --8<-- [start:launch]
def launch_interior(a: torch.Tensor, b: torch.Tensor, config: tuple,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B by v15's kernel at one configuration of TUNED: one block per tile of C."""
    m, n, k = check_operands(a, b)
    cuda.require_gpu()
    if config not in TUNED:
        raise ValueError(f"launch_interior: {config} is not one of v12's configurations (TUNED)")
    bm, bn, threads = config[0], config[1], config[5]
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    if grid[1] > GRID_Y_MAX:
        raise ValueError(f"{kernel_name(*config)}: {grid[1]} tiles along gridDim.y exceed CUDA's "
                         f"limit of {GRID_Y_MAX} (a is {m} x {k}, b is {k} x {n})")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
    with torch.cuda.device(a.device):
        fn = cuda.kernel(V15_FILE, kernel_name(*config), V15_OPTIONS)
        cuda.launch(fn, grid, threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k)))
    return c
# --8<-- [end:launch]


_TUNED: dict[tuple, tuple] = {}  # (device, M, N, K) -> the fastest configuration measured


def autotune_interior(a: torch.Tensor, b: torch.Tensor, reps: int = 5) -> tuple:
    """The fastest of TUNED for this shape, timed with CUDA events on these operands the first
    time the shape is seen (one untimed call each, then the median of ``reps``), as v12."""
    m, n, k = check_operands(a, b)
    key = (a.device.index, m, n, k)
    if key not in _TUNED:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        times = []
        for config in TUNED:
            launch_interior(a, b, config, out)
            samples = []
            for _ in range(reps):
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
                start.record()
                launch_interior(a, b, config, out)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times.append(sorted(samples)[reps // 2])
        _TUNED[key] = TUNED[times.index(min(times))]
    return _TUNED[key]


def sgemm_interior(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v15: v12 with unchecked float4 loads on whole tiles of interior blocks (16-byte aligned
    rows), at the fastest of v12's configurations for this shape. Any M, N, K >= 1."""
    refuse_grad("sgemm_interior", a, b, instead="a @ b")
    check_operands(a, b)
    cuda.require_gpu()
    return launch_interior(a, b, autotune_interior(a, b))


sgemm.add(Impl("v15", sgemm_interior, "CUDA",
               "v12 with unchecked float4 loads on interior tiles, autotuned",
               (*cuda.source_files(V15_FILE), kernel_name, launch_interior, autotune_interior,
                check_operands)))

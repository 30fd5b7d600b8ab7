"""Scan v10: v8's kernel with five blocks an SM and streaming hints (``csrc/scan/scan_v10.cu``).

A version of Part 3's ``scan`` op, registered from its own module.

- v10 CUDA, v8's tile and code (256 threads x 32 elements, 16-byte vectors, the tile's sum
      published early, a warp-wide look-back), launched with ``__launch_bounds__(256, 5)``: the
      register cap that lets five blocks share an SM, so that other tiles' loads and stores run
      while a block's warps wait at the barrier for its look-back. The full tiles' loads and stores
      carry the evict-first hint (``__ldcs`` / ``__stcs``): each element is touched once. Within a
      tile the additions are v8's; the carry, as in v8, groups its predecessors' sums by timing, so
      fp32 results may differ from run to run in the last bits (int32 results are exact).
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.part3.scan import SINGLE, SUFFIX, check_scan_input, scan
from snippets.registry import Impl

V10_FILE = "scan/scan_v10.cu"
V10_THREADS = 256   # v8's tile: 256 threads ...
V10_ITEMS = 32      # ... of 32 elements, eight 16-byte vectors each
V10_BLOCKS = 5      # blocks an SM the register cap makes room for
V10_TILE = V10_THREADS * V10_ITEMS
V10_OPTIONS = cuda.defines(V10_FILE, V10_THREADS=V10_THREADS, V10_ITEMS=V10_ITEMS,
                           V10_BLOCKS=V10_BLOCKS)


# --8<-- [start:launch]
def launch_tiles(name: str, x: torch.Tensor, file: str, options: tuple[str, ...], threads: int,
                 tile: int) -> torch.Tensor:
    """One block of ``threads`` per ``tile`` elements of x, each taking its tile number from the
    counter in state[0]: the kernel ``<name>_f32`` or ``<name>_i32`` of ``csrc/<file>``, compiled
    with ``options`` (v10 and v11)."""
    refuse_grad(name, x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")  # the op's rule (scan.py): 1-D only
    n = x.numel()
    out = torch.empty_like(x)
    tiles = triton.cdiv(n, tile)
    # [0]: tile counter; then one word per tile, as in v5 to v9
    state = torch.zeros(tiles + 1, dtype=torch.int64, device=x.device)
    with torch.cuda.device(x.device):
        fn = cuda.kernel(file, f"{name}_{SUFFIX[x.dtype]}", options)
        cuda.launch(fn, tiles, threads, (x, out, state, np.int64(n)))
    return out


def scan_lookback_v10(x: torch.Tensor) -> torch.Tensor:
    """v10: v8's kernel at five blocks an SM, with evict-first loads and stores; one block per
    V10_TILE elements."""
    return launch_tiles("scan_lookback_v10", x, V10_FILE, V10_OPTIONS, V10_THREADS, V10_TILE)
# --8<-- [end:launch]


scan.add(Impl("v10", scan_lookback_v10, "CUDA",
              "v8 at five blocks an SM, evict-first loads and stores",
              (*cuda.source_files(V10_FILE), *SINGLE[1:])))

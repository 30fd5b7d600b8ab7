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

import torch

from snippets import cuda
from snippets.part3.scan import SINGLE, launch_lookback, scan
from snippets.registry import Impl

V10_FILE = "scan/scan_v10.cu"
V10_THREADS = 256   # v8's tile: 256 threads ...
V10_ITEMS = 32      # ... of 32 elements, eight 16-byte vectors each
V10_BLOCKS = 5      # blocks an SM the register cap makes room for
V10_TILE = V10_THREADS * V10_ITEMS
V10_OPTIONS = cuda.defines(V10_FILE, V10_THREADS=V10_THREADS, V10_ITEMS=V10_ITEMS,
                           V10_BLOCKS=V10_BLOCKS)


# --8<-- [start:launch]
def scan_lookback_v10(x: torch.Tensor) -> torch.Tensor:
    """v10: v8's kernel at five blocks an SM, with evict-first loads and stores; one block per
    V10_TILE elements."""
    return launch_lookback("scan_lookback_v10", x, V10_THREADS, V10_TILE, V10_FILE, V10_OPTIONS)
# --8<-- [end:launch]


scan.add(Impl("v10", scan_lookback_v10, "CUDA",
              "v8 at five blocks an SM, evict-first loads and stores",
              (*cuda.source_files(V10_FILE), *SINGLE[1:])))

"""Scan v11: scanned in the order the lanes load it, in larger tiles (``csrc/scan/scan_v11.cu``).

A version of Part 3's ``scan`` op, registered from its own module.

- v11 CUDA, v10's single pass (16-byte evict-first vectors, the tile's sum published after one
      barrier, a warp-wide look-back by warp 0) without v10's transposes through shared memory:
      each warp scans its 16-byte rows where they land (four elements a lane, then the 32 lanes
      with shuffles, then the rows in order). The tile, no longer in shared memory, is three of
      v10's: 256 threads x 96 elements, two blocks an SM (``__launch_bounds__(256, 2)``), so a
      third as many tiles look back. fp32 sums come in another order than v10's and, as in v5 to
      v10, the carry groups the predecessors' sums by timing: the last bits can differ from run to
      run (int32 results are exact).
"""

from __future__ import annotations

import torch

from snippets import cuda
from snippets.part3.scan import SINGLE, launch_lookback, scan
from snippets.registry import Impl

V11_FILE = "scan/scan_v11.cu"
V11_THREADS = 256   # warps of 32 lanes ...
V11_ITEMS = 96      # ... of 24 16-byte rows each: 24576 elements a tile
V11_BLOCKS = 2      # blocks an SM: the register cap, 128 a thread
V11_TILE = V11_THREADS * V11_ITEMS
V11_OPTIONS = cuda.defines(V11_FILE, V11_THREADS=V11_THREADS, V11_ITEMS=V11_ITEMS,
                           V11_BLOCKS=V11_BLOCKS)


# --8<-- [start:launch]
def scan_lookback_v11(x: torch.Tensor) -> torch.Tensor:
    """v11: one block per V11_TILE elements, each taking its tile number from the counter in
    state[0] and scanning its rows where they were loaded."""
    return launch_lookback("scan_lookback_v11", x, V11_THREADS, V11_TILE, V11_FILE, V11_OPTIONS)
# --8<-- [end:launch]


scan.add(Impl("v11", scan_lookback_v11, "CUDA",
              "v10's pass scanned where the lanes load it, 256 x 96 tiles",
              (*cuda.source_files(V11_FILE), *SINGLE[1:])))

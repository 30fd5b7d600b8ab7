"""Scan v9: v8's tile in a persistent grid that prefetches its next tile (``csrc/scan/scan_v9.cu``).

A version of Part 3's ``scan`` op, registered from its own module so that v0 to v8's measured
results keep their source hashes (those cover ``snippets/part3/scan.py`` and the files of
``csrc/part3/``; this module and its kernel file are in v9's hash alone).

- v9  CUDA, v8's 8192-element tile (256 threads x 32 elements, 16-byte vectors), but only as many
      blocks as fit on the GPU at once, each taking tile after tile from the counter and issuing
      the loads of its next tile before it looks back and stores the current one: while a block
      waits on its predecessors' sums, its next tile is already on its way.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.part3.scan import SINGLE, SUFFIX, check_scan_input, scan
from snippets.registry import Impl

V9_FILE = "scan/scan_v9.cu"
V9_THREADS = 256    # v8's tile: 256 threads ...
V9_ITEMS = 32       # ... of 32 elements, eight 16-byte vectors each
V9_TILE = V9_THREADS * V9_ITEMS
V9_OPTIONS = cuda.defines(V9_FILE, V9_THREADS=V9_THREADS, V9_ITEMS=V9_ITEMS)


# --8<-- [start:v9_launch]
def persistent_blocks(tiles: int, sms: int, per_sm: int) -> int:
    """v9's grid: every block resident at once (``per_sm`` on each of ``sms`` SMs), never more
    blocks than tiles. A block that started after another finished would be harmless (tiles are
    claimed in order), but a grid that fits keeps every block busy from start to end."""
    if tiles < 1 or sms < 1 or per_sm < 1:
        raise ValueError(f"persistent_blocks: tiles, sms and per_sm must be >= 1, got {tiles}, "
                         f"{sms}, {per_sm}")
    return min(tiles, sms * per_sm)


def scan_lookback_v9(x: torch.Tensor) -> torch.Tensor:
    """v9: v8's kernel made persistent, each block prefetching its next tile into registers
    before the look-back of the current one."""
    refuse_grad("scan_lookback_v9", x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")  # the op's rule (scan.py): 1-D only
    n = x.numel()
    out = torch.empty_like(x)
    tiles = triton.cdiv(n, V9_TILE)
    # [0]: tile counter; then one word per tile, as in v5 to v8
    state = torch.zeros(tiles + 1, dtype=torch.int64, device=x.device)
    with torch.cuda.device(x.device):
        fn = cuda.kernel(V9_FILE, f"scan_lookback_v9_{SUFFIX[x.dtype]}", V9_OPTIONS)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = persistent_blocks(tiles, sms, cuda.resident_blocks(fn, V9_THREADS))
        cuda.launch(fn, grid, V9_THREADS, (x, out, state, np.int64(n)))
    return out
# --8<-- [end:v9_launch]


scan.add(Impl("v9", scan_lookback_v9, "CUDA",
              "v8's tile, persistent: each block prefetches its next tile before looking back",
              (cuda.source_path(V9_FILE), *SINGLE)))

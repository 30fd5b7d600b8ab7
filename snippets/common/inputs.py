"""Input patterns that more than one op draws its inputs from."""

from __future__ import annotations

import torch

BLOCK = 1 << 20  # values per block of block_pattern: 4 MiB of fp32


def block_pattern(n: int, gen: torch.Generator) -> torch.Tensor:
    """n fp32 values, cheap to make at any size: random blocks of 2**20 values, block b shifted by
    b, so that no two blocks are equal and a misplaced block would show (a host-to-device copy that
    moves the wrong chunk). Part 2's host transfers and Part 3's stream pipeline draw from it."""
    block = min(n, BLOCK)
    rows = -(-n // block)
    x = (torch.rand(block, generator=gen).expand(rows, block)
         + torch.arange(rows, dtype=torch.float32)[:, None])
    return x.reshape(-1)[:n].clone()

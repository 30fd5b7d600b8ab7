"""What the row kernels share: launch configurations per row length, input checks and the compute
dtype of LayerNorm (Part 4) and RMSNorm (Part 5), the chunk shape of Part 4's online softmax that
Part 5's cross-entropy reuses, and the sizes the two norms are measured at.

A row kernel holds a whole row (or a chunk of one) in registers; every sum is in fp32 (fp64 for
fp64 inputs, which only the gradient checks use), whatever the storage dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from snippets._checks import check_tensors

# The whole row lives in registers (LayerNorm and RMSNorm). 65536 fp32 over 16 warps is 128
# registers per thread, about what a thread can hold with its other values; a longer row would spill
# and needs a loop over the row (an exercise of the LayerNorm chapter).
MAX_N = 65536


# --8<-- [start:configs]
@dataclass(frozen=True)
class RowConfig:
    """Launch parameters for one row length (BLOCK_N, the row rounded up to a power of two).

    rows: rows per forward program. Short rows are packed several to a program so that each thread
        still holds two 16-byte vectors of x and each program moves enough bytes to be worth its
        launch slot.
    fwd_warps: warps per forward program: 16 elements (two 16-byte bf16 vectors) per thread at 4096
        and below, so a program's loads are all issued before its first reduction waits on them.
    bwd_warps: warps per backward program, which holds x, dy, w and the dw, db sums: five row-long
        fp32 values per element.
    groups_per_sm: backward programs per SM. Each writes 2*N fp32 partial sums, so more groups mean
        more partial traffic but more rows in flight to hide the latency of each row's two
        reductions.
    """

    rows: int
    fwd_warps: int
    bwd_warps: int
    groups_per_sm: int


def config_for(n: int, configs: dict[int, RowConfig]) -> tuple[int, RowConfig]:
    """(BLOCK_N, RowConfig) for rows of length ``n``, from ``configs`` (a table BLOCK_N -> RowConfig
    from 1024 up: LayerNorm's, RMSNorm's); shorter rows use the 1024 entry with more rows
    per program."""
    block_n = triton.next_power_of_2(n)
    if block_n < 1024:  # keep about 4096 elements per program: 4 rows of 1024, 64 rows of 64, ...
        base = configs[1024]
        return block_n, RowConfig(rows=base.rows * 1024 // block_n, fwd_warps=base.fwd_warps,
                                  bwd_warps=max(1, block_n // 256),
                                  groups_per_sm=base.groups_per_sm)
    return block_n, configs[block_n]
# --8<-- [end:configs]


# --8<-- [start:checks]
def check_rows(x, params: dict[str, torch.Tensor], dtypes, device: str) -> tuple[int, int]:
    """x (..., N) and per-column parameters of shape (N,) (``{"w": w, "b": b}``), one dtype and
    device, contiguous, 1 <= N <= MAX_N; returns (M, N), with the leading dimensions of x flattened
    into M rows (M may be 0: an empty batch gives an empty output). LayerNorm's and RMSNorm's
    checks."""
    check_tensors(("x", *params), (x, *params.values()), dtypes=dtypes, device=device,
                  same_shape=False)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the normalised one), got shape "
                         f"{tuple(x.shape)}")
    n = x.shape[-1]
    for name, t in params.items():
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), the last dimension of x "
                             f"{tuple(x.shape)}; got {tuple(t.shape)}")
    if n == 0:
        raise ValueError(f"x has rows of length 0 (shape {tuple(x.shape)}): there is nothing to "
                         "normalise")
    if n > MAX_N:
        raise ValueError(f"rows of length {n} do not fit in registers: at most {MAX_N} elements")
    return x.numel() // n, n


def compute_dtype(dtype: torch.dtype):
    """fp32 for every storage type; fp64 stays fp64 (for torch.autograd.gradcheck)."""
    return tl.float64 if dtype == torch.float64 else tl.float32
# --8<-- [end:checks]


# --8<-- [start:groups]
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU (4 under the interpreter, so that tests see
    several groups)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def backward_groups(m: int, n: int, device: torch.device, configs: dict[int, RowConfig]) -> int:
    """How many groups of rows a norm's backward splits M rows into: enough programs to keep every
    SM busy (groups_per_sm of them per SM, from ``configs``), never more than there are rows."""
    _, cfg = config_for(n, configs)
    return max(1, min(m, sm_count(device) * cfg.groups_per_sm))
# --8<-- [end:groups]


# --8<-- [start:online]
# Chunk width and warps of Part 4's online softmax (v4), which Part 5's cross-entropy streams its
# rows with too: 4096 columns over 8 warps is 16 values per thread per chunk (four 16-byte fp32
# loads in flight per thread), and three 16-value arrays (x, running max, running sum) stay in
# registers, so several programs fit on an SM and take turns keeping the memory system busy.
ONLINE_BLOCK_N = 4096
ONLINE_NUM_WARPS = 8
# --8<-- [end:online]


# The sizes LayerNorm and RMSNorm are measured at. Headline: bf16, 128 MiB of x and as much of y,
# 5x the H200's L2. The sweep keeps M * N fixed at 2^26: every point moves the same bytes, so the
# curve shows only what the row length changes (elements per program, programs per SM, reduction
# depth). A fixed M would shrink N = 1024 to 32 MiB of bf16, which the H200's L2 nearly holds.
NORM_HEADLINE = {"m": 16384, "n": 4096}
NORM_SWEEP = [{"m": 2**26 // n, "n": n} for n in (1024, 2048, 4096, 8192, 16384)]
NORM_TEST_SIZES = [{"m": 1, "n": 1}, {"m": 3, "n": 17}, {"m": 17, "n": 123}, {"m": 33, "n": 1000},
                   {"m": 5, "n": 4097}, {"m": 123, "n": 781}]

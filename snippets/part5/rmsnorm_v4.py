"""RMSNorm forward v4: v3's kernel with the load of w issued before the row's reduction.

A version of Part 5's ``rmsnorm`` op, registered from its own module so that v0 to v3's measured
results keep their source hashes.

- v4  Triton. v3 loads w after the sum of squares: the reduction's barrier must finish before
      the load of w is even issued, and each program then waits a second time, for w (an L2 hit,
      but hundreds of cycles), before it can multiply and store. v4 issues the loads of x and w
      together at the start, so both waits overlap and each program holds its slot on the SM for
      less time. The arithmetic is v3's, in the same order. Its launch table is v3's but for rows
      of 8192 and 16384 elements, where v3 took Part 4 LayerNorm's 16 warps a row: measured on the
      H200 (an experiment, not filed), 8 warps were faster there, by most at 16384. Wherever the
      two tables agree (rows up to 4096 elements, and above 16384), y is bit for bit v3's; with
      fewer warps the row's sum is added in another order.

A forward with a gradient to give (grad mode on and an input that requires grad) goes through v3's
``RMSNormFunction``, whose backward gives x and w their gradients: never a result without one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from snippets._checks import triton_device, wants_grad
from snippets.common.rows import check_rows, compute_dtype
from snippets.part5.rmsnorm import EPS, FLOAT_TYPES, config_for, rmsnorm, rmsnorm_triton
from snippets.registry import Impl


# --8<-- [start:kernel]
@triton.jit
def _rmsnorm_fwd_v4_kernel(x_ptr, w_ptr, y_ptr, M, N, eps,
                           BLOCK_N: tl.constexpr, ROWS: tl.constexpr, COMPUTE: tl.constexpr):
    # v3's (ROWS, BLOCK_N) tile of whole rows
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]  # int64: M * N may pass 2**31

    # Both loads first: neither depends on the other, so their latencies overlap. In v3 the load
    # of w waited behind the reduction below.
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # rounded once, to x's dtype
# --8<-- [end:kernel]


# --8<-- [start:host]
# Warps per program where v4 departs from v3's table (snippets.part5.rmsnorm.CONFIGS), by BLOCK_N.
FWD_WARPS = {8192: 8, 16384: 8}


def launch_config(n: int) -> tuple[int, int, int]:
    """(BLOCK_N, rows per program, warps) of v4's forward for rows of n elements."""
    block_n, cfg = config_for(n)
    return block_n, cfg.rows, FWD_WARPS.get(block_n, cfg.fwd_warps)


def rmsnorm_hoisted(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """v4: RMS norm of each row of x (..., N) by one launch of the kernel above (launch_config);
    y has x's dtype and shape. With a gradient to give, v3's autograd path."""
    check_rows(x, {"w": w}, FLOAT_TYPES, triton_device())
    if wants_grad(x, w):
        return rmsnorm_triton(x, w, eps)
    m, n = x.numel() // x.shape[-1], x.shape[-1]
    y = torch.empty_like(x)
    if m > 0:
        block_n, rows, warps = launch_config(n)
        rows = min(rows, triton.next_power_of_2(m))  # a 3-row input needs no 4-row program
        _rmsnorm_fwd_v4_kernel[(triton.cdiv(m, rows),)](
            x, w, y, m, n, float(eps), BLOCK_N=block_n, ROWS=rows,
            COMPUTE=compute_dtype(x.dtype), num_warps=warps)
    return y
# --8<-- [end:host]


rmsnorm.add(Impl("v4", rmsnorm_hoisted, "Triton", "v3 with w loaded before the row's sum",
                 (_rmsnorm_fwd_v4_kernel, check_rows, launch_config, config_for), device="any"))

"""part5.why-fusion.8: The fused backward of bias, GELU and dropout

The reference solution.

Chapter: docs/part5/why-fusion.md, exercise 8. Difficulty 3 of 4 (write most of it).

Write the kernel of the fused op's backward (the chapter's exercise 2) for the gradient that
needs one: dL/dx = dL/dy * k * gelu'(x + b) / (1 - p), where k is the forward's keep bit,
regenerated from the seed with the forward's counter, and gelu'(h) = Phi(h) + h phi(h) for the
exact GELU h Phi(h). (dL/dr is dL/dy itself, and dL/db the column sum of dL/dx, which the
launcher takes.) Only the seed and the inputs are needed: the forward saves no mask.

Check it:  python -m snippets exercise check part5.why-fusion.8
"""

import torch
import triton
import triton.language as tl


@triton.jit
def bias_gelu_dropout_backward_kernel(dy_ptr, x_ptr, bias_ptr, dx_ptr, M, N, p, scale, seed,
                                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]  # (BLOCK_M, BLOCK_N), the forward's Philox counter
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)
    h = x + b[None, :]
    cdf = 0.5 * (1.0 + tl.math.erf(h * 0.7071067811865476))   # Phi(h)
    pdf = tl.exp(-0.5 * h * h) * 0.3989422804014327            # phi(h), 0.398... = 1/sqrt(2 pi)
    keep = tl.rand(seed, offs) >= p                             # the forward's keep bits
    dx = tl.where(keep, dy * (cdf + h * pdf) * scale, 0.0)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def bias_gelu_dropout_backward(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, p: float,
                               seed: int, dx: torch.Tensor, block_m: int = 2,
                               block_n: int = 64) -> torch.Tensor:
    """Writes dL/dx of y = r + dropout_p(gelu(x + bias)) into dx (M x N, contiguous) and returns
    dL/dbias, its column sum."""
    m, n = x.shape
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    bias_gelu_dropout_backward_kernel[grid](dy, x, bias, dx, m, n, p, scale, seed,
                                            BLOCK_M=block_m, BLOCK_N=block_n)
    return dx.sum(0)

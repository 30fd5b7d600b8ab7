"""part5.cross-entropy.6: Cross-entropy with a z-loss, and its gradient

Chapter: docs/part5/cross-entropy.md, exercise 6. Difficulty 3 of 4 (write most of it).

Add a z-loss term z * lse^2 (PaLM's auxiliary loss, z = 1e-4) to a row-wise cross-entropy kernel
and derive its gradient: loss = lse - x[target] + z * lse^2 per row, and the kernel writes the
loss and d loss / d x of each row.

Check it:  python -m snippets exercise check part5.cross-entropy.6
(--solution checks the reference solution; exercise show part5.cross-entropy.6 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def ce_zloss_kernel(x_ptr, t_ptr, loss_ptr, grad_ptr, v, z, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    mask = cols < v
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=float("-inf"))
    target = tl.load(t_ptr + row)
    # YOUR CODE HERE: lse of the row, loss = lse - x[target] + z * lse^2, grad = d loss / d x
    loss = 0.0
    grad = tl.zeros((BLOCK_V,), dtype=tl.float32)
    tl.store(loss_ptr + row, loss)
    tl.store(grad_ptr + row * stride + cols, grad, mask=mask)


def cross_entropy_zloss(x: torch.Tensor, target: torch.Tensor, z: float, loss: torch.Tensor,
                        grad: torch.Tensor) -> None:
    """Per row of the (m, v) logits x: loss[r] and grad[r, :] of lse - x[target] + z * lse^2."""
    m, v = x.shape
    ce_zloss_kernel[(m,)](x, target, loss, grad, v, z, x.stride(0), BLOCK_V=triton.next_power_of_2(v))

"""part4.custom-ops.2: An in-place operator that says what it writes

Chapter: docs/part4/custom-ops.md, exercise 2. Difficulty 2 of 4 (write a few lines).

Declare mutates_args=() on an operator that writes into its input (an in-place dropout), and find
the opcheck test that catches the lie. Then declare it correctly and compile a function that
calls it.

Check it:  python -m snippets exercise check part4.custom-ops.2
(--solution checks the reference solution; exercise show part4.custom-ops.2 gives the hint)
"""

import re

import torch
import triton
import triton.language as tl

# An operator's name can be registered once per process: the namespace is this module's own.
NAMESPACE = "custom_ops_ex_" + re.sub(r"\W", "_", __name__)
BLOCK = 256


@triton.jit
def dropout_inplace_kernel(x_ptr, n, p, scale, seed, BLOCK: tl.constexpr):
    """x[i] = x[i] * scale where element i is kept (tl.rand(seed, i) >= p), 0 where it is dropped."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.rand(seed, offs) >= p
    tl.store(x_ptr + offs, tl.where(keep, x * scale, 0.0), mask=mask)


def launch(x: torch.Tensor, p: float, seed: int) -> None:
    """Run the kernel on x, in place."""
    assert x.is_contiguous() and x.dtype == torch.float32 and 0.0 <= p < 1.0
    n = x.numel()
    if n:
        dropout_inplace_kernel[(triton.cdiv(n, BLOCK),)](x, n, p, 1.0 / (1.0 - p), seed, BLOCK=BLOCK)


# YOUR CODE HERE: make dropout_ the operator f"{NAMESPACE}::dropout_" with torch.library.custom_op (which of
# its inputs does it write?), and give it a fake implementation with register_fake.
def dropout_(x: torch.Tensor, p: float, seed: int) -> None:
    """x[i] = x[i] / (1 - p) where element i is kept, 0 where it is dropped: in place, nothing returned."""
    launch(x, p, seed)


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """The out-of-place form: a copy of x, dropped out in place."""
    y = x.clone()
    dropout_(y, p, seed)
    return y

"""part3.sgemm.8: Project: validate a kernel against a CPU reference

A PLANTED WRONG SOLUTION ('fixed_loose'): the solution with a bug put in on purpose, for the
checker's tests (--planted fixed_loose checks it).

Chapter: docs/part3/sgemm.md, exercise 8. Difficulty 2 of 4 (write a few lines).

Write the comparison every kernel test of this book makes: validate(c, a, b) computes the
float64 product on the CPU and compares with a tolerance derived from the size of the problem
(tolerance(k) -> (rtol, atol)). It must accept any correct fp32 result, however its sums were
ordered, and reject a TF32 result, a missing K tile, a single wrong element and a result of the
wrong shape.

Check it:  python -m snippets exercise check part3.sgemm.8
"""

import torch


def tolerance(k: int) -> tuple[float, float]:
    """(rtol, atol) for an fp32 product of standard-normal (m x k) and (k x n) matrices against float64."""
    # An entry of C is a sum of k products of size ~1; the rounding error of a length-k fp32 sum grows like
    # u * k with u = 2^-24 (6e-8): 1e-6 * k leaves a margin of several times that, far below TF32's error.
    return 1e-2, 1e-2


def validate(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``c`` (an fp32 kernel's result, on any device) matches a @ b computed in float64 on the CPU."""
    ref = a.detach().cpu().double() @ b.detach().cpu().double()
    if tuple(c.shape) != tuple(ref.shape):
        return False
    rtol, atol = tolerance(a.shape[1])
    return bool(torch.allclose(c.detach().cpu().double(), ref, rtol=rtol, atol=atol))

"""part3.sgemm.8: Project: validate a kernel against a CPU reference

Chapter: docs/part3/sgemm.md, exercise 8. Difficulty 2 of 4 (write a few lines).

Write the comparison every kernel test of this book makes: validate(c, a, b) computes the
float64 product on the CPU and compares with a tolerance derived from the size of the problem
(tolerance(k) -> (rtol, atol)). It must accept any correct fp32 result, however its sums were
ordered, and reject a TF32 result, a missing K tile, a single wrong element and a result of the
wrong shape.

Check it:  python -m snippets exercise check part3.sgemm.8
(--solution checks the reference solution; exercise show part3.sgemm.8 gives the hint)
"""

import torch


def tolerance(k: int) -> tuple[float, float]:
    """(rtol, atol) for an fp32 product of standard-normal (m x k) and (k x n) matrices against float64."""
    raise NotImplementedError("YOUR CODE HERE")


def validate(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``c`` (an fp32 kernel's result, on any device) matches a @ b computed in float64 on the CPU."""
    raise NotImplementedError("YOUR CODE HERE")

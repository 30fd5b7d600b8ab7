"""part5.torch-compile.8: Two functions without a graph break

The reference solution.

Chapter: docs/part5/torch-compile.md, exercise 8. Difficulty 2 of 4 (write a few lines).

clip_by_norm_eager and positive_mean_eager are correct in eager mode, and each is two graphs
under torch.compile: a .item() that feeds a Python if, and a boolean mask whose result has a
size that depends on the data, end the graph there. Write clip_by_norm and positive_mean, with
the same values, so that Dynamo captures each in one graph (torch._dynamo.explain counts the
graphs and names the breaks): what the data decides must stay in tensors.

Check it:  python -m snippets exercise check part5.torch-compile.8
"""

import torch


def clip_by_norm_eager(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """x scaled down to a 2-norm of max_norm if its norm is larger, else x unchanged."""
    norm = torch.linalg.vector_norm(x)
    if norm.item() > max_norm:
        x = x * (max_norm / norm.item())
    return x


def positive_mean_eager(x: torch.Tensor) -> torch.Tensor:
    """The mean of the positive elements of x (nan if there are none)."""
    return x[x > 0].mean()


def clip_by_norm(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """clip_by_norm_eager's values, in one graph."""
    norm = torch.linalg.vector_norm(x)
    return x * torch.clamp(max_norm / norm, max=1.0)  # a factor of 1 when the norm is small enough


def positive_mean(x: torch.Tensor) -> torch.Tensor:
    """positive_mean_eager's values, in one graph."""
    positive = x > 0
    return torch.where(positive, x, 0.0).sum() / positive.sum()  # 0 / 0 = nan when none is positive

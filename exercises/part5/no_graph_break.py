"""part5.torch-compile.8: Two functions without a graph break

Chapter: docs/part5/torch-compile.md, exercise 8. Difficulty 2 of 4 (write a few lines).

clip_by_norm_eager and positive_mean_eager are correct in eager mode, and each is two graphs
under torch.compile: a .item() that feeds a Python if, and a boolean mask whose result has a
size that depends on the data, end the graph there. Write clip_by_norm and positive_mean, with
the same values, so that Dynamo captures each in one graph (torch._dynamo.explain counts the
graphs and names the breaks): what the data decides must stay in tensors.

Check it:  python -m snippets exercise check part5.torch-compile.8
(--solution checks the reference solution; exercise show part5.torch-compile.8 gives the hint)
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
    # YOUR CODE HERE: no .item(), no Python if on a tensor
    raise NotImplementedError("YOUR CODE HERE")


def positive_mean(x: torch.Tensor) -> torch.Tensor:
    """positive_mean_eager's values, in one graph."""
    # YOUR CODE HERE: no tensor whose size depends on the data
    raise NotImplementedError("YOUR CODE HERE")

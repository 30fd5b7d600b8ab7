"""part7.tensor-parallel.8: A column-parallel, then row-parallel MLP, simulated in one process

The reference solution.

Chapter: docs/part7/tensor-parallel.md, exercise 8. Difficulty 2 of 4 (write a few lines).

Shard an MLP y = W2 gelu(W1 x + b1) + b2 (nn.Linear's layout: W1 is (f, h), W2 is (h, f)) over t
ranks: W1 and b1 column parallel (rank r keeps rows r f/t .. (r+1) f/t of W1, the outputs it
computes), W2 row parallel (rank r keeps the matching columns of W2). Write the shards and each
rank's forward, and the all-reduce as a sum over the ranks' partial outputs; the result must equal
the unsharded MLP.

Check it:  python -m snippets exercise check part7.tensor-parallel.8
"""

import torch
import torch.nn.functional as F


def column_shard(w: torch.Tensor, b: torch.Tensor, t: int, r: int):
    """Rank r's part of a column-parallel layer: its f / t output features (rows of w) and bias."""
    f = w.shape[0] // t
    return w[r * f:(r + 1) * f], b[r * f:(r + 1) * f]


def row_shard(w: torch.Tensor, t: int, r: int) -> torch.Tensor:
    """Rank r's part of a row-parallel layer: the columns of w (input features) that match the
    column-parallel layer's outputs on rank r."""
    f = w.shape[1] // t
    return w[:, r * f:(r + 1) * f]


def rank_forward(x: torch.Tensor, w1_r: torch.Tensor, b1_r: torch.Tensor, w2_r: torch.Tensor):
    """One rank's partial output: gelu of its share of the hidden features, through its columns of
    W2. No bias of the second layer here."""
    return F.gelu(x @ w1_r.T + b1_r) @ w2_r.T


def tp_mlp(x, w1, b1, w2, b2, t: int) -> torch.Tensor:
    """The MLP on t simulated ranks: every rank gets the whole x (f: the identity), computes its
    partial output, the all-reduce sums them (g), and the bias b2 is added once, after the sum."""
    partials = [rank_forward(x, *column_shard(w1, b1, t, r), row_shard(w2, t, r)) for r in range(t)]
    return torch.stack(partials).sum(0) + b2

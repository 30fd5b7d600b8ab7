"""part7.context-expert-parallel.8: Top-k routing with a capacity, dispatch and combine

Chapter: docs/part7/context-expert-parallel.md, exercise 8. Difficulty 3 of 4 (write most of it).

Write the router's decision and the mixture-of-experts layer around it, with the chapter's
definitions. expert_capacity: C = ceil(capacity_factor * k * tokens / experts) slots per expert,
no limit (tokens) when the factor is None. route: each token's top k experts by softmax probability
(ties go to the lower expert index), the gates their probabilities, renormalised to sum to 1 over
the k when k > 1; the assignments arrive every token's first choice before any token's second, in
token order, and an expert keeps the first C that arrive and drops the rest; the kept assignments
are returned packed by expert, in arrival order within an expert, with the number dropped.
moe_forward: the dispatch (the rows of x in that packed order, each expert called once on its
rows) and the combine (each result weighted by its gate and summed into its token's row).

Check it:  python -m snippets exercise check part7.context-expert-parallel.8
"""

import math  # noqa: F401 (for your code)
from typing import Callable, NamedTuple

import torch


class Routing(NamedTuple):
    token: torch.Tensor    # (N,) int64: the token of each kept assignment, packed by expert
    expert: torch.Tensor   # (N,) int64: its expert, ascending
    gate: torch.Tensor     # (N,) its gate, in the logits' dtype
    dropped: int           # assignments that found their expert full


def expert_capacity(tokens: int, experts: int, k: int, capacity_factor: float | None) -> int:
    """Slots per expert: the even share k tokens / experts times the factor, rounded up; tokens
    (an expert sees a token at most once) when capacity_factor is None."""
    raise NotImplementedError("YOUR CODE HERE")


def route(logits: torch.Tensor, k: int, capacity_factor: float | None) -> Routing:
    """The router's decision for T tokens from their (T, E) scores."""
    raise NotImplementedError("YOUR CODE HERE")


def moe_forward(x: torch.Tensor, logits: torch.Tensor,
                experts: list[Callable[[torch.Tensor], torch.Tensor]], k: int,
                capacity_factor: float | None) -> torch.Tensor:
    """out (T, d): for each token the gate-weighted sum of its kept experts' outputs, zeros for a
    token whose every assignment was dropped (the residual, outside the layer, carries it)."""
    raise NotImplementedError("YOUR CODE HERE")

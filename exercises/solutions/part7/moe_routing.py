"""part7.context-expert-parallel.8: Top-k routing with a capacity, dispatch and combine

The reference solution.

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

import math
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
    if capacity_factor is None:
        return tokens
    return math.ceil(capacity_factor * k * tokens / experts)


def route(logits: torch.Tensor, k: int, capacity_factor: float | None) -> Routing:
    """The router's decision for T tokens from their (T, E) scores."""
    tokens, experts = logits.shape
    probs = logits.softmax(-1)
    choice = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]   # (T, k)
    top = probs.gather(1, choice)
    gates = top / top.sum(-1, keepdim=True) if k > 1 else top
    # arrival order: all first choices in token order, then all second choices, ...
    expert = choice.t().reshape(-1)
    token = torch.arange(tokens, device=logits.device).repeat(k)
    gate = gates.t().reshape(-1)
    arrived = torch.nn.functional.one_hot(expert, experts).cumsum(0)   # (k T, E) arrivals so far
    slot = arrived.gather(1, expert[:, None]).squeeze(1) - 1           # earlier arrivals, same expert
    keep = slot < expert_capacity(tokens, experts, k, capacity_factor)
    kept = keep.nonzero().squeeze(1)
    packed = kept[torch.sort(expert[kept], stable=True).indices]   # by expert, arrival order kept
    return Routing(token[packed], expert[packed], gate[packed], int((~keep).sum()))


def moe_forward(x: torch.Tensor, logits: torch.Tensor,
                experts: list[Callable[[torch.Tensor], torch.Tensor]], k: int,
                capacity_factor: float | None) -> torch.Tensor:
    """out (T, d): for each token the gate-weighted sum of its kept experts' outputs, zeros for a
    token whose every assignment was dropped (the residual, outside the layer, carries it)."""
    r = route(logits, k, capacity_factor)
    counts = torch.bincount(r.expert, minlength=len(experts)).tolist()
    rows = x[r.token].split(counts)                                # dispatch: packed by expert
    y = torch.cat([f(part) for f, part in zip(experts, rows)])
    out = torch.zeros_like(x)
    out.index_add_(0, r.token, r.gate[:, None].to(y.dtype) * y)    # combine: back to each token
    return out

"""part7.collectives.4: Halving and doubling for any number of ranks

Chapter: docs/part7/collectives.md, exercise 4. Difficulty 2 of 4 (write a part of it).

Write all_reduce_any_p(x): the element-wise sum of every rank's x on every rank, for any number of
ranks p. With q the largest power of two at most p, ranks q, ..., p - 1 first send their vectors to
ranks 0, ..., p - q - 1 (rank r to rank r - q), which add them; ranks 0, ..., q - 1 run the given
halving_doubling; then the results go back (rank r - q to rank r). The check runs it on 1, 3, 4 and
6 processes joined by torch.distributed's gloo backend and compares with dist.all_reduce.

Check it:  python -m snippets exercise check part7.collectives.4
"""

import torch
import torch.distributed as dist


def exchange(send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
    """Send ``send`` to rank ``peer`` and receive ``recv`` from it, both posted at once. Given."""
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def halving_doubling(flat: torch.Tensor, rank: int, q: int) -> None:
    """Recursive halving and doubling, in place on the 1-D ``flat``, among ranks 0, ..., q - 1
    (q a power of two; every one of them must call it): afterwards each holds the sum of their
    ``flat``. The book's algorithm (snippets/part7/collectives.py). Given."""
    if q < 1 or q & (q - 1):
        raise ValueError(f"halving_doubling: q must be a power of two, got {q}")
    at = [flat.numel() * k // q for k in range(q + 1)]     # q chunks
    lo, hi, mask = 0, q, q // 2
    steps = []
    while mask:                                             # halving: a reduce-scatter
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        mine = flat[at[keep[0]]:at[keep[1]]]
        incoming = torch.empty_like(mine)
        exchange(flat[at[give[0]]:at[give[1]]], incoming, rank ^ mask)
        mine += incoming
        steps.append((rank ^ mask, keep, give))
        lo, hi = keep
        mask //= 2
    for peer, keep, give in reversed(steps):                # doubling: an all-gather
        exchange(flat[at[keep[0]]:at[keep[1]]], flat[at[give[0]]:at[give[1]]], peer)


def all_reduce_any_p(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over all ranks, on every rank, for any number of ranks: fold the ranks above
    the largest power of two into the ranks below it, run halving_doubling, unfold. Returns a new
    tensor of x's shape."""
    raise NotImplementedError("YOUR CODE HERE")

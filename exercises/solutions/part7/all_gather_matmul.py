"""part7.tp-overlap.7: All-gather and multiply, each shard as it arrives

The reference solution.

Chapter: docs/part7/tp-overlap.md, exercise 7. Difficulty 3 of 4 (write most of it).

Under sequence parallelism each of p ranks holds n of the p n tokens, and the column-parallel
matrix needs all of them: an all-gather, then a multiply, one after the other. PyTorch's async-TP
(fused_all_gather_matmul) multiplies each shard as it arrives instead. Write
all_gather_matmul(x, w, out, rank, p) as a ring: in step s (0 <= s < p) rank r holds the shard of
rank (r - s) mod p. In every step but the last it posts the exchange that sends that shard to rank
r + 1 and receives the next one from rank r - 1; it multiplies the shard it holds by w into that
rank's rows of out while the exchange travels, and only then waits for it. out is (p n, k), rank
q's n rows after rank q - 1's, as an all-gather lays them out.

Check it:  python -m snippets exercise check part7.tp-overlap.7
"""

import torch
import torch.distributed as dist


class _Pending:
    """The handle of a posted exchange: wait() returns once the shard is sent and the next one is
    in the receive buffer."""

    def __init__(self, works):
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


def post_exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> _Pending:
    """Post, without waiting: send ``send`` to rank ``right`` and receive into ``recv`` from rank
    ``left``. ``send`` must not change and ``recv`` must not be read until the handle's wait()
    has returned. Given."""
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    return _Pending(dist.batch_isend_irecv(ops))


def all_gather_matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rank: int,
                      p: int) -> torch.Tensor:
    """Fill ``out`` (p n, k) with the all-gather of every rank's ``x`` (n, d) times ``w.T`` (w is
    (k, d), nn.Linear's layout), multiplying each rank's shard as it comes round the ring, and
    return it. ``x`` itself must not change."""
    n = x.shape[0]
    right, left = (rank + 1) % p, (rank - 1) % p
    held = x
    for step in range(p):
        src = (rank - step) % p                  # whose shard this rank holds now
        if step + 1 < p:                         # pass it on while it is multiplied
            incoming = torch.empty_like(held)
            pending = post_exchange(held, incoming, right, left)
        torch.mm(held, w.t(), out=out[src * n:(src + 1) * n])
        if step + 1 < p:
            pending.wait()
            held = incoming
    return out

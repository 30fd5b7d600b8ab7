"""part7.collectives.7: The ring all-reduce's reduce-scatter, on real ranks

Chapter: docs/part7/collectives.md, exercise 7. Difficulty 3 of 4 (write most of it).

Write reduce_scatter_chunks(chunks, rank, p), the ring reduce-scatter in place on this rank's p
chunks: in step s (0 <= s < p - 1) rank r sends chunk (r - s - 1) mod p to rank r + 1 and adds the
chunk (r - s - 2) mod p that rank r - 1 sends it. After p - 1 steps chunks[rank] holds the sum over
all ranks of chunk rank. The all-gather and the all-reduce around it are given. The check runs it on
4 and 3 processes joined by torch.distributed's gloo backend and compares with dist.all_reduce.

Check it:  python -m snippets exercise check part7.collectives.7
"""

import torch
import torch.distributed as dist


def _send_recv(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    """Send ``send`` to rank ``right`` and receive ``recv`` from rank ``left``, both posted at once
    (a ring of ranks that all send before they receive would deadlock). The sizes go first: if a
    rank's receive buffer does not match what its left neighbour sends, every rank raises the
    same ValueError instead of the transport failing. Given."""
    theirs = torch.zeros(1, dtype=torch.int64)
    _send_recv(torch.tensor([send.numel()]), theirs, right, left)
    bad = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    bad[dist.get_rank()] = int(theirs) != recv.numel()
    dist.all_reduce(bad)
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise ValueError(f"rank {r} receives into a chunk whose size differs from the chunk its "
                         "left neighbour sends: the two sides of a link must use the same chunk "
                         "index")
    _send_recv(send, recv, right, left)


def reduce_scatter_chunks(chunks: list[torch.Tensor], rank: int, p: int) -> None:
    """The ring reduce-scatter, in place: afterwards chunks[rank] is the sum of every rank's chunk
    ``rank`` (the other chunks hold partial sums)."""
    raise NotImplementedError("YOUR CODE HERE")


def all_gather_chunks(chunks: list[torch.Tensor], rank: int, p: int) -> None:
    """The ring all-gather, in place: rank r holds chunk r; in step s it sends chunk (r - s) mod p
    to the right and receives chunk (r - s - 1) mod p from the left into its place. Given."""
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        exchange(chunks[(rank - step) % p], chunks[(rank - step - 1) % p], right, left)


def ring_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over all ranks, on every rank: a reduce-scatter, then an all-gather. Given."""
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = x.reshape(-1).clone()
    chunks = list(flat.tensor_split(p))                  # views of flat, some maybe empty
    reduce_scatter_chunks(chunks, rank, p)
    all_gather_chunks(chunks, rank, p)
    return flat.view(x.shape)

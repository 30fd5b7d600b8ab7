"""Collectives built from point-to-point messages: the ring reduce-scatter, all-gather and
all-reduce, a binary-tree all-reduce, recursive halving-doubling, and a pairwise all-to-all.

Every function is called by every rank of ``group`` (the default group when None) with its own
tensor, like ``torch.distributed``'s collectives, and sends nothing but ``isend``/``irecv`` pairs
(through ``batch_isend_irecv``, which NCCL needs to run a send and a receive between the same two
ranks at once). The cost of each, in the alpha-beta model, is in ``snippets.part7.cost``.

Conventions:

- Any number of elements, not only multiples of p: the vector is cut into p chunks with
  ``tensor_split``, whose chunks differ in length by at most one (some are empty when the vector
  has fewer than p elements). Chunk k is ``x.reshape(-1).tensor_split(p)[k]`` on every rank.
- Sums are accumulated in the input's dtype, as NCCL does: a bfloat16 all-reduce adds bfloat16
  values, rounding after every addition. The order of the additions depends on the algorithm (and
  differs from NCCL's and gloo's), so float results agree with ``dist.all_reduce`` to rounding, and
  exactly when every partial sum is representable (integers in float64, say).
- The input is never modified; every function returns new tensors.
- The inputs are checked on every rank before anything is sent: each rank's dtype and shape are
  gathered first (one small ``all_gather_object``), and if any rank's input is unusable, or the
  shapes disagree, *every* rank raises the same ``TypeError``/``ValueError``, naming the ranks. A
  rank that raised alone would leave the others waiting in a receive forever (until the process
  group's timeout).

Run under ``torchrun`` (``torchrun --nproc-per-node 4 -m snippets.part7.collectives``), the module
checks every collective against ``torch.distributed``'s own on the ranks it is given.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

SUM_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# torch.distributed's own tensor collectives, for code that calls them directly (the sweep,
# ZeRO): torch 2.13 renamed them (the old names warn), older torch has only the old names
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _rank_and_size(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


# --8<-- [start:p2p]
def _p2p(sends, recvs, group) -> None:
    """Post every send (tensor, group rank) and receive (tensor, group rank) at once, then wait for
    all of them: a ring of ranks that all send before they receive cannot deadlock. Empty tensors
    are skipped: the partner of an empty send is an empty receive, skipped as well."""
    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=peer)
           for t, peer in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=peer)
            for t, peer in recvs if t.numel()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
# --8<-- [end:p2p]


def describe_input(x) -> tuple[str | None, str, tuple]:
    """(problem or None, dtype, shape) of one rank's input, for the exchange that checks it."""
    if not isinstance(x, torch.Tensor):
        return f"a {type(x).__name__}, not a tensor", "", ()
    if x.dtype not in SUM_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUM_DTYPES)
        return f"dtype {x.dtype} (the sums take {names})", str(x.dtype), tuple(x.shape)
    return None, str(x.dtype), tuple(x.shape)


def agree(name: str, group, described: list) -> list:
    """Gather every rank's description and raise the same error on every rank if one is unusable
    or the dtypes differ. Returns the descriptions, in rank order."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, described, group=group)
    problems = [(r, d[0]) for r, d in enumerate(everyone) if d[0] is not None]
    if problems:
        raise TypeError(f"{name}: " + "; ".join(f"rank {r} passed {why}" for r, why in problems))
    dtypes = {d[1] for d in everyone}
    if len(dtypes) > 1:
        raise TypeError(f"{name}: every rank must pass one dtype, got "
                        + ", ".join(f"rank {r}: {d[1]}" for r, d in enumerate(everyone)))
    return everyone


def agree_same_shape(name: str, x, group) -> None:
    everyone = agree(name, group, describe_input(x))
    if len({d[2] for d in everyone}) > 1:
        raise ValueError(f"{name}: every rank must pass the same shape, got "
                         + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone)))


def chunk_bounds(numel: int, p: int) -> list[int]:
    """Where each of tensor_split's p chunks of a vector of ``numel`` starts, and the end."""
    sizes = [numel // p + (k < numel % p) for k in range(p)]
    return [0, *itertools.accumulate(sizes)]


# --8<-- [start:ring_reduce_scatter]
def reduce_scatter_chunks(chunks, rank: int, p: int, group=None) -> None:
    """The ring, in place on this rank's p chunks: in step s (0 <= s < p - 1) rank r sends chunk
    (r - s - 1) mod p to rank r + 1 and adds the chunk (r - s - 2) mod p that rank r - 1 sends.
    A chunk travels once round the ring collecting every rank's share; it ends its journey on the
    rank with its index, so after p - 1 steps ``chunks[rank]`` holds the sum over all ranks."""
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send = chunks[(rank - step - 1) % p]
        mine = chunks[(rank - step - 2) % p]
        incoming = torch.empty_like(mine)
        _p2p([(send, right)], [(incoming, left)], group)
        mine += incoming                      # in the input's dtype, as NCCL adds


def ring_reduce_scatter(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank passes a tensor of one shape; rank r gets chunk r (``tensor_split`` of the
    flattened tensor into p chunks) of the element-wise sum over ranks, as a new 1-D tensor."""
    rank, p = _rank_and_size(group)
    agree_same_shape("ring_reduce_scatter", x, group)
    chunks = x.detach().reshape(-1).clone().tensor_split(p)    # p views of one copy of x
    reduce_scatter_chunks(chunks, rank, p, group)
    return chunks[rank].clone()
# --8<-- [end:ring_reduce_scatter]


# --8<-- [start:ring_all_gather]
def all_gather_chunks(chunks, rank: int, p: int, group=None) -> None:
    """The ring, in place: rank r holds chunk r; in step s it sends chunk (r - s) mod p to rank
    r + 1 and receives chunk (r - s - 1) mod p from rank r - 1 straight into its place. After
    p - 1 steps every rank holds every chunk."""
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        _p2p([(chunks[(rank - step) % p], right)], [(chunks[(rank - step - 1) % p], left)], group)


def ring_all_gather(chunk: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank passes a tensor; all get them concatenated along dim 0 in rank order, as a new
    tensor. The dims after the first must agree; the first may differ between ranks (as the
    chunks of ``tensor_split`` do). A 0-d tensor counts as one element."""
    rank, p = _rank_and_size(group)
    chunk = chunk.reshape(1) if isinstance(chunk, torch.Tensor) and chunk.dim() == 0 else chunk
    everyone = agree("ring_all_gather", group, describe_input(chunk))
    if len({d[2][1:] for d in everyone}) > 1:
        raise ValueError("ring_all_gather: the dims after the first must agree, got "
                         + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone)))
    rows = [d[2][0] for d in everyone]
    out = chunk.new_empty((sum(rows), *chunk.shape[1:]))
    chunks = out.split(rows)                                   # p views of the output
    chunks[rank].copy_(chunk)
    all_gather_chunks(chunks, rank, p, group)
    return out
# --8<-- [end:ring_all_gather]


# --8<-- [start:ring_all_reduce]
def ring_all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """The element-wise sum of every rank's ``x``, as a new tensor of x's shape on every rank:
    a ring reduce-scatter, then a ring all-gather of the reduced chunks, both in place on one
    flat copy of x. 2 (p - 1) steps of n / p elements each."""
    rank, p = _rank_and_size(group)
    agree_same_shape("ring_all_reduce", x, group)
    flat = x.detach().reshape(-1).clone()
    chunks = flat.tensor_split(p)
    reduce_scatter_chunks(chunks, rank, p, group)   # chunks[rank] is now the sum
    all_gather_chunks(chunks, rank, p, group)       # and now every chunk is
    return flat.view(x.shape)
# --8<-- [end:ring_all_reduce]


# --8<-- [start:tree_all_reduce]
def tree_all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """The element-wise sum of every rank's ``x`` through a binary tree rooted at rank 0 (rank r's
    children are 2r + 1 and 2r + 2, as in a binary heap): each rank adds its children's partial
    sums to its own and sends the result to its parent; rank 0 then holds the total, which goes
    back down the same tree. Whole messages, not pipelined: 2 floor(log2 p) steps of n elements.
    Returns a new tensor of x's shape."""
    rank, p = _rank_and_size(group)
    agree_same_shape("tree_all_reduce", x, group)
    total = x.detach().reshape(-1).clone()
    parent = (rank - 1) // 2
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < p]
    partials = [torch.empty_like(total) for _ in children]
    _p2p([], list(zip(partials, children)), group)        # reduce: up the tree
    for partial in partials:
        total += partial                                   # in the input's dtype
    if rank != 0:
        _p2p([(total, parent)], [], group)
        _p2p([], [(total, parent)], group)                 # broadcast: down the tree
    _p2p([(total, child) for child in children], [], group)
    return total.view(x.shape)
# --8<-- [end:tree_all_reduce]


# --8<-- [start:halving_doubling]
def recursive_halving_doubling_all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """The element-wise sum of every rank's ``x`` for p a power of two (Rabenseifner's algorithm).
    Halving: in step k rank r exchanges with r XOR p/2^(k+1); each keeps half of the chunks it is
    responsible for (the lower half if its bit is 0) and adds the partner's copy of that half.
    After log2 p steps rank r holds the sum of chunk r. Doubling: the same exchanges in reverse
    order, each rank sending all it holds, until every rank has every chunk. Returns a new
    tensor of x's shape."""
    rank, p = _rank_and_size(group)
    if p & (p - 1):
        raise ValueError(f"recursive_halving_doubling_all_reduce: needs a power-of-two number of "
                         f"ranks, got {p} (use ring_all_reduce)")
    agree_same_shape("recursive_halving_doubling_all_reduce", x, group)
    flat = x.detach().reshape(-1).clone()
    at = chunk_bounds(flat.numel(), p)           # chunk k is flat[at[k]:at[k + 1]]
    lo, hi = 0, p                                 # the chunks this rank is responsible for
    mask = p // 2
    while mask:                                   # recursive halving: a reduce-scatter
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        mine = flat[at[keep[0]]:at[keep[1]]]
        incoming = torch.empty_like(mine)
        _p2p([(flat[at[give[0]]:at[give[1]]], rank ^ mask)], [(incoming, rank ^ mask)], group)
        mine += incoming
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < p:                               # recursive doubling: an all-gather
        size = hi - lo
        other = (lo - size, lo) if rank & mask else (hi, hi + size)  # the partner's chunks
        _p2p([(flat[at[lo]:at[hi]], rank ^ mask)],
             [(flat[at[other[0]]:at[other[1]]], rank ^ mask)], group)
        lo, hi = min(lo, other[0]), max(hi, other[1])
        mask *= 2
    return flat.view(x.shape)
# --8<-- [end:halving_doubling]


# --8<-- [start:all_to_all]
def all_to_all(chunks, group=None) -> list[torch.Tensor]:
    """Every rank passes p tensors; ``chunks[j]`` goes to rank j. Returns p new tensors: element i
    is what rank i addressed to this rank. Pairwise exchange: in step s (1 <= s < p) rank r sends
    to r + s and receives from r - s, so every pair of ranks talks exactly once. The chunks may
    differ in their first dim (as the tokens an expert receives do); the other dims must agree."""
    rank, p = _rank_and_size(group)
    ok = isinstance(chunks, (list, tuple)) and len(chunks) == p
    shapes = None
    if ok:
        problem = next((d[0] for d in map(describe_input, chunks) if d[0]), None)
        ok = problem is None and len({(c.dtype, c.shape[1:]) for c in chunks}) == 1 \
            and all(c.dim() for c in chunks)
        shapes = [tuple(c.shape) for c in chunks]
    if not ok:
        why = f"{p} tensors of one dtype, at least 1-D, agreeing after dim 0"
        described = (f"{type(chunks).__name__} {shapes or ''}, not {why}", "", ())
    else:
        described = (None, str(chunks[0].dtype), tuple(shapes))
    everyone = agree("all_to_all", group, described)
    if len({tuple(s[1:] for s in d[2]) for d in everyone}) > 1:
        raise ValueError("all_to_all: the dims after the first must agree on every rank, got "
                         + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone)))
    out = [None] * p
    out[rank] = chunks[rank].clone()
    for step in range(1, p):
        dst, src = (rank + step) % p, (rank - step) % p
        out[src] = chunks[0].new_empty(everyone[src][2][rank])  # the shape rank src sends here
        _p2p([(chunks[dst].contiguous(), dst)], [(out[src], src)], group)
    return out
# --8<-- [end:all_to_all]


def check_collectives(rank: int, world_size: int, numel: int,
                      dtype: torch.dtype = torch.float64) -> dict[str, float]:
    """Run every collective of this module on integer-valued inputs (exact in float64) and compare
    it with ``torch.distributed``'s own, or with the sum computed from every rank's input where
    the backend lacks the op. Returns the largest absolute difference per collective: all zeros
    when the collectives are right. Made for ``run_world`` and ``torchrun``."""
    device = "cpu" if dist.get_backend() == "gloo" else f"cuda:{torch.cuda.current_device()}"
    g = torch.Generator().manual_seed(1000 * world_size + numel)
    inputs = [torch.randint(-8, 9, (numel,), generator=g).to(dtype) for _ in range(world_size)]
    x = inputs[rank].to(device)
    total = torch.stack(inputs).sum(0).to(device)
    reference = x.clone()
    dist.all_reduce(reference)
    gathered = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(gathered, x)
    errors = {
        "dist.all_reduce vs the sum": _difference(reference, total),
        "ring_all_reduce": _difference(ring_all_reduce(x), reference),
        "tree_all_reduce": _difference(tree_all_reduce(x), reference),
        "ring_reduce_scatter": _difference(ring_reduce_scatter(x),
                                           total.tensor_split(world_size)[rank]),
        "ring_all_gather": _difference(ring_all_gather(x), torch.cat(gathered)),
    }
    if world_size & (world_size - 1) == 0:
        errors["recursive_halving_doubling_all_reduce"] = _difference(
            recursive_halving_doubling_all_reduce(x), reference)
    # all-to-all: rank i sends rank j a block of (i + j) % 3 + 1 rows, each row (10 i + j, k)
    def block(i, j):
        rows = torch.full(((i + j) % 3 + 1, 1), 10.0 * i + j)
        return torch.cat([rows, torch.arange(len(rows)).view(-1, 1)], 1).to(device, dtype)

    got = all_to_all([block(rank, j) for j in range(world_size)])
    errors["all_to_all"] = max(_difference(got[i], block(i, rank)) for i in range(world_size))
    return errors


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of two tensors; infinite if their shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


def main() -> None:
    """``torchrun --nproc-per-node P -m snippets.part7.collectives``: every collective on every
    rank, at a few sizes, against torch.distributed's own; rank 0 prints the largest differences."""
    from snippets.part7.launch import init_from_env

    rank, world_size = init_from_env()
    worst: dict[str, float] = {}
    for numel in (1, 7, 1000, 4097, 1 << 20):
        for name, err in check_collectives(rank, world_size, numel).items():
            worst[name] = max(worst.get(name, 0.0), err)
    if rank == 0:
        for name, err in worst.items():
            print(f"{name:40s} largest difference {err:g}")
    dist.destroy_process_group()
    if any(worst.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Tensor parallelism with sequence parallelism, its collectives taken apart into a ring of
point-to-point messages so that every message travels while a matrix product runs: the
decomposition behind PyTorch's async-TP and the "collective matmul" of the TPU literature.

In the sequence-parallel MLP of tensor_parallel.py, rank r holds n of the p n tokens. The block
all-gathers them, multiplies by its column slice of the first matrix, and reduce-scatters the
product of the second. Both collectives can be cut by *rank*, not by chunks of tokens:

- **all-gather, then multiply** (``ring_gather_mm``): in step s (0 to p - 1) rank r holds the
  shard of rank r - s. It passes that shard on to rank r + 1 and, while the shard travels,
  multiplies it; the shard of rank r - s - 1 has arrived from rank r - 1 by the next step.
- **multiply, then reduce-scatter** (``ring_mm_reduce_scatter``): in step s rank r computes its
  partial product for the rows of rank d = r - s - 1, adds the running sum for those rows that
  rank r - 1 sent it, and passes the sum on to rank r + 1. After p - 1 hops the sum for rank d's
  rows has visited every rank and arrives at rank d itself in the last step, where d = r.

Each hop's message is one shard (n rows), and the product that hides it is one shard's product:
the pieces are as large as the layout allows, not cut smaller for the overlap. The backward runs
the same two rings on the gradients, and computes the weights' gradients (which need no message)
while the input gradient's sums travel. The messages are NCCL (or gloo) sends and receives posted
together (``batch_isend_irecv``): the block runs on the CPU under gloo exactly as on GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.collectives import agree_same_shape
from snippets.part7.tensor_parallel import TensorParallelMLP

# NCCL cuts a point-to-point message into chunks of NCCL_P2P_NVL_CHUNKSIZE bytes over NVLink; a hop
# of a few tens of MiB keeps every channel busy only with a chunk smaller than NCCL's default (the
# collectives chapter measured it), so the measurement sets this one before NCCL starts
P2P_CHUNK_BYTES = 1 << 16


# --8<-- [start:rings]
def hop_group(group=None):
    """The group the ring's messages go through. On NCCL, a new group of the same ranks whose
    streams have high priority: a message's kernel is then given SMs ahead of the waiting tiles of
    the product queued beside it, instead of after all of them. On other backends, ``group``."""
    if dist.get_backend(group) != "nccl":
        return group
    from torch.distributed import ProcessGroupNCCL

    options = ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    if group is None:
        return dist.new_group(pg_options=options)
    return dist.new_group(dist.get_process_group_ranks(group), pg_options=options,
                          use_local_synchronization=True)


def _ring(group) -> tuple[int, int, int, int]:
    """(p, this rank, the next rank, the previous rank): the last two as global ranks, which is
    what point-to-point calls take."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    world = (lambda k: k) if group is None else (lambda k: dist.get_global_rank(group, k))
    return p, r, world((r + 1) % p), world((r - 1) % p)


def _hop(send: torch.Tensor, recv: torch.Tensor, group) -> list:
    """Post: send ``send`` to the next rank, receive ``recv`` from the previous one."""
    _, _, nxt, prv = _ring(group)
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, group),
                                   dist.P2POp(dist.irecv, recv, prv, group)])


def ring_gather_mm(x: torch.Tensor, gathered: torch.Tensor,
                   use: Callable[[int, torch.Tensor], None], group=None) -> None:
    """All-gather this rank's rows ``x`` (n, ...) into ``gathered`` (p n, ...), rank k's rows at
    k n, and call ``use(k, rows)`` on each rank's rows while the next shard is on its way (this
    rank's own first)."""
    p, r, _, _ = _ring(group)
    n = x.shape[0]
    gathered[r * n:(r + 1) * n].copy_(x)
    for s in range(p):
        k = (r - s) % p                       # the shard this rank holds in step s
        works = []
        if s < p - 1:                         # pass it on; the previous rank's comes in
            j = (k - 1) % p
            works = _hop(gathered[k * n:(k + 1) * n], gathered[j * n:(j + 1) * n], group)
        use(k, gathered[k * n:(k + 1) * n])   # runs while the shards travel
        for work in works:
            work.wait()


def ring_mm_reduce_scatter(partial: Callable[[int], torch.Tensor], group=None,
                           between: tuple[Callable[[], None], ...] = ()) -> torch.Tensor:
    """The sum over the ranks of ``partial(d)`` (this rank's partial product for the rows of rank
    d), for d = this rank: each sum travels the ring, collecting one rank's part per hop.
    ``between`` are pieces of work that need no message: piece s runs while hop s travels, the
    rest before the last wait."""
    p, r, _, _ = _ring(group)
    works, received, sent, rest = [], None, None, list(between)
    for s in range(p):
        mine = partial((r - s - 1) % p)       # overlaps the hop in flight
        if s == p - 1:
            while rest:
                rest.pop(0)()
        for work in works:
            work.wait()
        if received is not None:
            mine += received
        if s < p - 1:
            received, sent = torch.empty_like(mine), mine     # sent: alive until its hop lands
            works = _hop(sent, received, group)
            if rest:
                rest.pop(0)()
    return mine
# --8<-- [end:rings]


# --8<-- [start:function]
class RingTPFunction(torch.autograd.Function):
    """down(gelu(up(x))) for this rank's ``x`` (n, d) of p n tokens, with its slices ``w1`` (f/p,
    d), ``b1`` (f/p), ``w2`` (d, f/p) and the whole ``b2`` (d): the sequence-parallel block, its
    all-gathers and reduce-scatters taken apart into rings."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, group):
        p = dist.get_world_size(group)
        n = x.shape[0]
        gathered = x.new_empty((p * n, x.shape[1]))
        pre = x.new_empty((p * n, w1.shape[0]))

        def up(k, rows):                      # rank k's tokens through the first matrix
            if b1 is None:
                torch.mm(rows, w1.t(), out=pre[k * n:(k + 1) * n])
            else:
                torch.addmm(b1, rows, w1.t(), out=pre[k * n:(k + 1) * n])

        ring_gather_mm(x, gathered, up, group)
        out = ring_mm_reduce_scatter(lambda k: F.gelu(pre[k * n:(k + 1) * n]) @ w2.t(), group)
        if b2 is not None:
            out += b2
        ctx.save_for_backward(gathered, pre, w1, w2)
        ctx.group, ctx.biases = group, (b1 is not None, b2 is not None)
        return out

    @staticmethod
    def backward(ctx, grad):
        gathered, pre, w1, w2 = ctx.saved_tensors
        has_b1, has_b2 = ctx.biases
        p, n = dist.get_world_size(ctx.group), grad.shape[0]
        ggrad = grad.new_empty((p * n, grad.shape[1]))          # every rank's grad of y
        da = grad.new_empty(pre.shape)                          # grad of the pre-activations
        h = F.gelu(pre)

        def down_t(k, rows):                  # rank k's rows back through w2 and gelu
            torch.ops.aten.gelu_backward.grad_input(rows @ w2, pre[k * n:(k + 1) * n],
                                                    grad_input=da[k * n:(k + 1) * n])

        ring_gather_mm(grad.contiguous(), ggrad, down_t, ctx.group)
        dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
        cols = [(w1.shape[0] * i // p, w1.shape[0] * (i + 1) // p) for i in range(p)]

        def weights(a, b):                    # a block of f/p of both weight gradients
            def run():
                torch.mm(ggrad.t(), h[:, a:b], out=dw2[:, a:b])
                torch.mm(da[:, a:b].t(), gathered, out=dw1[a:b])
            return run

        dx = ring_mm_reduce_scatter(lambda k: da[k * n:(k + 1) * n] @ w1, ctx.group,
                                    between=tuple(weights(a, b) for a, b in cols))
        db1 = da.sum(0) if has_b1 else None
        db2 = grad.sum(0) if has_b2 else None   # a partial sum, like tensor_parallel's (sp)
        return dx, dw1, db1, dw2, db2, None
# --8<-- [end:function]


# --8<-- [start:module]
class RingTPMLP(nn.Module):
    """``TensorParallelMLP(up, down, group, sp=True)``'s slices (the same parameter names and
    marks), computed by ``RingTPFunction``. The input is this rank's share of the tokens,
    (..., d). Before the first message of a call every rank's input shape is exchanged and a
    disagreement raises the same error on every rank; ``check=False`` skips that exchange. The
    messages go through ``hop_group(group)``, made here (on NCCL, by every rank of ``group``)."""

    def __init__(self, up: nn.Linear, down: nn.Linear, group=None):
        super().__init__()
        base = TensorParallelMLP(up, down, group, sp=True)
        self.up, self.down = base.up, base.down
        self.group, self.check = group, True
        self.hops = hop_group(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.up.weight
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"RingTPMLP: x must be a tensor, got {type(x).__name__}")
        if x.dtype != w.dtype or x.device != w.device:
            raise TypeError(f"RingTPMLP: x is {x.dtype} on {x.device}, the weights {w.dtype} on "
                            f"{w.device}")
        if x.dim() < 2 or x.shape[-1] != w.shape[1] or x.numel() == 0:
            raise ValueError(f"RingTPMLP: x must be (..., {w.shape[1]}) with at least one token, "
                             f"got {tuple(x.shape)}")
        if self.check:
            agree_same_shape("RingTPMLP", x, self.group)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = RingTPFunction.apply(flat, w, self.up.bias, self.down.weight, self.down.bias,
                                 self.hops)
        return y.view(*x.shape[:-1], y.shape[-1])
# --8<-- [end:module]

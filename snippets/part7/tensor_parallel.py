"""Tensor parallelism from scratch (Megatron-LM), with sequence parallelism, and the same model
through PyTorch's DTensor API.

Every rank of a tensor-parallel group holds a slice of every weight matrix of the transformer's
blocks and sees the whole batch. Shoeybi et al. ("Megatron-LM: Training Multi-Billion Parameter
Language Models Using Model Parallelism", 2019) cut the first linear layer of a pair by its output
features (*column parallel*: each rank computes some of the outputs, from the whole input) and the
second by its input features (*row parallel*: each rank multiplies its slice of the input by its
slice of the weight, and the partial products are summed). Column then row needs one all-reduce in
the forward (operator g) and one in the backward (operator f, its conjugate).

Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", 2022) split
what is left between the pairs (the norms, the residual additions) along the sequence: g becomes a
reduce-scatter onto a sequence shard, and f an all-gather of the shards (*sequence parallelism*).
Every rank then stores 1/p of those activations too, for the same bytes of communication.
Megatron also cuts the vocabulary: a vocab-parallel embedding, a head whose logits stay cut, and a
cross-entropy computed from the slices (``vocab_parallel=True``).

Conventions:

- A tensor-parallel layer is built from the full ``nn.Linear`` (every rank builds the same model
  from one seed, or ``tensor_parallel`` broadcasts rank 0's), and keeps this rank's slice.
- Each sharded parameter carries ``tp_dim`` (the dimension it is cut along, as Megatron's
  ``partition_dim``); a parameter that sees only a sequence shard under sequence parallelism
  carries ``sequence_parallel = True``, and its gradient must be summed over the ranks after the
  backward (``sync_sequence_parallel_grads``).
- Activations are (batch, seq, features); the sequence is dimension 1.

Under ``torchrun`` (``torchrun --nproc-per-node 4 -m snippets.part7.tensor_parallel``) the module
trains the tiny transformer with and without sequence parallelism (and the vocabulary cut), and
with DTensor, and compares each with one process.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.collectives import all_gather_tensor, reduce_scatter_tensor, ring_all_gather
from snippets.part7.launch import device_for, init_from_env
from snippets.part7.models import (
    Attention,
    TinyTransformer,
    causal_attention,
    lm_loss,
    tiny_batch,
    tiny_transformer,
)


def _group_rank_size(name: str, group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{name}: no process group: call dist.init_process_group first "
                           "(or run under snippets.part7.launch.run_world)")
    return dist.get_rank(group), dist.get_world_size(group)


def _split(name: str, what: str, n: int, p: int) -> int:
    if n % p:
        raise ValueError(f"{name}: {what}={n} does not split into {p} equal shards "
                         f"(tensor parallelism needs it divisible by the group size {p})")
    return n // p


# --8<-- [start:f_g]
class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: the identity in the forward; in the backward, the sum of the ranks'
    gradients (each rank's slice of the next layer produced a partial gradient of the input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g, f's conjugate: the sum of the ranks' partial outputs in the forward; the
    identity in the backward (every rank needs the whole gradient of the sum, which it has)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None
# --8<-- [end:f_g]


# --8<-- [start:sp_ops]
def _gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(b, s/p, ...) on every rank -> (b, s, ...), the shards in rank order."""
    p = dist.get_world_size(group)
    front = x.movedim(1, 0).contiguous()                   # all_gather stacks along dim 0
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))
    all_gather_tensor(out, front, group=group)
    return out.movedim(0, 1)


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(b, s, ...) partial sums on every rank -> this rank's (b, s/p, ...) shard of the sum."""
    p = dist.get_world_size(group)
    front = x.movedim(1, 0).contiguous()
    out = front.new_empty((front.shape[0] // p, *front.shape[1:]))
    reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, 1)


class GatherFromSequenceParallel(torch.autograd.Function):
    """f under sequence parallelism: all-gather the sequence shards in the forward; in the
    backward, reduce-scatter (sum the ranks' partial gradients, keep this rank's shard)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter the partial outputs onto sequence shards in
    the forward; all-gather the shards' gradients in the backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad.contiguous(), ctx.group), None
# --8<-- [end:sp_ops]


class ScatterToSequenceParallel(torch.autograd.Function):
    """Replicated -> this rank's sequence shard (no communication); backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        return x.tensor_split(p, dim=1)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad.contiguous(), ctx.group), None


class GatherToReplicated(torch.autograd.Function):
    """Sequence shards -> the whole sequence on every rank; backward: keep this rank's shard of
    the gradient (every rank computed the same whole gradient after this point)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        rank, p = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.tensor_split(p, dim=1)[rank].contiguous(), None


def enter_tensor_parallel(x: torch.Tensor, group, sp: bool) -> torch.Tensor:
    """The input of a column-parallel layer: f, or the all-gather of the sequence shards."""
    if sp:
        return GatherFromSequenceParallel.apply(x, group)
    return CopyToTensorParallel.apply(x, group)


def exit_tensor_parallel(y: torch.Tensor, group, sp: bool) -> torch.Tensor:
    """The output of a row-parallel layer: g, or the reduce-scatter onto sequence shards."""
    if sp:
        return ReduceScatterToSequenceParallel.apply(y, group)
    return ReduceFromTensorParallel.apply(y, group)


# --8<-- [start:linears]
class ColumnParallelLinear(nn.Module):
    """y_r = x W_r^T + b_r: this rank's out_features / p outputs (rows r of W and of b, in
    nn.Linear's (out, in) layout), from the whole input. With ``enter=True`` the input passes
    through f (or the sequence all-gather) first; a caller that feeds one input to several
    column-parallel layers (q, k, v) enters once itself and passes ``enter=False``."""

    def __init__(self, full: nn.Linear, group=None, sp: bool = False, enter: bool = True):
        super().__init__()
        rank, p = _group_rank_size("ColumnParallelLinear", group)
        _split("ColumnParallelLinear", "out_features", full.out_features, p)
        self.group, self.sp, self.enter = group, sp, enter
        self.weight = nn.Parameter(full.weight.detach().chunk(p, dim=0)[rank].clone())
        self.weight.tp_dim = 0
        self.bias = None
        if full.bias is not None:
            self.bias = nn.Parameter(full.bias.detach().chunk(p, dim=0)[rank].clone())
            self.bias.tp_dim = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enter:
            x = enter_tensor_parallel(x, self.group, self.sp)
        return F.linear(x, self.weight, self.bias)          # (..., out_features / p)


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b: this rank multiplies its in_features / p slice of the input (a
    column-parallel layer's output) by columns r of W; g (or the reduce-scatter) sums the partial
    products, and the bias is added once, after the sum."""

    def __init__(self, full: nn.Linear, group=None, sp: bool = False):
        super().__init__()
        rank, p = _group_rank_size("RowParallelLinear", group)
        _split("RowParallelLinear", "in_features", full.in_features, p)
        self.group, self.sp = group, sp
        self.weight = nn.Parameter(full.weight.detach().chunk(p, dim=1)[rank].clone())
        self.weight.tp_dim = 1
        self.bias = None
        if full.bias is not None:
            self.bias = nn.Parameter(full.bias.detach().clone())
            self.bias.sequence_parallel = sp     # added on a sequence shard: a partial gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = exit_tensor_parallel(F.linear(x, self.weight), self.group, self.sp)
        return y if self.bias is None else y + self.bias
# --8<-- [end:linears]


# --8<-- [start:mlp]
class TensorParallelMLP(nn.Module):
    """down(gelu(up(x))) with ``up`` column parallel and ``down`` row parallel: gelu acts on each
    rank's slice of the hidden layer alone, so the pair needs one all-reduce forward (g, in down)
    and one backward (f, in up)."""

    def __init__(self, up: nn.Linear, down: nn.Linear, group=None, sp: bool = False):
        super().__init__()
        self.up = ColumnParallelLinear(up, group, sp)
        self.down = RowParallelLinear(down, group, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))
# --8<-- [end:mlp]


# --8<-- [start:attention]
class TensorParallelAttention(nn.Module):
    """``models.Attention`` with its heads split over the ranks: q, k and v column parallel (rank
    r's output features are heads r h/p .. (r+1) h/p - 1, whole heads since h/p is an integer),
    attention on the local heads alone, and the output projection row parallel."""

    def __init__(self, full: Attention, group=None, sp: bool = False):
        super().__init__()
        _, p = _group_rank_size("TensorParallelAttention", group)
        self.heads = _split("TensorParallelAttention", "heads", full.heads, p)   # local heads
        self.group, self.sp = group, sp
        self.q, self.k, self.v = (ColumnParallelLinear(f, group, sp, enter=False)
                                  for f in (full.q, full.k, full.v))
        self.proj = RowParallelLinear(full.proj, group, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = enter_tensor_parallel(x, self.group, self.sp)   # once for q, k and v
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        o = causal_attention(q, k, v)                        # (b, heads / p, s, head_dim)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))
# --8<-- [end:attention]


# --8<-- [start:vocab]
class VocabParallelEmbedding(nn.Module):
    """An embedding table cut by rows (the vocabulary): rank r holds tokens r V/p .. (r+1) V/p - 1,
    looks up the tokens in its range, writes zeros for the others, and g sums the ranks' lookups
    (exactly one rank contributes each token's row)."""

    def __init__(self, full: nn.Embedding, group=None):
        super().__init__()
        rank, p = _group_rank_size("VocabParallelEmbedding", group)
        rows = _split("VocabParallelEmbedding", "num_embeddings", full.num_embeddings, p)
        self.group, self.start, self.stop = group, rank * rows, (rank + 1) * rows
        self.weight = nn.Parameter(full.weight.detach().chunk(p, dim=0)[rank].clone())
        self.weight.tp_dim = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mine = (tokens >= self.start) & (tokens < self.stop)
        local = torch.where(mine, tokens - self.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1)
        return ReduceFromTensorParallel.apply(out, self.group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy per token from logits cut by the vocabulary, (..., V/p) on each rank, with
    three all-reduces of one number per token (the maximum, the softmax's denominator, the target's
    logit) instead of a gather of the (..., V) logits. The backward needs no communication: the
    gradient of rank r's logits is softmax - onehot(target) on its own slice."""

    @staticmethod
    def forward(ctx, logits, targets, group):
        rank, v = dist.get_rank(group), logits.shape[-1]
        top = logits.detach().amax(-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top.unsqueeze(-1)                   # the same shift on every rank
        exp = shifted.exp()
        denom = exp.sum(-1)
        dist.all_reduce(denom, group=group)
        local = targets - rank * v
        mine = (local >= 0) & (local < v)
        local = torch.where(mine, local, 0)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        dist.all_reduce(target, group=group)                   # only the owner's is nonzero
        ctx.save_for_backward(exp / denom.unsqueeze(-1), local, mine)
        return denom.log() - target                            # -log softmax[target]

    @staticmethod
    def backward(ctx, grad):
        softmax, local, mine = ctx.saved_tensors
        out = softmax.clone()
        out.scatter_add_(-1, local.unsqueeze(-1), -mine.unsqueeze(-1).to(out.dtype))
        return out * grad.unsqueeze(-1), None, None


def vocab_parallel_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                        group=None) -> torch.Tensor:
    """``lm_loss`` for a model whose head is cut by the vocabulary: the mean cross-entropy."""
    return VocabParallelCrossEntropy.apply(model(tokens), targets, group).mean()
# --8<-- [end:vocab]


def _sequence_scatter_hook(group):
    def hook(module, args):
        x, = args
        if x.shape[1] % dist.get_world_size(group):
            raise ValueError(f"tensor_parallel: sequence parallelism needs the sequence length "
                             f"({x.shape[1]}) divisible by the group size "
                             f"{dist.get_world_size(group)}")
        return (ScatterToSequenceParallel.apply(x, group),)
    return hook


def _sequence_gather_hook(group):
    def hook(module, args, out):
        return GatherToReplicated.apply(out, group)
    return hook


# --8<-- [start:convert]
def tensor_parallel(model: TinyTransformer, group=None, sp: bool = False,
                    vocab_parallel: bool = False) -> TinyTransformer:
    """A tensor-parallel copy of ``tiny_transformer(...)``: in every block, attention split by
    heads and the MLP by its hidden features; the embeddings, the final norm and the head stay
    replicated. With ``sp``, the blocks run on sequence shards: the input of the blocks is cut
    along the sequence (``ScatterToSequenceParallel``), the norms and residual additions act on
    the shard, and the output is gathered back before the final norm. With ``vocab_parallel``,
    the token embedding and the head are cut by the vocabulary too (Megatron's layout): the model
    returns this rank's slice of the logits, for ``vocab_parallel_loss``.

    Rank 0's parameters are broadcast first, so the ranks start from one model. The parameters
    keep their names and their order (``full_parameters`` relies on it)."""
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"tensor_parallel: expected a TinyTransformer, got {type(model).__name__}")
    _, p = _group_rank_size("tensor_parallel", group)
    for i, block in enumerate(model.blocks):           # check everything before any collective
        _split(f"tensor_parallel (block {i} attention)", "heads", block.attn.heads, p)
        _split(f"tensor_parallel (block {i} MLP)", "hidden width", block.up.out_features, p)
    if vocab_parallel:
        _split("tensor_parallel (vocabulary)", "vocab", model.embed.num_embeddings, p)
    model = copy.deepcopy(model)
    with torch.no_grad():
        for t in model.parameters():
            dist.broadcast(t, group=group, group_src=0)
    if vocab_parallel:
        model.embed = VocabParallelEmbedding(model.embed, group)
        model.head = ColumnParallelLinear(model.head, group)   # logits cut by the vocabulary
    for block in model.blocks:
        block.attn = TensorParallelAttention(block.attn, group, sp)
        mlp = TensorParallelMLP(block.up, block.down, group, sp)
        block.up, block.down = mlp.up, mlp.down         # TransformerBlock.forward is unchanged
        if sp:
            for norm in (block.norm1, block.norm2):     # they see a shard: partial gradients
                for t in norm.parameters():
                    t.sequence_parallel = True
    if sp:
        model.blocks.register_forward_pre_hook(_sequence_scatter_hook(group))
        model.blocks.register_forward_hook(_sequence_gather_hook(group))
    return model
# --8<-- [end:convert]


# --8<-- [start:sync]
def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum, over the ranks, the gradients of the parameters that saw only a sequence shard (the
    norms of the blocks, the row-parallel biases): one all-reduce of all of them, flattened."""
    grads = [t.grad for t in model.parameters()
             if getattr(t, "sequence_parallel", False) and t.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
# --8<-- [end:sync]


def full_parameters(model: nn.Module, group=None) -> list[torch.Tensor]:
    """Every parameter, the sharded ones gathered along their ``tp_dim``, in ``parameters()``
    order, on the CPU (a collective: every rank must call it)."""
    out = []
    with torch.no_grad():
        for t in model.parameters():
            dim = getattr(t, "tp_dim", None)
            if dim is None:
                out.append(t.detach().cpu().clone())
                continue
            front = t.detach().movedim(dim, 0).contiguous()
            full = front.new_empty((dist.get_world_size(group) * front.shape[0],
                                    *front.shape[1:]))
            all_gather_tensor(full, front, group=group)
            out.append(full.movedim(0, dim).contiguous().cpu())
    return out


def _agree_on_batch(name: str, tokens: torch.Tensor, group) -> None:
    """Every rank of a tensor-parallel group must feed the same batch shape. The shapes travel
    through the collectives chapter's ``ring_all_gather``, whose own check makes every rank raise
    if even their lengths differ; then every rank sees every shape and raises the same error if
    they differ (instead of entering a collective that waits for a tensor of another size)."""
    shape = torch.tensor([tokens.shape], dtype=torch.float64, device=tokens.device)  # (1, ndim)
    everyone = [tuple(int(v) for v in row) for row in ring_all_gather(shape, group).tolist()]
    if len(set(everyone)) > 1:
        raise ValueError(f"{name}: every rank of a tensor-parallel group must see the same batch "
                         "shape, got " + ", ".join(f"rank {r}: {d}"
                                                   for r, d in enumerate(everyone)))


# --8<-- [start:train]
def train_tp(rank: int, world_size: int, steps: int = 10, dtype: torch.dtype = torch.float64,
             sp: bool = False, batch: int = 4, seq_len: int = 8, lr: float = 0.1,
             seed: int = 0, heads: int = 4, vocab_parallel: bool = False) -> dict:
    """Train ``tiny_transformer(seed)`` for ``steps`` SGD steps (momentum 0.9) on the batch of
    ``batch`` sequences that step s draws from seed s. With ``world_size`` > 1 (in a process
    group) the model is ``tensor_parallel`` (with sequence parallelism if ``sp``) and every rank
    sees the whole batch (``vocab_parallel``: the embedding and the head cut by the vocabulary,
    the loss from the logits' slices); with ``world_size`` 1 (no group needed) this is the
    single-process run that it must reproduce.

    Returns ``{"loss": [...], "params": [...]}``: the loss at every step (the same on every rank)
    and the final full parameters, gathered, in the order of the model's ``parameters()``."""
    distributed = world_size > 1
    if distributed and _group_rank_size("train_tp", None) != (rank, world_size):
        raise ValueError(f"train_tp: rank={rank}, world_size={world_size} is not this process's "
                         f"place in the group, {_group_rank_size('train_tp', None)}")
    device = device_for(rank) if distributed else "cpu"
    model = tiny_transformer(seed, dtype, heads=heads).to(device)
    if distributed:
        model = tensor_parallel(model, sp=sp, vocab_parallel=vocab_parallel)
    loss_fn = vocab_parallel_loss if distributed and vocab_parallel else lm_loss
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        tokens, targets = (t.to(device) for t in tiny_batch(step, batch, seq_len))
        if distributed and step == 0:             # every step's batch has this shape
            _agree_on_batch("train_tp", tokens, None)
        opt.zero_grad()
        loss = loss_fn(model, tokens, targets)
        loss.backward()
        if distributed and sp:
            sync_sequence_parallel_grads(model)
        opt.step()
        losses.append(loss.item())
    params = full_parameters(model) if distributed else [
        t.detach().cpu().clone() for t in model.parameters()]
    return {"loss": losses, "params": params}
# --8<-- [end:train]


# --8<-- [start:comm]
def tp_communication(batch: int, seq: int, dim: int, world_size: int, dtype_bytes: int,
                     sp: bool = False, blocks: int = 1,
                     vocab_parallel: bool = False) -> dict[str, tuple[int, int]]:
    """The collectives one training step of ``tensor_parallel(tiny_transformer(...))`` issues on
    every rank: ``{name: (count, bytes each)}``, bytes in ``cost.py``'s convention (the data one
    rank holds: the whole vector of an all-reduce, the whole input of a reduce-scatter, the whole
    output of an all-gather); all-reduces of another size than an activation are listed under
    their own names ("all_reduce_grads"). One activation is a = batch * seq * dim * dtype_bytes.

    Without sp, each block: 2 all-reduces of a forward (g after attention and after the MLP) and
    2 backward (f before them). With sp, each g is a reduce-scatter and each f an all-gather, and
    their conjugates in the backward the other way round: 4 of each per block. Per model, sp adds
    the all-gather of the blocks' output (forward), that of the gradient of their input
    (backward), and one all-reduce of the gradients of the norms and row biases (6 dim values a
    block). ``vocab_parallel`` adds the embedding's g (forward) and the head's f (backward), two
    all-reduces of a, and the cross-entropy's three all-reduces of batch * seq numbers (listed
    apart, as "all_reduce_loss", their size differing)."""
    for name, v in (("batch", batch), ("seq", seq), ("dim", dim), ("world_size", world_size),
                    ("dtype_bytes", dtype_bytes), ("blocks", blocks)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"tp_communication: {name} must be an int >= 1, got {v!r}")
    if sp and seq % world_size:
        raise ValueError(f"tp_communication: seq={seq} must divide by world_size={world_size}")
    a = batch * seq * dim * dtype_bytes
    if not sp:
        out = {"all_reduce": (4 * blocks, a)}
    else:
        out = {"all_gather": (4 * blocks + 2, a), "reduce_scatter": (4 * blocks, a),
               "all_reduce_grads": (1, 6 * dim * blocks * dtype_bytes)}
    if vocab_parallel:
        count, _ = out.get("all_reduce", (0, a))
        out |= {"all_reduce": (count + 2, a), "all_reduce_loss": (3, batch * seq * dtype_bytes)}
    return out


def ring_bytes_sent(comm: dict[str, tuple[int, int]], world_size: int) -> float:
    """What each rank sends for ``comm`` with ring algorithms: (p-1)/p of n for a reduce-scatter
    or an all-gather, twice that for an all-reduce (collectives.md)."""
    share = (world_size - 1) / world_size
    return sum((2 if name.startswith("all_reduce") else 1) * share * count * n
               for name, (count, n) in comm.items())
# --8<-- [end:comm]


# --8<-- [start:activations]
def activation_bytes(seq: int, batch: int, hidden: int, heads: int, tp: int = 1,
                     sp: bool = False) -> float:
    """Bytes of activations one transformer layer stores for its backward, per rank, by
    Korthikanti et al.'s count (16-bit activations, 1-byte dropout masks, no recomputation):

        no parallelism   s b h (34 + 5 a s / h)
        tensor parallel  s b h (10 + 24 / t + 5 a s / (h t))
        + sequence par.  s b h (34 + 5 a s / h) / t

    The 10 s b h that tensor parallelism leaves whole are the norms' inputs (2 x 2 s b h), the
    dropout masks after attention and after the MLP (2 x s b h) and the inputs of q/k/v and of
    the MLP's first layer (2 x 2 s b h): sequence parallelism keeps those on a sequence shard."""
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads),
                    ("tp", tp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"activation_bytes: {name} must be an int >= 1, got {v!r}")
    sbh, quad = seq * batch * hidden, 5 * heads * seq / hidden
    if sp:
        return sbh * (34 + quad) / tp
    return sbh * (10 + 24 / tp + quad / tp)
# --8<-- [end:activations]


# --8<-- [start:dtensor]
def dtensor_parallel(model: TinyTransformer, mesh, sp: bool = False) -> TinyTransformer:
    """The same split with torch's DTensor API, on a copy of ``model``: ``ColwiseParallel`` for
    q, k, v and up, ``RowwiseParallel`` for proj and down; with ``sp``, ``SequenceParallel`` for
    the norms, the blocks' input and output laid out as sequence shards (``Shard(1)``) by
    ``PrepareModuleInput``/``PrepareModuleOutput`` on the ``blocks`` container."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if not isinstance(model, TinyTransformer):
        raise TypeError(f"dtensor_parallel: expected a TinyTransformer, got "
                        f"{type(model).__name__}")
    p = mesh.size()
    for i, block in enumerate(model.blocks):
        _split(f"dtensor_parallel (block {i} attention)", "heads", block.attn.heads, p)
        _split(f"dtensor_parallel (block {i} MLP)", "hidden width", block.up.out_features, p)
    model = copy.deepcopy(model)
    seq = Shard(1) if sp else Replicate()
    for block in model.blocks:
        plan = {"attn": PrepareModuleInput(input_layouts=(seq,),
                                           desired_input_layouts=(Replicate(),)),
                "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=seq),
                "up": ColwiseParallel(input_layouts=seq),
                "down": RowwiseParallel(output_layouts=seq)}
        if sp:
            plan |= {"norm1": SequenceParallel(use_local_output=True),
                     "norm2": SequenceParallel(use_local_output=True)}
        parallelize_module(block, mesh, plan)
        block.attn.heads //= p              # the local tensors hold heads / p heads
    if sp:
        parallelize_module(model, mesh, {
            "blocks": PrepareModuleInput(input_layouts=(Replicate(),),
                                         desired_input_layouts=(Shard(1),),
                                         use_local_output=True)})
        parallelize_module(model, mesh, {
            "blocks": PrepareModuleOutput(output_layouts=(Shard(1),),
                                          desired_output_layouts=(Replicate(),),
                                          use_local_output=True)})
    return model
# --8<-- [end:dtensor]


def train_dtensor(rank: int, world_size: int, steps: int = 10,
                  dtype: torch.dtype = torch.float64, sp: bool = False, batch: int = 4,
                  seq_len: int = 8, lr: float = 0.1, seed: int = 0) -> dict:
    """``train_tp`` with ``dtensor_parallel`` instead of ``tensor_parallel``: same steps, same
    return value (the parameters' ``full_tensor()``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    _group_rank_size("train_dtensor", None)
    device = device_for(rank)
    mesh = init_device_mesh(torch.device(device).type, (world_size,))
    model = dtensor_parallel(tiny_transformer(seed, dtype).to(device), mesh, sp=sp)
    # foreach=False: the model mixes DTensor (parallel) and plain (replicated) parameters, which the
    # multi-tensor update used by default on CUDA refuses ("mixed torch.Tensor and DTensor")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=False)
    losses = []
    for step in range(steps):
        tokens, targets = (t.to(device) for t in tiny_batch(step, batch, seq_len))
        opt.zero_grad()
        loss = lm_loss(model, tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [(t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()
              for t in model.parameters()]
    return {"loss": losses, "params": params}


def main() -> None:
    """Under torchrun: train with TP, TP+SP and DTensor, compare with one process on rank 0."""
    rank, world_size = init_from_env()
    runs = {"tp": train_tp(rank, world_size, dtype=torch.float32),
            "tp+sp": train_tp(rank, world_size, dtype=torch.float32, sp=True),
            "tp+sp+vocab": train_tp(rank, world_size, dtype=torch.float32, sp=True,
                                    vocab_parallel=True),
            "dtensor": train_dtensor(rank, world_size, dtype=torch.float32),
            "dtensor+sp": train_dtensor(rank, world_size, dtype=torch.float32, sp=True)}
    if rank == 0:
        ref = train_tp(0, 1, dtype=torch.float32)           # rank 0 alone, the whole model
        for name, run in runs.items():
            worst = max(max(abs(a - b) for a, b in zip(run["loss"], ref["loss"])),
                        max((x - y.to(x.device)).abs().max().item()
                            for x, y in zip(run["params"], ref["params"])))
            print(f"{name}: {world_size} ranks, largest difference from one process {worst:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()


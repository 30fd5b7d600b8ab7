"""Context parallelism: ring attention over a sequence split across ranks, from scratch.

Every rank holds the queries, keys and values of its shard of the positions, of shape (batch,
heads, S / p, head_dim). Attention needs every query against every key, so the key/value blocks
travel round the ring: in step s rank r holds the block of rank (r - s) mod p, computes its queries
against it while it sends that block on to rank r + 1 and receives the next from rank r - 1, and
merges the partial result into its running one by the log-sum-exp rule. After p steps every query
has met every key, and no rank ever held more than two key/value blocks.

The merge is Part 5's online softmax one level up: FlashAttention merges the blocks of keys of one
kernel, ring attention the blocks of keys of other ranks. A partial result is the pair (o, lse):
the output normalised over the keys seen so far, and the row log-sum-exp lse = m + log l of those
scores (m the running max, l the running sum of exp(s - m), in Part 5's names).

Causal attention: a block whose keys all lie after the queries is skipped, the block on the
diagonal is masked, the blocks before it are used whole. With contiguous shards rank 0 then has one
block of work and rank p - 1 has p: the **zig-zag** layout cuts the sequence into 2p chunks and
gives rank r chunks r and 2p - 1 - r, an early one and a late one, so every rank has the same work.

The backward is a second ring (``RingAttention.backward``): the key/value blocks travel again, with
their gradients dK and dV riding along; each rank adds its queries' share, and after p steps the
gradients arrive back at the rank that owns the block. dQ stays home.

``train_cp`` trains ``tiny_transformer`` with its attention replaced by ring attention, each rank
holding a shard of every sequence's positions.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.collectives import agree_same_shape
from snippets.part7.launch import device_for
from snippets.part7.models import lm_loss, tiny_batch, tiny_transformer

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


# --8<-- [start:layout]
def chunks_of(rank: int, p: int, zigzag: bool) -> list[int]:
    """The chunks of the sequence that rank ``rank`` holds, in the order it stores them.
    Contiguous: the sequence is cut into p chunks, rank r holds chunk r. Zig-zag: into 2p chunks,
    rank r holds chunk r and chunk 2p - 1 - r."""
    return [rank, 2 * p - 1 - rank] if zigzag else [rank]


def shard_sequence(x: torch.Tensor, rank: int, p: int, zigzag: bool = False,
                   dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (its chunks concatenated, a new tensor)."""
    n_chunks = 2 * p if zigzag else p
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"shard_sequence: x must be a tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("shard_sequence: x must have at least one dimension")
    if not 0 <= rank < p:
        raise ValueError(f"shard_sequence: rank must be in [0, {p}), got {rank}")
    if x.shape[dim] % n_chunks:
        layout = f"zig-zag needs 2p = {n_chunks}" if zigzag else f"contiguous needs p = {p}"
        raise ValueError(f"shard_sequence: a sequence of {x.shape[dim]} positions does not split "
                         f"into equal chunks ({layout} chunks)")
    pieces = x.chunk(n_chunks, dim)
    return torch.cat([pieces[c] for c in chunks_of(rank, p, zigzag)], dim)


def unshard_sequence(shards: list[torch.Tensor], zigzag: bool = False,
                     dim: int = -2) -> torch.Tensor:
    """The inverse of ``shard_sequence``: the whole sequence from every rank's shard."""
    p = len(shards)
    pieces: list[torch.Tensor | None] = [None] * (2 * p if zigzag else p)
    for rank, shard in enumerate(shards):
        for c, piece in zip(chunks_of(rank, p, zigzag), shard.chunk(2 if zigzag else 1, dim)):
            pieces[c] = piece
    return torch.cat(pieces, dim)
# --8<-- [end:layout]


# --8<-- [start:block]
def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a block of queries against a block of keys, over (batch, heads, rows, d):
    the output normalised over these keys alone, and each row's log-sum-exp of its scores. With
    ``diagonal`` the two blocks cover the same positions and query i sees keys j <= i."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if diagonal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    lse = scores.logsumexp(-1)                             # (batch, heads, rows)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def merge_partials(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                   lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial results over disjoint sets of keys, merged into the result over both:
    lse = log(e^lse1 + e^lse2), and each output weighted by its share e^(lse_i - lse) of the
    total. The same rescaling as the online softmax's exp(m_old - m_new), on normalised outputs."""
    lse = torch.logaddexp(lse1, lse2)
    return (o1 * torch.exp(lse1 - lse).unsqueeze(-1)
            + o2 * torch.exp(lse2 - lse).unsqueeze(-1)), lse
# --8<-- [end:block]


def _pairs(q_chunks: list[int], k_chunks: list[int], causal: bool):
    """(i, j, diagonal) for every (query chunk i, key chunk j) that has work: all of them without
    the mask; with it, only key chunks at or before the query chunk (global chunk indices)."""
    for i, a in enumerate(q_chunks):
        for j, b in enumerate(k_chunks):
            if not causal or b < a:
                yield i, j, False
            elif b == a:
                yield i, j, True


def _ring_start(send: torch.Tensor, recv: torch.Tensor, rank: int, p: int, group) -> list:
    """Post the send of ``send`` to the right neighbour and the receive of ``recv`` from the left
    one, and return at once: the caller computes while the block travels, then waits."""
    ops = [dist.P2POp(dist.isend, send, group=group, group_peer=(rank + 1) % p),
           dist.P2POp(dist.irecv, recv, group=group, group_peer=(rank - 1) % p)]
    return dist.batch_isend_irecv(ops)


def _pack(*tensors: torch.Tensor) -> torch.Tensor:
    """Several tensors of one shape stacked into one buffer: one message per ring step."""
    return torch.stack(tensors).contiguous()


# --8<-- [start:ring_forward]
def ring_attention_forward(q, k, v, causal, zigzag, group=None):
    """One rank's forward: (o, lse) of its queries against every rank's keys. The key/value block
    of rank (rank - step) mod p is used in step ``step``, while the next one is on its way."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    n_chunks = len(chunks_of(rank, p, zigzag))
    q_parts = q.chunk(n_chunks, -2)
    o: list = [None] * n_chunks
    lse: list = [None] * n_chunks
    kv = _pack(k, v)
    for step in range(p):
        owner = (rank - step) % p
        if step < p - 1:                                  # the next block starts travelling
            incoming = torch.empty_like(kv)
            works = _ring_start(kv, incoming, rank, p, group)
        k_parts, v_parts = kv[0].chunk(n_chunks, -2), kv[1].chunk(n_chunks, -2)
        for i, j, diagonal in _pairs(chunks_of(rank, p, zigzag), chunks_of(owner, p, zigzag),
                                     causal):
            o_b, lse_b = block_attention(q_parts[i], k_parts[j], v_parts[j], diagonal)
            if o[i] is None:
                o[i], lse[i] = o_b, lse_b
            else:
                o[i], lse[i] = merge_partials(o[i], lse[i], o_b, lse_b)
        if step < p - 1:
            for work in works:
                work.wait()
            kv = incoming
    return torch.cat(o, -2), torch.cat(lse, -1)
# --8<-- [end:ring_forward]


# --8<-- [start:ring_backward]
def ring_attention_backward(q, k, v, o, lse, do, causal, zigzag, group=None):
    """One rank's backward, FlashAttention's formulas on every (query, key) block pair: with
    P = exp(S - lse) recomputed and delta = rowsum(dO * O), dV += P^T dO, dS = P * (dO V^T -
    delta), dQ += dS K scale, dK += dS^T Q scale. K, V, dK and dV travel together; after p steps
    of work and p sends, each block's dK and dV are home, summed over every rank's queries."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    n_chunks = len(chunks_of(rank, p, zigzag))
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (do * o).sum(-1)
    dq = torch.zeros_like(q)
    q_parts, do_parts = q.chunk(n_chunks, -2), do.chunk(n_chunks, -2)
    dq_parts, lse_parts = dq.chunk(n_chunks, -2), lse.chunk(n_chunks, -1)
    delta_parts = delta.chunk(n_chunks, -1)
    block = _pack(k, v, torch.zeros_like(k), torch.zeros_like(v))    # k, v, dk, dv
    for step in range(p):
        owner = (rank - step) % p
        # k and v go on to the next rank now; dk and dv once this rank has added its share
        kv_next = torch.empty_like(block[:2])
        works = _ring_start(block[:2].contiguous(), kv_next, rank, p, group) \
            if step < p - 1 else []
        k_parts, v_parts = block[0].chunk(n_chunks, -2), block[1].chunk(n_chunks, -2)
        dk_parts, dv_parts = block[2].chunk(n_chunks, -2), block[3].chunk(n_chunks, -2)
        for i, j, diagonal in _pairs(chunks_of(rank, p, zigzag), chunks_of(owner, p, zigzag),
                                     causal):
            scores = q_parts[i] @ k_parts[j].transpose(-1, -2) * scale
            if diagonal:
                n = scores.shape[-1]
                future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            prob = torch.exp(scores - lse_parts[i].unsqueeze(-1))
            dv_parts[j].add_(prob.transpose(-1, -2) @ do_parts[i])
            ds = prob * (do_parts[i] @ v_parts[j].transpose(-1, -2)
                         - delta_parts[i].unsqueeze(-1))
            dq_parts[i].add_(ds @ k_parts[j] * scale)
            dk_parts[j].add_(ds.transpose(-1, -2) @ q_parts[i] * scale)
        if p == 1:                                         # nothing travels: the block is home
            return dq, block[2], block[3]
        grads_next = torch.empty_like(block[2:])          # dk, dv of the block arriving next
        grad_works = _ring_start(block[2:].contiguous(), grads_next, rank, p, group)
        for work in works + grad_works:
            work.wait()
        if step < p - 1:
            block = torch.cat([kv_next, grads_next])
        else:                          # the last send brought this rank's own dk, dv home
            return dq, grads_next[0], grads_next[1]
    raise AssertionError("unreachable")
# --8<-- [end:ring_backward]


# --8<-- [start:autograd]
class RingAttention(torch.autograd.Function):
    """Ring attention with its ring backward: saves q, k, v, o and the log-sum-exp (one number
    per query row) and no score matrix, as FlashAttention does."""

    @staticmethod
    def forward(ctx, q, k, v, causal, zigzag, group):
        o, lse = ring_attention_forward(q, k, v, causal, zigzag, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.zigzag, ctx.group = causal, zigzag, group
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_attention_backward(q, k, v, o, lse, do.contiguous(), ctx.causal,
                                             ctx.zigzag, ctx.group)
        return dq, dk, dv, None, None, None
# --8<-- [end:autograd]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   zigzag: bool = False, group=None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), causal mask if ``causal``) v where q, k and v, of shape (batch,
    heads, S / p, head_dim), are this rank's shard of the positions (``shard_sequence``, with the
    same ``zigzag``). Every rank of ``group`` calls it; returns this rank's shard of the output,
    differentiable (the backward is a second ring). Refuses, on every rank, shards whose shapes or
    dtypes differ between ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring_attention: no process group: call dist.init_process_group first "
                           "(or run under snippets.part7.launch.run_world)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ring_attention: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"ring_attention: {name} must be floating point, got {t.dtype}")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError("ring_attention: q, k and v must be (batch, heads, seq, head_dim) of "
                         f"one shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not k.dtype == v.dtype == q.dtype:
        raise TypeError(f"ring_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if zigzag and q.shape[-2] % 2:
        raise ValueError(f"ring_attention: a zig-zag shard holds two equal chunks, got "
                         f"{q.shape[-2]} positions")
    agree_same_shape("ring_attention", q, group)     # every rank, the same shard shape
    return RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, zigzag,
                               group)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence in one process: the reference (o, lse) that ring attention must give."""
    return block_attention(q, k, v, diagonal=causal)


# --------------------------------------------------------------------------------------------------
# Training tiny_transformer with its sequence split over the ranks
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cp_model]
def _ring_self_attention(attn: nn.Module, x: torch.Tensor, zigzag: bool, group) -> torch.Tensor:
    """``models.Attention.forward`` with ring attention in place of ``causal_attention``: the
    projections act on this rank's positions alone, only the attention needs the others."""
    q, k, v = (attn.split_heads(f(x)) for f in (attn.q, attn.k, attn.v))
    o = ring_attention(q, k, v, causal=True, zigzag=zigzag, group=group)
    b, h, s, hd = o.shape
    return attn.proj(o.transpose(1, 2).reshape(b, s, h * hd))


def context_parallel(model: nn.Module, zigzag: bool, group=None) -> nn.Module:
    """Make every block of a ``TinyTransformer`` attend with ring attention (in place; returns
    the model). Its input is then this rank's shard of the positions: use ``cp_forward``."""
    for block in model.blocks:
        block.attn.forward = functools.partial(_ring_self_attention, block.attn,
                                               zigzag=zigzag, group=group)
    return model


def cp_forward(model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``TinyTransformer.forward`` on a shard of the positions: the position embedding is looked
    up at the shard's own (global) positions, not at 0 .. S/p - 1."""
    x = model.embed(tokens) + model.pos(positions)
    return model.head(model.norm(model.blocks(x)))
# --8<-- [end:cp_model]


# --8<-- [start:train_cp]
def train_cp(rank: int, world_size: int, steps: int = 10, dtype: torch.dtype = torch.float64,
             batch: int = 2, seq_len: int = 16, zigzag: bool = True, lr: float = 0.05,
             seed: int = 0) -> dict:
    """Train ``tiny_transformer(seed)`` for ``steps`` SGD steps (momentum 0.9) on step s's batch
    ``tiny_batch(s, batch, seq_len)``. With a process group, every rank takes every sequence but
    only its shard of the positions, attends by ring attention, and its loss is the sum of its
    tokens' losses over the global token count, so that the ranks' losses add up to the mean;
    the replicated parameters' gradients are summed over the ranks. Without one, this is the
    one-process run on whole sequences that context parallelism must reproduce.

    Returns ``{"loss": [...], "params": [...]}``: the global mean loss at every step and the final
    parameters (on the CPU)."""
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and seq_len % (2 * world_size if zigzag else world_size):
        raise ValueError(f"train_cp: seq_len={seq_len} must split into "
                         f"{2 * world_size if zigzag else world_size} equal chunks")
    device = device_for(rank) if distributed else "cpu"
    model = tiny_transformer(seed, dtype).to(device)
    if not 0 < seq_len <= model.pos.num_embeddings:
        raise ValueError(f"train_cp: seq_len={seq_len} must be in [1, "
                         f"{model.pos.num_embeddings}] (the model's position embeddings)")
    if distributed:
        context_parallel(model, zigzag)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    positions = shard_sequence(torch.arange(seq_len), rank, world_size, zigzag, dim=0) \
        if distributed else None
    losses = []
    for step in range(steps):
        tokens, targets = (t.to(device) for t in tiny_batch(step, batch, seq_len))
        opt.zero_grad()
        if distributed:
            tokens, targets = (shard_sequence(t, rank, world_size, zigzag, dim=1)
                               for t in (tokens, targets))
            logits = cp_forward(model, tokens, positions.to(device))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   reduction="sum") / (batch * seq_len)
            loss.backward()                   # the ring's backward sends dK, dV home
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)             # every rank used every weight: sum the shares
            for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(summed.view_as(g))
            total = loss.detach().clone()
            dist.all_reduce(total)
        else:
            loss = lm_loss(model, tokens, targets)
            loss.backward()
            total = loss.detach()
        opt.step()
        losses.append(total.item())
    return {"loss": losses, "params": [p.detach().cpu() for p in model.parameters()]}
# --8<-- [end:train_cp]


def work_per_rank(p: int, zigzag: bool) -> list[int]:
    """Causal attention: the number of (query chunk, key chunk) blocks each rank computes over the
    p steps of the ring, counting a diagonal block as one (it costs about half of a full one)."""
    return [sum(1 for owner in range(p)
                for _ in _pairs(chunks_of(r, p, zigzag), chunks_of(owner, p, zigzag), True))
            for r in range(p)]


def check_ring_attention(rank: int, world_size: int, dtype: torch.dtype = torch.float64,
                         seq_len: int = 32) -> dict[tuple[bool, bool], dict[str, float]]:
    """Every layout (causal or not, contiguous or zig-zag) against full attention in one process,
    forward and backward, on random (2, 3, seq_len, 8) inputs. Returns, per (causal, zigzag), the
    largest difference of o, dq, dk and dv on this rank's shard, relative to the reference's
    largest element where that exceeds 1 (dV sums seq_len rows of P dO: its elements reach
    several units). Made for ``run_world`` and ``torchrun``."""
    device = device_for(rank)
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(2, 3, seq_len, 8, generator=g, dtype=dtype) for _ in range(4))
    errors = {}
    for causal in (False, True):
        for zigzag in (False, True):
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            o_ref = attention_with_lse(*full, causal=causal)[0]
            o_ref.backward(do)
            mine = [shard_sequence(t, rank, world_size, zigzag).to(device).requires_grad_()
                    for t in (q, k, v)]
            o = ring_attention(*mine, causal=causal, zigzag=zigzag)
            o.backward(shard_sequence(do, rank, world_size, zigzag).to(device))
            got = [o, *(m.grad for m in mine)]
            want = [shard_sequence(t.detach(), rank, world_size, zigzag)
                    for t in (o_ref, *(f.grad for f in full))]
            errors[causal, zigzag] = {
                name: float((a.detach().cpu() - b).abs().max()) / max(1.0, float(b.abs().max()))
                for name, a, b in zip(("o", "dq", "dk", "dv"), got, want)}
    return errors


def main() -> None:
    """``torchrun --nproc-per-node P -m snippets.part7.context_parallel``: ring attention in every
    layout against full attention, on the ranks given; rank 0 prints the largest differences."""
    from snippets.part7.launch import init_from_env

    rank, world_size = init_from_env()
    errors = check_ring_attention(rank, world_size, seq_len=64 * world_size)
    if rank == 0:
        for (causal, zigzag), errs in errors.items():
            print(f"causal={causal!s:5} zigzag={zigzag!s:5} "
                  + " ".join(f"{name} {err:.1e}" for name, err in errs.items()))
    dist.destroy_process_group()
    if max(max(errs.values()) for errs in errors.values()) > 1e-12:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Two tiny language models (an MLP-only one, and a transformer with causal attention), their
data, and a training loop that runs on one process or on several with ``BucketedDDP``: for the
tests, the chapters and the exercises of Part 7.

The model has the parts whose gradients a data-parallel wrapper must handle: an embedding (a
gradient that is mostly rows of zeros), LayerNorms (small vectors), the matrices of an MLP, and a
head. It is small enough that a step takes no time on a CPU, so that a test can compare ten steps
on several ranks with ten steps in one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.ddp import BucketedDDP
from snippets.part7.launch import device_for

VOCAB = 64
DIM = 32


class Block(nn.Module):
    """Pre-norm MLP block: x + W2 gelu(W1 LayerNorm(x))."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding, ``blocks`` MLP blocks, a final LayerNorm and a head onto the vocabulary."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, blocks: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(blocks)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))   # (batch, seq, vocab)


def tiny_model(seed: int, dtype: torch.dtype = torch.float32, vocab: int = VOCAB,
               dim: int = DIM, blocks: int = 2) -> TinyLM:
    """A ``TinyLM`` whose weights depend only on ``seed`` (torch's global generator is left as it
    was), in float32 or float64."""
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"tiny_model: dtype must be float32 or float64, got {dtype}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(vocab, dim, blocks)
    return model.to(dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v projections (so that tensor
    parallelism can split each by heads) and an output projection."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"Attention: dim={dim} must split into {heads} heads")
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)."""
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(f(x)) for f in (self.q, self.k, self.v))
        o = causal_attention(q, k, v)
        b, h, s, hd = o.shape
        return self.proj(o.transpose(1, 2).reshape(b, s, h * hd))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v over (batch, heads, seq, head_dim), written out
    so that every rank of every parallel layout computes it with the same operations."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = q.shape[-2]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + Attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token and position embeddings, ``blocks`` transformer blocks, a final LayerNorm and a
    head: the small GPT-like model that Part 7's tensor, pipeline and context parallelism must
    train exactly as one process does."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, heads: int = 4, blocks: int = 2,
                 max_seq: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads) for _ in range(blocks)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[-1] > self.pos.num_embeddings:
            raise ValueError(f"TinyTransformer: sequence of {tokens.shape[-1]} tokens is longer "
                             f"than max_seq={self.pos.num_embeddings}")
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[-1], device=tokens.device))
        return self.head(self.norm(self.blocks(x)))   # (batch, seq, vocab)


def tiny_transformer(seed: int, dtype: torch.dtype = torch.float32, vocab: int = VOCAB,
                     dim: int = DIM, heads: int = 4, blocks: int = 2,
                     max_seq: int = 64) -> TinyTransformer:
    """A ``TinyTransformer`` whose weights depend only on ``seed`` (torch's global generator is
    left as it was), in float32 or float64."""
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"tiny_transformer: dtype must be float32 or float64, got {dtype}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformer(vocab, dim, heads, blocks, max_seq)
    return model.to(dtype)


def tiny_batch(seed: int, batch: int, seq_len: int = 16,
               vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets) of shape (batch, seq_len), drawn from ``seed``: random tokens, and as
    targets the tokens shifted by one (a next-token task on random text)."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return text[:, :-1], text[:, 1:]


def lm_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over every token of the batch."""
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_tiny(rank: int, world_size: int, steps: int = 3, dtype: torch.dtype = torch.float64,
               global_batch: int = 8, seq_len: int = 8, bucket_bytes: int = 2**14,
               lr: float = 0.1, seed: int = 0) -> dict:
    """Train ``tiny_model(seed)`` for ``steps`` SGD steps (momentum 0.9). Step s draws a global
    batch of ``global_batch`` sequences from seed s; rank ``rank`` takes its shard (``tensor_split``
    into ``world_size`` equal shards) and the mean loss over it. When a process group is running
    the model is wrapped in ``BucketedDDP``; without one (rank 0 of 1) this is the one-process run
    on the whole batch that data parallelism must reproduce.

    Returns ``{"loss": [...], "params": [...], "log": [...]}``: the mean loss over the whole global
    batch at every step (the ranks' losses averaged), the final parameters (on the CPU) and
    ``BucketedDDP.log`` of the last backward (empty without a process group).
    """
    if global_batch % world_size:
        raise ValueError(f"train_tiny: global_batch={global_batch} must split into {world_size} "
                         "equal shards (unequal shards would weigh their examples unequally)")
    distributed = dist.is_available() and dist.is_initialized()
    device = device_for(rank) if distributed else "cpu"
    model = tiny_model(seed, dtype).to(device)
    wrapped = BucketedDDP(model, bucket_bytes=bucket_bytes) if distributed else model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        tokens, targets = tiny_batch(step, global_batch, seq_len)
        tokens = tokens.tensor_split(world_size)[rank].to(device)
        targets = targets.tensor_split(world_size)[rank].to(device)
        opt.zero_grad()
        loss = lm_loss(wrapped, tokens, targets)
        loss.backward()                   # BucketedDDP averages the gradients over the ranks
        opt.step()
        mean = loss.detach() / world_size
        if distributed:
            dist.all_reduce(mean)         # the ranks' mean losses, averaged: the global mean
        losses.append(mean.item())
    return {"loss": losses, "params": [p.detach().cpu() for p in model.parameters()],
            "log": list(wrapped.log) if distributed else []}

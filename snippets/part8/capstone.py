"""The capstone: a Llama-style decoder built from the book's kernels, with a prefill and a paged
decode loop.

This is the one module meant to stand on the whole book: it imports Part 5's kernels (RMSNorm,
RoPE, SwiGLU, FlashAttention) and Part 8's paged cache and decode attention, an exception the
import rule (tests/test_import_rule.py, ``CAPSTONE``) grants to this module only.

The model (Llama 3's layout, random weights from a seed, nothing downloaded):

    x = embed[tokens]
    for each of n_layers blocks:
        h = rmsnorm(x) ; q, k, v = h Wq, h Wk, h Wv ; q, k = rope(q, k)
        x = x + attention(q, k, v) Wo       (grouped-query: n_heads / n_kv_heads per kv head)
        h = rmsnorm(x) ; x = x + swiglu(h Wg, h Wu) Wd
    logits = rmsnorm(x) W_lm

Two backends run the same weights: ``"torch"`` (the PyTorch references of the ops) and ``"book"``
(the kernels): Part 5's ``rmsnorm_triton``, ``rope_triton``, ``swiglu_triton`` and
``attention_triton`` (causal, for the prompt), Part 8's paged decode attention
(``paged_attention_split``: one new token per sequence, through the block tables). The matrix
products are cuBLAS's in both (``@``): the book's kernels that could replace them (Part 4's
matmul, Part 8's int4 GEMM for quantised weights) are a next step, not taken here.

``generate`` prefills a batch of prompts of one length, then decodes token by token with one
:class:`~snippets.part8.kv_cache.PagedKVCache` per layer (the layers allocate blocks in lockstep,
so their block tables are equal and one copy serves them all), greedily or by seeded sampling.
``profile_decode`` times each component of a decode step (CUDA events on a GPU; on a CPU the same
structure with a wall clock, for the tests only).
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from snippets._checks import check_int, check_scalar, refuse_grad, triton_interpreting
from snippets.common.baselines import compiled, needs_gpu
from snippets.part5 import flash_attention as fa
from snippets.part5 import rmsnorm as rn
from snippets.part5 import rope as rp
from snippets.part5 import swiglu as sw
from snippets.part8 import decode_attention as da
from snippets.part8 import decode_model as dm
from snippets.part8.kv_cache import ContiguousKVCache, OutOfBlocks, PagedKVCache
from snippets.registry import Impl, Op, register

BACKENDS = ("torch", "book")
CACHES = ("paged", "contiguous")
EPS = 1e-6          # Llama's RMSNorm epsilon, as Part 5's kernel uses
BLOCK_SIZE = 16     # tokens per cache block: vLLM's default page, as in decode_attention.py


# --8<-- [start:config]
@dataclass(frozen=True)
class Config:
    """The sizes of a Llama-style decoder. ``head_dim = dim // n_heads``; every ``n_heads /
    n_kv_heads`` query heads share one kv head (grouped-query attention)."""

    vocab: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq: int
    rope_base: float = rp.BASE

    def __post_init__(self):
        for f in fields(self):
            if f.name != "rope_base":
                check_int(f"Config: {f.name}", getattr(self, f.name), 1)
        if not check_scalar("Config: rope_base", self.rope_base) > 1:
            raise ValueError(f"Config: rope_base must be > 1, got {self.rope_base}")
        if self.dim % self.n_heads:
            raise ValueError(f"Config: dim ({self.dim}) must be a multiple of n_heads "
                             f"({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Config: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Config: head_dim = dim / n_heads = {self.head_dim} must be even "
                             "(RoPE rotates pairs)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def n_params(self) -> int:
        """Weights: embedding and LM head (untied), per layer the four attention projections,
        the three MLP matrices and two norm gains, and the final norm."""
        kv = self.n_kv_heads * self.head_dim
        layer = 2 * self.dim * self.dim + 2 * self.dim * kv + 3 * self.dim * self.ffn_dim
        return 2 * self.vocab * self.dim + self.n_layers * (layer + 2 * self.dim) + self.dim


TINY = Config(vocab=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq=64)
SMALL = Config(vocab=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048,
               max_seq=2048)                                     # about 125M parameters
LLAMA_1B = Config(vocab=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                  max_seq=8192)                                  # Llama 3.2 1B's shapes
LLAMA_8B = Config(vocab=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                  max_seq=8192)                                  # Llama 3 8B's shapes
CONFIGS = {"tiny": TINY, "small": SMALL, "llama_1b": LLAMA_1B, "llama_8b": LLAMA_8B}
# --8<-- [end:config]


# --8<-- [start:weights]
class Llama(torch.nn.Module):
    """Random weights from ``seed``: projections with std 1/sqrt(fan_in) (activations stay of
    order one through the blocks), embeddings with std 1, norm gains near one. Drawn in float32
    on the CPU, so the same seed gives the same model on every device and in every dtype;
    ``draw_on_device`` draws them where they will live instead (an 8B model in seconds rather
    than minutes, for a benchmark; the values then depend on that device's generator)."""

    def __init__(self, cfg: Config, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", draw_on_device: bool = False) -> None:
        super().__init__()
        if not isinstance(cfg, Config):
            raise TypeError(f"Llama: cfg must be a Config, got {type(cfg).__name__}")
        check_int("Llama: seed", seed, 0)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"Llama: dtype must be float32, float16 or bfloat16, got {dtype}")
        if not isinstance(draw_on_device, bool):
            raise TypeError(f"Llama: draw_on_device must be a bool, got {draw_on_device!r}")
        self.cfg = cfg
        gen = torch.Generator(device if draw_on_device else "cpu").manual_seed(seed)

        def param(*shape, std=None, gain=False):
            t = torch.randn(*shape, generator=gen, device=gen.device)
            t = 1.0 + 0.1 * t if gain else t * (std if std else 1 / math.sqrt(shape[-1]))
            return torch.nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False)

        d, kv = cfg.dim, cfg.n_kv_heads * cfg.head_dim
        self.embed = param(cfg.vocab, d, std=1.0)
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg.n_layers):
            layer = torch.nn.Module()
            layer.attn_norm, layer.mlp_norm = param(d, gain=True), param(d, gain=True)
            layer.wq, layer.wk, layer.wv = param(d, d), param(kv, d), param(kv, d)
            layer.wo = param(d, d)
            layer.wg, layer.wu = param(cfg.ffn_dim, d), param(cfg.ffn_dim, d)
            layer.wd = param(d, cfg.ffn_dim)
            self.layers.append(layer)
        self.norm = param(d, gain=True)
        self.lm_head = param(cfg.vocab, d)
        cos, sin = rp.rope_tables(cfg.max_seq, cfg.head_dim, dtype=dtype, device=device,
                                  base=cfg.rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, S, vocab) of a whole sequence, no cache, torch backend: what ONNX exports
        and what the cached paths are checked against."""
        return _prefill(self, tokens, OPS["torch"], None)
# --8<-- [end:weights]


# --------------------------------------------------------------------------------------------------
# The ops of each backend
# --------------------------------------------------------------------------------------------------

# --8<-- [start:attention_ref]
def causal_gqa_attention(q, k, v):
    """q (B, H, S, D), k and v (B, Hkv, S, D): softmax(q k^T / sqrt(D), causal) v, each kv head
    repeated for its H / Hkv query heads. Plain matrix products and a mask: the torch backend's
    prefill attention, and a graph ONNX can export."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
# --8<-- [end:attention_ref]


# --8<-- [start:backends]
# The book's decode attention is the split-KV version with its default chunk count (one chunk, the
# single-launch kernel, when the batch fills the GPU). It checks shapes on every call; the checks of
# the tables' contents (which read them back from the GPU: a synchronisation) run once a step in
# decode_step, for all layers, which share the tables.
def _book_prefill_attention(q, k, v):
    """Part 5's FlashAttention (causal). It has no grouped-query path, so each kv head is repeated
    for its query heads first: a copy of K and V the size of the prompt's (an exercise)."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1).contiguous()
    v = v.repeat_interleave(g, dim=1).contiguous()
    return fa.attention_triton(q.contiguous(), k, v, causal=True)


OPS = {   # backend -> the five ops a model needs besides the matrix products
    "torch": {"norm": rn.rmsnorm_ref, "rope": rp.rope_ref, "glu": sw.swiglu_ref,
              "prefill_attention": causal_gqa_attention,
              "decode_attention": da.paged_attention_ref},
    "book": {"norm": rn.rmsnorm_triton, "rope": rp.rope_triton, "glu": sw.swiglu_triton,
             "prefill_attention": _book_prefill_attention,
             "decode_attention": da.paged_attention_split},
}
# --8<-- [end:backends]


def _check_backend(name: str, model: Llama, backend: str) -> dict:
    if not isinstance(model, Llama):
        raise TypeError(f"{name}: model must be a Llama, got {type(model).__name__}")
    return _backend_ops(name, model, backend)


def _backend_ops(name: str, model: Llama, backend: str) -> dict:
    """_check_backend less the model's class: the backend's name and, for the book's kernels,
    the head_dim and the device; the backend's ops."""
    if backend not in BACKENDS:
        raise ValueError(f"{name}: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "book":
        d = model.cfg.head_dim
        if d not in fa.HEAD_DIMS:
            raise ValueError(f"{name}: the book backend needs head_dim in {fa.HEAD_DIMS} "
                             f"(FlashAttention's), got {d}")
        want = "cpu" if triton_interpreting() else "cuda"
        if model.embed.device.type != want:
            raise ValueError(f"{name}: the book backend runs its kernels on {want} here, but the "
                             f"model is on {model.embed.device}")
    return OPS[backend]


def _check_tokens(name: str, model: Llama, tokens: torch.Tensor, dims: int) -> None:
    _check_token_tensor(name, model, tokens, dims)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.vocab:
        raise ValueError(f"{name}: token ids must be in [0, {model.cfg.vocab}), got [{lo}, {hi}]")


def _check_token_tensor(name: str, model: Llama, tokens: torch.Tensor, dims: int) -> None:
    """_check_tokens less the ids' range: type, shape and device only (no read-back)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
        raise TypeError(f"{name}: tokens must be an int64 tensor, got "
                        f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.dim() != dims or tokens.numel() == 0:
        raise ValueError(f"{name}: tokens must be a non-empty {dims}-D tensor, got shape "
                         f"{tuple(tokens.shape)}")
    if tokens.device != model.embed.device:
        raise ValueError(f"{name}: tokens are on {tokens.device}, the model on "
                         f"{model.embed.device}")


# --------------------------------------------------------------------------------------------------
# The cache of a whole model
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cache]
class ModelCache:
    """One KV cache per layer, ``"paged"`` (Part 8's PagedKVCache, read by decode attention through
    block tables) or ``"contiguous"`` (ContiguousKVCache, a slot of ``max_len`` tokens per
    sequence; the torch backend only, as the check that paging changes nothing). Sequences are
    0 .. B-1; room for ``max_len`` tokens each (the model's max_seq unless given)."""

    def __init__(self, model: Llama, batch: int, kind: str = "paged",
                 max_len: int | None = None) -> None:
        if kind not in CACHES:
            raise ValueError(f"ModelCache: kind must be one of {CACHES}, got {kind!r}")
        cfg, w = model.cfg, model.embed
        self.kind, self.seqs = kind, list(range(check_int("ModelCache: batch", batch, 1)))
        max_len = cfg.max_seq if max_len is None else check_int("ModelCache: max_len", max_len, 1)
        args = (cfg.n_kv_heads, cfg.head_dim)
        if kind == "paged":
            per_seq = -(-max_len // BLOCK_SIZE)
            self.layers = [PagedKVCache(batch * per_seq, BLOCK_SIZE, *args, per_seq,
                                        dtype=w.dtype, device=w.device)
                           for _ in range(cfg.n_layers)]
        else:
            self.layers = [ContiguousKVCache(batch, max_len, *args, dtype=w.dtype,
                                             device=w.device) for _ in range(cfg.n_layers)]
        for c in self.layers:
            for s in self.seqs:
                c.add_sequence(s)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """K and V of new tokens, each (B, T, Hkv, D), after each sequence's last: the blocks and
        slots are found on the host (Python), then the whole batch is written with one indexed
        copy for K and one for V, not one call of ``PagedKVCache.append`` per token (which a
        4096-token prompt of 64 sequences would make 262144 times a layer). The bookkeeping is
        PagedKVCache's own: its allocator, block tables and lengths."""
        c, t = self.layers[layer], k.shape[1]
        if self.kind == "contiguous":
            for b in self.seqs:
                n = c.length[b]
                if n + t > c.max_len:
                    raise ValueError(f"ModelCache.append: sequence {b} would pass max_len "
                                     f"{c.max_len}")
                c.k[c.slot[b], n:n + t], c.v[c.slot[b], n:n + t] = k[b], v[b]
                c.length[b] = n + t
            return
        for b in self.seqs:                          # every check before any change
            self._check_room(c, b, t)
        if sum(self._blocks_needed(c, b, t) for b in self.seqs) > c.allocator.num_free:
            raise OutOfBlocks(f"ModelCache.append: not enough free blocks for {t} more tokens "
                              f"of {len(self.seqs)} sequences ({c.allocator.num_free} free)")
        rows = torch.cat([self._reserve(c, b, t) for b in self.seqs]).to(c.k.device)
        c.k.view(-1, *c.k.shape[2:])[rows] = k.reshape(-1, *k.shape[2:])
        c.v.view(-1, *c.v.shape[2:])[rows] = v.reshape(-1, *v.shape[2:])

    @staticmethod
    def _blocks_needed(c: PagedKVCache, seq: int, t: int) -> int:
        return -(-(c.length[seq] + t) // c.block_size) - len(c.tables[seq])

    @classmethod
    def _check_room(cls, c: PagedKVCache, seq: int, t: int) -> None:
        """Room in ``seq``'s table for ``t`` more tokens, and a last block of its own (the capstone
        never forks, so no block it writes is shared; checked)."""
        table = c.tables[seq]
        if len(table) + cls._blocks_needed(c, seq, t) > c.max_blocks_per_seq:
            raise ValueError(f"ModelCache.append: sequence {seq} would pass its "
                             f"{c.max_blocks_per_seq} blocks of {c.block_size} tokens")
        if c.length[seq] % c.block_size and c.allocator.refcount(table[-1]) > 1:
            raise ValueError(f"ModelCache.append: sequence {seq}'s last block is shared")

    @classmethod
    def _reserve(cls, c: PagedKVCache, seq: int, t: int) -> torch.Tensor:
        """New blocks from the allocator for ``t`` more tokens of ``seq`` (checked before), the new
        length; returns the tokens' rows in the flattened (blocks x block_size) storage."""
        n, table, bs = c.length[seq], c.tables[seq], c.block_size
        table += [c.allocator.allocate() for _ in range(cls._blocks_needed(c, seq, t))]
        c.length[seq] = n + t
        pos = torch.arange(n, n + t)
        return torch.tensor(table)[pos // bs] * bs + pos % bs

    def tables(self):
        """(block_tables, seq_lens) of the batch; every layer's tables are layer 0's."""
        return self.layers[0].block_tables(self.seqs)

    @property
    def length(self) -> int:
        return self.layers[0].length[0]
# --8<-- [end:cache]


# --------------------------------------------------------------------------------------------------
# Prefill and decode
# --------------------------------------------------------------------------------------------------

def _null(name: str):
    return contextlib.nullcontext()


# --8<-- [start:prefill]
def prefill(model: Llama, tokens: torch.Tensor, backend: str = "torch",
            cache: ModelCache | None = None,
            last_only: bool = False) -> tuple[torch.Tensor, ModelCache | None]:
    """The prompt ``tokens`` (B, S) in one pass: logits (B, S, vocab), or (B, 1, vocab) of the
    last position if ``last_only`` (all generation needs: B x S x vocab logits of a long prompt
    can outweigh the model), and each layer's K and V (after RoPE) written to ``cache`` if one is
    given. Attention is causal over the prompt."""
    ops = _check_backend("prefill", model, backend)
    _check_prompt("prefill", model, tokens)
    if not isinstance(last_only, bool):
        raise TypeError(f"prefill: last_only must be a bool, got {last_only!r}")
    return _prefill(model, tokens, ops, cache, last_only), cache


def _check_prompt(name: str, model: Llama, tokens: torch.Tensor, ids: bool = True) -> None:
    """A (B, S) prompt of int64 ids on the model's device, S <= max_seq; ``ids`` also checks each
    id is in the vocabulary (a read-back from the device, which a timed call leaves out)."""
    if ids:
        _check_tokens(name, model, tokens, 2)
    else:
        _check_token_tensor(name, model, tokens, 2)
    if tokens.shape[1] > model.cfg.max_seq:
        raise ValueError(f"{name}: prompt of {tokens.shape[1]} tokens exceeds max_seq "
                         f"{model.cfg.max_seq}")


def _prefill(model: Llama, tokens: torch.Tensor, ops: dict, cache: ModelCache | None,
             last_only: bool = False):
    """prefill on checked inputs: the logits."""
    cfg = model.cfg
    b, s = tokens.shape
    h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cos, sin = model.cos[:s], model.sin[:s]
    x = model.embed[tokens]                                              # (B, S, dim)
    for i, layer in enumerate(model.layers):
        a = ops["norm"](x, layer.attn_norm)
        q = (a @ layer.wq.T).view(b, s, h, d)
        k = (a @ layer.wk.T).view(b, s, hkv, d)
        v = (a @ layer.wv.T).view(b, s, hkv, d)
        q, k = ops["rope"](q, k, cos, sin)                               # (B, S, heads, D)
        if cache is not None:
            cache.append(i, k, v)
        o = ops["prefill_attention"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + o.transpose(1, 2).reshape(b, s, h * d) @ layer.wo.T
        m = ops["norm"](x, layer.mlp_norm)
        x = x + ops["glu"](m @ layer.wg.T, m @ layer.wu.T) @ layer.wd.T
    if last_only:
        x = x[:, -1:].contiguous()
    return ops["norm"](x, model.norm) @ model.lm_head.T
# --8<-- [end:prefill]


# --8<-- [start:decode]
def decode_step(model: Llama, tokens: torch.Tensor, cache: ModelCache, backend: str = "torch",
                timer: Callable = _null) -> torch.Tensor:
    """One new token per sequence, ``tokens`` (B,), at position ``cache.length``: logits (B, vocab).
    Its K and V join the cache; attention reads the whole cache through the block tables.
    ``timer(name)`` wraps each component (see :func:`profile_decode`)."""
    ops = _check_backend("decode_step", model, backend)
    _check_tokens("decode_step", model, tokens, 1)
    if not isinstance(cache, ModelCache) or len(cache.seqs) != tokens.shape[0]:
        raise ValueError(f"decode_step: cache must be a ModelCache of batch {tokens.shape[0]}")
    if backend == "book" and cache.kind != "paged":
        raise ValueError("decode_step: the book backend reads a paged cache, got "
                         f"{cache.kind!r}")
    cfg = model.cfg
    pos = cache.length
    if pos >= cfg.max_seq:
        raise ValueError(f"decode_step: position {pos} is past max_seq {cfg.max_seq}")
    b, h, hkv, d = tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cos, sin = model.cos[pos:pos + 1], model.sin[pos:pos + 1]
    with timer("embed"):
        x = model.embed[tokens][:, None]                                 # (B, 1, dim)
    tables = None
    for i, layer in enumerate(model.layers):
        with timer("norm"):
            a = ops["norm"](x, layer.attn_norm)
        with timer("qkv"):
            q = (a @ layer.wq.T).view(b, 1, h, d)
            k = (a @ layer.wk.T).view(b, 1, hkv, d)
            v = (a @ layer.wv.T).view(b, 1, hkv, d)
        with timer("rope"):
            q, k = ops["rope"](q, k, cos, sin)
        with timer("cache"):
            cache.append(i, k, v)
            if tables is None and cache.kind == "paged":
                tables = cache.tables()                # one host-to-device copy a step
        with timer("attention"):
            if i == 0 and backend == "book":        # once a step: the tables are every layer's
                c = cache.layers[0]
                da.check_decode_inputs("decode_step", q[:, 0], c.k, c.v, *tables)
            o = _decode_attention(ops, cache, i, q[:, 0], tables)        # (B, H, D)
        with timer("o_proj"):
            x = x + o.reshape(b, 1, h * d) @ layer.wo.T
        with timer("norm"):
            m = ops["norm"](x, layer.mlp_norm)
        with timer("mlp"):
            gate, up = m @ layer.wg.T, m @ layer.wu.T
        with timer("swiglu"):
            c = ops["glu"](gate, up)
        with timer("mlp"):
            x = x + c @ layer.wd.T
    with timer("norm"):
        x = ops["norm"](x, model.norm)
    with timer("lm_head"):
        return (x @ model.lm_head.T)[:, 0]
# --8<-- [end:decode]


def _decode_attention(ops, cache: ModelCache, layer: int, q, tables):
    """The paged kernel (or reference) on layer ``layer``'s blocks; on a contiguous cache, the
    reference attention of each sequence's gathered K and V (every cached token is visible)."""
    c = cache.layers[layer]
    if cache.kind == "paged":
        return ops["decode_attention"](q, c.k, c.v, *tables)
    out = torch.empty_like(q)
    for s in cache.seqs:
        k, v = c.gather(s)                                               # (n, Hkv, D) views
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, dim=1).transpose(0, 1)                # (H, n, D)
        v = v.repeat_interleave(g, dim=1).transpose(0, 1)
        p = torch.softmax((k @ q[s][:, :, None])[:, :, 0] / math.sqrt(q.shape[-1]), dim=-1)
        out[s] = (p[:, None, :] @ v)[:, 0]
    return out


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------

# --8<-- [start:generate]
def pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """The next token of each row: argmax at temperature 0, else a draw from softmax(logits / T)
    with the seeded generator (on the CPU, so a seed gives the same draws on every device)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0].to(logits.device)


def generate(model: Llama, prompt: torch.Tensor, max_new_tokens: int, backend: str = "torch",
             temperature: float = 0.0, seed: int = 0, cache: str = "paged",
             forced: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill ``prompt`` (B, S), then decode ``max_new_tokens`` tokens one at a time. Returns the
    new tokens (B, max_new_tokens) and the logits (B, vocab) each token was picked from.
    ``forced`` (B, max_new_tokens) feeds given tokens instead of picked ones (teacher forcing:
    two backends scored on the same sequence)."""
    _check_backend("generate", model, backend)
    _check_tokens("generate", model, prompt, 2)
    n = check_int("generate: max_new_tokens", max_new_tokens, 1)
    t = check_scalar("generate: temperature", temperature)
    if not t >= 0:
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    check_int("generate: seed", seed, 0)
    b, s = prompt.shape
    if s + n - 1 > model.cfg.max_seq:
        raise ValueError(f"generate: {s} prompt tokens + {n} new exceed max_seq "
                         f"{model.cfg.max_seq}")
    if forced is not None:
        _check_tokens("generate: forced", model, forced, 2)
        if tuple(forced.shape) != (b, n):
            raise ValueError(f"generate: forced must have shape ({b}, {n}), got "
                             f"{tuple(forced.shape)}")
    gen = torch.Generator().manual_seed(seed)
    kv = ModelCache(model, b, cache, max_len=s + n)
    with torch.no_grad():
        logits = prefill(model, prompt, backend, kv, last_only=True)[0][:, -1]
        out, seen = [], [logits]
        for i in range(n):
            tok = pick(logits, t, gen) if forced is None else forced[:, i]
            out.append(tok)
            if i + 1 < n:   # the last token's K and V are never needed
                logits = decode_step(model, tok, kv, backend)
                seen.append(logits)
    return torch.stack(out, dim=1), seen
# --8<-- [end:generate]


# --------------------------------------------------------------------------------------------------
# Where the time goes
# --------------------------------------------------------------------------------------------------

# --8<-- [start:profile]
class SectionTimer:
    """``timer(name)`` as a context manager, summing each name's time over a step. On a GPU it
    records a pair of CUDA events around each section (no synchronisation inside the step; the
    times are read after one at the end); elsewhere a wall clock, which gives the structure of
    the table but no GPU time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object, object]] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.marks.append((name, start, end))

    def totals_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for name, start, end in self.marks:
            ms = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out


def profile_decode(model: Llama, batch: int, context: int, backend: str = "book",
                   steps: int = 5, warmup: int = 2, seed: int = 0) -> dict[str, float]:
    """Mean time of each component of a decode step, in ms, for ``batch`` sequences with
    ``context`` tokens already cached (a random prompt, prefilled first): ``warmup`` untimed steps
    (compilation, autotuning), then ``steps`` timed ones. The components: embed, norm (all
    RMSNorms), qkv, rope, cache (the appends and the block tables), attention, o_proj, mlp (the
    three MLP products), swiglu, lm_head."""
    _check_backend("profile_decode", model, backend)
    check_int("profile_decode: batch", batch, 1)
    check_int("profile_decode: context", context, 1)
    check_int("profile_decode: steps", steps, 1)
    check_int("profile_decode: warmup", warmup, 0)
    if context + warmup + steps > model.cfg.max_seq:
        raise ValueError(f"profile_decode: context {context} + {warmup + steps} steps exceed "
                         f"max_seq {model.cfg.max_seq}")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(model.cfg.vocab, (batch, context), generator=gen)
    kv = ModelCache(model, batch, "paged", max_len=context + warmup + steps + 1)
    totals: dict[str, float] = {}
    with torch.no_grad():
        logits = prefill(model, prompt.to(model.embed.device), backend, kv, last_only=True)[0]
        tok = logits[:, -1].argmax(-1)
        for i in range(warmup + steps):
            timer = SectionTimer(model.embed.device)
            tok = decode_step(model, tok, kv, backend, timer).argmax(-1)
            if i >= warmup:
                for name, ms in timer.totals_ms().items():
                    totals[name] = totals.get(name, 0.0) + ms / steps
    return totals


def format_profile(totals: dict[str, float]) -> str:
    """One line per component, largest first, with its share of the step."""
    whole = sum(totals.values())
    lines = [f"{'component':<10} {'ms':>9} {'share':>7}"]
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"{name:<10} {ms:9.3f} {ms / whole:7.1%}")
    lines.append(f"{'step':<10} {whole:9.3f} {1:7.1%}")
    return "\n".join(lines)
# --8<-- [end:profile]


# --------------------------------------------------------------------------------------------------
# The decode step in a CUDA graph
# --------------------------------------------------------------------------------------------------

# --8<-- [start:static_cache]
class StaticDecoder:
    """A decode step whose every input lives on the device, so that a CUDA graph can replay it.

    :func:`decode_step` keeps the cache's bookkeeping in Python: ``ModelCache.append`` finds each
    new token's block on the host and the block tables are rebuilt and copied every step. A graph
    replays kernels, not Python, so none of that can be captured. Here all of it is decided once:
    the cache has room for ``max_len`` tokens per sequence, every block of every sequence reserved
    up front (in a scattered order, as a long-running server's allocator hands them out), the block
    tables a device tensor from the start, and the position of the next token a device tensor
    ``pos``. A step computes the new token's slot, RoPE's angles and the lengths from ``pos`` on
    the device, and (unless ``fixed_position``) advances ``pos`` itself.

    ``fixed_position``: every step writes the same slot and attends over the same length, so a
    step can be called any number of times with the same result (what a benchmark needs).
    ``length`` is the host's copy of the position (the host never reads ``pos`` back): it refuses
    a step past ``max_len`` before anything is launched. All sequences of the batch are at one
    position (prompts of one length, as :func:`generate` takes them)."""

    def __init__(self, model: Llama, batch: int, max_len: int, backend: str = "torch",
                 fixed_position: bool = False) -> None:
        self.ops = _check_backend("StaticDecoder", model, backend)
        cfg, w = model.cfg, model.embed
        self.batch = check_int("StaticDecoder: batch", batch, 1)
        self.max_len = check_int("StaticDecoder: max_len", max_len, 1)
        if max_len > cfg.max_seq:
            raise ValueError(f"StaticDecoder: max_len {max_len} exceeds max_seq {cfg.max_seq}")
        if not isinstance(fixed_position, bool):
            raise TypeError(f"StaticDecoder: fixed_position must be a bool, got {fixed_position!r}")
        self.model, self.backend, self.fixed_position = model, backend, fixed_position
        per_seq = -(-max_len // BLOCK_SIZE)
        order = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(0))
        self.tables = order.view(batch, per_seq).to(device=w.device, dtype=torch.int32)
        shape = (cfg.n_layers, batch * per_seq, BLOCK_SIZE, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=w.dtype, device=w.device)   # layer l's blocks: k[l]
        self.v = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=w.device)   # the next token's position
        self._length = [0]     # its copy on the host, in a list that with_backend's views share
        self.graph = None
        self._own_views = {}   # this decoder's views of other backends and steps, by name

    def _root(self) -> StaticDecoder:
        """The decoder that owns this one's cache and views: itself, or a view's decoder."""
        ref = self.__dict__.get("_owner")
        root = self if ref is None else ref()
        if root is None:
            raise RuntimeError("StaticDecoder: this view's decoder has been freed; keep the "
                               "decoder it was made from")
        return root

    @property
    def _views(self) -> dict:
        """The views of the decoder that owns this one's cache (shared by all its views)."""
        return self._root().__dict__["_own_views"]

    def view(self, cls: type) -> StaticDecoder:
        """A new decoder of class ``cls`` over this one's cache, tables and position, with no
        graph. It refers to the decoder that owns the cache weakly (the owner refers to its
        views): a decoder dropped with its views is freed at once, not at the cycle collector's
        next pass, which matters when it holds an 8B model's weights."""
        other = object.__new__(cls)
        other.__dict__.update(self.__dict__)
        other.__dict__.pop("_own_views", None)
        other._owner, other.graph = weakref.ref(self._root()), None
        return other

    @property
    def length(self) -> int:
        """The position of the next token, as the host knows it (tokens cached so far)."""
        return self._length[0]

    def with_backend(self, backend: str) -> StaticDecoder:
        """A decoder of ``backend`` over this one's cache, tables and position (shared, not
        copied: a step of either moves both), with a graph of its own: two backends timed on one
        prefilled cache."""
        root = self._root()
        if backend == root.backend:
            return root
        views = root._own_views
        if backend not in views:
            other = root.view(StaticDecoder)
            other.ops = _check_backend("StaticDecoder.with_backend", self.model, backend)
            other.backend = backend
            views[backend] = other
        return views[backend]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """K and V (B, T, Hkv, D) of the tokens at positions ``pos`` .. ``pos + T - 1``: each
        token's block from its sequence's table, its offset in the block, and one indexed write
        into the whole cache for K and one for V (``index_put_`` with device indices: no host
        value involved; on the whole cache rather than on the view ``k[layer]``, because
        torch.compile turns a write into a view of an input into a copy of the whole input,
        and a write into the input itself into the write alone). The position is advanced by
        :meth:`prefill` or :meth:`step`, after every layer has written."""
        t = k.shape[1]
        positions = self.pos + torch.arange(t, device=self.pos.device)           # (T,)
        blocks = self.tables.long()[:, positions // BLOCK_SIZE].flatten()         # (B * T,)
        offsets = (positions % BLOCK_SIZE).repeat(self.batch)                     # (B * T,)
        where = (torch.full_like(blocks, layer), blocks, offsets)
        self.k.index_put_(where, k.reshape(-1, *k.shape[2:]))
        self.v.index_put_(where, v.reshape(-1, *v.shape[2:]))
# --8<-- [end:static_cache]

    def _check_step(self, name: str, tokens: torch.Tensor, dims: int, check: bool) -> None:
        """tokens (B,) for a step (``dims`` 1) or (B, S) for a prefill (``dims`` 2): type, shape
        and device, room for them before ``max_len``, and (``check``) the ids themselves."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
            raise TypeError(f"{name}: tokens must be an int64 tensor, got "
                            f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != dims or tokens.shape[0] != self.batch or tokens.numel() == 0:
            want = "(batch,)" if dims == 1 else "(batch, S), S >= 1,"
            raise ValueError(f"{name}: tokens must have shape {want} with the decoder's batch "
                             f"{self.batch}, got {tuple(tokens.shape)}")
        if tokens.device != self.pos.device:
            raise ValueError(f"{name}: tokens are on {tokens.device}, the decoder on "
                             f"{self.pos.device}")
        n = 1 if dims == 1 else tokens.shape[1]
        if self.length + n > self.max_len:
            raise ValueError(f"{name}: position {self.length + n - 1} is past max_len "
                             f"{self.max_len}")
        if check:   # reads the ids back: a synchronisation, which the timed step leaves out
            _check_tokens(name, self.model, tokens, dims)

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prompt (B, S) written to the cache at positions ``pos`` .. ``pos + S - 1`` through
        the backend's prefill (attention over the prompt only: a first prompt); returns the last
        position's logits (B, vocab)."""
        if self.length:
            raise ValueError(f"StaticDecoder.prefill: the cache already holds {self.length} "
                             "tokens; prefill starts an empty one")
        self._check_step("StaticDecoder.prefill", prompt, 2, check=True)
        with torch.no_grad():
            logits = _prefill(self.model, prompt, self.ops, self, last_only=True)[:, -1]
        self.pos += prompt.shape[1]
        self._length[0] += prompt.shape[1]
        return logits

    def step(self, tokens: torch.Tensor, check: bool = True) -> torch.Tensor:
        """One new token per sequence, ``tokens`` (B,): logits (B, vocab). ``check`` also checks
        the token ids (a read-back from the device; the timed versions leave it to the caller,
        as decode attention leaves its content checks)."""
        self._check_step("StaticDecoder.step", tokens, 1, check)
        with torch.no_grad():
            logits = self._step(tokens)
        if not self.fixed_position:
            self._length[0] += 1
        return logits

    # --8<-- [start:static_step]
    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        """The step on checked inputs: device state only, no Python decision on data."""
        model, ops, cfg = self.model, self.ops, self.model.cfg
        b, h, hkv, d = self.batch, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cos, sin = model.cos.index_select(0, self.pos), model.sin.index_select(0, self.pos)
        lens = (self.pos + 1).to(torch.int32).repeat(b)                    # (B,), on the device
        attend = ops["decode_attention"] if self.backend == "book" else da.paged_attention_sdpa
        x = model.embed[tokens][:, None]                                   # (B, 1, dim)
        for i, layer in enumerate(model.layers):
            a = ops["norm"](x, layer.attn_norm)
            q = (a @ layer.wq.T).view(b, 1, h, d)
            k = (a @ layer.wk.T).view(b, 1, hkv, d)
            v = (a @ layer.wv.T).view(b, 1, hkv, d)
            q, k = ops["rope"](q, k, cos, sin)
            self.append(i, k, v)
            o = attend(q[:, 0], self.k[i], self.v[i], self.tables, lens)      # (B, H, D)
            x = x + o.reshape(b, 1, h * d) @ layer.wo.T
            m = ops["norm"](x, layer.mlp_norm)
            x = x + ops["glu"](m @ layer.wg.T, m @ layer.wu.T) @ layer.wd.T
        if not self.fixed_position:
            self.pos += 1
        return (ops["norm"](x, model.norm) @ model.lm_head.T)[:, 0]
    # --8<-- [end:static_step]

    # --8<-- [start:capture]
    def capture(self, warmup: int = 2) -> None:
        """Record one step in a CUDA graph over a static token buffer. ``warmup`` eager steps on a
        side stream first (Triton's compilation, cuBLAS's and the allocator's first-use work must
        not happen inside the capture), at a fixed position: they write only the next token's
        slot, which the first real step writes again, and never move the position. The capture
        itself runs nothing."""
        if self.pos.device.type != "cuda":
            raise ValueError(f"StaticDecoder.capture: CUDA graphs need the model on a CUDA "
                             f"device, it is on {self.pos.device}")
        check_int("StaticDecoder.capture: warmup", warmup, 1)
        if self.length >= self.max_len:
            raise ValueError(f"StaticDecoder.capture: position {self.length} is past max_len "
                             f"{self.max_len}")
        self.tokens = torch.zeros(self.batch, dtype=torch.long, device=self.pos.device)
        fixed, self.fixed_position = self.fixed_position, True
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(warmup):
                    self._step(self.tokens)
        finally:
            self.fixed_position = fixed
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.logits = self._step(self.tokens)

    def replay(self, tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`step` through the captured graph: ``tokens`` copied into the static buffer, one
        replay. The logits returned are the graph's output buffer, overwritten by the next
        replay (clone them to keep them). Token ids are not checked (no read-back)."""
        if self.graph is None:
            raise ValueError("StaticDecoder.replay: no graph; call capture() first")
        self._check_step("StaticDecoder.replay", tokens, 1, check=False)
        self.tokens.copy_(tokens)
        self.graph.replay()
        if not self.fixed_position:
            self._length[0] += 1
        return self.logits
    # --8<-- [end:capture]


# --------------------------------------------------------------------------------------------------
# The decode step as an op
# --------------------------------------------------------------------------------------------------

# --8<-- [start:op_reference]
def static_decode_ref(decoder: StaticDecoder, tokens: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor) -> torch.Tensor:
    """The step as written on paper, in the dtype of ``k_cache`` (float64 when the harness calls
    it): the new token's q, k and v from the weights, its RoPE angles at the position, attention
    over the ``pos`` cached tokens of each sequence (each position's row found through the
    sequence's block table) and the new token itself, then the MLP and the head. Reads the cache,
    writes nothing."""
    model, cfg, n = decoder.model, decoder.model.cfg, decoder.length
    b, h, hkv, d = tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dt = k_cache.dtype

    def w(t):
        return t.to(dt)

    cos, sin = w(model.cos[n:n + 1]), w(model.sin[n:n + 1])
    at = torch.arange(n, device=tokens.device)                        # the cached positions
    past = decoder.tables.long()[:, at // BLOCK_SIZE] * BLOCK_SIZE + at % BLOCK_SIZE   # (B, n)
    x = w(model.embed[tokens])                                        # (B, dim)
    for i, layer in enumerate(model.layers):
        a = rn.rmsnorm_ref(x, w(layer.attn_norm), EPS)
        q = (a @ w(layer.wq).T).view(b, 1, h, d)
        k = (a @ w(layer.wk).T).view(b, 1, hkv, d)
        v = (a @ w(layer.wv).T).view(b, 1, hkv, d)
        q, k = rp.rope_ref(q, k, cos, sin)
        kf, vf = k_cache[i].flatten(0, 1), v_cache[i].flatten(0, 1)   # (rows, Hkv, D)
        keys = torch.cat([kf[past], k], dim=1)                        # (B, n + 1, Hkv, D)
        vals = torch.cat([vf[past], v], dim=1)
        keys = keys.repeat_interleave(h // hkv, dim=2)                # (B, n + 1, H, D)
        vals = vals.repeat_interleave(h // hkv, dim=2)
        p = torch.softmax(torch.einsum("bhd,bnhd->bhn", q[:, 0], keys) / math.sqrt(d), dim=-1)
        x = x + torch.einsum("bhn,bnhd->bhd", p, vals).reshape(b, h * d) @ w(layer.wo).T
        m = rn.rmsnorm_ref(x, w(layer.mlp_norm), EPS)
        x = x + sw.swiglu_ref(m @ w(layer.wg).T, m @ w(layer.wu).T) @ w(layer.wd).T
    return rn.rmsnorm_ref(x, w(model.norm), EPS) @ w(model.lm_head).T
# --8<-- [end:op_reference]


# --8<-- [start:op_versions]
def check_timed_call(name: str, decoder, tokens, k_cache, v_cache) -> None:
    """The checks of a timed call of a decode version (no read-back from the device): a
    fixed-position decoder with its views, its own cache storage as ``k_cache`` and ``v_cache``,
    no input autograd tracks, ``tokens`` of the decoder's batch."""
    # by its attributes, not its class: an exported copy of this module has a class of its own
    fixed = getattr(decoder, "fixed_position", None) is True
    if not (callable(getattr(decoder, "step", None)) and fixed
            and isinstance(getattr(decoder, "_views", None), dict)):
        raise TypeError(f"{name}: decoder must be a StaticDecoder with fixed_position=True, got "
                        f"{type(decoder).__name__}")
    refuse_grad(name, k_cache, v_cache, instead="static_decode_ref")
    for label, t, own in (("k_cache", k_cache, decoder.k), ("v_cache", v_cache, decoder.v)):
        if not isinstance(t, torch.Tensor) or t.data_ptr() != own.data_ptr():
            raise ValueError(f"{name}: {label} must be the decoder's own cache storage")
    decoder._check_step(name, tokens, 1, check=False)


def graphed_step(decoder: StaticDecoder, tokens: torch.Tensor) -> torch.Tensor:
    """One step of ``decoder`` through its CUDA graph, captured on the first call (the
    harness's correctness check, never timed)."""
    if decoder.graph is None:
        decoder.capture()
    return decoder.replay(tokens)


def _timed(name: str, decoder, tokens, k_cache, v_cache, backend: str) -> StaticDecoder:
    check_timed_call(name, decoder, tokens, k_cache, v_cache)
    return decoder.with_backend(backend)


def decode_torch(decoder, tokens, k_cache, v_cache):
    """v0: the static step with the torch backend's ops, eager: PyTorch's kernels, one launch
    after another from Python."""
    return _timed("decode_torch", decoder, tokens, k_cache, v_cache, "torch").step(tokens, False)


def _torch_step(decoder: StaticDecoder, tokens: torch.Tensor) -> torch.Tensor:
    return decoder._step(tokens)


_torch_step_compiled = compiled(_torch_step)


def decode_torch_compiled(decoder, tokens, k_cache, v_cache):
    """v1: the torch backend's static step through torch.compile (default mode: Inductor's fused
    kernels, launched from Python; no CUDA graph)."""
    d = _timed("decode_torch_compiled", decoder, tokens, k_cache, v_cache, "torch")
    with torch.no_grad():
        return _torch_step_compiled(d, tokens)


def decode_book(decoder, tokens, k_cache, v_cache):
    """v2: the static step with the book's kernels (Part 5's norm, RoPE and SwiGLU, Part 8's
    split-KV decode attention), eager."""
    return _timed("decode_book", decoder, tokens, k_cache, v_cache, "book").step(tokens, False)


def _graphed(name: str, backend: str, decoder, tokens, k_cache, v_cache):
    return graphed_step(_timed(name, decoder, tokens, k_cache, v_cache, backend), tokens)


def decode_book_graph(decoder, tokens, k_cache, v_cache):
    """v3: v2's step captured once in a CUDA graph and replayed: one launch of the whole step."""
    return _graphed("decode_book_graph", "book", decoder, tokens, k_cache, v_cache)


def decode_torch_graph(decoder, tokens, k_cache, v_cache):
    """v4: v0's step (PyTorch's kernels only) in a CUDA graph: what a graph alone buys."""
    return _graphed("decode_torch_graph", "torch", decoder, tokens, k_cache, v_cache)


def needs_cuda_graphs() -> str | None:
    """For ``Impl(requires=...)``: why a CUDA graph cannot be captured here, or None."""
    return None if torch.cuda.is_available() else "CUDA graphs need a CUDA GPU"
# --8<-- [end:op_versions]


# --8<-- [start:op]
def _make_inputs(size, dtype, device, gen):
    """A model of ``size["config"]`` with seeded random weights (drawn on ``device``), a
    fixed-position decoder of ``b`` sequences with room for ``ctx`` + 1 tokens, a random prompt of
    ``ctx`` tokens prefilled (torch backend), and the next tokens. Returns (decoder, tokens, its K
    storage, its V storage)."""
    seed = int(torch.randint(2**31, (1,), generator=gen))
    model = Llama(CONFIGS[size["config"]], seed=seed, dtype=dtype, device=device,
                  draw_on_device=True)
    b, ctx = size["b"], size["ctx"]
    decoder = StaticDecoder(model, b, ctx + 1, "torch", fixed_position=True)
    prompt = torch.randint(model.cfg.vocab, (b, ctx), generator=gen).to(device)
    decoder.prefill(prompt)
    tokens = torch.randint(model.cfg.vocab, (b,), generator=gen).to(device)
    return decoder, tokens, decoder.k, decoder.v


def decoder_config(size, dtype) -> dm.DecoderConfig:
    """decode_model's description of the capstone's ``size["config"]`` in ``dtype``."""
    c = CONFIGS[size["config"]]
    return dm.DecoderConfig(layers=c.n_layers, hidden=c.dim, heads=c.n_heads,
                            kv_heads=c.n_kv_heads, head_dim=c.head_dim, ffn=c.ffn_dim,
                            vocab=c.vocab, dtype_bytes=dtype.itemsize,
                            kv_dtype_bytes=dtype.itemsize)


def _bytes(size, dtype) -> int:
    # decode_model.decode_step_bytes: every matmul weight once, the batch's embedding rows, each
    # sequence's ctx cached tokens read and the new token's K and V written
    return dm.decode_step_bytes(decoder_config(size, dtype), size["b"], size["ctx"])


def _flops(size, dtype) -> int:
    return dm.decode_step_flops(decoder_config(size, dtype), size["b"], size["ctx"])


def _compile_is_short(size) -> bool:
    """v1 is timed on the 1B model only: torch.compile unrolls every block of the step into one
    graph, and the 8B model's 32 blocks at each shape would spend the run's time compiling."""
    return size["config"] == "llama_1b"


HEADLINE = {"config": "llama_1b", "b": 1, "ctx": 1024}
SWEEP = [HEADLINE, {"config": "llama_1b", "b": 8, "ctx": 1024},
         {"config": "llama_1b", "b": 32, "ctx": 1024},
         {"config": "llama_8b", "b": 1, "ctx": 1024}, {"config": "llama_8b", "b": 1, "ctx": 4096}]
# Tiny, for the CPU: two sequences at position 5, and one at position 16 (a new block's first
# slot: the slot arithmetic's boundary).
TEST_SIZES = [{"config": "tiny", "b": 2, "ctx": 5}, {"config": "tiny", "b": 1, "ctx": 16}]
# float32: a few roundings of logits of order one. bf16: every activation rounded to 8 bits through
# the layers; sized from the CPU's bf16 error of 16- and 32-layer models of Llama's widths against
# this reference, with room for a GPU's summation order and a 128256-token vocabulary's extremes.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 1.5e-1)}

capstone_decode = register(Op(
    name="capstone_decode", part=8, chapter="part8/capstone.md",
    title="Capstone decode step (static cache, CUDA graphs)", reference=static_decode_ref,
    make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops, metric="GB/s", ceiling="copy",
    headline=HEADLINE, sweep=SWEEP, dtypes=(torch.bfloat16, torch.float32),
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES,
    sweep_axis="b"))
_STEP = (StaticDecoder, _timed, "snippets/part8/capstone.py")
capstone_decode.add(Impl("v0", decode_torch, "PyTorch",
                         "static step, torch ops (gather + SDPA attention), eager",
                         (*_STEP, da.paged_attention_sdpa), device="any", origin="library"))
capstone_decode.add(Impl("v1", decode_torch_compiled, "PyTorch",
                         "v0's step through torch.compile (default mode, no CUDA graph)",
                         (*_STEP, _torch_step, da.paged_attention_sdpa), requires=needs_gpu,
                         origin="library", bench_if=_compile_is_short))
capstone_decode.add(Impl("v2", decode_book, "Triton",
                         "static step, the book's kernels (split-KV decode attention), eager",
                         (*_STEP, da.paged_attention_split, rn.rmsnorm_triton, rp.rope_triton,
                          sw.swiglu_triton), device="any"))
capstone_decode.add(Impl("v3", decode_book_graph, "Triton",
                         "v2's step captured in one CUDA graph, replayed",
                         (*_STEP, da.paged_attention_split, rn.rmsnorm_triton, rp.rope_triton,
                          sw.swiglu_triton), requires=needs_cuda_graphs))
capstone_decode.add(Impl("v4", decode_torch_graph, "PyTorch",
                         "v0's step captured in one CUDA graph (PyTorch's kernels only)",
                         (*_STEP, da.paged_attention_sdpa), requires=needs_cuda_graphs,
                         origin="library"))
# --8<-- [end:op]


# --------------------------------------------------------------------------------------------------
# The prefill as an op
# --------------------------------------------------------------------------------------------------

# --8<-- [start:prefill_op]
def prefill_ref(model: Llama, tokens: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """The prompt's pass written out in the dtype of ``embed`` (the model's embedding table;
    float64 when the harness calls it, which upcasts tensor arguments but cannot upcast the
    model): every other weight converted to that dtype, causal grouped-query attention as a
    masked softmax over all the prompt's keys, and the last position's logits (B, 1, vocab)."""
    cfg, (b, s) = model.cfg, tokens.shape
    h, hkv, d, dt = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, embed.dtype

    def w(t):
        return t.to(dt)

    cos, sin = w(model.cos[:s]), w(model.sin[:s])
    later = torch.ones(s, s, dtype=torch.bool, device=tokens.device).triu(1)   # key after query
    x = embed[tokens]                                                 # (B, S, dim)
    for layer in model.layers:
        a = rn.rmsnorm_ref(x, w(layer.attn_norm), EPS)
        q = (a @ w(layer.wq).T).view(b, s, h, d)
        k = (a @ w(layer.wk).T).view(b, s, hkv, d)
        v = (a @ w(layer.wv).T).view(b, s, hkv, d)
        q, k = rp.rope_ref(q, k, cos, sin)
        k, v = k.repeat_interleave(h // hkv, dim=2), v.repeat_interleave(h // hkv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        p = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1)
        x = x + torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, h * d) @ w(layer.wo).T
        m = rn.rmsnorm_ref(x, w(layer.mlp_norm), EPS)
        x = x + sw.swiglu_ref(m @ w(layer.wg).T, m @ w(layer.wu).T) @ w(layer.wd).T
    return rn.rmsnorm_ref(x[:, -1:], w(model.norm), EPS) @ w(model.lm_head).T


def _prefill_timed(name: str, model, tokens, embed, backend: str) -> dict:
    """The checks of a timed call: the backend's (model, device, head_dim), the prompt's type,
    shape, device and length (not its ids: their range is a read-back from the device, which
    decode's timed versions leave out too), ``embed`` the model's own table, and no input autograd
    tracks. Returns the backend's ops."""
    # by its attributes, not its class: an exported copy of this module has a class of its own
    if not all(hasattr(model, a) for a in ("cfg", "embed", "layers", "lm_head")):
        raise TypeError(f"{name}: model must be a Llama, got {type(model).__name__}")
    ops = _backend_ops(name, model, backend)
    _check_prompt(name, model, tokens, ids=False)
    if not isinstance(embed, torch.Tensor) or embed.data_ptr() != model.embed.data_ptr():
        raise ValueError(f"{name}: embed must be the model's own embedding table")
    refuse_grad(name, embed, *model.parameters(), instead='prefill(model, tokens, "torch")')
    return ops


def prefill_torch(model, tokens, embed):
    """v0: the prompt through the torch backend's ops, eager (cuBLAS's products, PyTorch's
    kernels for the norms, RoPE, SwiGLU and the masked-softmax attention); the last logits."""
    ops = _prefill_timed("prefill_torch", model, tokens, embed, "torch")
    return _prefill(model, tokens, ops, None, last_only=True)


def _torch_prefill(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    return _prefill(model, tokens, OPS["torch"], None, last_only=True)


_torch_prefill_compiled = compiled(_torch_prefill)


def prefill_torch_compiled(model, tokens, embed):
    """v1: v0 through torch.compile (default mode: Inductor fuses the element-wise work and the
    attention's mask and softmax; the products stay cuBLAS's or Inductor's templates)."""
    _prefill_timed("prefill_torch_compiled", model, tokens, embed, "torch")
    with torch.no_grad():
        return _torch_prefill_compiled(model, tokens)


def prefill_book(model, tokens, embed):
    """v2: the prompt through the book's kernels (Part 5's RMSNorm, RoPE, SwiGLU and causal
    FlashAttention, each kv head repeated for its query heads first), eager; the products are
    cuBLAS's, as in v0."""
    ops = _prefill_timed("prefill_book", model, tokens, embed, "book")
    return _prefill(model, tokens, ops, None, last_only=True)


def _make_prefill_inputs(size, dtype, device, gen):
    """A model of ``size["config"]`` with seeded random weights (drawn on ``device``) and a random
    prompt of ``b`` x ``s`` tokens. Returns (model, prompt, the model's embedding table)."""
    seed = int(torch.randint(2**31, (1,), generator=gen))
    model = Llama(CONFIGS[size["config"]], seed=seed, dtype=dtype, device=device,
                  draw_on_device=True)
    prompt = torch.randint(model.cfg.vocab, (size["b"], size["s"]), generator=gen).to(device)
    return model, prompt, model.embed


def _prefill_flops(size, dtype) -> int:
    """decode_model.prefill_flops for each of the b prompts, less the LM head at all but the
    last position: the op returns the last position's logits only."""
    cfg, s = decoder_config(size, dtype), size["s"]
    return size["b"] * (dm.prefill_flops(cfg, s) - 2 * (s - 1) * cfg.vocab * cfg.hidden)


def _prefill_bytes(size, dtype) -> int:
    # decode_model.prefill_bytes of all b x s tokens: the weights once, each token's embedding row,
    # and each token's K and V written once (here for attention to read, there being no cache)
    return dm.prefill_bytes(decoder_config(size, dtype), size["b"] * size["s"])


PREFILL_HEADLINE = {"config": "llama_1b", "b": 1, "s": 2048}
PREFILL_SWEEP = [*({"config": "llama_1b", "b": 1, "s": s} for s in (512, 1024, 2048, 4096)),
                 {"config": "llama_1b", "b": 4, "s": 1024}]             # the headline among them
# Tiny, for the CPU: two prompts of 5 tokens (shorter than any attention tile), one of 37 (under
# the interpreter FlashAttention's tiles are 32 queries by 16 keys: a ragged last tile of each).
PREFILL_TEST_SIZES = [{"config": "tiny", "b": 2, "s": 5}, {"config": "tiny", "b": 1, "s": 37}]

# decode's table: the last position's logits pass through the same layers, and here every earlier
# position's K and V are rounded in bf16 too (decode's reference reads the cache as written, this
# one recomputes it); checked against the CPU's bf16 error of the torch backend at Llama 3.2 1B's
# widths and depth with the full vocabulary, prompts of 128 to 2048 tokens, against prefill_ref:
# within this table, with room for a GPU's summation order.
capstone_prefill = register(Op(
    name="capstone_prefill", part=8, chapter="part8/capstone.md",
    title="Capstone prefill (the prompt in one pass, last logits)", reference=prefill_ref,
    make_inputs=_make_prefill_inputs, bytes_moved=_prefill_bytes, flops=_prefill_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=PREFILL_HEADLINE, sweep=PREFILL_SWEEP,
    dtypes=(torch.bfloat16, torch.float32), bench_dtypes=(torch.bfloat16,),
    test_sizes=PREFILL_TEST_SIZES, tolerances=TOLERANCES, sweep_axis="s"))
_PASS = (_prefill, _prefill_timed, _check_prompt, causal_gqa_attention)
capstone_prefill.add(Impl("v0", prefill_torch, "PyTorch",
                          "prefill, torch ops (masked-softmax attention), eager",
                          _PASS, device="any", origin="library"))
capstone_prefill.add(Impl("v1", prefill_torch_compiled, "PyTorch",
                          "v0's prefill through torch.compile (default mode)",
                          (*_PASS, _torch_prefill), requires=needs_gpu, origin="library",
                          bench_if=_compile_is_short))
capstone_prefill.add(Impl("v2", prefill_book, "Triton",
                          "prefill, the book's kernels (causal FlashAttention), eager",
                          (*_PASS, _book_prefill_attention, fa.attention_triton,
                           rn.rmsnorm_triton, rp.rope_triton, sw.swiglu_triton), device="any"))
# --8<-- [end:prefill_op]


def main(argv: list[str] | None = None) -> None:
    """``python -m snippets.part8.capstone --config llama_1b --batch 1 --context 1024``: print
    where the time of a decode step goes (on a GPU, bf16)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--config", choices=sorted(CONFIGS), default="llama_1b")
    p.add_argument("--backend", choices=BACKENDS, default="book")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Llama(CONFIGS[args.config], dtype=dtype, device=device)
    print(f"{args.config}, {args.backend}, batch {args.batch}, context {args.context}, {dtype}, "
          f"{device}")
    print(format_profile(profile_decode(model, args.batch, args.context, args.backend,
                                        steps=args.steps)))


if __name__ == "__main__":
    main()

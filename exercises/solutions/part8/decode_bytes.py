"""part8.decode-memory-bound.6: Bytes per decoded token, and the batch where decode turns
compute-bound

The reference solution.

Chapter: docs/part8/decode-memory-bound.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Write the chapter's decode model for a DecoderConfig cfg (layers, hidden, heads, kv_heads,
head_dim, ffn, vocab, dtype_bytes, kv_dtype_bytes): the bytes one token adds to the KV cache; the
bytes of one decode step of `batch` sequences of `context` cached tokens (the weights once, the
batch's embedding rows, each sequence's cache read and its new token's K and V written); the bytes
per decoded token; the step's FLOPs; and the smallest batch at which the FLOPs take at least as long
as the bytes at a given bandwidth and peak rate (None if no batch does).

Check it:  python -m snippets exercise check part8.decode-memory-bound.6
"""

import math


def matmul_params(cfg) -> int:
    """The weights a decode step multiplies by: every block's q, k, v, o projections, the MLP's
    gate, up and down, the norms, the final norm and the output head (the input embedding is a
    lookup, not a product). Given, not part of the exercise."""
    attn = 2 * cfg.hidden * cfg.heads * cfg.head_dim + 2 * cfg.hidden * cfg.kv_heads * cfg.head_dim
    layer = attn + 3 * cfg.hidden * cfg.ffn + 2 * cfg.hidden
    return cfg.layers * layer + cfg.hidden + cfg.vocab * cfg.hidden


def kv_bytes_per_token(cfg) -> int:
    """What one token adds to the cache: a K and a V vector per KV head and layer."""
    return 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * cfg.kv_dtype_bytes


def step_bytes(cfg, batch: int, context: int) -> int:
    """Bytes of one decode step: the matmul weights once, `batch` embedding rows of `hidden`, and
    per sequence its `context` cached tokens read plus the new token's K and V written."""
    weights = (matmul_params(cfg) + batch * cfg.hidden) * cfg.dtype_bytes
    return weights + batch * (context + 1) * kv_bytes_per_token(cfg)


def bytes_per_token(cfg, batch: int, context: int) -> float:
    """Bytes moved per token the step decodes (one per sequence)."""
    return step_bytes(cfg, batch, context) / batch


def step_flops(cfg, batch: int, context: int) -> int:
    """Two FLOPs per matmul weight and token, and per layer and query head 4 * head_dim per attended
    token (q.k and p.v over the context and the new token)."""
    attn = 4 * cfg.layers * cfg.heads * cfg.head_dim * (context + 1)
    return batch * (2 * matmul_params(cfg) + attn)


def compute_bound_batch(cfg, context: int, bandwidth: float, peak_flops: float):
    """The smallest batch whose FLOPs take at least as long as its bytes (flops / peak_flops >=
    bytes / bandwidth), or None when no batch does."""
    fixed = matmul_params(cfg) * cfg.dtype_bytes                 # does not grow with the batch
    per_seq_bytes = step_bytes(cfg, 1, context) - fixed
    gain = step_flops(cfg, 1, context) / peak_flops - per_seq_bytes / bandwidth
    if gain <= 0:
        return None      # each sequence adds more byte time than FLOP time: never compute-bound
    b = max(1, math.ceil(fixed / bandwidth / gain))

    def compute_bound(n: int) -> bool:
        return step_flops(cfg, n, context) / peak_flops >= step_bytes(cfg, n, context) / bandwidth

    while b > 1 and compute_bound(b - 1):  # the closed form in floating point can be one off
        b -= 1
    while not compute_bound(b):
        b += 1
    return b

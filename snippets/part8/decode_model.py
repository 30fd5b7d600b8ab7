"""Why decoding is memory-bound: bytes and FLOPs of one decode step of a Llama-style model, and
the roofline time they imply.

A decode step takes one new token for each of ``batch`` sequences through the whole model. Every
weight matrix is read once per step, whatever the batch (the batch's tokens share the read), and
every sequence's KV cache is read once by attention and grows by one token. The FLOPs are two per
weight per token (one multiply, one add) plus attention's two dot products per cached token. So the
weights' arithmetic intensity grows with the batch, the KV cache's does not: a sequence's cache is
read for that sequence alone.

Nothing here knows a GPU. The roofline functions take the bandwidth (bytes/s) and the peak rate
(FLOP/s) as arguments: a datasheet's figures, or the ones the harness measured. Counted: the
weights of the matmuls and norms (the input embedding is a lookup of ``batch`` rows, counted as
such), the K and V of every layer, read and appended. Not counted: activations (a few vectors of
``hidden`` per token), the softmax's exponentials, norms' and activations' arithmetic; all of them
are small next to the terms above at any batch this module is about (checked in the tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from snippets._checks import check_int, check_scalar


# --8<-- [start:config]
@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a Llama-style decoder: ``layers`` blocks of grouped-query attention (``heads``
    query heads, ``kv_heads`` key/value heads, each ``head_dim`` wide) and a SwiGLU MLP (three
    matrices of ``hidden`` x ``ffn``), untied input embedding and output head over ``vocab``.
    ``dtype_bytes`` is the weights' element size, ``kv_dtype_bytes`` the KV cache's."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab",
                     "dtype_bytes", "kv_dtype_bytes"):
            check_int(f"DecoderConfig.{name}", getattr(self, name), 1)
        if self.heads % self.kv_heads:
            raise ValueError(f"DecoderConfig: heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")


# Llama 3 8B's published shape (config.json of meta-llama/Meta-Llama-3-8B), bf16 weights and cache.
LLAMA3_8B = DecoderConfig(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                          vocab=128256)
# --8<-- [end:config]


# --8<-- [start:counts]
def layer_params(cfg: DecoderConfig) -> int:
    """Weights of one block: q and o projections (hidden x heads*head_dim each), k and v
    (hidden x kv_heads*head_dim each), the MLP's gate, up and down (hidden x ffn each), two
    norms."""
    attn = 2 * cfg.hidden * cfg.heads * cfg.head_dim + 2 * cfg.hidden * cfg.kv_heads * cfg.head_dim
    return attn + 3 * cfg.hidden * cfg.ffn + 2 * cfg.hidden


def param_count(cfg: DecoderConfig) -> int:
    """Every weight: the blocks, the final norm, the input embedding and the output head."""
    return cfg.layers * layer_params(cfg) + cfg.hidden + 2 * cfg.vocab * cfg.hidden


def matmul_params(cfg: DecoderConfig) -> int:
    """The weights a decode step multiplies by: all but the input embedding, which is looked up."""
    return param_count(cfg) - cfg.vocab * cfg.hidden


def kv_bytes_per_token(cfg: DecoderConfig) -> int:
    """What one token adds to the cache: a K and a V vector per kv head per layer."""
    return 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * cfg.kv_dtype_bytes


def decode_step_bytes(cfg: DecoderConfig, batch: int, context: int) -> int:
    """Bytes one decode step must move: the weights once, the embedding rows of the batch's tokens,
    and for each sequence its cache of ``context`` tokens read plus the new token's K and V
    written."""
    check_int("decode_step_bytes: batch", batch, 1)
    check_int("decode_step_bytes: context", context, 0)
    weights = matmul_params(cfg) * cfg.dtype_bytes + batch * cfg.hidden * cfg.dtype_bytes
    return weights + batch * (context + 1) * kv_bytes_per_token(cfg)


def decode_step_flops(cfg: DecoderConfig, batch: int, context: int) -> int:
    """FLOPs of one decode step: 2 per matmul weight per token, and per layer and query head
    2 * head_dim for q.k and 2 * head_dim for p*v per attended token (context + the new one)."""
    check_int("decode_step_flops: batch", batch, 1)
    check_int("decode_step_flops: context", context, 0)
    attn = 4 * cfg.layers * cfg.heads * cfg.head_dim * (context + 1)
    return batch * (2 * matmul_params(cfg) + attn)


def arithmetic_intensity(cfg: DecoderConfig, batch: int, context: int) -> float:
    """FLOPs per byte of one decode step."""
    return decode_step_flops(cfg, batch, context) / decode_step_bytes(cfg, batch, context)
# --8<-- [end:counts]


# --8<-- [start:roofline]
def _check_machine(name: str, bandwidth: float, peak_flops: float) -> tuple[float, float]:
    bw, peak = check_scalar(f"{name}: bandwidth", bandwidth), check_scalar(f"{name}: peak_flops",
                                                                          peak_flops)
    if not (bw > 0 and math.isfinite(bw)):
        raise ValueError(f"{name}: bandwidth (bytes/s) must be positive and finite, got "
                         f"{bandwidth}")
    if not (peak > 0 and math.isfinite(peak)):
        raise ValueError(f"{name}: peak_flops must be positive and finite, got {peak_flops}")
    return bw, peak


def roofline_step_time(cfg: DecoderConfig, batch: int, context: int, bandwidth: float,
                       peak_flops: float) -> float:
    """The least time of one decode step, in seconds: the slower of moving its bytes at
    ``bandwidth`` and doing its FLOPs at ``peak_flops`` (each at its ceiling, perfectly
    overlapped)."""
    bw, peak = _check_machine("roofline_step_time", bandwidth, peak_flops)
    return max(decode_step_bytes(cfg, batch, context) / bw,
               decode_step_flops(cfg, batch, context) / peak)


def roofline_table(cfg: DecoderConfig, context: int, bandwidth: float, peak_flops: float,
                   batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[dict]:
    """One row per batch size: the step's bytes, FLOPs, intensity, roofline time, tokens per
    second (batch / time) and which ceiling binds ("memory" or "compute")."""
    bw, peak = _check_machine("roofline_table", bandwidth, peak_flops)
    if not batches:
        raise ValueError("roofline_table: batches is empty")
    rows = []
    for b in batches:
        nbytes, flops = decode_step_bytes(cfg, b, context), decode_step_flops(cfg, b, context)
        t = max(nbytes / bw, flops / peak)
        rows.append(dict(batch=b, bytes=nbytes, flops=flops, intensity=flops / nbytes,
                         seconds=t, tokens_per_s=b / t,
                         bound="compute" if flops / peak >= nbytes / bw else "memory"))
    return rows


def compute_bound_batch(cfg: DecoderConfig, context: int, bandwidth: float,
                        peak_flops: float) -> int | None:
    """The smallest batch at which a decode step's FLOPs take at least as long as its bytes, or
    None if no batch does (the cache grows with the batch as fast as the FLOPs: long contexts).

    With W the bytes that do not grow with the batch and, per sequence, k bytes and f FLOPs:
    B f / peak >= (W + B k) / bw, so B >= (W / bw) / (f / peak - k / bw) when f / peak > k / bw."""
    bw, peak = _check_machine("compute_bound_batch", bandwidth, peak_flops)
    check_int("compute_bound_batch: context", context, 0)
    fixed = matmul_params(cfg) * cfg.dtype_bytes
    per_seq_bytes = decode_step_bytes(cfg, 1, context) - fixed
    per_seq_flops = decode_step_flops(cfg, 1, context)
    gain = per_seq_flops / peak - per_seq_bytes / bw
    if gain <= 0:
        return None
    b = max(1, math.ceil(fixed / bw / gain))
    # the closed form in floating point can be one off at the boundary: settle it with the counts
    while b > 1 and decode_step_flops(cfg, b - 1, context) / peak >= (
            decode_step_bytes(cfg, b - 1, context) / bw):
        b -= 1
    while decode_step_flops(cfg, b, context) / peak < decode_step_bytes(cfg, b, context) / bw:
        b += 1
    return b
# --8<-- [end:roofline]


# --8<-- [start:prefill]
def prefill_flops(cfg: DecoderConfig, prompt: int) -> int:
    """FLOPs of processing a prompt of ``prompt`` tokens at once: 2 per matmul weight per token,
    and causal attention's q.k and p*v, 4 * head_dim per query head per (query, key) pair with
    key <= query: prompt * (prompt + 1) / 2 pairs."""
    check_int("prefill_flops: prompt", prompt, 1)
    pairs = prompt * (prompt + 1) // 2
    return 2 * matmul_params(cfg) * prompt + 4 * cfg.layers * cfg.heads * cfg.head_dim * pairs


def prefill_bytes(cfg: DecoderConfig, prompt: int) -> int:
    """Bytes a prefill must move: the weights once, the prompt's embedding rows, and the K and V
    of every prompt token written to the cache (attention reads them back from on-chip tiles)."""
    check_int("prefill_bytes: prompt", prompt, 1)
    weights = (matmul_params(cfg) + prompt * cfg.hidden) * cfg.dtype_bytes
    return weights + prompt * kv_bytes_per_token(cfg)


def prefill_intensity(cfg: DecoderConfig, prompt: int) -> float:
    """FLOPs per byte of a prefill: about ``prompt`` FLOPs per weight byte pair, against decode's
    about ``batch``."""
    return prefill_flops(cfg, prompt) / prefill_bytes(cfg, prompt)
# --8<-- [end:prefill]

"""Attention's reference, inputs, cost model and library baselines: what Part 5's FlashAttention
(Triton) and Part 6's Hopper forward and backward (CUDA) are all judged by, written once.

``o = softmax(q k^T * scale) v`` for each (batch, head), q, k, v and o of shape (B, H, S, D),
scale = 1/sqrt(D), with an optional causal mask (query i sees keys j <= i).

- ``attention_ref``, ``attention_bwd_ref``: attention as written on paper, one head at a time, and
  the closed form of its gradients, in the inputs' dtype (the tests pass float64).
- ``make_inputs``, ``make_inputs_bwd``: the registered ops' inputs (N(0, 1), never zeros), the
  backward's with an empty slot in which each version keeps what its forward saved.
- ``attention_flops``, ``attention_bwd_flops``, ``attention_bytes``, ``attention_bwd_bytes``:
  FlashAttention-2's FLOP convention (two products of 2 S^2 D per head forward, five backward,
  halved by the causal mask; exponentials not counted) and the bytes a fused kernel must move.
- ``sdpa``, ``sdpa_backward``, ``cudnn_missing``: PyTorch's scaled_dot_product_attention with one
  backend forced (the library rows), its backward timed alone, and why cuDNN's backend cannot run.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from snippets.registry import device_generator


# --8<-- [start:reference]
def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), masked if causal) v, one (batch, head) at a time, in q's dtype.

    This is attention as it is written on paper: each head materialises its S x S scores, then its S
    x S probabilities, in device memory. One head at a time keeps that at S*S elements (2 GiB of
    float64 at S = 16384) instead of B*H times as much; the FLOPs are 4*S*S*D per head
    either way."""
    b, h, s, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1) if causal else None
    for i in range(b):
        for j in range(h):
            scores = (q[i, j] @ k[i, j].T) * scale           # (S, S)
            if causal:
                scores = scores.masked_fill(mask, float("-inf"))
            out[i, j] = torch.softmax(scores, dim=-1) @ v[i, j]
    return out


def attention_bwd_ref(q, k, v, do, causal: bool = False, saved=None):
    """The gradients (dq, dk, dv) of sum(o * do), by the closed form Part 5 derives: with P the
    probabilities and dP = dO V^T,  dV = P^T dO,  dS = P * (dP - rowsum(dO * O)),  dQ = dS K *
    scale, dK = dS^T Q * scale. ``saved`` is the slot the versions keep their forward in; the
    reference ignores it."""
    b, h, s, d = q.shape
    scale = 1.0 / math.sqrt(d)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1) if causal else None
    for i in range(b):
        for j in range(h):
            scores = (q[i, j] @ k[i, j].T) * scale
            if causal:
                scores = scores.masked_fill(mask, float("-inf"))
            p = torch.softmax(scores, dim=-1)
            o = p @ v[i, j]
            dv[i, j] = p.T @ do[i, j]
            dp = do[i, j] @ v[i, j].T
            ds = p * (dp - (do[i, j] * o).sum(dim=-1, keepdim=True))
            dq[i, j] = ds @ k[i, j] * scale
            dk[i, j] = ds.T @ q[i, j] * scale
    return dq, dk, dv
# --8<-- [end:reference]


def make_inputs(size, dtype, device, gen):
    """q, k, v ~ N(0, 1) of shape (B, H, S, D) in ``dtype``, and the causal flag of the size."""
    g = device_generator(gen, device)
    shape = (size["b"], size["h"], size["s"], size["d"])
    q, k, v = (torch.randn(shape, generator=g, device=device).to(dtype) for _ in range(3))
    return q, k, v, size["causal"]


def make_inputs_bwd(size, dtype, device, gen):
    """The forward's inputs, an incoming gradient do ~ N(0, 1), the causal flag, and an empty slot
    (a dict) in which each version keeps what its forward saved for the backward."""
    q, k, v, causal = make_inputs(size, dtype, device, gen)
    do = torch.randn(q.shape, generator=device_generator(gen, device), device=device).to(dtype)
    return q, k, v, do, causal, {}


def attention_flops(size, dtype) -> int:
    """Two matmuls of 2*S*S*D per head (Q K^T and P V); the causal mask halves them
    (FlashAttention-2's count, which does not subtract the diagonal blocks' masked half)."""
    f = 4 * size["b"] * size["h"] * size["s"] * size["s"] * size["d"]
    return f // 2 if size["causal"] else f


def attention_bwd_flops(size, dtype) -> int:
    """Five matmuls against the forward's two (S and dP recomputed, then dV, dQ, dK): 2.5 times
    the forward."""
    return 5 * attention_flops(size, dtype) // 2


def attention_bytes(size, dtype) -> int:
    """Read q, k, v; write o."""
    return 4 * size["b"] * size["h"] * size["s"] * size["d"] * dtype.itemsize


def attention_bwd_bytes(size, dtype) -> int:
    """Read q, k, v, o, do and the fp32 log-sum-exp; write dq, dk, dv."""
    bhs = size["b"] * size["h"] * size["s"]
    return 8 * bhs * size["d"] * dtype.itemsize + 4 * bhs


# --8<-- [start:sdpa]
def sdpa(backend: SDPBackend, q, k, v, causal: bool) -> torch.Tensor:
    """SDPA with only ``backend`` allowed: it raises instead of silently falling back to
    another kernel."""
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))


def sdpa_backward(backend: SDPBackend, key: str, q, k, v, do, causal: bool, saved: dict | None):
    """The backward of SDPA with ``backend``. The first call on an input set runs the forward on
    leaves that require gradients and keeps the graph in ``saved[key]``; every call then runs only
    the backward, with ``retain_graph=True`` so that the saved tensors survive for the next one."""
    if saved is None:
        saved = {}
    if key not in saved:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))  # views, no copies
        saved[key] = (sdpa(backend, *leaves, causal), leaves)
    o, leaves = saved[key]
    return torch.autograd.grad(o, leaves, do, retain_graph=True)


@functools.lru_cache(maxsize=None)
def cudnn_missing() -> str | None:
    """For ``Impl(requires=...)``: why SDPA's cuDNN backend cannot run here, or None. Tried on a
    tiny bf16 problem, forward and backward: the backend's own checks (GPU generation, cuDNN
    version, head dim) are what decide, and they raise when they refuse."""
    if not torch.cuda.is_available():
        return "cuDNN attention needs a CUDA GPU"
    try:
        q = torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        sdpa(SDPBackend.CUDNN_ATTENTION, q, q, q, False).sum().backward()
    except RuntimeError as e:
        return f"SDPA's cuDNN backend is not available here: {str(e).splitlines()[0][:200]}"
    return None
# --8<-- [end:sdpa]

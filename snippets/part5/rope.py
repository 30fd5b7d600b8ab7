"""Rotary position embedding (RoPE) of queries and keys, forward and backward, in Triton.

Each head vector ``x`` of length D, at sequence position s, is cut into halves ``x1 = x[:D/2]``,
``x2 = x[D/2:]`` and pair ``(x1[i], x2[i])`` is rotated by the angle ``s * theta_i``:
``y = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)`` and tables ``cos``,
``sin`` of shape (S, D) precomputed as ``cat(freqs, freqs).cos()`` (``.sin()``), the layout of
HuggingFace's Llama and of Liger-Kernel. q is (B, S, H, D) and k is (B, S, H_kv, D), contiguous: the
storage order of the projections ``x @ W_q`` viewed per head, which HuggingFace then transposes to
(B, H, S, D) without a copy. Both are rotated in one launch, as
``apply_rotary_pos_emb(q, k, cos, sin)`` does. Two ops are registered.

Versions of ``rope`` (the forward, returning (q_rot, k_rot); never renumbered):

- v0  eager PyTorch, HuggingFace's formula ``q * cos + rotate_half(q) * sin``: several kernels per
      tensor (a copy for each half of rotate_half, its concatenation, two products and a sum).
- v1  the same formula through ``torch.compile``: one fused kernel.
- v2  Liger-Kernel's ``rope_forward``, which rotates q and k in place (as its module does in
  a model).
- v3  Triton, this chapter's kernel: one program per token rotates all H + H_kv heads of that token;
      each half of each head is loaded once and both outputs of a pair are computed from the
      two loads.

Versions of ``rope_fwd_bwd`` (forward and backward of a training step, returning (dq, dk)):

- v0  eager autograd through the formula.
- v1  like v0 with the forward compiled.
- v2  Liger-Kernel's ``LigerRopeFunction`` (rotates dq, dk in place in the backward).
- v3  Triton, :class:`RoPEFunction`: the same kernel with ``BACKWARD=True`` rotates the incoming
      gradients by the opposite angle (the transpose of a rotation is its inverse); nothing but cos
      and sin is saved.

The goal: the forward and the forward + backward at least as fast as torch.compile's and
Liger-Kernel's, at B 4, S 4096, 32 query heads, 8 key-value heads (Llama-3 8B's grouping), D
128, bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, check_tensors, refuse_grad, triton_device, wants_grad
from snippets.common.baselines import compiled, grads_through, liger, liger_missing, needs_gpu
from snippets.registry import Impl, Op, device_generator, register

FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
BASE = 500000.0  # Llama 3's rope_theta


# --8<-- [start:reference]
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """cat(-x2, x1) over the last dimension: the 90-degree turn of every pair (x1[i], x2[i])."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_ref(q, k, cos, sin):
    """q (B, S, H, D), k (B, S, H_kv, D), cos and sin (S, D): y = x * cos + rotate_half(x) * sin for
    both. Reads q and k, writes their rotations, reads the tables: 2 * B*S*(H + H_kv)*D +
    2*S*D elements."""
    c, s = cos[:, None, :], sin[:, None, :]  # (S, 1, D): broadcast over batch and heads
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rope_fwd_bwd_ref(q, k, cos, sin, dq_rot, dk_rot):
    """Gradients of sum(q_rot * dq_rot) + sum(k_rot * dk_rot). y = x*cos + rotate_half(x)*sin is
    linear in x; its transpose is dx = dy*cos + rotate_half^T(dy*sin), and rotate_half^T
    = -rotate_half."""
    c, s = cos[:, None, :], sin[:, None, :]
    return dq_rot * c - rotate_half(dq_rot * s), dk_rot * c - rotate_half(dk_rot * s)
# --8<-- [end:reference]


def rope_tables(seq_len: int, head_dim: int, dtype=torch.float32, device="cpu", base: float = BASE):
    """cos and sin of shape (S, D): position s times inv_freq_i = base^(-2i/D), the D/2 angles
    written twice (HuggingFace's layout), computed in fp32 and rounded to ``dtype`` as a model
    stores them."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
                        / head_dim)
    freqs = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# --------------------------------------------------------------------------------------------------
# Library baselines
# --------------------------------------------------------------------------------------------------

def rope_torch(q, k, cos, sin):
    """v0: HuggingFace's ``apply_rotary_pos_emb`` on the (B, S, H, D) layout, eager."""
    return rope_ref(q, k, cos, sin)


_rope_compiled = compiled(rope_torch)


def rope_compiled(q, k, cos, sin):
    """v1: the formula through torch.compile: one kernel reads q, k and the tables and writes
    both outputs."""
    return _rope_compiled(q, k, cos, sin)


def rope_fwd_bwd_torch(q, k, cos, sin, dq_rot, dk_rot):
    """v0: eager autograd through the formula: q, k as fresh leaves (views), the forward,
    ``torch.autograd.grad`` into q and k."""
    return grads_through(lambda q, k: rope_torch(q, k, cos, sin), (q, k), (dq_rot, dk_rot))


def rope_fwd_bwd_compiled(q, k, cos, sin, dq_rot, dk_rot):
    """v1: like v0 with the forward compiled; AOTAutograd compiles the backward."""
    return grads_through(lambda q, k: _rope_compiled(q, k, cos, sin), (q, k), (dq_rot, dk_rot))


def rope_liger(q, k, cos, sin):
    """v2: Liger-Kernel's ``rope_forward``, given the (B, H, S, D) views HuggingFace passes. It
    rotates q and k in place (their storage is the (B, S, H, D) tensors given here) and returns
    views of them."""
    q_rot, k_rot, _, _ = liger("rope").rope_forward(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q_rot.transpose(1, 2), k_rot.transpose(1, 2)


def rope_fwd_bwd_liger(q, k, cos, sin, dq_rot, dk_rot):
    """v2: ``LigerRopeFunction`` on the (B, H, S, D) views, forward and backward; both rotate in
    place (the backward rotates the incoming gradients dq_rot, dk_rot)."""
    q, k = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k))
    out = liger("rope").LigerRopeFunction.apply(q, k, cos, sin)
    dq, dk = torch.autograd.grad(out, (q, k), (dq_rot.transpose(1, 2), dk_rot.transpose(1, 2)))
    return dq.transpose(1, 2), dk.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
# One program per token. At the headline a token is 32 query heads and 8 key-value heads of 128: 10
# KiB of bf16 in and 10 KiB out. 4 warps: each thread holds 32 elements of q's two half-tiles and 8
# of k's (four 16-byte vectors of q), and an SM keeps up to 16 such programs resident, over 100 KiB
# of loads in flight. 16384 tokens make 16384 programs. Liger-Kernel's RoPE launches the same grid
# with the same 4 warps.
CONFIG = {"num_warps": 4}
# --8<-- [end:configs]


# --8<-- [start:kernel]
@triton.jit
def _load_halves(x_ptr, token, n_heads, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, COMPUTE: tl.constexpr):
    # The (n_heads, HEAD_DIM) slice of one token, as two (BLOCK_H, BLOCK_HALF) tiles: the first and
    # second halves of every head. Each element is loaded once; pair i of a head is (x1[:, i],
    # x2[:, i]).
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < HEAD_DIM // 2)[None, :]
    offs = token.to(tl.int64) * n_heads * HEAD_DIM + heads[:, None] * HEAD_DIM + cols[None, :]
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    x2 = tl.load(x_ptr + offs + HEAD_DIM // 2, mask=mask, other=0.0).to(COMPUTE)
    return x1, x2, offs, mask


@triton.jit
def _store_rotated(y_ptr, x1, x2, offs, mask, c1, c2, sa, sb, HEAD_DIM: tl.constexpr):
    # y1 = x1 * cos1 - x2 * sin1,  y2 = x2 * cos2 + x1 * sin2  (sa, sb: the sines, signed for
    # the direction)
    y1 = x1 * c1[None, :] - x2 * sa[None, :]
    y2 = x2 * c2[None, :] + x1 * sb[None, :]
    tl.store(y_ptr + offs, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + offs + HEAD_DIM // 2, y2.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, S, H, H_KV,
                 HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HKV: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, COMPUTE: tl.constexpr):
    token = tl.program_id(0)  # b * S + s
    pos = token % S
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HEAD_DIM // 2
    # Every load of the token before any store: the compiler cannot move a load of k above a store
    # to qo (for all it knows they overlap), so storing q first would leave k's loads waiting for
    # q's round trip.
    q1, q2, q_offs, q_mask = _load_halves(q_ptr, token, H, HEAD_DIM, BLOCK_H, BLOCK_HALF, COMPUTE)
    k1, k2, k_offs, k_mask = _load_halves(k_ptr, token, H_KV, HEAD_DIM, BLOCK_HKV, BLOCK_HALF,
                                          COMPUTE)
    # The table row of this position, once for all heads of q and k (the tables are 2 * S * D
    # elements in total and stay in L2; every batch reads the same rows).
    row = cos_ptr + pos * HEAD_DIM + cols
    c1 = tl.load(row, mask=col_ok, other=0.0).to(COMPUTE)
    c2 = tl.load(row + HEAD_DIM // 2, mask=col_ok, other=0.0).to(COMPUTE)
    row = sin_ptr + pos * HEAD_DIM + cols
    s1 = tl.load(row, mask=col_ok, other=0.0).to(COMPUTE)
    s2 = tl.load(row + HEAD_DIM // 2, mask=col_ok, other=0.0).to(COMPUTE)
    # the transpose: dx1 = c1 dy1 + s2 dy2, dx2 = c2 dy2 - s1 dy1; with RoPE's tables, the
    # angle -theta
    if BACKWARD:
        sa = -s2
        sb = -s1
    else:
        sa = s1
        sb = s2
    _store_rotated(qo_ptr, q1, q2, q_offs, q_mask, c1, c2, sa, sb, HEAD_DIM)
    _store_rotated(ko_ptr, k1, k2, k_offs, k_mask, c1, c2, sa, sb, HEAD_DIM)
# --8<-- [end:kernel]


# --8<-- [start:host]
def _check_inputs(q, k, cos, sin, dtypes) -> None:
    """q (B, S, H, D) and k (B, S, H_kv, D) with D even, cos and sin (S, D); one dtype and
    device, contiguous."""
    check_tensors(("q", "k", "cos", "sin"), (q, k, cos, sin), dtypes=dtypes, device=triton_device(),
                  same_shape=False)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError("q and k must be (batch, seq, heads, head_dim), got shapes "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    (b, s, _, d), (bk, sk, _, dk) = q.shape, k.shape
    if (b, s, d) != (bk, sk, dk):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seq and "
                         "head_dim")
    if d % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of elements), got {d}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (s, d):
            raise ValueError(f"{name} must have shape (seq, head_dim) = ({s}, {d}), got "
                             f"{tuple(t.shape)}")


def _rope_launch(q, k, cos, sin, backward: bool):
    """Rotate every head of q and k (by -theta if ``backward``) into new tensors; inputs
    already checked."""
    b, s, h, d = q.shape
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if b * s == 0 or d == 0:
        return qo, ko
    compute = tl.float64 if q.dtype == torch.float64 else tl.float32
    _rope_kernel[(b * s,)](q, k, cos, sin, qo, ko, s, h, k.shape[2], HEAD_DIM=d,
                           BLOCK_H=triton.next_power_of_2(max(h, 1)),
                           BLOCK_HKV=triton.next_power_of_2(max(k.shape[2], 1)),
                           BLOCK_HALF=triton.next_power_of_2(max(d // 2, 1)), BACKWARD=backward,
                           COMPUTE=compute, num_warps=CONFIG["num_warps"])
    return qo, ko


def rope_triton(q, k, cos, sin):
    """v3: (q_rot, k_rot) in one launch; new tensors of q's and k's shapes. With grad mode on and q
    or k requiring grad, the call goes through RoPEFunction (below), whose backward gives q and k
    their gradients; the tables get none, so a cos or sin that requires grad is refused."""
    _check_inputs(q, k, cos, sin, FLOAT_TYPES)
    refuse_grad("rope_triton", cos, sin, instead="rope_torch",
                why="computes no gradient for its tables: cos or sin requires grad")
    if wants_grad(q, k):
        return RoPEFunction.apply(q, k, cos, sin)
    return _rope_launch(q, k, cos, sin, backward=False)
# --8<-- [end:host]


# --8<-- [start:function]
class RoPEFunction(torch.autograd.Function):
    """RoPE that trains. Nothing is saved but the tables (already held by the model): the backward
    needs no activation, only the angles. float64 is accepted too, for torch.autograd.gradcheck."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        _check_inputs(q, k, cos, sin, (*FLOAT_TYPES, torch.float64))
        ctx.save_for_backward(cos, sin)
        return _rope_launch(q, k, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dq_rot, dk_rot):
        cos, sin = ctx.saved_tensors
        dq, dk = _rope_launch(dq_rot.contiguous(), dk_rot.contiguous(), cos, sin, backward=True)
        return dq, dk, None, None


def rope_fwd_bwd_triton(q, k, cos, sin, dq_rot, dk_rot):
    """v3: RoPEFunction through autograd: one launch forward, one backward."""
    refuse_grad("rope_fwd_bwd_triton", q, k, cos, sin, dq_rot, dk_rot, instead="rope_triton",
                why=GRADS_ONLY)
    check_tensors(("q", "dq_rot"), (q, dq_rot), dtypes=FLOAT_TYPES, device=triton_device())
    check_tensors(("k", "dk_rot"), (k, dk_rot), dtypes=FLOAT_TYPES, device=triton_device())
    return grads_through(lambda q, k: RoPEFunction.apply(q, k, cos, sin), (q, k),
                         (dq_rot, dk_rot))
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """q ~ N(0, 1) of (B, S, H, D), k ~ N(0, 1) of (B, S, H_kv, D), and Llama 3's tables
    in ``dtype``."""
    g = device_generator(gen, device)
    b, s, h, hkv, d = size["b"], size["s"], size["h"], size["hkv"], size["d"]
    q = torch.randn(b, s, h, d, generator=g, device=device).to(dtype)
    k = torch.randn(b, s, hkv, d, generator=g, device=device).to(dtype)
    return (q, k, *rope_tables(s, d, dtype, device))


def _make_inputs_fwd_bwd(size, dtype, device, gen):
    """The forward's inputs and incoming gradients of q_rot's and k_rot's shapes, N(0, 1)."""
    q, k, cos, sin = _make_inputs(size, dtype, device, gen)
    g = device_generator(gen, device)
    return q, k, cos, sin, torch.randn(q.shape, generator=g, device=device).to(dtype), \
        torch.randn(k.shape, generator=g, device=device).to(dtype)


def _tokens_x_dims(size) -> int:
    return size["b"] * size["s"] * (size["h"] + size["hkv"]) * size["d"]


def _bytes(size, dtype) -> int:
    """Read q and k, write their rotations, read cos and sin once."""
    return (2 * _tokens_x_dims(size) + 2 * size["s"] * size["d"]) * dtype.itemsize


def _bytes_fwd_bwd(size, dtype) -> int:
    """The forward, and the backward: read dq_rot, dk_rot, write dq, dk, read the tables again."""
    return (4 * _tokens_x_dims(size) + 4 * size["s"] * size["d"]) * dtype.itemsize


HEADLINE = {"b": 4, "s": 4096, "h": 32, "hkv": 8, "d": 128}  # bf16: 128 MiB of q, 32 MiB of k
SWEEP = [{"b": 4, "s": s, "h": 32, "hkv": 8, "d": 128} for s in (1024, 2048, 4096, 8192, 16384)]
TEST_SIZES = [{"b": 1, "s": 1, "h": 1, "hkv": 1, "d": 2},
              {"b": 2, "s": 5, "h": 3, "hkv": 1, "d": 10},
              {"b": 1, "s": 17, "h": 4, "hkv": 2, "d": 64},
              {"b": 3, "s": 33, "h": 5, "hkv": 3, "d": 80},
              {"b": 2, "s": 7, "h": 2, "hkv": 2, "d": 130}]
# fp32 arithmetic rounded once: half an ulp of the output type plus fp32's. The library versions
# compute in the input type: two products and a sum, each rounded, which for |x| up to ~6 (the
# largest of 10^8 normal samples) is up to half an ulp of 4..8 per product: 2^-6 for bf16, 2^-9 for
# fp16; hence the atol of two such roundings.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 5e-3),
              torch.bfloat16: (1.6e-2, 4e-2)}
SOURCES = (_rope_kernel, _load_halves, _store_rotated, _rope_launch, _check_inputs)
BWD_SOURCES = (*SOURCES, RoPEFunction.forward, RoPEFunction.backward, grads_through)

rope = register(Op(
    name="rope", part=5, chapter="part5/norms-activations.md", title="RoPE forward (q and k)",
    reference=rope_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: 3 * _tokens_x_dims(s), metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES, sweep_axis="s"))
rope.add(Impl("v0", rope_torch, "PyTorch", "q * cos + rotate_half(q) * sin (HF)",
              (rope_ref, rotate_half), device="any"))
rope.add(Impl("v1", rope_compiled, "Triton", "torch.compile of the HF formula",
              (rope_ref, rotate_half), device="cuda", requires=needs_gpu, origin="library"))
rope.add(Impl("v2", rope_liger, "Triton", "Liger-Kernel 0.8.5 rope_forward (in place)", (liger,),
              device="cuda", requires=liger_missing, origin="library"))
rope.add(Impl("v3", rope_triton, "Triton", "program per token, halves loaded once", SOURCES,
              device="any"))

rope_fwd_bwd = register(Op(
    name="rope_fwd_bwd", part=5, chapter="part5/norms-activations.md",
    title="RoPE forward + backward", reference=rope_fwd_bwd_ref, make_inputs=_make_inputs_fwd_bwd,
    bytes_moved=_bytes_fwd_bwd, flops=lambda s, d: 6 * _tokens_x_dims(s), metric="GB/s",
    ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="s",
    measure_memory=True))
rope_fwd_bwd.add(Impl("v0", rope_fwd_bwd_torch, "PyTorch", "HF formula + torch.autograd.grad",
                      (rope_ref, rotate_half, grads_through), device="any"))
rope_fwd_bwd.add(Impl("v1", rope_fwd_bwd_compiled, "Triton", "torch.compile forward and backward",
                      (rope_ref, rotate_half, grads_through), device="cuda", requires=needs_gpu,
                      origin="library"))
rope_fwd_bwd.add(Impl("v2", rope_fwd_bwd_liger, "Triton",
                      "Liger-Kernel 0.8.5 LigerRopeFunction (in place)", (liger,), device="cuda",
                      requires=liger_missing, origin="library"))
rope_fwd_bwd.add(Impl("v3", rope_fwd_bwd_triton, "Triton",
                      "RoPEFunction: BACKWARD constexpr, angle -theta", BWD_SOURCES, device="any"))

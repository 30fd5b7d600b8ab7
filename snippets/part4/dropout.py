"""Dropout that stores nothing for its backward: a counter-based generator (Philox) makes the
mask again.

Dropout keeps each element with probability ``1 - p`` and scales the kept ones by ``1 / (1 - p)``:
``y = x * keep / (1 - p)``. The backward needs the same ``keep`` bits: ``dx = dy * keep / (1 - p)``.

Versions of ``dropout`` (never renumbered). Every version takes ``(x, p, seed)`` and returns ``y``:

- v0  ``torch.nn.functional.dropout(x, p, training=True)``: the library baseline. It draws from
      torch's own generator (``seed`` is not used) and, on the GPU, writes a one-byte mask beside
      ``y`` for its backward.
- v1  Triton: ``tl.rand(seed, i)`` for element ``i``, keep when it is ``>= p``; writes ``y`` and a
      uint8 keep mask (the classic design: the backward reads the mask). ``n`` bytes more written
      than the output needs.
- v2  Triton, like v1 but no mask is written: the random number of element ``i`` is a pure function
      of ``(seed, i)``, so the backward runs the same kernel on ``dy`` with the same seed and gets
      the same keep bits. The forward moves only ``x`` and ``y``; nothing is kept between forward
      and backward but an integer.
- v3  Triton, like v2 but one Philox evaluation gives four uniform numbers (``tl.rand4x``), used by
      four neighbouring elements: a quarter of v2's Philox evaluations (ten rounds of two 32x32-bit
      multiplies each), which make v2 wait for integer arithmetic rather than memory; a different
      but equally reproducible stream.

Cost model: ``n * itemsize`` bytes read and ``n * itemsize`` written (v1's and v0's mask is extra
traffic the model does not count, so it shows as a lower rate); one multiply per element (counted as
n FLOPs).

The random numbers are Triton's Philox-4x32 with 10 rounds. ``philox4x32``, ``randint_ref`` and
``rand_ref`` below compute the same numbers with NumPy, bit for bit, so the reference of v2 and v3
is exact. ``p = 1`` returns zeros (every element dropped, as in torch) rather than dividing by zero;
``p`` outside ``[0, 1]`` is refused. Dropped elements are written as exact zeros with ``tl.where``
(not ``x * 0``), so an ``inf`` or ``nan`` in a dropped position gives 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, check_tensors, refuse_grad, triton_device, wants_grad
from snippets.common.dropout import (
    BLOCK,
    FLOAT_TYPES,
    NUM_WARPS,
    check_dropout_args,
    dropout_kernel,
    keep_ref,
    seeded_dropout,
)
from snippets.registry import Impl, Op, device_generator, register

# Philox-4x32-10 in NumPy (the exact reference of v2 and v3, keep_ref), the checks of p and the
# seed, v2's kernel and its host function seeded_dropout are in snippets.common.dropout: Part 5's
# fused chain uses them too.


# --8<-- [start:reference]
def dropout_ref(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """Dropout with v2's random numbers: element i (of x flattened) is kept when rand(seed, i) >= p,
    and scaled by 1 / (1 - p); p = 1 drops everything. Reads n * itemsize bytes and writes n
    * itemsize."""
    keep = torch.from_numpy(keep_ref(seed, p, x.numel())).to(x.device).view(x.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return torch.where(keep, x * scale, torch.zeros_like(x))
# --8<-- [end:reference]


# --8<-- [start:torch]
def dropout_torch(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """v0: torch's dropout in training mode (its own generator: ``seed`` is not used)."""
    return F.dropout(x, p, training=True)
# --8<-- [end:torch]


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kernel4x]
@triton.jit
def _dropout4x_kernel(x_ptr, y_ptr, n, p, scale, seed, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK % 4 == 0, "four elements per Philox counter")
    pid = tl.program_id(0).to(tl.int64)
    counters = pid * (BLOCK // 4) + tl.arange(0, BLOCK // 4)      # one counter per 4 elements
    u0, u1, u2, u3 = tl.rand4x(seed, counters)
    # element 4j + c takes word c of counter j. tl.join(a, b) adds a last axis of 2, so the outer
    # join puts (u0, u1) at [j, 0, :] and (u2, u3) at [j, 1, :]: the (BLOCK/4, 2, 2) result in
    # row-major order is u0, u1, u2, u3 of counter 0, then of counter 1, ...
    u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BLOCK,))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    x = tl.load(x_ptr + offs, mask=in_range)
    y = tl.where(u >= p, x.to(tl.float32) * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=in_range)
# --8<-- [end:kernel4x]


# --8<-- [start:mask_backward]
@triton.jit
def _apply_mask_kernel(dy_ptr, mask_ptr, dx_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    dy = tl.load(dy_ptr + offs, mask=in_range)
    keep = tl.load(mask_ptr + offs, mask=in_range) != 0
    dx = tl.where(keep, dy.to(tl.float32) * scale, 0.0)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=in_range)
# --8<-- [end:mask_backward]


# --8<-- [start:host_v1]
def dropout_with_mask(x: torch.Tensor, p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """v1's forward: ``(y, mask)``, the mask a uint8 tensor of x's shape (1 = kept) for
    the backward."""
    refuse_grad("dropout_with_mask", x, instead="dropout_masked or MaskedDropout.apply")
    p, scale, seed = check_dropout_args(x, p, seed)
    y, mask = torch.empty_like(x), torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    n = x.numel()
    if n:
        dropout_kernel[(triton.cdiv(n, BLOCK),)](x, y, mask, n, p, scale, seed, BLOCK=BLOCK,
                                                 STORE_MASK=True, num_warps=NUM_WARPS)
    return y, mask


def dropout_mask_backward(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """v1's backward: ``dx = dy * mask / (1 - p)`` from the stored mask."""
    refuse_grad("dropout_mask_backward", dy, instead="MaskedDropout.apply", why=GRADS_ONLY)
    p, scale, _ = check_dropout_args(dy, p, 0)
    check_tensors(("mask",), (mask,), dtypes=(torch.uint8,), device=triton_device())
    if mask.shape != dy.shape or mask.device != dy.device:
        raise ValueError(f"mask has shape {tuple(mask.shape)} on {mask.device}, dy has shape "
                         f"{tuple(dy.shape)} on {dy.device}")
    dx, n = torch.empty_like(dy), dy.numel()
    if n:
        _apply_mask_kernel[(triton.cdiv(n, BLOCK),)](dy, mask, dx, n, scale, BLOCK=BLOCK,
                                                     num_warps=NUM_WARPS)
    return dx


def dropout_masked(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """v1: y, with the mask written (and dropped here; ``dropout_with_mask`` returns it). When x
    requires grad (and grad mode is on), ``MaskedDropout`` below, which keeps the mask for
    the backward."""
    if wants_grad(x):
        return MaskedDropout.apply(x, p, seed)
    return dropout_with_mask(x, p, seed)[0]
# --8<-- [end:host_v1]


# --8<-- [start:host_v3]
def seeded_dropout4x(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """v3: like v2, one Philox evaluation for four neighbouring elements (its own stream,
    see keep_ref)."""
    refuse_grad("seeded_dropout4x", x, instead="SeededDropout.apply")
    p, scale, seed = check_dropout_args(x, p, seed)
    y, n = torch.empty_like(x), x.numel()
    if n:
        _dropout4x_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, p, scale, seed, BLOCK=BLOCK,
                                                    num_warps=NUM_WARPS)
    return y
# --8<-- [end:host_v3]


# --8<-- [start:autograd]
class SeededDropout(torch.autograd.Function):
    """Dropout for training that saves no tensor: the backward regenerates the keep bits from the
    seed. ``SeededDropout.apply(x, p, seed)``; each layer and each step needs its own seed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
        y = seeded_dropout(x, p, seed)
        ctx.p, ctx.seed = p, seed          # two Python numbers: all the backward needs
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # d(x * keep * scale)/dx = keep * scale: the forward kernel applied to dy with the
        # same seed.
        return seeded_dropout(dy.contiguous(), ctx.p, ctx.seed), None, None


class MaskedDropout(torch.autograd.Function):
    """The classic design, for comparison: the forward saves a one-byte mask per element for
    the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
        y, mask = dropout_with_mask(x, p, seed)
        ctx.save_for_backward(mask)
        ctx.p = p
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return dropout_mask_backward(dy.contiguous(), mask, ctx.p), None, None
# --8<-- [end:autograd]


# --------------------------------------------------------------------------------------------------
# The check of a random output, and registration
# --------------------------------------------------------------------------------------------------

# --8<-- [start:check]
def check_dropout(out: torch.Tensor, args: tuple, dtype: torch.dtype, sigmas: float = 6.0) -> None:
    """Raise AssertionError unless ``out`` is a possible dropout of ``args = (x, p, seed)``: every
    element is 0 or x / (1 - p) (to within two roundings of ``dtype``), and the number kept is
    within ``sigmas`` standard deviations of the binomial mean n (1 - p). Elements where x is 0 tell
    nothing and are left out."""
    x, p, _ = args
    assert isinstance(out, torch.Tensor), f"dropout returned {type(out).__name__}, not a tensor"
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device, (
        f"output {tuple(out.shape)} {out.dtype} {out.device}, input {tuple(x.shape)} {x.dtype} "
        f"{x.device}")
    o, xd = out.double().flatten(), x.double().flatten()
    informative = xd != 0
    o, xd = o[informative], xd[informative]
    assert not o.isnan().any(), "dropout output has NaN (unwritten) elements"
    scaled = xd * (0.0 if p == 1 else 1.0 / (1.0 - p))
    kept = o != 0
    tol = 2 * torch.finfo(dtype).eps * scaled.abs()
    bad = kept & ((o - scaled).abs() > tol)
    assert not bad.any(), (f"{int(bad.sum())} elements are neither 0 nor x/(1-p), e.g. "
                           f"{o[bad][:3].tolist()} for x/(1-p) = {scaled[bad][:3].tolist()}")
    n, k = o.numel(), int(kept.sum())
    mean, sd = n * (1 - p), math.sqrt(n * p * (1 - p))
    assert abs(k - mean) <= sigmas * sd + 1e-9, (
        f"kept {k} of {n} with p={p}: expected {mean:.1f} +- {sd:.1f} (binomial), off by "
        f"{abs(k - mean) / sd:.1f} sd")
# --8<-- [end:check]


# --8<-- [start:stats]
def chi_square_uniform(u: np.ndarray, bins: int = 64) -> tuple[float, float]:
    """Pearson's chi-square statistic of ``u`` against the uniform distribution on [0, 1) in
    ``bins`` equal bins, and the value a uniform sample exceeds with probability about 1e-6
    (Wilson-Hilferty approximation of the chi-square quantile with bins - 1 degrees of freedom, z
    = 4.75)."""
    counts = np.bincount(np.minimum((np.asarray(u, dtype=np.float64) * bins).astype(np.int64),
                                    bins - 1),
                         minlength=bins)
    expected = len(u) / bins
    stat = float(((counts - expected) ** 2 / expected).sum())
    k = bins - 1
    return stat, k * (1 - 2 / (9 * k) + 4.75 * math.sqrt(2 / (9 * k))) ** 3


def ks_uniform(u: np.ndarray) -> tuple[float, float]:
    """The Kolmogorov-Smirnov distance between the sample's distribution and U(0, 1), and the
    distance a uniform sample exceeds with probability about 1e-6 (the asymptotic bound sqrt(ln(2 /
    1e-6) / (2n)))."""
    u = np.sort(np.asarray(u, dtype=np.float64))
    n = len(u)
    i = np.arange(1, n + 1)
    d = float(max((i / n - u).max(), (u - (i - 1) / n).max()))
    return d, math.sqrt(math.log(2 / 1e-6) / (2 * n))


def lag_correlation(bits: np.ndarray, lag: int = 1) -> float:
    """Pearson correlation between element i and element i + lag of a 0/1 sequence (0 for
    independent bits, +-1 for a pattern that repeats or alternates). Its standard deviation for
    independent bits is 1/sqrt(n)."""
    b = np.asarray(bits, dtype=np.float64)
    a, c = b[:-lag], b[lag:]
    return float(((a - a.mean()) * (c - c.mean())).mean() / (a.std() * c.std()))
# --8<-- [end:stats]


P = 0.1  # the dropout rate of GPT-2 and BERT


def _make_inputs(size, dtype, device, gen):
    """x with |x| in [0.5, 1.5) and a random sign (no zeros: a zero output must mean "dropped"), p =
    0.1, and a seed drawn from ``gen``."""
    g = device_generator(gen, device)
    n = size["n"]
    mag = torch.rand(n, generator=g, device=device) + 0.5
    sign = torch.randint(0, 2, (n,), generator=g, device=device) * 2 - 1
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    return ((mag * sign).to(dtype), P, seed)


def _bytes(size, dtype) -> int:
    # x read, y written; no mask (the low-memory design's traffic)
    return 2 * size["n"] * dtype.itemsize


HEADLINE = {"n": 2**28}  # 1 GiB in and 1 GiB out in fp32: about 40x the H200's L2
SWEEP = [{"n": 2**k} for k in (20, 22, 24, 26, 28)]
TEST_SIZES = [{"n": n} for n in (1, 17, 123, 4097, 20001)]
_SRC = (check_dropout_args,)

dropout = register(Op(
    name="dropout", part=4, chapter="part4/dropout.md", title="Dropout",
    reference=dropout_ref, make_inputs=_make_inputs, bytes_moved=_bytes, flops=lambda s, d: s["n"],
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    test_sizes=TEST_SIZES, bench_dtypes=(torch.float32, torch.bfloat16), check=check_dropout))
dropout.add(Impl("v0", dropout_torch, "PyTorch",
                 "F.dropout(x, p, training=True), writes a bool mask"))
dropout.add(Impl("v1", dropout_masked, "Triton", "tl.rand per element, writes a uint8 mask",
                 (dropout_kernel, dropout_with_mask, *_SRC), device="any"))
dropout.add(Impl("v2", seeded_dropout, "Triton", "tl.rand per element, no mask (seeded)",
                 (dropout_kernel, *_SRC), device="any"))
dropout.add(Impl("v3", seeded_dropout4x, "Triton", "tl.rand4x: one Philox per 4 elements, no mask",
                 (_dropout4x_kernel, *_SRC), device="any"))

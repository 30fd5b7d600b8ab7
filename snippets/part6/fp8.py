"""FP8 on a CPU: the two formats, their rounding error, per-tensor and per-block scaling, and a
model of the limited-precision accumulation of FP8 tensor cores with its fix (promotion to fp32
every few K-steps).

Everything here is the arithmetic the FP8 GEMMs of the next chapters do, written with torch's float8
types so that it runs and is tested on a CPU: the kernels are checked against these functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# 4 exponent bits, 3 mantissa bits, no infinities: the format for weights and activations
E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2  # 5 exponent bits, 2 mantissa bits: more range, less precision (gradients)
FORMATS = (E4M3, E5M2)


# --8<-- [start:formats]
@dataclass(frozen=True)
class FormatFacts:
    """What an FP8 format can represent, derived from torch's description of it."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    max: float  # the largest finite value
    min_normal: float  # the smallest value with full precision
    min_subnormal: float  # the smallest non-zero value
    eps: float  # the gap between 1 and the next value: relative rounding error is at most eps / 2

    @property
    def dynamic_range(self) -> float:
        """max / min_subnormal, in powers of two: how many octaves the format spans."""
        return math.log2(self.max / self.min_subnormal)


def format_facts(dtype: torch.dtype) -> FormatFacts:
    if dtype not in FORMATS:
        raise TypeError(f"format_facts takes torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    exponent = 8 - 1 - mantissa
    return FormatFacts(
        str(dtype).removeprefix("torch."),
        exponent,
        mantissa,
        fi.max,
        fi.smallest_normal,
        fi.smallest_normal * 2.0**-mantissa,
        fi.eps,
    )


# --8<-- [end:formats]


def _check_float(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(
            f"{name} must be a floating-point tensor (fp32, fp64, bf16, fp16), got {x.dtype}"
        )


# --8<-- [start:scaling]
def quantize_per_tensor(
    x: torch.Tensor, dtype: torch.dtype = E4M3
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with ``q * scale`` close to ``x``: one scale for the whole tensor, chosen so
    that its largest magnitude maps to the format's largest value (no overflow, the most range
    used)."""
    _check_float(x, "x")
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = amax / format_facts(dtype).max
    return (x.float() / scale).to(dtype), scale


def quantize_blocks(
    x: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = E4M3
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) with one scale per ``block`` of a 2-D ``x``: (1, 128) for activations, (128,
    128) for weights, the recipe of DeepSeek-V3. ``scales`` has shape (rows / block rows,
    columns / block columns); an outlier then costs precision only in its own block."""
    _check_float(x, "x")
    if x.dim() != 2:
        raise ValueError(f"quantize_blocks takes a 2-D tensor, got shape {tuple(x.shape)}")
    (m, n), (bm, bn) = x.shape, block
    if bm < 1 or bn < 1 or m % bm or n % bn:
        raise ValueError(f"the shape {tuple(x.shape)} must be a multiple of the block {block}")
    tiles = x.float().reshape(m // bm, bm, n // bn, bn)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12)
    scales = amax / format_facts(dtype).max
    q = (tiles / scales).to(dtype).reshape(m, n)
    return q, scales.reshape(m // bm, n // bn)


def dequantize_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 values ``q`` stands for: each block times its scale."""
    (m, n), (gm, gn) = q.shape, scales.shape
    return (q.float().reshape(gm, m // gm, gn, n // gn) * scales.reshape(gm, 1, gn, 1)).reshape(
        m, n
    )


# --8<-- [end:scaling]


def relative_error(x: torch.Tensor, approx: torch.Tensor) -> float:
    """The root-mean-square error of ``approx`` relative to the root-mean-square of ``x``."""
    x64, a64 = x.double(), approx.double()
    return float((x64 - a64).pow(2).mean().sqrt() / x64.pow(2).mean().sqrt().clamp(min=1e-300))


# --8<-- [start:accumulation]
def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` with its mantissa cut to ``bits`` bits (towards zero): a model of an accumulator
    narrower than fp32's 23 bits."""
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.trunc(mantissa * 2.0**bits) / 2.0**bits, exponent)


def fp8_gemm_model(
    a_q: torch.Tensor,
    a_scales: torch.Tensor,
    b_q: torch.Tensor,
    b_scales: torch.Tensor,
    k_step: int = 32,
    accumulator_bits: int | None = None,
    promote_every: int | None = None,
) -> torch.Tensor:
    """C = A @ B.T for scaled FP8 operands (A: M x K, B: N x K), the way a Hopper FP8 GEMM
    computes it.

    Scales: ``a_scales`` is (1, 1) per tensor or (M, K / 128) per 1 x 128 block; ``b_scales`` is
    (1, 1) or
    (N / 128, K / 128) per 128 x 128 block. The tensor cores add ``k_step`` products of the raw FP8
    values at a time into an accumulator of ``accumulator_bits`` mantissa bits (None: fp32). Every
    ``promote_every`` K-steps (None: only at the end) the kernel multiplies that partial sum by the
    group's scales, adds it into an fp32 accumulator in registers, and restarts the narrow one from
    zero. Block scales change every 128 elements of K, so a block-scaled GEMM must promote at least
    that often: the scales cannot be applied inside the tensor cores' sum."""
    (m, k), (n, k2) = a_q.shape, b_q.shape
    if k != k2:
        raise ValueError(f"A is {tuple(a_q.shape)} and B is {tuple(b_q.shape)}: their K differ")
    group = promote_every * k_step if promote_every else k
    blocked = a_scales.shape[1] > 1 or b_scales.shape[1] > 1
    if k % group or (blocked and 128 % group):
        raise ValueError(
            f"promote every {group} elements of K: it must divide K = {k}"
            + (" and 128 (block scales change every 128)" if blocked else "")
        )
    a, b = a_q.float(), b_q.float()
    b_rows = (
        b_scales
        if b_scales.shape[0] == 1
        else b_scales.repeat_interleave(n // b_scales.shape[0], 0)
    )
    out = torch.zeros(m, n, dtype=torch.float32)
    for g0 in range(0, k, group):
        partial = torch.zeros(m, n, dtype=torch.float32)
        for k0 in range(g0, g0 + group, k_step):
            # products of two 3-bit mantissas are exact in fp32; the sum of k_step of
            # them is rounded
            partial = partial + a[:, k0 : k0 + k_step] @ b[:, k0 : k0 + k_step].T
            if accumulator_bits is not None:
                partial = round_mantissa(partial, accumulator_bits)
        kb = g0 // 128 if blocked else 0  # the scale block of this group
        out = out + partial * a_scales[:, kb : kb + 1] * b_rows[:, kb].reshape(1, -1)
    return out


# --8<-- [end:accumulation]


__all__ = [
    "E4M3",
    "E5M2",
    "FORMATS",
    "FormatFacts",
    "dequantize_blocks",
    "format_facts",
    "fp8_gemm_model",
    "quantize_blocks",
    "quantize_per_tensor",
    "relative_error",
    "round_mantissa",
]

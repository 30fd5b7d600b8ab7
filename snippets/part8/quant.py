"""Weight quantisation for inference, in PyTorch on any device: int8 per output channel, int4 with
group scales (optionally zero points) packed two to a byte, and three ways to choose the int4
codes: round to nearest (RTN), GPTQ (Frantar et al., 2022) and AWQ (Lin et al., 2023). Then FP8
(e4m3) for the KV cache, with per-head or per-token scales (the Part 6 FP8 chapter's per-block
scaling, restated for the cache's blocks: a chapter imports only its own part and the foundation).

Conventions (those of ``nn.Linear``): a weight ``w`` is (N, K), N output channels by K input
channels, and a layer computes ``y = x @ w.T``. Groups run along K: a group of ``group_size``
consecutive input channels of one output row shares one scale (and one zero point). Codes are
unsigned: int4 codes are 0..15 and stand for ``(q - z) * s``; symmetric int4 has the implicit zero
point 8 (codes -8..7 shifted up by 8), so it stores no zeros. Everything is deterministic: no
random numbers, no atomics, fixed reduction orders.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn  # 4 exponent bits, 3 mantissa bits, no infinities: max 448
INT4_SYMMETRIC_ZERO = 8  # codes 0..15 stand for -8..7 when there is no zero point
INT4_MAX_CODE = 15
GROUP_SIZES = (32, 64, 128)  # the group sizes GPTQ and AWQ checkpoints use; any even divisor works


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

def _check_weight(fn: str, w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{fn}: w must be a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"{fn}: w must be a floating-point tensor, got {w.dtype}")
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"{fn}: w must be a non-empty 2-D (N, K) weight, got shape "
                         f"{tuple(w.shape)}")


def _check_group(fn: str, k: int, group_size: int | None) -> int:
    """The group size as an int: None means one group per row (per-channel)."""
    if group_size is None:
        return k
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"{fn}: group_size must be an int or None, got {type(group_size).__name__}")
    if group_size < 2 or group_size % 2:
        raise ValueError(f"{fn}: group_size must be an even int >= 2 (two codes share a byte and "
                         f"must share a group), got {group_size}")
    if k % group_size:
        raise ValueError(f"{fn}: group_size {group_size} does not divide K = {k}")
    return group_size


def _check_calibration(fn: str, x: torch.Tensor, k: int) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{fn}: x must be a floating-point torch.Tensor")
    if x.dim() != 2 or x.shape[1] != k or x.shape[0] == 0:
        raise ValueError(f"{fn}: calibration activations must be (samples, K = {k}), got shape "
                         f"{tuple(x.shape)}")


# --------------------------------------------------------------------------------------------------
# int8 per output channel
# --------------------------------------------------------------------------------------------------

# --8<-- [start:int8]
def quantize_int8(w: torch.Tensor, symmetric: bool = True):
    """(q, scale, zero): one scale per output channel (row of w). Symmetric: int8 codes -127..127,
    scale = max|w| / 127, zero None. Asymmetric: uint8 codes 0..255 over [min, max] of the row
    (widened to include 0, so that 0 is exact), scale = (max - min) / 255, zero = the code of 0.
    Every weight is then within half a step (scale / 2) of its dequantised value."""
    _check_weight("quantize_int8", w)
    w = w.double()
    if symmetric:
        scale = w.abs().amax(dim=1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return q, scale.float(), None
    lo, hi = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    scale = (hi - lo) / 255
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale).clamp(0, 255)
    q = (torch.round(w / scale[:, None]) + zero[:, None]).clamp(0, 255).to(torch.uint8)
    return q, scale.float(), zero.to(torch.uint8)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor,
                    zero: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 weight the codes stand for: (q - zero) * scale, row by row."""
    z = 0 if zero is None else zero.float()[:, None]
    return (q.float() - z) * scale[:, None]


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor | None = None) -> torch.Tensor:
    """Weight-only int8: y = x @ dequantised(w).T in x's dtype. The scale is per output channel,
    so it factors out of the sum over K: y = (x @ (q - zero).T) * scale."""
    if x.shape[-1] != q.shape[1]:
        raise ValueError(f"int8_linear: x has K = {x.shape[-1]} but the weight is "
                         f"{tuple(q.shape)}")
    z = 0 if zero is None else zero.float()[:, None]
    return ((x.float() @ (q.float() - z).T) * scale).to(x.dtype)
# --8<-- [end:int8]


# --------------------------------------------------------------------------------------------------
# int4 with group scales: round to nearest, packing
# --------------------------------------------------------------------------------------------------

# --8<-- [start:int4]
def int4_params(w: torch.Tensor, group_size: int | None = 128, zero_point: bool = False):
    """(scales, zeros) of w's groups, each (N, K / group_size) in float32 and uint8 (zeros None
    when symmetric). Symmetric: codes -8..7 around the implicit zero 8, scale = max|w| / 7 (not /
    8: +max|w| would clip to 7 steps). Asymmetric: [min, max] widened to include 0 spread over
    codes 0..15, scale = (max - min) / 15, zero = round(-min / scale)."""
    _check_weight("int4_params", w)
    n, k = w.shape
    g = _check_group("int4_params", k, group_size)
    groups = w.double().reshape(n, k // g, g)
    if not zero_point:
        scale = groups.abs().amax(dim=2) / 7
        return torch.where(scale > 0, scale, torch.ones_like(scale)).float(), None
    lo, hi = groups.amin(dim=2).clamp(max=0), groups.amax(dim=2).clamp(min=0)
    scale = (hi - lo) / INT4_MAX_CODE
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale).clamp(0, INT4_MAX_CODE)
    return scale.float(), zero.to(torch.uint8)


def _expand(t: torch.Tensor, g: int) -> torch.Tensor:
    """(N, K / g) per-group values repeated to (N, K)."""
    return t.repeat_interleave(g, dim=1)


def quantize_int4(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None):
    """Round to nearest: the code of each weight given its group's scale and zero, 0..15 (uint8,
    one per byte: ``pack_int4`` halves that)."""
    n, k = w.shape
    g = k // scales.shape[1]
    z = INT4_SYMMETRIC_ZERO if zeros is None else _expand(zeros.double(), g)
    codes = torch.round(w.double() / _expand(scales.double(), g)) + z
    return codes.clamp(0, INT4_MAX_CODE).to(torch.uint8)


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor | None = None) -> torch.Tensor:
    """The weight the codes (N, K) stand for, (q - z) * s, in the scales' dtype (float64 scales
    give the exact values)."""
    n, k = q.shape
    if k % scales.shape[1]:
        raise ValueError(f"dequantize_int4: {scales.shape[1]} groups do not divide K = {k}")
    g = k // scales.shape[1]
    z = INT4_SYMMETRIC_ZERO if zeros is None else _expand(zeros.to(scales.dtype), g)
    return (q.to(scales.dtype) - z) * _expand(scales, g)


def rtn_int4(w: torch.Tensor, group_size: int | None = 128, zero_point: bool = False):
    """Round to nearest: (codes, scales, zeros). Each weight lands within half a step of its own
    group's scale: the whole error budget of RTN, spent without looking at any activation."""
    scales, zeros = int4_params(w, group_size, zero_point)
    return quantize_int4(w, scales, zeros), scales, zeros


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along K: byte j of a row holds code 2j in its low nibble and code 2j + 1
    in its high nibble. (N, K) uint8 codes 0..15 -> (N, K / 2) uint8."""
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4 takes (N, K) uint8 codes with K even, got {q.dtype} "
                         f"{tuple(q.shape)}")
    if int(q.max()) > INT4_MAX_CODE:
        raise ValueError(f"pack_int4: codes must be 0..15, found {int(q.max())}")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: (N, K / 2) uint8 -> (N, K) uint8 codes."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"unpack_int4 takes (N, K / 2) uint8, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    return torch.stack((packed & 0xF, packed >> 4), dim=2).reshape(packed.shape[0], -1)
# --8<-- [end:int4]


def output_error(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """The layer's relative output error on activations x: ||x w^T - x w_hat^T|| / ||x w^T||
    (Frobenius, in float64). What GPTQ and AWQ minimise, rather than the weights' own error."""
    x, w, w_hat = x.double(), w.double(), w_hat.double()
    return float((x @ (w - w_hat).T).norm() / (x @ w.T).norm())


# --------------------------------------------------------------------------------------------------
# GPTQ
# --------------------------------------------------------------------------------------------------

# --8<-- [start:gptq]
def gptq_int4(w: torch.Tensor, x: torch.Tensor, group_size: int | None = 128,
              zero_point: bool = False, damp: float = 0.01, block_size: int = 128,
              propagate: bool = True):
    """GPTQ: (codes, scales, zeros) for w (N, K) given calibration activations x (samples, K).

    H = 2 x^T x is the Hessian of the layer's squared output error in each row of w. Columns are
    quantised left to right; the rounding error of column i, divided by [H^-1]_ii, is spread over
    the columns not yet quantised along row i of the upper Cholesky factor of H^-1 (the OBS update,
    see the chapter). Updates to the columns past the current block of ``block_size`` are batched
    into one matrix product per block (lazy batch updates); a group's scale is chosen when the
    group's first column comes up, from the weights as updated so far. ``propagate=False`` skips
    every update: that is RTN, the control the tests compare with."""
    _check_weight("gptq_int4", w)
    n, k = w.shape
    g = _check_group("gptq_int4", k, group_size)
    _check_calibration("gptq_int4", x, k)
    if block_size < 1 or (g < k and block_size % g):
        raise ValueError(f"gptq_int4: block_size {block_size} must be a multiple of the group "
                         f"size {g}, so that no group straddles two blocks")
    if not damp > 0:
        raise ValueError(f"gptq_int4: damp must be > 0, got {damp}")
    w = w.double().clone()
    h = 2 * x.double().T @ x.double()
    dead = torch.diag(h) == 0  # an input channel that is always 0: its weights do not matter
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype, device=h.device)
    # rows of the upper Cholesky factor of H^-1: row i holds the OBS update of column i
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    scales = torch.empty(n, k // g, dtype=torch.float64, device=w.device)
    zeros = torch.empty(n, k // g, dtype=torch.float64, device=w.device) if zero_point else None
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        wb, hb = w[:, b0:b1].clone(), hinv[b0:b1, b0:b1]
        err = torch.zeros_like(wb)
        for i in range(b1 - b0):
            col = b0 + i
            if col % g == 0:  # a new group: its scale from its weights as they are now
                s, z = int4_params(wb[:, i:i + g] if g < k else w, None, zero_point)
                scales[:, col // g] = s[:, 0]
                if zero_point:
                    zeros[:, col // g] = z[:, 0]
            s = scales[:, col // g:col // g + 1]
            z = None if zeros is None else zeros[:, col // g:col // g + 1]
            q = quantize_int4(wb[:, i:i + 1], s, z)
            codes[:, col] = q[:, 0]
            e = (wb[:, i] - dequantize_int4(q, s, z)[:, 0]) / hb[i, i]
            err[:, i] = e
            if propagate:  # within the block, at once
                wb[:, i:] -= e[:, None] * hb[i, i:][None, :]
        if propagate:  # past the block, once per block (a matrix product, not b1 - b0 outer ones)
            w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return codes, scales.float(), None if zeros is None else zeros.to(torch.uint8)
# --8<-- [end:gptq]


# --------------------------------------------------------------------------------------------------
# AWQ
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AWQResult:
    """AWQ's output: the int4 codes of w * s (columns scaled), their group scales and zeros, the
    per-input-channel factor s (divide the layer's input by it, i.e. fold 1 / s into the previous
    op), the alpha chosen and the output error of every alpha tried."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    act_scale: torch.Tensor
    alpha: float
    errors: dict[float, float]

    def weight(self) -> torch.Tensor:
        """The effective weight of the original layer: dequantised(w * s) / s, (N, K) float64."""
        return dequantize_int4(self.codes, self.scales.double(), self.zeros) / self.act_scale


# --8<-- [start:awq]
def awq_int4(w: torch.Tensor, x: torch.Tensor, group_size: int | None = 128,
             zero_point: bool = True, grid: int = 20) -> AWQResult:
    """AWQ: scale input channel j of w by s_j = mean|x_j|^alpha before rounding, and the input by
    1 / s_j, with alpha searched on ``grid`` + 1 points of [0, 1] for the least output error on x.

    x (x / s)^T (w s)^T = x w^T: nothing changes before rounding. Rounding then costs every weight
    of a group up to half the group's step, but channel j's error reaches the output divided by
    s_j: salient channels (large |x_j|) get s_j > 1 and lose less. alpha = 0 is s = 1, plain RTN,
    so the search can only do as well or better on the calibration set."""
    _check_weight("awq_int4", w)
    n, k = w.shape
    g = _check_group("awq_int4", k, group_size)
    _check_calibration("awq_int4", x, k)
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"awq_int4: grid must be an int >= 1, got {grid!r}")
    w64, x64 = w.double(), x.double()
    mean_abs = x64.abs().mean(dim=0).clamp(min=1e-8)
    best, errors = None, {}
    for step in range(grid + 1):
        alpha = step / grid
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # centre on 1 in log scale, as the AWQ code does
        codes, scales, zeros = rtn_int4(w64 * s, g, zero_point)
        w_eff = dequantize_int4(codes, scales.double(), zeros) / s
        errors[alpha] = output_error(x64, w64, w_eff)
        if best is None or errors[alpha] < errors[best[0]]:  # first of equals: smallest alpha
            best = (alpha, codes, scales, zeros, s)
    alpha, codes, scales, zeros, s = best
    return AWQResult(codes, scales, zeros, s, alpha, errors)


def fold_awq_scale(prev: torch.Tensor, act_scale: torch.Tensor) -> torch.Tensor:
    """The op before the layer, with 1 / s folded in so that its output is already x / s: a norm's
    gain (K,) is divided by s, a previous linear layer's weight (K, K_in) row by row. Nothing is
    left to do at inference time."""
    if prev.shape[0] != act_scale.shape[0] or prev.dim() not in (1, 2):
        raise ValueError(f"fold_awq_scale: prev must be a (K,) gain or a (K, K_in) weight with K = "
                         f"{act_scale.shape[0]}, got shape {tuple(prev.shape)}")
    s = act_scale.to(prev.dtype)
    return prev / (s if prev.dim() == 1 else s[:, None])
# --8<-- [end:awq]


# --------------------------------------------------------------------------------------------------
# FP8 KV cache
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kv_fp8]
KV_GRANULARITIES = ("head", "token")


def quantize_kv_fp8(kv: torch.Tensor, granularity: str = "head"):
    """(q, scales) for a K or V cache of shape (batch, heads, seq, head_dim) in e4m3: one fp32
    scale per (batch, head) over all its tokens, or one per (batch, head, token). The Part 6
    recipe of per-block scaling, with the cache's blocks: each block's largest magnitude maps to
    e4m3's largest value (448), so nothing overflows and the most range is used. scales has shape
    (batch, heads, 1, 1) or (batch, heads, seq, 1), and broadcasts against q."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or not kv.is_floating_point():
        raise ValueError("quantize_kv_fp8: kv must be a floating-point 4-D (batch, heads, seq, "
                         "head_dim) tensor, got "
                         f"{tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv)}")
    if granularity not in KV_GRANULARITIES:
        raise ValueError(f"quantize_kv_fp8: granularity must be one of {KV_GRANULARITIES}, got "
                         f"{granularity!r}")
    if kv.numel() == 0:
        raise ValueError(f"quantize_kv_fp8: empty cache, shape {tuple(kv.shape)}")
    dims = (2, 3) if granularity == "head" else (3,)
    amax = kv.float().abs().amax(dim=dims, keepdim=True).clamp(min=1e-12)
    scales = amax / torch.finfo(E4M3).max
    return (kv.float() / scales).to(E4M3), scales


def dequantize_kv_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 cache that q and its scales stand for."""
    return q.float() * scales


def kv_fp8_error_bound(kv: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The largest error e4m3 rounding allows per element: half a unit in the last place of a
    3-bit mantissa (|x| * eps / 2, eps = 2^-3) for normal values, plus half the smallest subnormal
    step (scale * 2^-10) for values that land among the subnormals."""
    fi = torch.finfo(E4M3)
    min_subnormal = fi.smallest_normal * fi.eps  # 2^-6 * 2^-3
    return kv.abs().float() * (fi.eps / 2) + scales * (min_subnormal / 2)
# --8<-- [end:kv_fp8]


__all__ = [
    "AWQResult",
    "GROUP_SIZES",
    "awq_int4",
    "dequantize_int4",
    "dequantize_int8",
    "dequantize_kv_fp8",
    "fold_awq_scale",
    "gptq_int4",
    "int4_params",
    "int8_linear",
    "kv_fp8_error_bound",
    "output_error",
    "pack_int4",
    "quantize_int4",
    "quantize_int8",
    "quantize_kv_fp8",
    "rtn_int4",
    "unpack_int4",
]

"""part8.quantisation.11: int4 with group scales: round to nearest, pack, unpack

The reference solution.

Chapter: docs/part8/quantisation.md, exercise 11. Difficulty 3 of 4 (write most of it).

Quantise an (N, K) weight to int4 codes 0..15 in groups of g consecutive weights along K, round to
nearest: symmetric (scale = max|w| / 7 per group, implicit zero point 8) or with a zero point (the
group's [min, max], widened to include 0, spread over codes 0..15: scale = (max - min) / 15, zero =
round(-min / scale), clamped to 0..15). A group of zeros gets scale 1. Dequantise ((code - zero) *
scale), pack two codes per byte along K (code 2j in the low nibble of byte j, code 2j + 1 in the
high nibble) and unpack.

Check it:  python -m snippets exercise check part8.quantisation.11
"""

import torch


def int4_params(w: torch.Tensor, group_size: int, zero_point: bool):
    """(scales, zeros) of w's groups, each (N, K / group_size): scales float32, zeros uint8 (None
    when symmetric). Computed in float64, the scales rounded to float32 at the end."""
    n, k = w.shape
    groups = w.double().reshape(n, k // group_size, group_size)
    if not zero_point:
        scale = groups.abs().amax(dim=2) / 7      # /7, not /8: +max|w| must not clip
        return torch.where(scale > 0, scale, torch.ones_like(scale)).float(), None
    lo, hi = groups.amin(dim=2).clamp(max=0), groups.amax(dim=2).clamp(min=0)
    scale = (hi - lo) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale).clamp(0, 15)
    return scale.float(), zero.to(torch.uint8)


def quantize(w: torch.Tensor, scales: torch.Tensor, zeros) -> torch.Tensor:
    """(N, K) uint8 codes 0..15: round(w / scale) + zero, clamped (zero = 8 when zeros is None)."""
    g = w.shape[1] // scales.shape[1]
    s = scales.double().repeat_interleave(g, dim=1)
    z = 8.0 if zeros is None else zeros.double().repeat_interleave(g, dim=1)
    return (torch.round(w.double() / s) + z).clamp(0, 15).to(torch.uint8)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros) -> torch.Tensor:
    """(code - zero) * scale, in float64."""
    g = codes.shape[1] // scales.shape[1]
    s = scales.double().repeat_interleave(g, dim=1)
    z = 8.0 if zeros is None else zeros.double().repeat_interleave(g, dim=1)
    return (codes.double() - z) * s


def pack(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) uint8 codes -> (N, K / 2) uint8: code 2j in the low nibble of byte j, 2j + 1 high."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack: (N, K / 2) uint8 -> (N, K) uint8 codes."""
    return torch.stack((packed & 0xF, packed >> 4), dim=2).reshape(packed.shape[0], -1)

"""part8.quantisation.11: int4 with group scales: round to nearest, pack, unpack

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
    raise NotImplementedError("YOUR CODE HERE")


def quantize(w: torch.Tensor, scales: torch.Tensor, zeros) -> torch.Tensor:
    """(N, K) uint8 codes 0..15: round(w / scale) + zero, clamped (zero = 8 when zeros is None)."""
    raise NotImplementedError("YOUR CODE HERE")


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros) -> torch.Tensor:
    """(code - zero) * scale, in float64."""
    raise NotImplementedError("YOUR CODE HERE")


def pack(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) uint8 codes -> (N, K / 2) uint8: code 2j in the low nibble of byte j, 2j + 1 high."""
    raise NotImplementedError("YOUR CODE HERE")


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack: (N, K / 2) uint8 -> (N, K) uint8 codes."""
    raise NotImplementedError("YOUR CODE HERE")

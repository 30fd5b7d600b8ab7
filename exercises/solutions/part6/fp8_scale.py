"""part6.fp8.3: A per-tensor scale and a saturating cast

The reference solution.

Chapter: docs/part6/fp8.md, exercise 3. Difficulty 2 of 4 (write a few lines).

Write per_tensor_scale(x, dtype): the fp32 scale that maps the largest magnitude of x to the
format's largest finite value (amax / max, with amax kept at least 1e-12 so that a tensor of zeros
gets a usable scale), raising ValueError when x holds an infinity or a NaN (one of them would make
the scale infinite and every other value 0). Then quantize(x, scale, dtype): x / scale in fp32,
clamped to [-max, max] before the cast (a stale scale or an infinity saturates to the largest
value instead of becoming inf or NaN; NaN stays NaN).

Check it:  python -m snippets exercise check part6.fp8.3
"""

import torch


def largest(dtype: torch.dtype) -> float:
    """The format's largest finite value: 448 for e4m3, 57344 for e5m2."""
    return torch.finfo(dtype).max


def per_tensor_scale(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """The 0-d fp32 scale with ``x / scale`` reaching the format's largest value."""
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds an infinity or a NaN: no finite scale maps it into the format")
    amax = x.abs().amax().float().clamp(min=1e-12)
    return amax / largest(dtype)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
             ) -> torch.Tensor:
    """``x / scale`` in ``dtype``, saturated to the format's largest finite value."""
    top = largest(dtype)
    return (x.float() / scale).clamp(-top, top).to(dtype)

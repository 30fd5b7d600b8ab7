"""part6.fp8-attention.6: Power-of-two scales per head, and V written transposed

Chapter: docs/part6/fp8-attention.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Write the quantisation step of the FP8 forward. quantize_heads(x), for x of shape (B, H, ...):
one fp32 scale per (batch, head), the power of two that puts the head's largest magnitude in
(224, 448], e4m3's top binade, and the e4m3 codes of x / scale (x ~= x8 * scale[b, h]); a head
of zeros keeps a finite power of two. Then quantize_attention_inputs(q, k, v) -> (q8, k8, vt8,
q_scale, k_scale, v_scale): each quantised per head, V written transposed, (B, H, D, S) with the
sequence contiguous, the layout fp8 wgmma needs for the second product.

Check it:  python -m snippets exercise check part6.fp8-attention.6
"""

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # e4m3's largest finite value: its top binade is (224, 448]


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, ...) -> (e4m3 x8 of x's shape, fp32 scales (B, H)) with x ~= x8 * scale[b, h]."""
    raise NotImplementedError("YOUR CODE HERE")


def quantize_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(q8, k8, vt8, q_scale, k_scale, v_scale) from q, k, v of shape (B, H, S, D)."""
    raise NotImplementedError("YOUR CODE HERE")

"""part5.flash-attention.9: Write the FlashAttention forward

Chapter: docs/part5/flash-attention.md, exercise 9. Difficulty 4 of 4 (write the kernel).

Write the FlashAttention forward (non-causal, fp32 so that the CPU interpreter's tl.dot is exact
enough): a program owns BLOCK_M queries of one head, walks the keys in blocks of BLOCK_N, and
keeps the running row max m, the running sum l and the unnormalised output acc, rescaling l and
acc by exp(m_old - m_new) whenever the max grows. S need not be a multiple of the blocks.

Check it:  python -m snippets exercise check part5.flash-attention.9
(--solution checks the reference solution; exercise show part5.flash-attention.9 gives the hint)
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's queries
    base = tl.program_id(1) * S * D  # this program's head: q, k, v, o are (heads, S, D) contiguous
    d = tl.arange(0, D)
    # YOUR CODE HERE: load this program's queries; walk the keys in blocks of BLOCK_N with the running max m,
    # sum l and accumulator acc (rescaled when m grows); out = acc / l. tl.dot(..., input_precision="ieee")
    # keeps fp32 products exact enough for the check.
    out = tl.zeros((BLOCK_M, D), tl.float32)
    tl.store(o_ptr + base + rows[:, None] * D + d[None, :], out, mask=rows[:, None] < S)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block_m: int = 16,
              block_n: int = 16) -> None:
    """out = softmax(q k^T / sqrt(D)) v for (heads, S, D) contiguous fp32 tensors (D a power of two >= 16)."""
    heads, s, d = q.shape
    flash_kernel[(triton.cdiv(s, block_m), heads)](q, k, v, out, s, 1.0 / math.sqrt(d), D=d, BLOCK_M=block_m,
                                                   BLOCK_N=block_n)

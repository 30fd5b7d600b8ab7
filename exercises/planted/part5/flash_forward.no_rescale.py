"""part5.flash-attention.9: Write the FlashAttention forward

A PLANTED WRONG SOLUTION ('no_rescale'): the solution with a bug put in on purpose, for the
checker's tests (--planted no_rescale checks it).

Chapter: docs/part5/flash-attention.md, exercise 9. Difficulty 4 of 4 (write the kernel).

Write the FlashAttention forward (non-causal, fp32 so that the CPU interpreter's tl.dot is exact
enough): a program owns BLOCK_M queries of one head, walks the keys in blocks of BLOCK_N, and
keeps the running row max m, the running sum l and the unnormalised output acc, rescaling l and
acc by exp(m_old - m_new) whenever the max grows. S need not be a multiple of the blocks.

Check it:  python -m snippets exercise check part5.flash-attention.9
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
    q = tl.load(q_ptr + base + rows[:, None] * D + d[None, :], mask=rows[:, None] < S, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + cols[:, None] * D + d[None, :], mask=cols[:, None] < S, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * D + d[None, :], mask=cols[:, None] < S, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(cols[None, :] < S, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc + tl.dot(p, v, input_precision="ieee")
        m = m_new
    out = acc / l[:, None]
    tl.store(o_ptr + base + rows[:, None] * D + d[None, :], out, mask=rows[:, None] < S)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block_m: int = 16,
              block_n: int = 16) -> None:
    """out = softmax(q k^T / sqrt(D)) v for (heads, S, D) contiguous fp32 tensors (D a power of two >= 16)."""
    heads, s, d = q.shape
    flash_kernel[(triton.cdiv(s, block_m), heads)](q, k, v, out, s, 1.0 / math.sqrt(d), D=d, BLOCK_M=block_m,
                                                   BLOCK_N=block_n)

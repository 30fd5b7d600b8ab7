"""part6.fp8-gemm.5: The block-scaled GEMM's K loop, with promotion

Chapter: docs/part6/fp8-gemm.md, exercise 5. Difficulty 3 of 4 (write most of it).

Write the K loop of a block-scaled FP8 GEMM (DeepSeek-V3's recipe): A is M x K e4m3 with one
fp32 scale per 1 x 128 block (a_scales, M x K/128), B is N x K e4m3 (K-major) with one per
128 x 128 block (b_scales, ceil(N/128) x K/128). For every K-block kb of 128, the block's
product goes into a temporary that starts from zero (tl.dot of A's (BLOCK_M, 128) tile and the
(128, BLOCK_N) tile of B^T), and is promoted: multiplied by a_scale[m, kb] * b_scale[n // 128, kb]
and added into the fp32 accumulator. Ragged M and N; K is a multiple of 128; the scales are read
through their strides.

Check it:  python -m snippets exercise check part6.fp8-gemm.5
"""

import torch
import triton
import triton.language as tl

BLOCK = 128  # the scale block: 1 x 128 of A, 128 x 128 of B, and one K step


@triton.jit
def blockscaled_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K,
                       stride_am, stride_bn, stride_cm, stride_asm, stride_ask, stride_bsn,
                       stride_bsk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # YOUR CODE HERE: the K loop, one K-block kb of BLOCK_K = 128 per step. In each step, load A's
    # (BLOCK_M, 128) tile and the (128, BLOCK_N) tile of B^T (B is N x K), masked on M and N; sum the
    # block's 128 products into a temporary with tl.dot (fp32, starting from zero); then promote it:
    # multiply it by A's scale of row m and K-block kb and by the scale of B's 128 x 128 block that
    # holds row n (both read through their strides), and add it into acc.
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def fp8_gemm_blockscaled(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor,
                         b_scales: torch.Tensor, c: torch.Tensor, block_m: int = 16,
                         block_n: int = 32) -> None:
    """c (M x N, fp32) = the block-scaled product of a (M x K e4m3) and b (N x K e4m3): each
    1 x 128 block of A times a_scales[m, kb], each 128 x 128 block of B times
    b_scales[n // 128, kb]."""
    (m, k), n = a.shape, b.shape[0]
    if k % BLOCK or b.shape[1] != k:
        raise ValueError(f"K = {k} must be a multiple of {BLOCK} and shared by a and b")
    if a.stride(1) != 1 or b.stride(1) != 1 or c.stride(1) != 1:
        raise ValueError("a, b and c must be contiguous along their last dimension (a and b "
                         "K-major)")
    want_a, want_b = (m, k // BLOCK), (-(-n // BLOCK), k // BLOCK)
    if tuple(a_scales.shape) != want_a or tuple(b_scales.shape) != want_b:
        raise ValueError(f"a_scales must have shape {want_a} and b_scales {want_b}, got "
                         f"{tuple(a_scales.shape)} and {tuple(b_scales.shape)}")
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    blockscaled_kernel[grid](a, a_scales, b, b_scales, c, m, n, k,
                             a.stride(0), b.stride(0), c.stride(0),
                             a_scales.stride(0), a_scales.stride(1),
                             b_scales.stride(0), b_scales.stride(1),
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK)

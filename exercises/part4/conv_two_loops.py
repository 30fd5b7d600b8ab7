"""part4.convolution.5: The implicit GEMM's K loop as two loops, over the taps and over C

Chapter: docs/part4/convolution.md, exercise 5. Difficulty 3 of 4 (write most of it).

v2 walks K_gemm = RSC in steps of BLOCK_K and, for every column k of every step, finds its tap and
channel with c = k % C, s = (k // C) % S, r = k // (C * S), then tests each of the BLOCK_M x
BLOCK_K input pixels against the image. Rewrite its K loop as two loops: an outer loop over the
RS taps (r, s), where the input pixel of each row, the image-bounds test and the row's pointer
are BLOCK_M vectors computed once per tap, and an inner loop over C in steps of BLOCK_K that is a
plain GEMM step: no division, no remainder and no image-bounds test per element, only the c < C
mask for a ragged C. x is NHWC, w is (K, R, S, C), y is NHWC, in fp32.

Check it:  python -m snippets exercise check part4.convolution.5
(--solution checks the reference solution; exercise show part4.convolution.5 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def conv2d_two_loops_kernel(x_ptr, w_ptr, y_ptr, H, W, C, K, P, Q, R, S, M, KG, STRIDE, PAD,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # As v2: one program per BLOCK_M x BLOCK_N tile of y viewed as M x K (M = N * P * Q)
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixels m = (n, p, q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output channels
    q = offs_m % Q
    p = (offs_m // Q) % P
    img = offs_m // (P * Q)
    ih0 = p * STRIDE - PAD  # (BLOCK_M,): the corner of each row's window, maybe in the padding
    iw0 = q * STRIDE - PAD
    x_img = x_ptr + img.to(tl.int64) * H * W * C  # int64: N * H * W * C may pass 2**31
    row_ok = offs_m < M
    col_ok = offs_n < K
    w_rows = w_ptr + offs_n.to(tl.int64) * KG  # (BLOCK_N,): row n of w viewed as K x KG
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # YOUR CODE HERE: the K loop as two loops. Outer: over the R * S taps in (r, s) order (tap = r * S + s,
    # as in k = (r * S + s) * C + c), with the input pixel (ih, iw) of each row, the padding mask and the
    # pointer to the pixel's channel 0 computed once per tap, as (BLOCK_M,) vectors. Inner: over C in steps
    # of BLOCK_K, a plain GEMM step: a (BLOCK_M, BLOCK_K) tile of A from x and a (BLOCK_K, BLOCK_N) tile of
    # w^T (column tap * C + c of w viewed as K x KG), masked with other=0.0, then
    # acc = tl.dot(a, b, acc, input_precision="ieee"). No // or % and no test against H or W in the inner loop.
    # y is NHWC, so y viewed as M x K is row-major: row m, column n at m * K + n
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * K + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def conv2d_two_loops(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, stride: int = 1, padding: int = 0,
                     block_m: int = 32, block_n: int = 16, block_k: int = 16) -> None:
    """y = the convolution of x (N, H, W, C) with w (K, R, S, C), stride and zero padding on each side,
    written into y (N, P, Q, K): the implicit GEMM of v2 with its K loop split over taps and channels."""
    (n, h, wd, c), (k, r, s, _) = x.shape, w.shape
    _, p, q, _ = y.shape
    m, kg = n * p * q, r * s * c
    grid = (triton.cdiv(m, block_m) * triton.cdiv(k, block_n),)
    conv2d_two_loops_kernel[grid](x, w, y, h, wd, c, k, p, q, r, s, m, kg, stride, padding,
                                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)

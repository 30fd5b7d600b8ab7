"""part5.lora.3: LoRA's extra step as rank-one updates on the CUDA cores

The reference solution.

Chapter: docs/part5/lora.md, exercise 3. Difficulty 2 of 4 (write a few lines).

Add U @ Q to the accumulator of a tiled GEMM as R rank-one updates, acc += U[:, j] Q[j, :] for
j = 0 .. R - 1, instead of a tensor-core dot: no shared memory for Q's tile. (Comparing the two
forms' shared memory and speed inside v4's kernel is the GPU half of the chapter's exercise.)

Check it:  python -m snippets exercise check part5.lora.3
(--solution checks the reference solution; exercise show part5.lora.3 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def lora_kernel(a_ptr, b_ptr, u_ptr, q_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_um,
                stride_qr, stride_cm, R: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # C = A @ B, as in v2's GEMM
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :],
                    mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :],
                    mask=(ks[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    # the extra step, C += U @ Q, as R rank-one updates: column j of U times row j of Q
    for j in tl.static_range(R):
        u_j = tl.load(u_ptr + offs_m * stride_um + j, mask=offs_m < M, other=0.0)
        q_j = tl.load(q_ptr + j * stride_qr + offs_n, mask=offs_n < N, other=0.0)
        acc += u_j[:, None] * q_j[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def lora_matmul(a: torch.Tensor, b: torch.Tensor, u: torch.Tensor, q: torch.Tensor,
                c: torch.Tensor, block: int = 16) -> None:
    """c (M, N) = a (M, K) @ b (K, N) + u (M, R) @ q (R, N): fp32, rows contiguous (c's rows may be
    further apart than N)."""
    (m, k), n, r = a.shape, b.shape[1], u.shape[1]
    grid = (triton.cdiv(m, block), triton.cdiv(n, block))
    lora_kernel[grid](a, b, u, q, c, m, n, k, a.stride(0), b.stride(0), u.stride(0), q.stride(0),
                      c.stride(0), R=r, BLOCK_M=block, BLOCK_N=block, BLOCK_K=16)

"""LoRA v4: v2's plan on Part 4's persistent TMA GEMM.

A version of Part 5's ``lora_linear`` and ``lora_linear_fwd_bwd`` ops, registered from its own
module so that v0 to v3's measured results keep their source hashes.

- v4  ``lora_linear``: U = scale x A^T first (a skinny product by cuBLAS, the scale as its alpha),
      then y = [x, U] @ [W, B]^T in one persistent Triton kernel whose main loop is Part 4's
      ``matmul`` v4 (one program per SM walking the tiles of y in grouped order; tiles of x and W
      arrive by TMA; the epilogue stores y in two halves by TMA): after the K loop over D_in, one
      more step of depth r with U and B into the same fp32 accumulator, as v2's GEMM takes it.
      v3's U inside the K loop (a second, narrow wgmma next to the wide one) made this kernel
      markedly slower on the H200, where v2's extra pass over x costs a few percent.
- v4  ``lora_linear_fwd_bwd``: :class:`LoRALinearTMA`, the forward above keeping U, and
      dx = [dy, V] @ [W; A] by the same kernel with V = scale dy B (cuBLAS); dA = V^T x and
      dB = dy^T U by cuBLAS, as in v2 and v3.

TMA moves 2-D boxes of rows that are multiples of 16 bytes: the kernel runs on fp16 and bf16
inputs whose D_in and D_out are multiples of 8 and whose x starts on a 16-byte boundary.
Anything else (fp32, float64 for the gradient check, ragged widths, an offset view) goes to v3,
whose pointer-based kernel takes any shape."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, refuse_grad, triton_device, wants_grad
from snippets.common.baselines import grads_through
from snippets.common.gemm import (
    GROUP_M,
    device_smem_limit,
    launch_tma,
    set_block_shapes,
    tile_coords,
)
from snippets.part5.lora import (
    FLOAT_TYPES,
    TRITON_DTYPES,
    block_r,
    check_lora,
    lora_linear,
    lora_linear_fused,
    lora_linear_fwd_bwd,
    lora_linear_fwd_bwd_fused,
)
from snippets.registry import Impl

TMA_TYPES = (torch.float16, torch.bfloat16)


# --8<-- [start:kernel]
@triton.jit
def _lora_tma_kernel(a_desc, b_desc, c_desc, u_ptr, q_ptr, R, stride_um, stride_qr, stride_qn,
                     M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, B_KMAJOR: tl.constexpr,
                     FLATTEN: tl.constexpr, BLOCK_R: tl.constexpr):
    """C = A @ B + U @ Q: Part 4's persistent TMA kernel (A: M x K; B: K x N, stored N x K if
    B_KMAJOR) with one more step of depth R <= BLOCK_R into the accumulator before the epilogue
    (U: M x R, R contiguous; Q: R x N with any strides), i.e. C = [A, U] @ [B; Q]."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_r = tl.arange(0, BLOCK_R)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([off_m, k * BLOCK_K])        # (BLOCK_M, BLOCK_K)
            if B_KMAJOR:
                b = b_desc.load([off_n, k * BLOCK_K]).T  # W stored D_out x D_in: K-major
            else:
                b = b_desc.load([k * BLOCK_K, off_n])    # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc)
        # The extra step of depth R: (BLOCK_M, BLOCK_R) @ (BLOCK_R, BLOCK_N). Columns of U and rows
        # of Q past R load as zeros and add nothing, so R need not be a multiple of 16.
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        u_ptrs = u_ptr + offs_m[:, None].to(tl.int64) * stride_um + offs_r[None, :]
        u = tl.load(u_ptrs, mask=(offs_m[:, None] < M) & (offs_r[None, :] < R), other=0.0)
        q_ptrs = q_ptr + offs_r[:, None] * stride_qr + offs_n[None, :].to(tl.int64) * stride_qn
        q = tl.load(q_ptrs, mask=(offs_r[:, None] < R) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(u, q, acc)
        # Part 4's epilogue: two halves of BLOCK_N / 2 columns, each stored by TMA
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([off_m, off_n], left.to(c_desc.dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
# --8<-- [end:kernel]


# --8<-- [start:configs]
# Part 4's persistent tiles, 64-deep K steps (128 bytes of 16-bit values: one TMA box row, the
# 128-byte swizzle), 3 or 4 stages.
TMA_TILES = ((128, 128, 4), (128, 128, 8), (128, 256, 8), (256, 128, 8))


def tma_configs() -> list[triton.Config]:
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=GROUP_M),
                          num_warps=warps, num_stages=stages, pre_hook=set_block_shapes)
            for bm, bn, warps in TMA_TILES for stages in (3, 4)]


def tma_smem_bytes(cfg: triton.Config, block_r: int, in_bytes: int) -> int:
    """Shared memory of one program, as modelled: num_stages boxes of A and B, the staging tile of
    the epilogue's TMA store (half of C's tile) and the U and Q tiles of the extra step. The
    compiler may need a little more; the autotuner drops a config that does not fit."""
    k = cfg.kwargs
    stages = cfg.num_stages * (k["BLOCK_M"] + k["BLOCK_N"]) * k["BLOCK_K"] * in_bytes
    extra = (k["BLOCK_M"] + k["BLOCK_N"]) * block_r * in_bytes
    return stages + k["BLOCK_M"] * k["BLOCK_N"] // 2 * in_bytes + extra


def prune_tma(configs, named_args, **kwargs):
    """Drop the configs that need more shared memory than the device has."""
    a = named_args["a_desc"].base
    limit = device_smem_limit(a.device.index or 0)
    kept = [c for c in configs if tma_smem_bytes(c, kwargs["BLOCK_R"], a.element_size()) <= limit]
    return kept or configs[:1]


@functools.lru_cache(maxsize=None)
def tma_autotuned(persistent: bool, dtype: torch.dtype):
    """The kernel under triton.autotune (launch_tma's ``autotuned(True, dtype)``; one tuner per
    input dtype, which the descriptors hide from the autotuner's key)."""
    return triton.autotune(configs=tma_configs(), key=["M", "N", "K", "BLOCK_R", "B_KMAJOR"],
                           prune_configs_by={"early_config_prune": prune_tma})(_lora_tma_kernel)
# --8<-- [end:configs]


# --8<-- [start:launch]
def project(x: torch.Tensor, p: torch.Tensor, scale: float) -> torch.Tensor:
    """U = scale * x @ p^T for x (M, K) and p (R, K): a skinny product (R is 1 to 128) that only
    reads x, by cuBLAS, with the scale as its alpha so U is rounded once, in fp32, to x's dtype."""
    u = torch.empty((x.shape[0], p.shape[0]), dtype=x.dtype, device=x.device)
    return torch.addmm(u, x, p.T, beta=0, alpha=scale, out=u)  # beta = 0: u's contents unread


def lora_tma(a: torch.Tensor, b: torch.Tensor, u: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """C = a @ b + u @ q: a (M, K) row-major, b (K, N) as a view either way round, u (M, R)
    contiguous, q (R, N) with any strides; 16-bit inputs whose rows are 16-byte multiples
    (launch_tma checks a, b and C)."""
    (m, _), n, r = a.shape, b.shape[1], u.shape[1]
    if not u.is_contiguous():
        raise ValueError(f"lora_tma: u must be contiguous, got strides {u.stride()}")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    extra = (u, q, r, u.stride(0), q.stride(0), q.stride(1))
    return launch_tma(_lora_tma_kernel, tma_autotuned, a, b, c, extra, dict(BLOCK_R=block_r(r)))


def tma_applies(x: torch.Tensor, d_in: int, d_out: int) -> bool:
    """Whether v4's kernel takes these checked inputs: 16-bit, both widths multiples of 8 (rows of
    16-byte multiples), x on a 16-byte boundary (W, A and B are whole tensors or the checks'
    contiguous copies; an offset view of x is the case to catch)."""
    return (x.dtype in TMA_TYPES and d_in % 8 == 0 and d_out % 8 == 0
            and x.data_ptr() % 16 == 0)
# --8<-- [end:launch]


# --8<-- [start:function]
class LoRALinearTMA(torch.autograd.Function):
    """LoRALinearFunction (v2, v3) with v4's kernel in both passes: the forward keeps
    U = scale x A^T for dB, the backward computes V = scale dy B for dx and dA. W is frozen.
    Called by v4 only for inputs that tma_applies to."""

    @staticmethod
    def forward(ctx, x, w, a, b, scale):
        t, d_in, d_out, r = x.numel() // x.shape[-1], w.shape[1], w.shape[0], a.shape[0]
        x2 = x.reshape(t, d_in)
        if t == 0:
            y, u = x.new_empty((0, d_out)), x.new_empty((0, r))
        else:
            u = project(x2, a, float(scale))
            y = lora_tma(x2, w.T, u, b.T)
        ctx.save_for_backward(x2, w, a, b, u)
        ctx.scale, ctx.x_shape = float(scale), x.shape
        return y.reshape(*x.shape[:-1], d_out)

    @staticmethod
    def backward(ctx, dy):
        x2, w, a, b, u = ctx.saved_tensors
        dy2 = dy.reshape(-1, w.shape[0]).contiguous()  # autograd may pass a broadcast view
        if x2.shape[0] == 0:
            dx, da, db = torch.zeros_like(x2), torch.zeros_like(a), torch.zeros_like(b)
        else:
            # dx = dy W + V A with V = scale dy B: W (D_out x D_in) is B of this product, K x N
            # with N contiguous
            v = project(dy2, b.T, ctx.scale)
            dx = lora_tma(dy2, w, v, a)
            da, db = v.T @ x2, dy2.T @ u  # long-K products with tiny outputs: cuBLAS
        return dx.reshape(ctx.x_shape), None, da, db, None
# --8<-- [end:function]


# --8<-- [start:public]
def lora_linear_tma(x, w, a, b, scale):
    """v4: U = scale x A^T (cuBLAS), then y = x W^T + U B^T in one persistent TMA kernel; with grad
    mode on and x, A or B requiring grad, LoRALinearTMA. Inputs TMA cannot move go to v3
    (lora_linear_fused)."""
    t, d_in, d_out, _ = check_lora(x, w, a, b, scale, FLOAT_TYPES, triton_device())
    if not tma_applies(x, d_in, d_out):
        return lora_linear_fused(x, w, a, b, scale)
    refuse_grad("lora_linear_tma", w, instead="lora_linear_torch",
                why="computes no gradient for the frozen weight: w requires grad")
    if wants_grad(x, a, b):
        return LoRALinearTMA.apply(x, w, a, b, scale)
    if t == 0:
        return x.new_empty((*x.shape[:-1], d_out))
    x2 = x.reshape(t, d_in)
    y = lora_tma(x2, w.T, project(x2, a, float(scale)), b.T)
    return y.reshape(*x.shape[:-1], d_out)


def lora_linear_fwd_bwd_tma(x, w, a, b, scale, dy):
    """v4 of the training step: LoRALinearTMA forward and backward (v3's where TMA does
    not apply)."""
    refuse_grad("lora_linear_fwd_bwd_tma", x, w, a, b, dy, instead="lora_linear_tma",
                why=GRADS_ONLY)
    _, d_in, d_out, _ = check_lora(x, w, a, b, scale, FLOAT_TYPES, triton_device())
    if not tma_applies(x, d_in, d_out) or dy.dtype != x.dtype:
        return lora_linear_fwd_bwd_fused(x, w, a, b, scale, dy)
    return grads_through(lambda x, a, b: LoRALinearTMA.apply(x, w.detach(), a, b, scale),
                         (x, a, b), dy)
# --8<-- [end:public]


SOURCES = (_lora_tma_kernel, tile_coords, project, lora_tma, tma_applies, tma_configs,
           tma_smem_bytes, prune_tma, launch_tma, set_block_shapes, check_lora, torch.addmm)
BWD_SOURCES = (*SOURCES, LoRALinearTMA.forward, LoRALinearTMA.backward, grads_through)

lora_linear.add(Impl("v4", lora_linear_tma, "Triton",
                     "U by cuBLAS, then [x, U] @ [W, B]^T on Part 4's TMA kernel", SOURCES,
                     device="any", dtypes=TRITON_DTYPES))
lora_linear_fwd_bwd.add(Impl("v4", lora_linear_fwd_bwd_tma, "Triton",
                             "v4's kernel for y and dx, cuBLAS U, V, dA, dB",
                             BWD_SOURCES, device="any", dtypes=TRITON_DTYPES))

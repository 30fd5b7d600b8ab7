"""LoRA v4: v3's one-kernel fusion on Part 4's persistent TMA GEMM.

A version of Part 5's ``lora_linear`` and ``lora_linear_fwd_bwd`` ops, registered from its own
module so that v0 to v3's measured results keep their source hashes.

- v4  ``lora_linear``: y = x W^T + (scale x A^T) B^T in one persistent Triton kernel whose main
      loop is Part 4's ``matmul`` v4 (one program per SM walking the tiles of y in grouped order;
      tiles of x, W and A arrive by TMA; the epilogue stores y in two halves by TMA). As in v3, each
      program accumulates its rows of U = scale x A^T from the x tiles the K loop loads anyway (one
      BLOCK_M x BLOCK_R dot next to the wide one, A's box loaded by TMA like the others), rounds U
      to the input dtype and adds U B^T to the accumulator in one more dot before the epilogue.
- v4  ``lora_linear_fwd_bwd``: :class:`LoRALinearTMA`, the forward above keeping U (the first
      column of programs stores it), and dx = dy W + V A by the same kernel with V = scale dy B
      in its K loop (stored for dA); dA = V^T x and dB = dy^T U by cuBLAS, as in v2 and v3.

TMA moves 2-D boxes of rows that are multiples of 16 bytes: the kernel runs on fp16 and bf16
inputs whose D_in and D_out are multiples of 8 and whose tensors start on 16-byte boundaries.
Anything else (fp32, float64 for the gradient check, ragged widths, an offset view) goes to v3's
pointer-based kernel, which takes any shape: the same sums, in the same order within a tile.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, refuse_grad, triton_device, triton_interpreting, wants_grad
from snippets.common.baselines import grads_through
from snippets.common.gemm import (
    GROUP_M,
    INTERPRET,
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
def _lora_tma_kernel(a_desc, b_desc, c_desc, p_desc, q_ptr, u_ptr, R, scale,
                     stride_qr, stride_qn, stride_um, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, B_KMAJOR: tl.constexpr,
                     FLATTEN: tl.constexpr, BLOCK_R: tl.constexpr, STORE_U: tl.constexpr):
    """C = A @ B + U @ Q with U = scale * A @ P^T computed in the K loop: Part 4's persistent TMA
    kernel with v3's extra accumulator. A: M x K; B: K x N (stored N x K if B_KMAJOR); P: R x K,
    K contiguous; Q: R x N with any strides. If STORE_U, the programs of the first column of tiles
    store U (M x R) for a backward pass."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_r = tl.arange(0, BLOCK_R)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        u_acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([off_m, k * BLOCK_K])        # (BLOCK_M, BLOCK_K)
            if B_KMAJOR:
                b = b_desc.load([off_n, k * BLOCK_K]).T  # W stored D_out x D_in: K-major
            else:
                b = b_desc.load([k * BLOCK_K, off_n])    # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc)
            # P's box is BLOCK_R rows tall; rows past R are outside P and arrive as zeros
            p = p_desc.load([0, k * BLOCK_K]).T          # (BLOCK_K, BLOCK_R)
            u_acc = tl.dot(a, p, u_acc)
        # U rounded to the input dtype, as v2 and v3 round it: its product runs on the tensor cores
        u = (u_acc * scale).to(c_desc.dtype)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        if STORE_U:
            if pid_n == 0:  # every column of tiles computed the same U; the first one writes it
                u_ptrs = u_ptr + offs_m[:, None].to(tl.int64) * stride_um + offs_r[None, :]
                tl.store(u_ptrs, u, mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))
        offs_n = off_n + tl.arange(0, BLOCK_N)
        # (BLOCK_R, BLOCK_N); rows past R load as zeros and add nothing
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
# 128-byte swizzle), 3 or 4 stages; each stage also holds P's BLOCK_R x 64 box.
TMA_TILES = ((128, 128, 4), (128, 128, 8), (128, 256, 8), (256, 128, 8))


def set_boxes(nargs: dict) -> None:
    """Autotuner pre-hook: the boxes of A, B and C as Part 4's kernel sets them, and P's."""
    set_block_shapes(nargs)
    nargs["p_desc"].block_shape = [nargs["BLOCK_R"], nargs["BLOCK_K"]]


def tma_configs() -> list[triton.Config]:
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=GROUP_M),
                          num_warps=warps, num_stages=stages, pre_hook=set_boxes)
            for bm, bn, warps in TMA_TILES for stages in (3, 4)]


def tma_smem_bytes(cfg: triton.Config, block_r: int, in_bytes: int) -> int:
    """Shared memory of one program: num_stages boxes of A, B and P, and the staging tile of the
    epilogue's TMA store (half of C's tile)."""
    k = cfg.kwargs
    stages = cfg.num_stages * (k["BLOCK_M"] + k["BLOCK_N"] + block_r) * k["BLOCK_K"] * in_bytes
    return stages + k["BLOCK_M"] * k["BLOCK_N"] // 2 * in_bytes


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
def lora_tma(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor, q: torch.Tensor, scale: float,
             store_u: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """C = a @ b + U @ q with U = scale * a @ p^T: a (M, K) row-major, b (K, N) as a view either
    way round, p (R, K) row-major, q (R, N) with any strides; 16-bit inputs, rows of 16-byte
    multiples (launch_tma checks a, b and C). Returns (C, U if ``store_u``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n, r = a.shape, b.shape[1], p.shape[0]
    if not p.is_contiguous() or p.data_ptr() % 16:  # rows K * 2 bytes apart, like a's
        raise ValueError(f"lora_tma: p must be contiguous and 16-byte aligned, got strides "
                         f"{p.stride()} at {p.data_ptr():#x}")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    u = torch.empty((m, r) if store_u else (1, r), dtype=a.dtype, device=a.device)
    p_desc = TensorDescriptor(p, [r, k], [k, 1], [16, 16])  # the box is set per config
    if triton_interpreting():
        p_desc.block_shape = [block_r(r), INTERPRET["BLOCK_K"]]
    extra = (p_desc, q, u, r, scale, q.stride(0), q.stride(1), u.stride(0))
    launch_tma(_lora_tma_kernel, tma_autotuned, a, b, c, extra,
               dict(BLOCK_R=block_r(r), STORE_U=store_u))
    return c, (u if store_u else None)


def tma_applies(x: torch.Tensor, d_in: int, d_out: int) -> bool:
    """Whether v4's kernel takes these checked inputs: 16-bit, both widths multiples of 8 (rows of
    16-byte multiples), x on a 16-byte boundary (W, A and B are whole tensors or the checks'
    contiguous copies; an offset view of x is the case to catch)."""
    return (x.dtype in TMA_TYPES and d_in % 8 == 0 and d_out % 8 == 0
            and x.data_ptr() % 16 == 0)
# --8<-- [end:launch]


# --8<-- [start:function]
class LoRALinearTMA(torch.autograd.Function):
    """LoRALinearFunction (v3) with v4's kernel in both passes: the forward keeps U = scale x A^T,
    the backward's dx kernel computes V = scale dy B in its K loop and stores it for dA. W is
    frozen. Called by v4 only for inputs that tma_applies to."""

    @staticmethod
    def forward(ctx, x, w, a, b, scale):
        t, d_in, d_out, r = x.numel() // x.shape[-1], w.shape[1], w.shape[0], a.shape[0]
        x2 = x.reshape(t, d_in)
        if t == 0:
            y, u = x.new_empty((0, d_out)), x.new_empty((0, r))
        else:
            y, u = lora_tma(x2, w.T, a, b.T, float(scale), store_u=True)
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
            # with N contiguous; P is B^T (r x D_out, D_out contiguous, a copy of r * D_out values)
            dx, v = lora_tma(dy2, w, b.t().contiguous(), a, ctx.scale, store_u=True)
            da, db = v.T @ x2, dy2.T @ u  # long-K products with tiny outputs: cuBLAS
        return dx.reshape(ctx.x_shape), None, da, db, None
# --8<-- [end:function]


# --8<-- [start:public]
def lora_linear_tma(x, w, a, b, scale):
    """v4: y = x W^T + scale (x A^T) B^T in one persistent TMA kernel; with grad mode on and x, A
    or B requiring grad, LoRALinearTMA. Inputs TMA cannot move go to v3 (lora_linear_fused)."""
    t, d_in, d_out, _ = check_lora(x, w, a, b, scale, FLOAT_TYPES, triton_device())
    if not tma_applies(x, d_in, d_out):
        return lora_linear_fused(x, w, a, b, scale)
    refuse_grad("lora_linear_tma", w, instead="lora_linear_torch",
                why="computes no gradient for the frozen weight: w requires grad")
    if wants_grad(x, a, b):
        return LoRALinearTMA.apply(x, w, a, b, scale)
    if t == 0:
        return x.new_empty((*x.shape[:-1], d_out))
    y, _ = lora_tma(x.reshape(t, d_in), w.T, a, b.T, float(scale))
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


SOURCES = (_lora_tma_kernel, tile_coords, lora_tma, tma_applies, tma_configs, tma_smem_bytes,
           prune_tma, set_boxes, launch_tma, set_block_shapes, check_lora)
BWD_SOURCES = (*SOURCES, LoRALinearTMA.forward, LoRALinearTMA.backward, grads_through)

lora_linear.add(Impl("v4", lora_linear_tma, "Triton",
                     "v3's fusion on Part 4's persistent TMA kernel", SOURCES, device="any",
                     dtypes=TRITON_DTYPES))
lora_linear_fwd_bwd.add(Impl("v4", lora_linear_fwd_bwd_tma, "Triton",
                             "v4's kernel for y and dx (U, V in the K loops), cuBLAS dA, dB",
                             BWD_SOURCES, device="any", dtypes=TRITON_DTYPES))

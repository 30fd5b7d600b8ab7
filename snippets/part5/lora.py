"""LoRA: a frozen linear layer plus a trainable low-rank update, y = x @ W^T + scale * (x @ A^T)
@ B^T.

x is (..., D_in), W (D_out, D_in) is frozen, A (r, D_in) and B (D_out, r) are the trainable adapter,
r is small (8 to 64) and ``scale`` is LoRA's alpha / r. Two ops are registered.

Versions of ``lora_linear`` (the forward; never renumbered):

- v0  eager PyTorch: three cuBLAS products (x W^T, x A^T, then (x A^T) B^T), a scale and an add; the
      last product, the scale and the add each write a T x D_out tensor that the next one
      reads back.
- v1  the same function through ``torch.compile``: Inductor keeps the three products in cuBLAS and
      fuses the scale and the add into one pointwise kernel (or an addmm epilogue).
- v2  Triton, two kernels: a skinny kernel computes U = scale * x A^T (T x r, tiny), then one GEMM
      computes y = [x, U] @ [W, B]^T: its K loop runs over D_in for x W^T and then takes one extra
      step of depth r with U and B into the same fp32 accumulator. The low-rank term costs one more
      pass over x (U) and no T x D_out intermediate.
- v3  Triton, one kernel: like v2, but each program accumulates its rows of x A^T inside the K loop,
      from the x tiles it loads anyway (a BLOCK_M x r dot next to the BLOCK_M x BLOCK_N one), and
      takes the extra step with it. No second pass over x and one launch, at the price of
      recomputing x A^T once per column block of y (D_out / BLOCK_N times).

Versions of ``lora_linear_fwd_bwd`` (a training step: forward, then the gradients (dx, dA, dB); W
is frozen):

- v0  eager autograd: v0's forward and ``torch.autograd.grad``.
- v1  like v0 with the forward through ``torch.compile`` (AOTAutograd compiles the backward too).
- v2  Triton, :class:`LoRALinearFunction` with v2's forward, which keeps U for the backward.
      Backward: V = scale * dy B (the skinny kernel), dx = [dy, V] @ [W; A] (the GEMM kernel with
      the extra step, now over D_out), dA = V^T x and dB = dy^T U (cuBLAS: long-K products with tiny
      outputs, nothing to fuse).
- v3  Triton, :class:`LoRALinearFunction` with v3's one-kernel forward (its first column of programs
      stores U) and a one-kernel dx that accumulates V in its K loop (and stores it for dA); dA, dB
      as in v2.

The cost counted is the useful work: 2 T D_out D_in (the frozen product) + 2 T r (D_in + D_out) (the
two low-rank products) FLOPs for the forward; the backward adds 2 T D_out D_in (dx through W) and
4 T r (D_in + D_out) (V, V A, dA, dB). Every sum is in fp32 (fp64 for float64 inputs, which only the
gradient check uses); U and V are rounded to the input dtype once, so that their products run on the
tensor cores.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import (
    GRADS_ONLY,
    check_scalar,
    check_tensors,
    describe,
    refuse_grad,
    triton_device,
    triton_interpreting,
    wants_grad,
)
from snippets.common.baselines import compiled, grads_through, needs_gpu
from snippets.common.gemm import device_smem_limit, tile_coords, triton_half_dtypes
from snippets.registry import Impl, Op, device_generator, register

FLOAT_TYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_RANK = 128  # U's tile (BLOCK_M x r, fp32) lives in registers next to the accumulator
SCALE = 2.0  # alpha / r as LoRA configurations commonly set it (alpha = 2 r)


# --8<-- [start:reference]
def lora_linear_ref(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """y = x W^T + scale (x A^T) B^T. 2 T D_out D_in + 2 T r (D_in + D_out) FLOPs on at least
    (T D_in + D_out D_in + r D_in + D_out r + T D_out) elements: with r = 16 the adapter adds under
    1% of each."""
    return x @ w.T + scale * ((x @ a.T) @ b.T)


def lora_linear_fwd_bwd_ref(x, w, a, b, scale, dy):
    """The gradients of sum(y * dy) with respect to x, A and B (W is frozen). With U = scale x A^T
    and V = scale dy B:   dx = dy W + V A,   dA = V^T x,   dB = dy^T U."""
    u = scale * (x @ a.T)
    v = scale * (dy @ b)
    return dy @ w + v @ a, v.T @ x, dy.T @ u
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Library baselines
# --------------------------------------------------------------------------------------------------

# --8<-- [start:torch]
def lora_linear_torch(x, w, a, b, scale):
    """v0: what a LoRA layer runs in eager PyTorch (PEFT's Linear does the same): the frozen
    product, the two low-rank products, a scale and an add: five kernels, and three T x D_out
    tensors written and read back."""
    return F.linear(x, w) + scale * F.linear(F.linear(x, a), b)
# --8<-- [end:torch]


_lora_linear_compiled = compiled(lora_linear_torch)


def lora_linear_compiled(x, w, a, b, scale):
    """v1: v0 through torch.compile."""
    return _lora_linear_compiled(x, w, a, b, scale)


def _grads_through(forward, x, w, a, b, scale, dy):
    """A training step through ``forward`` (grads_through): x, A and B become leaves that require
    gradients, W stays frozen; then ``torch.autograd.grad`` with ``dy`` as the
    incoming gradient."""
    return grads_through(lambda x, a, b: forward(x, w.detach(), a, b, scale), (x, a, b), dy)


def lora_linear_fwd_bwd_torch(x, w, a, b, scale, dy):
    """v0: eager autograd (W frozen: no dW is computed)."""
    return _grads_through(lora_linear_torch, x, w, a, b, scale, dy)


def lora_linear_fwd_bwd_compiled(x, w, a, b, scale, dy):
    """v1: the forward compiled; AOTAutograd traces and compiles the backward as well."""
    return _grads_through(_lora_linear_compiled, x, w, a, b, scale, dy)


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------

# --8<-- [start:project_kernel]
@triton.jit
def _project_kernel(x_ptr, p_ptr, u_ptr, M, K, R, scale,
                    stride_xm, stride_xk, stride_pk, stride_pr, stride_um, stride_ur,
                    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                    PRECISION: tl.constexpr, ACC: tl.constexpr):
    """U = scale * X @ P for a skinny P (K x R, R <= BLOCK_R): one program per BLOCK_M rows of X,
    the whole width of U in one tile. It reads X once and is bound by that read."""
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    # (BLOCK_M, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk
    # (BLOCK_K, BLOCK_R)
    p_ptrs = p_ptr + offs_k[:, None] * stride_pk + offs_r[None, :] * stride_pr
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=ACC)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        p = tl.load(p_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_r[None, :] < R), other=0.0)
        acc = tl.dot(x, p, acc, input_precision=PRECISION, out_dtype=ACC)
        x_ptrs += BLOCK_K * stride_xk
        p_ptrs += BLOCK_K * stride_pk
    u_ptrs = u_ptr + offs_m[:, None].to(tl.int64) * stride_um + offs_r[None, :] * stride_ur
    tl.store(u_ptrs, (acc * scale).to(u_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))
# --8<-- [end:project_kernel]


# --8<-- [start:kernel]
@triton.jit
def _lora_matmul_kernel(a_ptr, b_ptr, c_ptr, u_ptr, p_ptr, q_ptr, M, N, K, R, scale,
                        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                        stride_um, stride_ur, stride_pk, stride_pr, stride_qr, stride_qn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr, U_IN_LOOP: tl.constexpr,
                        STORE_U: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """C = A @ B + U @ Q: a GEMM over K (A: M x K, B: K x N) with one more step of depth R <=
    BLOCK_R (U: M x R, Q: R x N) into the same accumulator, i.e. C = [A, U] @ [B; Q]. U is read from
    u_ptr, or, if U_IN_LOOP, computed here as scale * A @ P (P: K x R) from the A tiles the K loop
    loads anyway; then the programs of the first column of tiles store it (STORE_U) for a
    backward pass."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    # (BLOCK_M, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    # (BLOCK_K, BLOCK_N)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    # (BLOCK_K, BLOCK_R)
    p_ptrs = p_ptr + offs_k[:, None] * stride_pk + offs_r[None, :] * stride_pr
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    u_acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=ACC)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC)
        if U_IN_LOOP:  # the low-rank projection rides on the same A tile: r more columns of work
            p = tl.load(p_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_r[None, :] < R), other=0.0)
            u_acc = tl.dot(a, p, u_acc, input_precision=PRECISION, out_dtype=ACC)
            p_ptrs += BLOCK_K * stride_pk
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # (BLOCK_M, BLOCK_R)
    u_ptrs = u_ptr + offs_m[:, None].to(tl.int64) * stride_um + offs_r[None, :] * stride_ur
    u_mask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
    if U_IN_LOOP:
        # Rounded to the input dtype like the U that v2's skinny kernel writes: the extra step is a
        # tensor-core dot like the others, and the two versions compute the same numbers.
        u = (u_acc * scale).to(a_ptr.dtype.element_ty)
        if STORE_U:
            if pid_n == 0:  # every column of programs computed the same U; the first one writes it
                tl.store(u_ptrs, u, mask=u_mask)
    else:
        u = tl.load(u_ptrs, mask=u_mask, other=0.0)
    # The extra step of depth R: (BLOCK_M, BLOCK_R) @ (BLOCK_R, BLOCK_N) into the same accumulator.
    # Rows of Q past R load as zeros and add nothing, so r need not be a multiple of 16.
    # (BLOCK_R, BLOCK_N)
    q_ptrs = q_ptr + offs_r[:, None] * stride_qr + offs_n[None, :].to(tl.int64) * stride_qn
    q = tl.load(q_ptrs, mask=(offs_r[:, None] < R) & (offs_n[None, :] < N), other=0.0)
    acc = tl.dot(u, q, acc, input_precision=PRECISION, out_dtype=ACC)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:kernel]


# --------------------------------------------------------------------------------------------------
# Configs and launchers
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
# The GEMM: Part 4's larger tiles (the headline is a big square-ish product), 64-deep K steps of
# 16-bit values (128 bytes), 3 or 4 pipeline stages, two warpgroups; 128 x 128 with one warpgroup
# as well.
GEMM_TILES = ((128, 128), (128, 256), (256, 128))
GROUP_M = 8


def gemm_configs() -> list[triton.Config]:
    out = [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=GROUP_M), num_warps=8,
                         num_stages=s) for bm, bn in GEMM_TILES for s in (3, 4)]
    out += [triton.Config(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=GROUP_M), num_warps=4,
                          num_stages=s) for s in (3, 4)]
    return out


# The skinny projection reads X once and does little arithmetic per byte: rows per program small
# enough that T = 8192 rows give one or two waves of programs (64 or 128 per 132 SMs is too few), K
# steps of 64 or 128.
def project_configs() -> list[triton.Config]:
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_K=bk), num_warps=4, num_stages=s)
            for bm in (32, 64) for bk in (64, 128) for s in (3, 4)]


def gemm_smem_bytes(cfg: triton.Config, block_r: int, in_bytes: int, u_in_loop: bool) -> int:
    """Shared memory of one program: num_stages buffers of the A and B tiles (and of P's BLOCK_K x
    BLOCK_R tile when U is computed in the loop)."""
    k = cfg.kwargs
    per_stage = (k["BLOCK_M"] + k["BLOCK_N"]
                 + (block_r if u_in_loop else 0)) * k["BLOCK_K"] * in_bytes
    return cfg.num_stages * per_stage


def _prune_gemm(configs, named_args, **kwargs):
    """Drop the configs that need more shared memory than the device has (they would fail
    to launch)."""
    a = named_args["a_ptr"]
    limit = device_smem_limit(a.device.index or 0)
    kept = [c for c in configs
            if gemm_smem_bytes(c, kwargs["BLOCK_R"], a.element_size(), kwargs["U_IN_LOOP"])
            <= limit]
    return kept or configs[:1]


@functools.lru_cache(maxsize=None)
def gemm_autotuned():
    return triton.autotune(
        configs=gemm_configs(), key=["M", "N", "K", "BLOCK_R", "U_IN_LOOP"],
        prune_configs_by={"early_config_prune": _prune_gemm})(_lora_matmul_kernel)


@functools.lru_cache(maxsize=None)
def project_autotuned():
    return triton.autotune(configs=project_configs(), key=["M", "K", "BLOCK_R"])(_project_kernel)
# --8<-- [end:configs]


# Fixed configs: under the interpreter (nothing to tune, and small tiles make the CPU tests cover
# many tiles and groups), and on a GPU for fp32 (IEEE products on the FMA units: small tiles, it is
# never timed) and fp64 (the gradient check).
INTERPRET_GEMM = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2)
INTERPRET_PROJECT = dict(BLOCK_M=32, BLOCK_K=32)
WIDE_GEMM = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=GROUP_M, num_warps=4, num_stages=2)
WIDE_PROJECT = dict(BLOCK_M=32, BLOCK_K=32, num_warps=4, num_stages=2)


def _dot_types(dtype: torch.dtype):
    """(input_precision, accumulator type): IEEE fp32 products for fp32 inputs (tl.dot would use
    TF32 on a GPU), fp64 throughout for fp64 (the gradient check); 16-bit inputs are exact in fp32
    products anyway."""
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    return "ieee", acc


def block_r(r: int) -> int:
    """The width of U's tile: r rounded up to a power of two, at least 16 (the smallest
    tl.dot dimension)."""
    return max(16, triton.next_power_of_2(r))


# --8<-- [start:launch]
def _project(x: torch.Tensor, p: torch.Tensor, scale: float) -> torch.Tensor:
    """U = scale * x @ p for x (M, K) and p (K, r) with any strides; U is (M, r) in x's dtype."""
    (m, k), r = x.shape, p.shape[1]
    u = torch.empty((m, r), dtype=x.dtype, device=x.device)
    precision, acc = _dot_types(x.dtype)
    args = (x, p, u, m, k, r, scale, x.stride(0), x.stride(1), p.stride(0), p.stride(1),
            u.stride(0), u.stride(1))
    flags = dict(BLOCK_R=block_r(r), PRECISION=precision, ACC=acc)
    if triton_interpreting() or x.dtype not in (torch.float16, torch.bfloat16):
        cfg = INTERPRET_PROJECT if triton_interpreting() else WIDE_PROJECT
        _project_kernel[(triton.cdiv(m, cfg["BLOCK_M"]),)](*args, **flags, **cfg)
    else:
        project_autotuned()[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)](*args, **flags)
    return u


def _lora_matmul(a: torch.Tensor, b: torch.Tensor, q: torch.Tensor, *,
                 u: torch.Tensor | None = None, p: torch.Tensor | None = None, scale: float = 1.0,
                 store_u: bool = False):
    """C = a @ b + U @ q for a (M, K), b (K, N), q (r, N), any strides. U is given (``u``, (M, r))
    or, with ``p`` (K, r), computed in the K loop as scale * a @ p; ``store_u`` then returns it too.
    Returns (C, U)."""
    (m, k), n, r = a.shape, b.shape[1], q.shape[0]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    in_loop = p is not None
    if in_loop:
        u = torch.empty((m, r) if store_u else (0, r), dtype=a.dtype, device=a.device)
    else:
        p = u  # not read: U_IN_LOOP is off
    precision, acc = _dot_types(a.dtype)
    args = (a, b, c, u, p, q, m, n, k, r, scale, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), u.stride(0), u.stride(1), p.stride(0), p.stride(1),
            q.stride(0), q.stride(1))
    flags = dict(BLOCK_R=block_r(r), U_IN_LOOP=in_loop, STORE_U=in_loop and store_u,
                 PRECISION=precision, ACC=acc)
    if triton_interpreting() or a.dtype not in (torch.float16, torch.bfloat16):
        cfg = INTERPRET_GEMM if triton_interpreting() else WIDE_GEMM
        grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        _lora_matmul_kernel[grid](*args, **flags, **cfg)
    else:
        grid = lambda meta: (  # noqa: E731
            triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        gemm_autotuned()[grid](*args, **flags)
    return c, (u if store_u else None)
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# Checks and the public functions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_lora(x, w, a, b, scale, dtypes, device: str) -> tuple[int, int, int, int]:
    """x (..., D_in), w (D_out, D_in), a (r, D_in), b (D_out, r): one dtype and device, contiguous,
    w, a and b non-empty, 1 <= r <= MAX_RANK; scale a Python number. Returns (T, D_in, D_out, r)
    with the leading dimensions of x flattened into T rows (T may be 0: an empty batch gives an
    empty output)."""
    check_tensors(("x", "w", "a", "b"), (x, w, a, b), dtypes=dtypes, device=device,
                  same_shape=False)
    check_scalar("scale", scale)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (its features), got shape "
                         f"{tuple(x.shape)}")
    for name, t in (("w", w), ("a", a), ("b", b)):
        if t.dim() != 2 or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 2-D matrix, got {describe(t)}")
    d_out, d_in = w.shape
    r = a.shape[0]
    if x.shape[-1] != d_in:
        raise ValueError(f"x has {x.shape[-1]} features (shape {tuple(x.shape)}) but w is {d_out} "
                         f"x {d_in}: w must be (D_out, D_in), as nn.Linear stores it")
    if a.shape != (r, d_in):
        raise ValueError(f"a must be (r, D_in) = (r, {d_in}), got {tuple(a.shape)}")
    if b.shape != (d_out, r):
        raise ValueError(f"b must be (D_out, r) = ({d_out}, {r}) to match w {tuple(w.shape)} and a "
                         f"{tuple(a.shape)}, got {tuple(b.shape)}")
    if r > MAX_RANK:
        raise ValueError(f"rank r = {r} > {MAX_RANK}: U's tile (BLOCK_M x r) would not fit in "
                         "registers")
    return x.numel() // d_in, d_in, d_out, r
# --8<-- [end:checks]


# --8<-- [start:forward]
def _forward(x2, w, a, b, scale, in_loop: bool, keep_u: bool):
    """y (T, D_out) and, if ``keep_u``, U = scale x A^T (T, r) for checked 2-D inputs."""
    if in_loop:  # v3: one kernel; U from the x tiles of the K loop
        return _lora_matmul(x2, w.T, b.T, p=a.T, scale=scale, store_u=keep_u)
    u = _project(x2, a.T, scale)  # v2: the skinny kernel first, then the GEMM with its extra step
    y, _ = _lora_matmul(x2, w.T, b.T, u=u)
    return y, (u if keep_u else None)


def _lora_linear(x, w, a, b, scale, in_loop: bool) -> torch.Tensor:
    """v2 or v3; with grad mode on and x, A or B requiring grad, LoRALinearFunction (below), whose
    backward gives them their gradients (W is frozen: a W that requires grad is refused)."""
    t, d_in, d_out, _ = check_lora(x, w, a, b, scale, FLOAT_TYPES, triton_device())
    refuse_grad("lora_linear_fused" if in_loop else "lora_linear_two_kernels", w,
                instead="lora_linear_torch",
                why="computes no gradient for the frozen weight: w requires grad")
    if wants_grad(x, a, b):
        return LoRALinearFunction.apply(x, w, a, b, scale, in_loop)
    if t == 0:
        return x.new_empty((*x.shape[:-1], d_out))
    y, _ = _forward(x.reshape(t, d_in), w, a, b, float(scale), in_loop, keep_u=False)
    return y.reshape(*x.shape[:-1], d_out)


def lora_linear_two_kernels(x, w, a, b, scale):
    """v2: U = scale x A^T by the skinny kernel, then y = [x, U] @ [W, B]^T by one GEMM
    (two launches)."""
    return _lora_linear(x, w, a, b, scale, in_loop=False)


def lora_linear_fused(x, w, a, b, scale):
    """v3: one launch; each program computes its rows of x A^T in the K loop of x W^T."""
    return _lora_linear(x, w, a, b, scale, in_loop=True)
# --8<-- [end:forward]


# --8<-- [start:backward]
def _backward(dy2, x2, w, a, b, u, scale, in_loop: bool):
    """dx = dy W + V A, dA = V^T x, dB = dy^T U with V = scale dy B, for 2-D checked tensors."""
    if in_loop:  # V in the K loop of dy W (over D_out), stored by the first column of programs
        # P = B with D_out (the K of this product) contiguous, as the forward's P = A^T has D_in
        # contiguous: with B row-major (r contiguous) as P, Triton 3.6's sm_90 build of the kernel
        # read outside its shared memory (compute-sanitizer: out-of-range shared address in the K
        # loop). The copy is D_out x r.
        dx, v = _lora_matmul(dy2, w, a, p=b.t().contiguous().t(), scale=scale, store_u=True)
    else:
        v = _project(dy2, b, scale)
        dx, _ = _lora_matmul(dy2, w, a, u=v)
    # dA (r x D_in) and dB (D_out x r) sum over all T rows: long K, a few thousand outputs. cuBLAS
    # splits K across the SMs for such shapes, and neither product shares an operand tile with the
    # dx GEMM.
    return dx, v.T @ x2, dy2.T @ u
# --8<-- [end:backward]


# --8<-- [start:function]
class LoRALinearFunction(torch.autograd.Function):
    """A LoRA linear layer that trains A and B (and passes the gradient on to x) with W frozen. The
    forward keeps U = scale x A^T (T x r: 32 bytes a row at r = 16 in bf16) for dB. float64 is
    accepted so that torch.autograd.gradcheck can check the backward at the precision it needs."""

    @staticmethod
    def forward(ctx, x, w, a, b, scale, in_loop=False):
        t, d_in, d_out, _ = check_lora(x, w, a, b, scale, (*FLOAT_TYPES, torch.float64),
                                       triton_device())
        if w.requires_grad:
            raise ValueError("w must be frozen (requires_grad=False): this layer computes no "
                             "gradient for W")
        x2 = x.reshape(t, d_in)
        if t == 0:
            y, u = x.new_empty((0, d_out)), x.new_empty((0, a.shape[0]))
        else:
            y, u = _forward(x2, w, a, b, float(scale), in_loop, keep_u=True)
        ctx.save_for_backward(x2, w, a, b, u)
        ctx.scale, ctx.in_loop, ctx.x_shape = float(scale), in_loop, x.shape
        return y.reshape(*x.shape[:-1], d_out)

    @staticmethod
    def backward(ctx, dy):
        x2, w, a, b, u = ctx.saved_tensors
        dy2 = dy.reshape(-1, w.shape[0]).contiguous()  # autograd may pass a broadcast view
        if x2.shape[0] == 0:
            dx, da, db = torch.zeros_like(x2), torch.zeros_like(a), torch.zeros_like(b)
        else:
            dx, da, db = _backward(dy2, x2, w, a, b, u, ctx.scale, ctx.in_loop)
        return dx.reshape(ctx.x_shape), None, da, db, None, None


def lora_linear_train(x, w, a, b, scale, in_loop: bool = False):
    """The layer as a model calls it: ``LoRALinearFunction`` with v2's kernels
    (``in_loop=True``: v3's)."""
    return LoRALinearFunction.apply(x, w, a, b, scale, in_loop)
# --8<-- [end:function]


def lora_linear_fwd_bwd_two_kernels(x, w, a, b, scale, dy):
    """v2: LoRALinearFunction with the skinny-kernel forward and backward."""
    refuse_grad("lora_linear_fwd_bwd_two_kernels", x, w, a, b, dy, instead="lora_linear_train",
                why=GRADS_ONLY)
    return _grads_through(lambda *args: LoRALinearFunction.apply(*args, False), x, w, a, b, scale,
                          dy)


def lora_linear_fwd_bwd_fused(x, w, a, b, scale, dy):
    """v3: LoRALinearFunction with U and V computed in the K loops."""
    refuse_grad("lora_linear_fwd_bwd_fused", x, w, a, b, dy, instead="lora_linear_train",
                why=GRADS_ONLY)
    return _grads_through(lambda *args: LoRALinearFunction.apply(*args, True), x, w, a, b, scale,
                          dy)


# --8<-- [start:compile_sm90]
def compile_for_hopper(dtype: torch.dtype = torch.bfloat16, u_in_loop: bool = True, r: int = 16,
                       block_m: int = 128, block_n: int = 256, num_warps: int = 8,
                       num_stages: int = 3):
    """Compile the GEMM kernel for sm_90 on any machine (Triton's compiler runs on the host), with
    the strides of the forward (x and W row-major: W^T is K-major) and sizes that are multiples
    of 16. Returns the compiled kernel (``.asm["ptx"]``, ``.metadata.shared``). Needs
    TRITON_INTERPRET unset."""
    from snippets.common.introspect import TRITON_TYPES, triton_compile

    t = TRITON_TYPES[dtype]
    consts = dict(stride_ak=1, stride_bk=1, stride_cn=1, stride_ur=1, stride_pk=1, stride_qr=1,
                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64, BLOCK_R=block_r(r), GROUP_M=GROUP_M,
                  U_IN_LOOP=u_in_loop, STORE_U=u_in_loop, PRECISION="ieee", ACC=tl.float32)
    sig = {**{n: f"*{t}" for n in ("a_ptr", "b_ptr", "c_ptr", "u_ptr", "p_ptr", "q_ptr")},
           "scale": "fp32",
           **{n: "i32" for n in ("M", "N", "K", "R", "stride_am", "stride_bn", "stride_cm",
                                 "stride_um", "stride_pr", "stride_qn")}}
    divisible = [n for n, ty in sig.items() if ty[0] == "*" or ty == "i32"]
    return triton_compile(_lora_matmul_kernel, sig, consts, divisible, num_warps=num_warps,
                          num_stages=num_stages)
# --8<-- [end:compile_sm90]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _weights(size, dtype, device, gen, b_std):
    g = device_generator(gen, device)
    d_in, d_out, r = size["d_in"], size["d_out"], size["r"]
    w = torch.randn(d_out, d_in, generator=g, device=device) / math.sqrt(d_in)
    a = torch.randn(r, d_in, generator=g, device=device) / math.sqrt(d_in)
    b = torch.randn(d_out, r, generator=g, device=device) * b_std
    return w.to(dtype), a.to(dtype), b.to(dtype)


def _make_inputs(size, dtype, device, gen):
    """x ~ N(0, 1) (T x D_in); W and A ~ N(0, 1/D_in), B ~ N(0, 1/r): x W^T, x A^T and (x A^T) B^T
    all have entries of order 1 at every size, so the low-rank term is as visible in y as the frozen
    one (a trained B is far from LoRA's zero start). scale = 2."""
    w, a, b = _weights(size, dtype, device, gen, 1.0 / math.sqrt(size["r"]))
    x = torch.randn(size["t"], size["d_in"], generator=device_generator(gen, device), device=device)
    return x.to(dtype), w, a, b, SCALE


def _make_inputs_fwd_bwd(size, dtype, device, gen):
    """The forward's inputs and dy ~ N(0, 1), scaled so that dx, dA and dB all have entries of order
    1 at every size (one tolerance for the three): x ~ N(0, 1/T), because dA and dB sum T products,
    and B ~ N(0, 1/D_out), because V = scale dy B sums D_out of them."""
    w, a, b = _weights(size, dtype, device, gen, 1.0 / math.sqrt(size["d_out"]))
    g = device_generator(gen, device)
    x = torch.randn(size["t"], size["d_in"], generator=g, device=device) / math.sqrt(size["t"])
    dy = torch.randn(size["t"], size["d_out"], generator=g, device=device)
    return x.to(dtype), w, a, b, SCALE, dy.to(dtype)


def _flops(size, dtype) -> int:
    t, d_in, d_out, r = size["t"], size["d_in"], size["d_out"], size["r"]
    return 2 * t * d_out * d_in + 2 * t * r * (d_in + d_out)


def _flops_fwd_bwd(size, dtype) -> int:
    """Forward, plus dx through W (2 T D_out D_in) and V, V A, dA, dB (2 T r each of D_out, D_in,
    D_in, D_out)."""
    t, d_in, d_out, r = size["t"], size["d_in"], size["d_out"], size["r"]
    return _flops(size, dtype) + 2 * t * d_out * d_in + 4 * t * r * (d_in + d_out)


def _bytes(size, dtype) -> int:
    """Read x, W, A, B; write y."""
    t, d_in, d_out, r = size["t"], size["d_in"], size["d_out"], size["r"]
    return (t * d_in + d_out * d_in + r * (d_in + d_out) + t * d_out) * dtype.itemsize


def _bytes_fwd_bwd(size, dtype) -> int:
    """The forward's bytes (y is written, as a training forward must), then the backward reads dy,
    W, A, B and x and writes dx, dA, dB. U and V (T x r) are left out: a few percent of x."""
    t, d_in, d_out, r = size["t"], size["d_in"], size["d_out"], size["r"]
    backward = t * d_out + d_out * d_in + r * (d_in + d_out) + 2 * t * d_in + r * (d_in + d_out)
    return _bytes(size, dtype) + backward * dtype.itemsize


# T = 8192 tokens through a 4096 x 4096 projection: x, W and y are 64, 32 and 64 MiB in bf16, 3x the
# H200's 50 MB L2 together. The sweep over r shows what the adapter's width costs each design.
HEADLINE = {"t": 8192, "d_in": 4096, "d_out": 4096, "r": 16}
SWEEP = [{"t": 8192, "d_in": 4096, "d_out": 4096, "r": r} for r in (8, 16, 32, 64, 128)]
# D_in and D_out up to 96 and r from 1 to 33: ragged against the interpreter's 32 x 32 x 32 tiles
# and the 16-wide U tile, T = 1, and a rank that needs the 64-wide U tile.
TEST_SIZES = [{"t": 1, "d_in": 16, "d_out": 8, "r": 1}, {"t": 17, "d_in": 40, "d_out": 24, "r": 16},
              {"t": 40, "d_in": 72, "d_out": 33, "r": 33},
              {"t": 64, "d_in": 64, "d_out": 96, "r": 4}]
# Against float64, every sum in fp32: y, dx, dA, dB have entries of order 1-3 and are rounded once
# to the dtype (rtol 2u); U and V are rounded to the dtype before their products, and eager PyTorch
# rounds each of its intermediates too: atol 8u (1 + scale) covers those roundings of terms of size
# up to ~(1 + scale). A lost low-rank term or a wrong tile is off by ~1. fp32: IEEE products, sums
# over <= 100 terms.
_U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TOLERANCES = {**{d: (2 * u, 8 * u * (1 + SCALE)) for d, u in _U.items()},
              torch.float32: (1e-5, 1e-5)}
TRITON_DTYPES = (*triton_half_dtypes(), torch.float32)

FWD_SOURCES = (_lora_matmul_kernel, _project_kernel, tile_coords, _lora_matmul, _project, _forward,
               check_lora, gemm_configs, project_configs, _prune_gemm)
BWD_SOURCES = (*FWD_SOURCES, _backward, LoRALinearFunction.forward, LoRALinearFunction.backward,
               _grads_through)

lora_linear = register(Op(
    name="lora_linear", part=5, chapter="part5/lora.md", title="LoRA linear forward",
    reference=lora_linear_ref, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="r",
    measure_memory=True))
lora_linear.add(Impl("v0", lora_linear_torch, "PyTorch", "eager: 3 cuBLAS products, scale, add",
                     (F.linear,), device="any"))
lora_linear.add(Impl("v1", lora_linear_compiled, "Triton", "torch.compile of v0",
                     (lora_linear_torch,), device="cuda", requires=needs_gpu, origin="library"))
lora_linear.add(Impl("v2", lora_linear_two_kernels, "Triton",
                     "U = s x A^T kernel, then [x, U] @ [W, B]^T", FWD_SOURCES, device="any",
                     dtypes=TRITON_DTYPES))
lora_linear.add(Impl("v3", lora_linear_fused, "Triton",
                     "one kernel: x A^T in the K loop, extra K step", FWD_SOURCES, device="any",
                     dtypes=TRITON_DTYPES))

lora_linear_fwd_bwd = register(Op(
    name="lora_linear_fwd_bwd", part=5, chapter="part5/lora.md",
    title="LoRA linear forward + backward", reference=lora_linear_fwd_bwd_ref,
    make_inputs=_make_inputs_fwd_bwd, bytes_moved=_bytes_fwd_bwd, flops=_flops_fwd_bwd,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="r",
    measure_memory=True))
lora_linear_fwd_bwd.add(Impl("v0", lora_linear_fwd_bwd_torch, "PyTorch", "eager autograd, W frozen",
                             (lora_linear_torch, _grads_through), device="any"))
lora_linear_fwd_bwd.add(Impl("v1", lora_linear_fwd_bwd_compiled, "Triton",
                             "torch.compile forward and backward",
                             (lora_linear_torch, _grads_through), device="cuda", requires=needs_gpu,
                             origin="library"))
lora_linear_fwd_bwd.add(Impl("v2", lora_linear_fwd_bwd_two_kernels, "Triton",
                             "skinny U/V kernels, [dy, V] @ [W; A], cuBLAS dA, dB", BWD_SOURCES,
                             device="any", dtypes=TRITON_DTYPES))
lora_linear_fwd_bwd.add(Impl("v3", lora_linear_fwd_bwd_fused, "Triton",
                             "U, V in the K loops, one-kernel dx, cuBLAS dA, dB", BWD_SOURCES,
                             device="any", dtypes=TRITON_DTYPES))

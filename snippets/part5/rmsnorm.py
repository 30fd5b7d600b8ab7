"""RMS normalisation over the last dimension, forward and backward, in Triton.

``y = x * rstd * w`` for each row of ``x`` (M, N), with ``rstd = 1 / sqrt(mean(x^2) + eps)`` over
the row's N elements and ``eps = 1e-6`` (Llama's value). LayerNorm without the mean and without the
bias: one statistic instead of two, one learned vector instead of two. Two ops are registered.

Versions of ``rmsnorm`` (the forward; never renumbered):

- v0  ``torch.nn.functional.rms_norm``, eager: the library baseline.
- v1  the same call through ``torch.compile``: Inductor writes one Triton kernel per row block.
- v2  Liger-Kernel's Triton forward (``liger_kernel.ops.rms_norm.rms_norm_forward``), in its fp32
      ("gemma") casting mode, the one whose arithmetic matches this file's.
- v3  Triton, this chapter's kernel: the row in registers, one read of x, the sum of squares in
      fp32, one write of y. Part 4's LayerNorm forward (snippets/part4/layernorm.py) with the mean
      and the bias removed.

Versions of ``rmsnorm_fwd_bwd`` (a training step's forward and backward; each returns (dx, dw)):

- v0  eager PyTorch autograd: ``F.rms_norm`` then ``torch.autograd.grad``.
- v1  like v0 with the forward through ``torch.compile``: AOTAutograd compiles the backward as well.
- v2  Liger-Kernel's ``LigerRMSNormFunction`` ("gemma" casting, dx written over dy as its
  module does).
- v3  Triton, :class:`RMSNormFunction`: the forward also saves rstd (fp32, 4 bytes a row); the
      backward kernel computes dx row by row and sums dw for a group of rows into an fp32 (GROUPS,
      N) buffer, and a second small kernel adds the GROUPS partial rows in a fixed order: three
      launches, no atomics, the same bits every run. The design of Part 4's LayerNorm backward, with
      one partial buffer instead of two.

Inputs are ``x`` of shape (..., N) (leading dimensions are flattened into rows) and ``w`` of shape
(N,), one dtype (fp32, fp16 or bf16) on one device, contiguous; the output has x's dtype and shape.
Every sum is taken in fp32 (in fp64 for fp64 inputs, which only the gradient check uses). Cost:
``_bytes`` and ``_bytes_fwd_bwd``.

The goals, bf16 16384 x 4096: the forward, and forward + backward, at least as fast as
torch.compile's and Liger-Kernel's; the chapter's goal checks (docs/part5/norms-activations.md)
measure them on every GPU with results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, check_tensors, refuse_grad, triton_device, wants_grad
from snippets.common.baselines import compiled, grads_through, liger, liger_missing, needs_gpu
from snippets.common.rows import MAX_N as MAX_N  # the longest row it takes (re-exported)
from snippets.common.rows import (
    NORM_HEADLINE,
    NORM_SWEEP,
    NORM_TEST_SIZES,
    RowConfig,
    check_rows,
    compute_dtype,
)
from snippets.common.rows import backward_groups as row_backward_groups
from snippets.common.rows import config_for as row_config_for
from snippets.registry import Impl, Op, device_generator, register

EPS = 1e-6
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
# The whole row lives in registers: rows of at most MAX_N (65536 fp32 over 16 warps is 128
# registers a thread; snippets.common.rows, which check_rows enforces), as in Part 4's LayerNorm.


# --8<-- [start:reference]
def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w over the last dimension, eps = 1e-6 as in Llama.
    Reads x (M*N) and w (N), writes y (M*N): (2*M*N + N) * itemsize bytes, about 4 FLOPs
    an element."""
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * rstd * w


def rmsnorm_fwd_bwd_ref(x, w, dy, eps: float = 1e-6):
    """The gradients of sum(y * dy) for y = rmsnorm(x, w), by the closed form derived in the
    chapter: with xhat = x * rstd and g = dy * w,   dx = rstd * (g - xhat * mean(g * xhat)),   dw =
    sum over rows of dy * xhat."""
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    return dx, (dy * xhat).sum(dim=tuple(range(x.dim() - 1)))
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Library baselines
# --------------------------------------------------------------------------------------------------

def rmsnorm_torch(x, w):
    """v0: PyTorch's ``rms_norm`` (a fused CUDA kernel in recent releases)."""
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


_rmsnorm_compiled = compiled(rmsnorm_torch)


def rmsnorm_compiled(x, w):
    """v1: ``F.rms_norm`` through torch.compile: Inductor generates one Triton kernel for
    the row."""
    return _rmsnorm_compiled(x, w)


def rmsnorm_fwd_bwd_torch(x, w, dy):
    """v0: eager autograd through ``F.rms_norm``: its forward (which keeps what its backward needs)
    and its backward kernels, autograd's bookkeeping included, as in a training step."""
    return grads_through(rmsnorm_torch, (x, w), dy)


def rmsnorm_fwd_bwd_compiled(x, w, dy):
    """v1: like v0 with the forward compiled: AOTAutograd traces forward and backward, Inductor
    writes both."""
    return grads_through(_rmsnorm_compiled, (x, w), dy)


# Liger-Kernel's casting modes: "llama" rounds x * rstd to bf16 before multiplying by w, and its
# backward sums dw from bf16 products (about 2^-9 of relative error per term, which over 16384 rows
# leaves some dw entries farther from the float64 answer than bf16's own rounding); "gemma" computes
# everything in fp32, like v3. Gemma's mode adds an offset to w (1.0 in Gemma); offset 0.0 is
# plain RMSNorm.
LIGER_MODE = "gemma"


def rmsnorm_liger(x, w):
    """v2: Liger-Kernel's forward kernel, called directly (no autograd node): a program per row (or
    a block of 16 short rows), the row in registers, rstd stored for a backward."""
    return liger("rms_norm").rms_norm_forward(x, w, EPS, 0.0, LIGER_MODE, None)[0]


def rmsnorm_fwd_bwd_liger(x, w, dy):
    """v2: ``LigerRMSNormFunction`` as ``LigerRMSNorm`` runs it, with its default ``in_place=True``:
    the backward writes dx over dy (the incoming gradient has no other use in a model), so the
    caller's dy is overwritten."""
    fn = liger("rms_norm").LigerRMSNormFunction
    return grads_through(lambda x, w: fn.apply(x, w, EPS, 0.0, LIGER_MODE, True), (x, w), dy)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
# Launch parameters per row length: a RowConfig (snippets.common.rows: rows per forward program,
# forward and backward warps, backward groups per SM), as for Part 4's LayerNorm. Part 4's
# LayerNorm table, measured there on an H200 at 16384 x 4096 bf16 (1 row and 8 warps a forward
# program; 8 warps and 2 groups per SM for the backward). RMSNorm holds one row-long value fewer
# per element in each kernel and does one reduction fewer per row, so the same shapes apply; one
# partial buffer instead of two halves the partial traffic, which leaves room for 4 groups per SM
# at 4096 (more rows in flight per SM).
CONFIGS = {  # BLOCK_N -> RowConfig; shorter rows use the 1024 entry with more rows per program
    1024: RowConfig(rows=4, fwd_warps=8, bwd_warps=4, groups_per_sm=4),
    2048: RowConfig(rows=2, fwd_warps=8, bwd_warps=4, groups_per_sm=4),
    4096: RowConfig(rows=1, fwd_warps=8, bwd_warps=8, groups_per_sm=4),
    8192: RowConfig(rows=1, fwd_warps=16, bwd_warps=16, groups_per_sm=2),
    16384: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
    32768: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
    65536: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
}


def config_for(n: int) -> tuple[int, RowConfig]:
    """(BLOCK_N, RowConfig) for rows of length ``n``, from this module's table (the rule for
    short rows is snippets.common.rows.config_for, as for LayerNorm)."""
    return row_config_for(n, CONFIGS)
# --8<-- [end:configs]


# --8<-- [start:fwd_kernel]
@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, M, N, eps,
                        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STATS: tl.constexpr,
                        COMPUTE: tl.constexpr):
    # A (ROWS, BLOCK_N) tile of whole rows. N is a multiple of 16 in every benchmarked shape, and
    # Triton specialises on that, so the mask `cols < N` covers whole 16-byte vectors and the loads
    # stay vectorised.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]  # int64: M * N may pass 2**31

    # the one read of x; fp32 from here on
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    # One reduction: the padding was loaded as 0 and adds nothing to the sum of squares (no tl.where
    # needed, unlike LayerNorm, whose centring turns padded zeros into -mean).
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    # the same N values for every row: L2 hits
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # rounded once, to x's dtype
    if STATS:  # a training forward: 4 bytes a row, against 2 * N * itemsize for x and y
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
# --8<-- [end:fwd_kernel]


# --8<-- [start:bwd_kernel]
@triton.jit
def _rmsnorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_part_ptr, M, N, rows_per_group,
                        BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr):
    # Program `group` owns rows [group * rows_per_group, ...) and row `group` of the
    # partial-sum buffer.
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    # once per program, not once per row
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    dw_acc = tl.zeros([BLOCK_N], dtype=COMPUTE)  # this group's share of dw, in registers
    first = group * rows_per_group
    last = tl.minimum(first + rows_per_group, M)
    offs = first.to(tl.int64) * N + cols  # moved on by N each row
    for row in range(first, last):
        x = tl.load(x_ptr + offs, mask=col_ok, other=0.0).to(COMPUTE)
        dy = tl.load(dy_ptr + offs, mask=col_ok, other=0.0).to(COMPUTE)
        rstd = tl.load(rstd_ptr + row)  # saved by the forward: no second reduction over x
        xhat = x * rstd  # 0 in the padding, as x is
        g = dy * w  # dL/dxhat
        # dx = rstd * (g - xhat * mean(g * xhat)): one row sum, over registers
        c = tl.sum(g * xhat, axis=0) / N
        dx = rstd * (g - xhat * c)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)
        dw_acc += dy * xhat
        offs += N
    # One fp32 row per group: no two programs write the same address, so no atomics and no locks.
    tl.store(dw_part_ptr + group * N + cols, dw_acc, mask=col_ok)


@triton.jit
def _column_sum_kernel(part_ptr, out_ptr, GROUPS, N,
                       BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr):
    # Columns [pid * BLOCK_C, ...) of the (GROUPS, N) partials, summed down the groups in a fixed
    # order: the same bits every run. Part 4's _layernorm_dwdb_kernel does this for two buffers
    # at once.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=COMPUTE)
    for g0 in range(0, GROUPS, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        mask = (g < GROUPS)[:, None] & col_ok[None, :]
        acc += tl.load(part_ptr + g[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_ok)
# --8<-- [end:bwd_kernel]


# --8<-- [start:checks]
def _check_inputs(x, w, dtypes, device: str) -> tuple[int, int]:
    """RMSNorm's inputs: x (..., N) and w (N,), with Part 4 LayerNorm's rules (check_rows of
    snippets.common.rows)."""
    return check_rows(x, {"w": w}, dtypes, device)
# --8<-- [end:checks]


# --8<-- [start:fwd_host]
def _rmsnorm_fwd(x, w, eps: float, stats: bool):
    """Launch the forward on checked inputs; returns y and, if ``stats``, rstd (fp32, one
    per row)."""
    m, n = x.numel() // x.shape[-1], x.shape[-1]
    y = torch.empty_like(x)
    rstd = torch.empty(m if stats else 0,
                       dtype=torch.float64 if x.dtype == torch.float64 else torch.float32,
                       device=x.device)
    if m > 0:
        block_n, cfg = config_for(n)
        # a 3-row input does not need a 64-row program
        rows = min(cfg.rows, triton.next_power_of_2(m))
        _rmsnorm_fwd_kernel[(triton.cdiv(m, rows),)](
            x, w, y, rstd, m, n, eps, BLOCK_N=block_n, ROWS=rows, STATS=stats,
            COMPUTE=compute_dtype(x.dtype), num_warps=cfg.fwd_warps)
    return y, rstd


def rmsnorm_triton(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """v3: RMS norm of each row of x (..., N), in one launch; y has x's dtype and shape. With
    grad mode on and an input that requires grad, the call goes through RMSNormFunction (below),
    whose backward gives x and w their gradients."""
    _check_inputs(x, w, FLOAT_TYPES, triton_device())
    if wants_grad(x, w):
        return RMSNormFunction.apply(x, w, eps)
    return _rmsnorm_fwd(x, w, float(eps), stats=False)[0]
# --8<-- [end:fwd_host]


# --8<-- [start:bwd_host]
def backward_groups(m: int, n: int, device: torch.device) -> int:
    """How many groups of rows the backward splits M rows into: groups_per_sm programs per SM (from
    this module's table), at most M."""
    return row_backward_groups(m, n, device, CONFIGS)


def _rmsnorm_bwd(dy, x, w, rstd):
    """dx, dw from the saved x, w and rstd: the row kernel, then the column-sum kernel."""
    n = x.shape[-1]
    m = x.numel() // n
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    if m == 0:  # no rows: nothing flows back to x, and dw is an empty sum
        return dx, dw.zero_()
    block_n, cfg = config_for(n)
    compute = compute_dtype(x.dtype)
    groups = backward_groups(m, n, x.device)
    rows_per_group = triton.cdiv(m, groups)
    groups = triton.cdiv(m, rows_per_group)  # the last group may be short; none is empty
    dw_part = torch.empty((groups, n), dtype=rstd.dtype, device=x.device)
    _rmsnorm_bwd_kernel[(groups,)](x, w, dy, rstd, dx, dw_part, m, n, rows_per_group,
                                   BLOCK_N=block_n, COMPUTE=compute, num_warps=cfg.bwd_warps)
    # 64 columns a program: N / 64 programs (64 at N = 4096), each adding GROUPS x 64 partial sums.
    block_c = min(64, block_n)
    _column_sum_kernel[(triton.cdiv(n, block_c),)](dw_part, dw, groups, n, BLOCK_G=32,
                                                   BLOCK_C=block_c, COMPUTE=compute, num_warps=4)
    return dx, dw
# --8<-- [end:bwd_host]


# --8<-- [start:function]
class RMSNormFunction(torch.autograd.Function):
    """RMS norm that trains: the forward saves x, w and the per-row rstd in fp32 (4 bytes a row);
    nothing the size of x beyond x itself. float64 is accepted too, for torch.autograd.gradcheck."""

    @staticmethod
    def forward(ctx, x, w, eps=EPS):
        _check_inputs(x, w, (*FLOAT_TYPES, torch.float64), triton_device())
        y, rstd = _rmsnorm_fwd(x, w, float(eps), stats=True)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        # autograd may pass a broadcast view (the gradient of y.sum() is expanded ones)
        dy = dy.contiguous()
        dx, dw = _rmsnorm_bwd(dy, x, w, rstd)
        return dx, dw, None


def rmsnorm_fwd_bwd_triton(x, w, dy):
    """v3: RMSNormFunction through autograd, like v0: forward (1 launch), backward (2 launches)."""
    refuse_grad("rmsnorm_fwd_bwd_triton", x, w, dy, instead="rmsnorm_triton", why=GRADS_ONLY)
    check_tensors(("x", "dy"), (x, dy), dtypes=FLOAT_TYPES, device=triton_device())
    return grads_through(lambda x, w: RMSNormFunction.apply(x, w, EPS), (x, w), dy)
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """x ~ N(0, 1) rows (a hidden state), w ~ 1 + N(0, 0.1^2)."""
    g = device_generator(gen, device)
    m, n = size["m"], size["n"]
    x = torch.randn(m, n, generator=g, device=device)
    w = 1.0 + 0.1 * torch.randn(n, generator=g, device=device)
    return x.to(dtype), w.to(dtype)


def _make_inputs_fwd_bwd(size, dtype, device, gen):
    """The forward's inputs and an incoming gradient dy ~ N(0, 1) of y's shape."""
    x, w = _make_inputs(size, dtype, device, gen)
    dy = torch.randn(x.shape, generator=device_generator(gen, device), device=device)
    return x, w, dy.to(dtype)


def _bytes(size, dtype) -> int:
    """Read x and w, write y. The 4 bytes a row of rstd only a training forward writes."""
    m, n = size["m"], size["n"]
    return (2 * m * n + n) * dtype.itemsize


def _bytes_fwd_bwd(size, dtype) -> int:
    """Forward: read x, w, write y (2MN + N). Backward: read x, dy, w, write dx, dw (3MN + 2N). rstd
    is left out: the backward could recompute it from the x it reads anyway."""
    m, n = size["m"], size["n"]
    return (5 * m * n + 3 * n) * dtype.itemsize


# Part 4's LayerNorm sizes: the headline (bf16: 128 MiB of x and as much of y, 5x the H200's L2),
# the sweep with M * N fixed at 2^26 (every point moves the same bytes, so the curve shows only what
# the row length changes) and the odd test shapes.
HEADLINE, SWEEP, TEST_SIZES = NORM_HEADLINE, NORM_SWEEP, NORM_TEST_SIZES
# Against a float64 reference with every sum in fp32: outputs rounded once to their type (half an
# ulp: 2^-11 for fp16, 2^-8 relative for bf16) plus a few fp32 ulps from sums over N <= 4097 columns
# or M <= 123 rows; fp16 allows 4 of its ulps, bf16 2. bf16 runs on the GPU only; the library
# versions round twice there (x * rstd to bf16, then the product with w), which two bf16 ulps
# still cover.
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
              torch.bfloat16: (1.6e-2, 1.6e-2)}
TRITON_SOURCES = (_rmsnorm_fwd_kernel, _rmsnorm_fwd, _check_inputs, config_for)
BWD_SOURCES = (*TRITON_SOURCES, _rmsnorm_bwd_kernel, _column_sum_kernel, _rmsnorm_bwd,
               backward_groups, RMSNormFunction.forward, RMSNormFunction.backward, grads_through)

rmsnorm = register(Op(
    name="rmsnorm", part=5, chapter="part5/norms-activations.md", title="RMSNorm forward",
    reference=rmsnorm_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: 4 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES))
# v0 runs on the GPU only: PyTorch's CPU rms_norm computes fp16 in fp16 (3e-3 from the float64
# answer at 781 columns), its CUDA kernel, the one benchmarked, in fp32.
rmsnorm.add(Impl("v0", rmsnorm_torch, "PyTorch", "torch.nn.functional.rms_norm", (F.rms_norm,),
                 device="cuda"))
rmsnorm.add(Impl("v1", rmsnorm_compiled, "Triton", "torch.compile(F.rms_norm)", (rmsnorm_torch,),
                 device="cuda", requires=needs_gpu, origin="library"))
rmsnorm.add(Impl("v2", rmsnorm_liger, "Triton", "Liger-Kernel 0.8.5 rms_norm_forward", (liger,),
                 device="cuda", requires=liger_missing, origin="library"))
rmsnorm.add(Impl("v3", rmsnorm_triton, "Triton", "row in registers, fp32 sum of squares",
                 TRITON_SOURCES, device="any"))

rmsnorm_fwd_bwd = register(Op(
    name="rmsnorm_fwd_bwd", part=5, chapter="part5/norms-activations.md",
    title="RMSNorm forward + backward", reference=rmsnorm_fwd_bwd_ref,
    make_inputs=_make_inputs_fwd_bwd, bytes_moved=_bytes_fwd_bwd,
    flops=lambda s, d: 12 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES, measure_memory=True))
rmsnorm_fwd_bwd.add(Impl("v0", rmsnorm_fwd_bwd_torch, "PyTorch", "F.rms_norm + torch.autograd.grad",
                         (F.rms_norm, grads_through), device="cuda"))
rmsnorm_fwd_bwd.add(Impl("v1", rmsnorm_fwd_bwd_compiled, "Triton",
                         "torch.compile forward and backward", (rmsnorm_torch, grads_through),
                         device="cuda", requires=needs_gpu, origin="library"))
rmsnorm_fwd_bwd.add(Impl("v2", rmsnorm_fwd_bwd_liger, "Triton",
                         "Liger-Kernel 0.8.5 LigerRMSNormFunction", (liger, grads_through),
                         device="cuda", requires=liger_missing, origin="library"))
rmsnorm_fwd_bwd.add(Impl("v3", rmsnorm_fwd_bwd_triton, "Triton",
                         "RMSNormFunction: saved fp32 rstd, (GROUPS, N) partial dW", BWD_SOURCES,
                         device="any"))

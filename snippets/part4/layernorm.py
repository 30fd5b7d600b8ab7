"""Layer normalisation over the last dimension, forward and backward, in Triton (and the forward in
CUDA C).

``y = (x - mean) * rstd * w + b`` for each row of ``x`` (M, N), with ``mean`` and
``rstd = 1 / sqrt(var + eps)`` taken over the row's N elements, ``eps = 1e-5``. Two ops
are registered.

Versions of ``layernorm`` (the forward; never renumbered):

- v0  ``torch.nn.functional.layer_norm``, eager: the library baseline.
- v1  the same call through ``torch.compile``: Inductor writes a fused Triton kernel for it.
- v2  Liger-Kernel's Triton forward (``liger_kernel.ops.layer_norm.layer_norm_forward``).
- v3  Triton, this chapter's kernel: one program per row (several rows for short rows), the whole
      row in registers, statistics in fp32 by two passes over the registers, one read of x and one
      write of y.
- v4  CUDA C (csrc/part4/layernorm.cu), the same algorithm by hand: one block per row, 16-byte
      loads, warp shuffles and one shared-memory exchange per statistic. It exists to compare the
      two languages on one op.
- v5  CUDA C (``snippets/part4/layernorm_v5.py``, ``csrc/layernorm/layernorm_v5.cu``), one warp
      per row: the row packed in registers, statistics by shuffles alone; v4 for rows a warp
      cannot take.

Versions of ``layernorm_fwd_bwd`` (a training step's forward and backward; each returns (dx,
dw, db)):

- v0  eager PyTorch autograd: ``F.layer_norm`` then ``torch.autograd.grad``.
- v1  like v0 with the forward through ``torch.compile``: AOTAutograd compiles a forward and
  a backward.
- v2  Liger-Kernel's ``LigerLayerNormFunction``.
- v3  Triton, :class:`LayerNormFunction`: v3's forward kernel also saves mean and rstd (fp32); the
      backward kernel computes dx row by row and sums dw, db for a group of rows into an fp32
      (GROUPS, N) buffer, and a second small kernel adds the GROUPS partial rows: three launches, no
      atomics, the same bits every run.

Inputs are ``x`` of shape (..., N) (leading dimensions are flattened into rows, as ``nn.LayerNorm``
does), and ``w``, ``b`` of shape (N,), all of one dtype (fp32, fp16 or bf16) on one device,
contiguous; the output has x's dtype and shape. Statistics and every sum are computed in fp32 (in
fp64 for fp64 inputs, which only the gradient check uses). Cost: the forward reads x, w, b and
writes y; the backward reads x, dy, w and writes dx, dw, db (see ``_bytes`` and ``_bytes_fwd_bwd``).

The goals, bf16 16384 x 4096: v3 at least as fast as Liger-Kernel's forward, torch.compile's and
eager PyTorch's, and forward + backward at least as fast as all three; the chapter's goal checks
(docs/part4/layernorm.md) measure them on every GPU with results.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets import cuda
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

EPS = 1e-5
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
CU_FILE = "part4/layernorm.cu"
# The whole row lives in registers (v3 and v4): rows of at most MAX_N (snippets.common.rows).


# --8<-- [start:reference]
def layernorm_ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                  eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dimension, var the biased (1/N)
    variance, eps = 1e-5 (F.layer_norm's default). Reads x (M*N), w and b (N each), writes y
    (M*N): (2*M*N + 2*N) * itemsize bytes, about 8 FLOPs an element."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def layernorm_fwd_bwd_ref(x, w, b, dy, eps: float = 1e-5):
    """The gradients of sum(y * dy) for y = layernorm(x, w, b), by the closed-form backward (derived
    in the chapter): with xhat = (x - mean) * rstd and g = dy * w,
        dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum over rows of dy * xhat,  db =
        sum of dy."""
    mean = x.mean(dim=-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    rows = tuple(range(x.dim() - 1))
    return dx, (dy * xhat).sum(dim=rows), dy.sum(dim=rows)
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Library baselines
# --------------------------------------------------------------------------------------------------

def layernorm_torch(x, w, b):
    """v0: PyTorch's fused layer-norm kernel (one launch)."""
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


_layernorm_compiled = compiled(layernorm_torch)


def layernorm_compiled(x, w, b):
    """v1: ``F.layer_norm`` through torch.compile: Inductor generates one Triton kernel for
    the row."""
    return _layernorm_compiled(x, w, b)


def layernorm_fwd_bwd_torch(x, w, b, dy):
    """v0: eager autograd. Timed: making x, w, b leaves that require grad, ``F.layer_norm`` (which
    also keeps mean and rstd for the backward), and ``torch.autograd.grad`` (PyTorch's backward
    kernels for dx and for dw/db), autograd's own bookkeeping included, as in a training step."""
    return grads_through(layernorm_torch, (x, w, b), dy)


def layernorm_fwd_bwd_compiled(x, w, b, dy):
    """v1: like v0, with the forward compiled: AOTAutograd traces the forward and the backward and
    Inductor writes a kernel (or a few) for each; ``torch.autograd.grad`` runs the
    compiled backward."""
    return grads_through(_layernorm_compiled, (x, w, b), dy)


def layernorm_liger(x, w, b):
    """v2: Liger-Kernel's forward kernel, called directly (no autograd node): one program per row,
    the row in registers, mean and rstd stored for a backward."""
    return liger("layer_norm").layer_norm_forward(x, w, b, EPS)[0]


def layernorm_fwd_bwd_liger(x, w, b, dy):
    """v2: Liger-Kernel's autograd function, forward and backward, as ``LigerLayerNorm`` runs it."""
    fn = liger("layer_norm").LigerLayerNormFunction
    return grads_through(lambda x, w, b: fn.apply(x, w, b, EPS), (x, w, b), dy)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
# Launch parameters per row length, a RowConfig (snippets.common.rows) each. Chosen in tuning runs
# on an H200 (Triton 3.6) at 16384 x 4096 bf16: the forward with 1 row and 8 warps a program is
# ahead of Liger-Kernel's; the backward with 8 warps and 2 groups per SM beat 1 and 4 groups per SM
# and 4 or 16 warps. The other rows are not tuned: warps keep 16 to 32 elements
# per thread (the backward, with five row-long values per thread, gets twice the forward's warps
# past 4096), and groups_per_sm falls as N grows to keep the (GROUPS, N) partial buffers near 1/20
# of the backward's traffic.
CONFIGS = {  # BLOCK_N -> RowConfig; shorter rows use the 1024 entry with more rows per program
    1024: RowConfig(rows=4, fwd_warps=8, bwd_warps=4, groups_per_sm=4),
    2048: RowConfig(rows=2, fwd_warps=8, bwd_warps=4, groups_per_sm=4),
    4096: RowConfig(rows=1, fwd_warps=8, bwd_warps=8, groups_per_sm=2),
    8192: RowConfig(rows=1, fwd_warps=16, bwd_warps=16, groups_per_sm=1),
    16384: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
    32768: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
    65536: RowConfig(rows=1, fwd_warps=16, bwd_warps=32, groups_per_sm=1),
}


def config_for(n: int) -> tuple[int, RowConfig]:
    """(BLOCK_N, RowConfig) for rows of length ``n``, from this module's CONFIGS (the rule for
    short rows is snippets.common.rows.config_for)."""
    return row_config_for(n, CONFIGS)
# --8<-- [end:configs]


# --8<-- [start:fwd_kernel]
@triton.jit
def _layernorm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps,
                          BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STATS: tl.constexpr,
                          COMPUTE: tl.constexpr):
    # A (ROWS, BLOCK_N) tile: ROWS whole rows, each padded to a power of two. N is a multiple of 16
    # in every benchmarked shape, and Triton specialises on that, so `cols < N` masks whole
    # 16-byte vectors.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]  # int64: M * N may pass 2**31

    # One read of x; everything after happens in registers, in fp32 (bf16/fp16 are only a
    # storage format).
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    # Two passes over the registers: the mean, then the mean square of x - mean. Subtracting first
    # keeps the variance exact-ish when |mean| >> std, where E[x^2] - E[x]^2 would
    # cancel catastrophically.
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)  # padding must not add (0 - mean)^2 to the variance
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)

    # w and b: the same N values for every row; they stay in L2 (and L1) after the first programs.
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # rounded once, to x's dtype
    if STATS:  # for a backward: 8 bytes per row, against 2 * N * itemsize for x and y
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
# --8<-- [end:fwd_kernel]


# --8<-- [start:bwd_kernel]
@triton.jit
def _layernorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr,
                          db_part_ptr, M, N, rows_per_group,
                          BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr):
    # Program `group` owns rows [group * rows_per_group, ...) and one row of each
    # partial-sum buffer.
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(COMPUTE)
    dw_acc = tl.zeros([BLOCK_N], dtype=COMPUTE)  # this group's share of dw and db, in registers
    db_acc = tl.zeros([BLOCK_N], dtype=COMPUTE)
    first = group * rows_per_group
    last = tl.minimum(first + rows_per_group, M)
    offs = first.to(tl.int64) * N + cols  # int64: M * N may pass 2**31; moved on by N each row
    for row in range(first, last):
        x = tl.load(x_ptr + offs, mask=col_ok, other=0.0).to(COMPUTE)
        dy = tl.load(dy_ptr + offs, mask=col_ok, other=0.0).to(COMPUTE)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(col_ok, (x - mean) * rstd, 0.0)
        g = dy * w  # dL/dxhat; 0 in the padding, since dy is
        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)): two row sums, both over registers
        c_g = tl.sum(g, axis=0) / N
        c_gx = tl.sum(g * xhat, axis=0) / N
        dx = rstd * (g - c_g - xhat * c_gx)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)
        dw_acc += dy * xhat
        db_acc += dy
        offs += N
    # One fp32 row per group: no two programs write the same address, so no atomics and no locks.
    tl.store(dw_part_ptr + group * N + cols, dw_acc, mask=col_ok)
    tl.store(db_part_ptr + group * N + cols, db_acc, mask=col_ok)


@triton.jit
def _layernorm_dwdb_kernel(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, GROUPS, N,
                           BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr):
    # Column block `pid` of the (GROUPS, N) partials, summed down the groups in a fixed
    # order: deterministic.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    dw = tl.zeros([BLOCK_G, BLOCK_C], dtype=COMPUTE)
    db = tl.zeros([BLOCK_G, BLOCK_C], dtype=COMPUTE)
    for g0 in range(0, GROUPS, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        mask = (g < GROUPS)[:, None] & col_ok[None, :]
        offs = g[:, None] * N + cols[None, :]
        dw += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)
        db += tl.load(db_part_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(dw, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(db, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)
# --8<-- [end:bwd_kernel]


# --8<-- [start:checks]
def _check_inputs(x, w, b, dtypes, device: str) -> tuple[int, int]:
    """LayerNorm's inputs: x (..., N), w and b (N,); see check_rows (snippets.common.rows)."""
    return check_rows(x, {"w": w, "b": b}, dtypes, device)
# --8<-- [end:checks]


# --8<-- [start:fwd_host]
def _layernorm_fwd(x, w, b, eps: float, stats: bool):
    """Launch the forward on checked inputs; returns y and, if ``stats``, mean and rstd (fp32, one
    per row)."""
    m, n = x.numel() // x.shape[-1], x.shape[-1]
    y = torch.empty_like(x)
    stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    mean = torch.empty(m if stats else 0, dtype=stat_dtype, device=x.device)
    rstd = torch.empty_like(mean)
    if m > 0:
        block_n, cfg = config_for(n)
        # a 3-row input does not need a 64-row program
        rows = min(cfg.rows, triton.next_power_of_2(m))
        _layernorm_fwd_kernel[(triton.cdiv(m, rows),)](
            x, w, b, y, mean, rstd, m, n, eps, BLOCK_N=block_n, ROWS=rows, STATS=stats,
            COMPUTE=compute_dtype(x.dtype), num_warps=cfg.fwd_warps)
    return y, mean, rstd


def layernorm_triton(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                     eps: float = EPS) -> torch.Tensor:
    """v3: layer norm of each row of x (..., N), in one launch; y has x's dtype and shape. With
    grad mode on and an input that requires grad, the call goes through LayerNormFunction (below),
    whose backward gives x, w and b their gradients."""
    _check_inputs(x, w, b, FLOAT_TYPES, triton_device())
    if wants_grad(x, w, b):
        return LayerNormFunction.apply(x, w, b, eps)
    return _layernorm_fwd(x, w, b, float(eps), stats=False)[0]
# --8<-- [end:fwd_host]


# --8<-- [start:bwd_host]
def backward_groups(m: int, n: int, device: torch.device) -> int:
    """How many groups of rows the backward splits M rows into: groups_per_sm programs per SM
    (from this module's CONFIGS), at most M (snippets.common.rows.backward_groups)."""
    return row_backward_groups(m, n, device, CONFIGS)


def _layernorm_bwd(dy, x, w, mean, rstd):
    """dx, dw, db from the saved x, w, mean and rstd: the row kernel, then the
    partial-sum kernel."""
    n = x.shape[-1]
    m = x.numel() // n
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    db = torch.empty_like(w)
    if m == 0:  # no rows: nothing flows back to x, and dw, db are empty sums
        return dx, dw.zero_(), db.zero_()
    block_n, cfg = config_for(n)
    compute = compute_dtype(x.dtype)
    groups = backward_groups(m, n, x.device)
    rows_per_group = triton.cdiv(m, groups)
    groups = triton.cdiv(m, rows_per_group)  # the last group may be short; none is empty
    part_dtype = mean.dtype
    dw_part = torch.empty((groups, n), dtype=part_dtype, device=x.device)
    db_part = torch.empty((groups, n), dtype=part_dtype, device=x.device)
    _layernorm_bwd_kernel[(groups,)](
        x, w, dy, mean, rstd, dx, dw_part, db_part, m, n, rows_per_group,
        BLOCK_N=block_n, COMPUTE=compute, num_warps=cfg.bwd_warps)
    # 64 columns per program: N / 64 programs (64 at N = 4096), each adding GROUPS x 64 values of
    # both buffers.
    block_c = min(64, block_n)
    _layernorm_dwdb_kernel[(triton.cdiv(n, block_c),)](
        dw_part, db_part, dw, db, groups, n, BLOCK_G=32, BLOCK_C=block_c, COMPUTE=compute,
        num_warps=4)
    return dx, dw, db
# --8<-- [end:bwd_host]


# --8<-- [start:function]
class LayerNormFunction(torch.autograd.Function):
    """Layer norm that trains: the forward saves x, w and the per-row mean and rstd (8 bytes a row)
    so that the backward does not recompute them. float64 is accepted as well, so that
    torch.autograd.gradcheck can check the backward at the precision it needs."""

    @staticmethod
    def forward(ctx, x, w, b, eps=EPS):
        _check_inputs(x, w, b, (*FLOAT_TYPES, torch.float64), triton_device())
        y, mean, rstd = _layernorm_fwd(x, w, b, float(eps), stats=True)
        ctx.save_for_backward(x, w, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        # autograd may pass a broadcast view (the gradient of y.sum() is expanded ones)
        dy = dy.contiguous()
        dx, dw, db = _layernorm_bwd(dy, x, w, mean, rstd)
        return dx, dw, db, None


def layernorm_fwd_bwd_triton(x, w, b, dy):
    """v3: LayerNormFunction through autograd, like v0: forward (1 launch), backward
    (2 launches)."""
    refuse_grad("layernorm_fwd_bwd_triton", x, w, b, dy, instead="layernorm_triton", why=GRADS_ONLY)
    check_tensors(("x", "dy"), (x, dy), dtypes=FLOAT_TYPES, device=triton_device())
    return grads_through(lambda x, w, b: LayerNormFunction.apply(x, w, b, EPS), (x, w, b), dy)
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part4/layernorm.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
CUDA_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
VECS = (1, 2, 4)  # 16-byte vectors per thread: the kernels compiled in layernorm.cu
CUDA_THREADS = 512   # the most threads per block: the kernels' __launch_bounds__
CU_OPTIONS = cuda.defines(CU_FILE, CUDA_THREADS=CUDA_THREADS)  # layernorm.cu gets it as a -D option


def cuda_launch_shape(n: int, itemsize: int) -> tuple[int, int]:
    """(vectors per thread, threads per block) for rows of n elements: one block per row, each
    thread holding ``vecs`` 16-byte vectors. The fewest vectors per thread that keep the block
    within CUDA_THREADS threads (more threads and fewer vectors: more warps to hide latency). Raises
    ValueError past 4 vectors of 512."""
    per_vec = 16 // itemsize
    n_vec = triton.cdiv(n, per_vec)
    for vecs in VECS:
        threads = 32 * triton.cdiv(triton.cdiv(n_vec, vecs), 32)
        if threads <= CUDA_THREADS:
            return vecs, threads
    raise ValueError(f"rows of {n} elements of {itemsize} bytes do not fit one block of the CUDA "
                     f"kernel: at most {VECS[-1] * CUDA_THREADS * per_vec}")


def layernorm_cuda(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                   eps: float = EPS) -> torch.Tensor:
    """v4: the CUDA C forward, one block per row. Rows whose length is a multiple of 16 bytes and
    that start 16-byte aligned are read and written with 16-byte vectors; others element by element
    (same kernel)."""
    refuse_grad("layernorm_cuda", x, w, b, instead="layernorm_triton")
    cuda.require_gpu()
    m, n = _check_inputs(x, w, b, FLOAT_TYPES, "cuda")
    y = torch.empty_like(x)
    if m == 0:
        return y
    vecs, threads = cuda_launch_shape(n, x.element_size())
    aligned = all(t.data_ptr() % 16 == 0 for t in (x, w, b, y)) and (n * x.element_size()) % 16 == 0
    fn = cuda.kernel(CU_FILE, f"layernorm_fwd_{CUDA_SUFFIX[x.dtype]}_v{vecs}", CU_OPTIONS)
    cuda.launch(fn, m, threads, (x, w, b, y, np.int32(n), np.float32(eps), np.int32(aligned)))
    return y
# --8<-- [end:cuda_launch]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """x ~ N(1, 2^2) rows (a non-zero mean, so centring matters), w ~ 1 + N(0, 0.1^2), b ~
    N(0, 0.1^2)."""
    g = device_generator(gen, device)
    m, n = size["m"], size["n"]
    x = torch.randn(m, n, generator=g, device=device) * 2.0 + 1.0
    w = 1.0 + 0.1 * torch.randn(n, generator=g, device=device)
    b = 0.1 * torch.randn(n, generator=g, device=device)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def _make_inputs_fwd_bwd(size, dtype, device, gen):
    """The forward's inputs and an incoming gradient dy ~ N(0, 1) of y's shape."""
    x, w, b = _make_inputs(size, dtype, device, gen)
    dy = torch.randn(x.shape, generator=device_generator(gen, device), device=device)
    return x, w, b, dy.to(dtype)


def _bytes(size, dtype) -> int:
    """Read x, w, b; write y. The 8 bytes a row of mean and rstd only a training forward writes."""
    m, n = size["m"], size["n"]
    return (2 * m * n + 2 * n) * dtype.itemsize


def _bytes_fwd_bwd(size, dtype) -> int:
    """Forward: read x, w, b, write y (2MN + 2N). Backward: read x, dy, w, write dx, dw, db (3MN +
    3N). mean and rstd are left out: the backward could recompute them from the x it
    reads anyway."""
    m, n = size["m"], size["n"]
    return (5 * m * n + 5 * n) * dtype.itemsize


# bf16 16384 x 4096 (128 MiB of x and as much of y, 5x the H200's L2), a sweep with M * N fixed at
# 2^26, and odd test shapes: the sizes both norms are measured at (snippets.common.rows).
HEADLINE, SWEEP, TEST_SIZES = NORM_HEADLINE, NORM_SWEEP, NORM_TEST_SIZES
# Against a float64 reference, with every sum in fp32: the outputs are rounded once to their type,
# at most half an ulp (2^-11 fp16, 2^-8 bf16, relative), and fp32 sums over N <= 4097 columns or M
# <= 123 rows add a few fp32 ulp. fp16 allows 4 of its ulps; bf16 allows 2 of its ulps, because
# Triton's CPU interpreter rounds fp32 to bf16 by truncation (a whole ulp) where the GPU rounds to
# nearest. fp32: dw and db sum 123 rows of terms near 1, and PyTorch's CPU layer_norm is within 2e-5
# of the float64 answer there.
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
              torch.bfloat16: (1.6e-2, 1.6e-2)}
TRITON_SOURCES = (_layernorm_fwd_kernel, _layernorm_fwd, _check_inputs, config_for)
BWD_SOURCES = (*TRITON_SOURCES, _layernorm_bwd_kernel, _layernorm_dwdb_kernel, _layernorm_bwd,
               backward_groups, LayerNormFunction.forward, LayerNormFunction.backward,
               grads_through)

layernorm = register(Op(
    name="layernorm", part=4, chapter="part4/layernorm.md", title="LayerNorm forward",
    reference=layernorm_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: 8 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES))
layernorm.add(Impl("v0", layernorm_torch, "PyTorch", "torch.nn.functional.layer_norm",
                   (F.layer_norm,), device="any"))
layernorm.add(Impl("v1", layernorm_compiled, "Triton", "torch.compile(F.layer_norm)",
                   (layernorm_torch,), device="cuda", requires=needs_gpu, origin="library"))
layernorm.add(Impl("v2", layernorm_liger, "Triton", "Liger-Kernel 0.8.5 layer_norm_forward",
                   (liger,), device="cuda", requires=liger_missing, origin="library"))
layernorm.add(Impl("v3", layernorm_triton, "Triton", "row in registers, fp32 two-pass statistics",
                   TRITON_SOURCES, device="any"))
layernorm.add(Impl("v4", layernorm_cuda, "CUDA", "block per row, 16-byte vectors, shuffles",
                   (cuda.source_path(CU_FILE), _check_inputs, cuda_launch_shape), device="cuda"))

layernorm_fwd_bwd = register(Op(
    name="layernorm_fwd_bwd", part=4, chapter="part4/layernorm.md",
    title="LayerNorm forward + backward", reference=layernorm_fwd_bwd_ref,
    make_inputs=_make_inputs_fwd_bwd, bytes_moved=_bytes_fwd_bwd,
    flops=lambda s, d: 21 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES))
# v0 runs on the GPU only: PyTorch's CPU backward sums dw and db in fp16/bf16 for those inputs
# (relative errors of 4e-2 and 2e-1 at 123 rows), while its CUDA backward, the one benchmarked, sums
# in fp32.
layernorm_fwd_bwd.add(Impl("v0", layernorm_fwd_bwd_torch, "PyTorch",
                           "F.layer_norm + torch.autograd.grad", (F.layer_norm, grads_through),
                           device="cuda"))
layernorm_fwd_bwd.add(Impl("v1", layernorm_fwd_bwd_compiled, "Triton",
                           "torch.compile forward and backward", (layernorm_torch, grads_through),
                           device="cuda", requires=needs_gpu, origin="library"))
layernorm_fwd_bwd.add(Impl("v2", layernorm_fwd_bwd_liger, "Triton",
                           "Liger-Kernel 0.8.5 LigerLayerNormFunction", (liger, grads_through),
                           device="cuda", requires=liger_missing, origin="library"))
layernorm_fwd_bwd.add(Impl("v3", layernorm_fwd_bwd_triton, "Triton",
                           "LayerNormFunction: saved stats, (GROUPS, N) partial dW/dB", BWD_SOURCES,
                           device="any"))

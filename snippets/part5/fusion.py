"""Why fusion pays: the bytes of a chain of element-wise kernels, one fused kernel, and a case where
fusing loses.

Versions of ``bias_gelu_dropout_residual`` (``y = residual + dropout(gelu(x + bias))`` over an (M,
N) tensor with a bias of N; exact erf GELU; every version takes ``(x, bias, residual, p, seed)``;
never renumbered):

- v0  PyTorch eager: ``F.gelu(x + bias)``, ``F.dropout``, ``+ residual``: four kernels, three
      intermediates of (M, N) written to memory and read back (and a one-byte dropout mask written
      beside them). torch's own generator: ``seed`` is not used.
- v1  v0 through ``torch.compile`` (GPU only): Inductor fuses the chain into one generated Triton
      kernel, with its own Philox stream.
- v2  Triton, unfused on purpose: one kernel per step (bias add, GELU, the seeded dropout of Part 4,
      residual add), each reading its input from memory and writing its output back, intermediates
      in the input dtype. The "before" that the bytes model (:func:`chain_bytes`) predicts.
- v3  Triton, fused: one kernel reads x, residual and the bias once, keeps every intermediate in
      registers in fp32 and writes y once. The keep bits are the same as v2's: element
      ``i = row * N + col`` is kept when ``tl.rand(seed, i) >= p``.
- v4  Triton, like v3 but one ``tl.rand4x`` call draws the random numbers of four neighbouring
      elements (Part 4's dropout v3): element ``i`` takes word ``i % 4`` of Philox at counter
      ``i // 4``, a quarter of v3's Philox evaluations when ``N % 4 == 0`` (when it is not, a group
      of four straddles two rows and each element makes its own call for the same word). Another
      mask than v3's: its reference is :func:`bias_gelu_dropout_residual4x_ref`.

Versions of ``fusion_counterexample`` (row standardization ``y = (x - mean) / sqrt(var + eps)`` of
an (M, N) tensor, LayerNorm without weights: a row reduction whose result every element of the
row needs):

- v0  ``F.layer_norm(x, (N,))``: torch's kernel, the baseline.
- v1  Triton, two kernels: one program per row loops over the row in chunks and writes its mean and
      1/std (8 bytes per row); a 2-D element-wise kernel reads x again and writes y. x is
      read twice.
- v2  Triton, fused to the hilt: one program per row loads the whole row into registers (BLOCK_N is
      the next power of two >= N), reduces it and writes y. x is read once: by the bytes model the
      best. Past about 32K fp32 values per row the row no longer fits in the registers of one
      program and spills to local memory (see :func:`spill_report`).
- v3  Triton, one kernel, two loops: one program per row computes the statistics chunk by chunk,
      then reads the row again (from L2, where its first read left it) to write y. Fused in
      launches, not in bytes.

Cost models: ``bias_gelu_dropout_residual`` must read x, residual and the bias and write y,
``(3 M N + N) * itemsize`` bytes; ``fusion_counterexample`` must read x and write y,
``2 M N * itemsize``. Both are measured against the copy ceiling.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.common.baselines import compiled, needs_gpu
from snippets.common.dropout import check_p_seed, keep_ref, seeded_dropout
from snippets.registry import Impl, Op, device_generator, register

FLOAT_TYPES = (torch.float32, torch.bfloat16, torch.float16)
GRID_Y_MAX = 65535  # CUDA's limit on the second grid dimension


# --8<-- [start:reference]
def bias_gelu_dropout_residual_ref(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                   p: float, seed: int) -> torch.Tensor:
    """y = residual + dropout(gelu(x + bias)), dropout with the keep bits of the Triton versions:
    element i = row * N + col is kept when Philox's uniform number rand(seed, i) >= p (Part 4's
    keep_ref), and scaled by 1 / (1 - p). Fused, it reads x, residual (M * N each) and bias (N), and
    writes y (M * N)."""
    keep = torch.from_numpy(keep_ref(seed, p, x.numel())).to(x.device).view(x.shape)
    g = F.gelu(x + bias)                       # exact GELU: h * Phi(h)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return residual + torch.where(keep, g * scale, torch.zeros_like(g))
# --8<-- [end:reference]


# --8<-- [start:torch]
def bias_gelu_dropout_residual_torch(x, bias, residual, p, seed):
    """v0: the chain as a model writes it. Eagerly that is four kernels: x + bias, gelu, dropout
    (which also writes a bool mask for its backward), + residual; each reads its input from memory
    and writes its output. ``seed`` is not used: F.dropout draws from torch's generator."""
    _check_args(x, bias, residual, p, seed, _device_of(x))
    return residual + F.dropout(F.gelu(x + bias), p, training=True)
# --8<-- [end:torch]


# --8<-- [start:compiled]
def _chain(x, bias, residual, p: float):
    return residual + F.dropout(F.gelu(x + bias), p, training=True)


_chain_compiled = compiled(_chain)  # compiles on the first call for each shape and dtype


def bias_gelu_dropout_residual_compiled(x, bias, residual, p, seed):
    """v1: v0's chain through torch.compile: Inductor generates one kernel (with its own
    random stream)."""
    _check_args(x, bias, residual, p, seed, "cuda")
    return _chain_compiled(x, bias, residual, p)
# --8<-- [end:compiled]


# --------------------------------------------------------------------------------------------------
# The bytes model
# --------------------------------------------------------------------------------------------------

# --8<-- [start:chain_bytes]
@dataclass(frozen=True)
class ChainCost:
    """Predicted traffic of the unfused chain (one kernel per step) and of the fused kernel."""

    steps: tuple[tuple[str, int], ...]   # (kernel, bytes it reads + writes), in order
    unfused_bytes: int
    fused_bytes: int
    # bytes / bandwidth: the time if every kernel ran at that bandwidth
    unfused_s: float
    fused_s: float

    @property
    def ratio(self) -> float:
        """How many times the fused kernel should beat the chain, if both run at the
        same bandwidth."""
        return self.unfused_bytes / self.fused_bytes

    @property
    def launches(self) -> int:
        return len(self.steps)


def chain_bytes(m: int, n: int, itemsize: int, bandwidth_gbs: float,
                mask_bytes: int = 0) -> ChainCost:
    """Bytes and time of y = residual + dropout(gelu(x + bias)) on an (m, n) tensor of
    ``itemsize``-byte elements at ``bandwidth_gbs`` GB/s. ``mask_bytes``: bytes per element a
    dropout kernel writes for its backward (1 for PyTorch eager's bool mask, 0 for the seeded
    dropout of Part 4)."""
    e, s = m * n, itemsize
    steps = (
        ("h = x + bias", (2 * e + n) * s),          # read x and the bias, write h
        ("g = gelu(h)", 2 * e * s),                  # read h, write g
        ("d = dropout(g)", 2 * e * s + e * mask_bytes),  # read g, write d (and the mask)
        ("y = residual + d", 3 * e * s),             # read d and residual, write y
    )
    unfused = sum(b for _, b in steps)
    fused = (3 * e + n) * s                          # read x, residual, bias; write y
    bw = bandwidth_gbs * 1e9
    return ChainCost(steps, unfused, fused, unfused / bw, fused / bw)
# --8<-- [end:chain_bytes]


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

def _device_of(t) -> str:
    """Where a torch version runs: wherever its first tensor is (a non-tensor is refused by
    the checks)."""
    return t.device.type if isinstance(t, torch.Tensor) else "cuda"


# --8<-- [start:check_args]
def _check_args(x, bias, residual, p, seed, device: str) -> tuple[float, float, int]:
    """x and residual (M, N), bias (N,), one float dtype, contiguous, on ``device``; p in [0, 1];
    seed an int in [0, 2^63). Returns (p, scale, seed)."""
    check_tensors(("x", "residual"), (x, residual), dtypes=FLOAT_TYPES, device=device)
    check_tensors(("x", "bias"), (x, bias), dtypes=FLOAT_TYPES, device=device, same_shape=False)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}")
    if bias.shape != (x.shape[1],):
        raise ValueError(f"bias must have shape ({x.shape[1]},) to match x's {x.shape[1]} columns, "
                         f"got {tuple(bias.shape)}")
    return check_p_seed(p, seed)  # Part 4's dropout rules for p and the Philox seed
# --8<-- [end:check_args]


# --------------------------------------------------------------------------------------------------
# v2: one Triton kernel per step
# --------------------------------------------------------------------------------------------------

# 2-D tiles of 2 rows x 1024 columns for the kernels that need the column (bias), 1-D blocks of 2048
# for the others: 8 warps, 8 elements per thread, as Part 4's dropout. Compiled for sm_90
# (spill_report's way), the fused kernel needs about 70 registers a thread with 8 elements and about
# 140 with 16 (4 x 1024 tiles), which would leave room for only one 256-thread program per SM.
BLOCK_M, BLOCK_N, BLOCK = 2, 1024, 2048
NUM_WARPS = 8


# --8<-- [start:unfused]
@triton.jit
def _bias_add_kernel(x_ptr, bias_ptr, h_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)
    tl.store(h_ptr + offs, (x + b[None, :]).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_kernel(h_ptr, g_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    h = tl.load(h_ptr + offs, mask=offs < n).to(tl.float32)
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _add_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs, mask=offs < n).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=offs < n).to(tl.float32)
    tl.store(y_ptr + offs, (a + b).to(y_ptr.dtype.element_ty), mask=offs < n)


def bias_gelu_dropout_residual_unfused(x, bias, residual, p, seed):
    """v2: four launches, each a round trip through memory; intermediates in x's dtype, as eager
    PyTorch keeps them. The dropout step is Part 4's seeded_dropout (the element index is the
    Philox counter)."""
    refuse_grad("bias_gelu_dropout_residual_unfused", x, bias, residual,
                instead="bias_gelu_dropout_residual_torch")
    p, _, seed = _check_args(x, bias, residual, p, seed, triton_device())
    _check_grid(x)
    m, n = x.shape
    if x.numel() == 0:
        return torch.empty_like(x)
    h = torch.empty_like(x)
    _bias_add_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        x, bias, h, m, n, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    g = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), BLOCK),)
    _gelu_kernel[grid](h, g, x.numel(), BLOCK=BLOCK, num_warps=NUM_WARPS)
    d = seeded_dropout(g, p, seed)
    y = torch.empty_like(x)
    _add_kernel[grid](residual, d, y, x.numel(), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y
# --8<-- [end:unfused]


def _check_grid(x: torch.Tensor) -> None:
    if triton.cdiv(x.shape[1], BLOCK_N) > GRID_Y_MAX:
        raise ValueError(f"x has {x.shape[1]} columns; the column blocks of {BLOCK_N} must fit "
                         f"CUDA's grid limit of {GRID_Y_MAX} (at most {GRID_Y_MAX * BLOCK_N} "
                         "columns)")


# --------------------------------------------------------------------------------------------------
# v3: one fused kernel
# --------------------------------------------------------------------------------------------------

# --8<-- [start:fused]
@triton.jit
def _bias_gelu_dropout_residual_kernel(x_ptr, bias_ptr, res_ptr, y_ptr, M, N, p, scale, seed,
                                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]  # (BLOCK_M, BLOCK_N), also the Philox counter
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)
    r = tl.load(res_ptr + offs, mask=mask).to(tl.float32)
    h = x + b[None, :]                        # every intermediate stays in fp32 registers
    # exact GELU: h Phi(h), 0.707... = 1/sqrt(2)
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    keep = tl.rand(seed, offs) >= p                       # the same bits as Part 4's seeded dropout
    y = r + tl.where(keep, g * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_dropout_residual(x, bias, residual, p, seed):
    """v3: one launch; reads x, residual and bias once and writes y once."""
    refuse_grad("bias_gelu_dropout_residual", x, bias, residual,
                instead="bias_gelu_dropout_residual_torch")
    p, scale, seed = _check_args(x, bias, residual, p, seed, triton_device())
    _check_grid(x)
    m, n = x.shape
    y = torch.empty_like(x)
    if x.numel():
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        _bias_gelu_dropout_residual_kernel[grid](x, bias, residual, y, m, n, p, scale, seed,
                                                 BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                                 num_warps=NUM_WARPS)
    return y
# --8<-- [end:fused]


# --------------------------------------------------------------------------------------------------
# v4: one fused kernel, one Philox evaluation per four elements
# --------------------------------------------------------------------------------------------------

# --8<-- [start:reference4x]
def keep4x_ref(seed: int, p: float, shape: tuple[int, int]) -> torch.Tensor:
    """v4's keep bits, Part 4's dropout v3 stream on the flattened tensor: element
    i = row * N + col takes word i % 4 of Philox at counter i // 4 and is kept when that uniform
    number is >= p. A bool tensor of ``shape`` on the CPU."""
    return torch.from_numpy(keep_ref(seed, p, math.prod(shape), per_call=4)).view(shape)


def bias_gelu_dropout_residual4x_ref(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                     p: float, seed: int) -> torch.Tensor:
    """The reference of v4: the same chain as bias_gelu_dropout_residual_ref (exact GELU), with v4's
    keep bits (keep4x_ref) instead of v3's."""
    keep = keep4x_ref(seed, p, tuple(x.shape)).to(x.device)
    g = F.gelu(x + bias)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return residual + torch.where(keep, g * scale, torch.zeros_like(g))
# --8<-- [end:reference4x]


# --8<-- [start:fused4x]
@triton.jit
def _bias_gelu_dropout_residual4x_kernel(x_ptr, bias_ptr, res_ptr, y_ptr, M, N, p, scale, seed,
                                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                         ROWS_OF_FOURS: tl.constexpr):
    tl.static_assert(BLOCK_N % 4 == 0, "a tile's row is whole groups of four columns")
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]  # (BLOCK_M, BLOCK_N): element i of the flat tensor
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)
    r = tl.load(res_ptr + offs, mask=mask).to(tl.float32)
    h = x + b[None, :]
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))   # exact GELU, as v3
    # element i takes word i % 4 of Philox at counter i // 4 (Part 4's dropout v3)
    if ROWS_OF_FOURS:  # N % 4 == 0: every group of four lies in one row of the tile
        groups = tl.program_id(1) * (BLOCK_N // 4) + tl.arange(0, BLOCK_N // 4)
        counters = rows[:, None] * (N // 4) + groups[None, :]   # (BLOCK_M, BLOCK_N // 4)
        u0, u1, u2, u3 = tl.rand4x(seed, counters)
        # join puts (u0, u2) at [.., 0, :] and (u1, u3) at [.., 1, :] of a last axis of 2; read
        # row-major, [m, j, :, :] is u0, u1, u2, u3 of counter j, the columns 4j .. 4j + 3
        u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BLOCK_M, BLOCK_N))
    else:  # a group straddles two rows: one Philox per element, the same words
        u0, u1, u2, u3 = tl.rand4x(seed, offs // 4)
        word = offs % 4
        u = tl.where(word == 0, u0, tl.where(word == 1, u1, tl.where(word == 2, u2, u3)))
    y = r + tl.where(u >= p, g * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_dropout_residual4x(x, bias, residual, p, seed):
    """v4: like v3, but one tl.rand4x call gives the random numbers of four neighbouring elements
    (when N % 4 == 0; otherwise one call per element picks the same word): a quarter of v3's Philox
    evaluations, and a different mask (keep4x_ref)."""
    refuse_grad("bias_gelu_dropout_residual4x", x, bias, residual,
                instead="bias_gelu_dropout_residual_torch")
    p, scale, seed = _check_args(x, bias, residual, p, seed, triton_device())
    _check_grid(x)
    m, n = x.shape
    y = torch.empty_like(x)
    if x.numel():
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        _bias_gelu_dropout_residual4x_kernel[grid](x, bias, residual, y, m, n, p, scale, seed,
                                                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                                   ROWS_OF_FOURS=n % 4 == 0,
                                                   num_warps=NUM_WARPS)
    return y
# --8<-- [end:fused4x]


# --8<-- [start:philox_count]
# Philox-4x32's two round multipliers (snippets.common.dropout), as PTX prints an immediate: signed
# 32-bit in a 32-bit multiply, unsigned in a 64-bit one, or hex
PHILOX_MULTIPLIERS = tuple(str(c) for k in (0xD2511F53, 0xCD9E8D57)
                           for c in (k, k - 2**32, hex(k), f"0x{k:08X}"))


def philox_high_products(ptx: str) -> int:
    """The multiplies in ``ptx`` that form the high half of a 32 x 32-bit product: every
    ``mul.hi.u32`` (only Philox needs one in these kernels; Triton 3.6 keeps the multiplier in a
    register, 3.9 writes it as an immediate), and the 64-bit products by a round multiplier
    (``mul.wide.u32``, or ``mul.lo.s64`` of a zero-extended word), which give both halves at once.
    Two per round and Philox evaluation, fewer where the compiler dropped a product whose word is
    never used."""
    count = 0
    for line in ptx.splitlines():
        op = line.split(None, 1)
        if not op:
            continue
        if op[0] == "mul.hi.u32":
            count += 1
        elif op[0] in ("mul.wide.u32", "mul.lo.s64"):
            if any(re.search(rf"(?<![\w-]){re.escape(c)}\b", line) for c in PHILOX_MULTIPLIERS):
                count += 1
    return count


def philox_report(dtype: torch.dtype = torch.float32) -> dict[str, dict]:
    """Compile v3's and v4's fused kernels for sm_90 (no GPU needed) as the headline launches them
    (N a multiple of 16; v4 also for a ragged N, its one-call-per-element path) and return, per
    kernel, the Philox high products per element, the registers and spills per thread, and the
    widths of the global loads and stores."""
    from snippets.common.introspect import TRITON_TYPES, compile_many, load_store_widths

    t = TRITON_TYPES[dtype]
    sig = {"x_ptr": f"*{t}", "bias_ptr": f"*{t}", "res_ptr": f"*{t}", "y_ptr": f"*{t}",
           "M": "i32", "N": "i32", "p": "fp32", "scale": "fp32", "seed": "i32"}
    tile = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}
    pointers = ["x_ptr", "bias_ptr", "res_ptr", "y_ptr"]
    headline = {"num_warps": NUM_WARPS, "divisible": pointers + ["N"]}  # N = 8192
    jobs = {
        "v3": (_bias_gelu_dropout_residual_kernel, sig, tile, headline),
        "v4": (_bias_gelu_dropout_residual4x_kernel, sig, {**tile, "ROWS_OF_FOURS": True},
               headline),
        "v4 ragged N": (_bias_gelu_dropout_residual4x_kernel, sig,
                        {**tile, "ROWS_OF_FOURS": False},
                        {"num_warps": NUM_WARPS, "divisible": pointers}),
    }
    per_thread = BLOCK_M * BLOCK_N // (32 * NUM_WARPS)   # elements each thread computes
    out = {}
    for name, c in zip(jobs, compile_many(jobs.values())):
        out[name] = dict(philox_per_element=philox_high_products(c.ptx) / per_thread,
                         registers=c.registers, spill_stores=c.spill_stores,
                         widths=load_store_widths(c.ptx))
    return out
# --8<-- [end:philox_count]


# --------------------------------------------------------------------------------------------------
# The check of a random output
# --------------------------------------------------------------------------------------------------

# --8<-- [start:check]
def tolerance(x, bias, residual, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Per-element tolerance against float64 for a version that rounds up to four times in ``dtype``
    (v0 and v2 round h, g, the dropout output and y): each rounding is off by at most eps/2 of a
    value no larger than |residual| + |h| / (1 - p) (|gelu(h)| <= |h|, and its slope is below 1.13),
    so 2 eps of that sum covers the four with room for erf's own error."""
    eps = torch.finfo(dtype).eps
    h = (x.double() + bias.double()).abs()
    scale = 1.0 if p == 1 else 1.0 / (1.0 - p)
    return 2 * eps * (residual.double().abs() + 2 * h * scale) + torch.finfo(dtype).tiny


def check_bias_gelu_dropout_residual(out, args: tuple, dtype: torch.dtype,
                                     sigmas: float = 6.0) -> None:
    """Raise AssertionError unless ``out`` is a possible output for
    ``args = (x, bias, residual, p, seed)`` whatever generator drew the mask: every element is
    residual (dropped) or residual + gelu(x + bias) / (1 - p) (kept), within :func:`tolerance`, and
    among the elements where the two differ by more than twice the tolerance the number kept is
    within ``sigmas`` standard deviations of the binomial mean."""
    x, bias, residual, p, _ = args
    assert isinstance(out, torch.Tensor), f"returned {type(out).__name__}, not a tensor"
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device, (
        f"output {tuple(out.shape)} {out.dtype} {out.device}, input {tuple(x.shape)} {x.dtype} "
        f"{x.device}")
    o = out.double().cpu()
    assert not o.isnan().any(), "output has NaN (unwritten) elements"
    r = residual.double().cpu()
    add = F.gelu(x.double().cpu() + bias.double().cpu()) * (0.0 if p == 1 else 1.0 / (1.0 - p))
    tol = tolerance(x.cpu(), bias.cpu(), residual.cpu(), p, dtype)
    near_drop, near_keep = (o - r).abs() <= tol, (o - r - add).abs() <= tol
    bad = ~(near_drop | near_keep)
    assert not bad.any(), (f"{int(bad.sum())} elements are neither residual nor residual + "
                           f"gelu(x+b)/(1-p), e.g. {o[bad][:3].tolist()} for residual "
                           f"{r[bad][:3].tolist()}")
    informative = add.abs() > 2 * tol
    n, k = int(informative.sum()), int((near_keep & informative).sum())
    mean, sd = n * (1 - p), math.sqrt(n * p * (1 - p))
    assert abs(k - mean) <= sigmas * sd + 1e-9, (
        f"kept {k} of {n} with p={p}: expected {mean:.1f} +- {sd:.1f} (binomial)")
# --8<-- [end:check]


# --------------------------------------------------------------------------------------------------
# Horizontal fusion: two matrix-vector products that share the read of A
# --------------------------------------------------------------------------------------------------

# --8<-- [start:horizontal]
@triton.jit
def _gemv_kernel(a_ptr, u_ptr, v_ptr, yu_ptr, yv_ptr, M, N, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, TWO: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc_u = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        a = tl.load(a_ptr + rows[:, None] * N + cols[None, :],
                    mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0).to(tl.float32)
        u = tl.load(u_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc_u += tl.sum(a * u[None, :], axis=1)
        if TWO:  # the tile of A is already in registers: the second product costs no memory traffic
            v = tl.load(v_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            acc_v += tl.sum(a * v[None, :], axis=1)
    tl.store(yu_ptr + rows, acc_u.to(yu_ptr.dtype.element_ty), mask=rows < M)
    if TWO:
        tl.store(yv_ptr + rows, acc_v.to(yv_ptr.dtype.element_ty), mask=rows < M)


GEMV_BLOCK_M, GEMV_BLOCK_N = 16, 256


def _gemv(a, u, v):
    check_tensors(("a",), (a,), dtypes=FLOAT_TYPES, device=triton_device())
    vecs = (u,) if v is None else (u, v)
    check_tensors(("a", "u", "v")[:1 + len(vecs)], (a, *vecs), dtypes=FLOAT_TYPES,
                  device=triton_device(), same_shape=False)
    if a.dim() != 2 or any(t.shape != (a.shape[1],) for t in vecs):
        raise ValueError(f"a must be (M, N) and each vector (N,), got {tuple(a.shape)} and "
                         f"{[tuple(t.shape) for t in vecs]}")
    m, n = a.shape
    outs = [torch.empty(m, dtype=a.dtype, device=a.device) for _ in vecs]
    if m:
        _gemv_kernel[(triton.cdiv(m, GEMV_BLOCK_M),)](a, u, vecs[-1], outs[0], outs[-1], m, n,
                                                      BLOCK_M=GEMV_BLOCK_M, BLOCK_N=GEMV_BLOCK_N,
                                                      TWO=v is not None)
    return outs


def gemv(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A @ u: reads A (M x N) once."""
    refuse_grad("gemv", a, u, instead="a @ u")
    return _gemv(a, u, None)[0]


def gemv_pair(a: torch.Tensor, u: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A @ u, A @ v) in one kernel: A is read once for both, where gemv(a, u), gemv(a, v) read
    it twice."""
    refuse_grad("gemv_pair", a, u, v, instead="a @ u and a @ v")
    yu, yv = _gemv(a, u, v)
    return yu, yv


def horizontal_bytes(m: int, n: int, itemsize: int) -> tuple[int, int]:
    """(two separate GEMVs, one fused) bytes: A (m n), the vectors (n each) read, the results (m
    each) written. Fusing saves one read of A: nearly half the traffic when m and n are large."""
    one = (m * n + n + m) * itemsize
    return 2 * one, (m * n + 2 * n + 2 * m) * itemsize
# --8<-- [end:horizontal]


# --------------------------------------------------------------------------------------------------
# When not to fuse: row standardization over very wide rows
# --------------------------------------------------------------------------------------------------

EPS = 1e-5  # F.layer_norm's default


# --8<-- [start:counter_reference]
def standardize_ref(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) per row (biased variance and eps = 1e-5, as F.layer_norm's
    defaults): a reduction over the row whose two results every element of the row needs. Must
    read x (M N) and write y (M N)."""
    xf = x.double() if x.dtype == torch.float64 else x.float()
    mean = xf.mean(dim=1, keepdim=True)
    var = ((xf - mean) ** 2).mean(dim=1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + eps)).to(x.dtype)
# --8<-- [end:counter_reference]


def _check_rows(x: torch.Tensor, device: str) -> tuple[int, int]:
    check_tensors(("x",), (x,), dtypes=FLOAT_TYPES, device=device, allow_empty=False)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}")
    if x.shape[1] > 2**30:
        raise ValueError(f"x has {x.shape[1]} columns; the kernels index a row with int32 offsets "
                         "(at most 2**30)")
    return x.shape


def standardize_torch(x: torch.Tensor) -> torch.Tensor:
    """v0: torch's LayerNorm kernel without weight and bias."""
    _check_rows(x, _device_of(x))
    return F.layer_norm(x, (x.shape[1],), eps=EPS)


# --8<-- [start:two_kernels]
@triton.jit
def _chunked_mean_m2(x_ptr, row, N, CHUNK: tl.constexpr):
    """The mean and the sum of squared deviations (M2) of row ``row``, chunk by chunk. Each chunk's
    mean and M2 are exact in the chunk and merged into the running ones (Chan et al., 1979), which
    avoids the cancellation of sum(x^2) - N mean^2."""
    mean = 0.0
    m2 = 0.0
    count = 0.0
    for n0 in range(0, N, CHUNK):
        cols = n0 + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        c = tl.minimum(N - n0, CHUNK).to(tl.float32)
        c_mean = tl.sum(x, axis=0) / c
        c_m2 = tl.sum(tl.where(cols < N, (x - c_mean) * (x - c_mean), 0.0), axis=0)
        total = count + c
        delta = c_mean - mean
        mean += delta * c / total
        m2 += c_m2 + delta * delta * count * c / total
        count = total
    return mean, m2


@triton.jit
def _row_stats_kernel(x_ptr, mean_ptr, rstd_ptr, N, eps, CHUNK: tl.constexpr):
    """One program per row: the mean and 1/std of the row, chunk by chunk (_chunked_mean_m2)."""
    row = tl.program_id(0).to(tl.int64)
    mean, m2 = _chunked_mean_m2(x_ptr, row, N, CHUNK)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(m2 / N + eps))


@triton.jit
def _apply_stats_kernel(x_ptr, mean_ptr, rstd_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    mean = tl.load(mean_ptr + rows, mask=rows < M)
    rstd = tl.load(rstd_ptr + rows, mask=rows < M)
    tl.store(y_ptr + offs, ((x - mean[:, None]) * rstd[:, None]).to(y_ptr.dtype.element_ty),
             mask=mask)


STATS_CHUNK = 4096  # 8 warps: 16 fp32 values per thread and chunk


def standardize_two_kernels(x: torch.Tensor) -> torch.Tensor:
    """v1: statistics kernel (reads x, writes 8 bytes per row), then an element-wise kernel (reads x
    again, writes y): 3 M N element transfers instead of 2, neither kernel holding more than
    a chunk."""
    refuse_grad("standardize_two_kernels", x, instead="standardize_torch")
    m, n = _check_rows(x, triton_device())
    _check_grid(x)
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    y = torch.empty_like(x)
    _row_stats_kernel[(m,)](x, mean, rstd, n, EPS, CHUNK=STATS_CHUNK, num_warps=8)
    _apply_stats_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        x, mean, rstd, y, m, n, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    return y
# --8<-- [end:two_kernels]


# --8<-- [start:whole_row]
@triton.jit
def _standardize_row_kernel(x_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    # the whole row, once
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(cols < N, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    tl.store(y_ptr + row * N + cols, (xc * rstd).to(y_ptr.dtype.element_ty), mask=cols < N)


def whole_row_warps(block_n: int) -> int:
    """One warp per 1024 columns (32 values per thread), at least 4, at most 32 (1024 threads, a
    block's limit): past 32 * 1024 columns each thread must hold more than 32 values of the row."""
    return min(32, max(4, block_n // 1024))


def standardize_whole_row(x: torch.Tensor) -> torch.Tensor:
    """v2: one program per row holds the whole row in registers: x read once, y written once."""
    refuse_grad("standardize_whole_row", x, instead="standardize_torch")
    m, n = _check_rows(x, triton_device())
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(n)
    _standardize_row_kernel[(m,)](x, y, n, EPS, BLOCK_N=block_n, num_warps=whole_row_warps(block_n))
    return y
# --8<-- [end:whole_row]


# --8<-- [start:two_loops]
@triton.jit
def _standardize_looped_kernel(x_ptr, y_ptr, N, eps, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    mean, m2 = _chunked_mean_m2(x_ptr, row, N, CHUNK)   # loop 1: statistics, as _row_stats_kernel
    rstd = 1.0 / tl.sqrt(m2 / N + eps)
    for n0 in range(0, N, CHUNK):  # loop 2: read the row again (L2 holds it), write y
        cols = n0 + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * N + cols, ((x - mean) * rstd).to(y_ptr.dtype.element_ty),
                 mask=cols < N)


def standardize_two_loops(x: torch.Tensor) -> torch.Tensor:
    """v3: one kernel; each program reads its row twice, a chunk at a time, and never holds more
    than a chunk."""
    refuse_grad("standardize_two_loops", x, instead="standardize_torch")
    m, n = _check_rows(x, triton_device())
    y = torch.empty_like(x)
    _standardize_looped_kernel[(m,)](x, y, n, EPS, CHUNK=STATS_CHUNK, num_warps=8)
    return y
# --8<-- [end:two_loops]


# --8<-- [start:spills]
def spill_report(n: int, dtype: torch.dtype = torch.float32) -> dict[str, dict]:
    """Compile the counter-example's kernels for sm_90 (no GPU needed) as they would be launched on
    rows of ``n`` columns and return, per kernel, the registers per thread, the spill bytes ptxas
    reports and the threads per program. The whole-row kernel's needs grow with n; the chunked
    kernels' do not."""
    from snippets.common.introspect import TRITON_TYPES, compile_many

    t = TRITON_TYPES[dtype]
    block_n = triton.next_power_of_2(n)
    jobs = {
        "v2 whole row": (_standardize_row_kernel,
                         {"x_ptr": f"*{t}", "y_ptr": f"*{t}", "N": "i32", "eps": "fp32"},
                         {"BLOCK_N": block_n}, {"num_warps": whole_row_warps(block_n)}),
        "v1 statistics": (_row_stats_kernel,
                          {"x_ptr": f"*{t}", "mean_ptr": "*fp32", "rstd_ptr": "*fp32",
                           "N": "i32", "eps": "fp32"}, {"CHUNK": STATS_CHUNK},
                          {"num_warps": 8}),
        "v1 apply": (_apply_stats_kernel,
                     {"x_ptr": f"*{t}", "mean_ptr": "*fp32", "rstd_ptr": "*fp32",
                      "y_ptr": f"*{t}", "M": "i32", "N": "i32"},
                     {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}, {"num_warps": NUM_WARPS}),
        "v3 two loops": (_standardize_looped_kernel,
                         {"x_ptr": f"*{t}", "y_ptr": f"*{t}", "N": "i32", "eps": "fp32"},
                         {"CHUNK": STATS_CHUNK}, {"num_warps": 8}),
    }
    out = {}
    for name, c in zip(jobs, compile_many(jobs.values())):
        out[name] = dict(registers=c.registers, spill_stores=c.spill_stores,
                         spill_loads=c.spill_loads, threads=c.threads)
    return out
# --8<-- [end:spills]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

P = 0.1  # the dropout rate of GPT-2 and BERT


def _make_inputs(size, dtype, device, gen):
    """x and residual standard normal (M, N), a bias of N drawn from N(0, 0.5^2), p = 0.1 and
    a seed."""
    g = device_generator(gen, device)
    m, n = size["m"], size["n"]
    x = torch.randn(m, n, generator=g, device=device)
    bias = 0.5 * torch.randn(n, generator=g, device=device)
    residual = torch.randn(m, n, generator=g, device=device)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    return x.to(dtype), bias.to(dtype), residual.to(dtype), P, seed


def _bytes(size, dtype) -> int:
    # x, residual, bias read; y written
    return (3 * size["m"] * size["n"] + size["n"]) * dtype.itemsize


def _flops(size, dtype) -> int:
    # add, erf (~15 FLOPs as a polynomial), scale, compare, select, add
    return 25 * size["m"] * size["n"]


# 16384 x 8192: x, residual and y are 512 MiB each in fp32, 256 MiB in bf16: 5 to 10 times the
# H200's L2 each.
HEADLINE = {"m": 16384, "n": 8192}
# 2^27 elements: 512 MiB of fp32
SWEEP = [{"m": 2**27 // 2**k, "n": 2**k} for k in (10, 11, 12, 13, 14, 15)]
TEST_SIZES = [{"m": 1, "n": 1}, {"m": 3, "n": 17}, {"m": 7, "n": 123}, {"m": 5, "n": 1100},
              {"m": 37, "n": 781}]
SOURCES = (_check_args, _check_grid)

fused_op = register(Op(
    name="bias_gelu_dropout_residual", part=5, chapter="part5/why-fusion.md",
    title="Bias + GELU + dropout + residual (fused vs unfused)",
    reference=bias_gelu_dropout_residual_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=_flops, metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.bfloat16, torch.float32), test_sizes=TEST_SIZES, sweep_axis="n",
    check=check_bias_gelu_dropout_residual, measure_memory=True))
fused_op.add(Impl("v0", bias_gelu_dropout_residual_torch, "PyTorch",
                  "eager: x+b, gelu, dropout, +residual", SOURCES))
fused_op.add(Impl("v1", bias_gelu_dropout_residual_compiled, "PyTorch",
                  "torch.compile of v0's chain", (_chain, *SOURCES), device="cuda",
                  requires=needs_gpu, origin="library"))
fused_op.add(Impl("v2", bias_gelu_dropout_residual_unfused, "Triton", "four kernels, one per step",
                  (_bias_add_kernel, _gelu_kernel, seeded_dropout, _add_kernel, *SOURCES),
                  device="any"))
fused_op.add(Impl("v3", bias_gelu_dropout_residual, "Triton", "one fused kernel, fp32 in registers",
                  (_bias_gelu_dropout_residual_kernel, *SOURCES), device="any"))
fused_op.add(Impl("v4", bias_gelu_dropout_residual4x, "Triton",
                  "like v3, tl.rand4x: one Philox per 4 elements",
                  (_bias_gelu_dropout_residual4x_kernel, *SOURCES), device="any"))


def _counter_inputs(size, dtype, device, gen):
    """x drawn from N(3, 2^2): a mean far from 0, so a version that forgets to subtract it fails."""
    g = device_generator(gen, device)
    return ((3.0 + 2.0 * torch.randn(size["m"], size["n"], generator=g, device=device)).to(dtype),)


def _counter_bytes(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * dtype.itemsize  # read x, write y


# N from 2^12 to 2^17 at 2^27 elements (512 MiB of fp32 each way). The headline is the widest row:
# 128K fp32 values, 128 per thread of the widest block (32 warps), where v2 spills (spill_report).
COUNTER_HEADLINE = {"m": 1024, "n": 131072}
COUNTER_SWEEP = [{"m": 2**27 // 2**k, "n": 2**k} for k in range(12, 18)]
COUNTER_TEST_SIZES = [{"m": 1, "n": 1}, {"m": 3, "n": 17}, {"m": 7, "n": 123}, {"m": 4, "n": 4097},
                      {"m": 9, "n": 1823}]
ROW_SOURCES = (_check_rows,)

counter_op = register(Op(
    name="fusion_counterexample", part=5, chapter="part5/why-fusion.md",
    title="Row standardization over wide rows: whole row fused vs two kernels",
    reference=standardize_ref, make_inputs=_counter_inputs, bytes_moved=_counter_bytes,
    flops=lambda s, d: 6 * s["m"] * s["n"], metric="GB/s", ceiling="copy",
    headline=COUNTER_HEADLINE, sweep=COUNTER_SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.float32,), test_sizes=COUNTER_TEST_SIZES, sweep_axis="n",
    # Outputs are about 1 in size. fp32: the mean and variance carry ~1e-7 N^0.5 relative error;
    # 1e-5 covers the widest test row. fp16/bf16: one rounding of the output.
    tolerances={torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
                torch.bfloat16: (1.6e-2, 1.6e-2)}))
counter_op.add(Impl("v0", standardize_torch, "PyTorch", "F.layer_norm without weights",
                    ROW_SOURCES))
counter_op.add(Impl("v1", standardize_two_kernels, "Triton",
                    "two kernels: chunked statistics, then apply",
                    (_chunked_mean_m2, _row_stats_kernel, _apply_stats_kernel, *ROW_SOURCES),
                    device="any"))
counter_op.add(Impl("v2", standardize_whole_row, "Triton",
                    "fused: whole row in registers, one read",
                    (_standardize_row_kernel, whole_row_warps, *ROW_SOURCES), device="any"))
counter_op.add(Impl("v3", standardize_two_loops, "Triton",
                    "fused launch: one kernel, two chunked loops",
                    (_chunked_mean_m2, _standardize_looped_kernel, *ROW_SOURCES), device="any"))

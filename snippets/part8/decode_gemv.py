"""A decode step's projections at batch 1: y = x @ W^T with one row of x, a GEMV.

At batch 1 every projection of a decode step reads its whole weight to produce one row: two FLOPs
per weight, so the weight's bytes set the time, and the rate to compare is the copy bandwidth. The
capstone's timeline shows cuBLAS's GEMV kernels taking most of a graphed step; this op measures
them one matrix at a time, at the shapes of Llama 3.2 1B (hidden 2048): from the 2 MiB of a K or V
projection to the 501 MiB of the output head.

Versions (never renumbered):

- v0  cuBLAS through ``torch.nn.functional.linear`` (what the capstone's ``a @ w.T`` runs).
- v1  Triton: each program owns ``BLOCK_N`` rows of W and walks K in ``BLOCK_K`` chunks, 16-byte
      loads of W's rows, products summed in fp32 registers, one reduction at the end; autotuned
      among three tile shapes per (N, K).

Layout: x (1, K) and W (N, K), contiguous, one dtype (fp16, bf16; fp32 for tests under the
interpreter); y (1, N) in that dtype. One row of x only: a batch of M > 1 rows is a GEMM
(``F.linear``, or the tensor-core kernels of Parts 4 and 6).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import INT32_MAX, UNIT_ROUNDOFF
from snippets.registry import Impl, Op, device_generator, register

HALF = (torch.float16, torch.bfloat16)


# --8<-- [start:reference]
def gemv_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What every version computes: y = x W^T, the K products of each output summed in fp32, then
    rounded to x's dtype once. 2 N K FLOPs against N K weights read: one FLOP per byte in bf16."""
    return (x.float() @ w.float().T).to(x.dtype)
# --8<-- [end:reference]


# --8<-- [start:check]
def check_gemv(x: torch.Tensor, w: torch.Tensor, dtypes: tuple[torch.dtype, ...],
               device: str) -> tuple[int, int]:
    """x (1, K) and W (N, K): contiguous, one dtype and device, K equal. Returns (N, K)."""
    check_tensors(("x", "w"), (x, w), dtypes=dtypes, device=device, same_shape=False,
                  allow_empty=False)
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x must be (1, K) and w (N, K), got shapes {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"a GEMV takes one row of x (batch 1), got {x.shape[0]} rows: for a "
                         "batch use F.linear(x, w), a GEMM")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has K = {x.shape[1]} columns but w has {w.shape[1]} (w is N x K, "
                         "as nn.Linear.weight)")
    n, k = w.shape
    if n * k > INT32_MAX:
        raise ValueError(f"w has {n} x {k} elements, past the kernel's 32-bit offsets")
    return n, k
# --8<-- [end:check]


def gemv_cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through F.linear (no bias), as the capstone's ``a @ w.T`` calls it."""
    check_gemv(x, w, HALF, "cuda")
    return F.linear(x, w)


# --8<-- [start:kernel]
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows[:, None] * K  # (BLOCK_N, 1): where each of this program's rows starts
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)  # from L2 after the first program
        w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & (cols[None, :] < K),
                    other=0.0)
        # elementwise products, summed per lane across the K loop: no reduction inside it
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)  # one reduction per row, at the end
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)
# --8<-- [end:kernel]


# --8<-- [start:configs]
# Tile shapes: few rows and long K chunks (a row of W is K * 2 bytes: 4 KiB at K = 2048), so that
# each program streams long contiguous runs; 4 x 1024 and 8 x 512 hold 4096 products per step,
# 16 x 512 on 8 warps twice that. The autotuner keeps the fastest per (N, K).
GEMV_CONFIGS = [triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_warps=w)
                for bn, bk, w in ((4, 1024, 4), (8, 512, 4), (16, 512, 8))]
INTERPRET_CONFIG = dict(BLOCK_N=4, BLOCK_K=32)  # interpreter: several programs and K steps
# --8<-- [end:configs]


# --8<-- [start:gemv]
@functools.lru_cache(maxsize=None)
def gemv_autotuned():
    return triton.autotune(configs=GEMV_CONFIGS, key=["N", "K"])(_gemv_kernel)


def gemv_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v1: one program per BLOCK_N rows of W, products in fp32, the tile autotuned per (N, K)."""
    refuse_grad("gemv_triton", x, w, instead="F.linear(x, w)")
    dtypes = HALF + ((torch.float32,) if triton_interpreting() else ())
    n, k = check_gemv(x, w, dtypes, triton_device())
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if triton_interpreting():
        grid = (triton.cdiv(n, INTERPRET_CONFIG["BLOCK_N"]),)
        _gemv_kernel[grid](x, w, y, n, k, **INTERPRET_CONFIG)
    else:
        gemv_autotuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x, w, y, n, k)
    return y
# --8<-- [end:gemv]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def make_inputs(size, dtype, device, gen):
    """x (1, K) and W (N, K): standard normal values, W scaled by 1/sqrt(K) (so y is ~1)."""
    g = device_generator(gen, device)
    x = torch.randn((1, size["k"]), generator=g, device=device, dtype=torch.float32)
    w = torch.randn((size["n"], size["k"]), generator=g, device=device, dtype=torch.float32)
    w = w / size["k"] ** 0.5
    return x.to(dtype), w.to(dtype)


def bytes_moved(size, dtype) -> int:
    """W once, x once, y once."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (size["n"] * size["k"] + size["k"] + size["n"]) * itemsize


def flops(size, dtype) -> int:
    return 2 * size["n"] * size["k"]


def tolerance(k: int, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) against the fp32 sum: y is ~1, rounded to the dtype once (2u relative), and
    cuBLAS may sum in another order or split K (a few fp32 ulps times sqrt(K), far below u)."""
    u = {**UNIT_ROUNDOFF, torch.float32: 2.0**-24}[dtype]  # fp16/bf16: the GEMMs' unit roundoff
    return 2 * u, 2 * u + 1e-6 * k**0.5


def _reference(x, w):
    return x @ w.T


# Llama 3.2 1B's projections at batch 1 (hidden 2048): N rows of W, K = 2048. 512: K and V (2 MiB
# in bf16); 2048: Q and O; 3072: Q, K, V as one matrix; 8192: gate or up; 16384: both as one;
# 128256: the output head.
HEADLINE = {"n": 2048, "k": 2048}
SWEEP = [{"n": n, "k": 2048} for n in (512, 2048, 3072, 8192, 16384, 128256)]
TEST_SIZES = [{"n": n, "k": k} for n, k in ((1, 1), (5, 33), (64, 96), (67, 130))]
SOURCES = (_gemv_kernel, gemv_autotuned, check_gemv)  # the module (configs too) is in the hash


def _triton_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float16, torch.float32) if triton_interpreting() else HALF


gemv_op = register(Op(
    name="decode_gemv", part=8, chapter="part8/capstone.md", title="Decode GEMV (batch 1)",
    reference=_reference, make_inputs=make_inputs, bytes_moved=bytes_moved, flops=flops,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=HALF,
    bench_dtypes=(torch.bfloat16,),
    test_sizes=TEST_SIZES, sweep_axis="n",
    tolerances={d: tolerance(2048, d) for d in HALF},
    tolerance_at=lambda s, d: tolerance(s["k"], d)))
gemv_op.add(Impl("v0", gemv_cublas, "PyTorch", "cuBLAS via F.linear", (check_gemv,)))
gemv_op.add(Impl("v1", gemv_triton, "Triton",
                 "BLOCK_N rows a program, fp32 lanes, autotuned tile", SOURCES, device="any",
                 dtypes=_triton_dtypes()))

"""Warp divergence micro-benchmark: one kernel, five layouts of the same branch flags.

Each element takes path A or path B (``ITERS`` fused multiply-adds each). The flags' *layout* is
the variable:

- ``none``      every element takes A: no divergence, the reference time.
- ``warp``      flags alternate every 32 elements: each warp agrees with itself, so no warp runs
  both paths.
- ``half``      16 A then 16 B in every warp: every warp runs both paths.
- ``alternate`` A, B, A, B, ...: every warp runs both paths.
- ``random``    a fair coin per element: every warp runs both paths (with 32 threads, all agree with
  p = 2**-31).

Versions: v0 torch computes both paths everywhere and selects (``torch.where``), v1 the CUDA kernel
(``csrc/part1/divergence.cu``), v2 Triton, which also computes both paths and selects: a Triton
program works on whole blocks, so a data-dependent branch inside a block becomes a select.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part1/divergence.cu"
ITERS = 256  # long enough that arithmetic, not the 9 bytes per element of traffic, sets the time
PATTERNS = ("none", "warp", "half", "alternate", "random")


def make_flags(n: int, pattern: str, gen: torch.Generator | None = None) -> torch.Tensor:
    """uint8 flags (1 = path A) laid out by ``pattern``."""
    i = torch.arange(n)
    if pattern == "none":
        return torch.ones(n, dtype=torch.uint8)
    if pattern == "warp":
        return ((i // 32) % 2 == 0).to(torch.uint8)
    if pattern == "half":
        return ((i % 32) < 16).to(torch.uint8)
    if pattern == "alternate":
        return (i % 2 == 0).to(torch.uint8)
    if pattern == "random":
        return (torch.rand(n, generator=gen) < 0.5).to(torch.uint8)
    raise ValueError(f"unknown pattern {pattern!r}; choose one of {PATTERNS}")


# --8<-- [start:reference]
def two_paths_ref(x: torch.Tensor, take_a: torch.Tensor, iters: int = ITERS) -> torch.Tensor:
    """out = A^iters(x) where take_a else B^iters(x), with A(v) = v*v - 0.5 and B(v) = v/2 + 1/4."""
    a = x.clone()
    b = x.clone()
    for _ in range(iters):
        a = a * a - 0.5
        b = b * 0.5 + 0.25
    return torch.where(take_a.bool(), a, b)
# --8<-- [end:reference]


def _check(x: torch.Tensor, take_a: torch.Tensor, device: str) -> None:
    check_tensors(("x",), (x,), dtypes=(torch.float32,), device=device, allow_empty=False)
    check_tensors(("take_a",), (take_a,), dtypes=(torch.uint8, torch.bool), device=device,
                  allow_empty=False)
    if take_a.shape != x.shape or take_a.device != x.device:
        raise ValueError(f"take_a must match x: got shape {tuple(take_a.shape)} on "
                         f"{take_a.device}, x has shape {tuple(x.shape)} on {x.device}")


def two_paths_torch(x: torch.Tensor, take_a: torch.Tensor) -> torch.Tensor:
    """v0: both paths for every element in eager torch (2 * ITERS kernels), then a select."""
    return two_paths_ref(x, take_a)


def two_paths_cuda(x: torch.Tensor, take_a: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element, a real branch: divergence depends on the flags' layout."""
    refuse_grad("two_paths_cuda", x)
    cuda.require_gpu()
    _check(x, take_a, "cuda")
    out = torch.empty_like(x)
    n = x.numel()
    cuda.launch(cuda.kernel(CU_FILE, "two_paths"), triton.cdiv(n, 256), 256,
                (x, take_a, out, np.int64(n), np.int32(ITERS)))
    return out


# --8<-- [start:triton]
@triton.jit
def _two_paths_kernel(x_ptr, flag_ptr, out_ptr, n, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    take_a = tl.load(flag_ptr + offs, mask=mask) != 0
    a = x
    b = x
    for _ in range(ITERS):  # both paths, always: a block-wide program has no per-thread branch
        a = a * a - 0.5
        b = b * 0.5 + 0.25
    tl.store(out_ptr + offs, tl.where(take_a, a, b), mask=mask)


def two_paths_triton(x: torch.Tensor, take_a: torch.Tensor) -> torch.Tensor:
    """v2: Triton; both paths for every element, then a select, whatever the flags."""
    refuse_grad("two_paths_triton", x)
    _check(x, take_a, triton_device())
    out = torch.empty_like(x)
    n = x.numel()
    _two_paths_kernel[(triton.cdiv(n, 1024),)](x, take_a.view(torch.uint8), out, n, ITERS=ITERS,
                                               BLOCK=1024)
    return out
# --8<-- [end:triton]


def _make_inputs(size, dtype, device, gen):
    x = (torch.rand(size["n"], generator=gen, dtype=torch.float32) - 0.5).to(device)
    return x, make_flags(size["n"], size["pattern"], gen).to(device)


N = 2**24
warp_divergence = register(Op(
    name="warp_divergence", part=1, chapter="part1/execution-model.md", title="Warp divergence",
    reference=two_paths_ref, make_inputs=_make_inputs,
    # Useful work: one FMA (2 FLOPs) per iteration on the path each element takes. v0 and v2 do
    # twice that.
    bytes_moved=lambda s, d: 9 * s["n"], flops=lambda s, d: 2 * ITERS * s["n"],
    metric="TFLOP/s", ceiling="gemm_fp32", headline={"n": N, "pattern": "alternate"},
    sweep=[{"n": N, "pattern": p} for p in PATTERNS], sweep_axis="pattern", dtypes=(torch.float32,),
    test_sizes=[{"n": n, "pattern": p} for n in (1, 33, 1000) for p in PATTERNS],
    tolerances={torch.float32: (1e-5, 1e-5)}))
warp_divergence.add(Impl("v0", two_paths_torch, "PyTorch",
                         "both paths in eager torch, then torch.where", (two_paths_ref,)))
warp_divergence.add(Impl("v1", two_paths_cuda, "CUDA", "a real branch per thread",
                         (cuda.source_path(CU_FILE),)))
warp_divergence.add(Impl("v2", two_paths_triton, "Triton", "both paths per block, then a select",
                         (_two_paths_kernel,), device="any"))

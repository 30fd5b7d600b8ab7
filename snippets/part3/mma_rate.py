"""How fast ``mma.sync`` itself runs: a micro-benchmark for the tensor-cores chapter's last step.

``wmma_gemm`` v7 issues 32 ``mma.sync.m16n8k16`` and 8 ``ldmatrix.x4`` per 16-deep step and warp,
between copies and barriers. This op runs the same warp tile's MMAs with nothing else in the loop,
so the chapter can say how much of the instruction's own rate the GEMM reaches
(``csrc/wmma/mma_rate.cu``):

- v1 CUDA, the fragments loaded once into registers, then ``steps`` x 32 ``mma.sync`` into v7's
      64 x 64 block of fp32 sums: the tensor pipe and the issue slots, nothing more.
- v2 CUDA, every step re-reads the fragments from shared memory with v7's 8 ``ldmatrix.x4`` per
      32 MMAs, double-buffered in registers: what a GEMM of these instructions could reach with its
      copies and barriers free.

No library baseline (``kind="micro"``). Ceiling: ``gemm_fp16``, cuBLAS's fp16 GEMM rate in the same
run, so the fraction of ceiling reads "mma.sync's best, as a share of what cuBLAS reaches with
wgmma". Every warp computes ``steps * A[i] @ B[:, 8j : 8j + 8]`` for 4 x 8 tiles; warp 0 of block 0
writes its sums in the accumulator layout, which :func:`mma_rate_ref` computes with torch. With
operands of small integers every sum is exact in fp32, so the check is equality.
"""

from __future__ import annotations

import numpy as np
import torch

from snippets import cuda
from snippets._checks import check_int, check_tensors
from snippets.registry import Impl, Op, register

CU_FILE = "wmma/mma_rate.cu"
THREADS = 128  # 4 warps a block, as v7
CU_OPTIONS = cuda.defines(CU_FILE, RATE_THREADS=THREADS)
MI, NI = 4, 8  # v7's warp tile: 4 x 8 tiles of m16n8
FLOP_PER_MMA = 2 * 16 * 8 * 16  # m16n8k16
MMAS_PER_STEP = MI * NI
MAX_STEPS = 1 << 18  # operands in [-2, 2]: |sum| <= 64 * steps stays exact in fp32 up to here
KERNELS = {"v1": "mma_rate_registers", "v2": "mma_rate_ldmatrix"}


# --8<-- [start:reference]
def mma_rate_ref(a: torch.Tensor, b: torch.Tensor, blocks: int, steps: int) -> torch.Tensor:
    """What warp 0 of block 0 writes: lane l's 4 x 8 x 4 sums at ``out[128 l + 4 (8 i + j) + e]``,
    the m16n8 accumulator layout of ``steps * a[i] @ b[:, 8j : 8j + 8]``: lane l = 4 g + t
    holds rows g and g + 8, columns 2t and 2t + 1 of each tile (e = 2 [row g + 8] + [column
    2t + 1])."""
    b_tiles = b.double().reshape(16, NI, 8).permute(1, 0, 2)[:, None]  # (NI, 1, 16, 8)
    tiles = steps * (a.double() @ b_tiles)  # (NI, MI, 16, 8): tile (j, i) is a[i] @ b's tile j
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    e = torch.arange(4)
    rows = g[:, None] + 8 * (e[None, :] // 2)  # (32, 4)
    cols = 2 * t[:, None] + e[None, :] % 2
    sums = tiles[:, :, rows, cols].permute(2, 1, 0, 3)  # (lane, i, j, e)
    return sums.reshape(-1).to(torch.float32).to(a.device)
# --8<-- [end:reference]


def _check(a: torch.Tensor, b: torch.Tensor, blocks: int, steps: int) -> tuple[int, int]:
    for name, t, shape in (("a", a, (MI, 16, 16)), ("b", b, (16, 8 * NI))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float16:
            raise TypeError(f"{name} has dtype {t.dtype}; the kernels multiply torch.float16")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (a: {MI} tiles of 16 x 16; "
                             f"b: K x N), got {tuple(t.shape)}")
    blocks = check_int("blocks", blocks, 1)
    steps = check_int("steps", steps, 1)
    if blocks > 2**31 - 1:
        raise ValueError(f"blocks must fit CUDA's gridDim.x (2^31 - 1), got {blocks}")
    if steps > MAX_STEPS:
        raise ValueError(f"steps must be <= {MAX_STEPS} (the sums of small-integer operands stay "
                         f"exact in fp32 up to there), got {steps}")
    check_tensors(("a", "b"), (a, b), dtypes=(torch.float16,), device="cuda", same_shape=False)
    if a.device != b.device:
        raise ValueError(f"a and b must be on one device, got {a.device} and {b.device}")
    return blocks, steps


# --8<-- [start:launch]
def _launch(version: str, a: torch.Tensor, b: torch.Tensor, blocks: int,
            steps: int) -> torch.Tensor:
    blocks, steps = _check(a, b, blocks, steps)
    cuda.require_gpu()
    out = torch.empty(32 * MI * NI * 4, dtype=torch.float32, device=a.device)
    with torch.cuda.device(a.device):
        fn = cuda.kernel(CU_FILE, KERNELS[version], CU_OPTIONS)
        cuda.launch(fn, blocks, THREADS, (a, b, out, np.int32(steps)))
    return out


def mma_rate_registers(a: torch.Tensor, b: torch.Tensor, blocks: int, steps: int) -> torch.Tensor:
    """v1: ``blocks`` blocks of 4 warps, each warp ``steps`` x 32 ``mma.sync`` from fragments
    held in registers. Returns warp 0's sums (see :func:`mma_rate_ref`)."""
    return _launch("v1", a, b, blocks, steps)


def mma_rate_ldmatrix(a: torch.Tensor, b: torch.Tensor, blocks: int, steps: int) -> torch.Tensor:
    """v2: like v1, each step's fragments re-read from shared memory by 8 ``ldmatrix.x4``
    (double-buffered)."""
    return _launch("v2", a, b, blocks, steps)
# --8<-- [end:launch]


# the operands read (2 bytes a value) and warp 0's sums written (4 bytes): all the launch moves
BYTES = 2 * (MI * 16 * 16 + 16 * 8 * NI) + 4 * 32 * MI * NI * 4


def _make_inputs(size, dtype, device, gen):
    """Small integers in [-2, 2]: every product and sum exact in fp32."""
    a = torch.randint(-2, 3, (MI, 16, 16), generator=gen).to(dtype).to(device)
    b = torch.randint(-2, 3, (16, 8 * NI), generator=gen).to(dtype).to(device)
    return a, b, size["blocks"], size["steps"]


def mma_flops(size) -> int:
    """Tensor-core FLOPs of one launch: every warp of every block, ``steps`` x 32 m16n8k16."""
    return size["blocks"] * (THREADS // 32) * size["steps"] * MMAS_PER_STEP * FLOP_PER_MMA


# Blocks of 4 warps: 132 is one block an SM on a 132-SM H100 or H200 (one warp a scheduler), 264
# two (both versions' registers allow two), then two and four waves of those. 4096 steps: about
# 0.5 GFLOP a warp, milliseconds a launch.
STEPS = 4096
SWEEP = [{"blocks": n, "steps": STEPS} for n in (132, 264, 528, 1056)]
HEADLINE = SWEEP[-1]

mma_rate = register(Op(
    name="mma_rate", part=3, chapter="part3/tensor-cores.md", title="mma.sync's own rate",
    reference=mma_rate_ref, make_inputs=_make_inputs, bytes_moved=lambda s, d: BYTES,
    flops=lambda s, d: mma_flops(s), metric="TFLOP/s", ceiling="gemm_fp16", kind="micro",
    headline=HEADLINE, sweep=SWEEP, sweep_axis="blocks", dtypes=(torch.float16,),
    test_sizes=[{"blocks": 1, "steps": 1}, {"blocks": 3, "steps": 2}, {"blocks": 2, "steps": 7},
                {"blocks": 5, "steps": 100}],
    output_dtypes={torch.float16: torch.float32},  # fp32 sums
    tolerances={torch.float16: (0.0, 0.0)}))  # small-integer sums: exact
SOURCES = (*cuda.source_files(CU_FILE), _launch, _check)
mma_rate.add(Impl("v1", mma_rate_registers, "CUDA",
                  "v7's 32 mma.sync a step, fragments in registers", SOURCES))
mma_rate.add(Impl("v2", mma_rate_ldmatrix, "CUDA",
                  "v7's 32 mma.sync and 8 ldmatrix.x4 a step, no copies, no barrier", SOURCES))

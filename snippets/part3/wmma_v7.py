"""wmma_gemm v7: v6's ``mma.sync`` kernel with its address arithmetic and bounds checks moved out
of the K loop (``csrc/wmma/mma_v7.cu``).

A version of Part 3's ``wmma_gemm`` op, registered from its own module so that the measured
results of v1 to v6 keep their source hashes (they cover ``snippets/part3/wmma.py`` and
``csrc/part3/wmma_gemm.cu``, and every file of ``csrc/part3``: v7's kernel file lives outside it).

- v7 CUDA, v6's tile (128 x 128, 4 warps of 64 x 64), stages (three, 64 deep), swizzle, ``ldmatrix``
      and ``mma.sync``, unchanged. What changes is everything else in the loop: a thread's
      ``cp.async`` copies and a lane's ``ldmatrix`` reads share one swizzled offset each (their rows
      are 8k apart, so the XOR term is the same), computed once, in 32-bit shared-window addresses;
      global pointers step by a constant; a tile wholly inside the matrices (every K-step of an
      interior block but a ragged last one) is copied with no bounds check. The loop's SASS has
      about half of v6's instructions for the same MMAs and ``ldmatrix`` reads.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.gemm import HALF_TYPES, check_operands
from snippets.part3.wmma import GRID_Y_MAX, SUFFIX, WmmaConfig, check_supported, wmma_gemm
from snippets.registry import Impl

V7_FILE = "wmma/mma_v7.cu"

# --8<-- [start:config]
# v6's launch, unchanged: a 128 x 128 tile of C per block of 4 warps, three stages of a 128 x 64
# tile of A and a 64 x 128 tile of B (96 KiB: two blocks an SM)
V7_BK, V7_STAGES = 64, 3
V7 = WmmaConfig("mma_v7", tile=(128, 128), threads=128, multiple=(1, 8, 8), align=16,
                why="rows are copied in 16-byte pieces of 8 elements",
                smem=V7_STAGES * (128 + 128) * V7_BK * 2)
V7_OPTIONS = cuda.defines(V7_FILE, V7_BM=V7.tile[0], V7_BN=V7.tile[1], V7_BK=V7_BK,
                          V7_THREADS=V7.threads, V7_STAGES=V7_STAGES)
# --8<-- [end:config]


# --8<-- [start:launch]
def launch_v7(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B by v7's kernel: a 2-D grid of 128 x 128 tiles, 96 KiB of dynamic shared memory
    per block (the opt-in above 48 KiB is set on the kernel the first time)."""
    m, n, k = check_operands(a, b, HALF_TYPES)
    check_supported(V7, a, b)
    cuda.require_gpu()
    grid = (triton.cdiv(n, V7.tile[1]), triton.cdiv(m, V7.tile[0]))
    if grid[1] > GRID_Y_MAX:
        raise ValueError(f"{V7.kernel}: {grid[1]} tiles along gridDim.y exceed CUDA's limit of "
                         f"{GRID_Y_MAX} (a is {m} x {k})")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    with torch.cuda.device(a.device):
        fn = cuda.kernel(V7_FILE, f"{V7.kernel}_{SUFFIX[a.dtype]}", V7_OPTIONS)
        if fn.max_dynamic_shared_size_bytes < V7.smem:
            fn.max_dynamic_shared_size_bytes = V7.smem
        cuda.launch(fn, grid, V7.threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k)),
                    shared_mem=V7.smem)
    return c
# --8<-- [end:launch]


def wmma_mma_hoisted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v7: v6 (mma.sync m16n8k16 fed by ldmatrix from XOR-swizzled shared memory, three cp.async
    stages, 4 warps of 64 x 64) with the copies' and reads' addresses computed once per thread and
    no bounds checks on whole tiles. Any M; N, K multiples of 8; A and B on 16-byte boundaries."""
    refuse_grad("wmma_mma_hoisted", a, b, instead="a @ b")
    return launch_v7(a, b)


wmma_gemm.add(Impl("v7", wmma_mma_hoisted, "CUDA",
                   "like v6, addresses and bounds checks out of the K loop",
                   (*cuda.source_files(V7_FILE), launch_v7, check_operands, check_supported)))

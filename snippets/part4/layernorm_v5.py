"""LayerNorm forward v5: one warp per row in CUDA C (``csrc/layernorm/layernorm_v5.cu``).

A version of Part 4's ``layernorm`` op, registered from its own module, its kernel outside
``csrc/part4/``, so that v0 to v4's measured results (and every other Part 4 CUDA op's, whose
hashes cover ``csrc/part4/``) keep their source hashes.

- v5  CUDA C, the row of v4 given to one warp instead of one block: lane l holds 16-byte vectors
      l, l + 32, ... of the row in registers, in the row's own type; the mean and the variance are
      warp shuffles alone (no shared memory, no barrier), and a block is V5_WARPS independent rows.
      Rows that a warp cannot hold (more than 32 vectors a lane), whose length is not
      a multiple of 16 bytes, or whose tensors are not 16-byte aligned go to v4's kernel.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.rows import check_rows
from snippets.part4.layernorm import CUDA_SUFFIX, EPS, FLOAT_TYPES, layernorm, layernorm_cuda
from snippets.registry import Impl

V5_FILE = "layernorm/layernorm_v5.cu"
V5_WARPS = 4                      # rows a block, a warp each
V5_OPTIONS = cuda.defines(V5_FILE, V5_WARPS=V5_WARPS)
# the most 16-byte vectors a lane holds, per type (the entries layernorm_v5.cu compiles)
MAX_VECS = {torch.float32: 32, torch.float16: 32, torch.bfloat16: 32}


# --8<-- [start:warp_launch]
def warp_vectors(n: int, dtype: torch.dtype) -> int | None:
    """16-byte vectors a lane holds for rows of ``n`` elements of ``dtype``: the smallest power of
    two whose 32 lanes cover the row; None when the row is not a whole number of vectors or one
    warp cannot hold it (more than MAX_VECS[dtype])."""
    per_vec = 16 // dtype.itemsize
    if n < 1 or n % per_vec:
        return None
    vecs = triton.next_power_of_2(triton.cdiv(n // per_vec, 32))
    return vecs if vecs <= MAX_VECS.get(dtype, 0) else None


def layernorm_warp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                   eps: float = EPS) -> torch.Tensor:
    """v5: the CUDA C forward with one warp per row; rows it cannot take go to v4 (layernorm_cuda),
    which takes any row length up to its own limit."""
    refuse_grad("layernorm_warp", x, w, b, instead="layernorm_triton")
    m, n = check_rows(x, {"w": w, "b": b}, FLOAT_TYPES, "cuda")
    cuda.require_gpu()
    vecs = warp_vectors(n, x.dtype)
    aligned = all(t.data_ptr() % 16 == 0 for t in (x, w, b))
    if vecs is None or not aligned:
        return layernorm_cuda(x, w, b, eps)
    y = torch.empty_like(x)
    if m == 0:
        return y
    with torch.cuda.device(x.device):
        fn = cuda.kernel(V5_FILE, f"layernorm_warp_{CUDA_SUFFIX[x.dtype]}_v{vecs}", V5_OPTIONS)
        cuda.launch(fn, triton.cdiv(m, V5_WARPS), 32 * V5_WARPS,
                    (x, w, b, y, np.int32(m), np.int32(n), np.float32(eps)))
    return y
# --8<-- [end:warp_launch]


layernorm.add(Impl("v5", layernorm_warp, "CUDA",
                   "a warp per row, row in registers, shuffles only (v4 past a warp)",
                   (*cuda.source_files(V5_FILE), warp_vectors, check_rows, layernorm_cuda),
                   device="cuda"))

"""fp8_gemm v4, v5 and v6, fp8_gemm_blockscaled v5 and v6: the CUDA FP8 GEMMs with wider tiles
whose columns are promoted one slice at a time (``csrc/fp8/fp8_gemm_wide.cu``).

Registered from their own module, so that the measured results of the versions before them keep
their source hashes (those cover ``snippets/part6/fp8_gemm.py`` and ``csrc/fp8/fp8_gemm.cu``).

- fp8_gemm v4 / fp8_gemm_blockscaled v5, CUDA: v3 / v4 (16-byte stores of C, balanced persistent
      grid) with the tile widened from 128 x 128 to 128 x 256. A consumer warpgroup owns 64 rows as
      two 128-column slices: per 128-deep K-block, four wgmma m64n128k32 into one temporary, added
      into the first slice's fp32 accumulator, then the same for the second slice with the same
      temporary (192 registers for the three, where one 64 x 256 temporary and accumulator would
      need 256). The wider tile reads a quarter fewer bytes of A and B per FLOP; a stage is 48 KB,
      four in flight.
- fp8_gemm v5, CUDA: 128 x 192 tiles, two slices of 96 columns and two temporaries (again 192
      registers): the second slice's wgmmas are issued before the first slice is added, so a
      consumer adds while its own wgmmas run. Per tensor only: a 96-column slice straddles two of
      B's 128 x 128 scale blocks.
- fp8_gemm v6 / fp8_gemm_blockscaled v6, CUDA: v5 / blockscaled v5 with fewer instructions
      around the same wgmmas and adds: each descriptor made by adding an offset to one of two base
      descriptors instead of rebuilt from its address, and mbarrier waits that are a bare PTX
      try-and-branch loop (only a retry counts toward the trap) instead of reading the clock.
"""

from __future__ import annotations

import numpy as np
import torch

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.cubin import SM90A_FLAGS, Cubin
from snippets.part6.fp8_gemm import (
    CudaConfig,
    check_block_scales,
    check_fp8_operands,
    check_tensor_scales,
    cuda_grid,
    device_fp8_tensor_maps,
    encode_fp8_tensor_map,
    fp8_gemm,
    fp8_gemm_blockscaled,
    needs_fp8_sm90,
    tma_specs,
)
from snippets.registry import Impl

# --8<-- [start:config]
WIDE_CU_FILE = "fp8/fp8_gemm_wide.cu"
WIDE_CUBIN = Cubin(WIDE_CU_FILE, SM90A_FLAGS, name="fp8_gemm_wide")
# csrc/fp8/fp8_gemm_wide.cu's instances (a CPU test compares): two slices of W columns a tile, as
# many stages as 227 KB holds; the producer, the consumers and setmaxnreg as in fp8_gemm.cu.
# v4 and blockscaled v5: W = 128 (128 x 256 tiles, 48 KB stages, 4), one temporary
WIDE_CONFIG = CudaConfig(block_n=256, stages=4)
WIDE_KERNELS = {False: "fp8_gemm_tensor_wide", True: "fp8_gemm_block_wide"}  # by BLOCKWISE
# v5: W = 96 (128 x 192 tiles, 40 KB stages, 5), two temporaries
SLICED_CONFIG = CudaConfig(block_n=192, stages=5)
SLICED_KERNEL = "fp8_gemm_tensor_sliced"
# v6 and blockscaled v6: v5's and blockscaled v5's configs, descriptors by addition, lean waits
LEAN_KERNELS = {False: "fp8_gemm_tensor_lean", True: "fp8_gemm_block_lean"}  # by BLOCKWISE


def slice_registers(cfg: CudaConfig, temporaries: int) -> int:
    """fp32 registers a consumer thread holds: its 64 x block_n accumulator over the warpgroup's
    128 threads, and ``temporaries`` of one slice (block_n / 2 columns) each."""
    return 64 * cfg.block_n // 128 + temporaries * 64 * (cfg.block_n // 2) // 128
# --8<-- [end:config]


# --8<-- [start:launch]
def launch_wide(name: str, kernel: str, cfg: CudaConfig, a: torch.Tensor, b: torch.Tensor,
                scale_args: tuple) -> torch.Tensor:
    """fp8_gemm.py's launch_cuda for the kernels of fp8_gemm_wide.cu (operands and scales already
    checked): tensor maps with B's box of ``cfg.block_n`` rows, the balanced persistent grid.
    ``scale_args``: the two scale tensors and the four scale strides (zeros per tensor)."""
    reason = needs_fp8_sm90()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    specs = tma_specs(name, a, b, cfg)
    (m, k), n = a.shape, b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    index = a.device.index if a.device.index is not None else 0
    tmaps = device_fp8_tensor_maps(specs, a.device)
    fn = WIDE_CUBIN.kernel(kernel, index)
    if fn.max_dynamic_shared_size_bytes < cfg.smem_bytes:
        fn.max_dynamic_shared_size_bytes = cfg.smem_bytes  # above 48 KiB needs the opt-in
    with torch.cuda.device(a.device):
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        cuda.launch(fn, cuda_grid(m, n, sms, cfg, balanced=True), cfg.threads,
                    (tmaps, c, np.int32(m), np.int32(n), np.int32(k), np.int64(n), *scale_args),
                    shared_mem=cfg.smem_bytes)
    return c


def tensor_scaled(name: str, kernel: str, cfg: CudaConfig, a, b, a_s, b_s) -> torch.Tensor:
    """The per-tensor versions' checks and launch."""
    refuse_grad(name, a, b, a_s, b_s, instead="fp8_gemm_ref")
    check_fp8_operands(name, a, b, "cuda")
    check_tensor_scales(name, a_s, b_s, a.device)
    return launch_wide(name, kernel, cfg, a, b, (a_s, b_s, *(np.int64(0),) * 4))


def fp8_gemm_wide(a, b, a_s, b_s):
    """fp8_gemm v4: v3 with 128 x 256 tiles (each consumer's 64 x 256 as two promoted slices)."""
    return tensor_scaled("fp8_gemm_wide", WIDE_KERNELS[False], WIDE_CONFIG, a, b, a_s, b_s)


def fp8_gemm_sliced(a, b, a_s, b_s):
    """fp8_gemm v5: 128 x 192 tiles, two 96-column slices with a temporary each: one slice is
    added while the other's wgmmas run."""
    return tensor_scaled("fp8_gemm_sliced", SLICED_KERNEL, SLICED_CONFIG, a, b, a_s, b_s)


def fp8_gemm_lean(a, b, a_s, b_s):
    """fp8_gemm v6: v5 with its wgmma descriptors made by addition and its mbarrier waits a bare
    try-and-branch loop: the same sums, fewer instructions per K-block."""
    return tensor_scaled("fp8_gemm_lean", LEAN_KERNELS[False], SLICED_CONFIG, a, b, a_s, b_s)


def block_scaled(name: str, kernel: str, a, a_scales, b, b_scales) -> torch.Tensor:
    """The block-scaled versions' checks and launch (128 x 256 tiles)."""
    refuse_grad(name, a, a_scales, b, b_scales, instead="fp8_gemm_blockscaled_ref")
    m, n, k = check_fp8_operands(name, a, b, "cuda")
    check_block_scales(name, m, n, k, a_scales, b_scales, a.device)
    strides = (*a_scales.stride(), *b_scales.stride())
    return launch_wide(name, kernel, WIDE_CONFIG, a, b,
                       (a_scales, b_scales, *(np.int64(s) for s in strides)))


def fp8_gemm_blockscaled_wide(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v5: v4 with 128 x 256 tiles; each half of a tile has its own scale of
    B (one per 128 x 128 block), read with A's before each K-block's wait."""
    return block_scaled("fp8_gemm_blockscaled_wide", WIDE_KERNELS[True], a, a_scales, b, b_scales)


def fp8_gemm_blockscaled_lean(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v6: its v5 with fp8_gemm v6's descriptors and waits."""
    return block_scaled("fp8_gemm_blockscaled_lean", LEAN_KERNELS[True], a, a_scales, b, b_scales)
# --8<-- [end:launch]


WIDE_SOURCES = (*cuda.source_files(WIDE_CU_FILE), WIDE_CUBIN.build, launch_wide, tma_specs,
                check_fp8_operands, encode_fp8_tensor_map, device_fp8_tensor_maps, cuda_grid,
                needs_fp8_sm90)

fp8_gemm.add(Impl("v4", fp8_gemm_wide, "CUDA", "like v3, 128 x 256 tiles as two promoted slices",
                  (*WIDE_SOURCES, tensor_scaled, check_tensor_scales), requires=needs_fp8_sm90))
fp8_gemm.add(Impl("v5", fp8_gemm_sliced, "CUDA",
                  "128 x 192 tiles, a slice promoted while the next one's wgmmas run",
                  (*WIDE_SOURCES, tensor_scaled, check_tensor_scales), requires=needs_fp8_sm90))
fp8_gemm.add(Impl("v6", fp8_gemm_lean, "CUDA",
                  "like v5, descriptors by addition, bare try-and-branch waits",
                  (*WIDE_SOURCES, tensor_scaled, check_tensor_scales), requires=needs_fp8_sm90))
fp8_gemm_blockscaled.add(Impl(
    "v5", fp8_gemm_blockscaled_wide, "CUDA", "like v4, 128 x 256 tiles as two promoted slices",
    (*WIDE_SOURCES, block_scaled, check_block_scales), requires=needs_fp8_sm90))
fp8_gemm_blockscaled.add(Impl(
    "v6", fp8_gemm_blockscaled_lean, "CUDA", "like v5, fp8_gemm v6's descriptors and waits",
    (*WIDE_SOURCES, block_scaled, check_block_scales), requires=needs_fp8_sm90))

__all__ = ["LEAN_KERNELS", "SLICED_CONFIG", "SLICED_KERNEL", "WIDE_CONFIG", "WIDE_CUBIN",
           "WIDE_CU_FILE", "WIDE_KERNELS", "block_scaled", "fp8_gemm_blockscaled_lean",
           "fp8_gemm_blockscaled_wide", "fp8_gemm_lean", "fp8_gemm_sliced", "fp8_gemm_wide",
           "launch_wide", "slice_registers", "tensor_scaled"]

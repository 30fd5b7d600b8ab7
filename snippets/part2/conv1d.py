"""1-D convolution with a short filter: where the filter lives (global, constant or shared memory).

``out[i] = sum_j w[j] * x[i + j - k//2]``, a cross-correlation (no filter flip, as in every
deep-learning library) with "same"-size output and zero padding, for an fp32 signal ``x`` of n
samples and an odd filter of ``k <= 63`` taps.

Versions of ``conv1d_constant`` (never renumbered):

- v0  ``torch.nn.functional.conv1d`` on (1, 1, n) views (cuDNN), TF32 switched off: the
  library baseline.
- v1  CUDA, one thread per output, the filter and the signal read from global memory.
- v2  CUDA, like v1 but the filter in ``__constant__`` memory: a warp reads one w[j] at a time, and
      the constant cache serves one address to all 32 threads in a single broadcast.
- v3  CUDA, like v1 but each block first copies the filter and its input tile (halo included) into
      shared memory, and each thread computes 4 outputs from there.
- v4  Triton: one program per 1024 outputs, a loop over the taps, masked loads for the padding.
- v5  CUDA, like v3 but the filter from ``__constant__`` memory (as in v2) and only the signal in
  shared memory.

Each output reads k inputs and k filter values, but almost all of those reads hit in cache
(neighbouring outputs share inputs; every output shares the filter): DRAM sees each input once and
each output once. So the cost model is (2n + k) * 4 bytes and 2nk FLOPs. At k = 31 that is 7.75
FLOP/byte, below the fp32 ridge point of an H100 or H200 (about 14 to 20 FLOP/byte), so the op is
memory-bound and its ceiling is the copy bandwidth; at k = 63 (15.75 FLOP/byte) it crosses into
compute-bound territory.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part2/conv1d.cu"
# the size of conv1d.cu's __constant__ filter array (64 floats) minus one
MAX_K = 63


# --8<-- [start:reference]
def conv1d_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out[i] = sum_j w[j] * x[i + j - k//2], zero outside x. Reads x once and writes out once from
    DRAM: (2n + k) * itemsize bytes, 2nk FLOPs (k multiply-adds per output)."""
    n, k = x.numel(), w.numel()
    half = k // 2
    xp = F.pad(x, (half, half))  # zero padding: x[-half .. n + half)
    out = torch.zeros_like(x)
    for j in range(k):  # one shifted, scaled copy of x per tap
        out += w[j] * xp[j : j + n]
    return out
# --8<-- [end:reference]


def _check(x: torch.Tensor, w: torch.Tensor, device: str) -> None:
    """The refusals every version shares: fp32, 1-D, contiguous, non-empty x; an odd filter of at
    most 63 taps."""
    check_tensors(("x", "w"), (x, w), dtypes=(torch.float32,), device=device, same_shape=False,
                  allow_empty=False)
    if x.dim() != 1 or w.dim() != 1:
        raise ValueError(f"x and w must be 1-D, got shapes {tuple(x.shape)} and {tuple(w.shape)}")
    k = w.numel()
    if k % 2 == 0:
        raise ValueError("the filter length must be odd (a centred 'same' convolution), got k = "
                         f"{k}")
    if k > MAX_K:
        raise ValueError(f"the filter has {k} taps; these kernels hold at most {MAX_K} (the "
                         f"constant array has {MAX_K + 1} floats)")


# --------------------------------------------------------------------------------------------------
# v0: the library
# --------------------------------------------------------------------------------------------------

# --8<-- [start:torch]
def conv1d_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v0: ``F.conv1d`` on (batch 1, channel 1, n) views, padding k//2, which is the same
    cross-correlation. cuDNN may use TF32 for fp32 convolutions by default (10 mantissa bits: errors
    near 1e-3); the baseline must compute in fp32 like every other version, so TF32 is switched off
    for the call."""
    # torch runs on either device
    _check(x, w, x.device.type if isinstance(x, torch.Tensor) else "cuda")
    k = w.numel()
    prev = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        return F.conv1d(x.view(1, 1, -1), w.view(1, 1, k), padding=k // 2).view(-1)
    finally:
        torch.backends.cudnn.allow_tf32 = prev
# --8<-- [end:torch]


# --------------------------------------------------------------------------------------------------
# v4: Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
BLOCK = 1024  # outputs per program; 4 warps: 8 outputs per thread
NUM_WARPS = 4


@triton.jit
def _conv1d_kernel(x_ptr, w_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # this program's outputs
    half = k // 2
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(0, k):  # k is a run-time value: one compiled kernel serves every filter length
        wj = tl.load(w_ptr + j)  # a scalar: one address for the whole program, a broadcast
        src = offs + (j - half)
        # the mask is the zero padding
        xv = tl.load(x_ptr + src, mask=(src >= 0) & (src < n), other=0.0)
        acc += wj * xv
    tl.store(out_ptr + offs, acc, mask=offs < n)


def conv1d_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v4: Triton; neighbouring taps re-read x through the L1 cache, the filter through
    scalar loads."""
    refuse_grad("conv1d_triton", x, w, instead="conv1d_torch")
    _check(x, w, triton_device())
    out = torch.empty_like(x)
    n = x.numel()
    _conv1d_kernel[(triton.cdiv(n, BLOCK),)](x, w, out, n, w.numel(), BLOCK=BLOCK,
                                             num_warps=NUM_WARPS)
    return out
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part2/conv1d.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

THREADS = 256  # threads per block; the tiled kernels index shared memory with it
PER_THREAD = 4  # outputs per thread of the tiled kernels
TILE = THREADS * PER_THREAD  # outputs per block of the tiled kernels
# conv1d.cu is compiled with these numbers and MAX_K (-D options): they are written only here
CU_OPTIONS = cuda.defines(CU_FILE, MAX_K=MAX_K, THREADS=THREADS, PER_THREAD=PER_THREAD)


# --8<-- [start:set_constant]
def _set_filter(w: torch.Tensor) -> None:
    """Copy the filter into the module's ``__constant__ float c_filter[64]``: a device-to-device
    copy on torch's current stream, so it is ordered after whatever wrote ``w`` and before the
    launch that reads c_filter. There is one c_filter per module: two launches with different
    filters on two streams would race."""
    cupy = cuda.cupy_module()
    # cuda.module is the module cuda.kernel takes the kernels from, so this is the c_filter
    # they read.
    # a cupy MemoryPointer to the symbol in constant memory
    dst = cuda.module(CU_FILE, CU_OPTIONS).get_global("c_filter")
    cupy.cuda.runtime.memcpyAsync(dst.ptr, w.data_ptr(), w.numel() * w.element_size(),
                                  cupy.cuda.runtime.memcpyDeviceToDevice,
                                  torch.cuda.current_stream().cuda_stream)
# --8<-- [end:set_constant]


# --8<-- [start:launch]
# version -> (kernel, filter in constant memory, outputs per thread)
CUDA_VERSIONS = {
    "v1": ("conv1d_global", False, 1),
    "v2": ("conv1d_constant", True, 1),
    "v3": ("conv1d_shared", False, PER_THREAD),
    "v5": ("conv1d_shared_const", True, PER_THREAD),
}


def _conv1d_cuda(version: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The one launcher of every CUDA version: blocks of 256 threads, each thread computing 1 or
    4 outputs."""
    cuda.require_gpu()
    _check(x, w, "cuda")
    name, constant_filter, per_thread = CUDA_VERSIONS[version]
    out = torch.empty_like(x)
    n, k = x.numel(), w.numel()
    if constant_filter:
        _set_filter(w)
        args = (x, out, np.int64(n), np.int32(k))
    else:
        args = (x, w, out, np.int64(n), np.int32(k))
    cuda.launch(cuda.kernel(CU_FILE, name, CU_OPTIONS), triton.cdiv(n, THREADS * per_thread),
                THREADS, args)
    return out
# --8<-- [end:launch]


def conv1d_cuda_global(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v1: one thread per output; w[j] and x[i + j - k//2] both from global memory (through L1)."""
    refuse_grad("conv1d_cuda_global", x, w, instead="conv1d_torch")
    return _conv1d_cuda("v1", x, w)


def conv1d_cuda_constant(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but the filter in constant memory: the warp-uniform w[j] is one constant-cache
    broadcast, and the load/store unit is left to the signal."""
    refuse_grad("conv1d_cuda_constant", x, w, instead="conv1d_torch")
    return _conv1d_cuda("v2", x, w)


def conv1d_cuda_shared(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v3: like v1, but filter and input tile (with a k//2 halo each side) staged in shared memory
    once per block; 4 outputs per thread, so the halo is amortised over 1024 outputs and each w[j]
    read feeds 4 FMAs."""
    refuse_grad("conv1d_cuda_shared", x, w, instead="conv1d_torch")
    return _conv1d_cuda("v3", x, w)


def conv1d_cuda_shared_const(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v5: like v3, but the filter from constant memory (v2's broadcast) and only the signal in
    shared memory."""
    refuse_grad("conv1d_cuda_shared_const", x, w, instead="conv1d_torch")
    return _conv1d_cuda("v5", x, w)


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """x ~ N(0, 1); w ~ N(0, 1/k), so that out ~ N(0, 1) whatever k is and one tolerance fits
    every k."""
    k = size["k"]
    x = torch.randn(size["n"], generator=gen, dtype=torch.float32)
    w = torch.randn(k, generator=gen, dtype=torch.float32) / k**0.5
    return x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype)


N = 2**26  # 256 MiB of fp32 in, 256 MiB out: about 9x the H200's L2 for the pair
HEADLINE = {"n": N, "k": 31}
SWEEP = [{"n": N, "k": k} for k in (3, 7, 15, 31, 63)]
TEST_SIZES = [{"n": n, "k": k}
              for n, k in ((1, 1), (1, 7), (5, 7), (17, 1), (17, 3), (1000, 31), (4097, 63),
                           (65536 + 3, 15))]

conv1d_constant = register(Op(
    name="conv1d_constant", part=2, chapter="part2/constant-memory.md", title="1-D convolution",
    reference=conv1d_ref, make_inputs=_make_inputs,
    bytes_moved=lambda s, d: (2 * s["n"] + s["k"]) * 4, flops=lambda s, d: 2 * s["n"] * s["k"],
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, sweep_axis="k",
    dtypes=(torch.float32,), test_sizes=TEST_SIZES,
    # A dot product of k <= 63 terms summed in fp32 (out ~ N(0, 1)): errors of a few 1e-7; 1e-5
    # leaves room for the algorithm cuDNN picks (it may sum in another order, or use an FFT).
    tolerances={torch.float32: (1e-5, 1e-5)}))
_SRC = (cuda.source_path(CU_FILE), _conv1d_cuda, _check)
conv1d_constant.add(Impl("v0", conv1d_torch, "PyTorch", "F.conv1d (cuDNN), TF32 off", (_check,)))
conv1d_constant.add(Impl("v1", conv1d_cuda_global, "CUDA", "filter in global memory", _SRC))
conv1d_constant.add(Impl("v2", conv1d_cuda_constant, "CUDA", "filter in constant memory",
                         (*_SRC, _set_filter)))
conv1d_constant.add(Impl("v3", conv1d_cuda_shared, "CUDA", "filter and input tile in shared memory",
                         _SRC))
conv1d_constant.add(Impl("v4", conv1d_triton, "Triton", "1024 outputs per program, loop over taps",
                         (_conv1d_kernel, _check), device="any"))
conv1d_constant.add(Impl("v5", conv1d_cuda_shared_const, "CUDA",
                         "filter in constant, input tile in shared", (*_SRC, _set_filter)))

"""Sum of a vector, step by step: from a divergent shared-memory tree to one pass with shuffles
and atomics.

Versions of ``reduce_sum`` (never renumbered); all CUDA kernels are in ``csrc/part3/reduce.cu``:

- v0  ``torch.sum(x, dtype=torch.float32)``: the library baseline.
- v1  CUDA, a shared-memory tree with interleaved addressing, ``if (tid % (2*s) == 0)``:
  divergent warps.
- v2  CUDA, like v1 with the active threads packed (``index = 2*s*tid``): no divergence,
  bank conflicts.
- v3  CUDA, like v2 with sequential addressing (``s = BLOCK/2 .. 1``, ``tid < s``): no
  conflicts either.
- v4  CUDA, like v3 with the first add done while loading (2 elements per thread): half the blocks.
- v5  CUDA, like v4 with the last warp's six steps unrolled, warp-synchronous (volatile
  + ``__syncwarp``).
- v6  CUDA, like v4 with every warp reducing in registers through ``__shfl_down_sync``: one barrier.
- v7  CUDA, like v6 with a GPU-filling grid-stride loop of float4 loads and one ``atomicAdd`` per
      block: one launch, one pass over the data.
- v8  Triton: one program per 4096 elements writes ``tl.sum`` of its block; launched again on the
      partial sums until one is left.

v1 to v6 write one partial sum per block and are launched again on the partial sums until one
value remains.

The result is a 0-d float32 tensor for every input dtype: the sum is accumulated in fp32 and never
rounded to fp16/bf16 (an fp16 sum of 2^20 values of about 1 would overflow fp16's 65504). v7 adds
the per-block sums with atomics in whatever order the blocks finish, so its last bits can change
from run to run; every other version, and ``torch.sum``, gives the same bits every time on the same
input. Cost: n * itemsize bytes read, n FLOPs. The goal: the best version reaches at least 90% of
the measured copy bandwidth at n = 2^28 fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "part3/reduce.cu"
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
FP32 = (torch.float32,)


# --8<-- [start:reference]
def reduce_sum_ref(x: torch.Tensor) -> torch.Tensor:
    """The sum of every element of x, as a 0-d tensor of at least float32 precision (float64 stays
    float64, which is how the tests build the exact answer). Reads n elements once, writes one: n *
    itemsize bytes, n - 1 additions (counted as n FLOPs)."""
    return torch.sum(x, dtype=torch.promote_types(x.dtype, torch.float32))
# --8<-- [end:reference]


def reduce_sum_torch(x: torch.Tensor) -> torch.Tensor:
    """v0: PyTorch's own reduction kernel, accumulating and returning float32."""
    return torch.sum(x, dtype=torch.float32)


# --8<-- [start:sum_error_bound]
def sum_error_bound(x: torch.Tensor) -> float:
    """An absolute error bound for an fp32 sum of x, scaled with its length: 8 * eps32 *
    (log2(n) + 1) * sum(|x|). A tree of depth d loses at most d * eps * sum(|x|) (each element takes
    part in d roundings); the factor 8 leaves room for the sequential parts (a thread's grid-stride
    loop, the atomics of v7)."""
    n = x.numel()
    return (8 * torch.finfo(torch.float32).eps * (math.log2(max(n, 1)) + 1)
            * x.double().abs().sum().item())
# --8<-- [end:sum_error_bound]


def _check_vector(x: torch.Tensor, dtypes: tuple, device: str) -> int:
    """A contiguous, non-empty tensor of one of ``dtypes`` on ``device`` (any shape: every element
    is summed); returns its number of elements."""
    check_tensors(("x",), (x,), dtypes=dtypes, device=device, allow_empty=False)
    return x.numel()


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part3/reduce.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
@dataclass(frozen=True)
class ReduceConfig:
    """How a CUDA version is launched. Each block has ``threads`` threads (BLOCK in the .cu file)
    and covers ``per_block`` elements per pass (v1-v6: one partial sum per block, relaunched on the
    partials) or per grid-stride iteration (``atomic``: a grid of SMs x resident blocks, one
    atomicAdd per block)."""

    kernel: str
    threads: int
    per_block: int
    atomic: bool = False
    options: tuple[str, ...] = ()


THREADS = 256  # 8 warps: 8 blocks fill an SM's 2048 thread slots
UNROLL = 4  # float4 loads in flight per thread per iteration of v7
CU_OPTIONS = cuda.defines(CU_FILE, BLOCK=THREADS, UNROLL=UNROLL)  # reduce.cu is compiled with them
CONFIGS = {
    "v1": ReduceConfig("reduce_v1", THREADS, THREADS),
    "v2": ReduceConfig("reduce_v2", THREADS, THREADS),
    "v3": ReduceConfig("reduce_v3", THREADS, THREADS),
    "v4": ReduceConfig("reduce_v4", THREADS, 2 * THREADS),
    "v5": ReduceConfig("reduce_v5", THREADS, 2 * THREADS),
    "v6": ReduceConfig("reduce_v6", THREADS, 2 * THREADS),
    # UNROLL float4 per thread per iteration
    "v7": ReduceConfig("reduce_v7", THREADS, 4 * UNROLL * THREADS, atomic=True),
    "cg": ReduceConfig("reduce_cg", THREADS, 4 * UNROLL * THREADS, atomic=True,
                       options=("-DREDUCE_WITH_CG",)),
}


def _grid_stride_blocks(fn, cfg: ReduceConfig, n: int, device: torch.device) -> int:
    """One wave of blocks: every SM holds as many as fit at once (occupancy calculator), but no more
    blocks than there are elements to give them."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(sms * cuda.resident_blocks(fn, cfg.threads), triton.cdiv(n, cfg.per_block)))


def _launch_reduce(x: torch.Tensor, cfg: ReduceConfig) -> torch.Tensor:
    """The one launcher of every CUDA version; returns a 0-d float32 tensor."""
    cuda.require_gpu()
    n = _check_vector(x, FP32, "cuda")
    fn = cuda.kernel(CU_FILE, cfg.kernel, CU_OPTIONS + cfg.options)
    if cfg.atomic:
        out = torch.zeros((), dtype=torch.float32, device=x.device)  # the atomics add onto 0
        cuda.launch(fn, _grid_stride_blocks(fn, cfg, n, x.device), cfg.threads,
                    (x, out, np.int64(n)))
        return out
    src = x
    while True:  # pass 1 on x, then on the partial sums: 2^28 -> 2^20 -> 4096 -> 16 -> 1 with v1
        blocks = triton.cdiv(n, cfg.per_block)
        partial = torch.empty(blocks, dtype=torch.float32, device=x.device)
        cuda.launch(fn, blocks, cfg.threads, (src, partial, np.int64(n)))
        if blocks == 1:
            return partial.reshape(())
        src, n = partial, blocks
# --8<-- [end:cuda_launch]


def reduce_interleaved_divergent(x: torch.Tensor) -> torch.Tensor:
    """v1: a tree in shared memory; at step s, threads whose index is a multiple of 2s add the
    element s away. The active threads are spread over every warp, so every warp diverges."""
    refuse_grad("reduce_interleaved_divergent", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v1"])


def reduce_interleaved(x: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but thread t does the addition at index 2*s*t, so the active threads are the
    first ones: whole warps idle instead of diverging. The accesses 2s words apart are
    bank conflicts."""
    refuse_grad("reduce_interleaved", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v2"])


def reduce_sequential(x: torch.Tensor) -> torch.Tensor:
    """v3: like v2, but the upper half is folded onto the lower half (s = BLOCK/2 down to 1):
    consecutive threads read consecutive words, so no bank conflicts."""
    refuse_grad("reduce_sequential", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v3"])


def reduce_first_add_on_load(x: torch.Tensor) -> torch.Tensor:
    """v4: like v3, but each thread adds two elements while loading: half the blocks, and no thread
    of the first step sits idle."""
    refuse_grad("reduce_first_add_on_load", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v4"])


def reduce_unrolled_warp(x: torch.Tensor) -> torch.Tensor:
    """v5: like v4, but once one warp is left its six steps run without block barriers (volatile
    shared memory, __syncwarp between read and write)."""
    refuse_grad("reduce_unrolled_warp", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v5"])


def reduce_shuffle(x: torch.Tensor) -> torch.Tensor:
    """v6: like v4, but each warp reduces in registers with __shfl_down_sync and only the 8 warp
    sums go through shared memory: one barrier instead of eight."""
    refuse_grad("reduce_shuffle", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v6"])


def reduce_vec4_atomic(x: torch.Tensor) -> torch.Tensor:
    """v7: like v6, but one wave of blocks strides over x with float4 loads (4 in flight per thread)
    and each block adds its sum to the output with one atomicAdd: one launch, one pass. The order of
    the atomics varies, so the last bits of the result can differ between runs."""
    refuse_grad("reduce_vec4_atomic", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["v7"])


def reduce_cg(x: torch.Tensor) -> torch.Tensor:
    """v7 with its warp reduce written with cooperative groups (cg::tiled_partition<32>,
    cg::reduce); shown in the warp-primitives chapter, tested, not benchmarked."""
    refuse_grad("reduce_cg", x, instead="torch.sum")
    return _launch_reduce(x, CONFIGS["cg"])


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
# 4096 elements per program and 8 warps: 16 fp32 per thread, loaded as 16-byte vectors (the Part 1
# vector add block). The compiler builds tl.sum from shuffles and a small shared-memory exchange
# between warps.
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _sum_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    # int64: pid * BLOCK passes 2**31 past 2**31 elements
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)    # past the end: 0, the identity of +
    # accumulate in fp32 whatever the input
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def reduce_sum_triton(x: torch.Tensor) -> torch.Tensor:
    """v8: one program per BLOCK elements writes its block's sum; the same kernel then sums the
    partial sums, until one is left (2^28 -> 65536 -> 16 -> 1). float32/float16/bfloat16 in, a 0-d
    float32 tensor out. No atomics: the same input gives the same bits every time."""
    refuse_grad("reduce_sum_triton", x, instead="torch.sum")
    n = _check_vector(x, FLOAT_TYPES, triton_device())
    src = x
    while True:
        programs = triton.cdiv(n, BLOCK)
        partial = torch.empty(programs, dtype=torch.float32, device=x.device)
        _sum_kernel[(programs,)](src, partial, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
        if programs == 1:
            return partial.reshape(())
        src, n = partial, programs
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# The same sum on the CPU, for the CPU-vs-GPU comparison
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cpu]
def reduce_sum_numpy(x: torch.Tensor) -> torch.Tensor:
    """v9: NumPy on the CPU (one thread, pairwise summation), for comparison with the
    GPU versions."""
    _check_vector(x, (torch.float32,), "cpu")
    return torch.from_numpy(np.asarray(np.sum(x.numpy(), dtype=np.float32)))


def reduce_sum_torch_cpu(x: torch.Tensor) -> torch.Tensor:
    """v10: torch.sum on the CPU (all cores), for comparison with the GPU versions."""
    _check_vector(x, (torch.float32,), "cpu")
    return torch.sum(x, dtype=torch.float32)
# --8<-- [end:cpu]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """n values drawn from N(1, 1) on the target device (from a seed taken from ``gen``: a 1 GiB
    input is not built on the host first). The mean of 1 makes the sum grow like n, so a relative
    tolerance means the same at every size; zero-mean data, where the sum cancels, is tested with
    sum_error_bound in the test module."""
    dev_gen = device_generator(gen, device)
    x = torch.randn(size["n"], generator=dev_gen, device=device, dtype=torch.float32) + 1.0
    return (x.to(dtype),)


def _bytes(size, dtype) -> int:
    return size["n"] * dtype.itemsize  # read once; the 4-byte result is noise


HEADLINE = {"n": 2**28}  # 1 GiB of fp32: about 17x the H200's L2
SWEEP = [{"n": 2**k} for k in (20, 22, 24, 26, 28)]
TEST_SIZES = [{"n": n} for n in (1, 2, 3, 31, 1000, 4097, 65537)]
SOURCES = (cuda.source_path(CU_FILE), _launch_reduce, _check_vector, _grid_stride_blocks)

reduce_sum = register(Op(
    name="reduce_sum", part=3, chapter="part3/reduction.md", title="Sum reduction",
    reference=reduce_sum_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP,
    dtypes=FP32, test_sizes=TEST_SIZES,
    # Sum of N(1, 1) values: |sum| ~ sum|x|, and an fp32 tree of depth log2(2^28) = 28 is within
    # 28 * 6e-8 = 1.7e-6 of it; 1e-5 leaves room for the sequential parts (grid-stride
    # loops, atomics).
    tolerances={torch.float32: (1e-5, 1e-5)}))
reduce_sum.add(Impl("v0", reduce_sum_torch, "PyTorch", "torch.sum(x, dtype=torch.float32)"))
reduce_sum.add(Impl("v1", reduce_interleaved_divergent, "CUDA",
                    "shared tree, interleaved, divergent", SOURCES))
reduce_sum.add(Impl("v2", reduce_interleaved, "CUDA", "shared tree, interleaved, bank conflicts",
                    SOURCES))
reduce_sum.add(Impl("v3", reduce_sequential, "CUDA", "shared tree, sequential addressing", SOURCES))
reduce_sum.add(Impl("v4", reduce_first_add_on_load, "CUDA", "first add during load", SOURCES))
reduce_sum.add(Impl("v5", reduce_unrolled_warp, "CUDA", "last warp unrolled, no barriers", SOURCES))
reduce_sum.add(Impl("v6", reduce_shuffle, "CUDA", "warp shuffles, one barrier", SOURCES))
reduce_sum.add(Impl("v7", reduce_vec4_atomic, "CUDA",
                    "grid-stride float4, shuffles, one atomic per block", SOURCES))
reduce_sum.add(Impl("v8", reduce_sum_triton, "Triton",
                    "tl.sum per 4096 elements, relaunched on partials",
                    (_sum_kernel, reduce_sum_triton), device="any"))
reduce_sum.add(Impl("v9", reduce_sum_numpy, "NumPy", "NumPy on the CPU (one thread)",
                    (_check_vector,), device="cpu", timer="host", origin="library"))
reduce_sum.add(Impl("v10", reduce_sum_torch_cpu, "PyTorch", "torch.sum on the CPU (all cores)",
                    (_check_vector,), device="cpu", timer="host", origin="library"))

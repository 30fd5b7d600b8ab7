"""Element-wise ops of Part 1: vector add, scale, ReLU and SAXPY in PyTorch, CUDA C and Triton.

Versions of ``vector_add`` (never renumbered):

- v0  ``torch.add``: the library baseline.
- v1  CUDA, one thread per element with a bounds check.
- v2  CUDA, like v1 but a fixed-size grid strides over the array: the grid no longer grows with n.
- v3  CUDA, like v2 but 16-byte ``float4`` loads and stores: a quarter of the memory instructions.
- v4  Triton: one program per block of ``BLOCK`` elements, a mask for the ragged end.
- v5  CUDA, like v3 but four float4 loads per array in flight per thread before the first store.

``scale``, ``relu`` and ``saxpy`` each have v0 (torch), v1 (CUDA, the v5 pattern) and v2 (Triton).

Every one of these ops reads and writes each element once, so its speed is set by memory bandwidth:
the cost model is bytes moved, and the ceiling is the measured device-to-device copy bandwidth.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_scalar, check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part1/elementwise.cu"
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


# --8<-- [start:reference]
def vector_add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """out = x + y. Reads 2n elements, writes n: 3 * n * itemsize bytes, n FLOPs."""
    return x + y


def scale_ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """out = alpha * x. 2 * n * itemsize bytes."""
    return alpha * x


def relu_ref(x: torch.Tensor) -> torch.Tensor:
    """out = max(x, 0), NaN stays NaN. 2 * n * itemsize bytes."""
    return torch.relu(x)


def saxpy_ref(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """out = alpha * x + y (BLAS "single-precision a*x plus y"). 3 * n * itemsize bytes,
    2n FLOPs."""
    return alpha * x + y
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton_add]
# 4096 elements per program and 8 warps (256 threads): each thread handles 16 fp32 elements as four
# 16-byte vectors, so many loads are in flight per SM to cover DRAM latency, and the grid
# stays small.
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # which block of BLOCK elements this program owns
    # int64 offsets: pid * BLOCK in int32 overflows once n passes 2**31 elements.
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # the last program runs past the end unless BLOCK divides n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    # Add in fp32 and round once on the store, as torch does for fp16/bf16 (and the CPU interpreter,
    # which has no bf16 arithmetic, needs it too).
    out = x.to(tl.float32) + y.to(tl.float32)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_triton(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v4: x + y with a Triton kernel, for float32/float16/bfloat16 tensors of one shape."""
    refuse_grad("add_triton", x, y, instead="x + y")
    check_tensors(("x", "y"), (x, y), dtypes=FLOAT_TYPES, device=triton_device(), allow_empty=False)
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)
    _add_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out

# --8<-- [end:triton_add]


# --8<-- [start:triton_map]
@triton.jit
def _map_kernel(x_ptr, y_ptr, out_ptr, n, alpha, OP: tl.constexpr, BLOCK: tl.constexpr):
    """One kernel, one compiled variant per OP: the branch on a constexpr costs nothing at
    run time."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # compute in fp32, store in the input's dtype
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if OP == "scale":
        out = alpha * x
    elif OP == "relu":
        out = tl.where(x < 0, 0.0, x)  # NaN < 0 is false: NaN stays NaN, as in torch.relu
    else:  # "saxpy"
        y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
        out = alpha * x + y
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _map_triton(op: str, x: torch.Tensor, y: torch.Tensor | None, alpha: float) -> torch.Tensor:
    tensors = (x,) if y is None else (x, y)
    refuse_grad(f"{op}_triton", *tensors)
    check_tensors(("x", "y")[: len(tensors)], tensors, dtypes=FLOAT_TYPES, device=triton_device(),
                  allow_empty=False)
    out = torch.empty_like(x)
    n = x.numel()
    _map_kernel[(triton.cdiv(n, BLOCK),)](x, x if y is None else y, out, n, alpha, OP=op,
                                          BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


def scale_triton(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """v2: alpha * x."""
    return _map_triton("scale", x, None, check_scalar("alpha", alpha))


def relu_triton(x: torch.Tensor) -> torch.Tensor:
    """v2: max(x, 0)."""
    return _map_triton("relu", x, None, 0.0)


def saxpy_triton(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v2: alpha * x + y."""
    return _map_triton("saxpy", x, y, check_scalar("alpha", alpha))
# --8<-- [end:triton_map]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part1/elementwise.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
THREADS = 256  # 8 warps per block; up to 8 such blocks fill an SM's 2048 thread slots
UNROLL = 4  # float4 groups per thread per step in the v5 pattern: VEC4_UNROLL in elementwise.cu
CU_OPTIONS = cuda.defines(CU_FILE, VEC4_UNROLL=UNROLL)  # the .cu is compiled with it


def _launch_elementwise(name: str, grid_stride: bool, vec: int, tensors: tuple,
                        scalars: tuple = ()):
    """The one launcher of every CUDA version: ``vec`` elements per thread per step, a grid sized to
    n (one thread per ``vec`` elements) or to the GPU (``grid_stride``): as many blocks as are
    resident at once on every SM, so the whole grid runs in one wave (the unrolled kernels use more
    registers, so fewer of their blocks fit)."""
    *inputs, out = tensors
    n = out.numel()
    fn = cuda.kernel(CU_FILE, name, CU_OPTIONS)
    blocks = triton.cdiv(n, THREADS * vec)
    if grid_stride:
        sms = torch.cuda.get_device_properties(out.device).multi_processor_count
        blocks = min(blocks, sms * cuda.resident_blocks(fn, THREADS))
    cuda.launch(fn, blocks, THREADS, (*inputs, out, np.int64(n), *scalars))
    return out


def _aligned16(*tensors: torch.Tensor) -> bool:
    """float4 access needs 16-byte aligned addresses; a contiguous view such as x[1:] is not."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _check_cuda(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    cuda.require_gpu()
    check_tensors(names, tensors, dtypes=(torch.float32,), device="cuda", allow_empty=False)
    return torch.empty_like(tensors[0])
# --8<-- [end:cuda_launch]


def add_cuda_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element."""
    refuse_grad("add_cuda_naive", x, y, instead="x + y")
    out = _check_cuda(("x", "y"), (x, y))
    return _launch_elementwise("vector_add_v1", False, 1, (x, y, out))


def add_cuda_grid_stride(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but one GPU-filling wave of blocks strides over the array."""
    refuse_grad("add_cuda_grid_stride", x, y, instead="x + y")
    out = _check_cuda(("x", "y"), (x, y))
    return _launch_elementwise("vector_add_v2", True, 1, (x, y, out))


def add_cuda_vec4(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v3: like v2, but float4 (16-byte) loads and stores; falls back to v2 for unaligned views."""
    refuse_grad("add_cuda_vec4", x, y, instead="x + y")
    out = _check_cuda(("x", "y"), (x, y))
    if not _aligned16(x, y, out):
        return _launch_elementwise("vector_add_v2", True, 1, (x, y, out))
    return _launch_elementwise("vector_add_v3", True, 4, (x, y, out))


def add_cuda_vec4_unrolled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v5: like v3, but 4 float4 loads per array in flight per thread; falls back to v2 for
    unaligned views."""
    refuse_grad("add_cuda_vec4_unrolled", x, y, instead="x + y")
    out = _check_cuda(("x", "y"), (x, y))
    if not _aligned16(x, y, out):
        return _launch_elementwise("vector_add_v2", True, 1, (x, y, out))
    return _launch_elementwise("vector_add_v5", True, 4 * UNROLL, (x, y, out))


def _map_cuda(name: str, tensors: tuple[torch.Tensor, ...], scalars: tuple = ()) -> torch.Tensor:
    """The unrolled float4 kernels of scale/relu/saxpy; unaligned views are copied to aligned
    storage first."""
    names = ("x", "y")[: len(tensors)]
    out = _check_cuda(names, tensors)
    # clone() allocates aligned memory
    tensors = tuple(t if _aligned16(t) else t.clone() for t in tensors)
    return _launch_elementwise(name, True, 4 * UNROLL, (*tensors, out), scalars)


def scale_cuda(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """v1: alpha * x, the v5 pattern of vector_add."""
    refuse_grad("scale_cuda", x)
    return _map_cuda("scale_vec4", (x,), (np.float32(check_scalar("alpha", alpha)),))


def relu_cuda(x: torch.Tensor) -> torch.Tensor:
    """v1: max(x, 0), the v5 pattern of vector_add."""
    refuse_grad("relu_cuda", x)
    return _map_cuda("relu_vec4", (x,))


def saxpy_cuda(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v1: alpha * x + y, the v5 pattern of vector_add (one fused multiply-add per element)."""
    refuse_grad("saxpy_cuda", x, y)
    return _map_cuda("saxpy_vec4", (x, y), (np.float32(check_scalar("alpha", alpha)),))


# --------------------------------------------------------------------------------------------------
# Registration: what the tests, the harness and the docs know about these ops
# --------------------------------------------------------------------------------------------------

ALPHA = 1.7  # a scalar with a full mantissa, so scaling is not exact in any dtype


def _inputs(count: int, with_alpha: str | None = None):
    """Input generator for element-wise ops: ``count`` random tensors of n elements
    (never zeros)."""
    def make(size, dtype, device, gen):
        ts = [torch.randn(size["n"], generator=gen,
                          dtype=torch.float32).to(device=device, dtype=dtype)
              for _ in range(count)]
        if with_alpha == "first":
            return (ALPHA, *ts)
        if with_alpha == "last":
            return (*ts, ALPHA)
        return tuple(ts)
    return make


def _bytes(tensors: int):
    return lambda size, dtype: tensors * size["n"] * dtype.itemsize


HEADLINE = {"n": 2**28}  # 1 GiB per fp32 tensor: 20x the H200's L2, fills every SM many times over
SWEEP = [{"n": 2**k} for k in range(12, 29, 2)]
TEST_SIZES = [{"n": n} for n in (1, 17, 1000, 4096, 4097, 65536 + 3)]
BENCH = dict(metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
             test_sizes=TEST_SIZES, part=1, chapter="part1/elementwise.md")
FP32 = (torch.float32,)

vector_add = register(Op(
    name="vector_add", title="Vector add", reference=vector_add_ref, make_inputs=_inputs(2),
    bytes_moved=_bytes(3), flops=lambda s, d: s["n"], **BENCH))
vector_add.add(Impl("v0", torch.add, "PyTorch", "torch.add"))
vector_add.add(Impl("v1", add_cuda_naive, "CUDA", "one thread per element",
                    (cuda.source_path(CU_FILE), _launch_elementwise), dtypes=FP32))
vector_add.add(Impl("v2", add_cuda_grid_stride, "CUDA", "grid-stride loop",
                    (cuda.source_path(CU_FILE), _launch_elementwise), dtypes=FP32))
vector_add.add(Impl("v3", add_cuda_vec4, "CUDA", "grid-stride, float4 loads",
                    (cuda.source_path(CU_FILE), _launch_elementwise), dtypes=FP32))
vector_add.add(Impl("v4", add_triton, "Triton", "one program per 4096 elements", (_add_kernel,),
                    device="any"))
vector_add.add(Impl("v5", add_cuda_vec4_unrolled, "CUDA", "grid-stride, 4 float4 loads in flight",
                    (cuda.source_path(CU_FILE), _launch_elementwise), dtypes=FP32))

scale = register(Op(
    name="scale", title="Scalar multiply", reference=scale_ref, make_inputs=_inputs(1, "last"),
    bytes_moved=_bytes(2), flops=lambda s, d: s["n"], **BENCH))
scale.add(Impl("v0", torch.mul, "PyTorch", "torch.mul"))
scale.add(Impl("v1", scale_cuda, "CUDA", "grid-stride, 4 float4 loads in flight",
               (cuda.source_path(CU_FILE), _map_cuda, _launch_elementwise), dtypes=FP32))
scale.add(Impl("v2", scale_triton, "Triton", "one program per 4096 elements",
               (_map_kernel, _map_triton), device="any"))

relu = register(Op(
    name="relu", title="ReLU", reference=relu_ref, make_inputs=_inputs(1),
    bytes_moved=_bytes(2), flops=lambda s, d: s["n"], **BENCH))
relu.add(Impl("v0", torch.relu, "PyTorch", "torch.relu"))
relu.add(Impl("v1", relu_cuda, "CUDA", "grid-stride, 4 float4 loads in flight",
              (cuda.source_path(CU_FILE), _map_cuda, _launch_elementwise), dtypes=FP32))
relu.add(Impl("v2", relu_triton, "Triton", "one program per 4096 elements",
              (_map_kernel, _map_triton), device="any"))


def _saxpy_torch(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(y, x, alpha=alpha)  # one kernel: y + alpha * x


saxpy = register(Op(
    name="saxpy", title="SAXPY", reference=saxpy_ref, make_inputs=_inputs(2, "first"),
    bytes_moved=_bytes(3), flops=lambda s, d: 2 * s["n"], **BENCH))
saxpy.add(Impl("v0", _saxpy_torch, "PyTorch", "torch.add(y, x, alpha=a)"))
saxpy.add(Impl("v1", saxpy_cuda, "CUDA", "grid-stride, 4 float4 loads in flight",
               (cuda.source_path(CU_FILE), _map_cuda, _launch_elementwise), dtypes=FP32))
saxpy.add(Impl("v2", saxpy_triton, "Triton", "one program per 4096 elements",
               (_map_kernel, _map_triton), device="any"))

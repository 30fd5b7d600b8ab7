"""Coalescing: a copy whose loads are strided or misaligned, out[i] = x[offset + i * stride] for i
< n.

Two ops share one set of implementations:

- ``strided_copy`` sweeps the stride (1, 2, 4, ..., 32 elements; offset 0): how many bytes a warp's
  32 loads drag across the memory bus when its addresses spread out.
- ``offset_copy`` sweeps the offset (0, 1, 4, 16, 32 elements; stride 1): a dense copy that starts
  off a sector, line or 16-byte boundary.

Versions (never renumbered):

- v0  PyTorch: ``x[offset::stride][:n].clone()``, the copy kernel torch runs for a strided view.
- v1  CUDA, one thread per output element, 4-byte loads and stores.
- v2  CUDA, like v1 but 16-byte ``float4`` loads and stores when the copy is dense and aligned
      (stride 1, ``x + offset`` on a 16-byte boundary): a quarter of the memory instructions.
      Otherwise it runs v1.
- v3  Triton: one program per 4096 outputs; the compiler vectorizes by itself when it can prove
      stride 1 and 16-byte alignment, which it specializes on at launch.

The cost model counts the *useful* bytes only: n floats read and n written, 8n bytes whatever the
stride. The hardware moves whole 32-byte sectors, so a strided load moves more bytes than it uses,
and the rate reported is the *effective* bandwidth: it falls as the stride grows, which is the point
of the measurement.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_int as _int
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part2/coalescing.cu"
SECTOR = 32  # bytes: the unit in which L1, L2 and DRAM move data on every NVIDIA GPU since Maxwell


# --8<-- [start:reference]
def strided_copy_ref(x: torch.Tensor, n: int, stride: int = 1, offset: int = 0) -> torch.Tensor:
    """out[i] = x[offset + i * stride] for i < n: a gather by index.
    Reads n elements and writes n: 8n useful bytes in fp32, however far apart the reads are."""
    idx = offset + stride * torch.arange(n, device=x.device)
    return x[idx]
# --8<-- [end:reference]


# --8<-- [start:sectors]
def sectors_touched(n: int, stride: int, offset: int = 0, itemsize: int = 4) -> int:
    """How many distinct 32-byte sectors hold x[offset + i * stride] for i < n, when x starts on a
    sector boundary (as every allocation does). A warp's load is served sector by sector, so for n =
    32 this is the number of sectors one warp-wide load instruction needs."""
    # byte address of each read
    addr = (offset + stride * torch.arange(n, dtype=torch.int64)) * itemsize
    return int(torch.unique(addr // SECTOR).numel())
# --8<-- [end:sectors]


def _check(x: torch.Tensor, n: int, stride: int, offset: int, device: str) -> tuple[int, int, int]:
    """Validate a strided copy: ints first (so they are checked even without a GPU), then the
    tensor, then that the last index read, offset + (n - 1) * stride, is inside x."""
    n, stride, offset = _int("n", n, 1), _int("stride", stride, 1), _int("offset", offset, 0)
    check_tensors(("x",), (x,), dtypes=(torch.float32,), device=device, allow_empty=False)
    if x.dim() != 1:
        raise ValueError(f"x must be one-dimensional, got shape {tuple(x.shape)}")
    last = offset + (n - 1) * stride
    if last >= x.numel():
        raise ValueError(f"out[{n - 1}] would read x[{last}] (offset {offset} + {n - 1} * stride "
                         f"{stride}), but x has only {x.numel()} elements")
    return n, stride, offset


def strided_copy_torch(x: torch.Tensor, n: int, stride: int = 1, offset: int = 0) -> torch.Tensor:
    """v0: slice a strided view and copy it into fresh contiguous memory (torch's strided copy
    kernel). ``clone`` with ``contiguous_format``, not ``.contiguous()``: for stride 1 the view is
    already contiguous and ``.contiguous()`` would return it without copying anything."""
    n, stride, offset = _check(x, n, stride, offset,
                               x.device.type if isinstance(x, torch.Tensor) else "cuda")
    return x[offset::stride][:n].clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
BLOCK = 4096  # outputs per program; 8 warps: 16 per thread, as in Part 1's element-wise kernels
NUM_WARPS = 8


@triton.jit
def _strided_copy_kernel(src_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Triton compiles a variant for stride == 1 (a run-time 1 is specialized into the kernel), and
    # one per 16-byte alignment of src_ptr: only when both hold can it prove the loads contiguous
    # and vectorize them.
    vals = tl.load(src_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, vals, mask=mask)


def strided_copy_triton(x: torch.Tensor, n: int, stride: int = 1, offset: int = 0) -> torch.Tensor:
    """v3: like v1, but in Triton, one program per 4096 outputs; the compiler picks the load width
    itself. The offset is folded into the pointer (``x[offset:]``), so the launch sees the real
    alignment of the first element read."""
    refuse_grad("strided_copy_triton", x, instead="x[offset::stride][:n]")
    n, stride, offset = _check(x, n, stride, offset, triton_device())
    out = torch.empty(n, device=x.device, dtype=x.dtype)
    _strided_copy_kernel[(triton.cdiv(n, BLOCK),)](x[offset:], out, n, stride, BLOCK=BLOCK,
                                                   num_warps=NUM_WARPS)
    return out
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part2/coalescing.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
THREADS = 256


def _aligned16(*tensors: torch.Tensor) -> bool:
    """float4 access needs 16-byte aligned addresses; a view such as x[1:] starts 4 bytes in."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _launch(x: torch.Tensor, n: int, stride: int, offset: int, vec4: bool) -> torch.Tensor:
    """The one launcher of both CUDA versions. The float4 kernel is used only where it is valid: a
    dense copy (stride 1) whose source x + offset and destination are both 16-byte aligned; anything
    else runs the scalar kernel, one thread per output."""
    out = torch.empty(n, device=x.device, dtype=x.dtype)
    src = x[offset:]  # a view: its data_ptr() is the address of x[offset]
    if vec4 and stride == 1 and _aligned16(src, out):
        fn = cuda.kernel(CU_FILE, "copy_vec4")
        cuda.launch(fn, triton.cdiv(triton.cdiv(n, 4), THREADS), THREADS, (src, out, np.int64(n)))
    else:
        fn = cuda.kernel(CU_FILE, "strided_copy_v1")
        cuda.launch(fn, triton.cdiv(n, THREADS), THREADS,
                    (x, out, np.int64(n), np.int64(stride), np.int64(offset)))
    return out
# --8<-- [end:cuda_launch]


def strided_copy_cuda(x: torch.Tensor, n: int, stride: int = 1, offset: int = 0) -> torch.Tensor:
    """v1: one thread per output element, a 4-byte load and a 4-byte store each."""
    refuse_grad("strided_copy_cuda", x, instead="x[offset::stride][:n]")
    n, stride, offset = _check(x, n, stride, offset, "cuda")
    return _launch(x, n, stride, offset, vec4=False)


def strided_copy_cuda_vec4(x: torch.Tensor, n: int, stride: int = 1,
                           offset: int = 0) -> torch.Tensor:
    """v2: like v1, but 16-byte float4 loads and stores for a dense, aligned copy (stride 1 and x +
    offset on a 16-byte boundary); any other stride or offset runs v1's kernel."""
    refuse_grad("strided_copy_cuda_vec4", x, instead="x[offset::stride][:n]")
    n, stride, offset = _check(x, n, stride, offset, "cuda")
    return _launch(x, n, stride, offset, vec4=True)


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def make_strided_input(n: int, stride: int, offset: int, gen: torch.Generator,
                       device: str) -> torch.Tensor:
    """The smallest x that a copy of n elements at this stride and offset reads from: offset +
    (n-1)*stride + 1 floats. The n elements read are random; every other element is NaN, so a kernel
    that reads a wrong index returns NaN, which no comparison with the reference lets through."""
    x = torch.full((offset + (n - 1) * stride + 1,), float("nan"), device=device)
    x[offset::stride] = torch.randn(n, generator=gen).to(device)
    return x


def _make_inputs(size, dtype, device, gen):
    n, stride, offset = size["n"], size["stride"], size["offset"]
    return make_strided_input(n, stride, offset, gen, device).to(dtype), n, stride, offset


# 2^25 outputs: 128 MiB read and 128 MiB written at stride 1, four times the H200's 60 MB L2. At
# stride 32 the input spans 4 GiB (the copy reads one float in 32 of it), yet the reads move at most
# one 32-byte sector per float: 1 GiB, so every point stays quick to time.
N = 2**25
STRIDES = (1, 2, 4, 8, 16, 32)
# Offsets in elements, in order of decreasing alignment of the first element read: 0 and 32 (128 B,
# a whole line), 16 (64 B), 4 (16 B: still a float4 boundary), 1 (4 B: no boundary at all).
OFFSETS = (0, 32, 16, 4, 1)
FP32 = (torch.float32,)
COMMON = dict(part=2, chapter="part2/coalescing.md", reference=strided_copy_ref,
              make_inputs=_make_inputs, bytes_moved=lambda s, d: 2 * s["n"] * d.itemsize,
              flops=lambda s, d: 0, metric="GB/s", ceiling="copy", dtypes=FP32,
              tolerances={torch.float32: (0.0, 0.0)})  # a copy is exact

# Each headline is its op's last sweep point, the far end of the lesson (stride 32, offset 1): so
# the tables of every size list the sweep in its order, and the headline shows what the access
# pattern costs.
strided_copy = register(Op(
    name="strided_copy", title="Strided copy",
    headline={"n": N, "stride": STRIDES[-1], "offset": 0},
    sweep=[{"n": N, "stride": s, "offset": 0} for s in STRIDES], sweep_axis="stride",
    test_sizes=[{"n": n, "stride": s, "offset": o} for n in (1, 17, 1000, 4097)
                for s in (1, 2, 3, 8, 33) for o in (0, 1)],
    **COMMON))

offset_copy = register(Op(
    name="offset_copy", title="Misaligned copy",
    headline={"n": N, "stride": 1, "offset": OFFSETS[-1]},
    sweep=[{"n": N, "stride": 1, "offset": o} for o in OFFSETS], sweep_axis="offset",
    test_sizes=[{"n": n, "stride": 1, "offset": o} for n in (1, 5, 4099)
                for o in (0, 1, 2, 3, 4, 5, 16, 33)],
    **COMMON))

_SOURCES = (cuda.source_path(CU_FILE), _launch)
for _op in (strided_copy, offset_copy):
    _op.add(Impl("v0", strided_copy_torch, "PyTorch", "x[offset::stride][:n].clone()"))
    _op.add(Impl("v1", strided_copy_cuda, "CUDA", "one thread per output", _SOURCES, dtypes=FP32))
    _op.add(Impl("v2", strided_copy_cuda_vec4, "CUDA", "float4 when dense and aligned, else v1",
                 _SOURCES, dtypes=FP32))
    _op.add(Impl("v3", strided_copy_triton, "Triton", "one program per 4096 outputs",
                 (_strided_copy_kernel,), device="any"))

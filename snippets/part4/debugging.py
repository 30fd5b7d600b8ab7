"""Debugging Triton: the tools (interpreter, pdb, prints, asserts) and the common bugs, each with
its fix.

Every bug here is a small kernel next to its corrected version, so that the tests can show the bug
happening (a wrong answer, a clobbered neighbour, an exception with Triton's own message) and the
fix curing it.

Tools:

- ``_print_kernel``: ``tl.device_print`` and ``print`` inside a kernel.
- ``_scale_kernel``: a ``breakpoint()`` behind a constexpr switch, for pdb under the interpreter.
- ``_group_sums_kernel``: ``tl.static_assert`` on the block sizes (a compile-time check with
  a reason).
- ``_log_kernel``: ``tl.device_assert`` (kept only when the kernel is compiled with debug on).

Bugs and fixes:

- missing mask: ``_double_unmasked`` / ``_double_masked``
- wrong strides: ``_row_sums_assume_contiguous`` / ``_row_sums``
- runtime value as a shape: ``_fill_runtime_shape`` / ``_fill``
- block size not a power of two: ``fill_wrong_block`` / ``fill`` (same kernel, host picks BLOCK)
- accumulator in a 16-bit dtype: ``_sum_acc_input_dtype`` / ``_sum_acc_fp32``
- true division in an index: ``_repeat2_true_div`` / ``_repeat2``
- int32 offsets past 2**31: ``_offsets_int32`` / ``_offsets_int64``
- Python ``if`` on a block: ``_relu_python_if`` / ``_relu_where``
- many programs writing one place: ``_total_kernel`` with MODE "store", "load_add_store" (bugs),
  "atomic" (fix)
- too much shared memory: :func:`oversized_gemm_config`, :func:`out_of_resources_message`
"""

from __future__ import annotations

import io
import pdb
import sys
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device

FLOAT_TYPES = (torch.float32, torch.float16)


def _check(names, tensors, dtypes=FLOAT_TYPES, **kw) -> None:
    """Every example's checks: its kernels are forward-only, so grad-tracking inputs are refused
    too, in the name of the function that called this one."""
    refuse_grad(sys._getframe(1).f_code.co_name, *tensors)
    check_tensors(names, tensors, dtypes=dtypes, device=triton_device(), allow_empty=False, **kw)


# --------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------

# --8<-- [start:print]
@triton.jit
def _print_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    # a GPU prints one line per element; the interpreter one line per program
    tl.device_print("x", x)
    if pid == 0:             # an if on a scalar is fine (on a block it is not: see _relu_python_if)
        print("first block max", tl.max(x, axis=0))  # print in a kernel is device_print


def debug_print(x: torch.Tensor, block: int = 4) -> None:
    """Print x from inside a kernel, ``block`` elements per program."""
    _check(("x",), (x,), dtypes=(torch.float32,))
    _print_kernel[(triton.cdiv(x.numel(), block),)](x, x.numel(), BLOCK=block)
# --8<-- [end:print]


# --------------------------------------------------------------------------------------------------
# pdb under the interpreter
# --------------------------------------------------------------------------------------------------

# --8<-- [start:breakpoint]
@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, BREAK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = alpha * x
    if BREAK:  # a constexpr: when False, the compiler never sees the breakpoint() below
        breakpoint()
    tl.store(out_ptr + offs, y, mask=mask)


def scale(x: torch.Tensor, alpha: float, block: int = 4, stop: bool = False) -> torch.Tensor:
    """alpha * x; with ``stop=True`` (interpreter only) every program stops in pdb before
    its store."""
    _check(("x",), (x,), dtypes=(torch.float32,))
    out = torch.empty_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), alpha, BLOCK=block,
                                                    BREAK=stop)
    return out
# --8<-- [end:breakpoint]


def pdb_transcript(commands: list[str], fn: Callable[..., Any], *args, **kwargs) -> str:
    """Run ``fn(*args, **kwargs)`` with every ``breakpoint()`` answered by ``commands`` (the same
    list at each stop), and return what pdb printed: an interactive session, scripted so a test can
    check it."""
    out = io.StringIO()

    def hook(*_a, **_k):
        debugger = pdb.Pdb(stdin=io.StringIO("\n".join(commands) + "\n"), stdout=out)
        debugger.use_rawinput = False
        # stop in the frame that called breakpoint(): the kernel
        debugger.set_trace(sys._getframe(1))

    saved = sys.breakpointhook
    sys.breakpointhook = hook
    try:
        fn(*args, **kwargs)
    finally:
        sys.breakpointhook = saved
    return out.getvalue()


# --------------------------------------------------------------------------------------------------
# Compile-time and run-time assertions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:static_assert]
@triton.jit
def _group_sums_kernel(x_ptr, out_ptr, n_groups, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """out[g] = sum of x[g * GROUP : (g + 1) * GROUP]; each program sums BLOCK // GROUP
    whole groups."""
    tl.static_assert(BLOCK % GROUP == 0,
                     "BLOCK must be a multiple of GROUP: a program sums whole groups")
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n_groups * GROUP, other=0.0).to(tl.float32)
    sums = tl.sum(tl.reshape(x, (BLOCK // GROUP, GROUP)), axis=1)
    groups = pid * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
    tl.store(out_ptr + groups, sums, mask=groups < n_groups)


def group_sums(x: torch.Tensor, group: int, block: int = 256) -> torch.Tensor:
    """Sums of consecutive groups of ``group`` elements (x.numel() must be a multiple of it),
    in float32."""
    _check(("x",), (x,))
    if x.numel() % group:
        raise ValueError(f"x has {x.numel()} elements, not a multiple of group={group}")
    out = torch.empty(x.numel() // group, dtype=torch.float32, device=x.device)
    _group_sums_kernel[(triton.cdiv(x.numel(), block),)](x, out, out.numel(), BLOCK=block,
                                                         GROUP=group)
    return out
# --8<-- [end:static_assert]


# --8<-- [start:device_assert]
@triton.jit
def _log_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    # Checked only when compiled with debug (TRITON_DEBUG=1 or @triton.jit(debug=True)); compiled
    # away otherwise, and (Triton 3.9) skipped by the interpreter.
    tl.device_assert(x > 0, "log of a value <= 0")
    tl.store(out_ptr + offs, tl.log(x), mask=mask)


def log(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Natural log of a positive float32 tensor."""
    _check(("x",), (x,), dtypes=(torch.float32,))
    out = torch.empty_like(x)
    _log_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out
# --8<-- [end:device_assert]


# --------------------------------------------------------------------------------------------------
# Bug: a missing mask
# --------------------------------------------------------------------------------------------------

# --8<-- [start:mask]
@triton.jit
def _double_unmasked(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)          # BUG: the last program reads past the end of x ...
    tl.store(out_ptr + offs, 2 * x)    # ... and writes past the end of out


@triton.jit
def _double_masked(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n                    # FIX: lanes past the end neither load nor store
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 2 * x, mask=mask)


def double(x: torch.Tensor, out: torch.Tensor, masked: bool = True,
           block: int = 128) -> torch.Tensor:
    """out = 2 * x, with the masked (correct) or the unmasked (buggy) kernel."""
    _check(("x", "out"), (x, out))
    kernel = _double_masked if masked else _double_unmasked
    kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out
# --8<-- [end:mask]


# --------------------------------------------------------------------------------------------------
# Bug: wrong strides
# --------------------------------------------------------------------------------------------------

# --8<-- [start:strides]
@triton.jit
def _row_sums_assume_contiguous(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    # BUG: assumes row-major
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _row_sums(x_ptr, out_ptr, n_cols, stride_row, stride_col, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # FIX: strides
    x = tl.load(x_ptr + row * stride_row + cols * stride_col, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0))


def row_sums_buggy(x: torch.Tensor) -> torch.Tensor:
    """Row sums of a 2-D tensor that the kernel assumes is contiguous; nothing checks it."""
    _check(("x",), (x,), contiguous=False)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _row_sums_assume_contiguous[(x.shape[0],)](x, out, x.shape[1],
                                               BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def row_sums(x: torch.Tensor) -> torch.Tensor:
    """Row sums of any 2-D view: the strides travel with the pointer (x.contiguous() would also do,
    at the price of a copy)."""
    _check(("x",), (x,), contiguous=False)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _row_sums[(x.shape[0],)](x, out, x.shape[1], x.stride(0), x.stride(1),
                             BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
# --8<-- [end:strides]


# --------------------------------------------------------------------------------------------------
# Bugs: shapes that are not compile-time powers of two
# --------------------------------------------------------------------------------------------------

# --8<-- [start:shapes]
@triton.jit
def _fill_runtime_shape(out_ptr, n, value):
    offs = tl.arange(0, n)  # BUG: a block's shape must be known when the kernel is compiled
    tl.store(out_ptr + offs, value)


@triton.jit
def _fill(out_ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # FIX: a constexpr power of two ...
    tl.store(out_ptr + offs, value, mask=offs < n)         # ... and a mask for the rest


def fill_runtime_shape(out: torch.Tensor, value: float) -> torch.Tensor:
    _check(("out",), (out,), dtypes=(torch.float32,))
    _fill_runtime_shape[(1,)](out, out.numel(), value)
    return out


def fill_wrong_block(out: torch.Tensor, value: float) -> torch.Tensor:
    _check(("out",), (out,), dtypes=(torch.float32,))
    _fill[(1,)](out, out.numel(), value, BLOCK=out.numel())  # BUG: 100 elements -> BLOCK=100
    return out


def fill(out: torch.Tensor, value: float, max_block: int = 1024) -> torch.Tensor:
    _check(("out",), (out,), dtypes=(torch.float32,))
    n = out.numel()
    block = min(triton.next_power_of_2(n), max_block)  # FIX: round up; the mask covers the excess
    _fill[(triton.cdiv(n, block),)](out, n, value, BLOCK=block)
    return out
# --8<-- [end:shapes]


# --------------------------------------------------------------------------------------------------
# Bugs: dtypes
# --------------------------------------------------------------------------------------------------

# --8<-- [start:accumulate]
@triton.jit
def _sum_acc_input_dtype(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # BUG: an fp16 running sum stops growing at 2048
    acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc.to(tl.float32), axis=0))


@triton.jit
def _sum_acc_fp32(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)  # FIX: accumulate in fp32, whatever the input
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr, tl.sum(acc, axis=0))


def sum_one_program(x: torch.Tensor, fp32_accumulator: bool = True,
                    block: int = 16) -> torch.Tensor:
    """The sum of x by a single program that strides over it with a ``block``-wide running sum."""
    _check(("x",), (x,))
    out = torch.empty((), dtype=torch.float32, device=x.device)
    kernel = _sum_acc_fp32 if fp32_accumulator else _sum_acc_input_dtype
    kernel[(1,)](x, out, x.numel(), BLOCK=block)
    return out
# --8<-- [end:accumulate]


# --8<-- [start:true_div]
@triton.jit
def _repeat2_true_div(x_ptr, out_ptr, n_out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # BUG: / is true division: a float, not an index
    x = tl.load(x_ptr + offs / 2, mask=offs < n_out)
    tl.store(out_ptr + offs, x, mask=offs < n_out)


@triton.jit
def _repeat2(x_ptr, out_ptr, n_out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs // 2, mask=offs < n_out)  # FIX: // keeps integers integers
    tl.store(out_ptr + offs, x, mask=offs < n_out)


def repeat2(x: torch.Tensor, buggy: bool = False, block: int = 64) -> torch.Tensor:
    """Each element of x twice: x.repeat_interleave(2), by a kernel."""
    _check(("x",), (x,))
    out = torch.empty(2 * x.numel(), dtype=x.dtype, device=x.device)
    kernel = _repeat2_true_div if buggy else _repeat2
    kernel[(triton.cdiv(out.numel(), block),)](x, out, out.numel(), BLOCK=block)
    return out
# --8<-- [end:true_div]


# --------------------------------------------------------------------------------------------------
# Bug: 32-bit offsets
# --------------------------------------------------------------------------------------------------

# --8<-- [start:overflow]
@triton.jit
def _offsets_int32(out_ptr, first_pid, BLOCK: tl.constexpr):
    pid = first_pid + tl.program_id(0)           # an int32: program ids and small int arguments are
    offs = pid * BLOCK + tl.arange(0, BLOCK)     # BUG: int32 * int32 wraps past 2**31 - 1
    tl.store(out_ptr + tl.arange(0, BLOCK), offs.to(tl.int64))


@triton.jit
def _offsets_int64(out_ptr, first_pid, BLOCK: tl.constexpr):
    pid = (first_pid + tl.program_id(0)).to(tl.int64)  # FIX: widen before multiplying
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.arange(0, BLOCK), offs)


def element_offsets(pid: int, block: int, wide: bool = True,
                    device: str | None = None) -> torch.Tensor:
    """The element offsets that program ``pid`` of a 1-D kernel with ``block`` elements per program
    computes, in int32 arithmetic (``wide=False``, the bug) or int64. No tensor of that size is
    needed to see them."""
    out = torch.empty(block, dtype=torch.int64, device=device or triton_device())
    (_offsets_int64 if wide else _offsets_int32)[(1,)](out, pid, BLOCK=block)
    return out
# --8<-- [end:overflow]


# --------------------------------------------------------------------------------------------------
# Bug: Python control flow on a block
# --------------------------------------------------------------------------------------------------

# --8<-- [start:python_if]
@triton.jit
def _relu_python_if(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if x < 0:  # BUG: one branch for the whole block, but x < 0 is BLOCK booleans
        x = 0.0 * x
    tl.store(out_ptr + offs, x, mask=offs < n)


@triton.jit
def _relu_where(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    x = tl.where(x < 0, 0.0, x)        # FIX: choose per element
    tl.store(out_ptr + offs, x, mask=offs < n)


def relu(x: torch.Tensor, buggy: bool = False, block: int = 64) -> torch.Tensor:
    _check(("x",), (x,))
    out = torch.empty_like(x)
    kernel = _relu_python_if if buggy else _relu_where
    kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out
# --8<-- [end:python_if]


# --------------------------------------------------------------------------------------------------
# Bug: many programs, one output
# --------------------------------------------------------------------------------------------------

# --8<-- [start:race]
@triton.jit
def _total_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    if MODE == "store":
        tl.store(out_ptr, part)                        # BUG: the last program to store wins
    elif MODE == "load_add_store":
        tl.store(out_ptr, tl.load(out_ptr) + part)     # BUG: two programs read the same old value
    else:
        tl.atomic_add(out_ptr, part)                   # FIX: one indivisible read-modify-write


MODES = ("store", "load_add_store", "atomic")


def total(x: torch.Tensor, mode: str = "atomic", block: int = 256) -> torch.Tensor:
    """The sum of a float32 or int32 tensor, each program adding its block's sum to one output."""
    _check(("x",), (x,), dtypes=(torch.float32, torch.int32))
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    out = torch.zeros((), dtype=x.dtype, device=x.device)
    _total_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block, MODE=mode)
    return out
# --8<-- [end:race]


# --------------------------------------------------------------------------------------------------
# Shared memory beyond the SM's limit
# --------------------------------------------------------------------------------------------------

# --8<-- [start:out_of_resources]
# The most shared memory one block may use on sm_90 (H100/H200): 227 KB = 232448 bytes, the opt-in
# limit in NVIDIA's CUDA C++ Programming Guide (technical specifications per compute capability). A
# launch asks the driver; this constant only lets a CPU check say in advance what the GPU
# will answer.
SM90_MAX_SHARED_PER_BLOCK = 227 * 1024


def oversized_gemm_config() -> dict:
    """A config of the Part 3 GEMM (snippets/part3/wmma.py) whose pipeline needs more shared memory
    than an H100 has per block: 4 stages of a 256 x 64 tile of A and a 64 x 256 tile of B in fp16,
    4 * (256 * 64 + 64 * 256) * 2 bytes = 256 KB."""
    return dict(BLOCK_M=256, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, INPUT_PRECISION="tf32",
                num_warps=8, num_stages=4)


def out_of_resources_message(required: int, limit: int = SM90_MAX_SHARED_PER_BLOCK) -> str:
    """The message of the OutOfResources error that a launch raises when a kernel needs ``required``
    bytes of shared memory and the device allows ``limit``, built by Triton's own
    exception class."""
    from triton.runtime.errors import OutOfResources
    return str(OutOfResources(required, limit, "shared memory"))
# --8<-- [end:out_of_resources]

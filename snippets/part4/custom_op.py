"""From a book kernel to a PyTorch operator (docs/part4/custom-ops.md).

A kernel called from Python is invisible to PyTorch: autograd cannot differentiate it,
``torch.compile`` breaks its graph around it (or traces into Python it cannot follow), and
``torch.export`` cannot save it. Registering it with ``torch.library`` makes it an operator like
``torch.ops.aten.mul``: it gets a schema, a fake implementation (shapes and dtypes without running
anything, which is what the compiler traces with), and a backward. Two routes, each with a kernel
of the book:

- **A Triton kernel.** Part 4's seeded dropout (``snippets.common.dropout.dropout_kernel``) as
  ``kernels_measured::seeded_dropout``, a ``torch.library.custom_op`` with ``register_fake`` and
  ``register_autograd``: the compiler treats it as a black box and calls it as it is. And as
  ``kernels_measured::seeded_dropout_traceable``, a ``torch.library.triton_op`` whose kernel launch
  goes through ``wrap_triton``, so that ``torch.compile`` sees the Triton kernel itself and can
  schedule it with the code around it. Both run on the CPU through Triton's interpreter.
- **A CUDA C kernel.** The softmax of ``csrc/part4/softmax.cu`` (Part 4's v5), compiled with
  ``torch.utils.cpp_extension.load_inline`` together with a small launcher and a C++ wrapper, and
  registered as ``kernels_measured::softmax_cuda``. Building and running it needs a GPU and nvcc;
  the CUDA translation unit and the C++ wrapper are compile-checked without a GPU by the tests.

The backward of dropout is dropout of the incoming gradient with the same seed (the keep bits are
regenerated, never stored); the backward of softmax is ``y * (dy - sum(dy * y))`` row by row,
computed from the saved output.
"""

from __future__ import annotations

import functools

import torch
import triton
from torch.library import custom_op, triton_op, wrap_triton

from snippets import cuda
from snippets.common.dropout import BLOCK, NUM_WARPS, check_dropout_args, dropout_kernel
from snippets.part4 import softmax

NAMESPACE = "kernels_measured"


# --------------------------------------------------------------------------------------------------
# A Triton kernel as an opaque custom op
# --------------------------------------------------------------------------------------------------

# --8<-- [start:custom_op]
@custom_op(f"{NAMESPACE}::seeded_dropout", mutates_args=())
def seeded_dropout_op(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """y = x * keep / (1 - p), keep regenerated from (seed, element index): Part 4's dropout
    kernel behind an operator. The schema (Tensor x, float p, int seed) -> Tensor is read from the
    type hints; mutates_args=() promises that no input is written."""
    p, scale, seed = check_dropout_args(x, p, seed)
    y, n = torch.empty_like(x), x.numel()
    if n:
        dropout_kernel[(triton.cdiv(n, BLOCK),)](x, y, y, n, p, scale, seed, BLOCK=BLOCK,
                                                 STORE_MASK=False, num_warps=NUM_WARPS)
    return y


@seeded_dropout_op.register_fake
def seeded_dropout_fake(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """What the compiler traces with: an output of x's shape, dtype and device, no data."""
    check_dropout_args(x, p, seed)
    return torch.empty_like(x)


def dropout_setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    """Keep what the backward needs: two Python numbers, no tensor."""
    _, ctx.p, ctx.seed = inputs


def dropout_backward(ctx, dy: torch.Tensor):
    """d(x * keep * scale)/dx = keep * scale: the same op on dy with the same seed. No gradient
    for p and seed."""
    return torch.ops.kernels_measured.seeded_dropout(dy.contiguous(), ctx.p, ctx.seed), None, None


seeded_dropout_op.register_autograd(dropout_backward, setup_context=dropout_setup_context)
# --8<-- [end:custom_op]


# --------------------------------------------------------------------------------------------------
# The same kernel as a triton_op: torch.compile sees the launch
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton_op]
@triton_op(f"{NAMESPACE}::seeded_dropout_traceable", mutates_args=())
def seeded_dropout_traceable_op(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """The same dropout, written so that torch.compile can trace into it: only PyTorch operators
    and Triton launches wrapped by wrap_triton. The function is its own fake implementation."""
    p, scale, seed = check_dropout_args(x, p, seed)
    y, n = torch.empty_like(x), x.numel()
    if n:
        wrap_triton(dropout_kernel)[(triton.cdiv(n, BLOCK),)](
            x, y, y, n, p, scale, seed, BLOCK=BLOCK, STORE_MASK=False, num_warps=NUM_WARPS)
    return y


def traceable_backward(ctx, dy: torch.Tensor):
    return (torch.ops.kernels_measured.seeded_dropout_traceable(dy.contiguous(), ctx.p, ctx.seed),
            None, None)


seeded_dropout_traceable_op.register_autograd(traceable_backward,
                                           setup_context=dropout_setup_context)
# --8<-- [end:triton_op]


# --------------------------------------------------------------------------------------------------
# A CUDA C kernel through load_inline
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_sources]
# Compiled by nvcc after the book's csrc/part4/softmax.cu, whose kernels it launches.
LAUNCHER_CU = r"""
#include <cstdint>
#include <cuda_runtime.h>

// One block of `threads` threads per row of a contiguous (rows, cols) fp32 matrix, on `stream`:
// the launch of softmax_cuda in snippets/part4/softmax.py. vec: 16-byte loads (cols % 4 == 0 and
// x, y 16-byte aligned).
void softmax_f32_launch(const float* x, float* y, int64_t rows, int64_t cols, int threads,
                        bool vec, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (vec) softmax_f32_vec<<<(unsigned)rows, threads, 0, s>>>(x, y, (int)cols);
    else softmax_f32_scalar<<<(unsigned)rows, threads, 0, s>>>(x, y, (int)cols);
}
"""

# Compiled by the host compiler: checks the tensor, allocates the output and calls the launcher.
# load_inline writes the Python binding of softmax_f32 from this definition.
WRAPPER_CPP = r"""
#include <torch/extension.h>

void softmax_f32_launch(const float* x, float* y, int64_t rows, int64_t cols, int threads,
                        bool vec, void* stream);

torch::Tensor softmax_f32(torch::Tensor x, int64_t threads, bool vec, int64_t stream) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(),
                "x must be a contiguous 2-D CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    torch::Tensor y = torch::empty_like(x);
    softmax_f32_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                       static_cast<int>(threads), vec, reinterpret_cast<void*>(stream));
    return y;
}
"""


def cuda_source() -> str:
    """The CUDA translation unit: the book's softmax.cu as it is, then the launcher."""
    return cuda.source_path(softmax.CU_FILE).read_text() + "\n" + LAUNCHER_CU


@functools.cache
def softmax_extension():
    """Build the extension once per process (nvcc and the host compiler, a minute the first
    time; load_inline caches the build on disk) and import it."""
    cuda.require_gpu()
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="kernels_measured_softmax", cpp_sources=WRAPPER_CPP,
                       cuda_sources=cuda_source(), functions=["softmax_f32"],
                       extra_cuda_cflags=list(softmax.CU_OPTIONS), no_implicit_headers=True)
# --8<-- [end:cuda_sources]


# --8<-- [start:cuda_op]
@custom_op(f"{NAMESPACE}::softmax_cuda", mutates_args=(), device_types="cuda")
def softmax_cuda_op(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of a contiguous (M, N) fp32 CUDA tensor, N <= CUDA_MAX_N, by the CUDA kernel
    of csrc/part4/softmax.cu, on PyTorch's current stream."""
    _, n = softmax.check_rows(x, "cuda", dtypes=(torch.float32,))
    if n > softmax.CUDA_MAX_N:
        raise ValueError(f"x has {n} columns; the CUDA kernel takes at most {softmax.CUDA_MAX_N}")
    vec = n % 4 == 0 and x.data_ptr() % 16 == 0
    stream = torch.cuda.current_stream(x.device).cuda_stream
    return softmax_extension().softmax_f32(x, softmax.cuda_threads(n), vec, stream)


@softmax_cuda_op.register_fake
def softmax_cuda_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def softmax_setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(output)


def softmax_backward(ctx, dy: torch.Tensor) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y)) over each row: PyTorch operators on the saved output."""
    (y,) = ctx.saved_tensors
    return y * (dy - (dy * y).sum(dim=-1, keepdim=True))


softmax_cuda_op.register_autograd(softmax_backward, setup_context=softmax_setup_context)
# --8<-- [end:cuda_op]

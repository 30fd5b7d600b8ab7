"""Gated activations of a transformer MLP, forward and backward, in Triton: SwiGLU and GeGLU.

``c = act(a) * b`` element by element, where ``a`` is the gate projection and ``b`` the up
projection of the MLP's input, both (M, N). SwiGLU (Llama, Mistral, Qwen) uses ``act = silu``,
``silu(a) = a * sigmoid(a)``; GeGLU (Gemma) uses the tanh approximation of GELU. Both are
``a * sigmoid(k(a))``: ``k(a) = a`` for SiLU and ``k(a) = 2 * sqrt(2 / pi) * (a + 0.044715 * a^3)``
for GELU-tanh (since ``0.5 * (1 + tanh(z)) = sigmoid(2z)``), so one kernel with an ``ACT`` constexpr
computes either. Two ops are registered, for SwiGLU; GeGLU is the same kernels with
``act="gelu_tanh"``, tested against ``F.gelu(a, approximate="tanh") * b``.

Versions of ``swiglu`` (the forward; never renumbered):

- v0  ``F.silu(a) * b``, eager: two kernels, with silu(a) written to memory and read back
  in between.
- v1  the same expression through ``torch.compile``: Inductor fuses it into one element-wise kernel.
- v2  Liger-Kernel's forward (``liger_kernel.ops.swiglu.swiglu_forward``).
- v3  Triton, this chapter's kernel: a flat 1-D grid over the M * N elements, 4096 elements a
      program, fp32 arithmetic, one read of a and b and one write of c.

Versions of ``swiglu_fwd_bwd`` (a training step's forward and backward; each returns (da, db)):

- v0  eager autograd: ``F.silu(a) * b`` then ``torch.autograd.grad``; autograd keeps silu(a) for
  the backward.
- v1  like v0 with the forward through ``torch.compile``.
- v2  Liger-Kernel's ``LigerSiLUMulFunction`` (which writes da and db over a and b, as it does in
  a model).
- v3  Triton, :class:`GLUFunction`: the forward saves only its inputs a and b; the backward kernel
      reads a, b and dc once, recomputes sigmoid(k(a)) in registers and writes da and db: one launch
      each way.

Inputs are ``a`` and ``b`` of one shape (any number of dimensions), one dtype (fp32, fp16 or bf16),
one device, contiguous. Cost: ``_bytes`` and ``_bytes_fwd_bwd``.

The goals, bf16 16384 x 7168: the forward, and forward + backward, at least as fast as
torch.compile's and Liger-Kernel's; the chapter's goal checks (docs/part5/norms-activations.md)
measure them on every GPU with results.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import GRADS_ONLY, check_tensors, refuse_grad, triton_device, wants_grad
from snippets.common.baselines import compiled, grads_through, liger, liger_missing, needs_gpu
from snippets.common.rows import compute_dtype
from snippets.registry import Impl, Op, device_generator, register

FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTS = {"silu": 0, "gelu_tanh": 1}  # the ACT constexpr of the kernels
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)  # gelu_tanh(a) = a * sigmoid(GELU_K * (a + GELU_C * a^3))
GELU_C = 0.044715


# --8<-- [start:reference]
def swiglu_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = silu(a) * b = a * sigmoid(a) * b. Reads a and b, writes c: 3 * M*N * itemsize bytes."""
    return a * torch.sigmoid(a) * b


def geglu_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = gelu_tanh(a) * b = 0.5 * a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 a^3))) * b."""
    return 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3))) * b


def swiglu_fwd_bwd_ref(a, b, dc):
    """The gradients of sum(c * dc) for c = silu(a) * b: with s = sigmoid(a),
    silu'(a) = s + a * s * (1 - s),   da = dc * b * silu'(a),   db = dc * silu(a)."""
    s = torch.sigmoid(a)
    return dc * b * (s + a * s * (1 - s)), dc * a * s
# --8<-- [end:reference]


def geglu_fwd_bwd_ref(a, b, dc):
    """The gradients of sum(c * dc) for c = gelu_tanh(a) * b, through autograd on the
    formula (float64)."""
    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    with torch.enable_grad():
        return torch.autograd.grad(geglu_ref(*leaves), leaves, dc)


# --------------------------------------------------------------------------------------------------
# Library baselines
# --------------------------------------------------------------------------------------------------

def swiglu_torch(a, b):
    """v0: ``F.silu(a) * b``: one kernel writes silu(a), a second reads it back with b."""
    return F.silu(a) * b


_swiglu_compiled = compiled(swiglu_torch)


def swiglu_compiled(a, b):
    """v1: ``F.silu(a) * b`` through torch.compile: one fused element-wise Triton kernel."""
    return _swiglu_compiled(a, b)


def swiglu_fwd_bwd_torch(a, b, dc):
    """v0: eager autograd. The forward keeps a (for silu's backward), silu(a) and b (for
    the product's)."""
    return grads_through(swiglu_torch, (a, b), dc)


def swiglu_fwd_bwd_compiled(a, b, dc):
    """v1: like v0 with the forward compiled: AOTAutograd decides what to save and Inductor fuses
    each pass."""
    return grads_through(_swiglu_compiled, (a, b), dc)


def swiglu_liger(a, b):
    """v2: Liger-Kernel's forward kernel, called directly (no autograd node): one program
    per row."""
    return liger("swiglu").swiglu_forward(a, b)[2]


def swiglu_fwd_bwd_liger(a, b, dc):
    """v2: ``LigerSiLUMulFunction`` as ``LigerSwiGLUMLP`` runs it. Its backward writes da and db
    over the saved a and b (in a model they are activations nobody else reads), so the caller's a
    and b are overwritten."""
    return grads_through(liger("swiglu").LigerSiLUMulFunction.apply, (a, b), dc)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
# Element-wise, so the only choices are how many elements a program takes and how many warps share
# them. 4096 elements over 8 warps is 16 a thread: two 16-byte vectors of bf16 for each of a and b,
# all issued before the first use, which is what keeps enough bytes in flight per SM. 117 million
# elements at the headline make 28672 programs, about 217 waves of 132 SMs, so the ragged last wave
# costs under 1%. Not tuned on a GPU yet: the kernel has no reduction to wait on, so these are the
# settings of Part 1's element-wise kernels.
CONFIG = {"BLOCK": 4096, "num_warps": 8}
# --8<-- [end:configs]


# --8<-- [start:fwd_kernel]
@triton.jit
def _gate(a, ACT: tl.constexpr):
    """sigmoid(k(a)) for the activation act(a) = a * sigmoid(k(a)), and k'(a); a is fp32
    (or fp64)."""
    if ACT == 0:  # silu: k(a) = a
        return tl.sigmoid(a), 1.0
    else:  # gelu_tanh: k(a) = GELU_K * (a + GELU_C * a^3)
        k = 1.5957691216057308 * (a + 0.044715 * a * a * a)
        return tl.sigmoid(k), 1.5957691216057308 * (1.0 + 3.0 * 0.044715 * a * a)


@triton.jit
def _glu_fwd_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK: tl.constexpr, ACT: tl.constexpr,
                    COMPUTE: tl.constexpr):
    # A flat block of BLOCK elements: the op does not care about rows, and a 1-D block keeps every
    # load a 16-byte vector whatever N is (only the last block of all is masked).
    # int64: M * N may pass 2**31
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    s, _ = _gate(a, ACT)
    tl.store(c_ptr + offs, (a * s * b).to(c_ptr.dtype.element_ty), mask=mask)  # rounded once
# --8<-- [end:fwd_kernel]


# --8<-- [start:bwd_kernel]
@triton.jit
def _glu_bwd_kernel(a_ptr, b_ptr, dc_ptr, da_ptr, db_ptr, n_elements, BLOCK: tl.constexpr,
                    ACT: tl.constexpr, COMPUTE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    dc = tl.load(dc_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    # Recompute the gate from a instead of saving it in the forward: a few FLOPs against 2 bytes an
    # element written and read back (and M * N * itemsize bytes of memory held between the passes).
    s, dk = _gate(a, ACT)
    act = a * s
    dact = s + act * (1.0 - s) * dk  # d/da [a * sigmoid(k(a))] = s + a * s * (1 - s) * k'(a)
    tl.store(da_ptr + offs, (dc * b * dact).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dc * act).to(db_ptr.dtype.element_ty), mask=mask)
# --8<-- [end:bwd_kernel]


# --8<-- [start:host]
def _check_inputs(a, b, dtypes, act: str) -> None:
    check_tensors(("a", "b"), (a, b), dtypes=dtypes, device=triton_device())
    if act not in ACTS:
        raise ValueError(f"act must be one of {sorted(ACTS)}, got {act!r}")


def _grid(n: int):
    return (triton.cdiv(n, CONFIG["BLOCK"]),)


def _glu_fwd(a, b, act: str):
    c = torch.empty_like(a)
    if a.numel():
        _glu_fwd_kernel[_grid(a.numel())](a, b, c, a.numel(), BLOCK=CONFIG["BLOCK"], ACT=ACTS[act],
                                          COMPUTE=compute_dtype(a.dtype),
                                          num_warps=CONFIG["num_warps"])
    return c


def _glu_bwd(a, b, dc, act: str):
    da, db = torch.empty_like(a), torch.empty_like(b)
    if a.numel():
        _glu_bwd_kernel[_grid(a.numel())](a, b, dc, da, db, a.numel(), BLOCK=CONFIG["BLOCK"],
                                          ACT=ACTS[act], COMPUTE=compute_dtype(a.dtype),
                                          num_warps=CONFIG["num_warps"])
    return da, db


def glu_triton(a: torch.Tensor, b: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """act(a) * b element by element, in one launch; ``act`` is "silu" (SwiGLU) or
    "gelu_tanh" (GeGLU). With grad mode on and an input that requires grad, the call goes through
    GLUFunction (below), whose backward gives a and b their gradients."""
    _check_inputs(a, b, FLOAT_TYPES, act)
    if wants_grad(a, b):
        return GLUFunction.apply(a, b, act)
    return _glu_fwd(a, b, act)


def swiglu_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: silu(a) * b."""
    return glu_triton(a, b, "silu")


def geglu_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(a) * b: the same kernel with ACT = 1."""
    return glu_triton(a, b, "gelu_tanh")
# --8<-- [end:host]


# --8<-- [start:function]
class GLUFunction(torch.autograd.Function):
    """act(a) * b that trains. The forward saves a and b, the tensors it was given (no new memory);
    the backward recomputes the gate. float64 is accepted too, for torch.autograd.gradcheck."""

    @staticmethod
    def forward(ctx, a, b, act="silu"):
        _check_inputs(a, b, (*FLOAT_TYPES, torch.float64), act)
        ctx.save_for_backward(a, b)
        ctx.act = act
        return _glu_fwd(a, b, act)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        da, db = _glu_bwd(a, b, dc.contiguous(), ctx.act)  # dc may arrive as a broadcast view
        return da, db, None


def swiglu_fwd_bwd_triton(a, b, dc):
    """v3: GLUFunction (silu) through autograd, like v0: one launch forward, one backward."""
    refuse_grad("swiglu_fwd_bwd_triton", a, b, dc, instead="swiglu_triton", why=GRADS_ONLY)
    check_tensors(("a", "dc"), (a, dc), dtypes=FLOAT_TYPES, device=triton_device())
    return grads_through(GLUFunction.apply, (a, b), dc)
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """a, b ~ N(0, 1) of shape (M, N): gate and up projections."""
    g = device_generator(gen, device)
    shape = (size["m"], size["n"])
    return torch.randn(shape, generator=g, device=device).to(dtype), \
        torch.randn(shape, generator=g, device=device).to(dtype)


def _make_inputs_fwd_bwd(size, dtype, device, gen):
    """The forward's inputs and an incoming gradient dc ~ N(0, 1)."""
    a, b = _make_inputs(size, dtype, device, gen)
    dc = torch.randn(a.shape, generator=device_generator(gen, device), device=device)
    return a, b, dc.to(dtype)


def _bytes(size, dtype) -> int:
    """Read a and b, write c."""
    return 3 * size["m"] * size["n"] * dtype.itemsize


def _bytes_fwd_bwd(size, dtype) -> int:
    """Forward: read a, b, write c (3MN). Backward: read a, b, dc, write da, db (5MN)."""
    return 8 * size["m"] * size["n"] * dtype.itemsize


# bf16: 224 MiB each of a, b and c; 14336 is Llama-3 8B's MLP width / 2
HEADLINE = {"m": 16384, "n": 7168}
SWEEP = [{"m": 16384, "n": n} for n in (1024, 2048, 4096, 7168, 14336)]
TEST_SIZES = [{"m": 1, "n": 1}, {"m": 3, "n": 17}, {"m": 17, "n": 123}, {"m": 123, "n": 781},
              {"m": 2, "n": 4097}]
# Element-wise with fp32 arithmetic, rounded once: half an ulp of the output type plus a few fp32
# ulps from exp. bf16 (GPU only) allows two ulps because eager PyTorch rounds silu(a) to bf16 before
# the product and its backward rounds dc * b before silu's backward.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
              torch.bfloat16: (1.6e-2, 1.6e-2)}
TRITON_SOURCES = (_gate, _glu_fwd_kernel, _glu_fwd, _check_inputs, _grid)
BWD_SOURCES = (*TRITON_SOURCES, _glu_bwd_kernel, _glu_bwd, GLUFunction.forward,
               GLUFunction.backward, grads_through)

swiglu = register(Op(
    name="swiglu", part=5, chapter="part5/norms-activations.md", title="SwiGLU forward",
    reference=swiglu_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: 6 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES))
swiglu.add(Impl("v0", swiglu_torch, "PyTorch", "F.silu(a) * b", (F.silu,), device="any"))
swiglu.add(Impl("v1", swiglu_compiled, "Triton", "torch.compile(F.silu(a) * b)", (swiglu_torch,),
                device="cuda", requires=needs_gpu, origin="library"))
swiglu.add(Impl("v2", swiglu_liger, "Triton", "Liger-Kernel 0.8.5 swiglu_forward", (liger,),
                device="cuda", requires=liger_missing, origin="library"))
swiglu.add(Impl("v3", swiglu_triton, "Triton", "flat blocks of 4096, fp32 gate", TRITON_SOURCES,
                device="any"))

swiglu_fwd_bwd = register(Op(
    name="swiglu_fwd_bwd", part=5, chapter="part5/norms-activations.md",
    title="SwiGLU forward + backward", reference=swiglu_fwd_bwd_ref,
    make_inputs=_make_inputs_fwd_bwd, bytes_moved=_bytes_fwd_bwd,
    flops=lambda s, d: 16 * s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances=TOLERANCES, measure_memory=True))
# v0 on the GPU only: on the CPU, autograd's fp16 backward rounds between its steps more than the
# fp16 tolerance allows; the CUDA path, the one benchmarked, is compared at bf16 there.
swiglu_fwd_bwd.add(Impl("v0", swiglu_fwd_bwd_torch, "PyTorch",
                        "F.silu(a) * b + torch.autograd.grad", (F.silu, grads_through),
                        device="cuda"))
swiglu_fwd_bwd.add(Impl("v1", swiglu_fwd_bwd_compiled, "Triton",
                        "torch.compile forward and backward", (swiglu_torch, grads_through),
                        device="cuda", requires=needs_gpu, origin="library"))
swiglu_fwd_bwd.add(Impl("v2", swiglu_fwd_bwd_liger, "Triton",
                        "Liger-Kernel 0.8.5 LigerSiLUMulFunction", (liger, grads_through),
                        device="cuda", requires=liger_missing, origin="library"))
swiglu_fwd_bwd.add(Impl("v3", swiglu_fwd_bwd_triton, "Triton",
                        "GLUFunction: one kernel writes da and db", BWD_SOURCES, device="any"))

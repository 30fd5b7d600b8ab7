"""Registers, local memory and spills: one computation, three places for its per-thread array.

Every version computes, for each element, a chain of ``slots`` values and their sum
(``chain_sum_ref``). The sum visits the values in another order than the chain made them, so all of
them are alive at once, in an array ``float a[slots]`` per thread. Where that array lives is the
experiment (``csrc/part2/spill.cu``):

- v1  CUDA, every index a compile-time constant (loops unrolled): ``a`` is ``slots`` registers.
- v2  CUDA, like v1 but the sum reads ``a[(k * step + offset) % slots]`` with ``step`` and
      ``offset`` passed at run time: a register cannot be indexed at run time, so ``a`` goes to
      local memory (a stack frame).
- v3  CUDA, v1's code under ``__launch_bounds__(256, 8)``: at most 32 registers per thread, so for
      large ``slots`` ptxas spills part of ``a`` to local memory, in exchange for more
      resident warps.

A micro-benchmark (no library baseline). The sweep is over ``slots`` (8 to 64) at a fixed n. Each
element costs 3 (slots - 1) FLOPs (slots - 1 multiply-adds and slots - 1 adds) against 8 bytes of
DRAM traffic, so with the array in registers the kernel is compute-bound: the metric is TFLOP/s
against the cuBLAS fp32 rate. Local memory traffic is not in the cost model on purpose: it is the
overhead being measured.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad
from snippets.registry import Impl, Op, register

CU_FILE = "part2/spill.cu"
SLOTS = (8, 16, 32, 64)  # the instantiations in spill.cu (CHAIN_KERNELS)
THREADS = 256  # threads per block; chain_bounded_* is compiled for at most that many
CU_OPTIONS = cuda.defines(CU_FILE, THREADS=THREADS)  # spill.cu's launch bound, as a -D option
C, D = 0.96875, 0.0625  # C and D in spill.cu: exact in fp32
# The run-time permutation of v2: any odd step and any offset visit every slot once. These values
# are fixed here, but the kernel cannot know them: they arrive as kernel arguments.
STEP, OFFSET = 5, 3


# --8<-- [start:reference]
def chain_sum_ref(x: torch.Tensor, slots: int) -> torch.Tensor:
    """a_0 = x, a_k = C * a_{k-1} + D for k < slots; out = a_0 + ... + a_{slots-1}.
    Reads x and writes out (8 bytes per fp32 element); 3 * (slots - 1) FLOPs per element."""
    a = x.clone()
    total = x.clone()
    for _ in range(1, slots):
        a = C * a + D
        total = total + a
    return total
# --8<-- [end:reference]


def _check(x: torch.Tensor, slots: object) -> None:
    cuda.require_gpu()
    check_tensors(("x",), (x,), dtypes=(torch.float32,), device="cuda", allow_empty=False)
    if isinstance(slots, bool) or not isinstance(slots, int):
        raise TypeError(f"slots must be a Python int, got {type(slots).__name__}")
    if slots not in SLOTS:
        raise ValueError(f"slots = {slots} is not compiled; csrc/part2/spill.cu has {SLOTS}")


# --8<-- [start:launch]
def _launch_chain(variant: str, x: torch.Tensor, slots: int, *scalars) -> torch.Tensor:
    """The one launcher of every version: one thread per element, blocks of 256 threads."""
    out = torch.empty_like(x)
    n = x.numel()
    fn = cuda.kernel(CU_FILE, f"chain_{variant}_{slots}", CU_OPTIONS)
    cuda.launch(fn, triton.cdiv(n, THREADS), THREADS, (x, out, np.int64(n), *scalars))
    return out
# --8<-- [end:launch]


def chain_sum_registers(x: torch.Tensor, slots: int) -> torch.Tensor:
    """v1: the array in registers (every index known at compile time)."""
    refuse_grad("chain_sum_registers", x, instead="chain_sum_ref")
    _check(x, slots)
    return _launch_chain("registers", x, slots)


def chain_sum_local(x: torch.Tensor, slots: int, step: int = STEP,
                    offset: int = OFFSET) -> torch.Tensor:
    """v2: like v1, but the sum's order is ``(k * step + offset) % slots``, known only at run time,
    so the array is in local memory. ``step`` must be odd (then the order visits every slot once:
    a permutation)."""
    refuse_grad("chain_sum_local", x, instead="chain_sum_ref")
    _check(x, slots)
    for name, v in (("step", step), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be a Python int, got {type(v).__name__}")
    if step % 2 == 0:
        raise ValueError(f"step must be odd to visit every one of the {slots} slots once, got "
                         f"{step}")
    # Reduced mod slots here: the kernel's int arithmetic k * step + offset must not overflow.
    return _launch_chain("local", x, slots, np.int32(step % slots), np.int32(offset % slots))


def chain_sum_bounded(x: torch.Tensor, slots: int) -> torch.Tensor:
    """v3: v1's code compiled under ``__launch_bounds__(256, 8)``: at most 32 registers per thread,
    so 8 blocks of 256 threads fit an SM; what does not fit in 32 registers is spilled to
    local memory."""
    refuse_grad("chain_sum_bounded", x, instead="chain_sum_ref")
    _check(x, slots)
    return _launch_chain("bounded", x, slots)


VARIANTS = {"v1": "registers", "v2": "local", "v3": "bounded"}


def kernel_name(version: str, slots: int) -> str:
    """The name in spill.cu of a version's kernel, e.g.
    ``kernel_name("v3", 64) == "chain_bounded_64"``: for ``cuda.resident_blocks`` and the ptxas
    report in build/ptxas/."""
    return f"chain_{VARIANTS[version]}_{slots}"


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    x = torch.randn(size["n"], generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return x, size["slots"]


N = 2**24  # 16 M threads: 65536 blocks of 256, hundreds of waves on any GPU; 64 MiB in and out
register_spill = register(Op(
    name="register_spill", part=2, chapter="part2/registers.md",
    title="Registers, local memory and spills", reference=chain_sum_ref, make_inputs=_make_inputs,
    bytes_moved=lambda s, d: 8 * s["n"], flops=lambda s, d: 3 * (s["slots"] - 1) * s["n"],
    metric="TFLOP/s", ceiling="gemm_fp32", headline={"n": N, "slots": 64},
    sweep=[{"n": N, "slots": s} for s in SLOTS], sweep_axis="slots", dtypes=(torch.float32,),
    test_sizes=[{"n": n, "slots": s}
                for n, s in ((1, 64), (17, 8), (1000, 16), (4097, 32), (65536 + 3, 64))],
    # Partial sums reach ~130 (fp32 spacing 1.5e-5 there) over 63 additions, each term the end of a
    # chain of up to 63 roundings: worst case ~5e-4 absolute, and the sum can cancel to ~0, where
    # only atol helps.
    tolerances={torch.float32: (1e-5, 1e-3)}, kind="micro"))
_SRC = (cuda.source_path(CU_FILE), _launch_chain, _check)
register_spill.add(Impl("v1", chain_sum_registers, "CUDA",
                        "array in registers (compile-time indices)", _SRC))
register_spill.add(Impl("v2", chain_sum_local, "CUDA", "array in local memory (run-time indices)",
                        _SRC))
register_spill.add(Impl("v3", chain_sum_bounded, "CUDA",
                        "registers, __launch_bounds__(256, 8): spills", _SRC))

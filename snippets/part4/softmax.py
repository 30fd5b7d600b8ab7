"""Row-wise softmax of a 2-D tensor, fused: one read and one write per element.

Versions of ``softmax`` (never renumbered); each computes ``exp(x - max) / sum(exp(x - max))`` over
the last dimension of a contiguous (M, N) tensor, in fp32 inside the kernel, and returns the
input dtype:

- v0  ``torch.softmax(x, dim=-1)``, eager: the library baseline.
- v1  the same call through ``torch.compile`` (GPU only): what a compiler makes of it.
- v2  Triton, one pass, one program per row: the whole row is loaded into registers once (BLOCK_N is
      the next power of two >= N), reduced twice (max, then sum) without leaving the chip, and
      written once.
- v3  Triton, like v2, but persistent: a grid of (SMs x programs per SM) programs, each looping over
      rows with the next row's load issued while the current one is reduced
      (``tl.range(num_stages=...)``), plus an eviction hint on the load. Launch and scheduling cost
      is paid once per program instead of per row. The chapter's tables show it *slower* than v2 at
      every N it takes: the block scheduler already keeps every SM full of v2's short-lived
      programs, and the static round-robin of rows over programs leaves a tail. Kept as the
      experiment the chapter discusses; softmax() uses v2.
- v4  Triton, online (streaming) softmax, for rows that do not fit on chip: one pass over the row in
      BLOCK_N-wide chunks keeps a running max and a running sum rescaled to it, a second pass writes
      ``exp(x - max) / sum``. Any N, at the price of reading x twice: 3 N element transfers instead
      of 2.
- v5  CUDA C (``csrc/part4/softmax.cu``): one block per row, the row in registers, 16-byte vector
      loads, warp shuffles for the max and the sum. The same algorithm as v2, written out by hand.

``softmax(x)`` is the function to call: v2 when a row fits in registers (N <= ONE_PASS_MAX_N),
v4 otherwise.

Cost model: the op must read M*N elements and write M*N, so ``bytes = 2 * M * N * itemsize``, and is
measured against the copy ceiling. v4 moves 1.5 times that (x is read twice), but is held to the
same model: the table shows what the extra read costs. About 5 FLOPs per element (max, subtract,
exp, sum, scale), far below any GPU's FLOP/byte balance: softmax is memory-bound in every dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import (
    check_int,
    check_tensors,
    refuse_grad,
    triton_device,
    triton_interpreting,
)
from snippets.common.baselines import compiled, needs_gpu
from snippets.common.rows import ONLINE_BLOCK_N, ONLINE_NUM_WARPS
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "part4/softmax.cu"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Column offsets inside a row are int32 in every kernel (tl.arange, the CUDA column index); a chunk
# of v4 may run up to one BLOCK_N past the end of a row before its mask stops it, so leave that much
# headroom below 2^31.
MAX_COLS = 2**30


# --8<-- [start:reference]
def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the last dimension, written as the chain of PyTorch ops it is made of.
    Computed in at least fp32 (float64 stays float64: the tests' exact reference) and returned in
    the input dtype.

    Fused, the op reads M*N elements and writes M*N. Run eagerly, this chain makes five passes over
    (M, N) data: amax reads x; the subtraction reads x and writes t; exp reads t and writes e; sum
    reads e; the division reads e and writes y. That is 8 M*N element transfers instead of 2 (plus
    the conversions when x is bf16 or fp16)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    # subtracting the max: exp never overflows (see the chapter)
    row_max = xf.amax(dim=-1, keepdim=True)
    e = torch.exp(xf - row_max)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
# --8<-- [end:reference]


def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    """v0: PyTorch's fused softmax kernel (eager)."""
    return torch.softmax(x, dim=-1)


softmax_compiled = compiled(softmax_torch)  # v1: torch.compile (default mode, one kernel per shape)


# --8<-- [start:bytes]
def chain_bytes(m: int, n: int, itemsize: int) -> dict[str, int]:
    """Bytes that cross device memory for each eager op of ``softmax_ref``'s chain on an (m, n)
    input of ``itemsize``-byte elements (intermediates in the same dtype, as an fp32 chain has
    them), and for the fused kernel. Row vectors (the max, the sum) count m elements."""
    full, row = m * n * itemsize, m * itemsize
    steps = {
        "amax": full + row,             # read x, write the row maxima
        "sub": full + row + full,       # read x and the maxima, write t = x - max
        "exp": full + full,             # read t, write e
        "sum": full + row,              # read e, write the row sums
        "div": full + row + full,       # read e and the sums, write y
    }
    steps["chain"] = sum(steps.values())
    steps["fused"] = 2 * full           # read x once, write y once
    return steps
# --8<-- [end:bytes]


# --------------------------------------------------------------------------------------------------
# Input checks (one place for every version)
# --------------------------------------------------------------------------------------------------

def check_rows(x: torch.Tensor, device: str,
               dtypes: tuple[torch.dtype, ...] = DTYPES) -> tuple[int, int]:
    """A non-empty, contiguous, 2-D (M, N) tensor of one of ``dtypes`` on ``device`` with N small
    enough for int32 column offsets; returns (M, N)."""
    check_tensors(("x",), (x,), dtypes=dtypes, device=device, allow_empty=False)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}; "
                         "reshape to (-1, x.shape[-1]) for a softmax over the last dimension")
    m, n = x.shape
    if n > MAX_COLS:
        raise ValueError(f"x has {n} columns; these kernels index a row with int32 offsets and "
                         f"take at most {MAX_COLS} columns")
    return m, n


# --------------------------------------------------------------------------------------------------
# v2: one program per row, the whole row in registers
# --------------------------------------------------------------------------------------------------

# --8<-- [start:one_pass]
@triton.jit
def _softmax_row_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    # int64: row * stride passes 2^31 on inputs over 2^31 elements
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    # Padding lanes load -inf: they cannot win the max, and exp(-inf - max) = 0 adds nothing to
    # the sum.
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# The one-pass cut-off of softmax(): v2 gives a warp 1024 columns, i.e. each thread 32 fp32 values
# of the row (32 of its at most 255 registers, with room for the exponentials). A block has at most
# 32 warps, so past 32768 columns each thread must hold more, the row spills to local memory, and
# the online kernel (v4), which holds only a chunk, is as fast. In tuning runs on an H200 (Triton
# 3.6) v2 stayed near the copy rate up to 32768 fp32 columns and dropped to v4's rate at 65536 (the
# sweep in the chapter shows it).
ONE_PASS_MAX_N = 32768


def row_num_warps(block_n: int) -> int:
    """v2's warps per program: one warp per 1024 columns (32 values per thread), at least 4, at
    most 32."""
    return min(32, max(4, block_n // 1024))


def softmax_one_pass(x: torch.Tensor) -> torch.Tensor:
    """v2: one program per row; the row is read once into registers and written once."""
    refuse_grad("softmax_one_pass", x, instead="torch.softmax")
    m, n = check_rows(x, triton_device())
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(n)
    _softmax_row_kernel[(m,)](x, y, n, x.stride(0), BLOCK_N=block_n,
                              num_warps=row_num_warps(block_n))
    return y
# --8<-- [end:one_pass]


# --------------------------------------------------------------------------------------------------
# v3: persistent one-pass kernel
# --------------------------------------------------------------------------------------------------

# --8<-- [start:persistent_config]
@dataclass(frozen=True)
class PersistentConfig:
    """How v3 is launched for one range of row lengths.

    ``num_warps``: threads per program / 32. BLOCK_N / (32 * num_warps) is how many of a row's
    values each thread holds; 16 to 32 fp32 values keeps the row in registers with room for the
    exponentials, and means each thread issues 4 to 8 16-byte loads (fp32) at once.
    ``programs_per_sm``: the persistent grid is SMs x this. Each program holds one row at a time, so
    this is the number of rows an SM works on at once; with the pipelined loop below each program
    also has the next row's load in flight while it reduces the current one.
    ``num_stages``: the ``num_stages`` of the row loop: 2 issues row i+1's load (into shared memory)
    before row i is reduced; 1 turns the software pipelining off.
    ``evict_first``: mark x's cache lines as first to evict from L2. Every element is read exactly
    once, so keeping x in L2 helps nobody, while y's lines (written, then flushed to DRAM) and the
    next rows do.
    """

    num_warps: int
    programs_per_sm: int
    num_stages: int = 2
    evict_first: bool = True


# BLOCK_N (the next power of two >= N) -> config; the first key >= BLOCK_N applies. The reasoning
# for the headline 8192 columns: an fp32 row is 32 KB; 8 warps give 32 values per thread, and an
# SM's 64K 32-bit registers hold about four such programs, each with its next row in flight
# (num_stages=2): over 100 KB of loads in flight per SM, far above the ~30 KB per SM that Little's
# law asks for at 4.8 TB/s and ~0.8 us of DRAM latency over 132 SMs. The entries are the best of
# sweep_persistent_configs() on an H200 (Triton 3.6, M * N = 2^27) for fp32 and bf16 together; the
# top entries at 8192 were close to each other, and the eviction hint made no difference beyond
# run-to-run noise.
PERSISTENT_CONFIGS: dict[int, PersistentConfig] = {
    1024: PersistentConfig(num_warps=4, programs_per_sm=16, num_stages=1),
    2048: PersistentConfig(num_warps=4, programs_per_sm=16, num_stages=1),
    4096: PersistentConfig(num_warps=2, programs_per_sm=8, num_stages=1),
    8192: PersistentConfig(num_warps=8, programs_per_sm=4, num_stages=2),
    16384: PersistentConfig(num_warps=16, programs_per_sm=4, num_stages=1),
}
PERSISTENT_MAX_N = max(PERSISTENT_CONFIGS)  # v3 refuses longer rows (untuned there)
# under TRITON_INTERPRET: few programs, so each one loops over several rows
INTERPRETER_PROGRAMS = 3
# --8<-- [end:persistent_config]


# --8<-- [start:persistent]
@triton.jit
def _softmax_persistent_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK_N: tl.constexpr,
                               NUM_STAGES: tl.constexpr, EVICT_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    # Rows pid, pid + P, pid + 2P, ...; with NUM_STAGES = 2 the compiler's software pipeliner issues
    # the load of the next row before the current one is reduced and stored.
    for row in tl.range(pid, n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        start = tl.cast(row, tl.int64) * stride
        if EVICT_FIRST:
            x = tl.load(x_ptr + start + offs, mask=mask, other=-float("inf"),
                        eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + start + offs, mask=mask, other=-float("inf"))
        x = x.to(tl.float32)
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        y = e * (1.0 / tl.sum(e, axis=0))  # one division per row, then a multiply per element
        tl.store(y_ptr + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def persistent_config(block_n: int) -> PersistentConfig:
    for limit in sorted(PERSISTENT_CONFIGS):
        if block_n <= limit:
            return PERSISTENT_CONFIGS[limit]
    raise ValueError(f"no one-pass config for rows of {block_n} columns (the largest is "
                     f"{PERSISTENT_MAX_N}); use softmax_online or softmax()")


def persistent_grid(m: int, cfg: PersistentConfig, device: torch.device) -> int:
    """SMs x programs per SM, but no more programs than rows."""
    if triton_interpreting():
        return min(m, INTERPRETER_PROGRAMS)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return min(m, sms * cfg.programs_per_sm)


def softmax_persistent(x: torch.Tensor, config: PersistentConfig | None = None) -> torch.Tensor:
    """v3: one-pass softmax with a persistent grid. Rows of up to PERSISTENT_MAX_N columns;
    ``config`` overrides the table above (for tuning)."""
    refuse_grad("softmax_persistent", x, instead="torch.softmax")
    m, n = check_rows(x, triton_device())
    if n > PERSISTENT_MAX_N:
        raise ValueError(f"x has {n} columns: the persistent one-pass kernel is configured for "
                         f"rows of at most {PERSISTENT_MAX_N} (a longer row does not fit next to "
                         "its prefetched successor); use softmax(x)")
    block_n = triton.next_power_of_2(n)
    cfg = config or persistent_config(block_n)
    y = torch.empty_like(x)
    _softmax_persistent_kernel[(persistent_grid(m, cfg, x.device),)](
        x, y, m, n, x.stride(0), BLOCK_N=block_n, NUM_STAGES=cfg.num_stages,
        EVICT_FIRST=cfg.evict_first, num_warps=cfg.num_warps)
    return y
# --8<-- [end:persistent]


# --------------------------------------------------------------------------------------------------
# v4: online (streaming) softmax
# --------------------------------------------------------------------------------------------------

# --8<-- [start:online]
# Chunk width and warps of v4: ONLINE_BLOCK_N and ONLINE_NUM_WARPS (snippets.common.rows).
@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    offs = tl.arange(0, BLOCK_N)
    # Pass 1: each lane keeps its own running max m and its running sum s of exp(x - m), over the
    # columns it sees (lane j sees columns j, j + BLOCK_N, ...). When a larger value raises m, the
    # old sum is rescaled by exp(m_old - m_new): the identity of the online softmax, applied lane by
    # lane, so no cross-warp reduction is needed inside the loop.
    m = tl.full((BLOCK_N,), -float("inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf (padding, or -inf in the data) has m_new = -inf, and -inf -
        # -inf is NaN; shifting by 0 there instead gives exp(-inf) = 0 for both terms, and s
        # stays 0.
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    # Merge the lanes with the same identity: the row max, and every lane's sum rescaled to it.
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)
    inv = 1.0 / row_sum
    # Pass 2: read x again, write y. Last chunk first: those are the columns pass 1 read most
    # recently, the likeliest to be still in L2.
    for i in range(0, tl.cdiv(n_cols, BLOCK_N)):
        cols = (tl.cdiv(n_cols, BLOCK_N) - 1 - i) * BLOCK_N + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - row_max) * inv
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax_online(x: torch.Tensor, block_n: int | None = None) -> torch.Tensor:
    """v4: two passes over each row in chunks of ``block_n`` columns (default ONLINE_BLOCK_N, or
    less for short rows; a power of two); any row length up to MAX_COLS."""
    refuse_grad("softmax_online", x, instead="torch.softmax")
    m, n = check_rows(x, triton_device())
    if block_n is None:
        block_n = min(ONLINE_BLOCK_N, triton.next_power_of_2(n))
    else:
        block_n = check_int("block_n", block_n, 1)
        if block_n & (block_n - 1):
            raise ValueError(f"block_n must be a power of two, got {block_n}")
    y = torch.empty_like(x)
    _softmax_online_kernel[(m,)](x, y, n, x.stride(0), BLOCK_N=block_n, num_warps=ONLINE_NUM_WARPS)
    return y
# --8<-- [end:online]


# --8<-- [start:dispatch]
def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the last dimension of a contiguous 2-D fp32/bf16/fp16 tensor, in
    its dtype.

    Rows of up to ONE_PASS_MAX_N columns take the one-pass kernel (v2): the row stays in registers,
    2 element transfers per element. Longer rows would need more than 32 registers per thread for
    the row alone, so they take the online kernel (v4) instead: 3 transfers per element, but any
    length. (The persistent v3 is slower than v2 at every N it takes, in the chapter's tables, so
    it is not used here.)"""
    refuse_grad("softmax", x, instead="torch.softmax")
    _, n = check_rows(x, triton_device())
    return softmax_one_pass(x) if n <= ONE_PASS_MAX_N else softmax_online(x)
# --8<-- [end:dispatch]


# --------------------------------------------------------------------------------------------------
# v5: CUDA C (csrc/part4/softmax.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
VALUES_PER_THREAD = 32  # each thread holds up to 32 fp32 values of its row
MAX_THREADS = 512  # the kernel's __launch_bounds__: up to 65536 / 512 = 128 registers per thread
CUDA_MAX_N = VALUES_PER_THREAD * MAX_THREADS  # 16384: past it a row does not fit in the block
# softmax.cu is compiled with both numbers (-D options), so this is the one place they are written
CU_OPTIONS = cuda.defines(CU_FILE, VALUES_PER_THREAD=VALUES_PER_THREAD, MAX_THREADS=MAX_THREADS)


def cuda_threads(n: int) -> int:
    """Threads of v5's block for rows of n columns: enough for VALUES_PER_THREAD values each, in
    whole warps."""
    return min(MAX_THREADS, 32 * triton.cdiv(triton.cdiv(n, VALUES_PER_THREAD), 32))


def softmax_cuda(x: torch.Tensor) -> torch.Tensor:
    """v5: one block per row, the row in registers, 16-byte loads when every row starts
    16-byte aligned."""
    refuse_grad("softmax_cuda", x, instead="torch.softmax")
    cuda.require_gpu()
    m, n = check_rows(x, "cuda")
    if n > CUDA_MAX_N:
        raise ValueError(f"x has {n} columns; the CUDA kernel keeps a row in one block's registers "
                         f"and takes at most {CUDA_MAX_N}; use softmax(x)")
    vec_ok = (n * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0
    fn = cuda.kernel(CU_FILE, f"softmax_{SUFFIX[x.dtype]}_{'vec' if vec_ok else 'scalar'}",
                     CU_OPTIONS)
    y = torch.empty_like(x)
    cuda.launch(fn, m, cuda_threads(n), (x, y, np.int32(n)))
    return y
# --8<-- [end:cuda_launch]


# --------------------------------------------------------------------------------------------------
# The online recurrence in NumPy, one row, on the CPU
# --------------------------------------------------------------------------------------------------

# --8<-- [start:numpy_online]
def online_softmax_numpy(x: np.ndarray, block: int) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Softmax of the 1-D array x by the online recurrence over blocks of ``block`` values,
    in float64.

    Returns the softmax and the running (max, sum) after each block, where sum is the sum of
    exp(x_j - max) over every value seen so far. Each block updates the pair with
        m_new = max(m, max(block)),   s_new = s * exp(m - m_new) + sum(exp(block - m_new)),
    which keeps s equal to the sum over everything seen so far, shifted by the current max."""
    x = np.asarray(x, dtype=np.float64)
    m, s, trace = -np.inf, 0.0, []
    for start in range(0, x.size, block):
        chunk = x[start:start + block]
        m_new = max(m, chunk.max())
        # exp(-inf - finite) = 0 on the first block
        s = s * np.exp(m - m_new) + np.exp(chunk - m_new).sum()
        m = m_new
        trace.append((float(m), float(s)))
    return np.exp(x - m) / s, trace
# --8<-- [end:numpy_online]


# --------------------------------------------------------------------------------------------------
# Tuning v3 (GPU only, never at import)
# --------------------------------------------------------------------------------------------------

def sweep_persistent_configs(
        m: int, n: int, dtype: torch.dtype,
        configs: list[PersistentConfig]) -> list[tuple[PersistentConfig, float]]:
    """Time v3 with each config on an (m, n) input on the GPU; returns (config, GB/s) pairs, fastest
    first. Every config's output is checked against torch.softmax before it is timed."""
    cuda.require_gpu()
    x = torch.randn(m, n, device="cuda").to(dtype)
    want = torch.softmax(x.float(), dim=-1)
    results = []
    for cfg in configs:
        torch.testing.assert_close(softmax_persistent(x, cfg).float(), want, rtol=1e-2, atol=1e-5)
        ms = triton.testing.do_bench(lambda cfg=cfg: softmax_persistent(x, cfg))
        results.append((cfg, 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9))
    return sorted(results, key=lambda r: -r[1])


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """Logits drawn from N(100, 3^2): the offset of 100 makes exp(x) overflow fp32 (whose largest
    value is about exp(88.7)), so a version that forgot to subtract the row max fails every test."""
    dev_gen = device_generator(gen, device)
    x = 100.0 + 3.0 * torch.randn(size["m"], size["n"], generator=dev_gen, device=device,
                                  dtype=torch.float32)
    return (x.to(dtype),)


def _bytes(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * dtype.itemsize  # read x once, write y once


def _flops(size, dtype) -> int:
    return 5 * size["m"] * size["n"]  # max, subtract, exp, sum, scale


HEADLINE = {"m": 16384, "n": 8192}  # 512 MiB fp32 in + out: ten times the H200's L2
# N from 2^10 to 2^18 with M * N = 2^27 (512 MiB of fp32 each way): the one-pass kernels up to
# ONE_PASS_MAX_N, the online one everywhere.
SWEEP = [{"m": 2**27 // 2**k, "n": 2**k} for k in range(10, 19)]
TEST_SIZES = [{"m": 1, "n": 1}, {"m": 3, "n": 17}, {"m": 7, "n": 123}, {"m": 5, "n": 1024},
              {"m": 37, "n": 1823}]
# The module file is a source of every Triton version: their speed depends on tables
# (PERSISTENT_CONFIGS, ONLINE_BLOCK_N) whose values a function's source text would not show.
SOURCES = ("snippets/part4/softmax.py",)


def _v3_fits(size) -> bool:
    return size["n"] <= PERSISTENT_MAX_N


def _v2_fits(size) -> bool:
    # one step past the cut-off shows the spill; further only costs time
    return size["n"] <= 2 * ONE_PASS_MAX_N


softmax_op = register(Op(
    name="softmax", part=4, chapter="part4/softmax.md", title="Fused softmax",
    reference=softmax_ref, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES,
    bench_dtypes=(torch.float32, torch.bfloat16), test_sizes=TEST_SIZES, sweep_axis="n",
    # Outputs lie in (0, 1]. fp32: exp and the sum each carry a few ulp, and exp(x - max) amplifies
    # the rounding of x - max (up to ~20 here) by that size; 1e-5 relative covers it. fp16/bf16: one
    # rounding of the output (2^-11, 2^-8 relative). The atol only covers fp16 subnormals (below
    # 6e-5, spaced 6e-8); a larger atol would accept anything at large N, where every output is
    # about 1/N.
    tolerances={torch.float32: (1e-5, 1e-7), torch.float16: (1e-3, 1e-7),
                torch.bfloat16: (8e-3, 1e-7)}))
softmax_op.add(Impl("v0", softmax_torch, "PyTorch", "torch.softmax (eager)", device="any"))
softmax_op.add(Impl("v1", softmax_compiled, "PyTorch", "torch.compile(torch.softmax)",
                    (softmax_torch,), device="cuda", requires=needs_gpu, origin="library"))
softmax_op.add(Impl("v2", softmax_one_pass, "Triton", "one pass, one program per row",
                    (_softmax_row_kernel, row_num_warps, *SOURCES), device="any",
                    bench_if=_v2_fits))
softmax_op.add(Impl("v3", softmax_persistent, "Triton", "one pass, persistent, pipelined rows",
                    (_softmax_persistent_kernel, persistent_config, persistent_grid, *SOURCES),
                    device="any", bench_if=_v3_fits))
softmax_op.add(Impl("v4", softmax_online, "Triton",
                    "online: running max and rescaled sum, two reads",
                    (_softmax_online_kernel, *SOURCES), device="any"))
softmax_op.add(Impl("v5", softmax_cuda, "CUDA", "one block per row, shuffles, 16-byte loads",
                    (cuda.source_path(CU_FILE), cuda_threads, *SOURCES), device="cuda",
                    bench_if=lambda size: size["n"] <= CUDA_MAX_N))

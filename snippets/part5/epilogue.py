"""GEMM epilogue fusion: C = act(A @ B + bias) with the bias and the activation applied to the
accumulator in registers, before the one store of C.

Versions of ``matmul_epilogue`` (fp16 and bf16 inputs, fp32 sums, C in the input dtype; the
registered op uses the tanh-approximated GELU; never renumbered). Every version takes
``(a, b, bias)``:

- v0  PyTorch eager, unfused: ``torch.matmul``, ``+ bias``, ``F.gelu(approximate="tanh")``: three
      kernels; C is written by the GEMM, read and written by the bias add, read and written by
      the GELU.
- v1  v0 through ``torch.compile`` (GPU only): Inductor keeps cuBLAS for the product and fuses the
      bias and the GELU into one generated kernel: one extra read and write of C instead of two.
- v2  ``F.gelu(torch.addmm(bias, a, b))``: cuBLAS(Lt) adds the bias in its epilogue; the GELU is a
  second kernel.
- v3  Triton: Part 4's matmul (one program per tile of C, grouped order, autotuned over the same
      configs) with the epilogue applied to the fp32 accumulator in registers before the store: no
      extra pass at all.
- v4  Triton: Part 4's persistent TMA kernel (Hopper) with the same epilogue, the bias read once
  per tile.
- v5  ``torch._addmm_activation(bias, a, b, use_gelu=True)``: cuBLASLt's own GELU_BIAS epilogue
      (where torch takes the cuBLASLt path): the library's answer to v3 and v4.

``matmul_bias_act(a, b, bias, act)`` is the public function (v3's kernel); ``act`` is one of
``"gelu"`` (tanh approximation), ``"relu"``, ``"silu"`` or ``"none"``. The cost is 2 M N K FLOPs
(the epilogue adds ~10 per element of C, nothing next to 2 K) on at least (M K + K N + M N + N) *
itemsize bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device, triton_interpreting
from snippets.common.baselines import compiled, needs_gpu
from snippets.common.gemm import (
    GROUP_M,
    HALF_TYPES,
    INTERPRET,
    check_operands,
    check_tma,
    config_space,
    gemm_flops,
    launch_tma,
    make_operands,
    needs_hopper,
    prune_configs,
    set_block_shapes,
    tile_coords,
    tolerance_for,
    triton_half_dtypes,
)
from snippets.registry import Impl, Op, device_generator, register

ACTS = ("gelu", "relu", "silu", "none")


# --8<-- [start:reference]
def act_ref(c: torch.Tensor, act: str) -> torch.Tensor:
    if act == "gelu":
        return F.gelu(c, approximate="tanh")   # 0.5 c (1 + tanh(sqrt(2/pi) (c + 0.044715 c^3)))
    if act == "relu":
        return torch.relu(c)
    if act == "silu":
        return F.silu(c)                       # c * sigmoid(c)
    return c


def matmul_bias_act_ref(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                        act: str = "gelu") -> torch.Tensor:
    """act(A @ B + bias), bias broadcast over the rows: products exact in fp32, sums in fp32
    (float64 stays float64), one rounding of C to the input dtype at the end. Unfused, the bias add
    and the activation each read and write all of C: 4 M N extra element transfers next to the
    GEMM's (M K + K N + M N)."""
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    c = torch.matmul(a.to(wide), b.to(wide)) + bias.to(wide)
    return act_ref(c, act).to(a.dtype)
# --8<-- [end:reference]


def _check(a, b, bias, act: str, device: str, dtypes=HALF_TYPES) -> tuple[int, int, int]:
    """A (M x K) and B (K x N) any strides (check_operands), bias (N,) contiguous, same dtype and
    device; act one of ACTS. Returns (M, N, K)."""
    m, n, k = check_operands(a, b, dtypes, device=device, contiguous=False)
    check_tensors(("a", "bias"), (a, bias), dtypes=dtypes, device=device, same_shape=False,
                  contiguous=False)
    if bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), one value per column of C, got "
                         f"{tuple(bias.shape)}")
    if not bias.is_contiguous():
        raise ValueError(f"bias must be contiguous, got stride {bias.stride()}; call .contiguous() "
                         "first")
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    return m, n, k


# --8<-- [start:torch]
def matmul_bias_gelu_torch(a, b, bias):
    """v0: three kernels: the cuBLAS GEMM writes C, the bias add reads and writes it, the GELU reads
    and writes it again."""
    _check(a, b, bias, "gelu", a.device.type if isinstance(a, torch.Tensor) else "cuda")
    return F.gelu(torch.matmul(a, b) + bias, approximate="tanh")


def matmul_bias_gelu_addmm(a, b, bias):
    """v2: addmm(bias, a, b) = bias + a @ b; torch hands a 1-D bias to cuBLASLt's bias epilogue, so
    the GEMM writes C with the bias added. The GELU is still a second kernel."""
    _check(a, b, bias, "gelu", a.device.type if isinstance(a, torch.Tensor) else "cuda")
    return F.gelu(torch.addmm(bias, a, b), approximate="tanh")


def matmul_bias_gelu_lt(a, b, bias):
    """v5: torch._addmm_activation with use_gelu=True: cuBLASLt's GELU_BIAS epilogue, bias and
    (tanh) GELU applied inside the GEMM, where torch takes the cuBLASLt path (CUDA, fp16/bf16, 1-D
    bias); elsewhere torch falls back to addmm then GELU."""
    _check(a, b, bias, "gelu", a.device.type if isinstance(a, torch.Tensor) else "cuda")
    return torch._addmm_activation(bias, a, b, use_gelu=True)
# --8<-- [end:torch]


def _chain(a, b, bias):
    return F.gelu(torch.matmul(a, b) + bias, approximate="tanh")


_chain_compiled = compiled(_chain)  # compiles on the first call for each shape and dtype


def matmul_bias_gelu_compiled(a, b, bias):
    """v1: v0's chain through torch.compile."""
    _check(a, b, bias, "gelu", "cuda")
    return _chain_compiled(a, b, bias)


# --------------------------------------------------------------------------------------------------
# The epilogue, and v3: Part 4's tiled kernel with it
# --------------------------------------------------------------------------------------------------

# --8<-- [start:epilogue]
@triton.jit
def _sigmoid(z):
    # 1 / (1 + e^-z), written out (tl.sigmoid is the same on the GPU but fails under the CPU
    # interpreter of Triton 3.9); for z very negative e^-z is inf and the result an exact 0, as it
    # should be.
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _bias_act(acc, bias, ACT: tl.constexpr):
    """The epilogue: acc (BLOCK_M, BLOCK_N) fp32 sums, bias (BLOCK_N,) fp32. A few operations per
    element of C, on values already in registers."""
    c = acc + bias[None, :]
    if ACT == "gelu":
        # 0.5 c (1 + tanh(u)) = c * sigmoid(2 u), u = sqrt(2/pi) (c + 0.044715 c^3): one exp, no
        # tanh needed
        c = c * _sigmoid(1.5957691216057308 * (c + 0.044715 * c * c * c))  # 2 sqrt(2/pi)
    elif ACT == "relu":
        c = tl.maximum(c, 0.0)
    elif ACT == "silu":
        c = c * _sigmoid(c)
    return c
# --8<-- [end:epilogue]


# --8<-- [start:kernel]
@triton.jit
def _matmul_epilogue_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, ACT: tl.constexpr):
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # (BLOCK_M, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    # (BLOCK_K, BLOCK_N)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the main loop of Part 4's _matmul_kernel, unchanged
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # The epilogue: BLOCK_N bias values (read once per tile, from L2 after the first tile of a
    # column), then the activation on the fp32 sums, then the one store of C.
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    c = _bias_act(acc, bias, ACT)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:kernel]


@functools.lru_cache(maxsize=None)
def autotuned(persistent: bool, dtype: torch.dtype):
    """v3's (or v4's) kernel under Part 4's autotuner: the same config space and shared-memory
    pruning as matmul v3 and v4, so the only difference measured is the epilogue."""
    kernel = _matmul_epilogue_tma_kernel if persistent else _matmul_epilogue_kernel
    return triton.autotune(configs=config_space(dtype.itemsize, persistent), key=["M", "N", "K"],
                           prune_configs_by={"early_config_prune": prune_configs})(kernel)


# --8<-- [start:launch]
def matmul_bias_act(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                    act: str = "gelu") -> torch.Tensor:
    """v3: act(a @ b + bias) in one kernel: autotuned tiles of C in grouped order, the epilogue
    in registers."""
    refuse_grad("matmul_bias_act", a, b, bias, instead="matmul_bias_act_ref")
    m, n, k = _check(a, b, bias, act, triton_device(), triton_half_dtypes())
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    args = (a, b, c, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
            c.stride(1))
    if triton_interpreting():  # one small config: several tiles and groups even at test sizes
        grid = (triton.cdiv(m, INTERPRET["BLOCK_M"]) * triton.cdiv(n, INTERPRET["BLOCK_N"]),)
        _matmul_epilogue_kernel[grid](*args, ACT=act, **INTERPRET)
    else:
        grid = lambda meta: (  # noqa: E731
            triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        autotuned(False, a.dtype)[grid](*args, ACT=act)
    return c


def matmul_bias_gelu(a, b, bias):
    """v3 with the registered op's activation."""
    refuse_grad("matmul_bias_gelu", a, b, bias, instead="matmul_bias_act_ref")
    return matmul_bias_act(a, b, bias, "gelu")
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# v4: Part 4's persistent TMA kernel with the epilogue
# --------------------------------------------------------------------------------------------------

# --8<-- [start:persistent]
@triton.jit
def _matmul_epilogue_tma_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                                B_KMAJOR: tl.constexpr, ACT: tl.constexpr, FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([off_m, k * BLOCK_K])      # (BLOCK_M, BLOCK_K), one TMA copy
            if B_KMAJOR:
                b = b_desc.load([off_n, k * BLOCK_K]).T
            else:
                b = b_desc.load([k * BLOCK_K, off_n])  # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc)
        # The epilogue, as in v3, before C's tile is split into the two halves that TMA stores.
        offs_n = off_n + tl.arange(0, BLOCK_N)
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        c = _bias_act(acc, bias, ACT)
        halves = tl.permute(tl.reshape(c, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([off_m, off_n], left.to(c_desc.dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
# --8<-- [end:persistent]


# --8<-- [start:tma_launch]
def matmul_bias_act_persistent(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                               act: str = "gelu") -> torch.Tensor:
    """v4: one program per SM over the tiles of C; A, B and C moved by TMA (launch_tma, the
    launcher of Part 4's v4); the epilogue in registers."""
    refuse_grad("matmul_bias_act_persistent", a, b, bias, instead="matmul_bias_act_ref")
    m, n, _ = _check(a, b, bias, act, triton_device(), triton_half_dtypes())
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    return launch_tma(_matmul_epilogue_tma_kernel, autotuned, a, b, c, (bias,), dict(ACT=act))


def matmul_bias_gelu_persistent(a, b, bias):
    """v4 with the registered op's activation."""
    refuse_grad("matmul_bias_gelu_persistent", a, b, bias, instead="matmul_bias_act_ref")
    return matmul_bias_act_persistent(a, b, bias, "gelu")
# --8<-- [end:tma_launch]


# --8<-- [start:compile_sm90]
def hopper_job(dtype: torch.dtype = torch.bfloat16, act: str = "gelu", persistent: bool = True,
               block_m: int = 128, block_n: int = 256, num_warps: int = 8,
               num_stages: int = 3) -> tuple:
    """A ``(kernel, signature, constexprs, options)`` job for
    snippets.common.introspect.compile_many: v4's (or v3's) kernel as the autotuner would launch one
    of its configs on sm_90, for checking without a Hopper GPU that the epilogue compiles next to
    wgmma and TMA and costs no spills."""
    t = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    bk = 128 // dtype.itemsize
    consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk, GROUP_M=GROUP_M, ACT=act)
    sig = {"bias_ptr": f"*{t}", "M": "i32", "N": "i32", "K": "i32"}
    if persistent:
        sig = {"a_desc": f"tensordesc<{t}[{block_m}, {bk}]>",
               "b_desc": f"tensordesc<{t}[{bk}, {block_n}]>",
               "c_desc": f"tensordesc<{t}[{block_m}, {block_n // 2}]>", **sig}
        consts.update(NUM_SMS=132, B_KMAJOR=False, FLATTEN=True)
        kernel = _matmul_epilogue_tma_kernel
    else:
        sig = {"a_ptr": f"*{t}", "b_ptr": f"*{t}", "c_ptr": f"*{t}", **sig,
               "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
        consts.update(stride_ak=1, stride_bn=1, stride_cn=1)
        kernel = _matmul_epilogue_kernel
    divisible = [name for name, ty in sig.items() if ty[0] == "*" or ty == "i32"]
    return kernel, sig, consts, dict(num_warps=num_warps, num_stages=num_stages,
                                     divisible=divisible)
# --8<-- [end:compile_sm90]


# --------------------------------------------------------------------------------------------------
# What fusing the epilogue saves
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cost]
@dataclass(frozen=True)
class EpilogueCost:
    gemm_s: float     # 2 M N K FLOPs at the given tensor-core rate
    gemm_bytes: int   # what the fused kernel must move: A, B, bias read, C written once
    extra_bytes: int  # what the unfused bias add and activation add: C read and written twice, bias
    extra_s: float    # those bytes at the given bandwidth

    @property
    def overhead(self) -> float:
        """The unfused passes' time as a fraction of the GEMM's."""
        return self.extra_s / self.gemm_s


def epilogue_cost(m: int, n: int, k: int, itemsize: int, tflops: float,
                  bandwidth_gbs: float) -> EpilogueCost:
    """Unfused C = act(A @ B + bias): the GEMM, then a bias add (reads C and the bias, writes C) and
    an activation (reads C, writes C), each at ``bandwidth_gbs``. Fused, the two extra
    passes vanish."""
    extra = (4 * m * n + n) * itemsize
    return EpilogueCost(gemm_s=2 * m * n * k / (tflops * 1e12),
                        gemm_bytes=(m * k + k * n + m * n + n) * itemsize,
                        extra_bytes=extra, extra_s=extra / (bandwidth_gbs * 1e9))
# --8<-- [end:cost]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """A (m x k) and B (k x n) standard normal (as the Part 3 and 4 GEMMs), and a bias of n drawn
    from N(0, 4^2): entries of A @ B are ~sqrt(K) in size, so a bias of that order moves the GELU's
    operating point."""
    a, b = make_operands(size, dtype, device, gen)
    bias = 4.0 * torch.randn(size["n"], generator=device_generator(gen, device), device=device)
    return a, b, bias.to(dtype)


def _bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    return (m * k + k * n + m * n + n) * dtype.itemsize


def lt_missing() -> str | None:
    """v5 needs torch's private _addmm_activation (present since torch 1.13) and a GPU to be the
    cuBLASLt path."""
    if not hasattr(torch, "_addmm_activation"):
        return "this torch has no torch._addmm_activation"
    return needs_gpu()


# 4096^3: A, B and C are 32 MiB each in bf16; there the two unfused passes over C cost the most
# relative to the GEMM (epilogue_cost). The sweep adds 1024, 2048 (C small next to the GEMM's launch
# and ramp) and 8192.
HEADLINE = {"m": 4096, "n": 4096, "k": 4096}
SWEEP = [{"m": s, "n": s, "k": s} for s in (1024, 2048, 4096, 8192)]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP])
# N a multiple of 8 at every size: the TMA version needs 16-byte rows (it refuses others; tests
# cover that).
TEST_SIZES = [{"m": m, "n": n, "k": k}
              for m, n, k in ((1, 8, 8), (17, 40, 24), (64, 64, 64), (100, 136, 72))]

SOURCES = (_matmul_epilogue_kernel, _bias_act, _sigmoid, tile_coords, matmul_bias_act,
           config_space, prune_configs, _check)
TMA_SOURCES = (_matmul_epilogue_tma_kernel, _bias_act, _sigmoid, tile_coords,
               matmul_bias_act_persistent, launch_tma, set_block_shapes, config_space,
               prune_configs, check_tma, _check)

matmul_epilogue = register(Op(
    name="matmul_epilogue", part=5, chapter="part5/epilogue.md",
    title="GEMM + bias + GELU (epilogue fusion)", reference=matmul_bias_act_ref,
    make_inputs=_make_inputs, bytes_moved=_bytes, flops=gemm_flops, metric="TFLOP/s",
    ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP, dtypes=(torch.bfloat16, torch.float16),
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, sweep_axis="m",
    # Part 4's matmul tolerance: C's rounding, and cuBLAS's split-K partial sums; the GELU's slope
    # is at most 1.13, so it does not widen the error, and v0's two extra roundings of C fit
    # in atol.
    tolerances={d: tolerance_for(MAX_K, d) for d in HALF_TYPES},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
matmul_epilogue.add(Impl("v0", matmul_bias_gelu_torch, "PyTorch",
                         "matmul, + bias, gelu: three kernels", (_check,)))
matmul_epilogue.add(Impl("v1", matmul_bias_gelu_compiled, "PyTorch", "torch.compile of v0's chain",
                         (_chain, _check), requires=needs_gpu, origin="library"))
matmul_epilogue.add(Impl("v2", matmul_bias_gelu_addmm, "PyTorch",
                         "addmm (bias in cuBLAS's epilogue), gelu", (_check,), origin="library"))
matmul_epilogue.add(Impl("v3", matmul_bias_gelu, "Triton",
                         "Part 4's tiled kernel + epilogue in registers", SOURCES, device="any",
                         dtypes=triton_half_dtypes()))
matmul_epilogue.add(Impl("v4", matmul_bias_gelu_persistent, "Triton",
                         "persistent TMA kernel + epilogue", TMA_SOURCES, device="any",
                         dtypes=triton_half_dtypes(), requires=needs_hopper))
matmul_epilogue.add(Impl("v5", matmul_bias_gelu_lt, "PyTorch",
                         "torch._addmm_activation: cuBLASLt GELU_BIAS", (_check,),
                         requires=lt_missing, origin="library"))

"""FlashAttention's forward on Hopper: step 1 (TMA, mbarriers and ``wgmma``, written by hand),
step 2 (the two consumer warpgroups ping-pong), step 3 (each warpgroup's softmax overlaps its
own P V product), step 4 (step 2 with fewer instructions per tile in the softmax) and step 5
(step 4 in a persistent grid).

``o = softmax(q k^T * scale) v`` for bf16 q, k, v of shape (B, H, S, D) with D = 64 or 128, the same
S for queries and keys, with or without the causal mask (query i sees keys j <= i), and the row
log-sum-exp ``lse = log(sum_j exp(scale * q_i . k_j))`` (natural log, fp32, (B, H, S)) that a
backward recomputes P from. The kernel is ``csrc/hopper_attn/flash_fwd.cu``: one block per (128
query rows, head, batch); a producer warpgroup loads Q's tile once and K and V tiles of 128 keys
through a 2-stage ring with TMA; two consumer warpgroups (64 query rows each) compute S = Q K^T
with ``wgmma`` from shared memory, the online softmax in registers, and O += P V with P in
registers (the register-A form of ``wgmma``) and V read as an MN-major (transposed) operand.
Step 2 (``flash_fwd_hopper_pingpong``) is the same kernel compiled with ``PINGPONG``: the two
consumers take turns through two named barriers, each issuing one tile's products while the other
runs its softmax, with three K / V stages instead of two. Step 3 (``flash_fwd_hopper_overlap``)
adds ``OVERLAP``: inside a turn, the next tile's Q K^T is issued before the previous tile's P V,
in two ``wgmma`` groups, and the softmax runs after ``wgmma.wait_group 1`` (the scores are done),
while P V is still on the tensor cores. Step 4 (``flash_fwd_hopper_lean``) is step 2's kernel with
``LEAN``: the row max on raw scores, one FFMA and one ``ex2.approx`` per score, the mask on the
last tile only, O's rescale skipped when no row of a warp changed its max; its output is within
the same tolerance of the float64 reference, not step 1's bits. Step 5
(``flash_fwd_hopper_persistent``) runs step 4's consumers in a grid of one block per SM, each
looping over tiles (a query block of one head) with the K / V ring running on across them, each
block's next tile taken from a global counter as it frees up; the next tile's Q is loaded once
both consumers have issued their last Q K^T of the current tile. Step 4's bits.

This module checks the inputs, builds the three TMA tensor maps (Q, K and V viewed as 3-D
(B*H, S, D) tensors, boxes of 64 columns x 128 rows x one head with the 128-byte swizzle: a 128-wide
row of bf16 is 256 bytes, two swizzle spans, so a D = 128 tile is loaded as two boxes), compiles
the file with ``nvcc -cubin -arch=sm_90a`` once (cached under ``build/hopper_attn/``) and launches
it through CuPy on torch's stream. The tensor-map encoder and the sm_90 availability check are the
Hopper GEMM's (snippets/part6/gemm.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.cubin import Cubin
from snippets.common.gemm import num_sms
from snippets.part6.gemm import device_tensor_maps, needs_sm90
from snippets.part6.hopper import SMEM_LIMIT_SM90, TensorMapSpec

CU_FILE = "hopper_attn/flash_fwd.cu"
NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", "-arch=sm_90a")

# --8<-- [start:constants]
# The constants of flash_fwd.cu (tests/test_part6_hopper_attention.py compares)
BLOCK_M = 128  # query rows per block, 64 per consumer warpgroup
BLOCK_N = 128  # keys per K / V tile
STAGES = 2  # K / V tiles in flight
PINGPONG_STAGES = 3  # step 2: V of tile t - 1 is read a turn later
PANEL_COLS = 64  # bf16 columns of one 128-byte swizzled row: the inner dimension of every box
BOX_ROWS = 128  # rows of every box
SWIZZLE = "128B"
SWIZZLE_REPEAT = 1024  # the kernel rounds shared memory up to this boundary
THREADS = 384  # a producer warpgroup and two consumers
HEAD_DIMS = (64, 128)
KERNELS = {64: "hopper_flash_fwd_d64", 128: "hopper_flash_fwd_d128"}
PINGPONG_KERNELS = {64: "hopper_flash_fwd_pingpong_d64", 128: "hopper_flash_fwd_pingpong_d128"}
OVERLAP_KERNELS = {64: "hopper_flash_fwd_overlap_d64", 128: "hopper_flash_fwd_overlap_d128"}
LEAN_KERNELS = {64: "hopper_flash_fwd_lean_d64", 128: "hopper_flash_fwd_lean_d128"}
PERSIST_KERNELS = {64: "hopper_flash_fwd_persist_d64", 128: "hopper_flash_fwd_persist_d128"}
PERSIST_SCRATCH = 16  # step 5: one more mbarrier (q_empty) and the current tile's number
OVERLAP_SCRATCH = 256 * 4  # step 3: a word of shared memory per consumer thread (pin_softmax)
PINGPONG_BARRIERS = (1, 2)  # the named barrier consumer 0, 1 waits on for its turn
PINGPONG_THREADS = 256  # each counts both consumer warpgroups
PINGPONG_FIRST = 0  # the consumer whose turn comes first
LOG2E = 1.4426950408889634  # the kernel works in log2 units: e^x = 2^(x log2 e)
GRID_YZ_MAX = 65535  # gridDim.y carries the heads, gridDim.z the batch
# --8<-- [end:constants]


def smem_bytes(d: int, stages: int = STAGES, scratch: int = 0) -> int:
    """Dynamic shared memory of the kernel for head dim ``d``: Q's tile, ``stages`` x (K's tile, V's
    tile), 1 + 2 * stages mbarriers of 8 bytes, ``scratch`` bytes (step 3's), and the slack to
    align the base to 1024 bytes."""
    tile = BOX_ROWS * d * 2
    return tile * (1 + 2 * stages) + (1 + 2 * stages) * 8 + scratch + SWIZZLE_REPEAT


def tensor_map_spec(heads: int, s: int, d: int, address: int) -> TensorMapSpec:
    """Q's, K's or V's tensor map: (B*H = heads, S, D) row-major bf16 seen as 3-D, dimensions
    innermost first (D, S, heads), boxes of 64 columns (128 bytes, the span of the 128B swizzle) x
    128 rows x one head. A box never crosses into the next head: rows past S arrive as zeros."""
    return TensorMapSpec(2, (d, s, heads), (d * 2, s * d * 2), (PANEL_COLS, BOX_ROWS, 1),
                         swizzle=SWIZZLE, global_address=address).validate()


# --8<-- [start:checks]
def check_hopper_attention(name: str, q: object, k: object, v: object, causal: object,
                           scale: object) -> tuple[int, int, int, int, float]:
    """Refuse, before any launch and without a GPU, what the kernel cannot take; return (B, H, S,
    D) and the softmax scale. q, k, v: bf16 torch tensors of one shape (B, H, S, D), contiguous,
    on one device, D in HEAD_DIMS, S >= 1, 16-byte aligned (TMA); causal a bool; scale None
    (1 / sqrt(D)) or a finite number."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: {arg} must be bfloat16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name}: {arg} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"{name}: q, k, v must have one shape (B, H, S, D), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, s, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"{name}: head dim D = {d}; the kernel is compiled for D in {HEAD_DIMS}")
    if min(b, h, s) < 1:
        raise ValueError(f"{name}: q is empty (shape {tuple(q.shape)}): B, H and S must be >= 1")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be contiguous (B, H, S, D) with D innermost, got "
                             f"strides {t.stride()}; call .contiguous() first")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: {arg}'s data at {t.data_ptr():#x} is not 16-byte aligned, "
                             "as TMA requires")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v are on {q.device}, {k.device}, {v.device}")
    if h > GRID_YZ_MAX or b > GRID_YZ_MAX:
        raise ValueError(f"{name}: B = {b}, H = {h}: each must be at most {GRID_YZ_MAX} (the grid "
                         "is (S / 128, H, B))")
    if b * h * s >= 2**31:
        raise ValueError(f"{name}: B * H * S = {b * h * s} rows: the kernel indexes them with "
                         "32-bit ints")
    if not isinstance(causal, bool):
        raise TypeError(f"{name}: causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name}: scale must be None or a Python float, got "
                        f"{type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or not math.isfinite(scale * LOG2E):
        raise ValueError(f"{name}: scale = {scale} must be finite")
    smem = smem_bytes(d, PINGPONG_STAGES, OVERLAP_SCRATCH)  # the largest of the steps (3)
    if smem > SMEM_LIMIT_SM90:
        raise ValueError(f"{name}: {smem} bytes of shared memory exceed {SMEM_LIMIT_SM90}")
    for arg, t in (("q", q), ("k", k), ("v", v)):  # what cuTensorMapEncodeTiled would refuse
        try:
            tensor_map_spec(b * h, s, d, t.data_ptr())
        except ValueError as exc:
            raise ValueError(f"{name}: {arg}: {exc}") from None
    return b, h, s, d, scale
# --8<-- [end:checks]


# --8<-- [start:reference]
REFERENCE_SCORES = 2**27  # score elements the reference holds at once: 1 GiB of float64


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel computes, in float64: o = softmax(q k^T * scale, masked if causal) v and
    lse = logsumexp of each row of the scaled (masked) scores. Shapes (B, H, S, D) and (B, H, S).
    A few heads at a time: their S x S scores stay under 2^27 elements (1 GiB of float64), where
    all B x H heads at once would not fit in a GPU's memory at S = 16384."""
    b, h, s, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1) if causal else None
    o = torch.empty((b * h, s, v.shape[-1]), dtype=torch.float64, device=q.device)
    lse = torch.empty((b * h, s), dtype=torch.float64, device=q.device)
    qs, ks, vs = (t.reshape(b * h, s, t.shape[-1]) for t in (q, k, v))
    step = max(1, REFERENCE_SCORES // (s * s))
    for i in range(0, b * h, step):
        qi, ki, vi = (t[i:i + step].double() for t in (qs, ks, vs))
        scores = torch.matmul(qi, ki.transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(mask, float("-inf"))
        lse[i:i + step] = torch.logsumexp(scores, dim=-1)
        o[i:i + step] = torch.matmul(torch.exp(scores - lse[i:i + step, :, None]), vi)
    return o.view(b, h, s, -1), lse.view(b, h, s)
# --8<-- [end:reference]


# --8<-- [start:build]
# flash_fwd.cu is compiled with nvcc once per source text, flags and toolkit, and loaded by CuPy per
# device (snippets.common.cubin): wgmma needs sm_90a, which NVRTC through CuPy cannot target.
CUBIN = Cubin(CU_FILE, NVCC_FLAGS, name="hopper_attn")


def nvcc_command(out: Path) -> list[str]:
    """The command that compiles flash_fwd.cu to a cubin for sm_90a (the tests run it too)."""
    return CUBIN.nvcc_command(out)


def build_cubin() -> Path:
    """The cubin of the current flash_fwd.cu, compiled if it is not built yet."""
    return CUBIN.build()


def kernel(name: str, device_index: int):
    """The ``__global__`` function ``name`` of the sm_90a cubin, loaded on this device by CuPy."""
    return CUBIN.kernel(name, device_index)
# --8<-- [end:build]


# --8<-- [start:launch]
# What a step changes on the host: its kernels, its K / V stages and its scratch (shared memory)
STEPS = {1: (KERNELS, STAGES, 0), 2: (PINGPONG_KERNELS, PINGPONG_STAGES, 0),
         3: (OVERLAP_KERNELS, PINGPONG_STAGES, OVERLAP_SCRATCH),
         4: (LEAN_KERNELS, PINGPONG_STAGES, 0),
         5: (PERSIST_KERNELS, PINGPONG_STAGES, PERSIST_SCRATCH)}
# Steps whose grid is one block per SM (at most), each looping over tiles; their kernels take B * H
PERSISTENT_STEPS = (5,)
# Steps whose kernels take the row max on the raw scores, which commutes with the scale only when
# the scale is >= 0: a negative scale runs as -scale on -k (the same scores: negating a bf16
# operand negates every product and sum exactly)
RAW_MAX_STEPS = (4, 5)


def launch_step(step: int, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check, then launch step ``step``'s kernel for q's head dim: (o, lse)."""
    b, h, s, d, scale = check_hopper_attention(name, q, k, v, causal, scale)
    refuse_grad(name, q, k, v, instead="torch.nn.functional.scaled_dot_product_attention")
    if q.device.type != "cuda":
        raise RuntimeError(f"{name}: q, k, v must be CUDA tensors (on an H100 or H200), got "
                           f"{q.device}")
    reason = needs_sm90()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    kernels, stages, scratch = STEPS[step]
    if step in RAW_MAX_STEPS and scale < 0:
        k, scale = torch.neg(k), -scale
    o = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    specs = tuple(tensor_map_spec(b * h, s, d, t.data_ptr()) for t in (q, k, v))
    tmaps = device_tensor_maps(specs, q.device)
    dev = q.device.index if q.device.index is not None else 0
    fn = kernel(kernels[d], dev)
    smem = smem_bytes(d, stages, scratch)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem  # above 48 KB needs the opt-in
    args = (tmaps, o, lse, np.int32(s), np.float32(scale * LOG2E), np.int32(causal))
    grid = (-(-s // BLOCK_M), h, b)
    if step in PERSISTENT_STEPS:
        tiles = grid[0] * h * b  # < 2**31: check_hopper_attention bounds B * H * S
        grid = (min(tiles, num_sms(dev)), 1, 1)
        # the tile counter the blocks take their next tiles from: zeroed for every launch
        args += (np.int32(b * h), torch.zeros(1, dtype=torch.int32, device=q.device))
    with torch.cuda.device(q.device):
        cuda.launch(fn, grid, THREADS, args, shared_mem=smem)
    return o, lse


def flash_fwd_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention's forward on an H100 / H200 (step 1): (o, lse), o bf16 (B, H, S, D), lse fp32
    (B, H, S), the natural log of each row's softmax denominator (of the scaled scores)."""
    return launch_step(1, "flash_fwd_hopper", q, k, v, causal, scale)


def flash_fwd_hopper_pingpong(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              causal: bool = False,
                              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2: like ``flash_fwd_hopper`` (same checks, same outputs), the two consumer warpgroups
    ping-pong: one's softmax runs while the other's products do."""
    return launch_step(2, "flash_fwd_hopper_pingpong", q, k, v, causal, scale)


def flash_fwd_hopper_overlap(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             causal: bool = False,
                             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: like ``flash_fwd_hopper_pingpong`` (same checks, same outputs, the same bits as
    step 1), each warpgroup issues the next tile's Q K^T before the previous tile's P V and runs
    its softmax while that P V is on the tensor cores."""
    return launch_step(3, "flash_fwd_hopper_overlap", q, k, v, causal, scale)


def flash_fwd_hopper_lean(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          causal: bool = False,
                          scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4: like ``flash_fwd_hopper_pingpong`` (same checks, same outputs, same turns), with a
    softmax of fewer instructions per score (the scale folded into one FFMA before
    ``ex2.approx.ftz``, the mask on the last tile only, O's rescale skipped when no row of a warp
    changed its max). Not step 1's bits: within the float64 reference's tolerance."""
    return launch_step(4, "flash_fwd_hopper_lean", q, k, v, causal, scale)


def flash_fwd_hopper_persistent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                causal: bool = False,
                                scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5: step 4 (same checks, same outputs, the same bits) in a persistent grid: one block
    per SM at most, each looping over (query block, head) tiles, the next tile's Q and first K / V
    tiles loaded while the current one finishes."""
    return launch_step(5, "flash_fwd_hopper_persistent", q, k, v, causal, scale)
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# Registration: the op of the FlashAttention-on-Hopper chapter, against cuDNN's fused attention
# --------------------------------------------------------------------------------------------------

from torch.nn.attention import SDPBackend  # noqa: E402

from snippets.common.attention import (  # noqa: E402
    attention_bytes,
    attention_flops,
    cudnn_missing,
    make_inputs,
    sdpa,
)
from snippets.registry import Impl, Op, register  # noqa: E402


def cudnn_attention(q, k, v, causal=False):
    """v0: cuDNN's fused attention through SDPA (the library the ladder is judged against)."""
    return sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)


def hopper_attention_v1(q, k, v, causal=False):
    """v1: step 1 of the Hopper ladder (TMA, a producer and two consumer warpgroups, wgmma for both
    products, P from registers); the output only (the log-sum-exp is for a backward)."""
    return flash_fwd_hopper(q, k, v, causal)[0]


def hopper_attention_v2(q, k, v, causal=False):
    """v2: like v1, the two consumer warpgroups ping-pong: one's softmax overlaps the other's
    GEMMs (FlashAttention-3's inter-warpgroup scheduling); the output only."""
    return flash_fwd_hopper_pingpong(q, k, v, causal)[0]


def hopper_attention_v3(q, k, v, causal=False):
    """v3: like v2, each warpgroup issues the next tile's QK^T before the previous tile's PV and
    runs its softmax while the PV product is on the tensor cores (FlashAttention-3's
    intra-warpgroup overlap); the output only."""
    return flash_fwd_hopper_overlap(q, k, v, causal)[0]


def hopper_attention_v4(q, k, v, causal=False):
    """v4: like v2, with fewer instructions per tile in the softmax (scale folded into the
    exponent's FFMA, ex2.approx, the mask on the last tile only, O's rescale skipped when no row
    max moved); the output only."""
    return flash_fwd_hopper_lean(q, k, v, causal)[0]


def hopper_attention_v5(q, k, v, causal=False):
    """v5: v4 in a persistent grid (a block per SM looping over tiles, the next tile's loads under
    the current one's end); the output only."""
    return flash_fwd_hopper_persistent(q, k, v, causal)[0]


def reference_output(q, k, v, causal=False):
    """The registered reference: attention_ref's output, in float64."""
    return attention_ref(q, k, v, causal)[0]


# Part 5's sizes (its chapter's tables set the Triton kernel against the same cuDNN): the headline
# B 4, H 32, S 4096, D 128; S from 1024 to 16384 at B * S = 16384, with and without the mask; D 64.
HEADLINE = {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False}
SWEEP = [{"b": 16384 // s, "h": 32, "s": s, "d": 128, "causal": causal}
         for causal in (False, True) for s in (1024, 2048, 4096, 8192, 16384)]
SWEEP += [{"b": 4, "h": 32, "s": 4096, "d": 64, "causal": causal} for causal in (False, True)]
TEST_SIZES = [{"b": 1, "h": 2, "s": 77, "d": 64, "causal": False},
              {"b": 2, "h": 1, "s": 130, "d": 128, "causal": True},
              {"b": 1, "h": 1, "s": 128, "d": 64, "causal": True}]
# bf16 against float64, sized like Part 5's for S = 16384 (P and o each rounded once to bf16)
TOLERANCE = (3e-2, 3e-2)

hopper_attention_fwd = register(Op(
    name="hopper_attention_fwd", part=6, chapter="part6/hopper-attention.md",
    title="FlashAttention forward on Hopper (bf16)", reference=reference_output,
    make_inputs=make_inputs, bytes_moved=attention_bytes, flops=attention_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP,
    dtypes=(torch.bfloat16,), bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances={torch.bfloat16: TOLERANCE}, sweep_axis="s"))
hopper_attention_fwd.add(Impl("v0", cudnn_attention, "PyTorch", "SDPA, cuDNN backend",
                              (torch.nn.functional.scaled_dot_product_attention, sdpa),
                              device="cuda", dtypes=(torch.bfloat16,), requires=cudnn_missing,
                              origin="library"))
# what every step's measurement depends on besides its own entry point
_STEP_SOURCES = (cuda.source_path(CU_FILE), launch_step, check_hopper_attention, tensor_map_spec,
                 build_cubin)
hopper_attention_fwd.add(Impl("v1", hopper_attention_v1, "CUDA",
                              "TMA + wgmma, producer and 2 consumer warpgroups, P in registers",
                              (flash_fwd_hopper, *_STEP_SOURCES), device="cuda",
                              dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_fwd.add(Impl("v2", hopper_attention_v2, "CUDA",
                              "like v1, the two consumer warpgroups ping-pong: one's softmax "
                              "overlaps the other's GEMMs (3 K/V stages)",
                              (flash_fwd_hopper_pingpong, *_STEP_SOURCES), device="cuda",
                              dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_fwd.add(Impl("v3", hopper_attention_v3, "CUDA",
                              "like v2, each warpgroup issues the next tile's QK^T before its "
                              "softmax, which overlaps the PV product",
                              (flash_fwd_hopper_overlap, *_STEP_SOURCES), device="cuda",
                              dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_fwd.add(Impl("v4", hopper_attention_v4, "CUDA",
                              "like v2, fewer instructions per tile: scale folded into the "
                              "exponent's FFMA, ex2.approx, mask and O rescale only when needed",
                              (flash_fwd_hopper_lean, *_STEP_SOURCES), device="cuda",
                              dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_fwd.add(Impl("v5", hopper_attention_v5, "CUDA",
                              "like v4, in a persistent grid: a block per SM loops over tiles, "
                              "the next tile's Q and K/V loaded under the current one's end",
                              (flash_fwd_hopper_persistent, *_STEP_SOURCES), device="cuda",
                              dtypes=(torch.bfloat16,), requires=needs_sm90))

"""FlashAttention's backward on Hopper, in three steps, on the forward's machinery (TMA, mbarriers,
a producer and two consumer warpgroups, ``wgmma``), and an attention that trains on it.

Given q, k, v (bf16, (B, H, S, D), D = 64 or 128), the forward's o and lse (the natural-log row
log-sum-exp of the scaled scores, fp32 (B, H, S)) and the upstream gradient do, each step returns
dq, dk, dv. The kernels are ``csrc/hopper_attn/flash_bwd.cu`` (which includes the forward's file
for its device helpers), three launches a call:

1. ``hopper_flash_bwd_prep_d*``: delta = rowsum(do * o), lse in log2 units, the fp32 dQ
   accumulator zeroed; rows padded to a multiple of 64 (the padding rows get lse2 = +inf, P = 0).
2. The main kernel: one block per (128 keys, head, batch). The producer loads the block's K and V
   once, then Q and dO tiles of 64 queries (TMA) and their lse2 and delta (1-D bulk copies)
   through a 2-stage ring. Each consumer warpgroup owns 64 keys and, per query tile, computes
   S^T = K Q^T and dP^T = V dO^T with ``wgmma`` from shared memory, P^T and dS^T in registers,
   dV += P^T dO and dK += dS^T Q with P^T and dS^T as the register A operand, and dQ = dS K from
   dS written to shared memory. How dQ reaches the accumulator is what the steps change:
   step 1 (``flash_bwd_hopper``, ``hopper_flash_bwd_d*``) adds each consumer's part with float2
   atomics; step 2 (``flash_bwd_hopper_bulk``) sums the block's dQ tile in shared memory (each
   consumer half of its columns) and adds it with one ``cp.reduce.async.bulk``; step 3
   (``flash_bwd_hopper_frag``) is step 2 with stores free of bank conflicts: dS through
   ``stmatrix .trans``, the dQ tile and the accumulator in the consumers' fragment order.
3. ``hopper_flash_bwd_dq_d*`` (``_dq_frag_d*`` for step 3): dq = scale * accumulator in bf16.

``HopperFlashAttention`` (``flash_attention_hopper``) pairs step 4 of the forward with step 3 of
the backward: an attention that trains, whose forward saves o and lse (4 bytes a row).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from snippets import cuda
from snippets._checks import GRADS_ONLY, refuse_grad
from snippets.common.cubin import Cubin
from snippets.part6.gemm import device_tensor_maps, needs_sm90
from snippets.part6.hopper import SMEM_LIMIT_SM90, TensorMapSpec
from snippets.part6.hopper_attention import (
    BOX_ROWS,
    LOG2E,
    PANEL_COLS,
    SWIZZLE,
    SWIZZLE_REPEAT,
    THREADS,
    check_hopper_attention,
    flash_fwd_hopper_lean,
    tensor_map_spec,
)

CU_FILE = "hopper_attn/flash_bwd.cu"
NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", "-arch=sm_90a")

# --8<-- [start:constants]
# The constants of flash_bwd.cu (tests/test_part6_hopper_attention_bwd.py compares)
BLOCK_N = 128  # keys per block: 64 per consumer warpgroup
BLOCK_M = 64  # queries per tile of the inner loop
STAGES = 2  # query tiles (Q, dO, lse2, delta) in flight
Q_BOX_ROWS = 64  # rows of the Q and dO boxes (K and V use the forward's 128-row boxes)
VEC_BYTES = BLOCK_M * 4  # one tile's lse2 (or delta), one bulk copy
DS_TILE_BYTES = 64 * 128  # a consumer's 64 x 64 bf16 dS tile
PREP_ROWS = 8  # rows per block of the prep kernel (a warp each)
DQ_THREADS = 256  # threads per block of the dQ kernel (2 elements each)
KERNELS = {64: "hopper_flash_bwd_d64", 128: "hopper_flash_bwd_d128"}
BULK_KERNELS = {64: "hopper_flash_bwd_bulk_d64", 128: "hopper_flash_bwd_bulk_d128"}  # step 2
FRAG_KERNELS = {64: "hopper_flash_bwd_frag_d64", 128: "hopper_flash_bwd_frag_d128"}  # step 3
DQ_FRAG_KERNELS = {64: "hopper_flash_bwd_dq_frag_d64", 128: "hopper_flash_bwd_dq_frag_d128"}
PREP_KERNELS = {64: "hopper_flash_bwd_prep_d64", 128: "hopper_flash_bwd_prep_d128"}
DQ_KERNELS = {64: "hopper_flash_bwd_dq_d64", 128: "hopper_flash_bwd_dq_d128"}
# --8<-- [end:constants]


def smem_bytes(d: int, bulk: bool = False) -> int:
    """Dynamic shared memory of the main kernel: K and V (128 rows x d), STAGES x (Q, dO) (64 rows
    x d), two dS tiles, step 2's fp32 dQ tile (64 x d), STAGES x (lse2, delta), 1 + 2 * STAGES
    mbarriers, and the slack to align the base to 1024 bytes."""
    kv_tile, q_tile = BOX_ROWS * d * 2, Q_BOX_ROWS * d * 2
    dq_tile = BLOCK_M * d * 4 if bulk else 0
    return (2 * kv_tile + 2 * STAGES * q_tile + 2 * DS_TILE_BYTES + dq_tile
            + 2 * STAGES * VEC_BYTES + (1 + 2 * STAGES) * 8 + SWIZZLE_REPEAT)


def padded_rows(s: int) -> int:
    """S rounded up to a whole number of query tiles: the rows of lse2, delta and the dQ
    accumulator per head."""
    return -(-s // BLOCK_M) * BLOCK_M


def q_tensor_map_spec(heads: int, s: int, d: int, address: int) -> TensorMapSpec:
    """Q's or dO's tensor map: as the forward's (``tensor_map_spec``), with boxes of 64 rows."""
    return TensorMapSpec(2, (d, s, heads), (d * 2, s * d * 2), (PANEL_COLS, Q_BOX_ROWS, 1),
                         swizzle=SWIZZLE, global_address=address).validate()


# --8<-- [start:checks]
def check_hopper_attention_bwd(name: str, q: object, k: object, v: object, o: object,
                               lse: object, do: object, causal: object,
                               scale: object) -> tuple[int, int, int, int, float]:
    """The forward's checks on q, k, v, causal and scale; o and do like q (bf16, q's shape,
    contiguous, 16-byte aligned, on q's device), lse fp32 (B, H, S) contiguous. Returns (B, H, S,
    D) and the scale."""
    b, h, s, d, scale = check_hopper_attention(name, q, k, v, causal, scale)
    for arg, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16 or t.shape != q.shape:
            raise ValueError(f"{name}: {arg} must be bfloat16 of q's shape {tuple(q.shape)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name}: {arg} must be contiguous and 16-byte aligned (TMA); call "
                             ".contiguous() first")
        if t.device != q.device:
            raise ValueError(f"{name}: {arg} is on {t.device}, q on {q.device}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"{name}: lse must be a torch.Tensor, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (b, h, s):
        raise ValueError(f"{name}: lse must be float32 of shape {(b, h, s)} (the forward's), got "
                         f"{lse.dtype} {tuple(lse.shape)}")
    if not lse.is_contiguous() or lse.device != q.device:
        raise ValueError(f"{name}: lse must be contiguous, on q's device")
    smem = smem_bytes(d, bulk=True)  # the larger of the two steps
    if smem > SMEM_LIMIT_SM90:
        raise ValueError(f"{name}: {smem} bytes of shared memory exceed {SMEM_LIMIT_SM90}")
    for arg, t in (("q", q), ("do", do)):
        try:
            q_tensor_map_spec(b * h, s, d, t.data_ptr())
        except ValueError as exc:
            raise ValueError(f"{name}: {arg}: {exc}") from None
    return b, h, s, d, scale
# --8<-- [end:checks]


# --8<-- [start:build]
CUBIN = Cubin(CU_FILE, NVCC_FLAGS, name="hopper_attn_bwd")


def nvcc_command(out: Path) -> list[str]:
    """The command that compiles flash_bwd.cu to a cubin for sm_90a (the tests run it too)."""
    return CUBIN.nvcc_command(out)


def kernel(name: str, device_index: int):
    """The ``__global__`` function ``name`` of the sm_90a cubin, loaded on this device by CuPy."""
    return CUBIN.kernel(name, device_index)
# --8<-- [end:build]


# --8<-- [start:launch]
# The main kernel of each step (steps 2 and 3 add the fp32 dQ tile to shared memory)
STEPS = {1: KERNELS, 2: BULK_KERNELS, 3: FRAG_KERNELS}


def launch_bwd(step: int, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, causal: bool,
               scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check, then launch step ``step``'s three kernels: (dq, dk, dv)."""
    b, h, s, d, scale = check_hopper_attention_bwd(name, q, k, v, o, lse, do, causal, scale)
    refuse_grad(name, q, k, v, o, lse, do, instead="flash_attention_hopper", why=GRADS_ONLY)
    if q.device.type != "cuda":
        raise RuntimeError(f"{name}: the tensors must be CUDA tensors (on an H100 or H200), got "
                           f"{q.device}")
    reason = needs_sm90()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    dev = q.device.index if q.device.index is not None else 0
    s_pad = padded_rows(s)
    rows = b * h * s_pad
    lse2 = torch.empty(rows, dtype=torch.float32, device=q.device)
    delta = torch.empty(rows, dtype=torch.float32, device=q.device)
    dq_acc = torch.empty((rows, d), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    specs = (q_tensor_map_spec(b * h, s, d, q.data_ptr()),
             tensor_map_spec(b * h, s, d, k.data_ptr()),
             tensor_map_spec(b * h, s, d, v.data_ptr()),
             q_tensor_map_spec(b * h, s, d, do.data_ptr()))
    tmaps = device_tensor_maps(specs, q.device)
    main = kernel(STEPS[step][d], dev)
    smem = smem_bytes(d, bulk=step >= 2)
    if main.max_dynamic_shared_size_bytes < smem:
        main.max_dynamic_shared_size_bytes = smem  # above 48 KB needs the opt-in
    pairs, quads = b * h * s * d // 2, rows * d // 4
    with torch.cuda.device(q.device):
        cuda.launch(kernel(PREP_KERNELS[d], dev), (-(-rows // PREP_ROWS),), PREP_ROWS * 32,
                    (o, do, lse, lse2, delta, dq_acc, np.int32(s), np.int32(s_pad),
                     np.int32(rows)))
        cuda.launch(main, (-(-s // BLOCK_N), h, b), THREADS,
                    (tmaps, lse2, delta, dq_acc, dk, dv, np.int32(s), np.int32(s_pad),
                     np.float32(scale * LOG2E), np.float32(scale), np.int32(causal)),
                    shared_mem=smem)
        if step >= 3:  # the accumulator in fragment order: a thread per float4 of it
            cuda.launch(kernel(DQ_FRAG_KERNELS[d], dev), (-(-quads // DQ_THREADS),), DQ_THREADS,
                        (dq_acc, dq, np.int32(s), np.int32(s_pad), np.uint64(quads),
                         np.float32(scale)))
        else:
            cuda.launch(kernel(DQ_KERNELS[d], dev), (-(-pairs // DQ_THREADS),), DQ_THREADS,
                        (dq_acc, dq, np.int32(s), np.int32(s_pad), np.uint64(pairs),
                         np.float32(scale)))
    return dq, dk, dv


def flash_bwd_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                     lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                     scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention's backward on an H100 / H200 (step 1): (dq, dk, dv), bf16 of q's shape, from the
    forward's o and lse (``flash_fwd_hopper*``) and the upstream gradient do."""
    return launch_bwd(1, "flash_bwd_hopper", q, k, v, o, lse, do, causal, scale)


def flash_bwd_hopper_bulk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                          scale: float | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 2: like ``flash_bwd_hopper`` (same checks, same outputs), each block's dQ tile summed
    over its 128 keys in shared memory (each consumer computes half of its columns) and added to
    the accumulator with one bulk reduction (``cp.reduce.async.bulk``) instead of atomics."""
    return launch_bwd(2, "flash_bwd_hopper_bulk", q, k, v, o, lse, do, causal, scale)


def flash_bwd_hopper_frag(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                          scale: float | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 3: step 2 with shared-memory stores free of bank conflicts: dS through ``stmatrix``
    (transposed), the dQ tile and the accumulator in the consumers' fragment order (the last
    kernel puts the rows back in order)."""
    return launch_bwd(3, "flash_bwd_hopper_frag", q, k, v, o, lse, do, causal, scale)
# --8<-- [end:launch]


# --8<-- [start:function]
class HopperFlashAttention(torch.autograd.Function):
    """Attention that trains on Hopper: step 4's forward, which saves o and lse, and step 3 of the
    backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        o, lse = flash_fwd_hopper_lean(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()  # autograd may hand over a broadcast view (the gradient of o.sum())
        return (*flash_bwd_hopper_frag(q, k, v, o, lse, do, ctx.causal, ctx.scale), None, None)


def flash_attention_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v on an H100 / H200, differentiable: HopperFlashAttention.apply.
    bf16 (B, H, S, D) with D = 64 or 128, the forward's checks."""
    return HopperFlashAttention.apply(q, k, v, causal, scale)
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# Registration: the backward against cuDNN's (Part 5's Triton backward is in its own op,
# flash_attention_bwd; a chapter module does not import another part)
# --------------------------------------------------------------------------------------------------

from torch.nn.attention import SDPBackend  # noqa: E402

from snippets.common.attention import (  # noqa: E402
    attention_bwd_bytes,
    attention_bwd_flops,
    attention_bwd_ref,
    cudnn_missing,
    make_inputs_bwd,
    sdpa,
    sdpa_backward,
)
from snippets.registry import Impl, Op, register  # noqa: E402


def cudnn_attention_bwd(q, k, v, do, causal=False, saved=None):
    """v0: cuDNN's backward through SDPA and autograd, timed alone: the first call on an input set
    runs the forward on leaves that require grad and keeps the graph in ``saved["cudnn"]``."""
    return sdpa_backward(SDPBackend.CUDNN_ATTENTION, "cudnn", q, k, v, do, causal, saved)


def _with_saved_forward(backward, name, q, k, v, do, causal, saved):
    """The first call on an input set runs step 4's forward and keeps o and lse in
    ``saved["hopper"]``; every call then runs only ``backward`` (three launches)."""
    refuse_grad(name, q, k, v, do, instead="flash_attention_hopper", why=GRADS_ONLY)
    if saved is None:
        saved = {}
    if "hopper" not in saved:
        saved["hopper"] = flash_fwd_hopper_lean(q, k, v, causal)
    o, lse = saved["hopper"]
    return backward(q, k, v, o, lse, do, causal)


def hopper_attention_bwd_v1(q, k, v, do, causal=False, saved=None):
    """v1: step 1 of the Hopper backward (dQ by atomics), timed alone."""
    return _with_saved_forward(flash_bwd_hopper, "hopper_attention_bwd_v1", q, k, v, do, causal,
                               saved)


def hopper_attention_bwd_v2(q, k, v, do, causal=False, saved=None):
    """v2: step 2 (dQ summed per block, one bulk reduction a tile), timed alone."""
    return _with_saved_forward(flash_bwd_hopper_bulk, "hopper_attention_bwd_v2", q, k, v, do,
                               causal, saved)


def hopper_attention_bwd_v3(q, k, v, do, causal=False, saved=None):
    """v3: step 3 (stores without bank conflicts: stmatrix for dS, dQ in fragment order), timed
    alone."""
    return _with_saved_forward(flash_bwd_hopper_frag, "hopper_attention_bwd_v3", q, k, v, do,
                               causal, saved)


HEADLINE = {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False}
# the forward's sweep, S from 1024 to 16384 at B * S = 16384, fewer points; D 64 at the headline
SWEEP = [{"b": 16384 // s, "h": 32, "s": s, "d": 128, "causal": causal}
         for causal in (False, True) for s in (1024, 4096, 16384)]
SWEEP += [{"b": 4, "h": 32, "s": 4096, "d": 64, "causal": causal} for causal in (False, True)]
# ragged S (not a multiple of 64 or of 128), both masks, both head dims, several heads
TEST_SIZES = [{"b": 1, "h": 2, "s": 77, "d": 64, "causal": False},
              {"b": 2, "h": 1, "s": 130, "d": 128, "causal": True},
              {"b": 1, "h": 1, "s": 128, "d": 64, "causal": True},
              {"b": 1, "h": 3, "s": 300, "d": 128, "causal": False}]
TOLERANCE = (3e-2, 3e-2)  # Part 5's bf16 backward tolerance against float64

hopper_attention_bwd = register(Op(
    name="hopper_attention_bwd", part=6, chapter="part6/hopper-attention.md",
    title="FlashAttention backward on Hopper (bf16)", reference=attention_bwd_ref,
    make_inputs=make_inputs_bwd, bytes_moved=attention_bwd_bytes, flops=attention_bwd_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP,
    dtypes=(torch.bfloat16,), bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES,
    tolerances={torch.bfloat16: TOLERANCE}, sweep_axis="s"))
hopper_attention_bwd.add(Impl("v0", cudnn_attention_bwd, "PyTorch",
                              "SDPA cuDNN backward (autograd.grad)",
                              (torch.nn.functional.scaled_dot_product_attention, sdpa,
                               sdpa_backward),
                              device="cuda", dtypes=(torch.bfloat16,),
                              requires=cudnn_missing, origin="library"))
_BWD_SOURCES = (cuda.source_path(CU_FILE), launch_bwd, check_hopper_attention_bwd,
                q_tensor_map_spec, tensor_map_spec, check_hopper_attention, padded_rows, smem_bytes,
                _with_saved_forward, flash_fwd_hopper_lean)
hopper_attention_bwd.add(Impl("v1", hopper_attention_bwd_v1, "CUDA",
                              "TMA + wgmma, 128 keys per block, P^T and dS^T in registers, dQ by "
                              "atomics", (flash_bwd_hopper, hopper_attention_bwd_v1, *_BWD_SOURCES),
                              device="cuda", dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_bwd.add(Impl("v2", hopper_attention_bwd_v2, "CUDA",
                              "like v1, dQ summed over the block's keys in shared memory and added "
                              "with one bulk reduction a tile",
                              (flash_bwd_hopper_bulk, hopper_attention_bwd_v2, *_BWD_SOURCES),
                              device="cuda", dtypes=(torch.bfloat16,), requires=needs_sm90))
hopper_attention_bwd.add(Impl("v3", hopper_attention_bwd_v3, "CUDA",
                              "like v2, shared-memory stores without bank conflicts: dS by "
                              "stmatrix, the dQ tile in fragment order",
                              (flash_bwd_hopper_frag, hopper_attention_bwd_v3, *_BWD_SOURCES),
                              device="cuda", dtypes=(torch.bfloat16,), requires=needs_sm90))

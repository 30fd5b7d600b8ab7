"""FP8 attention forward in Triton: both products on the fp8 tensor cores, the softmax unchanged.

``o = softmax(q k^T / sqrt(D)) v`` per (batch, head), with or without the causal mask (query i sees
keys j <= i), for e4m3 q, k and v of shape (B, H, S, D), D in (64, 128), any S. Each of q, k, v
carries one fp32 scale per (batch, head): ``x = x8 * scale[b, h]``. V comes *transposed* per head,
``vt`` of shape (B, H, D, S): Hopper's fp8 ``wgmma`` reads both operands K-major from shared memory,
and in ``P @ V`` the reduction runs over the keys, so V must be contiguous along the sequence. The
quantisation step writes V anyway; it writes it transposed (``quantize_attention_inputs``). The
output is bf16 (B, H, S, D).

Why one scale per (batch, head) and not per tensor: heads differ in magnitude (a few carry
outliers), one program works on one head and reads its three scales once, and it is the granularity
of FlashAttention-3's ``descale`` tensors. The scales are powers of two (each head's largest
magnitude maps into e4m3's top binade, (224, 448]): dequantising is then exact in fp32 and in bf16,
so the bf16 versions below compute on the very values the fp8 kernel sees, and the comparison of the
two is a comparison of kernels, not of inputs. The cost is at most one binade of e4m3's subnormal
range.

Versions of ``attention_fp8`` (every version gets the fp8 inputs, their scales and the same values
dequantised to bf16; each uses what it needs):

- v0  cuDNN's fused attention through SDPA, in bf16 on the dequantised values (the library).
- v1  this module's Triton kernel in bf16 (``FP8=False``): Part 5's FlashAttention forward (one
      program per block of queries and head, the online softmax in log2 units, the key blocks right
      of the diagonal skipped), rewritten here because a Part 6 module may not import Part 5.
- v2  the same kernel in FP8: S = (q8 k8^T) * (sq sk / sqrt(D)), the online softmax in fp32, P
      scaled into e4m3's range (P * 448, folded into the exponent) and cast to e4m3 for the second
      product, O = P8 vt8^T (each block's product promoted into the fp32 accumulator), and at the
      end O * sv / l, where l sums the same scaled P in fp32.

Cost model: FlashAttention's count, 4 * B * H * S^2 * D FLOPs (two products of 2 S^2 D per head),
halved by the causal mask; bytes: e4m3 q, k, v read once, bf16 o written once.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend

from snippets._checks import refuse_grad, triton_device, triton_interpreting
from snippets.common.attention import attention_flops, cudnn_missing, sdpa
from snippets.part6.fp8 import E4M3, format_facts
from snippets.part6.fp8_gemm import CEILING
from snippets.registry import Impl, Op, device_generator, register

HEAD_DIMS = (64, 128)
BF16_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # v1's inputs (fp16 / fp32: the CPU)
LOG2E = 1.4426950408889634  # the kernel uses exp2: e^x = 2^(x log2 e), one MUFU.EX2 instruction
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which carries batch x heads
E4M3_MAX = format_facts(E4M3).max  # 448: e4m3's largest finite value
# P = 2^(s - m) lies in [0, 1]; the fp8 kernel computes 448 * P = 2^(s - m + log2 448) instead, so
# that P's cast to e4m3 uses the whole range of the format (a P of 1 becomes 448, not 1, and values
# down to 2^-9 / 448 survive as subnormals instead of flushing below 2^-9).
P_LOG2_SCALE = tl.constexpr(math.log2(E4M3_MAX))


# --------------------------------------------------------------------------------------------------
# Quantisation and references
# --------------------------------------------------------------------------------------------------

# --8<-- [start:quantize]
def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, ..) -> (e4m3 x8, fp32 scales (B, H)) with x ~= x8 * scale[b, h]: per (batch, head),
    the power of two that puts the head's largest magnitude in (224, 448], e4m3's top binade."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 3:
        raise TypeError("quantize_heads takes a floating-point tensor (B, H, ...), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    amax = x.detach().float().abs().flatten(2).amax(dim=2).clamp(min=2.0**-100)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    x8 = (x.detach().float() / scale.reshape(*scale.shape, *([1] * (x.dim() - 2)))).to(E4M3)
    return x8, scale


def quantize_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(q8, k8, vt8, q_scale, k_scale, v_scale) from q, k, v (B, H, S, D): each quantised per head,
    and V written transposed, (B, H, D, S) with S contiguous, the layout fp8 wgmma reads."""
    (q8, sq), (k8, sk), (v8, sv) = quantize_heads(q), quantize_heads(k), quantize_heads(v)
    return q8, k8, v8.transpose(-1, -2).contiguous(), sq, sk, sv


def dequantize_heads(x8: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """x8 * scale[b, h] in ``dtype`` (exact in fp32, bf16 and float64: the scales are powers of
    two)."""
    return x8.to(dtype) * scale.to(dtype)[:, :, None, None]
# --8<-- [end:quantize]


# --8<-- [start:reference]
REFERENCE_SCORES = 2**27  # score elements the reference holds at once: 1 GiB of float64


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), masked if causal) v in float64, for (B, H, S, D) tensors. A few
    heads at a time, so that their S x S scores stay under 2^27 elements (1 GiB of float64)."""
    b, h, s, d = q.shape
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1) if causal else None
    out = torch.empty((b * h, s, v.shape[-1]), dtype=torch.float64, device=q.device)
    qs, ks, vs = (t.reshape(b * h, s, t.shape[-1]) for t in (q, k, v))
    step = max(1, REFERENCE_SCORES // (s * s))
    for i in range(0, b * h, step):
        scores = qs[i:i + step].double() @ ks[i:i + step].double().transpose(-1, -2) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(mask, float("-inf"))
        out[i:i + step] = torch.softmax(scores, dim=-1) @ vs[i:i + step].double()
    return out.view(b, h, s, -1)


def attention_fp8_ref(q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v, causal=False):
    """The registered reference: attention in float64 on the dequantised fp8 inputs, so that a
    version is judged on the error it adds beyond the quantisation of its inputs. (q, k, v, the
    bf16 copies for v0 and v1, hold the same values.)"""
    vt = dequantize_heads(vt8, v_scale, torch.float64)
    return attention_ref(dequantize_heads(q8, q_scale, torch.float64),
                         dequantize_heads(k8, k_scale, torch.float64), vt.transpose(-1, -2), causal)
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# The kernel: one program per (block of queries, batch x head)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:interpreter_cast]
@triton.jit
def _round_to_e4m3(x):
    # x in [0, 448] rounded to the nearest e4m3 value (ties to even), in fp32: the CPU interpreter's
    # fp32 -> fp8 cast (triton/runtime/interpreter.py, _convert_float, Triton 3.9) drops the carry
    # of a mantissa that rounds up into the exponent when the exponent is odd (1.96 becomes 1.0,
    # not 2.0), so under the interpreter P is rounded here first and the cast is then exact. On a
    # GPU the cast is one cvt.rn.satfinite.e4m3x2.f32 per two values and this is not compiled.
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & ~0xFFFFF  # 23 -> 3 mantissa bits, RNE
    normal = bits.to(tl.float32, bitcast=True)
    subnormal = (x + 16384.0) - 16384.0  # below 2^-6 e4m3 steps by 2^-9: the ulp of 2^14 in fp32
    return tl.where(x < 0.015625, subnormal, normal)
# --8<-- [end:interpreter_cast]


# --8<-- [start:inner]
@triton.jit
def _attn_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, lo, hi, S, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                HEAD_DIM: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr, DOT: tl.constexpr,
                PRECISION: tl.constexpr, EXACT_CAST: tl.constexpr):
    # Key/value blocks lo, lo + BLOCK_N, ... < hi. MASKED blocks may run past S or cross the
    # diagonal; the others are whole and fully visible: their loads and scores carry no mask.
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_offs = cols[:, None] * HEAD_DIM + offs_d[None, :]  # (BLOCK_N, D): D contiguous
        if V_T:
            v_offs = offs_d[:, None] * S + cols[None, :]  # (D, BLOCK_N) of vt: keys contiguous
            v_ok = cols[None, :] < S
        else:
            v_offs = k_offs  # (BLOCK_N, D) of v, D contiguous
            v_ok = cols[:, None] < S
        if MASKED:
            k = tl.load(k_base + k_offs, mask=cols[:, None] < S, other=0.0).to(DOT)
        else:
            k = tl.load(k_base + k_offs).to(DOT)
        # (BLOCK_M, BLOCK_N) scores in log2 units; fp8: e4m3 x e4m3 products summed in fp32, the
        # two scales and 1/sqrt(D) folded into qk_scale
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            keep = cols[None, :] < S
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, -float("inf"))
        # The online softmax: a new running max rescales the running sum and the accumulator.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        if FP8:
            # 448 * P, in (0, 448]: the subtraction the exponent needs anyway carries the scale
            p = tl.exp2(s - (m_new - P_LOG2_SCALE)[:, None])
        else:
            p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # fp32, in the same units as P
        if MASKED:
            v = tl.load(v_base + v_offs, mask=v_ok, other=0.0).to(DOT)
        else:
            v = tl.load(v_base + v_offs).to(DOT)
        if V_T:
            v = tl.trans(v)  # a view: the tile stays keys-contiguous, K-major for wgmma
        # P rounded to the operand type (e4m3: 3 mantissa bits) for the tensor cores; the sum
        # stays in the fp32 accumulator.
        if EXACT_CAST:  # the interpreter only (see _round_to_e4m3)
            p_op = _round_to_e4m3(p).to(DOT)
        else:
            p_op = p.to(DOT)
        if FP8:
            # Promotion, as in the fp8 GEMM: the tensor cores sum this block's BLOCK_N products
            # from zero in their narrow accumulator, and the fp32 sum over blocks happens here,
            # one FMA per element that replaces the multiply by alpha (Triton's default on sm_90
            # would carry the whole row's sum, S products, in the narrow accumulator).
            acc = acc * alpha[:, None] + tl.dot(p_op, v, out_dtype=tl.float32)
        else:
            acc = tl.dot(p_op, v, acc * alpha[:, None], input_precision=PRECISION,
                         out_dtype=tl.float32)
        m_i = m_new
    return acc, l_i, m_i
# --8<-- [end:inner]


# --8<-- [start:kernel]
@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sq_ptr, sk_ptr, sv_ptr, S, qk_scale,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr,
                     DOT: tl.constexpr, PRECISION: tl.constexpr, EXACT_CAST: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0,
                     "the diagonal stage must start on a key-block boundary")
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # batch * H + head; int64: B*H*S*D may pass 2^31
    base = bh * S * HEAD_DIM  # one head of q, k, v (or vt) and o: S * D elements
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < S
    q_offs = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + base + q_offs, mask=row_ok[:, None], other=0.0).to(DOT)  # kept on chip
    if FP8:  # this head's scales: q's and k's go into the scores, v's into the output
        qk_scale = qk_scale * tl.load(sq_ptr + bh) * tl.load(sk_ptr + bh)

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)  # running max of each row (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of P
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of P v
    k_base = k_ptr + base
    v_base = v_ptr + base
    if CAUSAL:
        # Key blocks left of the diagonal: every key precedes every query of this block, no mask.
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, 0,
                                    m0, S, qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, FP8, V_T,
                                    DOT, PRECISION, EXACT_CAST)
        # The blocks the diagonal crosses: masked. Blocks right of it are never loaded.
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, m0,
                                    tl.minimum(m0 + BLOCK_M, S), S, qk_scale, True, CAUSAL,
                                    BLOCK_N, HEAD_DIM, FP8, V_T, DOT, PRECISION, EXACT_CAST)
    else:
        # whole blocks unmasked, then the ragged tail (if any) masked
        full = (S // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, 0,
                                    full, S, qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, FP8, V_T,
                                    DOT, PRECISION, EXACT_CAST)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, full,
                                    S, S, qk_scale, True, CAUSAL, BLOCK_N, HEAD_DIM, FP8, V_T, DOT,
                                    PRECISION, EXACT_CAST)
    inv_l = 1.0 / l_i  # the 448 of P is in both acc and l: it cancels here
    if FP8:
        inv_l = inv_l * tl.load(sv_ptr + bh)
    o = acc * inv_l[:, None]
    tl.store(o_ptr + base + q_offs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
# --8<-- [end:kernel]


# --------------------------------------------------------------------------------------------------
# Launch configurations
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
def _cfg(block_m, block_n, warps, stages):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps,
                         num_stages=stages)


# Tried by triton.autotune on the first call for each (S, D, causal, fp8, layout), the same list for
# v1 and v2. Every config has BLOCK_M a multiple of BLOCK_N (the causal diagonal stage) and
# BLOCK_N >= 32 (the K of the second product is BLOCK_N, and fp8 wgmma takes K in steps of 32).
# BLOCK_M = 128 wants 8 warps: at D = 128 the fp32 accumulator, the fp32 scores and (fp8) the
# promoted block's product are 64 KiB each, 64 registers per thread each over 256 threads; over
# 128 threads they spill (ptxas, for sm_90: tests/test_part6_fp8_attention.py compiles every
# config). Shared memory per stage: a K tile and a V tile of BLOCK_N x D elements.
FWD_CONFIGS = [_cfg(128, 128, 8, 3), _cfg(128, 128, 8, 2), _cfg(128, 64, 8, 3),
               _cfg(128, 64, 8, 2), _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 4)]
AUTOTUNE_KEY = ["S", "HEAD_DIM", "CAUSAL", "FP8", "V_T"]
# Short sequences (a few blocks per head, launch-bound; each new S would be tuned again) take one
# fixed launch: (BLOCK_M, BLOCK_N, warps, stages).
TUNE_MIN_S = 512
FIXED_LAUNCH = (64, 64, 4, 2)
# Under the interpreter: small blocks, so that S = 17 .. 130 sees several key blocks, ragged tails
# and diagonal stages of several steps.
INTERPRETER_BLOCKS = (32, 16)
# --8<-- [end:configs]


@functools.lru_cache(maxsize=None)
def autotuned():
    """The kernel wrapped in triton.autotune (built on first use: nothing is tuned at import)."""
    return triton.autotune(FWD_CONFIGS, key=AUTOTUNE_KEY)(_attn_fwd_kernel)


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def _check_common(name: str, b: int, h: int, s: int, d: int, causal: object) -> None:
    if d not in HEAD_DIMS:
        raise ValueError(f"{name}: head dim D = {d}; the kernel takes D in {HEAD_DIMS}")
    if min(b, h, s) < 1:
        raise ValueError(f"{name}: empty input: B, H, S = {b}, {h}, {s} must all be >= 1")
    if b * h > MAX_GRID_Y:
        raise ValueError(f"{name}: B x H = {b * h} exceeds the {MAX_GRID_Y} programs of a grid's "
                         "second dimension")
    if s * d >= 2**31:
        raise ValueError(f"{name}: S * D = {s * d} does not fit the kernel's 32-bit offsets "
                         "within a head")
    if not isinstance(causal, bool):
        raise TypeError(f"{name}: causal must be a bool, got {type(causal).__name__}")


def check_fp8_attention(name, q8, k8, vt8, q_scale, k_scale, v_scale,
                        causal) -> tuple[int, int, int, int]:
    """Refuse, before any launch, what v2's kernel cannot take; return (B, H, S, D). q8, k8: e4m3
    (B, H, S, D) contiguous; vt8: e4m3 (B, H, D, S) contiguous (V transposed per head: a
    ``v.transpose(-1, -2)`` view is not contiguous and is refused; a V passed untransposed is
    refused unless S == D, where the shapes cannot tell); scales fp32 (B, H) contiguous; one
    device, the kernel's; D in HEAD_DIMS; causal a bool. The scales' values are not read (that
    would wait for the GPU): a zero or non-finite scale gives a zero or non-finite output."""
    device = triton_device()
    for arg, t in (("q8", q8), ("k8", k8), ("vt8", vt8), ("q_scale", q_scale),
                   ("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != device:
            raise ValueError(f"{name}: {arg} must be on a {device} device, got {t.device}")
        if t.device != q8.device:
            raise ValueError(f"{name}: {arg} is on {t.device} but q8 is on {q8.device}")
    for arg, t in (("q8", q8), ("k8", k8), ("vt8", vt8)):
        if t.dtype != E4M3:
            raise TypeError(f"{name}: {arg} must be torch.float8_e4m3fn, got {t.dtype}; "
                            "quantize_attention_inputs makes all six inputs")
        if t.dim() != 4:
            raise ValueError(f"{name}: {arg} must be 4-D, got shape {tuple(t.shape)}")
    b, h, s, d = q8.shape
    if k8.shape != q8.shape:
        raise ValueError(f"{name}: k8 has shape {tuple(k8.shape)}, q8 {tuple(q8.shape)}: "
                         "both must be (B, H, S, D)")
    if vt8.shape != (b, h, d, s):
        raise ValueError(f"{name}: vt8 must be V transposed per head, (B, H, D, S) = "
                         f"{(b, h, d, s)}, got {tuple(vt8.shape)}; fp8 wgmma reads V along the "
                         "sequence: pass v8.transpose(-1, -2).contiguous()")
    for arg, t in (("q8", q8), ("k8", k8), ("vt8", vt8)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be contiguous, got strides {t.stride()} for "
                             f"shape {tuple(t.shape)}"
                             + ("; vt8 must be sequence-contiguous: call .contiguous() on the "
                                "transposed view" if arg == "vt8" else ""))
    for arg, t in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: {arg} must be float32, got {t.dtype}")
        if t.shape != (b, h):
            raise ValueError(f"{name}: {arg} must hold one scale per (batch, head), shape "
                             f"{(b, h)}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be contiguous, got strides {t.stride()}")
    _check_common(name, b, h, s, d, causal)
    return b, h, s, d


def check_attention(name, q, k, v, causal) -> tuple[int, int, int, int]:
    """v1's inputs: q, k, v of one dtype in BF16_DTYPES (fp16 and fp32 for the CPU's interpreter,
    where bf16 products are emulated in fp32), one shape (B, H, S, D), contiguous, on the
    kernel's device."""
    device = triton_device()
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in BF16_DTYPES or t.dtype != q.dtype:
            raise TypeError(f"{name}: {arg} has dtype {t.dtype}; q, k, v must share one of "
                            f"{BF16_DTYPES}")
        if t.device.type != device or t.device != q.device:
            raise ValueError(f"{name}: {arg} must be on q's {device} device, got {t.device}")
        if t.dim() != 4 or t.shape != q.shape:
            raise ValueError(f"{name}: q, k, v must have one 4-D shape (B, H, S, D), got "
                             f"{tuple(t.shape)} for {arg}, {tuple(q.shape)} for q")
        if not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be contiguous, got strides {t.stride()}")
    b, h, s, d = q.shape
    _check_common(name, b, h, s, d, causal)
    return b, h, s, d
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# Host functions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:launch]
def _launch(q, k, v, scales, causal: bool, fp8: bool, v_transposed: bool,
            config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """The one launcher of v1 and v2, on checked inputs. ``scales`` is (sq, sk, sv) for fp8 and
    (None, None, None) otherwise; ``v`` is vt (B, H, D, S) when ``v_transposed``. The output is
    bf16 for fp8 inputs, q's dtype otherwise. ``config`` (BLOCK_M, BLOCK_N, warps, stages) fixes
    the launch; by default the interpreter's blocks, a fixed launch for short S, else the tuner."""
    b, h, s, d = q.shape
    if fp8:
        dot, precision = tl.float8e4nv, "tf32"  # (input_precision does not apply to fp8 operands)
    elif q.dtype == torch.float32 or triton_interpreting():
        dot, precision = tl.float32, "ieee"  # NumPy has no bf16: the interpreter widens to fp32
    else:
        dot, precision = (tl.bfloat16 if q.dtype == torch.bfloat16 else tl.float16), "tf32"
    o = torch.empty((b, h, s, d), device=q.device,
                    dtype=torch.bfloat16 if fp8 else q.dtype)
    args = (q, k, v, o, *scales, s, LOG2E / math.sqrt(d))
    consts = dict(HEAD_DIM=d, CAUSAL=causal, FP8=fp8, V_T=v_transposed, DOT=dot,
                  PRECISION=precision, EXACT_CAST=fp8 and triton_interpreting())
    if config is None and triton_interpreting():
        config = (*INTERPRETER_BLOCKS, 4, 2)
    elif config is None and s < TUNE_MIN_S:
        config = FIXED_LAUNCH
    if config is None:
        autotuned()[lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), b * h)](*args, **consts)
    else:
        bm, bn, warps, stages = config
        _attn_fwd_kernel[(triton.cdiv(s, bm), b * h)](*args, BLOCK_M=bm, BLOCK_N=bn,
                                                      num_warps=warps, num_stages=stages, **consts)
    return o


def attention_fp8(q8, k8, vt8, q_scale, k_scale, v_scale, causal: bool = False) -> torch.Tensor:
    """v2: FP8 attention's forward, o (B, H, S, D) bf16 from e4m3 q8, k8 (B, H, S, D), vt8
    (B, H, D, S) and their fp32 (B, H) scales. Forward only: refuses inputs that require grad."""
    name = "attention_fp8"
    check_fp8_attention(name, q8, k8, vt8, q_scale, k_scale, v_scale, causal)
    refuse_grad(name, q8, k8, vt8, q_scale, k_scale, v_scale,
                instead="torch.nn.functional.scaled_dot_product_attention in bf16")
    return _launch(q8, k8, vt8, (q_scale, k_scale, v_scale), causal, fp8=True, v_transposed=True)


def attention_bf16(q, k, v, causal: bool = False) -> torch.Tensor:
    """v1: the same kernel on bf16 (or fp16, fp32) q, k, v (B, H, S, D): Part 5's forward.
    Forward only: refuses inputs that require grad."""
    name = "attention_bf16"
    check_attention(name, q, k, v, causal)
    refuse_grad(name, q, k, v, instead="torch.nn.functional.scaled_dot_product_attention")
    return _launch(q, k, v, (None, None, None), causal, fp8=False, v_transposed=False)
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def cudnn_attention(q, k, v, causal=False):
    """SDPA with only cuDNN's backend allowed (it raises instead of falling back)."""
    return sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)


def needs_fp8_attention() -> str | None:
    """For v2: torch's float8 types, and fp8 tensor cores (compute capability 8.9+) unless the CPU
    interpreter emulates them."""
    if not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no float8_e4m3fn"
    if triton_interpreting():
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (or TRITON_INTERPRET=1)"
    if torch.cuda.get_device_capability() < (8, 9):
        return ("fp8 tensor cores need compute capability 8.9+, this GPU has "
                f"{torch.cuda.get_device_capability()}")
    return None


# --8<-- [start:versions]
# Each version refuses gradients on any of the nine tensors, not only those it reads: an output
# that silently carried no gradient for the others would train wrongly.
def attention_fp8_v0(q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v, causal=False):
    """v0: cuDNN's fused attention through SDPA in bf16, on the dequantised values."""
    refuse_grad("attention_fp8_v0", q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v,
                instead="SDPA itself")
    return cudnn_attention(q, k, v, causal)


def attention_fp8_v1(q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v, causal=False):
    """v1: the book's bf16 attention (this module's kernel with FP8=False)."""
    refuse_grad("attention_fp8_v1", q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v,
                instead="torch.nn.functional.scaled_dot_product_attention")
    return attention_bf16(q, k, v, causal)


def attention_fp8_v2(q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v, causal=False):
    """v2: the kernel in FP8: both products e4m3 x e4m3 -> fp32, P cast to e4m3 at 448 * P."""
    refuse_grad("attention_fp8_v2", q8, k8, vt8, q_scale, k_scale, v_scale, q, k, v,
                instead="torch.nn.functional.scaled_dot_product_attention in bf16")
    return attention_fp8(q8, k8, vt8, q_scale, k_scale, v_scale, causal)
# --8<-- [end:versions]


def make_inputs(size, dtype, device, gen):
    """q, k, v ~ N(0, 1) times a factor per (batch, head) and tensor drawn from [0.5, 1.5] (heads
    differ in magnitude, so a scale read for the wrong head or tensor is an error the check sees),
    quantised by quantize_attention_inputs; then the same values dequantised to bf16 (exactly: the
    scales are powers of two) for v0 and v1, and the causal flag."""
    g = device_generator(gen, device)
    b, h, s, d = size["b"], size["h"], size["s"], size["d"]
    qkv = []
    for _ in range(3):
        factor = 0.5 + torch.rand((b, h, 1, 1), generator=g, device=device)
        qkv.append(torch.randn((b, h, s, d), generator=g, device=device) * factor)
    q8, k8, vt8, sq, sk, sv = quantize_attention_inputs(*qkv)
    del qkv
    bf16 = [dequantize_heads(x8, sc, torch.bfloat16) for x8, sc in ((q8, sq), (k8, sk))]
    v = dequantize_heads(vt8, sv, torch.bfloat16).transpose(-1, -2).contiguous()
    return q8, k8, vt8, sq, sk, sv, *bf16, v, size["causal"]


def attention_bytes(size, dtype) -> int:
    """e4m3 q, k, v read (one byte each), bf16 o written (two): the fp8 path's minimum."""
    n = size["b"] * size["h"] * size["s"] * size["d"]
    return 3 * n + 2 * n


# Part 5's and Part 6's attention headline; the causal headline, D = 64, and a longer S at the same
# number of tokens (FlashAttention's benchmark shape: B * S = 16384).
HEADLINE = {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False}
SWEEP = [{"b": 4, "h": 32, "s": 4096, "d": 128, "causal": True},
         {"b": 4, "h": 32, "s": 4096, "d": 64, "causal": False},
         {"b": 4, "h": 32, "s": 4096, "d": 64, "causal": True},
         {"b": 1, "h": 32, "s": 16384, "d": 128, "causal": False},
         {"b": 1, "h": 32, "s": 16384, "d": 128, "causal": True}]
# Small, for the interpreter: S = 1, a ragged tail, both masks, both head dims.
# (cuDNN, v0, refuses a single query: the book's versions at S = 1 are in test_part6_fp8_attention)
TEST_SIZES = [{"b": 1, "h": 2, "s": 3, "d": 64, "causal": False},
              {"b": 2, "h": 1, "s": 17, "d": 64, "causal": True},
              {"b": 1, "h": 1, "s": 130, "d": 128, "causal": False}]
# --8<-- [start:tolerance]
# Against float64 attention on the dequantised inputs. e4m3's unit roundoff is u = 2^-4 (3 mantissa
# bits): P's cast moves each weight by at most u of itself, so each output moves by at most
# u * sum_j P_ij |v_j| / l_i, "u times the attention of |v|" (the tests hold every element to that
# bound). One (rtol, atol) for every size has to bound it without knowing v: the worst rows are
# those that see few keys (causal), where the few non-maximal weights are large. A float64 model of
# P's rounding alone (tests/test_part6_fp8_attention.py: test_tolerance_covers_the_model) over the
# first 256 causal rows of 128 heads with make_inputs' largest factor stays under half of
# rtol = u, atol = 4u. bf16 versions (v0, v1) are far inside it.
U_E4M3 = 2.0**-4
TOLERANCE = (U_E4M3, 4 * U_E4M3)
# --8<-- [end:tolerance]

attention_fp8_op = register(Op(
    name="attention_fp8", part=6, chapter="part6/fp8-attention.md",
    title="FP8 attention forward (e4m3 q, k, v; per-head scales)", reference=attention_fp8_ref,
    make_inputs=make_inputs, bytes_moved=attention_bytes, flops=attention_flops,
    metric="TFLOP/s", ceiling=CEILING, headline=HEADLINE, sweep=SWEEP, dtypes=(E4M3,),
    bench_dtypes=(E4M3,), test_sizes=TEST_SIZES, tolerances={E4M3: TOLERANCE}, sweep_axis="s",
    output_dtypes={E4M3: torch.bfloat16}))
SOURCES = (_attn_fwd_kernel, _attn_inner, _round_to_e4m3, _launch, autotuned)
attention_fp8_op.add(Impl("v0", attention_fp8_v0, "PyTorch", "SDPA, cuDNN backend, bf16",
                          (torch.nn.functional.scaled_dot_product_attention, cudnn_attention, sdpa),
                          device="cuda", requires=cudnn_missing, origin="library"))
attention_fp8_op.add(Impl("v1", attention_fp8_v1, "Triton",
                          "online softmax, bf16 operands (Part 5's forward)",
                          (*SOURCES, attention_bf16, check_attention), device="any"))
attention_fp8_op.add(Impl("v2", attention_fp8_v2, "Triton",
                          "both products fp8 wgmma, P cast to e4m3 at 448 * P, V transposed",
                          (*SOURCES, attention_fp8, check_fp8_attention), device="any",
                          requires=needs_fp8_attention))


# --------------------------------------------------------------------------------------------------
# Compiling for Hopper without a GPU
# --------------------------------------------------------------------------------------------------

# --8<-- [start:compile]
def compile_for_sm90(fp8: bool, v_transposed: bool, head_dim: int, causal: bool, block_m: int,
                     block_n: int, num_warps: int, num_stages: int):
    """Compile the forward for compute capability 9.0 on any machine (not under TRITON_INTERPRET,
    where the kernel is not a compilable object); Triton's CompiledKernel (``asm`` holds ttgir,
    ptx, cubin). fp8: e4m3 q, k and v (``v_transposed``: vt, else V as (S, D)), bf16 o; else bf16
    throughout. S is assumed a multiple of 16, as the JIT specialises a launch at S = 4096."""
    from snippets.common.introspect import triton_compile

    ty = "fp8e4nv" if fp8 else "bf16"
    sig = {"q_ptr": "*" + ty, "k_ptr": "*" + ty, "v_ptr": "*" + ty, "o_ptr": "*bf16",
           "S": "i32", "qk_scale": "fp32"}
    consts = dict(HEAD_DIM=head_dim, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, FP8=fp8,
                  V_T=v_transposed, DOT=tl.float8e4nv if fp8 else tl.bfloat16, PRECISION="tf32",
                  EXACT_CAST=False)
    if fp8:
        sig.update(sq_ptr="*fp32", sk_ptr="*fp32", sv_ptr="*fp32")
    else:
        consts.update(sq_ptr=None, sk_ptr=None, sv_ptr=None)
    divisible = ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "S"]
    return triton_compile(_attn_fwd_kernel, sig, consts, divisible, num_warps=num_warps,
                          num_stages=num_stages)
# --8<-- [end:compile]


__all__ = [
    "E4M3_MAX", "FWD_CONFIGS", "HEAD_DIMS", "HEADLINE", "TOLERANCE", "U_E4M3",
    "attention_bf16", "attention_flops", "attention_fp8", "attention_fp8_op", "attention_fp8_ref",
    "attention_ref", "check_attention", "check_fp8_attention", "compile_for_sm90",
    "dequantize_heads", "make_inputs", "quantize_attention_inputs", "quantize_heads",
]

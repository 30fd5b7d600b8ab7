"""Part 8, the capstone's decode step v6: v5's step with the block's small operations carried by
its GEMVs.

v5 (capstone_fused) stacked the projections and fused RoPE with the cache write; its measurement
(capstone.md) found the time saved per block about the same at 1B's and 8B's shapes: a fixed cost
per kernel removed, not faster reads. v6 removes the next kernels of each block the same way: the
operations between the products are folded into the products' own kernel, :func:`block_gemv`.

- **RMSNorm as the GEMV's prologue.** ``rmsnorm(x, g) @ W^T`` is ``r * ((x * g) @ W^T)`` with ``r
  = 1 / sqrt(mean(x^2) + eps)`` one number per row. Every program of the GEMV reads the whole row
  of x anyway, so it sums the squares as it goes and scales its outputs by ``r`` at the end: the
  norm's kernel, and its round trip through memory, are gone.
- **SwiGLU as the gate/up GEMV's epilogue.** A program owns rows n of the gate weight and the same
  rows of the up weight (rows n and F + n of the stacked matrix) and writes ``silu(gate) * up``,
  F values where v5 wrote 2 F and read them back.
- **The residual add as the epilogue** of the output and down projections: ``x + o @ W^T`` in one
  kernel.

A block is then seven kernels: the norm + q/k/v GEMV, v5's RoPE + cache write, the split-KV
attention's two, the output GEMV + residual, the norm + gate/up GEMV + SwiGLU, the down GEMV +
residual. The head is one more: the final norm + the LM head's GEMV.

The GEMV walks K with fp32 products. At batch 1 the products are elementwise (no tensor cores:
one row leaves nothing for them to reuse); from ``DOT_FROM`` rows on the batch is a skinny GEMM,
and the tile goes through ``tl.dot``, its rows padded to 16: elementwise, every row of the batch
would cost one more FMA per weight on the CUDA cores, and a batch of 8 is already bound by them.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import INT32_MAX, device_smem_limit, num_sms
from snippets.part5.rmsnorm import EPS
from snippets.part8.capstone import (
    capstone_decode,
    check_timed_call,
    graphed_step,
    needs_cuda_graphs,
)
from snippets.part8.capstone_fused import DTYPES, StackedDecoder, rope_append
from snippets.registry import Impl

DOT_FROM = 2    # rows of the batch from which the tile goes through tl.dot
MIN_DOT_B = 16  # tl.dot's smallest M: a batch tile of fewer rows is padded to it
MAX_DOT_B = 64  # rows per program on the tl.dot path; a larger batch is split over the grid


# --8<-- [start:kernel]
@triton.jit
def _block_gemv_kernel(x_ptr, g_ptr, w_ptr, res_ptr, y_ptr, B, N, K, eps,
                       NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                       DOT: tl.constexpr, IEEE: tl.constexpr, BLOCK_B: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # y (B, N) = [res +] epilogue(r * ((x * g) @ W^T)); with GLU, W is (2 N, K): gate rows, up rows
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    bs = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok, b_ok = rows < N, bs < B
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K       # gate (or only) rows of this program
    u_rows = w_rows + N.to(tl.int64) * K                   # the up rows, GLU only
    x_rows = x_ptr + bs.to(tl.int64)[:, None] * K
    ss = tl.zeros((BLOCK_B,), dtype=tl.float32)            # the rows' sums of squares (NORM)
    if DOT:
        acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
    else:  # elementwise products kept per lane, one reduction at the end (decode_gemv's plan)
        acc = tl.zeros((BLOCK_B, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if GLU:                                                # the up half's accumulator
        acc_u = tl.zeros_like(acc)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_rows + cols[None, :], mask=b_ok[:, None] & col_ok[None, :], other=0.0)
        x = x.to(tl.float32)
        if NORM:                                           # the norm's prologue: r at the end
            ss += tl.sum(x * x, axis=1)
            x = x * tl.load(g_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        w_ok = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_rows + cols[None, :], mask=w_ok, other=0.0)
        if GLU:
            u = tl.load(u_rows + cols[None, :], mask=w_ok, other=0.0)
        if DOT:
            if IEEE:                                       # fp32: no TF32 rounding of the inputs
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
                if GLU:
                    acc_u += tl.dot(x, tl.trans(u), input_precision="ieee")
            else:
                acc += tl.dot(x.to(w.dtype), tl.trans(w))
                if GLU:
                    acc_u += tl.dot(x.to(w.dtype), tl.trans(u))
        else:
            acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
            if GLU:
                acc_u += x[:, None, :] * u.to(tl.float32)[None, :, :]
    if DOT:
        y = acc
    else:
        y = tl.sum(acc, axis=2)
    if NORM:
        r = 1.0 / tl.sqrt(ss / K + eps)
        y = y * r[:, None]
    if GLU:                                                # SwiGLU: silu(gate) * up
        if DOT:
            yu = acc_u
        else:
            yu = tl.sum(acc_u, axis=2)
        if NORM:
            yu = yu * r[:, None]
        y = y / (1.0 + tl.exp(-y)) * yu
    out = bs.to(tl.int64)[:, None] * N + rows[None, :]
    ok = b_ok[:, None] & row_ok[None, :]
    if RESIDUAL:
        y += tl.load(res_ptr + out, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)
# --8<-- [end:kernel]


# --8<-- [start:configs]
def _configs(block_b: int, glu: bool, dot: bool) -> list[triton.Config]:
    """Tile shapes for a batch tile of ``block_b`` rows. Elementwise: decode_gemv's three shapes,
    BLOCK_K shortened so that each accumulator holds the same 4096 (or 8192) products per step;
    SwiGLU's two accumulators also get the first shape at twice that.
    tl.dot: a few (BLOCK_N, BLOCK_K) with software pipelining of the weight's loads."""
    if dot:
        return [triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_warps=w, num_stages=s)
                for bn, bk, w, s in ((16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4),
                                     (32, 256, 8, 3), (64, 128, 4, 3))]
    per = block_b * (2 if glu else 1)
    shapes = [(4, 1024, 4), (8, 512, 4), (16, 512, 8)]
    if glu:  # also twice the products per step: at 8B's gate/up widths the halved tiles were slower
        shapes.append((4, 2048, 4))
    return [triton.Config(dict(BLOCK_N=bn, BLOCK_K=max(16, bk // per)), num_warps=w)
            for bn, bk, w in shapes]


@functools.lru_cache(maxsize=None)
def _autotuned(block_b: int, glu: bool, dot: bool):
    return triton.autotune(configs=_configs(block_b, glu, dot), key=["N", "K"])(
        _block_gemv_kernel)
# --8<-- [end:configs]


# --8<-- [start:block_gemv]
def block_gemv(x: torch.Tensor, w: torch.Tensor, *, norm: torch.Tensor | None = None,
               eps: float = EPS, glu: bool = False, residual: torch.Tensor | None = None,
               tma: bool = False, split_k: int | None = None) -> torch.Tensor:
    """y = [residual +] f(rmsnorm(x, norm) @ W^T) for x (B, K) and W (N, K), one kernel.

    ``norm`` (K,): RMSNorm's weight, applied to x first (eps as Part 5's rmsnorm); ``glu``: W is
    (2 F, K), gate rows then up rows (``capstone_fused.stack_weights``), and y = silu(x W_g^T) *
    (x W_u^T), (B, F); ``residual`` (B, N): added to the result. Products and epilogue in fp32,
    y rounded once to x's dtype. Nothing is rounded between the norm and the product, or between
    the product and SwiGLU, where the unfused step rounds each.

    ``tma`` (v7): from ``DOT_FROM`` rows on, the batched product of :func:`_block_gemm_tma_kernel`
    (TMA loads, the weight on the MMA's M side) wherever :func:`tma_applies`; elsewhere, and at
    batch 1, the same kernel as without it. ``split_k`` (the TMA product without norm or SwiGLU):
    programs per tile of output rows, each summing a slice of K, their fp32 partial sums added
    by a second kernel (:func:`_split_k_sum_kernel`) with the residual; None chooses
    (:func:`split_k_for`), 1 is no split."""
    name = "block_gemv"
    tensors = {"x": x, "w": w, **({"norm": norm} if norm is not None else {}),
               **({"residual": residual} if residual is not None else {})}
    check_tensors(tuple(tensors), tuple(tensors.values()), dtypes=DTYPES, device=triton_device(),
                  same_shape=False, allow_empty=False)
    refuse_grad(name, *tensors.values(), instead="the unfused step (StaticDecoder.step)")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{name}: x must be (B, K) and w (N, K) with the same K, got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    b, k = x.shape
    if glu and w.shape[0] % 2:
        raise ValueError(f"{name}: glu needs w of 2 F rows (gate, then up), got {w.shape[0]}")
    n = w.shape[0] // 2 if glu else w.shape[0]
    if w.numel() > INT32_MAX or b * max(n, k) > INT32_MAX:
        raise ValueError(f"{name}: w {tuple(w.shape)} or x {tuple(x.shape)} is past the kernel's "
                         "32-bit row offsets")
    if norm is not None and norm.shape != (k,):
        raise ValueError(f"{name}: norm must be ({k},), got {tuple(norm.shape)}")
    if residual is not None and residual.shape != (b, n):
        raise ValueError(f"{name}: residual must be ({b}, {n}), got {tuple(residual.shape)}")
    if not eps > 0:
        raise ValueError(f"{name}: eps must be positive, got {eps}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):
        raise ValueError(f"{name}: split_k must be a positive int or None, got {split_k!r}")
    if split_k not in (None, 1) and (norm is not None or glu):
        raise ValueError(f"{name}: split_k needs the full row for the norm and SwiGLU; "
                         "it applies without them only")
    y = torch.empty(b, n, dtype=x.dtype, device=x.device)  # never the residual's storage
    dot = b >= DOT_FROM
    block_b = min(max(MIN_DOT_B, triton.next_power_of_2(b)), MAX_DOT_B) if dot else \
        triton.next_power_of_2(b)
    if dot and tma and tma_applies(x, w):
        return _launch_tma(x, w, norm, residual, y, glu, float(eps), block_b, split_k)
    args = (x, norm if norm is not None else x, w, residual if residual is not None else x, y,
            b, n, k, float(eps))
    flags = dict(NORM=norm is not None, GLU=glu, RESIDUAL=residual is not None, DOT=dot,
                 IEEE=x.dtype == torch.float32, BLOCK_B=block_b)
    if triton_interpreting():  # several programs and K steps at tiny sizes
        tile = dict(BLOCK_N=16, BLOCK_K=16) if dot else dict(BLOCK_N=4, BLOCK_K=16)
        grid = (triton.cdiv(n, tile["BLOCK_N"]), triton.cdiv(b, block_b))
        _block_gemv_kernel[grid](*args, **flags, **tile)
    else:
        _autotuned(block_b, glu, dot)[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),
                                                    triton.cdiv(b, block_b))](*args, **flags)
    return y
# --8<-- [end:block_gemv]


# --8<-- [start:tma_kernel]
@triton.jit
def _block_gemm_tma_kernel(x_desc, g_ptr, w_desc, res_ptr, y_ptr, B, N, K, eps,
                           NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                           SPLIT_K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
    # v7's batched product, transposed: y^T tile (BLOCK_N, BLOCK_B) = W tile @ x^T. The weight is
    # the MMA's M side, so a tile of 64 or 128 weight rows feeds wgmma from shared memory, where
    # TMA put it; only the small x tile passes through registers (for the norm). With pointer
    # loads the weight tile's 64-bit addresses alone filled the registers and spilled.
    # Split-K: program (., ., s) sums the s-th slice of K (whole BLOCK_Ks) and stores fp32 partials.
    tl.static_assert(SPLIT_K == 1 or not (NORM or GLU), "split-K without the norm and SwiGLU only")
    n0 = tl.program_id(0) * BLOCK_N
    b0 = tl.program_id(1) * BLOCK_B
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(2) * k_per
    ss = tl.zeros((BLOCK_B,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_B), dtype=tl.float32)
    if GLU:
        acc_u = tl.zeros_like(acc)
    for k0 in range(k_lo, tl.minimum(K, k_lo + k_per), BLOCK_K):
        x = x_desc.load([b0, k0])                          # (BLOCK_B, BLOCK_K), zeros past B
        if NORM:
            cols = k0 + tl.arange(0, BLOCK_K)
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            g = tl.load(g_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            x = (xf * g[None, :]).to(x.dtype)
        acc = tl.dot(w_desc.load([n0, k0]), tl.trans(x), acc)
        if GLU:                                            # the up rows: F + n
            acc_u = tl.dot(w_desc.load([N + n0, k0]), tl.trans(x), acc_u)
    y = acc
    if NORM:
        r = 1.0 / tl.sqrt(ss / K + eps)
        y = y * r[None, :]
    if GLU:                                                # SwiGLU: silu(gate) * up
        yu = acc_u
        if NORM:
            yu = yu * r[None, :]
        y = y / (1.0 + tl.exp(-y)) * yu
    rows = n0 + tl.arange(0, BLOCK_N)                      # a gate tile past F read up rows:
    bs = b0 + tl.arange(0, BLOCK_B)                        # its outputs are masked here
    out = bs.to(tl.int64)[None, :] * N + rows[:, None]
    ok = (bs < B)[None, :] & (rows < N)[:, None]
    if SPLIT_K > 1:                                        # y_ptr: (SPLIT_K, B, N) fp32 partials
        tl.store(y_ptr + tl.program_id(2).to(tl.int64) * B * N + out, y, mask=ok)
    else:
        if RESIDUAL:
            y += tl.load(res_ptr + out, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)
# --8<-- [end:tma_kernel]


# --8<-- [start:split_k]
@triton.jit
def _split_k_sum_kernel(part_ptr, res_ptr, y_ptr, total, SPLIT_K: tl.constexpr,
                        RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    # y = [res +] the sum of the SPLIT_K fp32 partials, in a fixed order: the same bits every run
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    part = part_ptr + i
    acc = tl.load(part, mask=ok, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):                 # step a slice at a time: no s * total
        part += total                                      # product to overflow 32 bits
        acc += tl.load(part, mask=ok, other=0.0)
    if RESIDUAL:
        acc += tl.load(res_ptr + i, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=ok)


SPLIT_K_MAX = 8           # split-K: at most this many slices of K per tile of output rows
SPLIT_K_MIN_SLICE = 512   # and none shorter than this many columns of K


def split_k_for(b: int, n: int, k: int, block_b: int, device: torch.device) -> int:
    """Slices of K for a product of too few output tiles to fill the GPU: about one program per SM
    counting tiles of 64 weight rows (the smallest), within the limits above; 1 when the tiles
    alone fill it (the LM head, the gate/up product) or under the interpreter."""
    if triton_interpreting():
        return 1
    tiles = triton.cdiv(n, 64) * triton.cdiv(b, block_b)
    return max(1, min(SPLIT_K_MAX, num_sms(device.index or 0) // tiles, k // SPLIT_K_MIN_SLICE))
# --8<-- [end:split_k]


# --8<-- [start:tma_launch]
TMA_TILES = ((64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4), (64, 64, 4, 6))


def tma_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether v7's TMA product can take x and w: 16-bit floats (wgmma's inputs; fp32 keeps the
    IEEE tl.dot path), rows of a multiple of 16 bytes and 16-byte aligned bases (TMA's rules),
    and a Hopper GPU or the interpreter."""
    if x.dtype not in (torch.float16, torch.bfloat16) or x.shape[1] % 8:
        return False
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return False
    return triton_interpreting() or torch.cuda.get_device_capability(x.device) >= (9, 0)


def _tma_smem(c: triton.Config, block_b: int, glu: bool) -> int:
    """Shared memory of a config: each stage holds the weight tile(s) and the x tile (2-byte
    elements)."""
    bn, bk = c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
    return c.num_stages * ((2 if glu else 1) * bn + block_b) * bk * 2


def _tma_prune(configs, named_args, **kwargs):
    """Drop the configs that do not fit the device's shared memory (they would not launch)."""
    args = {**named_args, **kwargs}
    limit = device_smem_limit(args["x_desc"].base.device.index or 0)
    kept = [c for c in configs if _tma_smem(c, args["BLOCK_B"], args["GLU"]) <= limit]
    return kept or [min(configs, key=lambda c: _tma_smem(c, args["BLOCK_B"], args["GLU"]))]


def _set_boxes(nargs: dict) -> None:
    """Autotuner pre-hook: a host descriptor's box is part of it, so it follows the config."""
    nargs["x_desc"].block_shape = [nargs["BLOCK_B"], nargs["BLOCK_K"]]
    nargs["w_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


_tma_autotuned = triton.autotune(
    configs=[triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_warps=w, num_stages=s,
                           pre_hook=_set_boxes) for bn, bk, w, s in TMA_TILES],
    key=["N", "K", "BLOCK_B", "GLU", "SPLIT_K"],
    prune_configs_by={"early_config_prune": _tma_prune},
)(_block_gemm_tma_kernel)


def _launch_tma(x, w, norm, residual, y, glu: bool, eps: float, block_b: int,
                split_k: int | None = None) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor

    (b, k), n = x.shape, y.shape[1]
    if split_k is None:
        split_k = 1 if norm is not None or glu else split_k_for(b, n, k, block_b, x.device)
    # with split-K the product kernel writes fp32 partials; the sum kernel adds them into y
    out = y if split_k == 1 else torch.empty(split_k, b, n, dtype=torch.float32, device=x.device)
    x_desc = TensorDescriptor(x, list(x.shape), [k, 1], [16, 16])  # boxes: set per config
    w_desc = TensorDescriptor(w, list(w.shape), [k, 1], [16, 16])
    args = (x_desc, norm if norm is not None else x, w_desc,
            residual if residual is not None else x, out, b, n, k, eps)
    flags = dict(NORM=norm is not None, GLU=glu, RESIDUAL=residual is not None, SPLIT_K=split_k,
                 BLOCK_B=block_b)
    if triton_interpreting():  # several programs and K steps at tiny sizes
        tile = dict(BLOCK_N=16, BLOCK_K=16)
        _set_boxes({"x_desc": x_desc, "w_desc": w_desc, **flags, **tile})
        grid = (triton.cdiv(n, tile["BLOCK_N"]), triton.cdiv(b, block_b), split_k)
        _block_gemm_tma_kernel[grid](*args, **flags, **tile)
    else:
        _tma_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),
                                     triton.cdiv(b, block_b), split_k)](*args, **flags)
    if split_k > 1:
        block = 1024
        _split_k_sum_kernel[(triton.cdiv(b * n, block),)](
            out, residual if residual is not None else y, y, b * n, SPLIT_K=split_k,
            RESIDUAL=residual is not None, BLOCK=block)
    return y
# --8<-- [end:tma_launch]


# --8<-- [start:step]
class BlockDecoder(StackedDecoder):
    """v5's stacked decoder with each block's norms, SwiGLU and residual adds carried by its GEMVs
    (:func:`block_gemv`): seven kernels a block. Made by :meth:`over`, like
    :class:`StackedDecoder`, on the same cache, tables and position."""

    KEY, TMA = "block", False   # its name among the decoder's views; block_gemv's tma

    @classmethod
    def over(cls, decoder) -> BlockDecoder:
        if type(decoder) is cls:                       # already one: itself
            return decoder
        views = decoder._views
        if cls.KEY not in views:
            views[cls.KEY] = StackedDecoder.over(decoder).view(cls)  # v5's stacked weights
        return views[cls.KEY]

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        model, cfg = self.model, self.model.cfg
        b, h, hkv, d = self.batch, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        gemv = functools.partial(block_gemv, tma=self.TMA)
        lens = (self.pos + 1).to(torch.int32).repeat(b)                    # (B,), on the device
        x = model.embed[tokens]                                            # (B, dim)
        for i, layer in enumerate(model.layers):
            w_qkv, w_gu = self.weights[i]
            qkv = gemv(x, w_qkv, norm=layer.attn_norm)                    # norm + q, k, v
            q = rope_append(qkv, model.cos, model.sin, self.pos, self.k[i], self.v[i],
                            self.tables, h, hkv)                           # (B, H, D)
            o = self.ops["decode_attention"](q, self.k[i], self.v[i], self.tables, lens)
            x = gemv(o.reshape(b, h * d), layer.wo, residual=x)           # x + o W_o^T
            m = gemv(x, w_gu, norm=layer.mlp_norm, glu=True)              # norm + SwiGLU
            x = gemv(m, layer.wd, residual=x)                             # x + m W_d^T
        if not self.fixed_position:
            self.pos += 1
        return gemv(x, model.lm_head, norm=model.norm)                    # (B, vocab)
# --8<-- [end:step]


# --8<-- [start:tma_step]
class TmaBlockDecoder(BlockDecoder):
    """v7: v6's decoder with its batched products on :func:`_block_gemm_tma_kernel` (TMA loads,
    the weight on wgmma's M side). At batch 1 it is v6."""

    KEY, TMA = "block_tma", True
# --8<-- [end:tma_step]


# --8<-- [start:op_version]
def decode_block_graph(decoder, tokens, k_cache, v_cache):
    """v6: the block decoder's step (:class:`BlockDecoder`) captured once in a CUDA graph and
    replayed, as v3 and v5 do."""
    check_timed_call("decode_block_graph", decoder, tokens, k_cache, v_cache)
    return graphed_step(BlockDecoder.over(decoder), tokens)


capstone_decode.add(Impl("v6", decode_block_graph, "Triton",
                         "v5 with RMSNorm, SwiGLU and the residual adds inside the GEMVs "
                         "(7 kernels a block)",
                         (BlockDecoder, block_gemv, _block_gemv_kernel, _configs,
                          "snippets/part8/capstone_fused.py", "snippets/part8/capstone.py"),
                         requires=needs_cuda_graphs))


def decode_block_tma_graph(decoder, tokens, k_cache, v_cache):
    """v7: v6 with the batched products on TMA and wgmma (:class:`TmaBlockDecoder`), captured
    once in a CUDA graph and replayed."""
    check_timed_call("decode_block_tma_graph", decoder, tokens, k_cache, v_cache)
    return graphed_step(TmaBlockDecoder.over(decoder), tokens)


capstone_decode.add(Impl("v7", decode_block_tma_graph, "Triton",
                         "v6 with the batched products on TMA + wgmma, the weight on the MMA's "
                         "M side",
                         (TmaBlockDecoder, _block_gemm_tma_kernel, _split_k_sum_kernel,
                          _launch_tma, split_k_for, tma_applies,
                          "snippets/part8/capstone_fused.py", "snippets/part8/capstone.py"),
                         requires=needs_cuda_graphs))
# --8<-- [end:op_version]

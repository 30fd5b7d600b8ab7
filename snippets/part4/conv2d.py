"""2-D convolution as a matrix product: im2col, and a Triton implicit GEMM.

y = conv2d(x, w) with x NHWC, shape (N, H, W, C), and w shape (K, R, S, C) (output channels, filter
rows, filter columns, input channels; C is the contiguous dimension of both), a stride and a zero
padding the same along both axes, no dilation and no groups. y is NHWC, (N, P, Q, K) with
P = (H + 2 * pad - R) // stride + 1 and Q likewise, in x's dtype; every version sums in fp32.

The convolution is a matrix product in disguise. Read y as an (N * P * Q) x K matrix (one row per
output pixel, one column per output channel) and w as a K x (R * S * C) matrix: then y = A w^T,
where row m of A holds the R * S * C input values under the filter when it sits on output pixel m
(its "patch"). The GEMM has M = N * P * Q, N_gemm = K and K_gemm = R * S * C.

Versions of ``conv2d`` (never renumbered):

- v0  cuDNN through ``torch.nn.functional.conv2d`` on NCHW-shaped channels-last views of x and w
      (``permute`` only: no copy); the CPU's convolution under the interpreter's tests.
- v1  explicit im2col in PyTorch: A is built in memory, N * P * Q rows of R * S * C values, then one
      matrix product with w viewed as K x (R * S * C). For a 3 x 3 filter at stride 1, A is about
      nine times the size of x: the bytes this lowering costs.
- v2  Triton implicit GEMM: like v1's product, but A is never stored. Each program computes one
      BLOCK_M x BLOCK_N tile of y, walks K_gemm in BLOCK_K steps, and gathers the tile of A it needs
      straight from x with pointer arithmetic: GEMM index k is the filter tap (r, s) and input
      channel c, k = (r * S + s) * C + c, and the masks that fence ragged edges also supply the
      zero padding. fp32 sums through ``tl.dot``.

Cost model: 2 * N * P * Q * K * R * S * C FLOPs; the fewest bytes are x, w and y once each
(``conv2d_bytes``). v1 moves more: it writes A and reads it back (``im2col_bytes``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import (
    check_int,
    check_tensors,
    refuse_grad,
    triton_device,
    triton_interpreting,
)
from snippets.common.gemm import tolerance_for
from snippets.registry import Impl, Op, device_generator, register

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INT32_MAX = 2**31 - 1


def triton_dtypes() -> tuple[torch.dtype, ...]:
    """What v2 takes: fp16, bf16 and fp32 on a GPU; no bf16 under the CPU interpreter (NumPy has no
    bf16 arithmetic, and a tl.dot on bf16 there returns garbage)."""
    if triton_interpreting():
        return (torch.float16, torch.float32)
    return DTYPES


# --8<-- [start:reference]
def output_size(h: int, w: int, r: int, s: int, stride: int, pad: int) -> tuple[int, int]:
    """(P, Q): the positions of an R x S filter on an H x W image padded by ``pad`` on each side,
    taken every ``stride`` pixels."""
    return (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1


def conv2d_ref(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """y = conv2d(x, w) for NHWC x (N, H, W, C) and w (K, R, S, C), returned NHWC (N, P, Q, K) in
    x's dtype, computed in at least fp32 (float64 stays float64: the tests' exact reference) by
    PyTorch's own convolution on NCHW-shaped views."""
    acc = torch.promote_types(x.dtype, torch.float32)
    y = F.conv2d(x.permute(0, 3, 1, 2).to(acc), w.permute(0, 3, 1, 2).to(acc),
                 stride=stride, padding=padding)
    return y.permute(0, 2, 3, 1).to(x.dtype)
# --8<-- [end:reference]


# --8<-- [start:model]
def conv2d_flops(n: int, h: int, w: int, c: int, k: int, r: int, s: int, stride: int,
                 pad: int) -> int:
    """2 * M * N_gemm * K_gemm: one multiply and one add per (output pixel, output channel,
    filter tap, input channel)."""
    p, q = output_size(h, w, r, s, stride, pad)
    return 2 * (n * p * q) * k * (r * s * c)


def conv2d_bytes(n: int, h: int, w: int, c: int, k: int, r: int, s: int, stride: int, pad: int,
                 itemsize: int) -> int:
    """The fewest bytes a convolution moves: x and w read once, y written once."""
    p, q = output_size(h, w, r, s, stride, pad)
    return (n * h * w * c + k * r * s * c + n * p * q * k) * itemsize


def im2col_bytes(n: int, h: int, w: int, c: int, k: int, r: int, s: int, stride: int, pad: int,
                 itemsize: int) -> int:
    """What v1 moves on top of the fewest: the (N * P * Q) x (R * S * C) matrix A written once by
    the lowering and read once by the product (at least: a GEMM may read A more than once)."""
    p, q = output_size(h, w, r, s, stride, pad)
    return 2 * (n * p * q) * (r * s * c) * itemsize
# --8<-- [end:model]


# --------------------------------------------------------------------------------------------------
# Checks (one place for every version)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_conv(name: str, x, w, stride, padding, dilation, groups, device: str,
               dtypes: tuple[torch.dtype, ...] = DTYPES) -> tuple[int, int]:
    """Validate a convolution's arguments before anything is allocated or launched; returns
    (P, Q). x (N, H, W, C) and w (K, R, S, C): 4-D, contiguous (C innermost), one dtype and
    device, the same C; stride >= 1 and padding >= 0 plain ints; no dilation, no groups; a filter
    that fits the padded image; offsets that fit the kernel's 32-bit index arithmetic."""
    if dilation != 1 or groups != 1:
        raise ValueError(f"{name}: dilation and groups are not supported (got dilation={dilation}, "
                         f"groups={groups}); use torch.nn.functional.conv2d")
    check_tensors(("x", "w"), (x, w), dtypes=dtypes, device=device, same_shape=False)
    stride, padding = check_int("stride", stride, 1), check_int("padding", padding, 0)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"{name}: x must be NHWC (N, H, W, C) and w (K, R, S, C), got shapes "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    (n, h, wd, c), (k, r, s, c2) = x.shape, w.shape
    if c != c2:
        raise ValueError(f"{name}: x has C = {c} channels but w has {c2} (w is (K, R, S, C))")
    if min(h, wd, c, k, r, s) < 1:
        raise ValueError(f"{name}: H, W, C, K, R and S must be at least 1, got x "
                         f"{tuple(x.shape)} and w {tuple(w.shape)}")
    if r > h + 2 * padding or s > wd + 2 * padding:
        raise ValueError(f"{name}: a {r} x {s} filter does not fit a {h} x {wd} image padded by "
                         f"{padding}")
    p, q = output_size(h, wd, r, s, stride, padding)
    if h * wd * c > INT32_MAX or n * p * q > INT32_MAX or r * s * c > INT32_MAX:
        raise ValueError(f"{name}: x {tuple(x.shape)} with w {tuple(w.shape)} is past the "
                         "kernels' 32-bit pixel and patch indices")
    return p, q
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# v0: cuDNN through torch
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cudnn]
def conv2d_cudnn(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1) -> torch.Tensor:
    """v0: torch.nn.functional.conv2d (cuDNN on a GPU). NHWC x and (K, R, S, C) w, permuted to
    NCHW shapes, are channels-last tensors: no copy, and cuDNN picks its NHWC kernels, whose output
    is channels-last too, so the permute back to NHWC is contiguous."""
    check_conv("conv2d_cudnn", x, w, stride, padding, dilation, groups, x.device.type
               if isinstance(x, torch.Tensor) else "cuda")
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), stride=stride, padding=padding)
    return y.permute(0, 2, 3, 1).contiguous()  # a no-op when the output is channels-last
# --8<-- [end:cudnn]


# --------------------------------------------------------------------------------------------------
# v1: explicit im2col, then one matrix product
# --------------------------------------------------------------------------------------------------

# --8<-- [start:im2col]
def im2col(x: torch.Tensor, r: int, s: int, stride: int, padding: int) -> torch.Tensor:
    """The (N * P * Q) x (R * S * C) matrix of patches: row m = (n, p, q) holds the R x S x C
    window of the zero-padded x whose corner is at (p * stride, q * stride), in (r, s, c) order,
    the order of w's (R, S, C) dimensions."""
    n, _, _, c = x.shape
    xp = F.pad(x, (0, 0, padding, padding, padding, padding))  # zeros around H and W: a copy
    # (N, P, Q, C, R, S) view of the windows: no copy yet
    win = xp.unfold(1, r, stride).unfold(2, s, stride)
    p, q = win.shape[1], win.shape[2]
    # to (N, P, Q, R, S, C) and flat: the reshape of a permuted view copies, R * S values per x
    return win.permute(0, 1, 2, 4, 5, 3).reshape(n * p * q, r * s * c)


def conv2d_im2col(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0,
                  dilation: int = 1, groups: int = 1) -> torch.Tensor:
    """v1: A = im2col(x) in memory, then y = A @ w^T with w viewed as K x (R * S * C): one GEMM of
    M = N * P * Q, N_gemm = K, K_gemm = R * S * C (fp32 sums, as torch.matmul does for fp16/bf16
    on a GPU)."""
    p, q = check_conv("conv2d_im2col", x, w, stride, padding, dilation, groups,
                      x.device.type if isinstance(x, torch.Tensor) else "cuda")
    n, (k, r, s, c) = x.shape[0], w.shape
    a = im2col(x, r, s, stride, padding)  # (N * P * Q, R * S * C)
    y = a @ w.reshape(k, r * s * c).t()   # (N * P * Q, K): y in NHWC, row by row
    return y.view(n, p, q, k)
# --8<-- [end:im2col]


# --------------------------------------------------------------------------------------------------
# v2: Triton implicit GEMM
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kernel]
@triton.jit
def _conv2d_implicit_gemm_kernel(x_ptr, w_ptr, y_ptr, H, W, C, K, P, Q, R, S, M, KG, STRIDE, PAD,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr):
    # One program per BLOCK_M x BLOCK_N tile of y viewed as M x K (M = N * P * Q), the tiles of
    # one row of programs side by side: they read the same patches of x, so those come from L2.
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixels m = (n, p, q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output channels
    # Each row of the tile: which image, and where its window's corner sits (may be in the padding)
    q = offs_m % Q
    p = (offs_m // Q) % P
    img = offs_m // (P * Q)
    ih0 = p * STRIDE - PAD  # (BLOCK_M,)
    iw0 = q * STRIDE - PAD
    x_img = x_ptr + img.to(tl.int64) * H * W * C  # int64: N * H * W * C may pass 2**31
    row_ok = offs_m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KG, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # GEMM k = (r * S + s) * C + c
        c = offs_k % C
        s = (offs_k // C) % S
        r = offs_k // (C * S)
        ih = ih0[:, None] + r[None, :]  # (BLOCK_M, BLOCK_K): the input pixel of A[m, k]
        iw = iw0[:, None] + s[None, :]
        # The padding is never stored: a tap outside the image is masked and reads 0.0, as the
        # ragged edges of M and K_gemm do.
        a_ok = (row_ok[:, None] & (offs_k[None, :] < KG)
                & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W))
        a_ptrs = x_img[:, None] + (ih * W + iw) * C + c[None, :]  # (BLOCK_M, BLOCK_K)
        a = tl.load(a_ptrs, mask=a_ok, other=0.0)
        # w viewed as K x KG, read transposed: b[k, n] = w[n, k], contiguous along k
        b_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * KG + offs_k[:, None]  # (BLOCK_K, BLOCK_N)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < KG) & (offs_n[None, :] < K), other=0.0)
        acc = tl.dot(a, b, acc)  # fp32 sums (TF32 products for fp32 inputs on a GPU)
    # y is NHWC, so y viewed as M x K is row-major: row m, column n at m * K + n
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * K + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < K))
# --8<-- [end:kernel]


# --8<-- [start:launch]
# Untuned (the chapter's exercises ask what to tune): 128 output pixels x 64 output channels per
# program, the headline's K = 64 in one tile column; BLOCK_K = 32 is half of a 3 x 3 layer's C = 64.
# num_stages = 3 double-buffers A and B: (128 + 64) x 32 x 2 bytes = 12 KiB per stage in fp16.
CONFIG = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
# Under the interpreter: the smallest tiles tl.dot takes, so tiny test layers still span tiles
INTERPRET_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16)


def conv2d_implicit_gemm(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0,
                         dilation: int = 1, groups: int = 1) -> torch.Tensor:
    """v2: like v1's GEMM, but A is gathered from x tile by tile inside the kernel and never
    stored: x, w and y cross memory once each (up to the reuse that L2 gives)."""
    refuse_grad("conv2d_implicit_gemm", x, w, instead="conv2d_im2col or torch's conv2d")
    p, q = check_conv("conv2d_implicit_gemm", x, w, stride, padding, dilation, groups,
                      triton_device(), triton_dtypes())
    (n, h, wd, c), (k, r, s, _) = x.shape, w.shape
    y = torch.empty((n, p, q, k), dtype=x.dtype, device=x.device)
    m, kg = n * p * q, r * s * c
    if m == 0:  # an empty batch: nothing to launch
        return y
    cfg = INTERPRET_CONFIG if triton_interpreting() else CONFIG
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(k, cfg["BLOCK_N"]),)
    _conv2d_implicit_gemm_kernel[grid](x, w, y, h, wd, c, k, p, q, r, s, m, kg, stride, padding,
                                       **cfg)
    return y
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _dims(size) -> tuple[int, ...]:
    return (size["n"], size["h"], size["w"], size["c"], size["k"], size["r"], size["s"],
            size["stride"], size["pad"])


def _make_inputs(size, dtype, device, gen):
    """(x, w, stride, padding): x NHWC and w (K, R, S, C) standard normal, drawn in fp32 on the
    device and rounded to ``dtype``; w scaled by 1 / sqrt(R * S * C) (He-style) so y stays ~1."""
    n, h, wd, c, k, r, s, stride, pad = _dims(size)
    dev_gen = device_generator(gen, device)
    x = torch.randn((n, h, wd, c), generator=dev_gen, device=device)
    w = torch.randn((k, r, s, c), generator=dev_gen, device=device) / (r * s * c) ** 0.5
    return x.to(dtype), w.to(dtype), stride, pad


def _flops(size, dtype) -> int:
    return conv2d_flops(*_dims(size))


def _bytes(size, dtype) -> int:
    return conv2d_bytes(*_dims(size), dtype.itemsize)


def conv_tolerance(kg: int, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) against float64 for K_gemm = kg: a GEMM's (snippets.common.gemm.tolerance_for,
    whose atol is sized for sums of kg products of standard normal values, ~sqrt(kg)) scaled down
    by sqrt(kg), since _make_inputs' w is scaled so that y is ~1. A wrong tap, channel or pixel is
    off by ~1: 16 (bf16) to 128 (fp16, TF32) times atol."""
    rtol, atol = tolerance_for(kg, dtype)
    return rtol, atol / kg**0.5


def _tolerance(size, dtype) -> tuple[float, float]:
    return conv_tolerance(size["r"] * size["s"] * size["c"], dtype)


def _layer(n, hw, c, k, rs, stride=1, pad=None) -> dict:
    return {"n": n, "h": hw, "w": hw, "c": c, "k": k, "r": rs, "s": rs, "stride": stride,
            "pad": rs // 2 if pad is None else pad}


# ResNet-50's 3 x 3 layers at batch 32, one per stage (56, 28, 14, 7 pixels a side, 64 to 512
# channels), and the 1 x 1 that opens a stage-4 bottleneck (1024 -> 256 channels at 14 x 14). Every
# one is a GEMM with a large M (N * P * Q from 1568 to 100 352) and a small N_gemm (K).
HEADLINE = _layer(32, 56, 64, 64, 3)
SWEEP = [HEADLINE, _layer(32, 28, 128, 128, 3), _layer(32, 14, 256, 256, 3),
         _layer(32, 7, 512, 512, 3), _layer(32, 14, 1024, 256, 1)]
# Tiny for the interpreter: ragged tiles everywhere, stride 2, padding 0 and 1, a 1 x 1 filter, C
# not a multiple of the interpreter's BLOCK_K (16), a non-square filter.
TEST_SIZES = [_layer(1, 5, 3, 4, 3),
              _layer(2, 9, 20, 17, 3, stride=2),
              _layer(1, 7, 5, 6, 3, pad=0),
              _layer(2, 6, 33, 19, 1),
              {"n": 1, "h": 8, "w": 11, "c": 7, "k": 9, "r": 3, "s": 2, "stride": 2, "pad": 1}]
MAX_KG = max(s["r"] * s["s"] * s["c"] for s in SWEEP)
SOURCES = ("snippets/part4/conv2d.py",)

conv2d_op = register(Op(
    name="conv2d", part=4, chapter="part4/convolution.md",
    title="Convolution as a matrix multiply (NHWC)", reference=conv2d_ref,
    make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops, metric="TFLOP/s",
    ceiling="gemm_fp16", headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES,
    bench_dtypes=(torch.float16, torch.bfloat16), test_sizes=TEST_SIZES, sweep_axis="c",
    tolerances={d: conv_tolerance(MAX_KG, d) for d in DTYPES}, tolerance_at=_tolerance))
conv2d_op.add(Impl("v0", conv2d_cudnn, "PyTorch", "cuDNN via F.conv2d on channels-last views",
                   (check_conv, *SOURCES), device="any", origin="library"))
conv2d_op.add(Impl("v1", conv2d_im2col, "PyTorch", "explicit im2col, then one matmul",
                   (im2col, check_conv, *SOURCES), device="any"))
conv2d_op.add(Impl("v2", conv2d_implicit_gemm, "Triton",
                   "implicit GEMM: patches gathered in the kernel",
                   (_conv2d_implicit_gemm_kernel, check_conv, *SOURCES), device="any",
                   dtypes=triton_dtypes()))

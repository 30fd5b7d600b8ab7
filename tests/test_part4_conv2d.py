"""conv2d beyond the generic reference check: the cost model (FLOPs, the bytes of im2col), the
im2col matrix itself, each edge of the implicit GEMM (padding, stride, ragged tiles, C not a
multiple of BLOCK_K, 1 x 1 and non-square filters, an empty batch), an index error that the
tolerance would catch, bad input refused before launch, and gradients refused by the Triton
version. CPU tests run v2 under the interpreter in fp32 and fp16; bf16 and cuDNN run on the GPU."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_refuses

from conftest import DEVICE, poison_allocator
from snippets.part4 import conv2d as cv

FNS = {"v0": cv.conv2d_cudnn, "v1": cv.conv2d_im2col, "v2": cv.conv2d_implicit_gemm}
# The CPU's fp32 sums are exact to ~1e-6 here; fp16 is one rounding of y (|y| up to ~4) to fp16.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3)}


def _inputs(n, h, w, c, k, r, s, dtype=torch.float32, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, w, c, generator=g)
    wt = torch.randn(k, r, s, c, generator=g) / (r * s * c) ** 0.5
    return x.to(device, dtype), wt.to(device, dtype)


def _check(fn, x, w, stride, padding, tol=None):
    p, q = cv.output_size(x.shape[1], x.shape[2], w.shape[1], w.shape[2], stride, padding)
    poison_allocator(x.shape[0] * p * q * w.shape[0] * x.element_size() + 64, x.device.type)
    y = fn(x, w, stride, padding)
    ref = cv.conv2d_ref(x.double(), w.double(), stride, padding)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], p, q, w.shape[0])
    assert y.is_contiguous(), "y must be NHWC, contiguous"
    assert not y.isnan().any(), "an output element was never written"
    if x.dtype == torch.float32 and x.device.type == "cuda" and tol is None:
        # On a GPU tl.dot (and cuDNN, by PyTorch's default) multiply fp32 inputs as TF32: 10 mantissa
        # bits, the low bits dropped (truncation, up to 2^-10 relative) or rounded. Each product is
        # then within 2^-9 of its value, so the sum within 2^-9 of the sum of |x| |w| (fp32's own
        # accumulation error is far below that): a bound per element, not a loose global tolerance.
        mag = cv.conv2d_ref(x.double().abs(), w.double().abs(), stride, padding)
        excess = ((y.double() - ref).abs() - 2.0 ** -9 * mag - 1e-6).max().item()
        assert excess <= 0, f"an element is {excess:.3g} beyond the TF32 bound"
        return y
    rtol, atol = tol or TOL[x.dtype]
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), rtol=rtol, atol=atol)
    return y


# ---------------------------------------------------------------- pieces that need no kernel

@pytest.mark.op("conv2d")
def test_flops_and_bytes_of_the_headline():
    d = (32, 56, 56, 64, 64, 3, 3, 1, 1)
    # 32 * 56 * 56 output pixels x 64 channels x 576 taps, 2 FLOPs each
    assert cv.conv2d_flops(*d) == 2 * 100_352 * 64 * 576 == 7_398_752_256
    # x and y are 32 * 56 * 56 * 64 fp16 values each (12.25 MiB), w 64 * 576
    assert cv.conv2d_bytes(*d, 2) == (2 * 6_422_528 + 36_864) * 2
    # im2col's A is 9 times x, written and read: 18 x's worth on top
    assert cv.im2col_bytes(*d, 2) == 2 * 9 * 6_422_528 * 2
    assert cv._flops(cv.HEADLINE, torch.float16) == cv.conv2d_flops(*d)


@pytest.mark.op("conv2d")
@pytest.mark.parametrize("h, r, stride, pad, want", [(56, 3, 1, 1, 56), (56, 3, 2, 1, 28),
                                                     (7, 3, 1, 0, 5), (14, 1, 1, 0, 14),
                                                     (8, 3, 2, 0, 3), (1, 3, 1, 1, 1)])
def test_output_size(h, r, stride, pad, want):
    assert cv.output_size(h, h, r, r, stride, pad) == (want, want)
    x, w = _inputs(1, h, h, 2, 3, r, r, device="cpu")
    assert cv.conv2d_ref(x, w, stride, pad).shape == (1, want, want, 3)


@pytest.mark.op("conv2d")
def test_im2col_rows_are_patches_in_rsc_order():
    # x[0, i, j, c] = 100 * i + 10 * j + c: every value says where it came from
    i, j, c = torch.meshgrid(torch.arange(4), torch.arange(5), torch.arange(2), indexing="ij")
    x = (100 * i + 10 * j + c).float()[None]
    a = cv.im2col(x, 3, 3, 1, 1)
    assert a.shape == (4 * 5, 3 * 3 * 2)
    # output pixel (p, q) = (2, 3): window rows 1..3, columns 2..4, in (r, s, c) order
    row = a[2 * 5 + 3].view(3, 3, 2)
    assert row[0, 0].tolist() == [120.0, 121.0] and row[2, 2].tolist() == [340.0, 341.0]
    # output pixel (0, 0): its first row and column of taps are padding
    corner = a[0].view(3, 3, 2)
    assert (corner[0] == 0).all() and (corner[:, 0] == 0).all() and corner[1, 1].tolist() == [0, 1]


@pytest.mark.op("conv2d")
def test_im2col_is_r_times_s_times_x():
    x, _ = _inputs(2, 12, 12, 8, 1, 1, 1, device="cpu")
    a = cv.im2col(x, 3, 3, 1, 1)
    assert a.numel() == 9 * x.numel()  # stride 1, "same" padding: every value copied 9 times


@pytest.mark.op("conv2d")
def test_tolerance_would_catch_a_wrong_tap():
    # Shift y by one output column (as a kernel that mixed up s would): far outside the tolerance.
    x, w = _inputs(1, 6, 6, 8, 4, 3, 3, device="cpu")
    y = cv.conv2d_ref(x.double(), w.double(), 1, 1)
    rtol, atol = cv.conv_tolerance(72, torch.float16)
    assert (y[:, :, 1:] - y[:, :, :-1]).abs().max() > 20 * atol
    assert not torch.allclose(y[:, :, 1:], y[:, :, :-1], rtol=rtol, atol=atol)


# -------------------------------------------------------- every version (v2 under the interpreter)

CASES = {
    # (n, h, w, c, k, r, s, stride, pad)
    "3x3 same padding": (2, 7, 7, 5, 6, 3, 3, 1, 1),
    "3x3 no padding": (1, 9, 8, 4, 3, 3, 3, 1, 0),
    "stride 2": (2, 9, 9, 20, 17, 3, 3, 2, 1),
    "stride 2 no padding": (1, 10, 7, 3, 5, 3, 3, 2, 0),
    "1x1": (2, 6, 6, 33, 19, 1, 1, 1, 0),
    "1x1 stride 2": (1, 7, 7, 16, 16, 1, 1, 2, 0),
    "non-square filter": (1, 8, 11, 7, 9, 3, 2, 2, 1),
    "filter as large as the image": (1, 3, 3, 2, 2, 3, 3, 1, 0),
    "padding 2, 5x5": (1, 6, 5, 3, 4, 5, 5, 1, 2),
    "C a multiple of BLOCK_K": (1, 5, 5, 16, 16, 3, 3, 1, 1),
    "many output tiles": (3, 13, 13, 6, 40, 3, 3, 1, 1),
}


@pytest.mark.op("conv2d")
@pytest.mark.parametrize("version", sorted(FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cases(version, dtype, case):
    n, h, w, c, k, r, s, stride, pad = CASES[case]
    x, wt = _inputs(n, h, w, c, k, r, s, dtype)
    _check(FNS[version], x, wt, stride, pad)


@pytest.mark.op("conv2d")
@pytest.mark.parametrize("version", sorted(FNS))
def test_empty_batch(version):
    x, w = _inputs(0, 5, 5, 3, 4, 3, 3)
    y = FNS[version](x, w, 1, 1)
    assert y.shape == (0, 5, 5, 4) and y.dtype == x.dtype


@pytest.mark.op("conv2d")
def test_padding_reads_zeros_not_neighbours():
    # x all ones, w all ones: an interior pixel sums R * S * C ones, a corner only the taps inside
    # the image (4 of 9 per channel). A kernel that wrapped around an edge would count 9.
    x = torch.ones(1, 4, 4, 3, device=DEVICE)
    w = torch.ones(2, 3, 3, 3, device=DEVICE)
    y = cv.conv2d_implicit_gemm(x, w, 1, 1)
    assert y[0, 1, 1].tolist() == [27.0, 27.0]
    assert y[0, 0, 0].tolist() == [12.0, 12.0] and y[0, 0, 1].tolist() == [18.0, 18.0]
    assert y[0, 3, 3].tolist() == [12.0, 12.0]


@pytest.mark.op("conv2d")
def test_registered_inputs_keep_y_near_one():
    args = cv._make_inputs(cv.TEST_SIZES[1], torch.float32, "cpu", torch.Generator().manual_seed(0))
    y = cv.conv2d_ref(*args)
    assert 0.5 < y.std().item() < 2.0


# ---------------------------------------------------------------- bad input, before any launch

def _bad_inputs():
    x, w = _inputs(1, 5, 5, 4, 3, 3, 3)
    return [
        ("w of another dtype", (x, w.half(), 1, 1), TypeError, "dtype"),
        ("integer x", (x.long(), w, 1, 1), TypeError, "dtype"),
        ("a list, not a tensor", (x.tolist(), w, 1, 1), TypeError, "torch.Tensor"),
        ("3-D x", (x[0], w, 1, 1), ValueError, "NHWC"),
        ("C mismatch", (x, w[..., :2].contiguous(), 1, 1), ValueError,
         "C = 4 channels but w has 2"),
        ("non-contiguous x (NCHW memory)", (x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1),
                                            w, 1, 1), ValueError, "contiguous"),
        ("stride 0", (x, w, 0, 1), ValueError, "stride must be >= 1"),
        ("negative padding", (x, w, 1, -1), ValueError, "padding must be >= 0"),
        ("tuple stride", (x, w, (1, 1), 1), TypeError, "stride must be a Python int"),
        ("filter larger than the image", (x, _inputs(1, 1, 1, 4, 3, 7, 7)[1], 1, 0), ValueError,
         "7 x 7 filter does not fit a 5 x 5 image"),
        ("no output channels", (x, w[:0], 1, 1), ValueError, "at least 1"),
    ]


@pytest.mark.op("conv2d")
@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
def test_bad_input_raises(case):
    assert_refuses(cv.conv2d_im2col, case, cv.conv2d_implicit_gemm, cv.conv2d_cudnn)


@pytest.mark.op("conv2d")
@pytest.mark.parametrize("version", sorted(FNS))
@pytest.mark.parametrize("kw", [{"dilation": 2}, {"groups": 2}])
def test_dilation_and_groups_refused(version, kw):
    x, w = _inputs(1, 5, 5, 4, 4, 3, 3)
    with pytest.raises(ValueError, match="dilation and groups are not supported"):
        FNS[version](x, w, 1, 1, **kw)


@pytest.mark.op("conv2d")
def test_bf16_refused_under_the_interpreter():
    if torch.cuda.is_available():
        pytest.skip("bf16 runs on a GPU")
    x, w = _inputs(1, 5, 5, 4, 3, 3, 3, torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        cv.conv2d_implicit_gemm(x, w, 1, 1)


@pytest.mark.op("conv2d")
def test_triton_version_refuses_grad():
    x, w = _inputs(1, 5, 5, 4, 3, 3, 3)
    with pytest.raises(RuntimeError, match="forward-only"):
        cv.conv2d_implicit_gemm(x, w.requires_grad_(), 1, 1)
    with torch.no_grad():
        _check(cv.conv2d_implicit_gemm, x, w, 1, 1)


@pytest.mark.op("conv2d")
def test_im2col_version_trains():
    x, w = _inputs(1, 6, 6, 3, 4, 3, 3)
    x.requires_grad_()
    w.requires_grad_()
    cv.conv2d_im2col(x, w, 2, 1).square().sum().backward()
    x2, w2 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    cv.conv2d_ref(x2, w2, 2, 1).square().sum().backward()
    torch.testing.assert_close(x.grad.double(), x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w2.grad, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- GPU only: bf16, cuDNN

@pytest.mark.gpu
@pytest.mark.op("conv2d")
@pytest.mark.parametrize("version", sorted(FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu(version, dtype, case):
    n, h, w, c, k, r, s, stride, pad = CASES[case]
    x, wt = _inputs(n, h, w, c, k, r, s, dtype, "cuda")
    _check(FNS[version], x, wt, stride, pad, cv.conv_tolerance(r * s * c, dtype))


@pytest.mark.gpu
@pytest.mark.op("conv2d")
@pytest.mark.parametrize("version", sorted(FNS))
@pytest.mark.parametrize("size", cv.SWEEP, ids=lambda s: f"{s['h']}x{s['c']}x{s['r']}")
def test_gpu_resnet_layers(version, size):
    args = cv._make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    x, w, stride, pad = args
    _check(FNS[version], x, w, stride, pad,
           cv.conv_tolerance(size["r"] * size["s"] * size["c"], torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.op("conv2d")
def test_gpu_cudnn_copies_nothing_going_in():
    x, w = _inputs(2, 8, 8, 16, 32, 3, 3, torch.float16, "cuda")
    assert x.permute(0, 3, 1, 2).is_contiguous(memory_format=torch.channels_last)
    assert w.permute(0, 3, 1, 2).is_contiguous(memory_format=torch.channels_last)
    y = cv.conv2d_cudnn(x, w, 1, 1)
    assert y.is_contiguous()

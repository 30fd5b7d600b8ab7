"""The Part 8 W4A16 GEMM: the Triton kernel (v1, and v2's split-K) against float64
dequantise-then-multiply at M = 1 to 64, every group size, with and without zero points, K not a
multiple of BLOCK_K, ragged N; fp16 and fp32 activations under the CPU interpreter (it has no bf16
arithmetic), bf16 on a GPU; split-K equal to no split; the refusals of bad input before any launch;
the registration and its cost model."""

from __future__ import annotations

import pytest
import torch
from helpers import NoLaunch, assert_int4_matches, int4_operands

from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets.part8 import int4_gemm as ig

HALF = torch.bfloat16 if HAS_GPU else torch.float16
# (M, N, K, G): M = 1, ragged M and N, K = 96 and 192 against the interpreter's BLOCK_K = 64 (and
# the GPU's 128), every group size, and G = 48, which no power-of-two slice divides
SHAPES = [(1, 64, 128, 32), (1, 37, 96, 32), (4, 40, 192, 64), (16, 96, 256, 128),
          (33, 72, 96, 32), (64, 48, 384, 128), (3, 40, 144, 48)]


def _operands(m, n, k, g, dtype=HALF, zero_point=False, seed=0):
    return int4_operands(m, n, k, g, dtype, DEVICE, zero_point, seed)


_check = assert_int4_matches


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", SHAPES)
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
def test_kernel_matches_reference(m, n, k, g, zero_point):
    x, packed, scales, zeros = _operands(m, n, k, g, zero_point=zero_point)
    poison_allocator(m * n * 4, DEVICE)
    for split in (1, None):
        _check(ig.int4_gemm(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"M={m} N={n} K={k} G={g} zeros={zero_point} split_k={split}")


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_equals_no_split(split):
    """Split-K changes only where the fp32 partial sums are added: the same answer to rounding.
    K = 320 is 5 steps of 64 (interpreter): 3 splits of 2 steps leave the last range short, 5 one
    step each."""
    x, packed, scales, zeros = _operands(3, 40, 320, 64, dtype=torch.float32, zero_point=True)
    one = ig.int4_gemm(x, packed, scales, zeros, split_k=1)
    torch.testing.assert_close(ig.int4_gemm(x, packed, scales, zeros, split_k=split), one,
                               rtol=1e-5, atol=1e-4)


@pytest.mark.op("int4_gemm")
def test_shapes_cover_both_dequantisation_paths():
    """SHAPES runs the scale-after-the-dot path (BLOCK_K divides G) and the scale-per-element path
    (it does not) with the launch configuration of this machine."""
    after = {g % ig.launch_config(m, n, k, g)["BLOCK_K"] == 0 for m, n, k, g in SHAPES}
    assert after == {True, False}  # G = 48 is the per-element case on a GPU too


@pytest.mark.op("int4_gemm")
def test_fp32_activations_exact_codes():
    """fp32 activations under the interpreter: the dequantised weights are exact in fp32, so the
    kernel agrees with float64 to fp32 rounding (on a GPU fp32 dots may use TF32, which the
    tolerance allows)."""
    x, packed, scales, zeros = _operands(5, 33, 128, 32, dtype=torch.float32, seed=3)
    _check(ig.int4_gemm(x, packed, scales, zeros), x, packed, scales, zeros, "fp32")


@pytest.mark.op("int4_gemm")
def test_a_wrong_nibble_order_is_caught():
    """The test above can fail: swapping the two codes of every byte changes the answer by far more
    than the tolerance."""
    x, packed, scales, zeros = _operands(4, 32, 128, 32)
    swapped = ((packed & 0xF) << 4) | (packed >> 4)
    y = ig.int4_gemm(x, swapped, scales, zeros)
    with pytest.raises(AssertionError):
        _check(y, x, packed, scales, zeros, "swapped nibbles")


@pytest.mark.op("int4_gemm")
def test_empty_m():
    x, packed, scales, _ = _operands(1, 16, 64, 32)
    assert ig.int4_gemm(x[:0], packed, scales).shape == (0, 16)


# ---------------------------------------------------------------- refusals, before any launch

def _bad_inputs():
    x, packed, scales, zeros = _operands(4, 32, 128, 32, zero_point=True)
    return [
        ("x not a tensor", (x.tolist(), packed, scales), TypeError, "x must be a torch.Tensor"),
        ("x int", (x.to(torch.int32), packed, scales.to(torch.int32)), TypeError, "x has dtype"),
        ("scales dtype", (x, packed, scales.float()), TypeError, "scales must have x's dtype"),
        ("packed int8", (x, packed.view(torch.int8), scales), TypeError, "packed must be uint8"),
        ("packed wrong K", (x, packed[:, :32].contiguous(), scales), ValueError,
         r"packed must be \(N, K / 2\)"),
        ("packed not contiguous", (x, packed.T.contiguous().T, scales), ValueError, "contiguous"),
        ("x 3-D", (x[None], packed, scales), ValueError, "x must be 2-D"),
        ("group does not divide K", (x[:, :100].contiguous(), packed[:, :50].contiguous(),
                                     scales[:, :3].contiguous()), ValueError,
         "G dividing K"),
        ("odd group", (x[:, :6].contiguous(), packed[:, :3].contiguous(),
                       scales[:, :2].contiguous()), ValueError, "must be even"),
        ("scales rows", (x, packed, scales[:16]), ValueError, "scales must be"),
        ("zeros shape", (x, packed, scales, zeros[:, :2].contiguous()), ValueError,
         "zeros must have"),
        ("zeros dtype", (x, packed, scales, zeros.float()), TypeError, "zeros must be uint8"),
        ("split_k 0", (x, packed, scales, None, 0), ValueError, "split_k"),
    ]


BAD = _bad_inputs()


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("label, args, exc, words", BAD, ids=[b[0] for b in BAD])
def test_refuses_before_launch(label, args, exc, words, monkeypatch):
    monkeypatch.setattr(ig, "_int4_gemm_kernel", NoLaunch())
    with pytest.raises(exc, match=words):
        ig.int4_gemm(*args)


@pytest.mark.op("int4_gemm")
def test_refuses_bf16_under_interpreter_and_grad():
    x, packed, scales, _ = _operands(2, 16, 64, 32)
    if not HAS_GPU:
        with pytest.raises(TypeError, match="interpreter has no bf16"):
            ig.int4_gemm(x.bfloat16(), packed, scales.bfloat16())
    with pytest.raises(RuntimeError, match="forward-only"):
        ig.int4_gemm(x.requires_grad_(), packed, scales)


# ---------------------------------------------------------------- registration

@pytest.mark.op("int4_gemm")
def test_registration_and_cost():
    op = ig.int4_gemm_op
    assert list(op.impls) == ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"]
    assert op.impls["v0"].origin == op.impls["v3"].origin == "library"
    assert op.metric == "GB/s" and op.ceiling == "copy"
    assert [s["m"] for s in op.sweep] == [1, 4, 16, 64, 128]  # 128: issue 22's third goal
    size = op.headline
    # 8192 x 8192 codes at half a byte, 64 scales per row of 2 bytes, x and y
    assert op.bytes_moved(size, torch.bfloat16) == 8192 * 4096 + 8192 * 64 * 2 + 2 * 16 * 8192 * 2
    assert op.flops(size, torch.bfloat16) == 2 * 16 * 8192 * 8192


# ---------------------------------------------------------------- GPU: bf16, the benchmark N, K

@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m", [1, 4, 16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sweep_shapes(m, dtype):
    x, packed, scales, zeros = _operands(m, 4096, 4096, 128, dtype=dtype, zero_point=True)
    for split in (1, None):
        _check(ig.int4_gemm(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"GPU M={m} {dtype} split_k={split}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m", [1, 16])
def test_gpu_per_element_scales(m):
    """G = 48: no power-of-two BLOCK_K divides it, so the GPU runs the scale-per-element path."""
    x, packed, scales, zeros = _operands(m, 1024, 48 * 43, 48, dtype=torch.bfloat16,
                                         zero_point=True)
    assert 48 % ig.launch_config(m, 1024, 48 * 43, 48)["BLOCK_K"] != 0
    for split in (1, None):
        _check(ig.int4_gemm(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"GPU G=48 M={m} split_k={split}")

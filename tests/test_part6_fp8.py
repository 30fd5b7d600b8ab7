"""FP8 on a CPU (snippets/part6/fp8.py): the formats' facts against every bit pattern, the rounding
bound,
per-tensor and per-block scaling (an outlier costs precision only in its block), and the
accumulation model: a narrow accumulator loses accuracy over a long K, promotion to fp32 every 128
elements wins it back."""

from __future__ import annotations

import pytest
import torch

from snippets.part6 import fp8


def all_values(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of an FP8 format, from its 256 bit patterns."""
    v = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return v[torch.isfinite(v)]


@pytest.mark.parametrize("dtype", fp8.FORMATS)
def test_format_facts_match_every_bit_pattern(dtype):
    facts = fp8.format_facts(dtype)
    v = all_values(dtype)
    positive = v[v > 0]
    assert facts.max == positive.max().item()
    assert facts.min_subnormal == positive.min().item()
    assert facts.exponent_bits + facts.mantissa_bits == 7
    # above min_normal, neighbours differ by at most eps times the smaller one
    normal = torch.sort(positive[positive >= facts.min_normal]).values
    assert ((normal[1:] - normal[:-1]) / normal[:-1]).max().item() == pytest.approx(facts.eps)


def test_e4m3_and_e5m2_trade_precision_for_range():
    e4, e5 = fp8.format_facts(fp8.E4M3), fp8.format_facts(fp8.E5M2)
    assert (e4.exponent_bits, e4.mantissa_bits, e4.max) == (4, 3, 448.0)
    assert (e5.exponent_bits, e5.mantissa_bits, e5.max) == (5, 2, 57344.0)
    assert e4.eps < e5.eps and e4.dynamic_range < e5.dynamic_range


@pytest.mark.parametrize("dtype", fp8.FORMATS)
def test_rounding_error_is_at_most_half_an_eps_in_the_normal_range(dtype):
    facts = fp8.format_facts(dtype)
    x = torch.logspace(
        torch.log10(torch.tensor(facts.min_normal)),
        torch.log10(torch.tensor(facts.max * 0.99)),
        20001,
        dtype=torch.float64,
    )
    q = x.to(dtype).double()
    assert ((q - x).abs() / x).max().item() <= facts.eps / 2 + 1e-12


def test_per_tensor_scale_maps_the_largest_magnitude_to_the_format_max():
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)) * 3
    q, scale = fp8.quantize_per_tensor(x)
    assert q.dtype == fp8.E4M3 and torch.isfinite(q.float()).all()
    assert q.float().abs().max().item() == fp8.format_facts(fp8.E4M3).max
    assert fp8.relative_error(x, q.float() * scale) < fp8.format_facts(fp8.E4M3).eps / 2


def test_block_scales_confine_an_outlier_to_its_block():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 1024, generator=g)
    x[3, 5] = 1e6  # one activation outlier: it sets the per-tensor scale
    q, s = fp8.quantize_per_tensor(x)
    per_tensor = fp8.relative_error(x, q.float() * s)
    qb, sb = fp8.quantize_blocks(x, (1, 128))
    assert sb.shape == (128, 8)
    per_block = fp8.relative_error(x, fp8.dequantize_blocks(qb, sb))
    # away from the outlier's block, per-block scaling keeps full precision; per-tensor
    # flushes small values
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[3, :128] = False
    err_t = fp8.relative_error(x[mask], (q.float() * s)[mask])
    err_b = fp8.relative_error(x[mask], fp8.dequantize_blocks(qb, sb)[mask])
    assert err_b < fp8.format_facts(fp8.E4M3).eps / 2 and err_t > 10 * err_b
    assert per_block < per_tensor


def test_dequantize_inverts_the_block_layout():
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    q, s = fp8.quantize_blocks(x, (128, 128))
    assert s.shape == (2, 2)
    back = fp8.dequantize_blocks(q, s)
    # each block on its own: the same as quantizing the block per tensor
    qt, st = fp8.quantize_per_tensor(x[128:, :128])
    assert torch.equal(back[128:, :128], qt.float() * st)


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    return fp8.quantize_per_tensor(a), fp8.quantize_per_tensor(b)


def test_fp32_accumulation_matches_the_exact_product_of_the_quantized_values():
    (aq, sa), (bq, sb) = _operands(16, 128, 1024, 3)
    exact = (aq.double() * sa.double()) @ (bq.double() * sb.double()).T
    c = fp8.fp8_gemm_model(aq, sa.reshape(1, 1), bq, sb.reshape(1, 1))
    assert fp8.relative_error(exact, c) < 1e-6


def test_a_narrow_accumulator_drifts_over_k_and_promotion_fixes_it():
    (aq, sa), (bq, sb) = _operands(16, 128, 16384, 4)
    exact = (aq.double() * sa.double()) @ (bq.double() * sb.double()).T
    one = sa.reshape(1, 1), sb.reshape(1, 1)
    narrow = fp8.relative_error(
        exact, fp8.fp8_gemm_model(aq, one[0], bq, one[1], accumulator_bits=13)
    )
    promoted = fp8.relative_error(
        exact, fp8.fp8_gemm_model(aq, one[0], bq, one[1], accumulator_bits=13, promote_every=4)
    )
    assert narrow > 20 * promoted  # promoting every 128 elements of K wins most of it back
    assert (
        promoted < fp8.format_facts(fp8.E4M3).eps / 100
    )  # and is far below the inputs' own rounding


def test_block_scaled_gemm_equals_its_dequantized_product():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 512, generator=g), torch.randn(256, 512, generator=g)
    aq, sa = fp8.quantize_blocks(a, (1, 128))
    bq, sb = fp8.quantize_blocks(b, (128, 128))
    exact = fp8.dequantize_blocks(aq, sa).double() @ fp8.dequantize_blocks(bq, sb).double().T
    c = fp8.fp8_gemm_model(aq, sa, bq, sb, promote_every=4)
    assert fp8.relative_error(exact, c) < 1e-6


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="float8"):
        fp8.format_facts(torch.float16)
    with pytest.raises(TypeError, match="floating-point"):
        fp8.quantize_per_tensor(torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple of the block"):
        fp8.quantize_blocks(torch.ones(100, 128), (128, 128))
    with pytest.raises(ValueError, match="2-D"):
        fp8.quantize_blocks(torch.ones(128), (1, 128))
    aq, sa = fp8.quantize_blocks(torch.ones(4, 256), (1, 128))
    bq, sb = fp8.quantize_blocks(torch.ones(128, 256), (128, 128))
    with pytest.raises(ValueError, match="block scales change every 128"):
        fp8.fp8_gemm_model(aq, sa, bq, sb)  # never promoted: scales cannot apply
    with pytest.raises(ValueError, match="K differ"):
        fp8.fp8_gemm_model(aq, sa, bq[:, :128], sb[:, :1], promote_every=4)

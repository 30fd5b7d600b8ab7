"""Part 8 quantisation on a CPU: int4 packing round trips; RTN within half a step of every weight
(int8 and int4, symmetric and with zero points); GPTQ beating RTN on the output of a layer whose
calibration activations are correlated, and the same code without its error propagation not
beating it; AWQ's searched alpha beating alpha = 0 (RTN) when a few input channels are large;
int8 weight-only linear close to the float layer; the FP8 KV cache within the e4m3 bound; and the
refusals of bad shapes and group sizes."""

from __future__ import annotations

import pytest
import torch

from snippets.part8 import quant as qt


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _correlated(samples: int, k: int, seed: int) -> torch.Tensor:
    """Activations with strong correlations between input channels, as real layers see: a rank-16
    signal (its mixing fixed per K, so that two seeds are two samples of one source) plus a little
    noise."""
    mix = torch.randn(16, k, generator=_gen(100 + k))  # one source: the same mixing every call
    g = _gen(seed)
    return torch.randn(samples, 16, generator=g) @ mix + 0.1 * torch.randn(samples, k, generator=g)


def _outliers(samples: int, k: int, seed: int, channels: int = 4) -> torch.Tensor:
    """Standard normal activations with ``channels`` input channels 30 times larger."""
    x = torch.randn(samples, k, generator=_gen(seed))
    x[:, :channels] *= 30
    return x


# ---------------------------------------------------------------- packing and RTN

@pytest.mark.parametrize("n, k", [(1, 2), (3, 64), (17, 130)])
def test_pack_unpack_round_trip(n, k):
    codes = torch.randint(0, 16, (n, k), generator=_gen(n * k), dtype=torch.uint8)
    packed = qt.pack_int4(codes)
    assert packed.shape == (n, k // 2) and packed.dtype == torch.uint8
    assert torch.equal(qt.unpack_int4(packed), codes)
    # the nibble order is part of the format the kernel reads: code 2j low, code 2j + 1 high
    assert torch.equal(packed & 0xF, codes[:, 0::2]) and torch.equal(packed >> 4, codes[:, 1::2])
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    assert torch.equal(qt.pack_int4(qt.unpack_int4(every_byte)), every_byte)


@pytest.mark.parametrize("group_size", [32, 64, 128, None])
@pytest.mark.parametrize("zero_point", [False, True])
def test_rtn_int4_within_half_a_step(group_size, zero_point):
    w = torch.randn(48, 256, generator=_gen(1)) * torch.rand(48, 1, generator=_gen(2)) * 3
    w[0, :] = 0  # an all-zero row: scale 1, codes exact
    w[1, :] = 0.25  # a constant row (all positive): zero points must still reach it
    codes, scales, zeros = qt.rtn_int4(w, group_size, zero_point)
    g = 256 if group_size is None else group_size
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == (48, 256 // g) and (zeros is None) == (not zero_point)
    w_hat = qt.dequantize_int4(codes, scales.double(), zeros)
    step = scales.double().repeat_interleave(g, dim=1)
    assert ((w_hat - w.double()).abs() <= step / 2 * (1 + 1e-6)).all()
    assert torch.equal(w_hat[0], torch.zeros(256, dtype=torch.float64))


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_within_half_a_step_and_linear_close(symmetric):
    w = torch.randn(64, 96, generator=_gen(3)) + (0 if symmetric else 0.7)
    q, scale, zero = qt.quantize_int8(w, symmetric)
    assert q.dtype == (torch.int8 if symmetric else torch.uint8)
    w_hat = qt.dequantize_int8(q, scale, zero)
    assert ((w_hat - w).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all()
    x = torch.randn(8, 96, generator=_gen(4))
    y, y_ref = qt.int8_linear(x, q, scale, zero), x @ w.T
    rel = float((y - y_ref).norm() / y_ref.norm())
    assert rel < 1e-2, rel  # 8 bits: ~1/255 of each row's range per weight
    # and int4 RTN of the same layer is far worse: the test can tell 8 bits from 4
    codes, s4, z4 = qt.rtn_int4(w, 32, not symmetric)
    assert qt.output_error(x, w, qt.dequantize_int4(codes, s4.double(), z4)) > 5 * rel


# ---------------------------------------------------------------- GPTQ

@pytest.mark.parametrize("group_size, zero_point", [(32, False), (128, True), (None, False)])
def test_gptq_beats_rtn_on_correlated_activations(group_size, zero_point):
    n, k = 64, 256
    w = torch.randn(n, k, generator=_gen(5))
    x_cal, x_test = _correlated(1024, k, 6), _correlated(1024, k, 7)
    rtn = qt.dequantize_int4(*_double(qt.rtn_int4(w, group_size, zero_point)))
    gptq = qt.dequantize_int4(*_double(qt.gptq_int4(w, x_cal, group_size, zero_point)))
    no_prop = qt.dequantize_int4(*_double(qt.gptq_int4(w, x_cal, group_size, zero_point,
                                                        propagate=False)))
    e_rtn, e_gptq = qt.output_error(x_test, w, rtn), qt.output_error(x_test, w, gptq)
    assert e_gptq < 0.5 * e_rtn, (e_gptq, e_rtn)  # on held-out activations from the same source
    # the planted bug: without error propagation GPTQ is RTN, and must not beat it
    assert qt.output_error(x_test, w, no_prop) >= 0.99 * e_rtn
    # the error moved into the output's blind spots, not removed: the weights are further off
    assert (gptq - w.double()).norm() > (rtn - w.double()).norm()


def test_gptq_lazy_blocks_match_one_block():
    """Lazy batch updates only reorder the arithmetic: blocks of 32 give the codes of one block."""
    w, x = torch.randn(16, 128, generator=_gen(8)), _correlated(256, 128, 9)
    one = qt.gptq_int4(w, x, 32, block_size=128)
    lazy = qt.gptq_int4(w, x, 32, block_size=32)
    assert (one[0] != lazy[0]).float().mean() < 0.01  # float64 reassociation flips a rare tie
    torch.testing.assert_close(one[1], lazy[1], rtol=1e-5, atol=0)


def _double(result):
    codes, scales, zeros = result
    return codes, scales.double(), zeros


# ---------------------------------------------------------------- AWQ

@pytest.mark.parametrize("zero_point", [False, True])
def test_awq_beats_rtn_with_salient_channels(zero_point):
    n, k = 64, 256
    w = torch.randn(n, k, generator=_gen(10))
    res = qt.awq_int4(w, _outliers(512, k, 11), 128, zero_point)
    assert res.alpha > 0 and res.errors[res.alpha] < 0.8 * res.errors[0.0], res.errors
    # alpha = 0 is exactly RTN
    rtn = qt.dequantize_int4(*_double(qt.rtn_int4(w, 128, zero_point)))
    x_test = _outliers(512, k, 12)
    assert res.errors[0.0] == pytest.approx(qt.output_error(_outliers(512, k, 11), w, rtn))
    assert qt.output_error(x_test, w, res.weight()) < 0.8 * qt.output_error(x_test, w, rtn)
    # salient channels were scaled up: s is largest where |x| is
    assert int(res.act_scale.argmax()) < 4


def test_awq_scale_folds_into_the_previous_layer():
    """prev -> (fold 1/s into prev) -> quantised (w * s) computes prev -> w_eff: the rescaling
    costs no op at inference."""
    g = _gen(16)
    prev = torch.randn(128, 32, generator=g, dtype=torch.float64)  # the previous linear layer
    w = torch.randn(48, 128, generator=g, dtype=torch.float64)
    h = torch.randn(256, 32, generator=g, dtype=torch.float64)
    h[:, :2] *= 20
    res = qt.awq_int4(w, h @ prev.T, 64, True)
    folded = qt.fold_awq_scale(prev, res.act_scale)
    w_q = qt.dequantize_int4(res.codes, res.scales.double(), res.zeros)  # what the kernel reads
    torch.testing.assert_close((h @ folded.T) @ w_q.T, (h @ prev.T) @ res.weight().T)
    gain = torch.rand(128, generator=g, dtype=torch.float64) + 0.5  # or a norm's gain
    torch.testing.assert_close(qt.fold_awq_scale(gain, res.act_scale) * res.act_scale, gain)
    with pytest.raises(ValueError, match="fold_awq_scale"):
        qt.fold_awq_scale(torch.ones(64), res.act_scale)


def test_awq_without_outliers_gains_little():
    """With no salient channels every s_j is about equal: AWQ has nothing to protect."""
    w = torch.randn(32, 128, generator=_gen(13))
    res = qt.awq_int4(w, torch.randn(512, 128, generator=_gen(14)), 64, False)
    assert res.errors[res.alpha] > 0.9 * res.errors[0.0]


# ---------------------------------------------------------------- FP8 KV cache

@pytest.mark.parametrize("granularity", ["head", "token"])
def test_kv_fp8_within_e4m3_bound(granularity):
    kv = torch.randn(2, 4, 33, 64, generator=_gen(15))
    kv[:, 1] *= 50  # one loud head: per-head scales keep the others' precision
    kv[0, 2, 5] = 0  # zeros stay zero
    q, scales = qt.quantize_kv_fp8(kv, granularity)
    assert q.dtype == torch.float8_e4m3fn and q.shape == kv.shape
    assert scales.shape == ((2, 4, 1, 1) if granularity == "head" else (2, 4, 33, 1))
    back = qt.dequantize_kv_fp8(q, scales)
    assert ((back - kv).abs() <= qt.kv_fp8_error_bound(kv, scales) * (1 + 1e-6)).all()
    assert torch.equal(back[0, 2, 5], torch.zeros(64))
    rel_quiet = float((back[:, 0] - kv[:, 0]).norm() / kv[:, 0].norm())
    assert rel_quiet < 2.0**-4  # the quiet head did not pay for the loud one


# ---------------------------------------------------------------- refusals

BAD = [
    ("group does not divide K", lambda: qt.rtn_int4(torch.zeros(4, 96), 64), ValueError,
     "does not divide K"),
    ("odd group", lambda: qt.rtn_int4(torch.zeros(4, 99), 33), ValueError, "even"),
    ("1-D weight", lambda: qt.rtn_int4(torch.zeros(96), 32), ValueError, "2-D"),
    ("int weight", lambda: qt.quantize_int8(torch.zeros(4, 8, dtype=torch.int32)), TypeError,
     "floating"),
    ("pack odd K", lambda: qt.pack_int4(torch.zeros(4, 7, dtype=torch.uint8)), ValueError,
     "K even"),
    ("pack code 16", lambda: qt.pack_int4(torch.full((1, 2), 16, dtype=torch.uint8)), ValueError,
     "0..15"),
    ("calibration K", lambda: qt.gptq_int4(torch.zeros(4, 64), torch.zeros(8, 32), 32), ValueError,
     "samples, K = 64"),
    ("block vs group", lambda: qt.gptq_int4(torch.zeros(4, 128), torch.ones(8, 128), 64,
                                            block_size=96), ValueError, "multiple of the group"),
    ("awq grid", lambda: qt.awq_int4(torch.zeros(4, 64), torch.ones(8, 64), 32, grid=0),
     ValueError, "grid"),
    ("kv 3-D", lambda: qt.quantize_kv_fp8(torch.zeros(2, 3, 4)), ValueError, "4-D"),
    ("kv granularity", lambda: qt.quantize_kv_fp8(torch.zeros(1, 1, 2, 4), "block"), ValueError,
     "granularity"),
]


@pytest.mark.parametrize("label, call, exc, words", BAD, ids=[b[0] for b in BAD])
def test_refuses(label, call, exc, words):
    with pytest.raises(exc, match=words):
        call()

"""The decode cost model: Llama 3 8B's published parameter count, the bytes and FLOPs of a step
counted by hand, the roofline's two regimes, the batch where decode turns compute-bound (checked
against the step counts on both sides of it), prefill's intensity against decode's, and clear
refusal of bad input."""

from __future__ import annotations

import pytest

from snippets.part8 import decode_model as dm

CFG = dm.LLAMA3_8B
BW, PEAK = 1e12, 2e14        # nominal: 1 TB/s and 200 TFLOP/s, numbers for the arithmetic


def test_llama3_8b_parameter_count():
    """8,030,261,248: the count Meta publishes for Llama 3 8B (8.03 B)."""
    assert dm.layer_params(CFG) == 218_112_000
    assert dm.param_count(CFG) == 8_030_261_248
    assert dm.matmul_params(CFG) == 8_030_261_248 - 128256 * 4096


def test_kv_bytes_per_token():
    assert dm.kv_bytes_per_token(CFG) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    fp8 = dm.DecoderConfig(**{**CFG.__dict__, "kv_dtype_bytes": 1})
    assert dm.kv_bytes_per_token(fp8) * 2 == dm.kv_bytes_per_token(CFG)


def test_step_counts_by_hand():
    b, ctx = 4, 1000
    weights = dm.matmul_params(CFG) * 2
    assert dm.decode_step_bytes(CFG, b, ctx) == weights + b * 4096 * 2 + b * 1001 * 131072
    attn = 4 * 32 * 32 * 128 * 1001
    assert dm.decode_step_flops(CFG, b, ctx) == b * (2 * dm.matmul_params(CFG) + attn)
    # the weights' share of the bytes falls with the batch, their FLOPs per byte grow with it
    assert dm.arithmetic_intensity(CFG, 64, ctx) > 30 * dm.arithmetic_intensity(CFG, 1, ctx)


def test_intensity_at_batch_one_is_about_one_flop_per_byte():
    """Batch 1, short context: 2 FLOPs per weight, 2 bytes per weight."""
    assert 0.99 < dm.arithmetic_intensity(CFG, 1, 0) < 1.01


def test_roofline_table_regimes():
    rows = dm.roofline_table(CFG, 0, BW, PEAK)
    assert [r["batch"] for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert rows[0]["bound"] == "memory"
    # memory-bound: tokens per second grow almost linearly with the batch at first
    assert rows[1]["tokens_per_s"] > 1.9 * rows[0]["tokens_per_s"]
    for r in rows:
        assert r["seconds"] == pytest.approx(max(r["bytes"] / BW, r["flops"] / PEAK))
        assert r["seconds"] == dm.roofline_step_time(CFG, r["batch"], 0, BW, PEAK)
    b = dm.compute_bound_batch(CFG, 0, BW, PEAK)
    assert b == 201     # about the balance point, 200 FLOPs per byte: 2 FLOPs per 2-byte weight
    assert [r["bound"] for r in rows] == ["memory"] * 8 + ["compute"]
    # compute-bound, the step time grows with the batch: tokens per second stop growing
    assert rows[-1]["tokens_per_s"] < 1.01 * 2e14 / rows[-1]["flops"] * 256


@pytest.mark.parametrize("ctx", [0, 128, 512])
def test_compute_bound_batch_is_the_boundary(ctx):
    b = dm.compute_bound_batch(CFG, ctx, BW, PEAK)
    assert b is not None and b > 1

    def compute_bound(n):
        return dm.decode_step_flops(CFG, n, ctx) / PEAK >= dm.decode_step_bytes(CFG, n, ctx) / BW

    assert compute_bound(b) and not compute_bound(b - 1)


def test_long_context_never_turns_compute_bound():
    """With GQA's 4 query heads per kv head in bf16, attention does 4 FLOPs per cache byte (the
    module docstring of decode_attention): a cache of a long enough context
    keeps every batch memory-bound. At 200 FLOPs per byte, 1024 tokens are long enough."""
    assert dm.compute_bound_batch(CFG, 1024, BW, PEAK) is None
    assert all(r["bound"] == "memory" for r in dm.roofline_table(CFG, 1024, BW, PEAK))


def test_prefill_intensity_grows_with_the_prompt():
    assert dm.prefill_intensity(CFG, 2048) > 500 * dm.arithmetic_intensity(CFG, 1, 2048)
    assert 1000 < dm.prefill_intensity(CFG, 2048) < 4000
    assert dm.prefill_flops(CFG, 1) == dm.decode_step_flops(CFG, 1, 0)


@pytest.mark.parametrize("call, match", [
    (lambda: dm.decode_step_bytes(CFG, 0, 10), "batch must be >= 1"),
    (lambda: dm.decode_step_flops(CFG, 1, -1), "context must be >= 0"),
    (lambda: dm.roofline_step_time(CFG, 1, 1, 0.0, PEAK), "bandwidth"),
    (lambda: dm.roofline_table(CFG, 1, BW, float("inf")), "peak_flops"),
    (lambda: dm.roofline_table(CFG, 1, BW, PEAK, batches=()), "empty"),
    (lambda: dm.compute_bound_batch(CFG, 1, -1.0, PEAK), "bandwidth"),
    (lambda: dm.prefill_flops(CFG, 0), "prompt"),
    (lambda: dm.DecoderConfig(2, 64, 6, 4, 16, 128, 100), "multiple of kv_heads"),
    (lambda: dm.DecoderConfig(2, 64, 4, 0, 16, 128, 100), "kv_heads must be >= 1"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_types_raise():
    with pytest.raises(TypeError, match="batch"):
        dm.decode_step_bytes(CFG, 2.0, 10)
    with pytest.raises(TypeError, match="bandwidth"):
        dm.roofline_step_time(CFG, 1, 1, "fast", PEAK)

"""Autotuning: the config space, the pruning rules, fixed-config launches and triton.autotune around the Part 3
GEMM kernel. On the CPU the interpreter cannot time, so the autotuner is exercised with a space that pruning cuts
to one config; the GPU tests tune for real and run the measured sweep on a small problem."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import triton

from conftest import poison_allocator
from snippets.common.gemm import tolerance_for
from snippets.part4 import autotune as at
from snippets.part4.autotune import MatmulConfig

C = MatmulConfig


def test_space_is_the_product_of_the_knobs():
    space = at.matmul_space()
    assert len(space) == 3 * 3 * 3 * 1 * 2 * 4 == len(set(space))
    small = at.matmul_space(block_m=(32,), block_n=(32, 64), block_k=(16,), num_warps=(4,), num_stages=(2, 3))
    assert small == [C(32, 32, 16, 8, 4, 2), C(32, 32, 16, 8, 4, 3), C(32, 64, 16, 8, 4, 2), C(32, 64, 16, 8, 4, 3)]
    for bad in (48, 8):
        with pytest.raises(ValueError, match="powers of two >= 16"):
            at.matmul_space(block_n=(bad,))


def test_config_round_trips_through_triton():
    cfg = C(128, 64, 32, 4, num_warps=8, num_stages=5)
    tc = cfg.to_triton()
    assert tc.kwargs == {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}
    assert (tc.num_warps, tc.num_stages) == (8, 5) and MatmulConfig.from_triton(tc) == cfg


def test_smem_estimate():
    # 3 stages x (128 + 128) rows x 64 columns x 2 bytes: the 96 KB of the Part 3 config
    assert at.smem_bytes(C(128, 128, 64, num_stages=3), 2) == 3 * 256 * 64 * 2 == 98304
    assert at.smem_bytes(C(128, 256, 64, num_stages=5), 2) == 245760  # over sm_90's 232448: OutOfResources
    assert at.smem_bytes(C(64, 64, 32, num_stages=2), 4) == 2 * 128 * 32 * 4


def test_prune_drops_what_does_not_fit():
    space = at.matmul_space()
    kept = at.prune(space, 4096, 4096, 4096, 2)
    assert kept and all(at.smem_bytes(c, 2) <= at.SMEM_LIMIT_SM90 for c in kept)
    dropped = set(space) - set(kept)
    assert C(256, 256, 128, 8, 4, 2) in dropped and all(at.smem_bytes(c, 2) > at.SMEM_LIMIT_SM90 for c in dropped)
    # fp32 tiles are twice as large: fewer survive
    assert len(at.prune(space, 4096, 4096, 4096, 4)) < len(kept)
    assert [c for c in kept if c in space] == kept  # the original order is kept
    assert at.prune(space, 4096, 4096, 4096, 2, limit=1024) == []


def test_prune_fits_blocks_to_a_small_problem():
    space = at.matmul_space()
    kept = at.prune(space, 40, 100, 64, 2)
    # M = 40 needs at most a 64-row block, N = 100 a 128-column one; K = 64 is one 64-deep step or two 32-deep
    assert {c.BLOCK_M for c in kept} == {64} and {c.BLOCK_N for c in kept} == {64, 128}
    assert {c.BLOCK_K for c in kept} == {32, 64}
    # no more stages than K iterations, except the smallest stage count of the space (2)
    assert all(c.num_stages <= max(2, triton.cdiv(64, c.BLOCK_K)) for c in kept)
    assert C(64, 64, 32, 8, 4, 2) in kept and C(64, 64, 64, 8, 4, 3) not in kept
    # a 1 x 1 x 1 problem still keeps the smallest configs
    tiny = at.prune(space, 1, 1, 1, 2)
    assert tiny and {(c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_stages) for c in tiny} == {(64, 64, 32, 2)}


def test_prune_checks_its_arguments():
    with pytest.raises(ValueError, match="m must be >= 1"):
        at.prune(at.TUNE_SPACE, 0, 1, 1, 2)
    with pytest.raises(TypeError, match="itemsize"):
        at.prune(at.TUNE_SPACE, 1, 1, 1, 2.0)


def test_early_config_prune_has_triton_signature():
    params = list(inspect.signature(at.early_config_prune).parameters)
    assert params[:2] == ["configs", "named_args"]
    a = torch.empty(40, 64, dtype=torch.float16)
    configs = [c.to_triton() for c in at.matmul_space()]
    kept = at.early_config_prune(configs, {"a_ptr": a, "M": 40, "N": 100, "K": 64}, INPUT_PRECISION="tf32")
    assert kept and all(c in configs for c in kept)  # the same Config objects, filtered
    assert [MatmulConfig.from_triton(c) for c in kept] == at.prune(at.matmul_space(), 40, 100, 64, 2)
    huge = [C(256, 256, 128, num_stages=5).to_triton()]
    with pytest.raises(ValueError, match="no configuration fits"):
        at.early_config_prune(huge, {"a_ptr": a, "M": 4096, "N": 4096, "K": 4096})


def test_autotune_options_match_this_triton():
    has = "cache_results" in inspect.signature(triton.autotune).parameters
    assert at._autotune_options() == ({"cache_results": True} if has else {})


@pytest.mark.parametrize("cfg", [C(16, 16, 16, 1), C(32, 16, 32, 2), C(16, 64, 16, 8)], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 19), (123, 45, 67), (64, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matmul_with_every_config(device, cfg, shape, dtype):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 1000 + n)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
    poison_allocator(m * n * dtype.itemsize, device)
    c = at.matmul_with(a, b, cfg)
    assert c.shape == (m, n) and c.dtype == dtype
    rtol, atol = tolerance_for(k, dtype)
    torch.testing.assert_close(c.double().cpu(), a.double().cpu() @ b.double().cpu(), rtol=rtol, atol=atol)


TRITON_VERSION = tuple(int(x) for x in triton.__version__.split(".")[:2])


@pytest.mark.skipif(TRITON_VERSION <= (3, 6) and not torch.cuda.is_available(),
                    reason="Triton 3.6's autotuner times every pruned config even when one is left, and "
                           "timing needs a GPU (Triton 3.9 launches a lone config untimed)")
def test_autotuner_runs_the_config_pruning_leaves(device):
    # Two configs; at K = 16 the 64-deep one has a block 4x the problem and goes: one config is left, which the
    # autotuner launches without timing (so this runs under the interpreter too). On a GPU it would time both.
    kernel = at.make_autotuned([C(16, 16, 16, 1), C(16, 16, 64, 1)])
    a = torch.randn(20, 16, device=device, dtype=torch.float16)
    b = torch.randn(16, 24, device=device, dtype=torch.float16)
    c = at.matmul_tuned(a, b, kernel)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-3, atol=1e-2)
    assert MatmulConfig.from_triton(kernel.best_config) == C(16, 16, 16, 1)
    assert kernel.keys == ["M", "N", "K"]


@pytest.mark.parametrize("fn", [at.matmul_tuned, lambda a, b: at.matmul_with(a, b, C(16, 16, 16))])
def test_bad_inputs(device, fn):
    a = torch.randn(8, 4, device=device)
    with pytest.raises(TypeError, match="dtype"):
        fn(a.to(torch.int32), a.t().contiguous().to(torch.int32))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        fn(a, a)
    with pytest.raises(ValueError, match="contiguous"):
        fn(a, a.t())
    with pytest.raises(ValueError, match="empty"):
        fn(torch.empty(0, 4, device=device), torch.empty(4, 3, device=device))
    with pytest.raises(ValueError, match="2-D"):
        fn(a[None], a.t().contiguous())
    other = "meta" if device == "cpu" else "cpu"
    with pytest.raises(ValueError, match="device"):
        fn(a.to(other), a.t().contiguous().to(other))


def test_matmul_with_refuses_a_dict_config(device):
    a = torch.randn(4, 4, device=device)
    with pytest.raises(TypeError, match="MatmulConfig"):
        at.matmul_with(a, a, {"BLOCK_M": 16})


def test_tflops_formula():
    assert at.tflops(1000, 1000, 1000, 1.0) == pytest.approx(2.0)  # 2e9 FLOPs in 1 ms
    with pytest.raises(ValueError):
        at.tflops(1, 1, 1, 0.0)
    assert math.isclose(at.tflops(4096, 4096, 4096, 0.5), 2 * 4096**3 / 0.5e-3 / 1e12)


def test_sweep_configs_cover_both_grids():
    cfgs = at.sweep_configs()
    assert len(cfgs) == len(set(cfgs))
    cells = {(c.BLOCK_M, c.BLOCK_N) for c in cfgs}
    assert cells == {(m, n) for m in (64, 128, 256) for n in (64, 128, 256)}
    square = {(c.num_stages, c.num_warps) for c in cfgs if (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K) == (128, 128, 64)}
    assert square == {(s, w) for s in range(1, 7) for w in (2, 4, 8, 16)}
    assert any(at.smem_bytes(c, 2) > at.SMEM_LIMIT_SM90 for c in cfgs)  # failures are part of the lesson


@pytest.mark.gpu
def test_autotuner_tunes_on_gpu():
    kernel = at.make_autotuned([C(64, 64, 32, num_warps=4, num_stages=2), C(128, 128, 64, num_warps=8, num_stages=3)])
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    c = at.matmul_tuned(a, b, kernel)
    rtol, atol = tolerance_for(256, torch.bfloat16)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol)
    assert len(kernel.cache) == 1  # one key tuned
    at.matmul_tuned(a, b, kernel)
    assert len(kernel.cache) == 1  # the same key: no new tuning
    at.matmul_tuned(a[:256], b, kernel)
    assert len(kernel.cache) == 2  # another M: tuned again


@pytest.mark.gpu
def test_sweep_records_ok_and_failed_configs():
    over = C(256, 256, 64, num_warps=8, num_stages=5)  # 320 KiB: more shared memory than any GPU has
    recs = at.sweep([C(64, 64, 32, num_warps=4, num_stages=2), over], 256, 256, 256, budget_ms=20)
    assert recs[0]["status"] == "ok" and recs[0]["tflops"] > 0 and recs[0]["ms"] > 0
    assert recs[1]["status"] == "failed" and not recs[1]["fits"] and "OutOfResources" in recs[1]["error"]

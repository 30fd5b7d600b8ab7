"""PyTorch's FSDP2 on the tiny model (snippets/part7/fsdp.py), on 2 and 4 gloo ranks: with and
without prefetching, and keeping the gathered parameters until the backward, it trains exactly as
one process does on the whole batch (ten SGD steps, fp32 and fp64); each rank holds 1/p of the
parameters; in mixed precision the shards stay fp32 and the losses follow the fp32 run's."""

from __future__ import annotations

import pytest
import torch

from snippets.part7.fsdp import train_fsdp2
from snippets.part7.launch import run_world
from snippets.part7.models import tiny_model, train_tiny

TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
CASES = [(torch.float64, True, True), (torch.float32, True, True),
         (torch.float64, False, True), (torch.float64, True, False)]


def one_process(dtype) -> dict:
    """train_tiny without a process group: tiny_model(0) on the whole batch, the same SGD."""
    return train_tiny(0, 1, steps=10, dtype=dtype)


def fsdp_world(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    out = {case: train_fsdp2(rank, world, dtype=case[0], prefetch=case[1],
                             reshard_after_forward=case[2]) for case in CASES}
    out["mixed"] = train_fsdp2(rank, world, dtype=torch.float32, mixed=True)
    return out


@pytest.fixture(scope="module", params=[2, 4])
def world(request):
    return request.param, run_world(fsdp_world, request.param, backend="gloo", timeout_s=240)


def test_fsdp2_trains_as_one_process(world):
    p, ranks = world
    for case in CASES:
        dtype = case[0]
        ref = one_process(dtype)
        for rank, out in enumerate(ranks):
            run = out[case]
            assert max(abs(a - b) for a, b in zip(run["loss"], ref["loss"])) <= TOL[dtype], \
                (p, rank, case)
            worst = max((a - b).abs().max().item() for a, b in zip(run["params"], ref["params"]))
            assert worst <= TOL[dtype], (p, rank, case, worst)


def test_each_rank_holds_its_shard(world):
    p, ranks = world
    full = sum(q.numel() * q.element_size() for q in tiny_model(0, torch.float64).parameters())
    held = sum(out[CASES[0]]["held_bytes"] for out in ranks)
    assert held == full                                     # the shards add up to the model
    assert max(out[CASES[0]]["held_bytes"] for out in ranks) <= full / p + 8 * 64 * 8


def test_mixed_precision_keeps_fp32_shards_and_follows_fp32(world):
    p, ranks = world
    ref = one_process(torch.float32)
    for out in ranks:
        assert out["mixed"]["dtypes"] == ["torch.float32"]
        assert max(abs(a - b) for a, b in zip(out["mixed"]["loss"], ref["loss"])) < 2e-2
        assert out["mixed"]["loss"] != ref["loss"]           # bf16 compute did happen


def test_uneven_batch_raises():
    with pytest.raises(ValueError, match="equal shards"):
        train_fsdp2(0, 3, global_batch=8)

"""Data parallelism and ZeRO on the small transformer (attention included), not only on the
MLP-only tiny model: BucketedDDP and ZeRO stages 1, 2 and 3 on 2 and 3 gloo ranks train
``tiny_transformer`` for ten steps exactly as one process does on the whole batch (losses and
parameters within 1e-12 in fp64 and 1e-6 in fp32)."""

from __future__ import annotations

import functools

import pytest
import torch

from snippets.part7.ddp import BucketedDDP
from snippets.part7.launch import run_world
from snippets.part7.models import lm_loss, tiny_batch, tiny_transformer
from snippets.part7.zero import Zero3Module, ZeroOptimizer

STEPS, BATCH, SEQ = 10, 6, 8
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
METHODS = ("ddp", "zero1", "zero2", "zero3")


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train(rank: int, world: int, method: str | None, dtype) -> dict:
    model = tiny_transformer(3, dtype)
    if method == "ddp":
        wrapped, opt = BucketedDDP(model, bucket_bytes=2**13), sgd(model.parameters())
    elif method in ("zero1", "zero2"):
        wrapped, opt = model, ZeroOptimizer(model, sgd, int(method[-1]))
    elif method == "zero3":
        wrapped = Zero3Module(model)
        opt = sgd(wrapped.parameters())
    else:
        wrapped, opt = model, sgd(model.parameters())
    losses = []
    for step in range(STEPS):
        tokens, targets = (t.tensor_split(world)[rank] for t in tiny_batch(step, BATCH, SEQ))
        opt.zero_grad()
        loss = lm_loss(wrapped, tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = (wrapped.full_parameters() if method == "zero3"
              else [p.detach().clone() for p in model.parameters()])
    return {"loss": losses, "params": params}


def world_runs(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    return {(m, d): train(rank, world, m, d) for m in METHODS
            for d in (torch.float64, torch.float32)}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(world_runs, request.param, backend="gloo", timeout_s=240)


@functools.lru_cache(maxsize=None)
def reference(dtype) -> dict:
    return train(0, 1, None, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_equals_one_process(world, method, dtype):
    p, results = world
    ref, tol = reference(dtype), TOL[dtype]
    losses = torch.tensor([r[method, dtype]["loss"] for r in results],
                          dtype=torch.float64).mean(0)   # equal shards: the mean of the means
    torch.testing.assert_close(losses, torch.tensor(ref["loss"], dtype=torch.float64),
                               atol=tol, rtol=0)
    for rank, r in enumerate(results):
        for a, b in zip(r[method, dtype]["params"], ref["params"]):
            torch.testing.assert_close(a, b, atol=tol, rtol=0,
                                       msg=lambda m: f"{method} rank {rank}/{p}: {m}")

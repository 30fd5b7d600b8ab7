"""ZeRO from scratch (snippets/part7/zero.py): stages 1, 2 and 3 on 2 and 4 gloo ranks train
tiny_model exactly as one process does on the whole batch, with SGD (momentum) and AdamW; each
rank holds the optimizer state of its shard only, and the bytes it holds are zero_memory's.

Each rank trains on its shard of the global batch with the mean loss over it; the single-process
reference takes the whole batch. One world per size runs every scenario.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from snippets.part7.launch import run_world
from snippets.part7.models import lm_loss, tiny_batch, tiny_model
from snippets.part7.zero import Zero3Module, ZeroOptimizer, measured_bytes, zero_memory

SEED = 7
GLOBAL_BATCH = 8
SEQ_LEN = 8
STEPS = 10
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
# bytes of optimizer state per parameter in fp32 training, where the parameters are the master
# weights: SGD keeps a momentum, AdamW a momentum and a variance
OPTIMIZERS = {"sgd": 4, "adamw": 8}


def make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    # Adam divides each gradient by its own running size, so an element whose gradient is nearly
    # zero (sums that cancel) takes a step of up to lr set by rounding: keep lr well under the fp32
    # tolerance's reach over ten steps
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)


def n_params() -> int:
    return sum(p.numel() for p in tiny_model(SEED).parameters())


def train(rank: int, world: int, stage: int, opt_name: str, dtype) -> dict:
    """Ten steps of tiny_model(SEED) with ZeRO stage ``stage`` (0: one process, no wrapper);
    returns the rank's local losses, the final full parameters and the bytes held before the
    last step."""
    model = tiny_model(SEED, dtype)
    if stage == 3:
        wrapped = Zero3Module(model)
        opt = make_optimizer(opt_name, wrapped.parameters())
    elif stage in (1, 2):
        wrapped = model
        opt = ZeroOptimizer(model, functools.partial(make_optimizer, opt_name), stage)
    else:
        wrapped, opt = model, make_optimizer(opt_name, model.parameters())
    losses, memory = [], None
    for step in range(STEPS):
        tokens, targets = (t.tensor_split(world)[rank]
                           for t in tiny_batch(step, GLOBAL_BATCH, SEQ_LEN))
        opt.zero_grad()
        loss = lm_loss(wrapped, tokens, targets)
        loss.backward()
        if step == STEPS - 1:
            memory = (wrapped.memory(opt) if stage == 3 else opt.memory() if stage
                      else measured_bytes(model.parameters(),
                                          [p.grad for p in model.parameters()], opt))
        opt.step()
        losses.append(loss.item())
    params = (wrapped.full_parameters() if stage == 3
              else [p.detach().clone() for p in model.parameters()])
    return {"loss": losses, "params": params, "memory": memory}


def zero_world(rank: int, world: int) -> dict:
    out = {(stage, opt, dtype): train(rank, world, stage, opt, dtype)
           for stage in (1, 2, 3) for opt in OPTIMIZERS for dtype in DTYPES}
    # replicas that start different are made equal by the broadcast from rank 0
    different = tiny_model(100 + rank)
    ZeroOptimizer(different, functools.partial(make_optimizer, "sgd"))
    out["broadcast"] = [p.detach().clone() for p in different.parameters()]
    try:
        ZeroOptimizer(tiny_model(0), functools.partial(make_optimizer, "sgd"), stage=3)
    except ValueError as exc:
        out["bad stage"] = str(exc)
    try:
        Zero3Module(torch.nn.Linear(2, 2))          # a parameter of the root: in no unit
    except ValueError as exc:
        out["no unit"] = str(exc)
    wrapped = Zero3Module(tiny_model(SEED))
    out["zero3 params"] = ([n for n, _ in wrapped.module.named_parameters()],
                           [s.numel() for s in wrapped.parameters()])
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(zero_world, request.param, backend="gloo", timeout_s=180)


@functools.lru_cache(maxsize=None)
def reference(opt_name: str, dtype) -> dict:
    return train(0, 1, 0, opt_name, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_equals_one_process_on_the_whole_batch(world, stage, opt_name, dtype):
    p, results = world
    ref, tol = reference(opt_name, dtype), TOL[dtype]
    runs = [r[stage, opt_name, dtype] for r in results]
    losses = torch.tensor([r["loss"] for r in runs], dtype=torch.float64).mean(0)
    torch.testing.assert_close(losses, torch.tensor(ref["loss"], dtype=torch.float64),
                               atol=tol, rtol=tol)
    for rank, run in enumerate(runs):
        assert len(run["params"]) == len(ref["params"])
        for a, b in zip(run["params"], ref["params"]):
            assert a.dtype == dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")


def test_the_test_can_fail(world):
    """One rank's shard alone (no averaging) lands far from the reference."""
    _, results = world
    alone = train(0, 2, 0, "sgd", torch.float64)
    ref = reference("sgd", torch.float64)
    assert max((a - b).abs().max().item() for a, b in zip(alone["params"], ref["params"])) > 1e-6


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bytes_held_per_rank_are_zero_memorys(world, stage, opt_name):
    p, results = world
    n = n_params()
    shard = -(-n // p)
    for dtype in DTYPES:
        size = torch.empty((), dtype=dtype).element_size()
        expected = zero_memory(n, p, stage, param_bytes=size, grad_bytes=size,
                               optim_bytes=OPTIMIZERS[opt_name] * size // 4)
        unsharded = reference(opt_name, dtype)["memory"]
        assert unsharded == zero_memory(n, 1, 0, size, size, OPTIMIZERS[opt_name] * size // 4)
        for r in results:
            held = r[stage, opt_name, dtype]["memory"]
            assert held == expected
            # the optimizer state: exactly this rank's shard, about 1/p of the unsharded
            assert held["optimizer"] == shard * OPTIMIZERS[opt_name] * size // 4
            assert held["optimizer"] * p == unsharded["optimizer"]


def test_construction_broadcasts_rank0s_weights(world):
    _, results = world
    expected = [p.detach() for p in tiny_model(100).parameters()]
    for r in results:
        assert all(torch.equal(a, b) for a, b in zip(r["broadcast"], expected))
        assert "stage must be 1 or 2" in r["bad stage"]
        assert "outside every unit" in r["no unit"]


def test_zero3_keeps_only_shards(world):
    """The wrapped module has no parameters left; the wrapper has one shard per unit (embedding,
    two blocks, norm, head), each 1/p of the unit."""
    p, results = world
    units = [[q.numel() for q in unit.parameters()] for unit in (
        tiny_model(SEED).embed, *tiny_model(SEED).blocks, tiny_model(SEED).norm,
        tiny_model(SEED).head)]
    for r in results:
        names, shards = r["zero3 params"]
        assert names == []
        assert shards == [-(-sum(u) // p) for u in units]


def test_zero_memory_reproduces_the_papers_figure_1():
    """7.5B parameters, 64 ranks, mixed-precision Adam (K = 12): 120 GB per rank for data
    parallelism, 31.4, 16.6 and 1.9 GB for stages 1, 2 and 3 (GB = 1e9 bytes)."""
    gb = [round(zero_memory(7_500_000_000, 64, s)["total"] / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    m = zero_memory(7_500_000_000, 64, 1)
    assert m == {"params": 15e9, "grads": 15e9, "optimizer": 90e9 / 64, "total": m["total"]}
    assert zero_memory(10, 4, 3, 1, 1, 1)["params"] == 3         # shards are padded: ceil(10/4)


@pytest.mark.parametrize("kwargs", [dict(stage=4), dict(stage=-1), dict(world_size=0),
                                    dict(n_params=-1), dict(optim_bytes=-2), dict(stage=1.5)])
def test_zero_memory_rejects_bad_arguments(kwargs):
    args = dict(n_params=100, world_size=4, stage=1) | kwargs
    with pytest.raises(ValueError):
        zero_memory(**args)


def test_wrappers_need_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="process group"):
        ZeroOptimizer(tiny_model(0), functools.partial(make_optimizer, "sgd"))
    with pytest.raises(RuntimeError, match="process group"):
        Zero3Module(tiny_model(0))

"""Data parallelism from scratch (snippets/part7/ddp.py): BucketedDDP on 2 and 4 gloo ranks trains
tiny_model exactly as one process does on the whole batch, as torch's own DDP does; no_sync
accumulates; a bucket's all-reduce starts before the backward ends.

Each rank trains on its shard of a global batch with the mean loss over its shard; since the shards
are equal, the average of the ranks' gradients is the gradient of the mean loss over the whole
batch, which the single-process reference computes. One world per size runs every scenario
(spawning the processes is most of the time).
"""

from __future__ import annotations

import contextlib
import functools
import random

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from snippets.part7.ddp import BucketedDDP, assign_buckets
from snippets.part7.launch import run_world
from snippets.part7.models import lm_loss, tiny_batch, tiny_model, train_tiny

SEED = 7
GLOBAL_BATCH = 8        # sequences per step: divisible by every world size tested
SEQ_LEN = 8
STEPS = 10
LR = 0.1
BUCKET_BYTES = 2**14    # several buckets for tiny_model in float32 and float64
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def micro_batches(step: int, rank: int, world: int, micro: int):
    """Rank ``rank``'s ``micro`` micro-batches of step ``step``: the global batch of
    GLOBAL_BATCH * micro sequences cut into ``world`` shards, each cut into ``micro`` pieces."""
    tokens, targets = tiny_batch(step, GLOBAL_BATCH * micro, SEQ_LEN)
    mine = (tokens.tensor_split(world)[rank], targets.tensor_split(world)[rank])
    return list(zip(mine[0].tensor_split(micro), mine[1].tensor_split(micro)))


def train(rank: int, world: int, dtype, wrapper: str, steps: int = STEPS, micro: int = 1,
          device: str = "cpu", set_to_none: bool = True):
    """Train tiny_model(SEED) for ``steps`` SGD steps; returns (local losses, parameters, log of the
    last backward, whether every ``.grad`` is a view of its bucket at the end). ``wrapper``: "ours"
    (BucketedDDP), "torch" (DistributedDataParallel) or "none" (a single process: rank 0 of a world
    of 1). ``set_to_none``: how ``zero_grad`` clears the gradients before each step."""
    model = tiny_model(SEED, dtype).to(device)
    if wrapper == "ours":
        wrapped = BucketedDDP(model, bucket_bytes=BUCKET_BYTES)
    elif wrapper == "torch":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=BUCKET_BYTES / 2**20)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        total = 0.0
        batches = micro_batches(step, rank, world, micro)
        for k, (tokens, targets) in enumerate(batches):
            # the forward inside the block too: torch's DDP decides at the forward whether the
            # backward all-reduces (BucketedDDP decides in its hooks, so either way works for it)
            local = wrapper != "none" and k < micro - 1
            with wrapped.no_sync() if local else contextlib.nullcontext():
                loss = lm_loss(wrapped, tokens.to(device), targets.to(device)) / micro
                loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    log = list(wrapped.log) if wrapper == "ours" else []
    views = wrapper == "ours" and all(
        p.grad.data_ptr() == bucket.flat[start:].data_ptr()
        for bucket in wrapped.buckets for p, start in zip(bucket.params, bucket.offsets))
    return losses, [p.detach().cpu() for p in model.parameters()], log, views


def ddp_world(rank: int, world: int) -> dict:
    out = {}
    for dtype in (torch.float32, torch.float64):
        for wrapper in ("ours", "torch"):
            out[wrapper, dtype] = train(rank, world, dtype, wrapper)
    out["no_sync"] = train(rank, world, torch.float64, "ours", steps=4, micro=2)
    out["torch no_sync"] = train(rank, world, torch.float64, "torch", steps=4, micro=2)
    out["kept"] = train(rank, world, torch.float64, "ours", steps=4, micro=2, set_to_none=False)
    # replicas that start different are made equal by the broadcast from rank 0
    start = BucketedDDP(tiny_model(100 + rank), bucket_bytes=BUCKET_BYTES)
    out["broadcast"] = [p.detach().clone() for p in start.parameters()]
    out["buckets"] = len(start.buckets)
    out["train_tiny"] = train_tiny(rank, world)
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(ddp_world, request.param, backend="gloo", timeout_s=120)


@functools.lru_cache(maxsize=None)
def reference(dtype, steps: int = STEPS, micro: int = 1):
    """One process, the whole batch (all ranks' micro-batches at once), the mean loss."""
    model = tiny_model(SEED, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        tokens, targets = tiny_batch(step, GLOBAL_BATCH * micro, SEQ_LEN)
        opt.zero_grad()
        loss = lm_loss(model, tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def assert_float64_steps_equal_torchs(r: dict, rank: int) -> None:
    """One rank's float64 runs (plain, and two micro-batches with no_sync): BucketedDDP's losses
    and parameters equal torch's DDP's bit for bit."""
    for ours, theirs in ((("ours", torch.float64), ("torch", torch.float64)),
                         ("no_sync", "torch no_sync")):
        assert r[ours][0] == r[theirs][0], (rank, ours)
        assert all(torch.equal(a, b) for a, b in zip(r[ours][1], r[theirs][1])), (rank, ours)


def assert_same_run(results, ref, tol):
    """Every rank ended with the reference's parameters, and the mean of the ranks' losses is the
    reference's loss at every step."""
    ref_losses, ref_params = ref
    losses = torch.tensor([r[0] for r in results], dtype=torch.float64).mean(0)
    # the losses are near 4, where one float32 rounding is 4.8e-7: relative and absolute tol
    torch.testing.assert_close(losses, torch.tensor(ref_losses, dtype=torch.float64),
                               atol=tol, rtol=tol)
    for rank, (_, params, *_) in enumerate(results):
        assert len(params) == len(ref_params)
        for p, q in zip(params, ref_params):
            torch.testing.assert_close(p, q, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("wrapper", ["ours", "torch"])
def test_data_parallel_equals_one_process_on_the_whole_batch(world, wrapper, dtype):
    _, results = world
    assert_same_run([r[wrapper, dtype] for r in results], reference(dtype), TOL[dtype])


def test_the_test_can_fail(world):
    """A different learning rate (or a missed average) moves the parameters far past the
    tolerance: the comparison above is not vacuous."""
    _, results = world
    losses, params = reference(torch.float64)
    with pytest.raises(AssertionError):
        assert_same_run([r["ours", torch.float64] for r in results],
                        (losses, [2 * p for p in params]), TOL[torch.float64])
    alone = train(0, world[0], torch.float64, "none")  # rank 0's shard alone, no averaging
    with pytest.raises(AssertionError):
        assert_same_run([alone], reference(torch.float64), TOL[torch.float64])


@pytest.mark.parametrize("wrapper", ["ours", "torch"])
def test_no_sync_accumulation_equals_one_step_on_twice_the_batch(world, wrapper):
    _, results = world
    key = "no_sync" if wrapper == "ours" else "torch no_sync"
    assert_same_run([r[key] for r in results], reference(torch.float64, steps=4, micro=2),
                    TOL[torch.float64])


def test_on_two_ranks_ours_and_torchs_ddp_agree_bit_for_bit(world):
    """On two ranks an average is (a + b) / 2 in any order, so in float64 BucketedDDP and torch's
    DDP must take the same steps exactly, with and without no_sync. Catches what a tolerance hides:
    a micro-batch whose forward ran outside torch's no_sync block, so that torch's DDP all-reduced
    it anyway, landed within 1e-12 of the reference but a few ulps from BucketedDDP."""
    p, results = world
    if p != 2:
        pytest.skip("a sum of more than two values depends on the order of the additions")
    for rank, r in enumerate(results):
        assert_float64_steps_equal_torchs(r, rank)


def test_gradients_are_views_of_the_buckets_and_survive_zeroing_in_place(world):
    """After a step every ``.grad`` of BucketedDDP is a view of its slice of the bucket (nothing is
    copied back), and clearing them in place (``zero_grad(set_to_none=False)``, which keeps the
    views, so that autograd accumulates into the buckets) trains exactly as setting them to None:
    two micro-batches with no_sync, bit for bit in float64."""
    _, results = world
    for rank, r in enumerate(results):
        assert r["ours", torch.float64][3] and r["kept"][3], rank
        assert r["kept"][0] == r["no_sync"][0], rank
        assert all(torch.equal(a, b) for a, b in zip(r["kept"][1], r["no_sync"][1])), rank


def test_construction_broadcasts_rank0s_weights(world):
    _, results = world
    expected = list(tiny_model(100).parameters())
    for r in results:
        assert len(r["broadcast"]) == len(expected)
        for p, q in zip(r["broadcast"], expected):
            assert torch.equal(p, q.detach())


def test_a_bucket_is_launched_before_the_backward_ends(world):
    """The log of a backward: at least one all-reduce was launched while gradients of other
    buckets were still to come, every bucket was launched once, in order, and the end came last."""
    _, results = world
    for r in results:
        log = r["ours", torch.float32][2]
        n = r["buckets"]
        assert n >= 3
        launches = [b for kind, b in log if kind == "launch"]
        assert launches == list(range(n))
        last_grad = max(i for i, (kind, _) in enumerate(log) if kind == "grad")
        first_launch = log.index(("launch", 0))
        assert first_launch < last_grad, log
        assert log[-1] == ("end", -1)


def test_train_tiny_on_p_ranks_is_train_tiny_on_one(world):
    """The chapter's loop: every rank reports the global mean loss, and ends with the parameters
    of the one-process run."""
    p, results = world
    one = train_tiny(0, 1)
    for r in results:
        assert r["train_tiny"]["loss"] == pytest.approx(one["loss"], abs=1e-12, rel=0)
        for a, b in zip(r["train_tiny"]["params"], one["params"]):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert one["log"] == [] and ("launch", 0) in results[0]["train_tiny"]["log"]
    with pytest.raises(ValueError, match="equal shards"):
        train_tiny(0, 3)


def test_buckets_take_parameters_in_reverse_up_to_the_size():
    f32 = [torch.zeros(n) for n in (10, 20, 30, 5, 5, 100)]        # 40, 80, 120, 20, 20, 400 B
    assert assign_buckets(f32, 128) == [[5], [4, 3], [2], [1, 0]]
    assert assign_buckets(f32, 10**6) == [[5, 4, 3, 2, 1, 0]]
    assert assign_buckets(f32, 1) == [[i] for i in reversed(range(6))]
    mixed = [torch.zeros(2), torch.zeros(2, dtype=torch.float64), torch.zeros(2)]
    assert assign_buckets(mixed, 10**6) == [[2], [1], [0]]           # one dtype per bucket
    with pytest.raises(ValueError, match="bucket_bytes"):
        assign_buckets(f32, 0)


def test_buckets_closed_after_the_cap_are_torchs_buckets():
    """close="after" (BucketedDDP's default) is the rule of torch's reducer: on 300 random
    single-dtype models, the same buckets as torch.distributed's own assignment function."""
    f32 = [torch.zeros(n) for n in (10, 20, 30, 5, 5, 100)]        # 40, 80, 120, 20, 20, 400 B
    assert assign_buckets(f32, 128, "after") == [[5], [4, 3, 2], [1, 0]]
    assert assign_buckets(f32, 1, "after") == [[i] for i in reversed(range(6))]
    rng = random.Random(5)
    for _ in range(300):
        params = [torch.zeros(rng.randint(1, 300)) for _ in range(rng.randint(1, 30))]
        cap = rng.choice([4, 64, 400, 1024, 4096])
        backward_order = params[::-1]
        theirs, _ = dist._compute_bucket_assignment_by_size(
            backward_order, [cap], [False] * len(params))
        n = len(params)
        assert assign_buckets(params, cap, "after") == [[n - 1 - i for i in b] for b in theirs]
    with pytest.raises(ValueError, match="close"):
        assign_buckets(f32, 128, "never")


def test_bucketed_ddp_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="process group"):
        BucketedDDP(tiny_model(0))


def test_tiny_model_is_reproducible_and_leaves_the_generator_alone():
    state = torch.random.get_rng_state()
    a, b = tiny_model(3), tiny_model(3, torch.float64)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p.double(), q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(tiny_model(4).parameters()), next(a.parameters()))
    with pytest.raises(TypeError):
        tiny_model(0, torch.bfloat16)

"""Context and expert parallelism from scratch (snippets/part7/context_parallel.py and
expert_parallel.py) on 2 and 4 gloo ranks.

- Ring attention, causal or not, contiguous or zig-zag, equals full attention in one process,
  forward and backward (dq, dk, dv), in float64 and float32.
- ``train_cp`` (tiny_transformer with ring attention over shards of the positions) reproduces ten
  SGD steps of one process on whole sequences.
- The expert-parallel MoE layer equals the single-process ``MoE`` (one group per rank): outputs,
  input gradients, router and expert gradients, load-balancing loss and dropped counts, k = 1 and
  2, with and without a capacity that drops tokens; ``train_moe`` reproduces ten steps.
- Bad input raises ValueError; shards of different shapes on different ranks raise on every rank.

One world per size runs every scenario (spawning the processes is most of the time).
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from snippets.part7.context_parallel import (
    attention_with_lse,
    check_ring_attention,
    merge_partials,
    ring_attention,
    shard_sequence,
    train_cp,
    unshard_sequence,
    work_per_rank,
)
from snippets.part7.expert_parallel import (
    ExpertParallelMoE,
    MoE,
    a2a_bytes,
    check_expert_parallel,
    expert_capacity,
    route,
    train_moe,
)
from snippets.part7.launch import run_world
from snippets.part7.models import tiny_transformer

TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
STEPS = 10
CP_RUNS = [(torch.float32, True), (torch.float64, False)]                 # (dtype, zigzag)
MOE_CASES = [(torch.float64, k, cf) for k in (1, 2) for cf in (None, 0.5)] \
    + [(torch.float32, 2, 0.5)]                                           # (dtype, k, capacity)
MOE_RUNS = [(torch.float32, 2, 1.0), (torch.float64, 1, None)]
EXPERTS = 8


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def ring_case(rank: int, p: int, dtype) -> dict:
    """``check_ring_attention``'s errors for every layout, and the error of a layout bug: zig-zag
    shards attended as if they were contiguous."""
    out = check_ring_attention(rank, p, dtype, seq_len=8 * p)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 8 * p, 8, generator=g, dtype=dtype) for _ in range(3))
    want = shard_sequence(attention_with_lse(q, k, v, causal=True)[0], rank, p, zigzag=True)
    wrong = ring_attention(*(shard_sequence(t, rank, p, zigzag=True) for t in (q, k, v)),
                           causal=True, zigzag=False)
    out["layout bug"] = max_diff(wrong, want)
    return out


def refusals(rank: int, p: int) -> dict:
    """The errors bad input gets, every one caught on every rank."""
    out = {}
    attempts = {
        "experts": lambda: ExpertParallelMoE(MoE(4, 4, 2 * p + 1)),
        "zigzag shard": lambda: ring_attention(*(torch.zeros(1, 1, 3, 4),) * 3, zigzag=True),
        "zigzag seq": lambda: train_cp(rank, p, 1, seq_len=2 * p + 2, zigzag=True),
        # rank 0 passes one more position than the others: caught before anything is sent
        "ranks disagree": lambda: ring_attention(*(torch.zeros(1, 1, 4 + (rank == 0), 4),) * 3),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = None
        except (ValueError, TypeError) as exc:
            out[name] = (type(exc).__name__, str(exc))
    return out


def world_fn(rank: int, p: int) -> dict:
    out = {"ring": {dtype: ring_case(rank, p, dtype) for dtype in DTYPES}}
    out["cp"] = {(dtype, zigzag): train_cp(rank, p, STEPS, dtype, zigzag=zigzag)
                 for dtype, zigzag in CP_RUNS}
    out["moe"] = {case: check_expert_parallel(rank, p, *case, experts=EXPERTS)
                  for case in MOE_CASES}
    out["moe train"] = {(dtype, k, cf): train_moe(rank, p, STEPS, dtype, k, cf, EXPERTS)
                        for dtype, k, cf in MOE_RUNS}
    out["refusals"] = refusals(rank, p)
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(world_fn, request.param, backend="gloo", timeout_s=180)


@pytest.mark.parametrize("zigzag", [False, True], ids=["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ring_attention_equals_full_attention(world, dtype, causal, zigzag):
    _, results = world
    for rank, r in enumerate(results):
        errors = r["ring"][dtype][causal, zigzag]
        for name in ("o", "dq", "dk", "dv"):
            assert errors[name] <= TOL[dtype], f"rank {rank} {name}: {errors[name]}"
        # the comparison can fail: shards attended in the wrong layout are far off on every rank
        assert r["ring"][dtype]["layout bug"] > 1e-2


@contextlib.contextmanager
def one_thread():
    """The one-process references on one thread, as each rank runs: on this shared 2-core
    machine torch's default of one thread per core made the tiny reference runs tens of times
    slower (threads waiting on each other), not faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def cp_reference(dtype) -> dict:
    with one_thread():
        return train_cp(0, 1, STEPS, dtype)


@pytest.mark.parametrize("dtype, zigzag", CP_RUNS, ids=["float32-zigzag", "float64-contiguous"])
def test_train_cp_equals_one_process(world, dtype, zigzag):
    _, results = world
    ref, tol = cp_reference(dtype), TOL[dtype]
    for rank, r in enumerate(results):
        run = r["cp"][dtype, zigzag]
        torch.testing.assert_close(torch.tensor(run["loss"]), torch.tensor(ref["loss"]),
                                   atol=tol, rtol=tol)
        assert len(run["params"]) == len(ref["params"])
        for a, b in zip(run["params"], ref["params"]):
            assert a.dtype == dtype
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")
    # the parameters moved: ten steps that changed nothing would compare equal too
    start = [w.detach() for w in tiny_transformer(0, dtype).parameters()]
    assert max(max_diff(a, b) for a, b in zip(ref["params"], start)) > 1e-3


@pytest.mark.parametrize("dtype, k, capacity_factor", MOE_CASES,
                         ids=[f"{str(d)[6:]}-k{k}-cap{cf}" for d, k, cf in MOE_CASES])
def test_expert_parallel_moe_equals_one_process(world, dtype, k, capacity_factor):
    p, results = world
    tol = TOL[dtype]
    for rank, r in enumerate(results):
        case = r["moe"][dtype, k, capacity_factor]
        for name in ("y", "dx", "router", "experts", "aux"):
            assert case[name] <= tol, f"rank {rank} {name}: {case[name]}"
        assert case["local experts"] == EXPERTS // p
        got, want = case["dropped"]
        assert got == want
        assert (want > 0) == (capacity_factor is not None)   # a capacity of 0.5 must drop


@functools.lru_cache(maxsize=None)
def moe_reference(dtype, k, capacity_factor, groups) -> dict:
    with one_thread():
        return train_moe(0, 1, STEPS, dtype, k, capacity_factor, EXPERTS, groups=groups)


@pytest.mark.parametrize("dtype, k, capacity_factor", MOE_RUNS,
                         ids=[f"{str(d)[6:]}-k{k}-cap{cf}" for d, k, cf in MOE_RUNS])
def test_train_moe_equals_one_process(world, dtype, k, capacity_factor):
    p, results = world
    ref, tol = moe_reference(dtype, k, capacity_factor, p), TOL[dtype]
    seen = set()
    for rank, r in enumerate(results):
        run = r["moe train"][dtype, k, capacity_factor]
        torch.testing.assert_close(torch.tensor(run["loss"]), torch.tensor(ref["loss"]),
                                   atol=tol, rtol=tol)
        assert run["dropped"] == ref["dropped"]
        for name, w in run["params"].items():
            torch.testing.assert_close(w, ref["params"][name], atol=tol, rtol=0,
                                       msg=lambda m: f"rank {rank} {name}: {m}")
            seen.add(name)
    assert seen == set(ref["params"])            # every expert lives on some rank
    assert (sum(ref["dropped"]) > 0) == (capacity_factor is not None)
    # one group instead of p routes with other capacities and balances another loss
    if capacity_factor is not None:
        other = moe_reference(dtype, k, capacity_factor, 1)
        assert max(abs(a - b) for a, b in zip(other["loss"], ref["loss"])) > 1e-6


def test_bad_input_is_refused_on_every_rank(world):
    p, results = world
    for r in results:
        errors = r["refusals"]
        assert errors["experts"][0] == "ValueError"
        assert "multiple of the world" in errors["experts"][1]
        assert errors["zigzag shard"][0] == "ValueError"
        assert errors["zigzag seq"][0] == "ValueError" and "train_cp" in errors["zigzag seq"][1]
        assert errors["ranks disagree"][0] == "ValueError"
        assert "same shape" in errors["ranks disagree"][1]


def test_shard_and_unshard_are_inverse():
    x = torch.arange(24).view(1, 24, 1)
    for p in (1, 2, 3):
        for zigzag in (False, True):
            shards = [shard_sequence(x, r, p, zigzag, dim=1) for r in range(p)]
            assert torch.equal(unshard_sequence(shards, zigzag, dim=1), x)
    assert shard_sequence(torch.arange(8), 1, 2, zigzag=True, dim=0).tolist() == [2, 3, 4, 5]
    assert shard_sequence(torch.arange(8), 0, 2, zigzag=True, dim=0).tolist() == [0, 1, 6, 7]
    with pytest.raises(ValueError, match="zig-zag needs 2p = 8"):
        shard_sequence(torch.zeros(12), 0, 4, zigzag=True, dim=0)
    with pytest.raises(ValueError, match="contiguous needs p = 5"):
        shard_sequence(torch.zeros(12), 0, 5, dim=0)


def test_merge_of_two_halves_is_the_whole_softmax():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    o, lse = attention_with_lse(q, k, v)
    o1, lse1 = attention_with_lse(q, k[..., :2, :], v[..., :2, :])
    o2, lse2 = attention_with_lse(q, k[..., 2:, :], v[..., 2:, :])
    merged, merged_lse = merge_partials(o1, lse1, o2, lse2)
    torch.testing.assert_close(merged, o, atol=1e-14, rtol=0)
    torch.testing.assert_close(merged_lse, lse, atol=1e-14, rtol=0)
    assert max_diff(o1, o) > 1e-3                  # either half alone is not the answer


def test_zigzag_balances_the_causal_work():
    for p in (2, 4, 8):
        assert work_per_rank(p, zigzag=False) == list(range(1, p + 1))
        assert work_per_rank(p, zigzag=True) == [2 * p + 1] * p


def test_route_capacity_priority_and_balance_loss():
    # 4 tokens, 2 experts: every token prefers expert 0, second choice expert 1
    logits = torch.tensor([[2.0, 0.0], [3.0, 1.0], [1.0, 0.0], [5.0, 0.0]], dtype=torch.float64)
    assert expert_capacity(4, 2, 1, 1.0) == 2 and expert_capacity(4, 2, 2, None) == 4
    r = route(logits, 1, 1.0)                       # capacity 2: tokens 2 and 3 are dropped
    assert r.token.tolist() == [0, 1] and r.expert.tolist() == [0, 0] and r.dropped == 2
    assert r.counts.tolist() == [2, 0]
    probs = logits.softmax(-1)
    torch.testing.assert_close(r.gate, probs[:2, 0])
    torch.testing.assert_close(r.aux, 2 * probs[:, 0].mean())          # f = (1, 0)
    r2 = route(logits, 2, 1.0)                      # capacity 4: all 8 assignments fit
    assert r2.dropped == 0 and r2.counts.tolist() == [4, 4]
    torch.testing.assert_close(r2.gate.view(2, 4).sum(0), torch.ones(4, dtype=torch.float64))
    r3 = route(logits, 2, 0.5)                      # capacity 2: first choices of tokens 0, 1
    assert r3.token.tolist() == [0, 1, 0, 1] and r3.dropped == 4
    uniform = route(torch.zeros(8, 4), 1, None)
    assert abs(uniform.aux.item() - 1.0) < 1e-6     # P_e = 1/4 whatever f: E * sum f_e / 4


def test_moe_and_helpers_refuse_bad_arguments():
    with pytest.raises(ValueError, match="MoE: k=3"):
        MoE(4, 4, 2, k=3)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoE(4, 4, 2, capacity_factor=0)
    with pytest.raises(ValueError, match="equal"):
        MoE(4, 4, 2, groups=3)(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        MoE(4, 4, 2)(torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match="process group"):
        ExpertParallelMoE(MoE(4, 4, 2))
    with pytest.raises(RuntimeError, match="process group"):
        ring_attention(*(torch.zeros(1, 1, 4, 4),) * 3)
    with pytest.raises(ValueError, match="train_cp: seq_len=65"):
        train_cp(0, 1, 1, seq_len=65)
    assert a2a_bytes(1024, 4096, 2, 2, 8) == 2 * 7 * 2 * 1024 * 4096 * 2 // 8

"""Collectives from send/recv (snippets/part7/collectives.py), the launcher that runs them
(launch.py) and the alpha-beta cost model (cost.py).

Every collective is compared with torch.distributed's own on gloo (``dist.all_reduce``,
``dist.all_gather``, ``dist.reduce_scatter``), and where gloo needs equal chunks and ours do not, or
has no such collective (all-to-all, in older torch), with the result computed from every rank's input (each rank draws all ranks'
inputs from one seed). Integer-valued inputs must come out exact; random ones within a tolerance
that allows for a different order of the additions. Spawning a world costs a second or more per
process, so one world per size runs every check and returns the differences; the tests read them.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from snippets.part7 import cost
from snippets.part7.collectives import (
    all_to_all,
    check_collectives,
    recursive_halving_doubling_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    tree_all_reduce,
)
from snippets.part7.launch import device_for, run_world

SIZES = (1, 7, 1000, 4097)
ALL_REDUCES = {"ring": ring_all_reduce, "tree": tree_all_reduce,
               "halving_doubling": recursive_halving_doubling_all_reduce}
# random floats: a sum of p values in another order; relative to the largest partial sum
RTOL = {torch.float32: 1e-5, torch.float64: 1e-13}


def inputs(p: int, n: int, dtype, integer: bool) -> list[torch.Tensor]:
    """Every rank's input, the same on every rank (so each can compute the exact sum)."""
    g = torch.Generator().manual_seed(100 * p + n + integer)
    if integer:
        return [torch.randint(-50, 51, (n,), generator=g).to(dtype) for _ in range(p)]
    return [torch.randn(n, generator=g, dtype=torch.float64).to(dtype) for _ in range(p)]


def diff(ours: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest |expected| (1 when that is 0);
    infinite for a wrong shape or dtype."""
    if ours.shape != expected.shape or ours.dtype != expected.dtype:
        return math.inf
    if not ours.numel():
        return 0.0
    scale = max(1.0, float(expected.double().abs().max()))
    return float((ours.double() - expected.double()).abs().max()) / scale


def errors_of(fn, *args):
    """(exception type name, message) of ``fn(*args)``, or None if it returned."""
    try:
        fn(*args)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return None


def collectives_world(rank: int, p: int, full: bool) -> dict:
    """Every collective against torch's, for SIZES x (float32, float64) x (integer, random) inputs;
    with ``full`` False (the largest world) only the all-reduces. Then the errors."""
    out: dict = {}
    for n in SIZES:
        for dtype in (torch.float32, torch.float64):
            for integer in (True, False):
                xs = inputs(p, n, dtype, integer)
                x = xs[rank]
                key = (n, dtype, integer)
                reference = x.clone()
                dist.all_reduce(reference)
                for name, fn in ALL_REDUCES.items():
                    if name != "halving_doubling" or p & (p - 1) == 0:
                        y = fn(x)
                        out[("all_reduce", name, *key)] = diff(y, reference)
                        assert torch.equal(x, xs[rank]), "the input was modified"
                if not full:
                    continue
                # reduce-scatter: gloo's needs equal chunks; ours takes tensor_split's
                if n % p == 0:
                    expected = torch.empty(n // p, dtype=dtype)
                    dist.reduce_scatter(expected, list(x.chunk(p)))
                else:
                    expected = torch.stack(xs).double().sum(0).to(dtype).tensor_split(p)[rank]
                out[("reduce_scatter", *key)] = diff(ring_reduce_scatter(x), expected)
                # all-gather: equal chunks against gloo's, unequal ones (n + rank rows) by hand
                gathered = [torch.empty_like(x) for _ in range(p)]
                dist.all_gather(gathered, x)
                out[("all_gather", *key)] = diff(ring_all_gather(x), torch.cat(gathered))
                rows = [torch.cat([xs[r], xs[r][:r]]).view(-1, 1).repeat(1, 2) for r in range(p)]
                out[("all_gather uneven", *key)] = diff(ring_all_gather(rows[rank]),
                                                        torch.cat(rows))
                # all-to-all: n elements to every rank, then uneven blocks; by hand (rank i sends
                # xs[i] + j to rank j): gloo in torch 2.11 (the GPU image) has no all-to-all
                blocks = [xs[rank] + j for j in range(p)]
                expected = [xs[i] + rank for i in range(p)]
                got = all_to_all(blocks)
                out[("all_to_all", *key)] = max(diff(a, b) for a, b in zip(got, expected))
                sent = [xs[rank][: (rank + 2 * j) % 5].view(-1, 1) for j in range(p)]
                got = all_to_all(sent)
                out[("all_to_all uneven", *key)] = max(
                    diff(got[i], xs[i][: (i + 2 * rank) % 5].view(-1, 1)) for i in range(p))
    out["bfloat16"] = diff(ring_all_reduce(torch.full((33,), rank + 1.0, dtype=torch.bfloat16)),
                           torch.full((33,), p * (p + 1) / 2, dtype=torch.bfloat16))
    out["check_collectives"] = check_collectives(rank, p, 10)
    out["device"] = device_for(rank)
    if full:
        out["errors"] = bad_inputs(rank, p)
    return out


def bad_inputs(rank: int, p: int) -> dict:
    """Inputs that one rank gets wrong: every rank must raise, none may hang."""
    n = 10 + (rank == 1)                                   # rank 1 has one element more
    errs = {
        "halving_doubling": errors_of(recursive_halving_doubling_all_reduce, torch.ones(4)),
        "ring size": errors_of(ring_all_reduce, torch.ones(n)),
        "tree size": errors_of(tree_all_reduce, torch.ones(n)),
        "reduce_scatter size": errors_of(ring_reduce_scatter, torch.ones(n)),
        "all_gather dims": errors_of(ring_all_gather, torch.ones(2, n)),
        "dtype": errors_of(ring_all_reduce, torch.ones(4, dtype=torch.float64 if rank == 1
                                                       else torch.float32)),
        "int": errors_of(ring_all_reduce, torch.ones(4, dtype=torch.int32 if rank == 1
                                                     else torch.float32)),
        "not a tensor": errors_of(ring_all_reduce, [1.0] if rank == 1 else torch.ones(1)),
        "all_to_all count": errors_of(all_to_all, [torch.ones(2)] * (p + (rank == 1))),
    }
    # nothing was left half-sent: the group still works
    errs["after"] = float(ring_all_reduce(torch.ones(3)).sum())
    return errs


def raises_on_rank1(rank: int, p: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()            # rank 0 waits for a rank that will never come


def stalls(rank: int, p: int) -> None:
    time.sleep(600)


@functools.lru_cache(maxsize=None)
def world(p: int) -> list[dict]:
    """Every rank's results in a world of p ranks, computed once per size."""
    return run_world(collectives_world, p, p < 8, backend="gloo", timeout_s=120)


ALL_WORLDS = [2, 3, 4, 8]
SMALL_WORLDS = [2, 3, 4]       # every collective; the 8-rank world runs the all-reduces only


@pytest.mark.parametrize("p", ALL_WORLDS)
def test_every_all_reduce_equals_torchs(p):
    results = world(p)
    found = 0
    for out in results:
        for key, err in out.items():
            if key[0] != "all_reduce":
                continue
            found += 1
            _, name, n, dtype, integer = key
            tol = 0.0 if integer else RTOL[dtype]
            assert err <= tol, f"p={p}: {name} all-reduce of {n} {dtype} (integer={integer}): {err}"
    expected = len(SIZES) * 4 * (3 if p & (p - 1) == 0 else 2) * p
    assert found == expected


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "all_gather uneven",
                                "all_to_all", "all_to_all uneven"])
@pytest.mark.parametrize("p", SMALL_WORLDS)
def test_other_collectives_equal_torchs(p, op):
    results = world(p)
    for out in results:
        for n in SIZES:
            for dtype in (torch.float32, torch.float64):
                for integer in (True, False):
                    err = out[op, n, dtype, integer]
                    # moving data is exact; only a reduce-scatter of random floats rounds
                    tol = RTOL[dtype] if op == "reduce_scatter" and not integer else 0.0
                    assert err <= tol, f"p={p}: {op} of {n} {dtype} (integer={integer}): {err}"


@pytest.mark.parametrize("p", ALL_WORLDS)
def test_bfloat16_sums_and_the_self_check(p):
    results = world(p)
    for out in results:
        assert out["bfloat16"] == 0.0
        assert set(out["check_collectives"]) >= {"ring_all_reduce", "tree_all_reduce",
                                                  "ring_reduce_scatter", "ring_all_gather",
                                                  "all_to_all"}
        assert not any(out["check_collectives"].values()), out["check_collectives"]
        assert out["device"] == "cpu"


@pytest.mark.parametrize("p", SMALL_WORLDS)
def test_bad_input_on_one_rank_raises_on_every_rank(p):
    results = world(p)
    errs = [out["errors"] for out in results]
    power_of_two = p & (p - 1) == 0
    for e in errs:
        if power_of_two:
            assert e["halving_doubling"] is None
        else:
            assert e["halving_doubling"][0] == "ValueError"
            assert "power-of-two" in e["halving_doubling"][1]
        for case, shape in (("ring size", "(11,)"), ("tree size", "(11,)"),
                            ("reduce_scatter size", "(11,)"), ("all_gather dims", "(2, 11)")):
            kind, message = e[case]
            assert kind == "ValueError" and f"rank 1: {shape}" in message, (case, message)
        for case in ("dtype", "int", "not a tensor", "all_to_all count"):
            kind, message = e[case]
            assert kind == "TypeError" and "rank 1" in message, (case, message)
        assert e["after"] == 3 * p
    # the same message on every rank
    for case in errs[0]:
        assert all(e[case] == errs[0][case] for e in errs), case


def test_a_rank_that_raises_stops_the_world_and_is_named():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 raised ValueError: boom from rank 1"):
        run_world(raises_on_rank1, 2, backend="gloo", timeout_s=60)
    assert time.monotonic() - start < 30       # the waiting rank 0 was stopped, not waited for


def test_a_stalled_world_times_out():
    with pytest.raises(RuntimeError, match=r"did not finish within timeout_s=3"):
        run_world(stalls, 2, backend="gloo", timeout_s=3)


def test_run_world_refuses_what_cannot_spawn():
    with pytest.raises(TypeError, match="pickle"):
        run_world(lambda rank, p: rank, 2)
    with pytest.raises(ValueError, match="world_size"):
        run_world(stalls, 0)
    with pytest.raises(ValueError, match="backend"):
        run_world(stalls, 2, backend="mpi")


def test_the_module_runs_under_torchrun():
    """The command the chapter shows for GPUs, on 2 CPU processes: torchrun starts the ranks,
    init_from_env joins them, rank 0 prints the largest difference of every collective."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "snippets.part7.collectives"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "largest difference" in line]
    assert len(lines) == 7 and all(line.endswith("largest difference 0") for line in lines), \
        proc.stdout


# ---------------------------------------------------------------- the cost model

A, B = 5e-6, 1e11        # a nominal alpha (s) and beta (bytes/s) for the arithmetic below


def test_costs_by_hand():
    n = 8e6
    assert cost.send_time(n, A, B) == pytest.approx(5e-6 + 8e-5)
    assert cost.ring_all_reduce_time(n, 4, A, B) == pytest.approx(6 * A + 1.5 * n / B)
    assert cost.ring_reduce_scatter_time(n, 4, A, B) == pytest.approx(3 * A + 0.75 * n / B)
    assert cost.ring_all_gather_time(n, 4, A, B) == pytest.approx(3 * A + 0.75 * n / B)
    assert cost.ring_all_reduce_time(n, 8, A, B) == pytest.approx(
        cost.ring_reduce_scatter_time(n, 8, A, B) + cost.ring_all_gather_time(n, 8, A, B))
    assert [cost.tree_depth(p) for p in (1, 2, 3, 4, 7, 8, 9)] == [0, 1, 1, 2, 2, 3, 3]
    assert cost.tree_all_reduce_time(n, 8, A, B) == pytest.approx(6 * (A + n / B))
    assert cost.halving_doubling_all_reduce_time(n, 8, A, B) == pytest.approx(
        6 * A + 1.75 * n / B)
    assert cost.all_to_all_time(n, 4, A, B) == pytest.approx(3 * A + 0.75 * n / B)
    for f in (cost.ring_all_reduce_time, cost.tree_all_reduce_time,
              cost.halving_doubling_all_reduce_time, cost.all_to_all_time):
        assert f(n, 1, A, B) == 0.0                    # one rank talks to nobody
    with pytest.raises(ValueError, match="power of two"):
        cost.halving_doubling_all_reduce_time(n, 6, A, B)
    with pytest.raises(ValueError, match="beta"):
        cost.send_time(n, A, 0)
    with pytest.raises(ValueError, match="p "):
        cost.ring_all_reduce_time(n, 0, A, B)


def test_the_ring_wins_large_messages_and_the_tree_small_ones():
    p = 8
    cross = cost.crossover_bytes(p, A, B)
    assert cross == pytest.approx(A * B * 4 / (3 - 7 / 8))
    assert cost.tree_all_reduce_time(cross, p, A, B) == pytest.approx(
        cost.ring_all_reduce_time(cross, p, A, B))
    assert cost.tree_all_reduce_time(cross / 10, p, A, B) < cost.ring_all_reduce_time(
        cross / 10, p, A, B)
    assert cost.tree_all_reduce_time(cross * 10, p, A, B) > cost.ring_all_reduce_time(
        cross * 10, p, A, B)
    assert cost.crossover_bytes(2, A, B) == 0.0
    # halving-doubling: the tree's latency term and the ring's bandwidth term
    for n in (1e3, 1e6, 1e9):
        hd = cost.halving_doubling_all_reduce_time(n, p, A, B)
        assert hd <= min(cost.ring_all_reduce_time(n, p, A, B),
                         cost.tree_all_reduce_time(n, p, A, B)) * (1 + 1e-12)


def test_bus_bandwidth_follows_nccl():
    assert cost.bus_bandwidth(100.0, "all_reduce", 4) == pytest.approx(150.0)
    assert cost.bus_bandwidth(100.0, "all_gather", 8) == pytest.approx(87.5)
    assert cost.bus_bandwidth(100.0, "reduce_scatter", 2) == pytest.approx(50.0)
    assert cost.bus_bandwidth(100.0, "all_to_all", 4) == pytest.approx(75.0)
    assert cost.bus_bandwidth(100.0, "broadcast", 8) == 100.0
    # the bus bandwidth of a ring all-reduce that runs at the model's speed is the link's beta
    n, p = 1e9, 8
    algbw = cost.algorithm_bandwidth(n, cost.ring_all_reduce_time(n, p, 0.0, B))
    assert cost.bus_bandwidth(algbw, "all_reduce", p) == pytest.approx(B)
    with pytest.raises(ValueError, match="op must be"):
        cost.bus_bandwidth(1.0, "allreduce", 4)


def test_fit_recovers_alpha_and_beta():
    sizes = [2.0**k for k in range(0, 31, 2)]
    times = [cost.send_time(n, A, B) for n in sizes]
    alpha, beta, rel = cost.fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(A, rel=1e-9) and beta == pytest.approx(B, rel=1e-9)
    assert max(map(abs, rel)) < 1e-12
    # a point off the line shows in its relative error, and the fit is weighted by 1/t: the
    # latency survives a large message that is slow
    times[-1] *= 1.5
    fit = cost.fit_alpha_beta(sizes, times)
    assert fit.alpha_s == pytest.approx(A, rel=0.05)
    assert fit.rel_errors[-1] < -0.2
    assert fit.rel_errors == pytest.approx(
        [(fit.alpha_s + n / fit.beta_bytes_per_s - t) / t for n, t in zip(sizes, times)])
    # noise in the small messages can put the free line under the origin (here exactly on
    # t = -10 us + n / 51.2 MB/s): the latency is then 0, not negative, and beta the best with alpha = 0
    sizes, times = [1024, 2048, 4096, 8192], [1e-5, 3e-5, 7e-5, 1.5e-4]
    free = np.linalg.lstsq(np.stack([np.ones(4), sizes], 1) / np.array(times)[:, None], np.ones(4),
                           rcond=None)[0]
    assert free[0] < 0  # the unconstrained fit would report a negative latency
    fit = cost.fit_alpha_beta(sizes, times)
    x = np.array(sizes) / np.array(times)
    assert fit.alpha_s == 0.0 and fit.beta_bytes_per_s == pytest.approx(np.sum(x * x) / np.sum(x))
    # and it is the best such line: a slightly different beta has a larger squared relative error
    sq = lambda b: sum(((n / b - t) / t) ** 2 for n, t in zip(sizes, times))  # noqa: E731
    assert sq(fit.beta_bytes_per_s) < min(sq(fit.beta_bytes_per_s * 1.01), sq(fit.beta_bytes_per_s * 0.99))
    with pytest.raises(ValueError, match="two different sizes"):
        cost.fit_alpha_beta([8, 8], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="do not grow"):
        cost.fit_alpha_beta([1, 1e6], [2e-6, 1e-6])
    with pytest.raises(ValueError, match="times"):
        cost.fit_alpha_beta([1, 2], [1e-6, 0])


def test_piecewise_fit_finds_the_ranges_of_a_sweep():
    # a flat floor to 64 KiB (latency only), then a line of its own: no single line fits both
    sizes = [2.0**k for k in range(10, 31)]
    times = [20e-6 if n <= 2**16 else 5e-6 + n / 3e11 for n in sizes]
    one = cost.fit_piecewise(sizes, times, max_pieces=1)
    assert max(map(abs, one.rel_errors)) > 0.15
    fit = cost.fit_piecewise(sizes, times, max_pieces=3)
    assert max(map(abs, fit.rel_errors)) < 1e-9          # two exact ranges: nothing left over
    assert [(p.lo_bytes, p.hi_bytes) for p in fit.pieces] == [(2.0**10, 2.0**16),
                                                              (2.0**17, 2.0**30)]
    flat, line = fit.pieces
    assert flat.beta_bytes_per_s is None and flat.alpha_s == pytest.approx(20e-6)
    assert line.alpha_s == pytest.approx(5e-6) and line.beta_bytes_per_s == pytest.approx(3e11)
    for n, t in zip(sizes, times, strict=True):
        assert cost.predict_piecewise(fit, n) == pytest.approx(t)
    # one piece is the relative-error line of fit_alpha_beta, where its alpha is >= 0
    times2 = [cost.send_time(n, A, B) * (1.1 if i % 3 == 0 else 1.0) for i, n in enumerate(sizes)]
    single, pw = cost.fit_alpha_beta(sizes, times2), cost.fit_piecewise(sizes, times2, 1)
    assert pw.pieces[0].alpha_s == pytest.approx(single.alpha_s)
    assert pw.pieces[0].beta_bytes_per_s == pytest.approx(single.beta_bytes_per_s)
    assert pw.rel_errors == pytest.approx(single.rel_errors)
    # the errors come back in the caller's order, whatever the order of the sizes
    shuffled = cost.fit_piecewise(sizes[::-1], times[::-1], max_pieces=3)
    assert shuffled.rel_errors == pytest.approx(fit.rel_errors[::-1], abs=1e-12)
    # every range has min_points sizes: with 7 points and min_points 3 at most 2 ranges exist
    assert len(cost.fit_piecewise(sizes[:7], times[:7], max_pieces=3, min_points=3).pieces) <= 2
    assert sum(1 for _ in cost._cuts(21, 3, 3)) == math.comb(21 - 3 * 3 + 2, 2)
    for bad, match in ((dict(sizes=[1, 2], times=[1e-6, 2e-6]), "at least 3"),
                       (dict(sizes=[1, 1, 2], times=[1e-6] * 3), "once"),
                       (dict(sizes=[1, 2, 3], times=[1e-6, 0, 1e-6]), "times"),
                       (dict(sizes=[1, 2, 3], times=[1e-6] * 3, max_pieces=0), "max_pieces")):
        with pytest.raises(ValueError, match=match):
            cost.fit_piecewise(**bad)

"""Pipeline parallelism from scratch (snippets/part7/pipeline.py).

- GPipe and 1F1B on 2, 3 and 4 gloo ranks (the tiny transformer with 4 blocks cut into that many
  stages) train exactly as one process does on the whole batch over 10 steps, in float32 and
  float64; so does torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B on the same stages.
- The schedules, as data: every micro-batch forwarded and backwarded once per stage, the
  dependencies respected, 1F1B's peak of activations in flight min(p - s, m) against GPipe's m;
  the executor's measured peak is the schedule's.
- The simulator's bubble is (p - 1) / (m + p - 1) exactly for equal action times; the bubble
  measured on the ranks, with a sleep per action standing in for compute, is within a tolerance of
  it.
- Bad input raises ValueError before any work; ranks that disagree on the activation shape all
  raise, none hangs.
- The timing mode of ``main`` under torchrun (2 gloo ranks, a sleep per action, no comparison)
  writes the record ``snippets.bench.distributed`` files, its median bubble within the same band
  of the formula; ``record`` files it and ``list`` shows it.

One world per size runs every scenario.
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from snippets.bench import distributed as dr
from snippets.part7.launch import run_world
from snippets.part7.models import tiny_batch, tiny_transformer
from snippets.part7.pipeline import (
    bubble_formula,
    check_schedule,
    gpipe_schedule,
    one_f_one_b_schedule,
    peak_in_flight,
    run_schedule,
    simulate,
    split_stages,
    timeline_mermaid,
    train_pp,
    train_torch_pp,
)

STEPS = 10
BLOCKS = 4
MICRO_BATCHES = 4
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
SCHEDULE_NAMES = ("gpipe", "1f1b")
# the bubble measured with a sleep per action: long enough that the tiny stages' compute and gloo's
# latency are small beside it, short enough that (m + p - 1) * 2 sleeps per step stay quick
DELAY_S = 0.025
BUBBLE_STEPS = 3
BUBBLE_RUNS = (("gpipe", 4), ("1f1b", 8))
# measured minus formula: the compute and the messages add to the critical path, and on a loaded
# machine a rank wakes late from a sleep or a receive; all of it lengthens the step, so the
# measured bubble exceeds the formula, the more so the busier the machine (the tolerance is set
# for a shared 2-core machine running other jobs). A plausible bug, stages that run one after the
# other, gives (p - 1) / p, at least 0.3 above the formula for these p and m.
BUBBLE_TOL = 0.12
REPO_ROOT = Path(__file__).resolve().parent.parent


def pp_world(rank: int, world: int) -> dict:
    out = {}
    for name in SCHEDULE_NAMES:
        for dtype in DTYPES:
            out["ours", name, dtype] = train_pp(rank, world, STEPS, dtype, name, MICRO_BATCHES,
                                                blocks=BLOCKS)
            out["torch", name, dtype] = train_torch_pp(rank, world, STEPS, dtype, name,
                                                       MICRO_BATCHES, blocks=BLOCKS)
    for name, m in BUBBLE_RUNS:
        out["bubble", name, m] = train_pp(rank, world, BUBBLE_STEPS, torch.float32, name, m,
                                          blocks=BLOCKS, global_batch=m, delay_s=DELAY_S)
    # rank 0 sends sequences of 8 tokens, the others expect 16: every rank must raise
    stage = split_stages(tiny_transformer(0, blocks=BLOCKS), world)[rank]
    tokens, targets = tiny_batch(0, 4, 8 if rank == 0 else 16)
    try:
        run_schedule(stage, gpipe_schedule(world, 2)[rank], tokens, targets, 2)
    except ValueError as exc:
        out["mismatch"] = str(exc)
    # rank 1 forgets to backward micro-batch 1: every rank must raise, naming rank 1
    actions = gpipe_schedule(world, 2)[rank][:3 if rank == 1 else 4]
    try:
        run_schedule(stage, actions, *tiny_batch(0, 4, 8), 2)
    except ValueError as exc:
        out["bad schedule"] = str(exc)
    # the stages in reverse: the first rank holds the head
    wrong = split_stages(tiny_transformer(0, blocks=BLOCKS), world)[world - 1 - rank]
    try:
        run_schedule(wrong, gpipe_schedule(world, 2)[rank], *tiny_batch(0, 4, 8), 2)
    except ValueError as exc:
        out["wrong stage"] = str(exc)
    return out


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(pp_world, request.param, backend="gloo", timeout_s=240)


@functools.lru_cache(maxsize=None)
def reference(dtype) -> dict:
    return train_pp(0, 1, STEPS, dtype, blocks=BLOCKS)


def assert_equal_to_one_process(runs: list[dict], dtype) -> None:
    ref, tol = reference(dtype), TOL[dtype]
    for rank, run in enumerate(runs):
        torch.testing.assert_close(torch.tensor(run["loss"], dtype=torch.float64),
                                   torch.tensor(ref["loss"], dtype=torch.float64),
                                   atol=tol, rtol=tol, msg=lambda m: f"rank {rank}: {m}")
        assert len(run["params"]) == len(ref["params"])
        for a, b in zip(run["params"], ref["params"]):
            assert a.dtype == dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_pipeline_equals_one_process(world, name, dtype):
    _, results = world
    assert_equal_to_one_process([r["ours", name, dtype] for r in results], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_torch_pipelining_equals_one_process(world, name, dtype):
    """torch.distributed.pipelining runs on gloo in this torch: its schedules on the same stages
    give the same training as one process, hence as ours."""
    _, results = world
    assert_equal_to_one_process([r["torch", name, dtype] for r in results], dtype)


def test_the_test_can_fail():
    """Training on one micro-batch only (the gradient of the first quarter of the batch) lands far
    from the reference."""
    quarter = train_pp(0, 1, STEPS, torch.float64, micro_batches=1, blocks=BLOCKS,
                       global_batch=2)
    ref = reference(torch.float64)
    assert max((a - b).abs().max().item() for a, b in zip(quarter["params"], ref["params"])) > 1e-6


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_measured_peak_in_flight_is_the_schedules(world, name):
    p, results = world
    for rank, r in enumerate(results):
        expected = MICRO_BATCHES if name == "gpipe" else min(p - rank, MICRO_BATCHES)
        assert r["ours", name, torch.float64]["peak"] == expected


@pytest.mark.parametrize(("name", "m"), BUBBLE_RUNS)
def test_measured_bubble_is_the_formulas(world, name, m):
    p, results = world
    bubbles = results[0]["bubble", name, m]["bubble"]
    assert all(r["bubble", name, m]["bubble"] == bubbles for r in results)   # one value per step
    formula = float(bubble_formula(p, m))
    measured = statistics.median(bubbles)
    assert formula - 0.03 < measured < formula + BUBBLE_TOL, (bubbles, formula)
    assert measured < (p - 1) / p - 0.1                 # far from the stages run one by one


def test_ranks_that_disagree_or_err_all_raise(world):
    p, results = world
    for r in results:
        assert "every stage must agree" in r["mismatch"]
        assert "rank 0: (2, 8, 32, 2)" in r["mismatch"]
        assert "rank 1: (2, 16, 32, 2)" in r["mismatch"]
        assert "rank 1: check_schedule: its actions must run" in r["bad schedule"]
        assert "rank 0" not in r["bad schedule"]
        assert f"rank {p - 1}: its stage is not stage {p - 1} of {p}" in r["wrong stage"]


# ---------------------------------------------------------------- the schedules, without processes

SIZES = [(p, m) for p in range(1, 7) for m in range(1, 10)]


def forward_dependencies_hold(timeline, p, m) -> bool:
    at = {(k, s, i): (start, end) for s, stage in enumerate(timeline.spans)
          for k, i, start, end in stage}
    return (all(at["F", s, i][0] >= at["F", s - 1, i][1] for s in range(1, p) for i in range(m))
            and all(at["B", s, i][0] >= at["B", s + 1, i][1]
                    for s in range(p - 1) for i in range(m))
            and all(at["B", p - 1, i][0] >= at["F", p - 1, i][1] for i in range(m)))


@pytest.mark.parametrize("make", [gpipe_schedule, one_f_one_b_schedule])
def test_every_micro_batch_once_per_stage_dependencies_respected(make):
    for p, m in SIZES:
        schedule = make(p, m)
        assert len(schedule) == p
        check_schedule(schedule, m)
        for actions in schedule:
            assert sorted(actions) == sorted((k, i) for k in "FB" for i in range(m))
            # forwards and backwards each in micro-batch order (the messages arrive in that order)
            assert [i for k, i in actions if k == "F"] == list(range(m))
            assert [i for k, i in actions if k == "B"] == list(range(m))
        timeline = simulate(schedule, 3, 5)
        assert forward_dependencies_hold(timeline, p, m)


def test_peak_in_flight_1f1b_against_gpipe():
    for p, m in SIZES:
        assert [peak_in_flight(a) for a in gpipe_schedule(p, m)] == [m] * p
        assert [peak_in_flight(a) for a in one_f_one_b_schedule(p, m)] == [
            min(p - s, m) for s in range(p)]


def test_1f1b_steady_state_alternates():
    actions = one_f_one_b_schedule(4, 8)[1]           # warm-up of 2 forwards, then F, B, F, B ...
    assert actions[:2] == [("F", 0), ("F", 1)]
    assert actions[2:14] == [x for i in range(6) for x in (("F", i + 2), ("B", i))]
    assert actions[14:] == [("B", 6), ("B", 7)]


@pytest.mark.parametrize("make", [gpipe_schedule, one_f_one_b_schedule])
def test_simulated_bubble_is_the_formula_exactly(make):
    for p, m in SIZES:
        for f, b in ((1, 1), (1, 2), (Fraction(3, 7), Fraction(5, 3))):
            timeline = simulate(make(p, m), f, b)
            assert timeline.makespan == (m + p - 1) * (f + b)
            assert timeline.bubble == bubble_formula(p, m) == Fraction(p - 1, m + p - 1)


def test_unequal_times_and_messages_make_a_larger_bubble():
    """A slow last stage (the head and the loss), or a message time, and the formula no longer
    holds: the bubble grows."""
    p, m = 4, 8
    slow_last = simulate(one_f_one_b_schedule(p, m), lambda s, i: 2 if s == p - 1 else 1, 2)
    assert slow_last.bubble > bubble_formula(p, m)
    with_comm = simulate(gpipe_schedule(p, m), 1, 2, comm=Fraction(1, 4))
    assert with_comm.makespan == (m + p - 1) * 3 + 2 * (p - 1) * Fraction(1, 4)
    assert with_comm.bubble > bubble_formula(p, m)


def test_check_schedule_and_simulate_reject_bad_schedules():
    with pytest.raises(ValueError, match="before forwarding"):
        check_schedule([[("B", 0), ("F", 0)]], 1)
    with pytest.raises(ValueError, match="once for every"):
        check_schedule([[("F", 0), ("B", 0), ("F", 0)]], 1)
    with pytest.raises(ValueError, match="once for every"):
        check_schedule([[("F", 0), ("B", 0)]], 2)
    # stage 1 backwards micro-batch 1 first; stage 0 forwards 1 only after backwarding 0
    deadlock = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    check_schedule(deadlock, 2)
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(deadlock)


def test_the_chapters_diagrams_are_the_simulators():
    """The Mermaid charts in the chapter are timeline_mermaid's output, not drawn by hand."""
    page = (REPO_ROOT / "docs/part7/pipeline-parallel.md").read_text()
    charts = re.findall(r"```mermaid\n(.*?)\n```", page, re.DOTALL)
    assert charts == [timeline_mermaid(simulate(gpipe_schedule(4, 1), 1, 2)),
                      timeline_mermaid(simulate(gpipe_schedule(4, 8), 1, 2)),
                      timeline_mermaid(simulate(one_f_one_b_schedule(4, 8), 1, 2))]


def test_stages_hold_the_models_parameters_in_order():
    model = tiny_transformer(0, blocks=5)
    for p in range(1, 6):
        stages = split_stages(model, p)
        assert [len(s.blocks) for s in stages] == [5 // p + (s < 5 % p) for s in range(p)]
        params = [q for s in stages for q in s.parameters()]
        assert len(params) == len(list(model.parameters()))
        assert all(a is b for a, b in zip(params, model.parameters()))
    tokens, _ = tiny_batch(0, 2, 8)
    x = tokens
    for s in split_stages(model, 3):
        x = s(x)
    torch.testing.assert_close(x, model(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("call", [
    lambda: gpipe_schedule(2, 0),
    lambda: one_f_one_b_schedule(2, 0),
    lambda: one_f_one_b_schedule(0, 4),
    lambda: gpipe_schedule(2.0, 4),
    lambda: bubble_formula(3, 0),
    lambda: split_stages(tiny_transformer(0, blocks=4), 5),
    lambda: split_stages(tiny_transformer(0, blocks=4), 0),
    lambda: train_pp(0, 1, micro_batches=0),
    lambda: train_pp(0, 1, micro_batches=3),                # 8 sequences in 3 micro-batches
    lambda: train_pp(0, 1, schedule="zero-bubble"),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


# ---------------------------------------------------------------- the timing mode, as GPUs run it

TIMING_FIELDS = {"schedule", "p", "m", "dim", "blocks", "seq_len", "micro_batch_size", "dtype",
                 "steps", "bubble_median", "bubble_all", "formula", "seconds_per_step_median"}


@pytest.fixture(scope="module")
def timing_run(tmp_path_factory):
    """``scripts/part7_gpus.sh``'s pipeline_timing step at a tiny size on 2 CPU processes: the
    sleep per action stands in for the compute of a large model."""
    out = tmp_path_factory.mktemp("pipeline_timing")
    # a CPU run (gloo) on any machine: with GPUs visible the command line would take NCCL
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "snippets.part7.pipeline", "--micro-batches", "4", "--steps", str(BUBBLE_STEPS + 1),
         "--dim", "32", "--blocks", "2", "--seq-len", "8", "--micro-batch-size", "2",
         "--dtype", "float32", "--delay-ms", str(DELAY_S * 1000), "--no-check",
         "--out", str(out / "pipeline.json")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "pipeline.json").read_text()), proc.stdout


def test_timing_mode_writes_its_records(timing_run):
    _, data, stdout = timing_run
    assert [r["schedule"] for r in data["records"]] == list(SCHEDULE_NAMES)
    assert data["provenance"]["backend"] == "gloo" and data["provenance"]["world_size"] == 2
    assert data["provenance"]["gpu"] is None                  # a CPU run says so
    for r in data["records"]:
        assert TIMING_FIELDS <= set(r)
        assert (r["p"], r["m"], r["dim"], r["blocks"], r["seq_len"], r["micro_batch_size"],
                r["dtype"], r["steps"]) == (2, 4, 32, 2, 8, 2, "float32", BUBBLE_STEPS + 1)
        assert r["formula"] == float(bubble_formula(2, 4))
        assert len(r["bubble_all"]) == r["steps"]
        # the first step is a warm-up, left out of the median
        assert r["bubble_median"] == statistics.median(r["bubble_all"][1:])
        assert formula_band(r["bubble_median"], r["formula"]), r
        # (m + p - 1) forwards and backwards of DELAY_S each, at least, per step
        assert r["seconds_per_step_median"] >= (4 + 2 - 1) * 2 * DELAY_S
        assert f"{r['schedule']:6s} p=2 m=4: measured bubble {r['bubble_median']:.3f}" in stdout
    assert "largest parameter difference" not in stdout       # --no-check


def formula_band(measured: float, formula: float) -> bool:
    return formula - 0.03 < measured < formula + BUBBLE_TOL


def test_timing_mode_is_filed_and_listed(timing_run, tmp_path, capsys):
    """``record`` refuses the CPU run as a result; with a GPU's provenance in its place (what the
    GPU machine writes) it files it, fresh, and ``list`` prints each schedule's bubble."""
    out, data, _ = timing_run
    dest = tmp_path / "distributed"
    with pytest.raises(ValueError, match="CPU dry run"):
        dr.record(out, "abc1234", REPO_ROOT, dest)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    prov = {**data["provenance"], "backend": "nccl", "gpu": "NVIDIA H200", "nccl": "2.28.9"}
    (gpu / "pipeline.json").write_text(json.dumps({**data, "provenance": prov}))
    path = dr.record(gpu, "abc1234", REPO_ROOT, dest)
    entry = json.loads(path.read_text())["runs"]["pipeline"]
    assert entry["module"] == "snippets.part7.pipeline" and dr.fresh("pipeline", entry)
    assert entry["records"] == data["records"]
    assert dr.main(["list", "--dest", str(dest)]) == 0
    listed = capsys.readouterr().out
    assert "NVIDIA H200 x2 pipeline: fresh (commit abc1234" in listed
    for r in data["records"]:
        assert f"{r['schedule']} p=2 m=4 {r['bubble_median']:.3f} ({r['formula']:.3f})" in listed


def test_default_mode_is_unchanged():
    """Without the new flags the module builds the model it always built, and checks against the
    one-process run on the batch it always used."""
    from snippets.part7 import pipeline as pp

    ref = pp._reference(2, 4, 4)
    model = tiny_transformer(0, torch.float64, blocks=4)
    assert [q.shape for q in model.parameters()] == [q.shape for q in ref]
    run = train_pp(0, 1, 2, torch.float64, micro_batches=4, blocks=4, global_batch=16)
    for a, b in zip(run["params"], ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)

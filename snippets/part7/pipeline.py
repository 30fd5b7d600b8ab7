"""Pipeline parallelism from scratch: the layers of the tiny transformer split into p stages, one
per rank, micro-batches passed from stage to stage, and the GPipe and 1F1B schedules.

- ``split_stages`` cuts ``tiny_transformer`` into p ``StageModule``: stage 0 holds the embeddings
  and its share of the blocks, the last stage its share, the final norm and the head (and computes
  the loss).
- A *schedule* is data: for every stage, the ordered list of its actions, ``("F", i)`` (forward
  micro-batch i) and ``("B", i)`` (backward micro-batch i). ``gpipe_schedule`` (Huang et al.,
  "GPipe", 2019: every forward, then every backward) and ``one_f_one_b_schedule`` (Narayanan et
  al., "PipeDream", 2019, and Megatron-LM's non-interleaved schedule: after a warm-up, one forward
  and one backward in turn) build them; ``check_schedule`` checks one.
- ``simulate`` runs a schedule on paper with given action times: each stage's timeline, the
  makespan and the *bubble*, the fraction of stage-time spent idle.
- ``run_schedule`` runs one stage's actions of one step on a process group: activations go to the
  next stage and their gradients back with ``isend``/``irecv``; every action is timed, so the
  bubble is measured as well as computed. ``train_pp`` trains with it.
- ``train_torch_pp`` trains the same stages with ``torch.distributed.pipelining``.

Under ``torchrun`` (``torchrun --nproc-per-node 4 -m snippets.part7.pipeline``) the module trains
with both schedules on the GPUs, checks the result against one process and prints the measured
bubble next to (p - 1) / (m + p - 1). Its timing mode (``--dim``, ``--blocks``, ``--seq-len``,
``--micro-batch-size``, ``--dtype``, ``--no-check``, ``--out FILE``) times a model large enough
that each stage's compute dominates, and rank 0 writes the bubble of each schedule (the median
over the steps after the first, a warm-up) with the run's provenance to FILE, for
``snippets.bench.distributed record``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.distributed as dist
from torch import nn

from snippets.part7.collectives import agree
from snippets.part7.launch import device_for, init_from_env
from snippets.part7.models import DIM, TinyTransformer, lm_loss, tiny_batch, tiny_transformer
from snippets.part7.sweep import provenance

Action = tuple[str, int]                # ("F", micro-batch) or ("B", micro-batch)
Schedule = list[list[Action]]           # one ordered list of actions per stage


def _positive_int(name: str, what: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {what} must be an int >= 1, got {value!r}")
    return value


# --8<-- [start:split]
class StageModule(nn.Module):
    """One stage of a ``TinyTransformer``: blocks ``[lo, hi)``; the first stage also the token and
    position embeddings (its input is token ids), the last the final norm and the head (its output
    is logits). The submodules are the model's own, so the stages of one model share its weights,
    and ``parameters()`` lists them in the model's order."""

    def __init__(self, model: TinyTransformer, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.dim = model.embed.embedding_dim
        self.embed = model.embed if first else None
        self.pos = model.pos if first else None
        self.blocks = nn.Sequential(*model.blocks[lo:hi])
        self.norm = model.norm if last else None
        self.head = model.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:                      # x: token ids (batch, seq)
            if x.shape[-1] > self.pos.num_embeddings:
                raise ValueError(f"StageModule: sequence of {x.shape[-1]} tokens is longer than "
                                 f"max_seq={self.pos.num_embeddings}")
            x = self.embed(x) + self.pos(torch.arange(x.shape[-1], device=x.device))
        x = self.blocks(x)                              # (batch, seq, dim)
        if self.head is not None:
            x = self.head(self.norm(x))                 # (batch, seq, vocab)
        return x


def split_stages(model: TinyTransformer, p: int) -> list[StageModule]:
    """Cut ``model`` into ``p`` stages of consecutive blocks, as equal as they can be (the first
    ``len(blocks) % p`` stages take one block more). Every stage needs at least one block."""
    if not isinstance(model, TinyTransformer):
        raise TypeError("split_stages: model must be a TinyTransformer, got "
                        f"{type(model).__name__}")
    p = _positive_int("split_stages", "the number of stages p", p)
    n = len(model.blocks)
    if p > n:
        raise ValueError(f"split_stages: p={p} stages for {n} blocks: every stage needs a block")
    sizes = [n // p + (s < n % p) for s in range(p)]
    bounds = [sum(sizes[:s]) for s in range(p + 1)]
    return [StageModule(model, bounds[s], bounds[s + 1], s == 0, s == p - 1) for s in range(p)]
# --8<-- [end:split]


# --8<-- [start:schedules]
def gpipe_schedule(p: int, m: int) -> Schedule:
    """GPipe: every stage forwards the m micro-batches, then backwards them, in order. A stage
    holds the activations of all m micro-batches when the first backward starts."""
    p = _positive_int("gpipe_schedule", "the number of stages p", p)
    m = _positive_int("gpipe_schedule", "the number of micro-batches m", m)
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b_schedule(p: int, m: int) -> Schedule:
    """1F1B: stage s first forwards w = min(p - s - 1, m) micro-batches (the warm-up: what is in
    flight below it when its first backward can arrive), then alternates one forward and one
    backward, then backwards what is left. It never holds more than min(p - s, m) micro-batches'
    activations."""
    p = _positive_int("one_f_one_b_schedule", "the number of stages p", p)
    m = _positive_int("one_f_one_b_schedule", "the number of micro-batches m", m)
    schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions: list[Action] = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):                     # steady state: F(i + w), then B(i)
            actions += [("F", i + warmup), ("B", i)]
        actions += [("B", i) for i in range(m - warmup, m)]   # cool-down
        schedule.append(actions)
    return schedule
# --8<-- [end:schedules]


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {
    "gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def check_schedule(schedule: Schedule, m: int) -> None:
    """Raise ValueError unless every stage forwards and backwards each of the ``m`` micro-batches
    exactly once, each forward before its backward. (Whether the stages can run it without waiting
    for each other forever is ``simulate``'s question.)"""
    m = _positive_int("check_schedule", "the number of micro-batches m", m)
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError(f"check_schedule: a schedule is a non-empty list of stages, got "
                         f"{type(schedule).__name__}")
    expected = sorted((k, i) for k in "BF" for i in range(m))
    for s, actions in enumerate(schedule):
        if sorted(map(tuple, actions)) != expected:
            raise ValueError(f"check_schedule: stage {s} must run ('F', i) and ('B', i) once for "
                             f"every i < {m}, got {list(actions)}")
        done = set()
        for kind, i in actions:
            if kind == "B" and i not in done:
                raise ValueError(f"check_schedule: stage {s} backwards micro-batch {i} before "
                                 "forwarding it")
            done.add(i)


def peak_in_flight(actions: Sequence[Action]) -> int:
    """The most micro-batches whose activations one stage holds at once: forwarded, not yet
    backwarded."""
    held = peak = 0
    for kind, _ in actions:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


# --8<-- [start:simulate]
@dataclass
class Timeline:
    """What a schedule does in time: ``spans[s]`` lists stage s's actions as (kind, micro-batch,
    start, end), in the order it ran them; ``makespan`` is the end of the last one."""
    spans: list[list[tuple[str, int, float, float]]]

    @property
    def makespan(self):
        return max(end for stage in self.spans for *_, end in stage)

    @property
    def bubble(self):
        """The idle fraction of the p stages over the makespan: 1 - busy / (p * makespan), a
        Fraction when the times are ints or Fractions."""
        total = len(self.spans) * self.makespan
        busy = sum(end - start for stage in self.spans for *_, start, end in stage)
        if isinstance(total, int) and isinstance(busy, int):
            return Fraction(total - busy, total)        # exact for integer times
        return (total - busy) / total


def simulate(schedule: Schedule, f_time=1, b_time=1, comm=0) -> Timeline:
    """Run ``schedule`` on paper. Each stage runs its actions in order; an action starts when the
    stage is free and its input has arrived: F(s, i) needs F(s - 1, i), B(s, i) needs B(s + 1, i)
    (and, on the last stage, F(s, i)), each message taking ``comm``. ``f_time`` and ``b_time`` are
    numbers, or functions of (stage, micro-batch). Exact with ints or Fractions.
    Raises ValueError if the stages would wait for each other forever."""
    p = len(schedule)
    m = len(schedule[0]) // 2 if schedule else 0
    check_schedule(schedule, max(m, 1))
    ft = f_time if callable(f_time) else (lambda s, i: f_time)
    bt = b_time if callable(b_time) else (lambda s, i: b_time)
    done: dict[tuple[str, int, int], object] = {}      # (kind, stage, mb) -> end time
    spans: list[list] = [[] for _ in range(p)]
    nxt, free = [0] * p, [0] * p
    while any(nxt[s] < len(schedule[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(schedule[s]):
                kind, i = schedule[s][nxt[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break                               # wait for the neighbour
                ready = free[s] if dep is None else max(free[s], done[dep] + comm * (dep[1] != s))
                end = ready + (ft(s, i) if kind == "F" else bt(s, i))
                spans[s].append((kind, i, ready, end))
                done[kind, s, i] = free[s] = end
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = {s: schedule[s][nxt[s]] for s in range(p) if nxt[s] < len(schedule[s])}
            raise ValueError(f"simulate: the schedule deadlocks: stages wait on {stuck}")
    return Timeline(spans)


def bubble_formula(p: int, m: int) -> Fraction:
    """GPipe's (and 1F1B's) bubble with equal action times: (p - 1) / (m + p - 1)."""
    p = _positive_int("bubble_formula", "the number of stages p", p)
    m = _positive_int("bubble_formula", "the number of micro-batches m", m)
    return Fraction(p - 1, m + p - 1)
# --8<-- [end:simulate]


def timeline_mermaid(timeline: Timeline, title: str = "") -> str:
    """A Mermaid gantt chart of ``timeline``: one row per stage, one bar per action, backwards in
    red. Mermaid's gantt charts take dates: a time t is written as t seconds after the Unix epoch,
    in milliseconds (``dateFormat x``), and the axis prints seconds since the epoch (``%s``), t."""
    lines = ["---", "displayMode: compact", "---", "gantt",
             *([f"    title {title}"] if title else []), "    dateFormat x", "    axisFormat %s"]
    for s, stage in enumerate(timeline.spans):
        lines.append(f"    section stage {s}")
        for kind, i, start, end in stage:
            tag = "crit, " if kind == "B" else ""
            lines.append(f"    {kind}{i} :{tag}{round(start * 1000)}, {round(end * 1000)}")
    return "\n".join(lines)


# --8<-- [start:exchange]
def _exchange(sends: list, recv, lanes) -> list:
    """Post the pending sends [(tensor, group rank, lane)] one by one, then the receive (tensor,
    group rank, lane) or None, and wait for the receive (the stage needs its input); return the
    sends' handles, to wait for at the end of the step. ``lanes`` holds two process groups over the
    same ranks: activations travel in lane 0, gradients in lane 1. NCCL carries out the messages of
    one communicator between two ranks in the order they are posted, on one stream: with a single
    lane, stage s sending an activation up while stage s + 1 sends a gradient down, each then
    receiving, could wait on each other forever. In two lanes each direction has its own
    communicator and stream, and within a lane both sides post their messages in the same order
    (activations by forward order, gradients by backward order), one message per call."""
    works = [dist.isend(t, group=lanes[lane], group_dst=peer) for t, peer, lane in sends]
    if recv is not None:
        tensor, peer, lane = recv
        dist.irecv(tensor, group=lanes[lane], group_src=peer).wait()
    return works


def pipeline_lanes(group=None) -> tuple:
    """The two process groups (activations, gradients) that ``run_schedule`` sends over, on the
    ranks of ``group``; a collective call: every rank of the world must make it."""
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    return dist.new_group(ranks), dist.new_group(ranks)
# --8<-- [end:exchange]
# --8<-- [end:exchange]


def _clock(device) -> float:
    """Host time in seconds, after everything queued on ``device`` has run when it is a GPU
    (``torch.cuda.synchronize``): a span between two clocks is the GPU's work, not the launch's."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _agree_on_shapes(name: str, group, dtype, described) -> None:
    """Every rank states the activation shape (micro-batch, seq, dim, m) it will send and receive,
    or what is wrong with its input; if one rank's input is wrong or its shape differs, every rank
    raises the same error before a message is sent (a rank that raised alone would leave its
    neighbours waiting for its messages until the process group's timeout)."""
    everyone = agree(name, group, (None, str(dtype), described))
    problems = [f"rank {r}: {d[2]}" for r, d in enumerate(everyone) if isinstance(d[2], str)]
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))
    if len({d[2] for d in everyone}) > 1:
        raise ValueError(f"{name}: every stage must agree on (micro-batch, seq, dim, m), got "
                         + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone)))


def _input_problem(stage, rank, p, actions, tokens, targets, m) -> str | None:
    """What is wrong with one rank's input to ``run_schedule``, or None."""
    if (stage.embed is not None) != (rank == 0) or (stage.head is not None) != (rank == p - 1):
        return f"its stage is not stage {rank} of {p} (the embeddings must be on the first, " \
               "the head on the last)"
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        return f"m must be an int >= 1, got {m!r}"
    try:
        check_schedule([actions], m)
    except ValueError as exc:
        return str(exc).replace("stage 0 ", "its actions ")
    if tokens.dim() != 2 or tokens.shape != targets.shape or tokens.shape[0] % m:
        return (f"tokens and targets must be (batch, seq) with batch a multiple of m={m}, got "
                f"{tuple(tokens.shape)} and {tuple(targets.shape)}")
    return None


# --8<-- [start:run_schedule]
def run_schedule(stage: StageModule, actions: Sequence[Action], tokens: torch.Tensor,
                 targets: torch.Tensor, m: int, group=None, delay_s=0.0, lanes=None) -> dict:
    """Run this rank's ``actions`` of one step: rank s of ``group`` is stage s. Every rank passes
    the whole batch's ``tokens`` and ``targets`` (batch, seq); the first stage reads the tokens of
    micro-batch i, the last its targets. The gradients of the mean loss over the batch are
    accumulated in ``stage``'s ``.grad`` (each micro-batch's mean loss divided by m).

    ``lanes``: the two process groups of ``pipeline_lanes(group)`` (made here when None, which
    costs two group creations per call: a training loop makes them once).
    ``delay_s`` (seconds, or a pair for F and B) is added to every action, a stand-in for compute
    on a machine whose stages are too small to time. Returns ``{"losses"}`` (the last stage's
    per-micro-batch losses, else []), ``"spans"`` (kind, mb, start, end) in seconds from the start,
    ``"end"`` (when the last send completed) and ``"peak"`` (most activations held at once)."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    f_delay, b_delay = delay_s if isinstance(delay_s, (tuple, list)) else (delay_s, delay_s)
    first, last = rank == 0, rank == p - 1
    param = next(stage.parameters())
    device, dtype = param.device, param.dtype
    problem = _input_problem(stage, rank, p, actions, tokens, targets, m)
    shape = None if problem else (tokens.shape[0] // m, tokens.shape[1], stage.dim)
    _agree_on_shapes("run_schedule", group, dtype, problem or (*shape, m))   # checked everywhere
    tokens_mb, targets_mb = tokens.to(device).chunk(m), targets.to(device).chunk(m)
    lanes = pipeline_lanes(group) if lanes is None else lanes

    inputs, outputs, losses, spans = {}, {}, {}, []
    pending: list = []            # sends produced by the last action, posted with the next receive
    in_flight: list = []          # sends posted without a receive, waited for at the end
    peak = 0
    start = _clock(device)
    for kind, i in actions:
        if kind == "F":
            if first:
                x, recv = tokens_mb[i], None
            else:
                x = torch.empty(shape, device=device, dtype=dtype)
                recv = (x, rank - 1, 0)
            in_flight += _exchange(pending, recv, lanes)
            pending = []
            if not first:
                x.requires_grad_()
            t0 = _clock(device)
            out = stage(x)
            if last:
                losses[i] = lm_loss(nn.Identity(), out, targets_mb[i])
                out = losses[i] / m                     # the mean over the whole batch
            else:
                pending.append((out.detach(), rank + 1, 0))
            inputs[i], outputs[i] = x, out
            peak = max(peak, len(outputs))
            delay = f_delay
        else:
            grad = None if last else torch.empty(shape, device=device, dtype=dtype)
            in_flight += _exchange(pending, None if last else (grad, rank + 1, 1), lanes)
            pending = []
            t0 = _clock(device)
            torch.autograd.backward(outputs.pop(i), grad)    # into the .grad of this stage
            x = inputs.pop(i)
            if not first:
                pending.append((x.grad, rank - 1, 1))
            delay = b_delay
        if delay:
            time.sleep(delay)
        spans.append((kind, i, t0 - start, _clock(device) - start))
    for work in in_flight + _exchange(pending, None, lanes):
        work.wait()
    return {"losses": [losses[i].item() for i in range(m)] if last else [], "spans": spans,
            "end": _clock(device) - start, "peak": peak}
# --8<-- [end:run_schedule]


def measured_bubble(spans: Sequence[Sequence], ends: Sequence[float]) -> float:
    """The bubble of one step measured on p ranks: ``spans[s]`` as ``run_schedule`` returns them,
    ``ends[s]`` when rank s finished. 1 - (time spent in actions) / (p * the slowest rank's end)."""
    wall = max(ends)
    busy = sum(end - start for stage in spans for *_, start, end in stage)
    return 1 - busy / (len(spans) * wall)


def _make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    raise ValueError(f"train_pp: optimizer must be 'sgd' or 'adamw', got {name!r}")


def _check_train_args(name: str, schedule, micro_batches: int, global_batch: int):
    if isinstance(schedule, str) and schedule not in SCHEDULES:
        raise ValueError(f"{name}: schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    if not isinstance(schedule, str) and not callable(schedule):
        raise TypeError(f"{name}: schedule must be a name or a function (p, m) -> schedule, "
                        f"got {type(schedule).__name__}")
    m = _positive_int(name, "micro_batches", micro_batches)
    if global_batch % m:
        raise ValueError(f"{name}: global_batch={global_batch} must split into micro_batches={m} "
                         "equal micro-batches (unequal ones would weigh their examples unequally)")
    return m


# --8<-- [start:train_pp]
def train_pp(rank: int, world_size: int, steps: int = 10, dtype: torch.dtype = torch.float64,
             schedule="1f1b", micro_batches: int = 4, blocks: int = 4, global_batch: int = 8,
             seq_len: int = 8, optimizer: str = "sgd", seed: int = 0, delay_s=0.0,
             group=None, dim: int = DIM, gather: bool = True) -> dict:
    """Train ``tiny_transformer(seed, dtype, dim=dim, blocks=blocks)`` (positions enough for
    ``seq_len``) for ``steps`` steps, pipelined over the ranks of ``group`` with ``schedule``
    ("gpipe", "1f1b" or a function (p, m) -> schedule) and ``micro_batches`` micro-batches: step k
    draws ``tiny_batch(k, global_batch, seq_len)``; the gradients of the micro-batches
    accumulate, then every stage's optimizer steps its own parameters. Without a process group
    this is the one-process run on the whole batch.

    Returns, on every rank: ``"loss"`` (the mean loss of every step), ``"params"`` (all of the
    model's parameters, gathered from the stages, in ``model.parameters()`` order; None when
    ``gather`` is False, for a model too large to gather), ``"peak"`` (the most micro-batches in
    flight on this stage), ``"bubble"`` (measured, every step) and ``"seconds"`` (every step's
    schedule, barrier to the slowest rank's last send)."""
    m = _check_train_args("train_pp", schedule, micro_batches, global_batch)
    model = _model(seed, dtype, dim, blocks, seq_len)
    if not (dist.is_available() and dist.is_initialized()):
        opt = _make_optimizer(optimizer, model.parameters())
        losses = []
        for step in range(steps):
            opt.zero_grad()
            loss = lm_loss(model, *tiny_batch(step, global_batch, seq_len))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"loss": losses, "params": [q.detach().clone() for q in model.parameters()]}
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    make = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    actions = make(p, m)[rank]
    stage = split_stages(model, p)[rank].to(device_for(rank))
    opt = _make_optimizer(optimizer, stage.parameters())
    lanes = pipeline_lanes(group)                       # activations and gradients apart
    losses, bubbles, seconds, peak = [], [], [], 0
    for step in range(steps):
        tokens, targets = tiny_batch(step, global_batch, seq_len)
        opt.zero_grad()
        dist.barrier(group)                             # the ranks start the step together
        out = run_schedule(stage, actions, tokens, targets, m, group, delay_s, lanes)
        opt.step()
        loss = torch.tensor(sum(out["losses"]) / m, dtype=torch.float64,
                            device=device_for(rank))
        dist.broadcast(loss, group=group, group_src=p - 1)    # the last stage has the loss
        losses.append(loss.item())
        everyone = [None] * p
        dist.all_gather_object(everyone, (out["spans"], out["end"]), group=group)
        bubbles.append(measured_bubble([e[0] for e in everyone], [e[1] for e in everyone]))
        seconds.append(max(e[1] for e in everyone))
        peak = max(peak, out["peak"])
    params = gather_parameters(stage, group) if gather else None
    return {"loss": losses, "params": params, "peak": peak, "bubble": bubbles,
            "seconds": seconds}
# --8<-- [end:train_pp]


def _model(seed: int, dtype: torch.dtype, dim: int, blocks: int, seq_len: int) -> TinyTransformer:
    """The model ``train_pp`` and the one-process reference train: positions for at least 64
    tokens (the tiny transformer's default) and for ``seq_len``."""
    return tiny_transformer(seed, dtype, dim=dim, blocks=blocks, max_seq=max(64, seq_len))


def gather_parameters(stage: nn.Module, group=None) -> list[torch.Tensor]:
    """Every stage's parameters, on the CPU, concatenated in stage order: the whole model's
    parameters in ``model.parameters()`` order, on every rank."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, [q.detach().cpu() for q in stage.parameters()], group=group)
    return [q for params in everyone for q in params]


# --8<-- [start:torch_pp]
def train_torch_pp(rank: int, world_size: int, steps: int = 10,
                   dtype: torch.dtype = torch.float64, schedule: str = "1f1b",
                   micro_batches: int = 4, blocks: int = 4, global_batch: int = 8,
                   seq_len: int = 8, optimizer: str = "sgd", seed: int = 0) -> dict:
    """``train_pp`` with ``torch.distributed.pipelining``: the same ``StageModule`` wrapped in a
    ``PipelineStage`` and run by ``ScheduleGPipe`` or ``Schedule1F1B``, whose ``step`` splits the
    batch into micro-batches, and (``scale_grads=True``) divides the summed gradients by m, as
    ``run_schedule`` does. Returns ``{"loss", "params"}`` as ``train_pp`` does."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    m = _check_train_args("train_torch_pp", schedule, micro_batches, global_batch)
    if not isinstance(schedule, str):
        raise TypeError("train_torch_pp: schedule must be 'gpipe' or '1f1b'")
    p = dist.get_world_size()
    device = torch.device(device_for(rank))
    stage = split_stages(tiny_transformer(seed, dtype, blocks=blocks), p)[rank].to(device)
    pipe = PipelineStage(stage, stage_index=rank, num_stages=p, device=device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    runner = kind(pipe, n_microbatches=m,
                  loss_fn=lambda logits, y: lm_loss(nn.Identity(), logits, y))
    opt = _make_optimizer(optimizer, stage.parameters())
    losses = []
    for step in range(steps):
        # contiguous: torch.distributed.pipelining (torch 2.11) checks an input's strides against
        # the stage's, and tiny_batch's tokens are a slice of (B, S + 1) text
        batch = tiny_batch(step, global_batch, seq_len)
        tokens, targets = (t.to(device).contiguous() for t in batch)
        opt.zero_grad()
        mb_losses: list = []
        if rank == 0:
            runner.step(tokens)
        elif rank == p - 1:
            runner.step(target=targets, losses=mb_losses)
        else:
            runner.step()
        opt.step()
        loss = torch.zeros((), dtype=torch.float64, device=device)
        if rank == p - 1:
            loss += sum(x.item() for x in mb_losses) / m
        dist.broadcast(loss, group_src=p - 1)
        losses.append(loss.item())
    return {"loss": losses, "params": gather_parameters(stage)}
# --8<-- [end:torch_pp]


DTYPES = {"float32": torch.float32, "float64": torch.float64}
CHECK_TOL = {torch.float32: 1e-5, torch.float64: 1e-12}   # largest parameter difference allowed
WARMUP_STEPS = 1        # the first step (allocations, cuBLAS handles) is left out of the medians


def main(argv: list[str] | None = None) -> None:
    """``torchrun --nproc-per-node P -m snippets.part7.pipeline [--micro-batches M]``: both
    schedules on P ranks, compared with one process; rank 0 prints the largest parameter
    difference and the measured bubble (median over the steps) next to the formula.

    The timing mode sets the model (``--dim``, ``--blocks`` in all, ``--seq-len``,
    ``--micro-batch-size``, ``--dtype``), may skip the comparison (``--no-check``) and, with
    ``--out FILE``, has rank 0 write ``{"records": [one per schedule], "provenance"}``, each
    record's bubble and step time the median over the steps after the first."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="added to every action (the tiny stages compute almost nothing)")
    ap.add_argument("--dim", type=int, default=DIM, help="the model's width")
    ap.add_argument("--blocks", type=int, help="transformer blocks in all, cut into P stages "
                    "(default max(4, P))")
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the comparison with one process (slow for a large model)")
    ap.add_argument("--out", help="rank 0 writes the measured bubbles here (JSON)")
    args = ap.parse_args(argv)
    if args.out and args.steps <= WARMUP_STEPS:
        ap.error(f"--out needs --steps > {WARMUP_STEPS}: the first step is a warm-up")
    rank, p = init_from_env()
    m, dtype = args.micro_batches, DTYPES[args.dtype]
    blocks = max(4, p) if args.blocks is None else args.blocks
    shape = {"dim": args.dim, "blocks": blocks, "seq_len": args.seq_len,
             "micro_batch_size": args.micro_batch_size}
    ref, failed, records = None, False, []
    for name in SCHEDULES:
        out = train_pp(rank, p, args.steps, dtype, name, m, blocks=blocks,
                       global_batch=args.micro_batch_size * m, seq_len=args.seq_len,
                       delay_s=args.delay_ms / 1000, dim=args.dim, gather=not args.no_check)
        if rank != 0:
            continue
        line = f"{name:6s} p={p} m={m}: "
        if not args.no_check:
            if ref is None:
                ref = _reference(args.steps, m, dtype=dtype, **shape)
            worst = max((a - b).abs().max().item() for a, b in zip(out["params"], ref))
            failed |= not worst <= CHECK_TOL[dtype]
            line += f"largest parameter difference {worst:.3g}, "
        formula = f"(p-1)/(m+p-1) = {float(bubble_formula(p, m)):.3f}"
        if args.out:
            rec = _timing_record(name, p, m, args, shape, out)
            records.append(rec)
            print(f"{line}measured bubble {rec['bubble_median']:.3f} (median of steps "
                  f"{WARMUP_STEPS + 1} to {args.steps}), {formula}, "
                  f"{rec['seconds_per_step_median']:.3g} s per step")
        else:
            bubble = sorted(out["bubble"])[len(out["bubble"]) // 2]
            print(f"{line}measured bubble {bubble:.3f}, {formula}")
    prov = provenance(dist.get_backend(), p) if rank == 0 and args.out else None
    dist.destroy_process_group()
    if prov is not None:
        with open(args.out, "w") as f:
            json.dump({"records": records, "provenance": prov}, f, indent=1)
    if failed:
        raise SystemExit(1)


def _timing_record(name: str, p: int, m: int, args, shape: dict, out: dict) -> dict:
    """One schedule's record for ``--out``: its shape, every step's bubble, and the medians over
    the steps after the warm-up."""
    return {"schedule": name, "p": p, "m": m, **shape, "dtype": args.dtype,
            "steps": args.steps, "warmup_steps": WARMUP_STEPS, "delay_ms": args.delay_ms,
            "bubble_median": statistics.median(out["bubble"][WARMUP_STEPS:]),
            "bubble_all": out["bubble"], "formula": float(bubble_formula(p, m)),
            "seconds_per_step_median": statistics.median(out["seconds"][WARMUP_STEPS:]),
            "seconds_all": out["seconds"]}


def _reference(steps: int, m: int, blocks: int, dim: int = DIM, seq_len: int = 8,
               micro_batch_size: int = 4, dtype: torch.dtype = torch.float64
               ) -> list[torch.Tensor]:
    """The one-process run's final parameters (the model trained on the whole batch, no group)."""
    model = _model(0, dtype, dim, blocks, seq_len)
    opt = _make_optimizer("sgd", model.parameters())
    for step in range(steps):
        opt.zero_grad()
        lm_loss(model, *tiny_batch(step, micro_batch_size * m, seq_len)).backward()
        opt.step()
    return [q.detach().cpu() for q in model.parameters()]


if __name__ == "__main__":
    main()

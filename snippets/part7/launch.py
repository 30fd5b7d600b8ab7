"""Launching a world of processes: ``run_world`` for the tests and the chapters, ``init_from_env``
for ``torchrun``.

Every algorithm of Part 7 runs in several processes at once, one per *rank*, joined by a process
group. ``run_world(fn, p, ...)`` starts ``p`` processes on this machine, gives each a process group
(NCCL when there is a GPU for every rank, gloo on the CPU otherwise), calls ``fn(rank, p, ...)`` in
each and returns the ranks' return values in rank order. It is meant for tests and small
experiments: it never hangs (a rank that raises, dies or stalls stops the whole world, and the
error names the rank), and it needs nothing but this machine.

On GPUs one normally lets ``torchrun`` start the processes instead; such a program calls
``init_from_env()`` first, which reads the rank and the world size that ``torchrun`` put in the
environment.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKENDS = ("gloo", "nccl")
# After the first rank reports an error, how long the others get to report theirs before they are
# stopped: enough for ranks that raise the same error (a validation that fails on every rank).
ERROR_GRACE_S = 2.0


def default_backend(world_size: int) -> str:
    """NCCL when CUDA is available and there is a GPU for every rank, gloo otherwise."""
    if torch.cuda.is_available() and world_size <= torch.cuda.device_count():
        return "nccl"
    return "gloo"


def device_for(rank: int) -> str:
    """The device a rank's tensors live on: ``"cuda:<rank % count>"`` when CUDA is available, unless
    the process group already running is gloo (whose point-to-point operations take CPU tensors),
    and ``"cpu"`` otherwise."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        return "cpu"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return f"cuda:{rank % torch.cuda.device_count()}"
    return "cpu"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now: bind a socket to port 0 and let the
    kernel pick one. Rank 0 binds it again a moment later (another program could take it in
    between; on a test machine that does not happen in practice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, backend: str, timeout_s: float,
            fn: Callable, args: tuple, results) -> None:
    """One rank: join the group, run ``fn``, report (rank, ok, pickled value or error text)."""
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        else:
            # ranks share the machine's cores: without this each would start one thread per core
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        value = fn(rank, world_size, *args)
        # pickled here, with the plain pickler: a tensor travels by value, not through shared
        # memory that would vanish when this process exits
        payload = pickle.dumps(value)
        dist.destroy_process_group()
        results.put((rank, True, payload))
    except BaseException as exc:  # every failure is reported; then the process ends
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_world(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None,
              timeout_s: float = 60) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined by a process
    group, and return the ranks' return values, in rank order.

    - ``fn`` and ``args`` are pickled into processes started with ``spawn``: ``fn`` must be a
      function defined at the top level of an importable module, and the return values must
      pickle (return CPU tensors: a CUDA tensor would be rebuilt on the GPU of the caller).
    - ``backend``: ``"gloo"`` or ``"nccl"``; by default NCCL when CUDA is available and there is a
      GPU for every rank (rank r uses ``cuda:r``), gloo otherwise.
    - ``timeout_s`` bounds every collective (the process group's timeout) and the whole run.

    Raises ``RuntimeError`` naming the rank and its exception if any rank raised (the others are
    stopped), if a rank died without reporting, or if the run took longer than ``timeout_s``.
    """
    if not callable(fn):
        raise TypeError(f"run_world: fn must be callable, got {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"run_world: world_size must be a positive int, got {world_size!r}")
    if not timeout_s > 0:
        raise ValueError(f"run_world: timeout_s must be positive, got {timeout_s!r}")
    backend = default_backend(world_size) if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f"run_world: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and not (torch.cuda.is_available()
                                  and world_size <= torch.cuda.device_count()):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"run_world: nccl needs a GPU per rank: {world_size} ranks, {count} GPUs")
    try:
        pickle.dumps((fn, args))
    except Exception as exc:
        raise TypeError("run_world: fn and args must pickle (fn defined at the top level of a "
                        f"module, not a lambda or a local function): {exc}") from exc

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True, name=f"rank{rank}",
                         args=(rank, world_size, port, backend, timeout_s, fn, args, results))
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) + len(errors) < world_size:
            now = time.monotonic()
            if now > deadline:
                break
            try:
                report = results.get(timeout=min(0.1, deadline - now))
            except queue.Empty:
                report = None
                silent = [r for r, proc in enumerate(procs)
                          if proc.exitcode is not None and r not in values and r not in errors]
                if silent:  # died without a report (killed, a crash in C++), or its report is late
                    try:
                        report = results.get(timeout=0.5)
                    except queue.Empty:
                        for r in silent:
                            errors[r] = (f"the process exited with code {procs[r].exitcode} "
                                         "without reporting a result")
            if report is not None:
                rank, ok, payload = report
                if ok:
                    values[rank] = pickle.loads(payload)
                else:
                    errors[rank] = payload
            if errors:  # give the others a moment to report theirs, then stop them
                deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
    finally:
        _stop(procs, wait=not errors and len(values) == world_size)
        results.close()
    if errors:
        first = next(iter(errors))  # the first to report: the others may only have lost it
        summary = errors[first].splitlines()[0]
        others = sorted(set(errors) - {first})
        also = f" (rank(s) {others} raised too)" if others else ""
        raise RuntimeError(f"run_world: rank {first} of {world_size} raised {summary}{also}\n"
                           f"--- rank {first} ---\n{errors[first]}")
    if len(values) < world_size:
        missing = sorted(set(range(world_size)) - set(values))
        raise RuntimeError(f"run_world: rank(s) {missing} of {world_size} did not finish within "
                           f"timeout_s={timeout_s} (a collective that some ranks never called?)")
    return [values[rank] for rank in range(world_size)]


def _stop(procs: list, wait: bool) -> None:
    """Terminate (and if need be kill) every process still running; after a run in which every rank
    reported, first give them a moment to exit by themselves."""
    end = time.monotonic() + (5.0 if wait else 0.0)
    for proc in procs:
        proc.join(timeout=max(0.0, end - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def init_from_env(backend: str | None = None, timeout_s: float = 600) -> tuple[int, int]:
    """Join the process group ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), with NCCL when every
    local rank has a GPU (and select it), gloo otherwise. Returns (rank, world_size)."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in needed if k not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_env: {missing} not set: start the program with torchrun "
                           "(torchrun --nproc-per-node 4 -m snippets.part7.collectives)")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = default_backend(local_world) if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f"init_from_env: backend must be one of {BACKENDS}, got {backend!r}")
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device_id = torch.device("cuda", local_rank)   # NCCL need not guess the rank's GPU
    if os.environ.get("KM_HANG_S"):   # debugging a hang: every thread's stack after that long
        faulthandler.dump_traceback_later(float(os.environ["KM_HANG_S"]), exit=True)
    dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device_id,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world_size

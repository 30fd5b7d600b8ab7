"""Tensor parallelism with its communication overlapped: the Megatron MLP of tensor_parallel.py
(column parallel, then row parallel) computed in chunks of tokens, each chunk's collective in
flight while the next chunk's matrices are multiplied.

In ``TensorParallelMLP`` the all-reduce at the exit (g, forward) and the one at the entrance (f,
backward) sit on the critical path: nothing else runs while they travel. The MLP acts on each
token alone, so the tokens can be cut into ``chunks`` pieces. Chunk i's partial output is
all-reduced asynchronously (``async_op=True``) while chunk i + 1 is computed; every handle is
waited for at the end. The backward does the same with the partial gradients of the input. With
sequence parallelism the all-gather before the column-parallel matrix and the reduce-scatter after
the row-parallel one are chunked the same way: chunk i + 1's all-gather is posted before chunk
i's matrices run.

PyTorch's async-TP (``torch.ops.symm_mem.fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter``, on symmetric memory) does the same for the sequence-parallel
layout, inside one fused operator; ``AsyncTPMLP`` wraps them for training (CUDA only).

Conventions: the same as tensor_parallel.py's (the parameters are its ``ColumnParallelLinear``'s
and ``RowParallelLinear``'s, with their ``tp_dim`` and ``sequence_parallel`` marks); the input is
(..., features), every leading dimension counted as tokens (with sequence parallelism, this
rank's shard of them). Chunks follow ``tensor_split``: any count from 1 to the number of (local)
tokens, the sizes differing by at most one.

Under ``torchrun`` the module measures one forward and backward at a realistic size:

    torchrun --nproc-per-node 4 -m snippets.part7.tp_overlap --out tp_overlap.json
    python -m snippets.part7.tp_overlap --world 2 --tokens 64 --hidden 32 --ffn 64 \\
        --dtype float32 --out dry.json                       # a CPU dry run on gloo
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.collectives import (
    agree_same_shape,
    all_gather_tensor,
    chunk_bounds,
    reduce_scatter_tensor,
)
from snippets.part7.launch import device_for
from snippets.part7.ring_tp import P2P_CHUNK_BYTES, RingTPMLP
from snippets.part7.sweep import provenance, slowest_time
from snippets.part7.tensor_parallel import TensorParallelMLP


def _gelu_grad(grad: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """d gelu(a) times grad: the kernel autograd itself calls for F.gelu (exact, erf form)."""
    return torch.ops.aten.gelu_backward(grad, a)


# --8<-- [start:post]
def _post(kind: str, out: torch.Tensor, inp: torch.Tensor, group, talk: bool):
    """Start one collective without waiting for it and return its handle (None when ``talk`` is
    False: the compute-only measurement, where the collectives are left out and the buffers they
    would fill keep whatever they hold)."""
    if not talk:
        return None
    if kind == "all_reduce":                       # in place: out is inp
        return dist.all_reduce(out, group=group, async_op=True)
    if kind == "all_gather":
        return all_gather_tensor(out, inp, group=group, async_op=True)
    return reduce_scatter_tensor(out, inp, group=group, async_op=True)


def _wait(works) -> None:
    for work in works:
        if work is not None:
            work.wait()


def _arrived(rows, sp: bool, full, local, scale: int, group, talk):
    """Each chunk's (start, stop) rows, once its input is here. Under sequence parallelism chunk
    i's all-gather (of ``local`` into ``full``) is posted before chunk i - 1 is computed, so it
    travels meanwhile; without, the input is whole and nothing is sent."""
    def gather(i):
        s, e = rows[i]
        return _post("all_gather", full[scale * s:scale * e], local[s:e], group, talk)

    gathers = [gather(0)] if sp else []
    for i, (s, e) in enumerate(rows):
        if sp and i + 1 < len(rows):
            gathers.append(gather(i + 1))            # chunk i + 1 travels while i computes
        if sp:
            _wait(gathers[i:i + 1])
        yield s, e
# --8<-- [end:post]


def _bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """(start, stop) of each of ``tensor_split``'s chunks of n rows."""
    at = chunk_bounds(n, chunks)
    return list(zip(at, at[1:]))


# --8<-- [start:forward]
class ChunkedTensorParallelMLP(torch.autograd.Function):
    """down(gelu(up(x))) on this rank's slices ``w1`` (f/p, d), ``b1`` (f/p), ``w2`` (d, f/p) and
    the whole ``b2`` (d), for ``x`` of (n, d) tokens, in ``chunks`` chunks of tokens.

    Without sequence parallelism (``sp`` False) x is every token: chunk i's partial output is
    all-reduced while chunk i + 1 is computed. With it, x is this rank's n tokens of p n: chunk
    i's all-gather (p n_i rows, rank r's n_i after rank r - 1's) and, after the matrices, its
    reduce-scatter back to this rank's n_i rows; chunk i + 1's all-gather is posted before chunk
    i is computed."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, chunks, group, sp, talk):
        p = _world_size(group)
        n, rows = x.shape[0], _bounds(x.shape[0], chunks)
        gathered = x.new_empty((p * n, x.shape[1])) if sp else x       # the full inputs
        pre = x.new_empty((gathered.shape[0], w1.shape[0]))            # up's outputs
        out = x.new_empty((n, w2.shape[0]))
        scale = p if sp else 1                       # rows of a chunk's input, per local row

        reduces = []
        for s, e in _arrived(rows, sp, gathered, x, scale, group, talk):
            xi, ai = gathered[scale * s:scale * e], pre[scale * s:scale * e]
            if b1 is None:
                torch.mm(xi, w1.t(), out=ai)
            else:
                torch.addmm(b1, xi, w1.t(), out=ai)
            if sp:                                   # a partial sum of p n_i rows, scattered
                partial = torch.mm(F.gelu(ai), w2.t())
                reduces.append(_post("reduce_scatter", out[s:e], partial, group, talk))
            else:                                    # a partial sum of n_i rows, in place
                torch.mm(F.gelu(ai), w2.t(), out=out[s:e])
                reduces.append(_post("all_reduce", out[s:e], out[s:e], group, talk))
        _wait(reduces)
        if b2 is not None:
            out += b2
        ctx.save_for_backward(gathered, pre, w1, w2)
        ctx.meta = (chunks, group, sp, talk, b1 is not None, b2 is not None)
        return out
    # --8<-- [end:forward]

    # --8<-- [start:backward]
    @staticmethod
    def backward(ctx, grad):
        gathered, pre, w1, w2 = ctx.saved_tensors
        chunks, group, sp, talk, has_b1, has_b2 = ctx.meta
        p = _world_size(group)
        grad = grad.contiguous()
        n, rows = grad.shape[0], _bounds(grad.shape[0], chunks)
        scale = p if sp else 1
        ggrad = grad.new_empty((p * n, grad.shape[1])) if sp else grad  # the full grad of y
        dx = grad.new_empty((n, w1.shape[1]))
        dw1, dw2 = torch.zeros_like(w1), torch.zeros_like(w2)
        db1 = w1.new_zeros(w1.shape[0]) if has_b1 else None

        reduces = []
        for s, e in _arrived(rows, sp, ggrad, grad, scale, group, talk):
            gi, ai = ggrad[scale * s:scale * e], pre[scale * s:scale * e]
            da = _gelu_grad(gi @ w2, ai)             # (rows, f/p)
            if sp:                                   # partial grads of p n_i inputs, scattered
                reduces.append(_post("reduce_scatter", dx[s:e], da @ w1, group, talk))
            else:
                torch.mm(da, w1, out=dx[s:e])
                reduces.append(_post("all_reduce", dx[s:e], dx[s:e], group, talk))
            # the weights' gradients need no communication: computed while dx[s:e] travels
            dw2.addmm_(gi.t(), F.gelu(ai))
            dw1.addmm_(da.t(), gathered[scale * s:scale * e])
            if has_b1:
                db1 += da.sum(0)
        _wait(reduces)
        db2 = grad.sum(0) if has_b2 else None        # with sp, a partial sum (sequence_parallel)
        return dx, dw1, db1, dw2, db2, None, None, None, None
# --8<-- [end:backward]


def _world_size(group) -> int:
    """The group's size, or 1 without a process group (the compute-only run on one process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _check_input(name: str, x, weight: torch.Tensor, chunks, sp: bool) -> int:
    """Local checks of one rank's input, before anything is sent; returns the (local) tokens."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: x must be a tensor, got {type(x).__name__}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise TypeError(f"{name}: x is {x.dtype} on {x.device}, the weights {weight.dtype} on "
                        f"{weight.device}")
    if x.dim() < 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: x must be (..., {weight.shape[1]}), got {tuple(x.shape)}")
    tokens = x.numel() // x.shape[-1]
    if not isinstance(chunks, int) or isinstance(chunks, bool) or not 1 <= chunks <= tokens:
        where = "local tokens (this rank's sequence shard)" if sp else "tokens"
        raise ValueError(f"{name}: chunks must be an int from 1 to the {tokens} {where}, "
                         f"got {chunks!r}")
    return tokens


# --8<-- [start:module]
class OverlappedTensorParallelMLP(nn.Module):
    """``TensorParallelMLP`` (same slices, same parameter names and marks) computed by
    ``ChunkedTensorParallelMLP`` in ``chunks`` chunks. ``chunks=1`` is the unoverlapped block.

    Before the first collective of a call, every rank's input shape is exchanged
    (``collectives.agree_same_shape``) and a disagreement raises the same error on every rank;
    ``check=False`` skips that small exchange (the timed loop, once the shapes are agreed)."""

    def __init__(self, up: nn.Linear, down: nn.Linear, group=None, sp: bool = False,
                 chunks: int = 2):
        super().__init__()
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f"OverlappedTensorParallelMLP: chunks must be an int >= 1, "
                             f"got {chunks!r}")
        base = TensorParallelMLP(up, down, group, sp)
        self.up, self.down = base.up, base.down
        self.group, self.sp, self.chunks, self.check = group, sp, chunks, True

    def forward(self, x: torch.Tensor, talk: bool = True) -> torch.Tensor:
        name = "OverlappedTensorParallelMLP"
        _check_input(name, x, self.up.weight, self.chunks, self.sp)
        if talk and self.check:
            agree_same_shape(name, x, self.group)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = ChunkedTensorParallelMLP.apply(flat, self.up.weight, self.up.bias, self.down.weight,
                                           self.down.bias, self.chunks, self.group, self.sp,
                                           talk)
        return y.view(*x.shape[:-1], y.shape[-1])
# --8<-- [end:module]


# --8<-- [start:async_tp]
def async_tp_ops():
    """PyTorch's fused operators: (fused_all_gather_matmul, fused_matmul_reduce_scatter)."""
    import torch.distributed._symmetric_memory as symm_mem

    if not hasattr(symm_mem, "enable_symm_mem_for_group"):
        raise RuntimeError("async_tp_ops: this torch has no symmetric memory")
    return (torch.ops.symm_mem.fused_all_gather_matmul,
            torch.ops.symm_mem.fused_matmul_reduce_scatter)


def async_tp_unavailable(device) -> str | None:
    """Why async-TP cannot run here, or None: it needs CUDA tensors and NCCL."""
    if torch.device(device).type != "cuda":
        return "async-TP (symmetric memory) needs CUDA tensors: this run is on the CPU"
    try:
        async_tp_ops()
    except (ImportError, AttributeError, RuntimeError) as exc:
        return f"async-TP unavailable: {exc}"
    return None


class AsyncTPFunction(torch.autograd.Function):
    """The sequence-parallel MLP through PyTorch's async-TP: forward all-gather + up (one fused
    op), gelu, down + reduce-scatter (another); backward the same two fused ops on the gradients,
    the weights' gradients from the gathered tensors they return."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, group_name, ops):
        ag_mm, mm_rs = ops
        gathered, (pre,) = ag_mm(x, [w1.t()], 0, group_name)        # (p n, d), (p n, f/p)
        pre = pre + b1
        out = mm_rs(F.gelu(pre), w2.t(), "sum", 0, group_name) + b2  # (n, d)
        ctx.save_for_backward(gathered, pre, w1, w2)
        ctx.group_name, ctx.ops = group_name, ops
        return out

    @staticmethod
    def backward(ctx, grad):
        gathered, pre, w1, w2 = ctx.saved_tensors
        ag_mm, mm_rs = ctx.ops
        ggrad, (dh,) = ag_mm(grad.contiguous(), [w2], 0, ctx.group_name)   # (p n, f/p)
        da = _gelu_grad(dh, pre)
        dx = mm_rs(da, w1, "sum", 0, ctx.group_name)                         # (n, d)
        return (dx, da.t() @ gathered, da.sum(0), ggrad.t() @ F.gelu(pre), grad.sum(0),
                None, None)


class AsyncTPMLP(nn.Module):
    """``TensorParallelMLP(up, down, group, sp=True)``'s slices, computed by ``AsyncTPFunction``;
    ``ops`` defaults to ``async_tp_ops()`` (a test passes stand-ins with the same signatures)."""

    def __init__(self, up: nn.Linear, down: nn.Linear, group=None, ops=None):
        super().__init__()
        if up.bias is None or down.bias is None:
            raise ValueError("AsyncTPMLP: the MLP's layers must have biases")
        base = TensorParallelMLP(up, down, group, sp=True)
        self.up, self.down = base.up, base.down
        self.group_name = (group or dist.group.WORLD).group_name
        self.ops = ops
        if ops is None:
            self.ops = async_tp_ops()
            import torch.distributed._symmetric_memory as symm_mem

            with warnings.catch_warnings():      # needed before torch 2.8, deprecated after
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(self.group_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("AsyncTPMLP", x, self.up.weight, 1, True)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = AsyncTPFunction.apply(flat, self.up.weight, self.up.bias, self.down.weight,
                                  self.down.bias, self.group_name, self.ops)
        return y.view(*x.shape[:-1], y.shape[-1])
# --8<-- [end:async_tp]


# --8<-- [start:model]
def chunk_timeline(compute_s: float, comm_s: float, chunks: int, latency_s: float = 0.0,
                   after_s: float = 0.0, chunk_overhead_s: float = 0.0,
                   sm_share: float = 0.0) -> float:
    """The time of one pass (forward or backward) of compute ``compute_s`` and one collective
    ``comm_s`` (its time unchunked) cut into ``chunks``: each chunk computes what its collective
    sends, posts the collective, then computes ``after_s / chunks`` that does not feed it (the
    backward's weight gradients; 0 in the forward); the collectives run one after another on the
    link. Without ``after_s`` this is a two-stage pipeline:

        T(c) = t_comp + t_comm + (c - 1) max(t_comp, t_comm)

    with t_comp = compute_s / c + chunk_overhead_s (a smaller matrix runs less efficiently), divided
    by 1 - sm_share when c > 1 (the share of the SMs the collective's kernel occupies while compute
    runs beside it), and t_comm = (comm_s - latency_s) / c + latency_s (each collective pays its
    latency again: alpha-beta). c = 1 without ``after_s`` is compute then communication."""
    for name, v in (("compute_s", compute_s), ("comm_s", comm_s), ("latency_s", latency_s),
                    ("after_s", after_s), ("chunk_overhead_s", chunk_overhead_s)):
        if not v >= 0:
            raise ValueError(f"chunk_timeline: {name} must be >= 0, got {v!r}")
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"chunk_timeline: chunks must be an int >= 1, got {chunks!r}")
    if not 0 <= sm_share < 1:
        raise ValueError(f"chunk_timeline: sm_share must be in [0, 1), got {sm_share!r}")
    if latency_s > comm_s or after_s > compute_s:
        raise ValueError(f"chunk_timeline: latency_s={latency_s} must not exceed comm_s={comm_s}"
                         f", nor after_s={after_s} compute_s={compute_s}")
    slow = 1 - sm_share if chunks > 1 else 1.0
    before = ((compute_s - after_s) / chunks + chunk_overhead_s) / slow
    after = after_s / chunks / slow
    t_comm = (comm_s - latency_s) / chunks + latency_s
    compute = link = 0.0                     # when the SMs, and the link, are next free
    for _ in range(chunks):
        compute += before
        link = max(compute, link) + t_comm   # a collective starts when its data and link are
        compute += after
    return max(compute, link)


def hidden_fraction(compute_s: float, comm_s: float, step_s: float) -> float:
    """The share of the communication that did not add to the step: (a + b - t) / b, for compute
    alone a, communication alone b and the step t. 1: all hidden; 0: none (t = a + b); negative:
    the step took longer than compute and communication one after the other."""
    if not (compute_s > 0 and comm_s > 0 and step_s > 0):
        raise ValueError(f"hidden_fraction: the times must be > 0, got compute_s={compute_s!r}, "
                         f"comm_s={comm_s!r}, step_s={step_s!r}")
    return (compute_s + comm_s - step_s) / comm_s
# --8<-- [end:model]


# --8<-- [start:measure]
VARIANTS = ("compute", "comm", "tp", "overlap", "ring", "async_tp")


def _comm_only(n: int, d: int, chunks: int, sp: bool, group, like: torch.Tensor):
    """The collectives of one forward and backward of the block, chunked as it chunks them, on
    tensors of the same sizes, without the matrices."""
    p = dist.get_world_size(group)
    local = like.new_zeros((n, d))
    full = like.new_zeros((p * n, d)) if sp else local

    def step():
        for _ in range(2):                       # the forward's collective, the backward's
            works = []
            for s, e in _bounds(n, chunks):
                if sp:
                    works.append(_post("all_gather", full[p * s:p * e], local[s:e], group, True))
                    works.append(_post("reduce_scatter", local[s:e], full[p * s:p * e],
                                       group, True))
                else:
                    works.append(_post("all_reduce", local[s:e], local[s:e], group, True))
            _wait(works)
    return step


def measure(tokens: int = 8192, hidden: int = 8192, ffn: int = 28672,
            dtype: torch.dtype = torch.bfloat16, chunk_counts=(2, 4), iters: int = 10,
            warmup: int = 3, layouts=(False, True), group=None) -> dict[str, Any]:
    """Time one forward and backward of the MLP block on this process group (every rank calls it;
    the slowest rank's time is kept), for each layout (``sp`` False: all-reduces; True: all-gather
    and reduce-scatter, ``tokens`` cut over the ranks):

    - compute: the block with its collectives left out (``talk=False``);
    - comm: its collectives alone, on tensors of the same sizes (unchunked, and per chunk count);
    - tp: tensor_parallel.py's ``TensorParallelMLP``, no overlap;
    - overlap: ``OverlappedTensorParallelMLP`` for each of ``chunk_counts`` (and 1);
    - ring: ring_tp.py's ``RingTPMLP`` (sequence-parallel layout): the collectives as rings of
      messages, each hidden behind one shard's product;
    - async_tp: PyTorch's async-TP (sequence-parallel layout, CUDA only; otherwise a reason).

    Returns {"records": [...], "hidden": [...]}: hidden fraction (a + b - t) / b of tp, of each
    overlap, of ring and of async_tp, with a compute and b the unchunked comm of the same layout."""
    for name, v in (("tokens", tokens), ("hidden", hidden), ("ffn", ffn), ("iters", iters)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"measure: {name} must be an int >= 1, got {v!r}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("measure: no process group: run it under torchrun (or run_world)")
    p = dist.get_world_size(group)
    if ffn % p or tokens % p:
        raise ValueError(f"measure: ffn={ffn} and tokens={tokens} must divide by the {p} ranks")
    if any(not isinstance(c, int) or c < 1 or c > tokens // p for c in chunk_counts):
        raise ValueError(f"measure: chunk_counts must be ints from 1 to {tokens // p}, "
                         f"got {chunk_counts!r}")
    device = torch.device(device_for(dist.get_rank(group)))
    with torch.device("meta"):
        up, down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
    up, down = (m.to_empty(device=device).to(dtype) for m in (up, down))
    g = torch.Generator(device=device).manual_seed(0)   # the same full weights on every rank
    with torch.no_grad():
        for t in (*up.parameters(), *down.parameters()):
            t.normal_(0, t.shape[-1] ** -0.5, generator=g)
    records = []

    def timed(variant, sp, chunks, fn, block=None):
        records.append({"variant": variant, "sp": sp, "chunks": chunks,
                        "seconds": slowest_time(fn, device, iters, warmup, group)})

    def fwd_bwd(block, x, grad, **kw):
        def step():
            for t in block.parameters():
                t.grad = None
            x.grad = None
            block(x, **kw).backward(grad)
        return step

    for sp in layouts:
        n = tokens // p if sp else tokens
        x = (torch.randn((1, n, hidden), device=device, generator=g) * 0.1).to(dtype)
        x.requires_grad_()
        grad = torch.randn((1, n, hidden), device=device, generator=g).to(dtype)
        blocks = {c: OverlappedTensorParallelMLP(up, down, group, sp, c)
                  for c in sorted({1, *chunk_counts})}
        for block in blocks.values():
            block(x).sum()                         # agree on the shapes once, then time
            block.check = False
        timed("compute", sp, 1, fwd_bwd(blocks[1], x, grad, talk=False))
        for c in sorted({1, *chunk_counts}):
            timed("comm", sp, c, _comm_only(n, hidden, c, sp, group, x))
        timed("tp", sp, 1, fwd_bwd(TensorParallelMLP(up, down, group, sp), x, grad))
        for c, block in blocks.items():
            timed("overlap", sp, c, fwd_bwd(block, x, grad))
        if sp:
            ring = RingTPMLP(up, down, group)
            ring(x).sum()
            ring.check = False
            timed("ring", sp, 1, fwd_bwd(ring, x, grad))
            why = async_tp_unavailable(device)
            if why is None:
                timed("async_tp", sp, 1, fwd_bwd(AsyncTPMLP(up, down, group), x, grad))
            else:
                records.append({"variant": "async_tp", "sp": sp, "chunks": 1, "skipped": why})
    return {"records": records, "hidden": hidden_fractions(records)}
# --8<-- [end:measure]


def hidden_fractions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every timed tp, overlap, ring and async_tp record: its hidden fraction against the
    compute and the unchunked comm of its layout."""
    out = []
    for sp in sorted({r["sp"] for r in records}):
        mine = [r for r in records if r["sp"] == sp and "seconds" in r]
        a = next((r["seconds"] for r in mine if r["variant"] == "compute"), None)
        b = next((r["seconds"] for r in mine if r["variant"] == "comm" and r["chunks"] == 1),
                 None)
        if a is None or b is None:
            continue
        for r in mine:
            if r["variant"] in ("tp", "overlap", "ring", "async_tp"):
                out.append({"variant": r["variant"], "sp": sp, "chunks": r["chunks"],
                            "hidden_fraction": hidden_fraction(a, b, r["seconds"])})
    return out


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def _rank_main(rank: int, world: int, kw: dict[str, Any]) -> dict[str, Any]:
    return {"provenance": provenance(dist.get_backend(), world), **measure(**kw)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--chunks", default="2,4", help="chunk counts, comma separated (1 is added)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--world", type=int, help="spawn this many processes here (without torchrun)")
    ap.add_argument("--p2p-chunk-bytes", type=int, default=P2P_CHUNK_BYTES,
                    help="NCCL_P2P_NVL_CHUNKSIZE for this process (the ring block's messages), "
                         "set before NCCL starts unless the environment sets it (0: NCCL's "
                         "default)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.p2p_chunk_bytes < 0:
        raise ValueError(f"--p2p-chunk-bytes must be >= 0, got {args.p2p_chunk_bytes}")
    if args.p2p_chunk_bytes:
        os.environ.setdefault("NCCL_P2P_NVL_CHUNKSIZE", str(args.p2p_chunk_bytes))
    kw = {"tokens": args.tokens, "hidden": args.hidden, "ffn": args.ffn,
          "dtype": DTYPES[args.dtype], "iters": args.iters, "warmup": args.warmup,
          "chunk_counts": tuple(int(c) for c in args.chunks.split(",") if c)}
    if args.world:
        from snippets.part7.launch import run_world

        result = run_world(_rank_main, args.world, kw, timeout_s=3600)[0]
    else:
        from snippets.part7.launch import init_from_env

        rank, world = init_from_env(timeout_s=3600)
        result = _rank_main(rank, world, kw)
        dist.destroy_process_group()
        if rank != 0:
            return 0
    prov = result["provenance"]
    chunk = os.environ.get("NCCL_P2P_NVL_CHUNKSIZE")       # None: NCCL's default
    result["nccl_p2p_chunk_bytes"] = int(chunk) if chunk else None
    result = {"gpu": prov["gpu"], "world_size": prov["world_size"], "torch": prov["torch"],
              "date": prov["date"], "config": {**kw, "dtype": args.dtype}, **result}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for h in result["hidden"]:
        layout = "tp+sp" if h["sp"] else "tp"
        print(f"{layout} {h['variant']} chunks={h['chunks']}: hidden fraction "
              f"{h['hidden_fraction']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

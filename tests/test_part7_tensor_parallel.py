"""Tensor parallelism from scratch (snippets/part7/tensor_parallel.py): on 2 and 4 gloo ranks,
Megatron's split of tiny_transformer (with and without sequence parallelism) and torch's DTensor
version of it train exactly as one process does; f and g, the MLP and the attention give the full
layers' outputs and gradients; the collectives issued in a step are tp_communication's.

In tensor parallelism every rank sees the whole batch: the single-process reference trains the
same model on the same batches. One world per size runs every scenario.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from snippets.part7 import tensor_parallel as tp
from snippets.part7.launch import run_world
from snippets.part7.models import lm_loss, tiny_batch, tiny_transformer

SEED = 5
STEPS = 10
BATCH = 4
SEQ_LEN = 8             # divisible by every world size tested (sequence parallelism)
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
DIM = 32
# the vocabulary cut too: both dtypes and both layouts, without running all four pairings
VOCAB_RUNS = ((False, torch.float64), (True, torch.float32))


def train(rank: int, world: int, dtype, sp: bool, how: str = "ours") -> dict:
    """``how``: "ours" (tensor_parallel), "vocab" (with the vocabulary cut too) or "dtensor"."""
    if how == "dtensor":
        return tp.train_dtensor(rank, world, steps=STEPS, dtype=dtype, sp=sp, batch=BATCH,
                                seq_len=SEQ_LEN, seed=SEED)
    return tp.train_tp(rank, world, steps=STEPS, dtype=dtype, sp=sp, batch=BATCH,
                       seq_len=SEQ_LEN, seed=SEED, vocab_parallel=how == "vocab")


def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The ranks' equal shards of ``t`` along ``dim``, concatenated in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


def isolated(rank: int, world: int) -> dict:
    """f and g alone, the MLP and the attention against the full layers (float64)."""
    out = {}
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    (tp.CopyToTensorParallel.apply(x, None) * (rank + 1)).sum().backward()
    out["f grad"] = x.grad.clone()               # the sum of every rank's (r + 1)
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    y = tp.ReduceFromTensorParallel.apply(x, None)
    (y * 2).sum().backward()
    out["g"] = (y.detach().clone(), x.grad.clone())   # sum of (r + 1); gradient 2, unsummed

    layers, x, w = full_layers()                  # the same layers and data on every rank
    (mlp_full, _), (attn_full, _) = layers["mlp"], layers["attn"]
    for sp in (False, True):
        mlp = tp.TensorParallelMLP(mlp_full.up, mlp_full.down, sp=sp)
        attn = tp.TensorParallelAttention(attn_full, sp=sp)
        for name, layer in (("mlp", mlp), ("attn", attn)):
            xin = (x.tensor_split(world, 1)[rank] if sp else x).clone().requires_grad_()
            y = layer(xin)
            wmine = w.tensor_split(world, 1)[rank] if sp else w
            (y * wmine).sum().backward()
            grads = {}
            for pname, t in layer.named_parameters():
                g = t.grad
                if getattr(t, "tp_dim", None) is not None:
                    g = gather(g, t.tp_dim)
                elif sp:                           # a partial sum: add the ranks' parts
                    g = g.clone()
                    dist.all_reduce(g)
                grads[pname] = g
            out[name, sp] = {"y": gather(y.detach(), 1) if sp else y.detach(),
                             "x grad": gather(xin.grad, 1) if sp else xin.grad, "grads": grads}
    logits, targets = full_logits()
    mine = logits.chunk(world, -1)[rank].clone().requires_grad_()
    loss = tp.VocabParallelCrossEntropy.apply(mine, targets, None)
    (loss * torch.arange(1.0, 1 + loss.numel(), dtype=loss.dtype).view_as(loss)).sum().backward()
    out["cross entropy"] = (loss.detach(), gather(mine.grad, -1))
    return out


def full_logits():
    """Logits (2, 8, 64) with a wide range (a softmax that needs its shift) and their targets."""
    g = torch.Generator().manual_seed(1)
    logits = 30 * torch.randn(2, SEQ_LEN, 64, dtype=torch.float64, generator=g)
    return logits, torch.randint(0, 64, (2, SEQ_LEN), generator=g)


class Counter:
    """Replaces the collectives tensor_parallel.py calls with counting wrappers."""

    def __init__(self):
        self.calls: dict[str, list[int]] = {}
        self.saved = (dist.all_reduce, tp.all_gather_tensor, tp.reduce_scatter_tensor)

    def wrap(self, name, fn, which):
        def counted(*args, **kwargs):
            self.calls.setdefault(name, []).append(which(*args).numel()
                                                   * which(*args).element_size())
            return fn(*args, **kwargs)
        return counted

    def __enter__(self):
        all_reduce, gather_, scatter = self.saved
        dist.all_reduce = self.wrap("all_reduce", all_reduce, lambda t, *a: t)
        tp.all_gather_tensor = self.wrap("all_gather", gather_, lambda out, inp: out)
        tp.reduce_scatter_tensor = self.wrap("reduce_scatter", scatter, lambda out, inp: inp)
        return self

    def __exit__(self, *exc):
        dist.all_reduce, tp.all_gather_tensor, tp.reduce_scatter_tensor = self.saved


def counted_step(sp: bool, dtype, vocab: bool) -> list[tuple[str, int]]:
    """(collective, bytes) of every call one forward and backward issue, sorted."""
    model = tp.tensor_parallel(tiny_transformer(SEED, dtype), sp=sp, vocab_parallel=vocab)
    tokens, targets = tiny_batch(0, BATCH, SEQ_LEN)
    loss_fn = tp.vocab_parallel_loss if vocab else lm_loss
    with Counter() as counter:
        loss_fn(model, tokens, targets).backward()
        if sp:
            tp.sync_sequence_parallel_grads(model)
    return sorted((name, n) for name, sizes in counter.calls.items() for n in sizes)


def errors(rank: int, world: int) -> dict:
    out = {}

    def catch(key, fn):
        try:
            fn()
        except (ValueError, TypeError) as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    bad_heads = tiny_transformer(SEED, heads=world // 2 if world > 2 else 1)
    catch("heads", lambda: tp.tensor_parallel(bad_heads))
    bad_mlp = tiny_transformer(SEED)
    width = 4 * world + 1                         # divides by no world size > 1
    bad_mlp.blocks[1].up, bad_mlp.blocks[1].down = nn.Linear(DIM, width), nn.Linear(width, DIM)
    catch("mlp", lambda: tp.tensor_parallel(bad_mlp))
    catch("column", lambda: tp.ColumnParallelLinear(nn.Linear(4, width)))
    catch("row", lambda: tp.RowParallelLinear(nn.Linear(width, 4)))
    mesh = init_device_mesh("cpu", (world,))
    catch("dtensor heads", lambda: tp.dtensor_parallel(bad_heads, mesh))
    # ranks that disagree on the batch: every rank raises, nobody waits for a tensor of another size
    catch("batch", lambda: tp.train_tp(rank, world, steps=1, seq_len=SEQ_LEN + 4 * (rank == 1)))
    catch("sp seq", lambda: tp.train_tp(rank, world, steps=1, sp=True, seq_len=SEQ_LEN + 1))
    return out


def tp_world(rank: int, world: int) -> dict:
    out = {("ours", sp, dtype): train(rank, world, dtype, sp)
           for sp in (False, True) for dtype in DTYPES}
    for sp, dtype in VOCAB_RUNS:
        out["vocab", sp, dtype] = train(rank, world, dtype, sp, how="vocab")
    try:
        for sp in (False, True):
            for dtype in DTYPES:
                out["dtensor", sp, dtype] = train(rank, world, dtype, sp, how="dtensor")
    except NotImplementedError as exc:            # an op DTensor lacks on this backend
        out["dtensor skipped"] = f"{type(exc).__name__}: {exc}"
    out["isolated"] = isolated(rank, world)
    out["counts"] = {(sp, dtype, vocab): counted_step(sp, dtype, vocab) for sp in (False, True)
                     for dtype in DTYPES for vocab in (False, True)}
    out["errors"] = errors(rank, world)
    # the norms' gradients of sequence parallelism left unsummed: the test below must see it
    sync, tp.sync_sequence_parallel_grads = tp.sync_sequence_parallel_grads, lambda *a: None
    try:
        out["no sync"] = train(rank, world, torch.float64, sp=True)
    finally:
        tp.sync_sequence_parallel_grads = sync
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(tp_world, request.param, backend="gloo", timeout_s=240)


@functools.lru_cache(maxsize=None)
def reference(dtype) -> dict:
    return train(0, 1, dtype, sp=False)


def assert_equal_to_reference(runs: list[dict], dtype) -> None:
    ref, tol = reference(dtype), TOL[dtype]
    for rank, run in enumerate(runs):
        torch.testing.assert_close(torch.tensor(run["loss"], dtype=torch.float64),
                                   torch.tensor(ref["loss"], dtype=torch.float64),
                                   atol=tol, rtol=tol, msg=lambda m: f"rank {rank} loss: {m}")
        assert len(run["params"]) == len(ref["params"])
        for a, b in zip(run["params"], ref["params"]):
            assert a.dtype == dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_tensor_parallel_equals_one_process(world, sp, dtype):
    _, results = world
    assert_equal_to_reference([r["ours", sp, dtype] for r in results], dtype)


@pytest.mark.parametrize(("sp", "dtype"), VOCAB_RUNS, ids=["tp-float64", "tp+sp-float32"])
def test_vocab_parallel_equals_one_process(world, sp, dtype):
    _, results = world
    assert_equal_to_reference([r["vocab", sp, dtype] for r in results], dtype)


def test_vocab_parallel_cross_entropy(world):
    """Per-token losses and the gradient of the logits (gathered) equal F.cross_entropy's."""
    _, results = world
    logits, targets = full_logits()
    logits.requires_grad_()
    loss = F.cross_entropy(logits.view(-1, 64), targets.view(-1), reduction="none")
    weights = torch.arange(1.0, 1 + loss.numel(), dtype=loss.dtype)
    (loss * weights).sum().backward()
    for r in results:
        got_loss, got_grad = r["isolated"]["cross entropy"]
        torch.testing.assert_close(got_loss.view(-1), loss.detach(), atol=1e-12, rtol=0)
        torch.testing.assert_close(got_grad, logits.grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_dtensor_version_equals_one_process(world, sp, dtype):
    _, results = world
    if "dtensor skipped" in results[0]:
        pytest.skip(f"DTensor tensor parallelism on gloo/CPU: {results[0]['dtensor skipped']}")
    assert_equal_to_reference([r["dtensor", sp, dtype] for r in results], dtype)


def test_the_test_can_fail(world):
    """Sequence parallelism without summing the norms' gradients over the ranks drifts away."""
    _, results = world
    ref = reference(torch.float64)
    worst = max((a - b).abs().max().item()
                for a, b in zip(results[0]["no sync"]["params"], ref["params"]))
    assert worst > 1e-6


def test_f_and_g(world):
    p, results = world
    total = p * (p + 1) / 2                       # sum over ranks of (r + 1)
    for rank, r in enumerate(results):
        iso = r["isolated"]
        torch.testing.assert_close(iso["f grad"], torch.full((3,), total, dtype=torch.float64))
        y, grad = iso["g"]
        torch.testing.assert_close(y, torch.full((3,), total, dtype=torch.float64))
        torch.testing.assert_close(grad, torch.full((3,), 2.0, dtype=torch.float64),
                                   msg=lambda m: f"rank {rank}: {m}")


def full_layers():
    """A full MLP and attention layer of tiny_transformer's first block, an input and the
    weights of the loss sum(y * w), drawn from fixed seeds."""
    block = tiny_transformer(SEED, torch.float64).blocks[0]
    up, down, attn = block.up, block.down, block.attn
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, SEQ_LEN, DIM, dtype=torch.float64, generator=g)
    w = torch.randn(2, SEQ_LEN, DIM, dtype=torch.float64, generator=g)
    mlp = nn.Module()
    mlp.up, mlp.down = up, down
    return {"mlp": (mlp, lambda h: down(F.gelu(up(h)))), "attn": (attn, attn)}, x, w


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("name", ["mlp", "attn"])
def test_layer_gradients_equal_the_full_layers(world, name, sp):
    """Column then row (the MLP; q, k, v then proj) gives the full layer's output and the
    gradients of its input and of every weight, gathered."""
    _, results = world
    layers, x, w = full_layers()
    module, fn = layers[name]
    x = x.clone().requires_grad_()
    y = fn(x)
    (y * w).sum().backward()
    expected = dict(module.named_parameters())
    for rank, r in enumerate(results):
        got = r["isolated"][name, sp]
        torch.testing.assert_close(got["y"], y.detach(), atol=1e-12, rtol=0)
        torch.testing.assert_close(got["x grad"], x.grad, atol=1e-12, rtol=0)
        assert set(got["grads"]) == set(expected)
        for pname, g in got["grads"].items():
            torch.testing.assert_close(g, expected[pname].grad, atol=1e-12, rtol=0,
                                       msg=lambda m: f"rank {rank} {pname}: {m}")


@pytest.mark.parametrize("vocab", [False, True], ids=["", "vocab"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_collectives_issued_are_tp_communications(world, sp, dtype, vocab):
    p, results = world
    size = torch.empty((), dtype=dtype).element_size()
    expected = tp.tp_communication(BATCH, SEQ_LEN, DIM, p, size, sp=sp, blocks=2,
                                   vocab_parallel=vocab)
    calls = sorted((name.removesuffix("_grads").removesuffix("_loss"), n)
                   for name, (count, n) in expected.items() for _ in range(count))
    for r in results:
        assert r["counts"][sp, dtype, vocab] == calls


def test_errors_are_clear_and_raised_on_every_rank(world):
    p, results = world
    for r in results:
        e = r["errors"]
        assert set(e) == {"heads", "mlp", "column", "row", "dtensor heads", "batch", "sp seq"}
        assert "ValueError" in e["heads"] and f"heads={1 if p == 2 else p // 2}" in e["heads"]
        assert "ValueError" in e["mlp"] and f"hidden width={4 * p + 1}" in e["mlp"]
        assert "ColumnParallelLinear" in e["column"] and "out_features" in e["column"]
        assert "RowParallelLinear" in e["row"] and "in_features" in e["row"]
        assert "dtensor_parallel" in e["dtensor heads"]
        assert "train_tp" in e["batch"] and "same batch shape" in e["batch"]
        assert "sequence length" in e["sp seq"]


def test_communication_formula():
    comm = tp.tp_communication(2, 8, 32, 4, 4)
    assert comm == {"all_reduce": (4, 2 * 8 * 32 * 4)}
    sp = tp.tp_communication(2, 8, 32, 4, 4, sp=True, blocks=3)
    # per block, sequence parallelism sends what tensor parallelism does: an all-reduce is a
    # reduce-scatter plus an all-gather
    per_block = {k: (4, n) for k, (_, n) in sp.items() if not k.startswith("all_reduce")}
    assert tp.ring_bytes_sent(per_block, 4) == tp.ring_bytes_sent(comm, 4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tp_communication"):
            tp.tp_communication(bad, 8, 32, 4, 4)
    with pytest.raises(ValueError, match="seq=7"):
        tp.tp_communication(2, 7, 32, 4, 4, sp=True)


def test_activation_memory():
    s, b, h, a = 2048, 1, 12288, 96               # GPT-3 175B's layer, as in Korthikanti et al.
    none = tp.activation_bytes(s, b, h, a)
    assert none == s * b * h * (34 + 5 * a * s / h)
    assert tp.activation_bytes(s, b, h, a, tp=1, sp=True) == none
    for t in (2, 4, 8):
        with_tp = tp.activation_bytes(s, b, h, a, tp=t)
        with_sp = tp.activation_bytes(s, b, h, a, tp=t, sp=True)
        assert with_sp == pytest.approx(none / t)
        # what tensor parallelism alone leaves whole: 10 s b h, which sequence parallelism cuts
        assert with_tp - with_sp == pytest.approx(10 * s * b * h * (1 - 1 / t))
    with pytest.raises(ValueError, match="activation_bytes: tp"):
        tp.activation_bytes(s, b, h, a, tp=0)


def test_layers_need_a_process_group():
    with pytest.raises(RuntimeError, match="ColumnParallelLinear: no process group"):
        tp.ColumnParallelLinear(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="tensor_parallel: expected a TinyTransformer"):
        tp.tensor_parallel(nn.Linear(4, 4))

"""Pointer chasing: the chain is one cycle through every 128-byte slot, the reference follows it, bad input is
refused, and (on a GPU) both CUDA versions land on the reference's index, or report an invalid chain."""

from __future__ import annotations

import pytest
import torch

from conftest import poison_allocator
from snippets.part2 import latency as lt

CUDA_FNS = {"v1": lt.pointer_chase_cuda, "v2": lt.pointer_chase_cuda_cg}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _visit_order(buf: torch.Tensor) -> list[int]:
    """The slots in the order the chain visits them, starting from slot 0, until it comes back to a slot."""
    heads = (buf[:: lt.SLOT_WORDS] // lt.SLOT_WORDS).tolist()
    order, seen, slot = [], set(), 0
    while slot not in seen:
        seen.add(slot)
        order.append(slot)
        slot = heads[slot]
    return order


# ---------------------------------------------------------------- the chain (CPU)

@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("slots", [1, 2, 3, 37, 1024, 4097])
def test_chain_is_one_cycle_through_every_slot(slots):
    buf = lt.make_chain(slots * lt.SLOT_BYTES, _gen(slots))
    assert buf.dtype == torch.int32 and buf.shape == (slots * lt.SLOT_WORDS,)
    heads = buf[:: lt.SLOT_WORDS]
    assert (heads % lt.SLOT_WORDS == 0).all() and (heads >= 0).all() and (heads < buf.numel()).all()
    order = _visit_order(buf)
    assert sorted(order) == list(range(slots))  # every slot once before any repeats ...
    assert heads[order[-1]] == 0  # ... and the last one leads back to the start: a single cycle
    others = buf.view(slots, lt.SLOT_WORDS)[:, 1:]
    assert (others == 0).all()  # only the first word of each line is part of the chain


@pytest.mark.op("pointer_chase")
def test_chain_has_no_short_cycles_in_many_draws():
    """A random permutation of n slots is usually several cycles; linking a random order never is."""
    for seed in range(50):
        buf = lt.make_chain(64 * lt.SLOT_BYTES, _gen(seed))
        assert len(_visit_order(buf)) == 64


@pytest.mark.op("pointer_chase")
def test_chain_is_random_and_seeded():
    a = lt.make_chain(4096 * lt.SLOT_BYTES, _gen(1))
    assert torch.equal(a, lt.make_chain(4096 * lt.SLOT_BYTES, _gen(1)))
    assert not torch.equal(a, lt.make_chain(4096 * lt.SLOT_BYTES, _gen(2)))
    steps = torch.tensor(_visit_order(a)).diff().abs()
    assert (steps > 1).float().mean() > 0.99  # almost never to a neighbouring line: nothing to prefetch


@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("nbytes, exc, words", [
    (100, ValueError, "nbytes must be >= 128"),
    (0, ValueError, "nbytes must be >= 128"),
    (200, ValueError, "multiple of 128"),
    (4096.0, TypeError, "nbytes must be a Python int"),
])
def test_make_chain_refuses_bad_sizes(nbytes, exc, words):
    with pytest.raises(exc, match=words):
        lt.make_chain(nbytes)


# ---------------------------------------------------------------- the reference (CPU)

@pytest.mark.op("pointer_chase")
def test_reference_follows_the_cycle():
    buf = lt.make_chain(37 * lt.SLOT_BYTES, _gen(3))
    order = _visit_order(buf)
    for k in (1, 2, 5, 36, 37, 38, 1000):
        out = lt.pointer_chase_ref(buf, k)
        assert out.dtype == torch.int32 and out.shape == (1,)
        assert out.item() == order[k % 37] * lt.SLOT_WORDS


@pytest.mark.op("pointer_chase")
def test_cost_model_and_sweep():
    op = lt.pointer_chase
    assert op.metric == "ns/access" and op.ceiling is None and op.kind == "micro" and "v0" not in op.impls
    assert op.accesses({"bytes": 4096, "iters": 77}, torch.int32) == 77
    assert op.rate({"bytes": 4096, "iters": 1000}, torch.int32, 1.0) == pytest.approx(1000.0)  # 1 ms / 1000
    sizes = [s["bytes"] for s in op.sweep]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes) and op.headline == op.sweep[-1]
    assert op.headline["bytes"] == 2**30


# ---------------------------------------------------------------- refusing bad input

@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("iters, exc, words", [(0, ValueError, "iters must be >= 1"),
                                               (-3, ValueError, "iters must be >= 1"),
                                               (2.0, TypeError, "iters must be a Python int"),
                                               (True, TypeError, "iters must be a Python int")])
def test_bad_iters_refused(version, iters, exc, words):
    """Checked before the tensor, so this runs on any machine."""
    with pytest.raises(exc, match=words):
        CUDA_FNS[version](lt.make_chain(4096), iters)


@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
def test_refuses_host_buffer(version):
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[version](lt.make_chain(4096), 10)


@pytest.mark.gpu
@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("make, exc, words", [
    (lambda: lt.make_chain(4096, device="cuda").long(), TypeError, "dtype"),
    (lambda: lt.make_chain(4096, device="cuda").float(), TypeError, "dtype"),
    (lambda: lt.make_chain(4096, device="cuda")[:0], ValueError, "empty"),
    (lambda: lt.make_chain(4096, device="cuda").view(32, 32), ValueError, "one-dimensional"),
    (lambda: lt.make_chain(4096, device="cuda")[::2], ValueError, "contiguous"),
    (lambda: lt.make_chain(4096).tolist(), TypeError, "torch.Tensor"),
])
def test_bad_buffer_refused(version, make, exc, words):
    with pytest.raises(exc, match=words):
        CUDA_FNS[version](make(), 10)


@pytest.mark.gpu
@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("bad", [-1, -2**31, 1024, 2**31 - 1])
@pytest.mark.parametrize("where", [0, 32, 1023])
def test_invalid_chain_reported_not_chased(version, bad, where):
    """An entry outside [0, numel) anywhere in buf (on the chain or not): the result is -1, and nothing is read
    out of bounds (a later CUDA call still works)."""
    buf = lt.make_chain(4096, _gen(), device="cuda")
    buf[where] = bad
    assert CUDA_FNS[version](buf, 1000).item() == -1
    good = lt.make_chain(4096, _gen(), device="cuda")
    assert CUDA_FNS[version](good, 1000).item() == lt.pointer_chase_ref(good, 1000).item()


# ---------------------------------------------------------------- the CUDA versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("pointer_chase")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("nbytes", [128, 31 * 128, 4096, 256 * 1024, 256 * 1024 + 128, 3 * 2**20 + 384])
@pytest.mark.parametrize("iters", [1, 2, 31, 32, 33, 1000, 20_000])
def test_cuda_matches_reference(version, nbytes, iters):
    buf = lt.make_chain(nbytes, _gen(nbytes + iters), device="cuda")
    before = buf.clone()
    poison_allocator(4, "cuda")
    out = CUDA_FNS[version](buf, iters)
    assert out.dtype == torch.int32 and out.shape == (1,) and out.device.type == "cuda"
    assert out.item() == lt.pointer_chase_ref(buf, iters).item() != -1
    assert torch.equal(buf, before)  # the chase only reads


@pytest.mark.gpu
@pytest.mark.op("pointer_chase")
def test_cuda_at_the_headline_size():
    """1 GiB: 8M slots, word indices up to 2^28; a short chase so the test stays fast."""
    if torch.cuda.mem_get_info()[0] < 3 * 2**30:
        pytest.skip("needs 3 GiB of free GPU memory")
    buf = lt.make_chain(2**30, _gen(), device="cuda")
    for fn in CUDA_FNS.values():
        assert fn(buf, 5000).item() == lt.pointer_chase_ref(buf, 5000).item()

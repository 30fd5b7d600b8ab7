"""SGEMM v14 (snippets/part3/sgemm_v14.py, csrc/sgemm/v14_streamk.cu): stream-K for the last waves.

On a CPU: the plan (blocks, data-parallel waves) and the shares of K-steps, walked exactly as the kernel walks
them, cover every K-step of every tile once; the blocks that meet in a split tile are the ones share_owner
names, and their workspace slots never collide; the kernel file's share arithmetic is the Python one; a model
of the whole schedule in float32 (partials summed in block order) computes the product; bad input is refused.
On a GPU: every configuration against float64 at ragged shapes, at shapes with data-parallel waves and a
stream-K part, and bit-identical results from call to call."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import poison_allocator
from snippets import cuda
from snippets.part3 import sgemm_v14 as sk
from snippets.part3.sgemm import tolerance_for_k


def _schedule(tiles: int, steps: int, slots: int):
    """What each block of v14's kernel computes, in its order: (block, tile, t0, t1) segments, walked with the
    kernel's loop (data-parallel waves first, then the block's share of the rest)."""
    blocks, dp = sk.streamk_plan(tiles, steps, slots)
    segments = [(b, w * blocks + b, 0, steps) for b in range(blocks) for w in range(dp)]
    first = dp * blocks
    total = (tiles - first) * steps
    for b in range(blocks):
        g, end = sk.share_begin(b, total, blocks), sk.share_begin(b + 1, total, blocks)
        while g < end:
            tile, t0 = divmod(g, steps)
            t1 = min(steps, t0 + end - g)
            segments.append((b, first + tile, t0, t1))
            g += t1 - t0
    return blocks, dp, segments


PLAN_CASES = [(1024, 512, 264), (4096, 1024, 264), (512, 512, 132), (1056, 512, 264), (64, 128, 264),
              (1, 1, 264), (3, 2, 264), (7, 1, 4), (265, 3, 264), (527, 5, 264), (10, 100, 3), (1000, 1, 132)]


@pytest.mark.parametrize("tiles, steps, slots", PLAN_CASES)
def test_every_k_step_of_every_tile_once(tiles, steps, slots):
    blocks, dp, segments = _schedule(tiles, steps, slots)
    assert 1 <= blocks <= slots and dp * blocks <= tiles
    covered = np.zeros((tiles, steps), dtype=int)
    for _, tile, t0, t1 in segments:
        assert 0 <= t0 < t1 <= steps, "an empty or out-of-range segment"
        covered[tile, t0:t1] += 1
    assert (covered == 1).all()
    # the shared-out part is one to two waves' worth when there are more tiles than slots, none when
    # the waves are whole
    shared = tiles - dp * blocks
    if tiles >= slots:
        assert shared == 0 if tiles % slots == 0 else slots < shared < 2 * slots
    # no share is empty (the kernel's owner arithmetic needs it)
    total = shared * steps
    assert all(sk.share_begin(b + 1, total, blocks) > sk.share_begin(b, total, blocks)
               for b in range(blocks)) or shared == 0


@pytest.mark.parametrize("tiles, steps, slots", PLAN_CASES)
def test_split_tiles_meet_their_owners_in_distinct_slots(tiles, steps, slots):
    blocks, dp, segments = _schedule(tiles, steps, slots)
    first = dp * blocks
    total = (tiles - first) * steps
    by_tile: dict[int, list[int]] = {}
    slots_used: dict[tuple[int, int], int] = {}  # (block, slot) -> tile
    for b, tile, t0, t1 in segments:
        if t0 == 0 and t1 == steps:
            continue
        by_tile.setdefault(tile, []).append(b)
        g0 = (tile - first) * steps
        slot = 2 * b + (0 if sk.share_begin(b, total, blocks) >= g0 else 1)
        assert slots_used.setdefault((b, slot), tile) == tile, "two tiles of one block in one slot"
    for tile, owners in by_tile.items():
        g0 = (tile - first) * steps
        lo, hi = sk.share_owner(g0, total, blocks), sk.share_owner(g0 + steps - 1, total, blocks)
        assert owners == list(range(lo, hi + 1)), f"tile {tile}: owners {owners}, counted {lo}..{hi}"
        assert len(owners) >= 2


def test_share_owner_inverts_share_begin():
    for total, blocks in [(1, 1), (7, 3), (100, 100), (513, 264), (5 * 512, 264), (10**9 + 7, 264)]:
        for b in {0, blocks // 2, blocks - 1}:
            g0, g1 = sk.share_begin(b, total, blocks), sk.share_begin(b + 1, total, blocks) - 1
            for g in (g0, g1, (g0 + g1) // 2):
                assert sk.share_owner(g, total, blocks) == b


def test_kernel_file_has_the_same_share_arithmetic():
    text = cuda.source_path(sk.V14_FILE).read_text()
    assert "return (long long)b * I / P;" in text
    assert "return (int)(((g + 1) * P + I - 1) / I) - 1;" in text
    # the slot rule and the last-arrival test the schedule tests model
    assert "2 * owner + (share_begin(owner, I, P) >= tile_g0 ? 0 : 1)" in text
    assert "atomicAdd(&arrived[tile], 1) == hi - lo" in text


def _model(a: np.ndarray, b: np.ndarray, bm: int, bn: int, bk: int, slots: int) -> np.ndarray:
    """C as v14 computes it, in float32: each segment's partial over its K-steps, a split tile's partials
    summed in block order starting from zero (the kernel's fixup)."""
    m, k = a.shape
    n = b.shape[1]
    tm, tn, steps = -(-m // bm), -(-n // bn), -(-k // bk)
    _, _, segments = _schedule(tm * tn, steps, slots)
    c = np.full((m, n), np.nan, dtype=np.float32)
    parts: dict[int, list[tuple[int, np.ndarray]]] = {}
    for blk, tile, t0, t1 in segments:
        r, col = divmod(tile, tn)   # plain order (the grouped order only permutes tiles)
        rs, cs, ks = slice(r * bm, (r + 1) * bm), slice(col * bn, (col + 1) * bn), slice(t0 * bk, t1 * bk)
        part = (a[rs, ks].astype(np.float32) @ b[ks, cs].astype(np.float32)).astype(np.float32)
        if t0 == 0 and t1 == steps:
            c[rs, cs] = part
        else:
            parts.setdefault(tile, []).append((blk, part))
    for tile, ps in parts.items():
        r, col = divmod(tile, tn)
        s = np.zeros_like(ps[0][1])
        for _, p in sorted(ps, key=lambda x: x[0]):
            s = s + p
        c[r * bm:(r + 1) * bm, col * bn:(col + 1) * bn] = s
    return c


@pytest.mark.parametrize("m, n, k, slots", [(130, 260, 37, 4), (256, 128, 48, 3), (300, 520, 64, 5),
                                            (17, 33, 9, 264), (1000, 1000, 24, 7)])
def test_schedule_model_computes_the_product(m, n, k, slots):
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c = _model(a, b, 128, 128, 8, slots)
    rtol, atol = tolerance_for_k(k)
    np.testing.assert_allclose(c, a @ b, rtol=rtol, atol=atol)


def test_plan_refuses_nonsense():
    for args in [(0, 1, 1), (1, 0, 1), (1, 1, 0)]:
        with pytest.raises(ValueError, match="must be >= 1"):
            sk.streamk_plan(*args)


def test_configs_are_the_instantiated_kernels():
    (option,) = sk.V14_OPTIONS
    params = [tuple(int(v) for v in g.split(",")) for g in re.findall(r"SGEMM_STREAMK\(([^)]*)\)", option)]
    assert params == list(sk.STREAMK)
    # the file's own default is the first configuration
    text = cuda.source_path(sk.V14_FILE).read_text()
    assert f"#define SGEMM_STREAMK_CONFIGS SGEMM_STREAMK({', '.join(map(str, sk.STREAMK[0]))})" in text
    assert [c.kernel for c in sk.STREAMK_CONFIGS][0] == "sgemm_sk_128x128_k8_w64x64_t128_g8_p4"


@pytest.mark.parametrize("a, b, exc, words", [
    (torch.ones(4, 4), torch.ones(4, 4), ValueError, "cuda"),
    (torch.ones(4, 4, requires_grad=True), torch.ones(4, 4), (RuntimeError, ValueError, TypeError), "grad"),
])
def test_bad_input_refused_before_launch(a, b, exc, words):
    with pytest.raises(exc, match=words):
        sk.sgemm_streamk(a, b)


# ---------------------------------------------------------------- GPU

def _check(c, a, b, label):
    m, k = a.shape
    assert c.shape == (m, b.shape[1]) and not c.isnan().any(), f"{label}: unwritten outputs"
    rtol, atol = tolerance_for_k(k)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


def _operands(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(m, k, generator=g, device="cuda"), torch.randn(k, n, generator=g, device="cuda")


SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (300, 1, 5), (5, 7, 300), (257, 255, 33), (384, 130, 136),
          (1100, 900, 70)]


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sk.STREAMK_CONFIGS, ids=lambda c: c.kernel)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_every_config_matches_float64(cfg, m, n, k):
    a, b = _operands(m, n, k, seed=m + n + k)
    poison_allocator(m * n * 4, "cuda")
    _check(sk.launch_streamk(a, b, cfg), a, b, f"{cfg.kernel} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sk.STREAMK_CONFIGS, ids=lambda c: c.kernel)
def test_waves_and_stream_k_together(cfg):
    """4096 x 4096 tiles of C with a short K: several data-parallel waves and a stream-K part on any GPU of
    more than a few SMs; K = 40 is five steps of BK = 8, so shares cut tiles mid-K."""
    a, b = _operands(4096, 4096, 40, seed=7)
    fn = cuda.kernel(sk.V14_FILE, cfg.kernel, sk.V14_OPTIONS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = (4096 // cfg.bm) * (4096 // cfg.bn)
    blocks, dp = sk.streamk_plan(tiles, -(-40 // cfg.bk), sms * cuda.resident_blocks(fn, cfg.threads))
    assert dp >= 1 and tiles > dp * blocks, "the shape should exercise both parts"
    poison_allocator(4096 * 4096 * 4, "cuda")
    _check(sk.launch_streamk(a, b, cfg), a, b, f"{cfg.kernel} 4096x4096x40")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_split_tiles_sum_the_same_way_every_call():
    a, b = _operands(1100, 900, 4000, seed=3)
    first = sk.sgemm_streamk(a, b)
    for _ in range(3):
        assert torch.equal(sk.sgemm_streamk(a, b), first)
    _check(first, a, b, "v14 1100x900x4000")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("shapes, dtype, exc, words", [
    (((4, 4), (4, 4)), torch.float64, (TypeError, ValueError), "float32"),
    (((4, 3), (4, 4)), torch.float32, ValueError, "inner dimensions"),
    (((4,), (4, 4)), torch.float32, ValueError, "2-D"),
])
def test_gpu_bad_input_refused(shapes, dtype, exc, words):
    a, b = (torch.ones(s, dtype=dtype, device="cuda") for s in shapes)
    with pytest.raises(exc, match=words):
        sk.sgemm_streamk(a, b)


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_autotune_picks_once_per_shape():
    a, b = _operands(256, 384, 64)
    sk._TUNED.clear()
    first = sk.autotune_streamk(a, b)
    assert first in sk.STREAMK_CONFIGS and list(sk._TUNED.values()) == [first]
    assert sk.autotune_streamk(a, b) is first

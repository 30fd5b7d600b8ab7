"""SGEMM beyond the generic reference check: every version on ragged shapes against float64 with a tolerance
scaled to K, the float4 paths and their scalar fallbacks, IEEE fp32 (not TF32) in v0, and clear refusal of
what the kernels cannot take."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import poison_allocator
from snippets.part3 import sgemm as sg
from snippets.part3 import sgemm_v14 as sg14  # registers v14, in a module of its own
from snippets.part3 import sgemm_v15 as sg15  # registers v15, in a module of its own

VERSIONS = {
    "v0": sg.sgemm_cublas, "v1": sg.sgemm_naive, "v2": sg.sgemm_coalesced, "v3": sg.sgemm_smem,
    "v4": sg.sgemm_1d_tiling, "v5": sg.sgemm_2d_tiling, "v6": sg.sgemm_vectorized, "v7": sg.sgemm_warptile,
    "v8": sg.sgemm_double_buffer, "v11": sg.sgemm_tuned, "v12": sg.sgemm_autotuned, "v13": sg.sgemm_async,
    "v14": sg14.sgemm_streamk, "v15": sg15.sgemm_interior,
}
# (M, N, K): the brief's edge cases; then shapes that cut the 128 x 128 x 8 tiles in every direction, row
# lengths that are multiples of 4 (float4 paths with partial tiles) and ones that are not (scalar fallback),
# K shorter than one BK step, and several whole tiles.
SHAPES = [(1, 1, 1), (17, 33, 9), (64, 64, 64), (127, 129, 65), (256, 192, 320),
          (1, 300, 7), (300, 1, 5), (5, 7, 300), (129, 131, 3), (132, 136, 12), (260, 4, 20), (4, 260, 8),
          (33, 64, 17), (256, 256, 256), (384, 130, 136)]


def _check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, label: str) -> None:
    m, k = a.shape
    n = b.shape[1]
    assert c.shape == (m, n) and c.dtype == torch.float32 and c.device == a.device and c.is_contiguous()
    ref = a.double() @ b.double()
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = sg.tolerance_for_k(k)
    torch.testing.assert_close(c.double(), ref, rtol=rtol, atol=atol, msg=lambda s: f"{label}: {s}")


def _operands(m, n, k, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(m, k, generator=g, device=device), torch.randn(k, n, generator=g, device=device))


# ---------------------------------------------------------------- CPU: the reference and the checks

@pytest.mark.op("sgemm")
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 33, 9), (5, 3, 40)])
def test_reference_is_a_sum_of_outer_products(m, n, k):
    a, b = _operands(m, n, k, "cpu")
    expected = a.double() @ b.double()
    torch.testing.assert_close(sg.sgemm_ref(a.double(), b.double()), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sg._reference(a.double(), b.double()), expected, rtol=1e-12, atol=1e-12)


def _bad_operands(device):
    a, b = _operands(6, 5, 4, device)
    return [
        ("float64 a", (a.double(), b), TypeError, "dtype"),
        ("float16 b", (a, b.half()), TypeError, "dtype"),
        ("int32", (a.int(), b.int()), TypeError, "dtype"),
        ("inner dims differ", (a, torch.randn(5, 5, device=device)), ValueError, "inner dimensions"),
        ("1-D a", (a.reshape(-1), b), ValueError, "2-D"),
        ("3-D b", (a, b.reshape(2, 2, 5)), ValueError, "2-D"),
        ("transposed a", (torch.randn(4, 6, device=device).t(), b), ValueError, "contiguous"),
        ("column slice b", (a, torch.randn(4, 10, device=device)[:, :5]), ValueError, "contiguous"),
        ("empty a", (a[:0], b), ValueError, "empty"),
        ("empty k", (torch.randn(6, 0, device=device), torch.randn(0, 5, device=device)), ValueError, "empty"),
        ("not a tensor", (a.tolist(), b), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("case", range(len(_bad_operands("cpu"))))
def test_check_operands_refuses(case):
    """The shared check, run on CPU tensors with device="cpu": what every version refuses before launching."""
    label, args, exc, words = _bad_operands("cpu")[case]
    with pytest.raises(exc, match=words):
        sg.check_operands(*args, device="cpu")


@pytest.mark.op("sgemm")
def test_check_operands_returns_sizes():
    a, b = _operands(6, 5, 4, "cpu")
    assert sg.check_operands(a, b, device="cpu") == (6, 5, 4)


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_cpu_tensors_refused(version):
    """CPU tensors are refused with a ValueError naming the device, before any GPU is needed."""
    a, b = _operands(8, 8, 8, "cpu")
    with pytest.raises(ValueError, match="cuda device"):
        VERSIONS[version](a, b)


@pytest.mark.op("sgemm")
def test_configs_match_the_ladder():
    # v12 picks one of TUNED_CONFIGS per shape; v13 is sg.V13, the first of ASYNC_CONFIGS; v14 picks one of
    # sgemm_v14.STREAMK_CONFIGS; v15 one of TUNED
    assert set(sg.CONFIGS) == set(VERSIONS) - {"v0", "v12", "v13", "v14", "v15"}
    assert set(sg.sgemm.impls) == set(VERSIONS) | {"v9", "v10"}  # v9, v10: the CPU comparison
    per_thread = {name: cfg.results_per_thread for name, cfg in {**sg.CONFIGS, "v13": sg.V13}.items()}
    assert per_thread == {"v1": 1, "v2": 1, "v3": 1, "v4": 8, "v5": 64, "v6": 64, "v7": 64, "v8": 64, "v11": 128,
                          "v13": 128}


@pytest.mark.op("sgemm")
def test_tuned_configs_are_the_instantiated_kernels():
    """v11_tuned.cu instantiates one kernel per entry of TUNED, the list sgemm.py passes to the compiler
    (-D SGEMM_TUNED_CONFIGS), and TUNED_CONFIGS sizes their grids: the option must carry every entry, in
    order, and each kernel name must spell out its launch numbers. (tests/test_cuda_compile.py compiles the
    file with the option and compares the kernels it gets with these names.)"""
    import re

    (option,) = sg.CU_OPTIONS[sg.TUNED_CONFIGS[0].path]
    params = [tuple(int(v) for v in m.split(",")) for m in re.findall(r"SGEMM_TUNED\(([^)]*)\)", option)]
    assert params == list(sg.TUNED) and len(params) == len(sg.TUNED_CONFIGS) >= 2
    for (bm, bn, bk, wm, wn, nt, g, pad), cfg in zip(params, sg.TUNED_CONFIGS):
        assert cfg.kernel == f"sgemm_t_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{nt}_g{g}_p{pad}"
        assert cfg.tile == (bm, bn) and cfg.bk == bk and cfg.threads == (nt,)
        # a lane owns (wm / 32) x (wn / 16) pieces of 4 x 4 results; one warp per warp tile
        assert wm % 32 == 0 and wn % 16 == 0 and (bm // wm) * (bn // wn) * 32 == nt
    assert sg.CONFIGS["v11"] == sg.TUNED_CONFIGS[0]
    assert len({c.kernel for c in sg.TUNED_CONFIGS}) == len(sg.TUNED_CONFIGS)


@pytest.mark.op("sgemm")
def test_slow_steps_skip_only_the_largest_size():
    """The naive steps and CPU versions are timed up to 4096^3 (always at the headline), the rest everywhere."""
    big = {"m": 8192, "n": 8192, "k": 8192}
    assert big in sg.SWEEP
    skipped = {name for name, impl in sg.sgemm.impls.items() if not impl.benched_at(big, sg.HEADLINE)}
    assert skipped == {"v1", "v2", "v3", "v9", "v10"}
    assert all(impl.benched_at(sg.HEADLINE, sg.HEADLINE) for impl in sg.sgemm.impls.values())


@pytest.mark.op("sgemm")
def test_tolerance_scales_with_k():
    assert sg.tolerance_for_k(4096)[1] > sg.tolerance_for_k(64)[1] > sg.tolerance_for_k(1)[1] > 0
    assert sg.sgemm.tolerance(torch.float32) == sg.tolerance_for_k(8192)


# ---------------------------------------------------------------- GPU: every version

@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_versions_match_float64(version, m, n, k):
    a, b = _operands(m, n, k, "cuda", seed=m * 1_000_003 + n * 1009 + k)
    poison_allocator(m * n * 4, "cuda")
    _check(VERSIONS[version](a, b), a, b, f"{version} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", ["v6", "v7", "v8", "v11", "v12", "v13", "v14", "v15"])
def test_vector_paths_misaligned_views(version):
    """Operands whose base is not 16-byte aligned (a view one float into a buffer) take the scalar path of the
    float4 kernels even when the row lengths are multiples of 4."""
    m, n, k = 130, 132, 24
    buf_a = torch.randn(m * k + 1, device="cuda")
    buf_b = torch.randn(k * n + 1, device="cuda")
    a, b = buf_a[1:].view(m, k), buf_b[1:].view(k, n)
    assert a.data_ptr() % 16 != 0 and a.is_contiguous()
    _check(VERSIONS[version](a, b), a, b, f"{version} misaligned")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_special_values(version):
    """Zeros give exact zeros; an infinity in A spreads along its row of C only; identity gives B back."""
    a, b = _operands(70, 90, 33, "cuda")
    assert torch.count_nonzero(VERSIONS[version](torch.zeros_like(a), b)) == 0
    eye = torch.eye(33, device="cuda")
    assert torch.equal(VERSIONS[version](eye, b[:33].contiguous()), b[:33])
    a_inf = a.abs().clone()
    a_inf[5, 3] = float("inf")
    c = VERSIONS[version](a_inf, b.abs().contiguous())
    assert torch.isinf(c[5]).all() and torch.isfinite(torch.cat([c[:5], c[6:]])).all()


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.TUNED_CONFIGS, ids=lambda c: c.kernel)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (127, 129, 65), (257, 255, 33), (300, 1, 5), (384, 130, 136)])
def test_every_tuned_config(cfg, m, n, k):
    """Each configuration v12 may pick is itself correct at ragged shapes (autotuning only picks the fastest)."""
    a, b = _operands(m, n, k, "cuda", seed=m + n + k)
    poison_allocator(m * n * 4, "cuda")
    _check(sg._launch_sgemm(a, b, cfg), a, b, f"{cfg.kernel} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_autotune_picks_once_per_shape():
    a, b = _operands(256, 384, 64, "cuda")
    sg._TUNED.clear()
    first = sg.autotune(a, b)
    assert first in sg.TUNED_CONFIGS and list(sg._TUNED.values()) == [first]
    assert sg.autotune(a, b) is first  # remembered, not re-timed
    sg.autotune(a[:, :32].contiguous(), b[:32].contiguous())
    assert len(sg._TUNED) == 2  # a new shape is tuned on its own


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_v0_is_ieee_fp32_and_restores_the_flag():
    """With TF32 on, cuBLAS would round the inputs to 10-bit mantissas: an error ~100 times the fp32 one at
    K = 320, far outside tolerance_for_k. v0 must turn it off and put the caller's setting back."""
    a, b = _operands(256, 192, 320, "cuda")
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for setting in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = setting
            _check(sg.sgemm_cublas(a, b), a, b, f"v0 with allow_tf32={setting}")
            assert torch.backends.cuda.matmul.allow_tf32 is setting
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("case", range(len(_bad_operands("cpu"))))
def test_gpu_bad_input_refused(version, case):
    label, args, exc, words = _bad_operands("cuda")[case]
    with pytest.raises(exc, match=words):
        VERSIONS[version](*args)


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_grid_limit_refused():
    """v5's grid puts tiles of 128 rows on gridDim.y: more than 65535 of them is refused, not launched."""
    a = torch.empty((128 * 65535 + 1, 1), device="cuda")
    b = torch.empty((1, 1), device="cuda")
    with pytest.raises(ValueError, match="gridDim.y"):
        sg.sgemm_2d_tiling(a, b)



# ---------------------------------------------------------------- v13 (csrc/part3/sgemm/v13_async.cu)
# The kernel's index math, written again in Python (checked against the CUDA functions themselves by
# test_v13_layout_functions_match_the_cuda_source), then a model of the whole kernel built from it: which
# thread copies which 16-byte chunk of which stage, when each group of copies lands, which elements each lane
# multiplies and where it stores them. The model runs at the real tile sizes on small ragged shapes.

def _sa_offset(r: int, k: int, bk: int) -> int:
    """sa_offset<BK>: A[r][k] of the tile in its K-major stage, rows padded to BK + 4 floats."""
    return r * (bk + 4) + k


def _a_chunk(idx: int, bk: int) -> tuple[int, int]:
    """a_chunk<BK>: (row, first column) of the A tile's chunk that copy number idx fetches."""
    cpr = bk // 4
    return idx % 8 + 8 * (idx // (8 * cpr)), (idx // 8) % cpr * 4


def _b_chunk(idx: int, bn: int) -> tuple[int, int]:
    """load_stage's B order: chunks numbered along the rows of the (BK, BN) tile."""
    return idx // (bn // 4), (idx % (bn // 4)) * 4


def _lane(cfg: tuple, tid: int) -> tuple[int, int, int, int]:
    """(wm0, wn0, lm, ln): the warp tile's corner in the block tile and the lane's place in the 8 x 4 grid."""
    bm, bn, bk, wm, wn, nt, stages, group = cfg
    warp, lane = divmod(tid, 32)
    return (warp // (bn // wn)) * wm, (warp % (bn // wn)) * wn, lane // 4, lane % 4


def _lane_rows(cfg: tuple, tid: int) -> list[int]:
    """The rows of the block tile lane tid owns: lm + 8 i of its warp tile."""
    wm0, _, lm, _ = _lane(cfg, tid)
    return [wm0 + lm + 8 * i for i in range(cfg[3] // 8)]


def _lane_cols(cfg: tuple, tid: int) -> list[int]:
    """The columns lane tid owns: NI runs of 4 at jn * (WN / NI) + ln * 4 of its warp tile."""
    _, wn0, _, ln = _lane(cfg, tid)
    ni = cfg[4] // 16
    return [wn0 + jn * (cfg[4] // ni) + ln * 4 + j for jn in range(ni) for j in range(4)]


def _block_tile(pid: int, grid_x: int, grid_y: int, group: int) -> tuple[int, int]:
    """(tile row, tile column) of block pid = blockIdx.y * gridDim.x + blockIdx.x: v12's grouped order."""
    if group == 0:
        return pid // grid_x, pid % grid_x
    per_group = group * grid_x
    first = (pid // per_group) * group
    rows = min(grid_y - first, group)
    return first + (pid % per_group) % rows, (pid % per_group) // rows


def _load4(x: np.ndarray, r: int, c: int, vec: bool) -> np.ndarray:
    """load4 of common.cuh (and cp.async with src-size 0 outside): 4 floats of row r from column c, zeros
    outside. On the vector path a chunk is wholly inside or wholly outside."""
    rows, cols = x.shape
    out = np.zeros(4)
    if r >= rows:
        return out
    if vec:
        if c < cols:
            assert c + 4 <= cols, "a vector chunk crosses the end of a row"
            out[:] = x[r, c:c + 4]
        return out
    for j in range(4):
        if c + j < cols:
            out[j] = x[r, c + j]
    return out


def _emulate_v13(cfg: tuple, a: np.ndarray, b: np.ndarray, vec: bool) -> np.ndarray:
    """C = A @ B as v13's kernel computes it, in float64. Shared memory starts as NaN (an element read before
    a copy wrote it poisons the result); a group of copies lands only when cp_async_wait lets it (and the
    model checks that no copy in flight targets the stage being read); every C element must be stored once."""
    bm, bn, bk, wm, wn, nt, stages, group = cfg
    m, k = a.shape
    n = b.shape[1]
    sa, sb = bm * (bk + 4), bk * bn
    a4, b4 = bm * bk // 4 // nt, bk * bn // 4 // nt
    # per lane: the offsets its FMAs read, relative to the stage: A (nt, TM, BK) and B (nt, BK, TN)
    aoff = np.array([[[_sa_offset(r, kk, bk) for kk in range(bk)] for r in _lane_rows(cfg, t)]
                     for t in range(nt)])
    boff = np.array([[[kk * bn + col for col in _lane_cols(cfg, t)] for kk in range(bk)] for t in range(nt)])
    grid_x, grid_y, tiles = -(-n // bn), -(-m // bm), -(-k // bk)
    c = np.full((m, n), np.nan)
    stores = np.zeros((m, n), dtype=int)
    seen_tiles = set()
    for pid in range(grid_x * grid_y):
        tile_m, tile_n = _block_tile(pid, grid_x, grid_y, group)
        assert 0 <= tile_m < grid_y and 0 <= tile_n < grid_x
        seen_tiles.add((tile_m, tile_n))
        row0, col0 = tile_m * bm, tile_n * bn
        smem = np.full(stages * (sa + sb), np.nan)

        def issue(t):
            s, writes = t % stages, []
            for tid in range(nt):
                for i in range(a4):
                    r, cc = _a_chunk(tid + i * nt, bk)
                    writes.append((s * sa + _sa_offset(r, cc, bk), _load4(a, row0 + r, t * bk + cc, vec), s))
                for i in range(b4):
                    r, cc = _b_chunk(tid + i * nt, bn)
                    writes.append((stages * sa + s * sb + r * bn + cc, _load4(b, t * bk + r, col0 + cc, vec), s))
            offsets = [w[0] for w in writes]
            assert len(set(offsets)) == len(offsets) == (bm * bk + bk * bn) // 4, "every chunk copied once"
            assert all(o % 4 == 0 for o in offsets), "16-byte aligned shared addresses"
            assert all(s * sa <= o < s * sa + sa or stages * sa + s * sb <= o < stages * sa + (s + 1) * sb
                       for o in offsets), "copies stay in their stage"
            return writes

        pending = [issue(s) if s < tiles else [] for s in range(stages - 1)]
        acc = np.zeros((nt, wm // 8, wn // 4))  # (nt, TM, TN) accumulators
        for t in range(tiles):
            while len(pending) > stages - 2:  # cp_async_wait<STAGES - 2>
                for off, vals, _ in pending.pop(0):
                    smem[off:off + 4] = vals
            nxt = t + stages - 1
            pending.append(issue(nxt) if nxt < tiles else [])
            cur = t % stages
            assert all(w[2] != cur for g in pending for w in g), "a copy in flight targets the stage being read"
            a_vals, b_vals = smem[cur * sa + aoff], smem[stages * sa + cur * sb + boff]
            acc += np.einsum("tik,tkj->tij", a_vals, b_vals)
        for tid in range(nt):
            for i, r in enumerate(_lane_rows(cfg, tid)):
                cols = _lane_cols(cfg, tid)
                for jn in range(0, len(cols), 4):
                    rr, cc = row0 + r, col0 + cols[jn]
                    assert cols[jn:jn + 4] == list(range(cols[jn], cols[jn] + 4)), "a float4 of C"
                    if rr >= m or cc >= n:  # store4: nothing outside C
                        continue
                    assert not vec or cc + 4 <= n, "a vector store crosses the end of a row"
                    width = 4 if vec else min(4, n - cc)  # the float4, or the guarded scalars inside
                    c[rr, cc:cc + width] = acc[tid, i, jn:jn + width]
                    stores[rr, cc:cc + width] += 1
    assert len(seen_tiles) == grid_x * grid_y, "the grouped order visits every tile once"
    assert stores.min() == 1 and stores.max() == 1, "every element of C stored exactly once"
    return c


V13_MODEL_SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (130, 260, 37), (129, 257, 20), (256, 128, 48),
                    (33, 64, 17), (264, 136, 100)]


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.ASYNC, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("m, n, k", V13_MODEL_SHAPES)
def test_v13_model_computes_the_product(cfg, m, n, k):
    """The kernel's index math and pipeline, run in the model, give A @ B exactly (float64), on the vector path
    where the row lengths allow it and on the scalar path always."""
    g = np.random.default_rng(m * 1_000_003 + n * 1009 + k)
    a, b = g.standard_normal((m, k)), g.standard_normal((k, n))
    paths = [False] + ([True] if k % 4 == 0 and n % 4 == 0 else [])
    for vec in paths:
        c = _emulate_v13(cfg, a, b, vec)
        assert not np.isnan(c).any()
        np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12, err_msg=f"vec={vec}")


def _conflict_free(words: list[int]) -> bool:
    """A model of one shared-memory wavefront: 32 banks of 4 bytes; the distinct 4-byte words requested
    together must sit in distinct banks (the same word read by several lanes is a broadcast)."""
    banks: dict[int, set[int]] = {}
    for w in set(words):
        banks.setdefault(w % 32, set()).add(w)
    return all(len(ws) == 1 for ws in banks.values())


def _a_reads(cfg: tuple, lda: int, rows=_lane_rows) -> list[list[int]]:
    """Per warp, per (row index i, chunk kc): the words of the A stage its 32 lanes read with one float4 load
    each (rows padded to lda floats)."""
    nt, bk = cfg[5], cfg[2]
    out = []
    for warp in range(nt // 32):
        lanes = range(warp * 32, warp * 32 + 32)
        for i in range(cfg[3] // 8):
            for kc in range(0, bk, 4):
                out.append([rows(cfg, t)[i] * lda + kc + j for t in lanes for j in range(4)])
    return out


def _a_copy_phases(cfg: tuple, lda: int, order=_a_chunk) -> list[list[int]]:
    """Per phase of a 16-byte copy (8 consecutive threads): the words of the A stage it writes."""
    bm, bn, bk, wm, wn, nt = cfg[:6]
    out = []
    for i in range(bm * bk // 4 // nt):
        for p in range(nt // 8):
            chunks = [order(t + i * nt, bk) for t in range(8 * p, 8 * p + 8)]
            out.append([r * lda + c + j for r, c in chunks for j in range(4)])
    return out


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.ASYNC, ids=lambda c: "x".join(map(str, c)))
def test_v13_shared_layout_is_conflict_free(cfg):
    """Rows padded to BK + 4 floats (an odd number of 16-byte chunks) and lane rows 8 apart: every warp-wide A
    read (8 distinct float4s), every B read (4 distinct float4s) and every copy phase of A or B touches each
    bank at most once in the model."""
    bm, bn, bk, wm, wn, nt = cfg[:6]
    lda = bk + 4
    assert all(_conflict_free(w) for w in _a_reads(cfg, lda))
    assert all(_conflict_free(w) for w in _a_copy_phases(cfg, lda))
    ni = wn // 16
    for warp in range(nt // 32):
        lanes = range(warp * 32, warp * 32 + 32)
        for jn in range(ni):
            assert _conflict_free([_lane_cols(cfg, t)[4 * jn + j] for t in lanes for j in range(4)])
    for i in range(bk * bn // 4 // nt):  # B copies: 8 consecutive chunks of a row of B per phase
        for p in range(nt // 8):
            chunks = [_b_chunk(t + i * nt, bn) for t in range(8 * p, 8 * p + 8)]
            assert _conflict_free([r * bn + c + j for r, c in chunks for j in range(4)])


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.ASYNC, ids=lambda c: "x".join(map(str, c)))
def test_v13_conflict_model_sees_the_alternatives(cfg):
    """The model is not vacuous: without the padding, with v11's lane rows (lm * 4 + i % 4, 4 consecutive
    rows a lane) or with the A chunks copied row by row, it finds conflicts."""
    bk = cfg[2]

    def v11_rows(c, t):
        wm0, _, lm, _ = _lane(c, t)
        return [wm0 + (i // 4) * 32 + lm * 4 + i % 4 for i in range(c[3] // 8)]

    def by_rows(idx, bk):
        return idx // (bk // 4), (idx % (bk // 4)) * 4

    assert not all(_conflict_free(w) for w in _a_reads(cfg, bk))
    assert not all(_conflict_free(w) for w in _a_reads(cfg, bk + 4, rows=v11_rows))
    assert not all(_conflict_free(w) for w in _a_copy_phases(cfg, bk + 4, order=by_rows))
    # v11's rows cover the same rows of the block tile: only their assignment to lanes differs
    assert sorted(r for t in range(cfg[5]) for r in v11_rows(cfg, t)) == sorted(
        r for t in range(cfg[5]) for r in _lane_rows(cfg, t))


@pytest.mark.op("sgemm")
def test_v13_configs_are_the_instantiated_kernels():
    """v13_async.cu instantiates one kernel per entry of ASYNC (its default list is the same list, which
    tests/test_cuda_compile.py holds equal); each name spells out its launch numbers, and each fits the
    shared memory of one block on an H100 (227 KiB, above 48 KiB by the opt-in the launcher makes)."""
    import re

    (option,) = sg.ASYNC_OPTIONS
    params = [tuple(int(v) for v in m.split(",")) for m in re.findall(r"SGEMM_ASYNC\(([^)]*)\)", option)]
    assert params == list(sg.ASYNC) and sg.V13 == sg.ASYNC_CONFIGS[0]
    for (bm, bn, bk, wm, wn, nt, stages, g), cfg in zip(params, sg.ASYNC_CONFIGS):
        assert cfg.kernel == f"sgemm_a_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{nt}_s{stages}_g{g}"
        assert cfg.tile == (bm, bn) and cfg.bk == bk and cfg.threads == (nt,) and cfg.stages == stages
        assert wm % 32 == 0 and wn % 16 == 0 and (bm // wm) * (bn // wn) * 32 == nt
        assert cfg.smem == stages * (bm * (bk + 4) + bk * bn) * 4 <= 227 * 1024
        assert bm * bk % (4 * nt) == 0 and bk * bn % (4 * nt) == 0  # whole chunks per thread


@pytest.mark.op("sgemm")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v13_layout_functions_match_the_cuda_source(tmp_path):
    """The model's _sa_offset and _a_chunk are the CUDA functions: a host program that includes
    v13_async.cu (no kernels instantiated, nothing runs on a GPU) prints them for every row, column and copy
    number of both step sizes the model uses."""
    prog = tmp_path / "layout.cu"
    prog.write_text(
        '#include "part3/sgemm/v13_async.cu"\n#include <cstdio>\nint main() {\n'
        "    for (int r = 0; r < 256; ++r) for (int k = 0; k < 32; ++k)\n"
        '        printf("%d %d\\n", sa_offset<16>(r, k), sa_offset<32>(r, k));\n'
        "    for (int i = 0; i < 2048; ++i) { int r, c, r2, c2; a_chunk<16>(i, r, c); a_chunk<32>(i, r2, c2);\n"
        '        printf("%d %d %d %d\\n", r, c, r2, c2); }\n}\n')
    exe = tmp_path / "layout"
    cmd = [shutil.which("nvcc"), "-std=c++17", "-arch=sm_90a", "-I", "csrc", "-I", "csrc/common",
           "-DSGEMM_ASYNC_CONFIGS=", str(prog), "-o", str(exe)]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    expected = [f"{_sa_offset(r, k, 16)} {_sa_offset(r, k, 32)}" for r in range(256) for k in range(32)]
    expected += [" ".join(map(str, (*_a_chunk(i, 16), *_a_chunk(i, 32)))) for i in range(2048)]
    assert lines == expected


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.ASYNC_CONFIGS, ids=lambda c: c.kernel)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (127, 129, 65), (257, 255, 33), (300, 1, 5), (384, 130, 136),
                                     (264, 520, 100), (1024, 1024, 1024)])
def test_every_async_config(cfg, m, n, k):
    """Each v13 configuration at ragged shapes (vector and scalar paths), and one whole-tile size."""
    a, b = _operands(m, n, k, "cuda", seed=m + n + k)
    poison_allocator(m * n * 4, "cuda")
    _check(sg._launch_async(a, b, cfg), a, b, f"{cfg.kernel} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("size", [4096, 8192])
def test_v13_at_the_benchmark_sizes(size):
    """v13 at the sizes its goal is measured at, against float64 (computed on the GPU)."""
    a, b = _operands(size, size, size, "cuda", seed=size)
    c = sg.sgemm_async(a, b)
    rtol, atol = sg.tolerance_for_k(size)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------- v12 against v13 in SASS
# The sgemm chapter explains v13's loss to v12 on the H100 by dispatch stalls in the FMA loop (Nsight
# Compute, outputs/<gpu>/ncu_counters_gemms.txt) and names register-bank conflicts as a known cause. The
# compile-time side of that: how often an FFMA reads two of its sources, not served by the operand reuse
# cache (.reuse), from one register bank. NVIDIA does not document the banks, so both models the
# microbenchmark literature reports are counted: two banks (Volta and later) and four (Maxwell).

def _sass_of(cu: str, define: str, tmp_path: Path) -> str:
    from helpers import cuobjdump
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's NVIDIA backend)")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / (Path(cu).stem + ".cubin")
    cmd = [shutil.which("nvcc"), "-std=c++17", "-cubin", "-arch=sm_90", "-I", "csrc/common",
           define.replace(",", "\\,"), cu, "-o", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return subprocess.run([tool, "-sass", str(out)], capture_output=True, text=True,
                          check=True).stdout


def _same_bank_rate(sass: str, banks: int) -> float:
    """The fraction of FFMAs with two sources read from the register file in one bank."""
    import re
    hits = total = 0
    for m in re.finditer(r"FFMA R\d+, (-?R\w+)(\.reuse)?, (-?R\w+)(\.reuse)?, (-?R\w+)(\.reuse)?",
                         sass):
        read = [int(r.lstrip("-R")) % banks for r, reused in zip(m.groups()[::2], m.groups()[1::2])
                if r.lstrip("-") != "RZ" and not reused]
        total += 1
        hits += any(read.count(b) >= 2 for b in set(read))
    assert total >= 1024, "the inner loop's FFMAs were not found"
    return hits / total


@pytest.mark.op("sgemm")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v13_ffmas_read_one_bank_twice_more_often_than_v12s(tmp_path):
    """v12's kernel (128 x 256 x 16, 256 threads) and v13's (128 x 128 x 16, 128 threads, 4 stages)
    compiled by this nvcc for sm_90: under both bank models, v13's FFMAs read two register-file
    sources from one bank at least 1.5 times as often as v12's (a compile-time count that fits the
    measured dispatch stalls; it does not prove they are the cause)."""
    v12 = _sass_of("csrc/part3/sgemm/v11_tuned.cu",
                   "-DSGEMM_TUNED_CONFIGS=SGEMM_TUNED(128,256,16,64,64,256,8,0)", tmp_path)
    v13 = _sass_of("csrc/part3/sgemm/v13_async.cu",
                   "-DSGEMM_ASYNC_CONFIGS=SGEMM_ASYNC(128,128,16,64,64,128,4,8)", tmp_path)
    for banks in (2, 4):
        assert _same_bank_rate(v13, banks) >= 1.5 * _same_bank_rate(v12, banks), banks

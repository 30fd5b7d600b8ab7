"""Scan beyond the generic reference check: every version at tile edges and multi-level sizes, exact checks on
small integers stored as fp32 (any addition order gives the same, exactly representable, sums), int32, the
relative error at large n against float64, poisoned outputs, and refusal of bad input."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from helpers import nvcc_with_report, sass_by_function

from conftest import poison_allocator
from snippets import cuda
from snippets.part3 import scan as sc
from snippets.part3 import scan_v9 as sc9
from snippets.part3 import scan_v10 as sc10  # registers v10, in a module of its own
from snippets.part3 import scan_v11 as sc11  # registers v11, in a module of its own

CUDA_FNS = {"v1": sc.scan_kogge_stone, "v2": sc.scan_brent_kung, "v3": sc.scan_reduce_then_scan,
            "v5": sc.scan_lookback, "v6": sc.scan_lookback_warp, "v7": sc.scan_lookback_v7,
            "v8": sc.scan_lookback_v8, "v9": sc9.scan_lookback_v9, "v10": sc10.scan_lookback_v10,
            "v11": sc11.scan_lookback_v11}
ALL_FNS = {"v0": sc.scan_torch, **CUDA_FNS, "v4": sc.scan_triton}
SIZES = (1, 31, 32, 33, 1023, 1024, 1025, 4095, 4096, 4097, 100003)
# 1024 * 1024 + 1: v1/v2 need three levels (1025 tile sums, then 2); 2**22 + 4097 crosses many 4096-tiles.
# v7's 8192-element tiles: one element short of a tile and past it, a tail that is not a multiple of 4 (the
# 16-byte vectors), and 2**22 + 3 (512 full tiles, then 3 elements).
GPU_SIZES = SIZES + (8191, 8192, 8193, 3 * 8192 + 6, 1024 * 1024 + 1, 2**22 + 4097, 2**22 + 3)


def _small_ints(n: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """Integers in [0, 8): every prefix of up to 2**21 of them is below 2**24, so exact in fp32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 8, (n,), generator=g, dtype=torch.int32).to(device=device, dtype=dtype)


def _assert_exact(fn, x: torch.Tensor) -> None:
    poison_allocator(x.numel() * 4, x.device.type)
    out = fn(x)
    exp = torch.cumsum(x.cpu().long(), 0)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    bad = (out.cpu().long() != exp).nonzero()
    assert bad.numel() == 0, f"n={x.numel()}: {bad.numel()} wrong outputs, first at {bad[0].item()}"


@pytest.mark.op("scan")
def test_reference_keeps_dtype():
    x = torch.tensor([1, 2, 3, -10], dtype=torch.int32)
    out = sc.scan_ref(x)
    assert out.dtype == torch.int32 and out.tolist() == [1, 3, 6, -4]


# ---------------------------------------------------------------- Triton and PyTorch (CPU or GPU)

@pytest.mark.op("scan")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.int32))
def test_triton_exact(n, dtype, device):
    _assert_exact(sc.scan_triton, _small_ints(n, dtype, device, seed=n))


@pytest.mark.op("scan")
def test_triton_many_carry_rounds(device):
    """More than BLOCK block sums: the carry program runs several rounds."""
    n = sc.BLOCK * (sc.BLOCK + 3) if device == "cuda" else 0
    if n == 0:
        pytest.skip("2**24 elements is too slow for the interpreter; covered on the GPU")
    _assert_exact(sc.scan_triton, _small_ints(n, torch.int32, device))


@pytest.mark.op("scan")
def test_triton_negative_int32(device):
    x = torch.randint(-1000, 1000, (5000,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    x = x.to(device)
    assert torch.equal(sc.scan_triton(x).cpu(), torch.cumsum(x.cpu(), 0, dtype=torch.int32))


def _bad_inputs(device):
    x = torch.rand(64, device=device)
    return [
        ("float64", (x.double(),), TypeError, "dtype"),
        ("float16", (x.half(),), TypeError, "dtype"),
        ("int64", (x.long(),), TypeError, "dtype"),
        ("empty", (x[:0],), ValueError, "empty"),
        ("2-D", (x.view(8, 8),), ValueError, "1-D"),
        ("strided", (x[::2],), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(),), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("scan")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    _, args, exc, words = _bad_inputs(device)[case]
    for fn in (sc.scan_torch, sc.scan_triton):
        with pytest.raises(exc, match=words):
            fn(*args)


@pytest.mark.op("scan")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CPU tensors without a GPU")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_versions_refuse_without_gpu(name):
    with pytest.raises(RuntimeError, match="GPU"):
        CUDA_FNS[name](torch.zeros(4))


# ---------------------------------------------------------------- every version (GPU)

@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
@pytest.mark.parametrize("n", GPU_SIZES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.int32))
def test_gpu_exact(name, n, dtype):
    _assert_exact(ALL_FNS[name], _small_ints(n, dtype, "cuda", seed=n))


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
def test_gpu_unaligned_view_and_int32_sign(name):
    base = torch.randint(-50, 50, (70001,), generator=torch.Generator().manual_seed(7), dtype=torch.int32).cuda()
    x = base[3:]  # contiguous, not 16-byte aligned
    assert torch.equal(ALL_FNS[name](x).cpu(), torch.cumsum(x.cpu(), 0, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
def test_gpu_relative_error_large_n(name):
    """2**25 fp32 values in [0, 1) against float64: the error relative to the running sum stays within the op's
    tolerance, and no tile's offset is missing (a missing 4096-element tile would be off by ~2048)."""
    (x,) = sc.make_inputs({"n": 2**25}, torch.float32, "cuda", torch.Generator().manual_seed(3))
    out = ALL_FNS[name](x).double()
    ref = torch.cumsum(x.double(), 0)
    rtol, atol = sc.TOLERANCES[torch.float32]
    rel = ((out - ref).abs() / ref.clamp_min(1e-30)).max().item()
    assert rel <= rtol, f"max relative error {rel:.3g} > {rtol}"
    assert (out[-1] - ref[-1]).abs().item() < 1000, "the last prefix is off by more than rounding"


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", ("v5", "v6", "v7", "v8", "v9", "v10", "v11"))
def test_gpu_lookback_repeatable(name):
    """The look-back orders tiles by an atomic counter; run it many times to shake out a race."""
    x = _small_ints(2**21, torch.int32, "cuda")
    exp = torch.cumsum(x.long(), 0).int()
    for _ in range(20):
        assert torch.equal(ALL_FNS[name](x), exp)


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_gpu_refuses_bad_input(name):
    for _, args, exc, words in _bad_inputs("cuda"):
        with pytest.raises(exc, match=words):
            CUDA_FNS[name](*args)
    with pytest.raises(ValueError, match="cuda"):
        CUDA_FNS[name](torch.zeros(4))


# ---------------------------------------------------------------- v7 on the CPU: an emulation of its tile logic

def _pad(i):
    return i + (i >> 5)  # scan.cu's PAD


def _v7_block(x, n, state, counter, history, out, threads, items, vectors):
    """One block of scan_lookback_v7, step by step (a generator: it yields where the kernel can be overtaken
    by other blocks). The index arithmetic is the kernel's: warp segments of 32 * items elements, warp-striped
    16-byte vectors (or one element per lane) into a padded slice, blocked registers, one sum per warp, the
    aggregate published before the look-back, a window of 32 predecessors, the carry added last."""
    tile_elems, seg = threads * items, 32 * items
    tile = counter[0]  # atomicAdd(&state[0], 1): tiles in the order blocks start
    counter[0] += 1
    yield
    base = tile * tile_elems
    full = base + tile_elems <= n
    lanes = np.arange(32)
    zero = x.dtype.type(0)
    slices, regs = [], []
    for warp in range(threads // 32):
        gseg = base + warp * seg
        s = np.full(_pad(seg), np.nan if x.dtype.kind == "f" else -(2**31), dtype=x.dtype)  # poison
        if full and vectors:
            for k in range(items // 4):
                e = (k * 32 + lanes) * 4
                for q in range(4):  # .x .y .z .w of each lane's vector
                    s[_pad(e + q)] = x[gseg + e + q]
        else:
            for k in range(items):
                e = k * 32 + lanes
                s[_pad(e)] = np.where(gseg + e < n, x[np.minimum(gseg + e, n - 1)], zero)
        r = np.stack([s[_pad(lanes * items + k)] for k in range(items)], axis=1)  # (32, items), blocked
        slices.append(s)
        regs.append(np.cumsum(r, axis=1, dtype=x.dtype))
    warp_totals = np.array([np.sum(r[:, -1], dtype=x.dtype) for r in regs], dtype=x.dtype)
    total = np.sum(warp_totals, dtype=x.dtype)
    history[tile].append(("prefix" if tile == 0 else "agg", total))
    state[tile] = (2 if tile == 0 else 1, total)  # published after one barrier
    yield
    for warp, (s, r) in enumerate(zip(slices, regs)):  # the other warps' work, before the carry is known
        lane_excl = np.concatenate([[zero], np.cumsum(r[:, -1], dtype=x.dtype)[:-1]]).astype(x.dtype)
        offset = np.sum(warp_totals[:warp], dtype=x.dtype) + lane_excl
        for k in range(items):
            s[_pad(lanes * items + k)] = r[:, k] + offset
    carry = zero
    if tile > 0:
        j0 = tile - 1
        while True:
            j = j0 - lanes
            words = [state[i] if i >= 0 else (2, zero) for i in j]
            while any(w[0] == 0 for w in words):  # lanes still waiting re-read their word
                yield
                words = [state[i] if w[0] == 0 else w for i, w in zip(j, words)]
            prefixes = [lane for lane in range(32) if words[lane][0] == 2]
            stop = prefixes[0] if prefixes else 31  # the nearest inclusive prefix
            carry = carry + np.sum([words[lane][1] for lane in range(stop + 1)], dtype=x.dtype)
            if prefixes:
                break
            j0 -= 32
        history[tile].append(("prefix", carry + total))
        state[tile] = (2, carry + total)
    yield
    for warp, s in enumerate(slices):
        gseg = base + warp * seg
        for k in range(items):
            e = k * 32 + lanes
            keep = gseg + e < n
            out[(gseg + e)[keep]] = s[_pad(e)][keep] + carry


def _v7_emulated(x, threads, items, vectors, resident, seed):
    """Run the blocks of v7 over x with at most ``resident`` running at a time, advancing a random running
    block at each step. Returns out, the final state words and each tile's publications."""
    n = len(x)
    tiles = -(-n // (threads * items))
    rng = np.random.default_rng(seed)
    state = [(0, x.dtype.type(0))] * tiles
    history = [[] for _ in range(tiles)]
    counter = [0]
    out = np.full(n, -7, dtype=x.dtype)
    waiting, running = list(range(tiles)), []
    for _ in range(200 * tiles * (threads // 32 + 64)):
        while waiting and len(running) < resident:
            waiting.pop(int(rng.integers(len(waiting))))  # blocks start in any order
            running.append(_v7_block(x, n, state, counter, history, out, threads, items, vectors))
        if not running:
            return out, state, history
        pick = int(rng.integers(len(running)))
        try:
            next(running[pick])
        except StopIteration:
            running.pop(pick)
    raise AssertionError("the emulated blocks did not finish: a wait that never ends")


@pytest.mark.op("scan")
@pytest.mark.parametrize("dtype", (np.float32, np.int32))
@pytest.mark.parametrize("vectors", (True, False), ids=("aligned", "unaligned"))
@pytest.mark.parametrize("threads,items,n,resident", [
    (64, 8, 1, 3),          # one element: one partial tile
    (64, 8, 511, 2),        # one element short of a 512-element tile
    (64, 8, 513, 2),        # one past it
    (64, 8, 40 * 512 + 3, 4),  # 41 tiles: windows of 32 with and without a prefix in them; tail of 3
    (64, 8, 70 * 512, 1),   # one block at a time: every predecessor has its prefix
    (64, 8, 70 * 512 - 5, 70),  # all blocks resident: look-backs over aggregates, several windows
    (sc.V7_THREADS, sc.V7_ITEMS, 5 * sc.V7_TILE + 4093, 3),  # the real tile: ragged, not a multiple of 4
    (sc.V8_THREADS, sc.V8_ITEMS, 5 * sc.V8_TILE + 4093, 4),  # v8's shape of it
])
def test_v7_emulated_tiles_and_lookback(threads, items, n, resident, vectors, dtype):
    """The inclusive prefix each tile ends with, the order of its publications (aggregate, then prefix;
    tile 0 its prefix only) and the output against torch.cumsum, on small integers (exact in any order)."""
    x = _small_ints(n, torch.int32, "cpu", seed=n).numpy().astype(dtype)
    out, state, history = _v7_emulated(x, threads, items, vectors, resident, seed=n + resident)
    exp = torch.cumsum(torch.from_numpy(x.astype(np.int64)), 0).numpy()
    assert np.array_equal(out.astype(np.int64), exp), np.flatnonzero(out.astype(np.int64) != exp)[:5]
    tile_elems = threads * items
    for tile, (status, value) in enumerate(state):
        last = min((tile + 1) * tile_elems, n) - 1
        assert status == 2 and int(value) == exp[last], (tile, status, value)
        kinds = [k for k, _ in history[tile]]
        assert kinds == (["prefix"] if tile == 0 else ["agg", "prefix"]), (tile, kinds)
        first = tile * tile_elems
        agg = int(history[tile][0][1])
        assert agg == exp[last] - (exp[first - 1] if first else 0), (tile, agg)


@pytest.mark.op("scan")
def test_v7_constants():
    """The tile v7's launcher sizes its grid with is the kernel's (512 threads x 16), every lane loads whole
    16-byte vectors, and the warp totals fit one warp's scan (at most 32 warps)."""
    assert sc.V7_TILE == sc.V7_THREADS * sc.V7_ITEMS and sc.V7_ITEMS % 4 == 0
    assert sc.V7_THREADS % 32 == 0 and sc.V7_THREADS // 32 <= 32
    assert sc.V7_TILE > sc.RTS_TILE  # a larger tile than v5's and v6's
    # v8: the same tile, half the threads, twice the elements each
    assert sc.V8_TILE == sc.V8_THREADS * sc.V8_ITEMS == sc.V7_TILE and sc.V8_ITEMS % 4 == 0
    assert (sc.V8_THREADS, sc.V8_ITEMS) == (sc.V7_THREADS // 2, 2 * sc.V7_ITEMS)


@pytest.mark.op("scan")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v7_sass_vectors_barriers_no_fence(tmp_path):
    """What scan_lookback_v7 compiles to for sm_90a, read from its SASS: 16-byte loads and stores
    (V7_ITEMS / 4 each), three block barriers (the tile number, the warp totals, the carry), one atomic, and
    no memory fence (the status and the value travel in one 64-bit word)."""
    cubin = tmp_path / "scan.cubin"
    defines = [f"-D{k}={v}" for k, v in cuda.DEFINES[sc.CU_FILE].items()]
    nvcc_with_report(["nvcc", "-arch=sm_90a", "-cubin", *defines, "-o", str(cubin),
                      str(cuda.source_path(sc.CU_FILE))], tmp_path)
    sass = sass_by_function(cubin)
    for suffix in ("f32", "i32"):
        for name, items in (("v7", sc.V7_ITEMS), ("v8", sc.V8_ITEMS)):
            code = sass[f"scan_lookback_{name}_{suffix}"]
            assert code.count("LDG.E.128") == items // 4 and code.count("STG.E.128") == items // 4
            assert code.count("BAR.SYNC") == 3
            assert code.count("ATOMG") == 1 and "MEMBAR" not in code


# ---------------------------------------------------------------- v9: the persistent grid

def test_v9_grid_is_what_fits_at_once_and_never_more_than_the_tiles():
    assert sc9.persistent_blocks(tiles=32768, sms=132, per_sm=2) == 264
    assert sc9.persistent_blocks(tiles=5, sms=132, per_sm=2) == 5      # a small input: one tile a block
    assert sc9.persistent_blocks(tiles=1, sms=1, per_sm=1) == 1
    for bad in ((0, 132, 2), (10, 0, 2), (10, 132, 0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            sc9.persistent_blocks(*bad)


def test_v9_is_v8s_tile():
    """v9 changes the grid, not the tile: the same 8192 elements as 256 threads of 32."""
    assert (sc9.V9_THREADS, sc9.V9_ITEMS) == (sc.V8_THREADS, sc.V8_ITEMS)


@pytest.mark.gpu
@pytest.mark.op("scan")
def test_gpu_v9_blocks_take_several_tiles_each():
    """More tiles than the grid has blocks, so every block loops, prefetching across tiles (the last one
    partial, its prefetch skipped); small integers: any order of additions is exact."""
    fn = cuda.kernel(sc9.V9_FILE, "scan_lookback_v9_i32", sc9.V9_OPTIONS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = sc9.persistent_blocks(10**9, sms, cuda.resident_blocks(fn, sc9.V9_THREADS))
    n = 3 * blocks * sc9.V9_TILE + 4093
    x = _small_ints(n, torch.int32, "cuda", seed=9)
    assert torch.equal(sc9.scan_lookback_v9(x), torch.cumsum(x.long(), 0).int())


# ---------------------------------------------------------------- v10: five blocks an SM, streaming hints

def test_v10_is_v8s_tile():
    """v10 changes the launch bounds and the cache hints, not the tile."""
    assert (sc10.V10_THREADS, sc10.V10_ITEMS, sc10.V10_TILE) == (sc.V8_THREADS, sc.V8_ITEMS, sc.V8_TILE)
    assert sc.scan.impls["v10"].lang == "CUDA"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v10_fits_five_blocks_and_streams(tmp_path):
    """Compiled for sm_90: no spills, registers and shared memory that let V10_BLOCKS blocks of
    V10_THREADS share an SM (65536 registers, 227 KiB), and evict-first vector loads and stores
    (ld.global.cs / st.global.cs: LDG.E.EF / STG.E.EF in the SASS) in v10 and not in v8."""
    from pathlib import Path

    from test_cuda_compile import parse_ptxas
    out = tmp_path / "scan_v10.cubin"
    report = nvcc_with_report([shutil.which("nvcc"), "-std=c++17", "-cubin", "-arch=sm_90", "-I",
                               "csrc/common", *sc10.V10_OPTIONS, "csrc/" + sc10.V10_FILE,
                               "-o", str(out)], Path(__file__).resolve().parent.parent)
    f = parse_ptxas(report)["scan_lookback_v10_f32"]
    assert f["spill_store_bytes"] == f["spill_load_bytes"] == 0
    regs_per_warp = -(-f["registers"] * 32 // 256) * 256
    assert sc10.V10_BLOCKS * (sc10.V10_THREADS // 32) * regs_per_warp <= 65536, f
    assert sc10.V10_BLOCKS * (f["smem_bytes"] + 1024) <= 227 * 1024 + 1024, f
    sass = sass_by_function(out)
    for name in ("scan_lookback_v10_f32", "scan_lookback_v10_i32"):
        assert "LDG.E.EF.128" in sass[name] and "STG.E.EF.128" in sass[name], name
    assert "LDG.E.EF" not in sass["scan_lookback_v8_f32"] and "STG.E.EF" not in sass["scan_lookback_v8_f32"]


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("n", [1, 8191, 8193, 3 * 8192 + 6, 2**22 + 3, 2**26])
def test_gpu_v10_matches_v8(n):
    """int32: the exact prefix sums, as v8's (the int32 and fp32 kernels are one template: a lost
    or doubled tile shows here exactly). fp32: no further from the float64 scan than a few times
    CUB's (torch.cumsum) error on the same input; the carries group the predecessors' sums by
    timing, so the last bits may differ from v8's and from run to run."""
    g = torch.Generator(device="cuda").manual_seed(n)
    xi = torch.randint(-1000, 1000, (n,), generator=g, device="cuda", dtype=torch.int32)
    assert torch.equal(sc10.scan_lookback_v10(xi), sc.scan_lookback_v8(xi))
    assert torch.equal(sc10.scan_lookback_v10(xi), torch.cumsum(xi.long(), 0).int())
    xf = torch.randn(n, generator=g, device="cuda")
    ref = torch.cumsum(xf.double(), 0)
    cub = (torch.cumsum(xf, 0).double() - ref).abs().max().item()
    for fn in (sc10.scan_lookback_v10, sc.scan_lookback_v8):
        err = (fn(xf).double() - ref).abs().max().item()
        assert err <= 4 * cub + 1e-4, (fn.__name__, err, cub)


@pytest.mark.gpu
@pytest.mark.op("scan")
def test_gpu_v10_holds_five_blocks_an_sm():
    fn = cuda.kernel(sc10.V10_FILE, "scan_lookback_v10_f32", sc10.V10_OPTIONS)
    assert cuda.resident_blocks(fn, sc10.V10_THREADS) >= sc10.V10_BLOCKS


# ---------------------------------------------------------------- v11: scanned where the lanes load it
def test_v11_tile_is_three_of_v10s():
    """v11's tile, 256 threads x 96 elements, is three of v10's, at two blocks an SM."""
    assert (sc11.V11_THREADS, sc11.V11_ITEMS, sc11.V11_BLOCKS) == (256, 96, 2)
    assert sc11.V11_TILE == 3 * sc10.V10_TILE
    assert sc.scan.impls["v11"].lang == "CUDA"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v11_has_no_tile_in_shared_memory(tmp_path):
    """Compiled for sm_90: no spills, registers for V11_BLOCKS blocks of V11_THREADS an SM, a few
    dozen bytes of shared memory (the warp totals, the tile number, the carry: no tile), and no
    shared-memory traffic in the scan itself: the only shared stores are those words, while v10's
    transposes store every element. Its loads and stores are v10's evict-first 16-byte vectors."""
    from pathlib import Path

    from test_cuda_compile import parse_ptxas
    out = tmp_path / "scan_v11.cubin"
    report = nvcc_with_report([shutil.which("nvcc"), "-std=c++17", "-cubin", "-arch=sm_90", "-I",
                               "csrc/common", *sc11.V11_OPTIONS, "csrc/" + sc11.V11_FILE,
                               "-o", str(out)], Path(__file__).resolve().parent.parent)
    sass = sass_by_function(out)
    for name in ("scan_lookback_v11_f32", "scan_lookback_v11_i32"):
        f = parse_ptxas(report)[name]
        assert f["spill_store_bytes"] == f["spill_load_bytes"] == 0, f
        regs_per_warp = -(-f["registers"] * 32 // 256) * 256
        assert sc11.V11_BLOCKS * (sc11.V11_THREADS // 32) * regs_per_warp <= 65536, f
        assert f["smem_bytes"] <= 64, f  # 8 warp totals, the tile number, the carry
        code = sass[name]
        assert "LDG.E.EF.128" in code and "STG.E.EF.128" in code, name
        # the full tile's 24 rows a lane: loaded and stored as vectors, never through shared memory
        assert code.count("LDG.E.EF.128") == sc11.V11_ITEMS // 4, name
        assert code.count("STS") <= 4, name  # sTile, sWarp[warp], sCarry (and nothing per element)
        assert "SHFL.UP" in code, name


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("n", [1, 383, 24575, 24576, 24577, 3 * 24576 + 6, 2**22 + 3, 2**26])
def test_gpu_v11_exact_and_close(n):
    """int32: the exact prefix sums (a lost or doubled row, lane or tile shows exactly), also from an
    unaligned start (one element in: the element-wise path for every tile). fp32: no further from
    the float64 scan than a few times CUB's (torch.cumsum) error on the same input."""
    g = torch.Generator(device="cuda").manual_seed(n)
    xi = torch.randint(-1000, 1000, (n + 1,), generator=g, device="cuda", dtype=torch.int32)
    for x in (xi[:n], xi[1:]):
        assert torch.equal(sc11.scan_lookback_v11(x), torch.cumsum(x.long(), 0).int())
    xf = torch.randn(n, generator=g, device="cuda")
    ref = torch.cumsum(xf.double(), 0)
    cub = (torch.cumsum(xf, 0).double() - ref).abs().max().item()
    err = (sc11.scan_lookback_v11(xf).double() - ref).abs().max().item()
    assert err <= 4 * cub + 1e-4, (err, cub)


@pytest.mark.gpu
@pytest.mark.op("scan")
def test_gpu_v11_holds_two_blocks_an_sm():
    fn = cuda.kernel(sc11.V11_FILE, "scan_lookback_v11_f32", sc11.V11_OPTIONS)
    assert cuda.resident_blocks(fn, sc11.V11_THREADS) >= sc11.V11_BLOCKS


@pytest.mark.gpu
@pytest.mark.op("scan")
def test_gpu_v11_first_warp_is_exercise_10s_model():
    """The first warp of the first tile has no carry and no offset among the warps, so its fp32
    output is the row scan alone: bit for bit the NumPy model of exercise 10 (the same additions in
    the same order), which the chapter says it is."""
    from exercises.engine import SOLUTIONS, load_module

    model = load_module(SOLUTIONS / "part3/striped_scan.py")
    g = torch.Generator(device="cuda").manual_seed(10)
    x = torch.randn(2 * sc11.V11_TILE, generator=g, device="cuda")
    seg = 32 * sc11.V11_ITEMS
    got = sc11.scan_lookback_v11(x)[:seg].cpu().numpy()
    want = model.striped_scan(x[:seg].cpu().numpy())
    assert (got.view(np.int32) == want.view(np.int32)).all()

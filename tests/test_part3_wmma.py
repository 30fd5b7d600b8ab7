"""Tensor-core GEMMs beyond the generic reference check: every version on ragged and aligned shapes in both
half-precision dtypes against float64 with a tolerance scaled to K, the size and alignment rules of the WMMA
kernels (refused clearly, never run out of bounds), the TF32 rounding emulation and what it predicts about the
error of TF32 products, and TF32 being on in tf32_gemm's v0 (and off again afterwards)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import cancelling_operands

from conftest import poison_allocator
from snippets._checks import triton_interpreting
from snippets.common import gemm
from snippets.part3 import sgemm
from snippets.part3 import wmma as w
from snippets.part3 import wmma_v7 as w7  # registers v7, in a module of its own

HALF = (torch.float16, torch.bfloat16)
WMMA_VERSIONS = {"v0": w.wmma_cublas, "v1": w.wmma_naive, "v2": w.wmma_smem, "v3": w.wmma_async,
                 "v4": w.wmma_triton, "v5": w.wmma_triton_wide, "v6": w.wmma_mma,
                 "v7": w7.wmma_mma_hoisted}
TF32_VERSIONS = {"v0": w.tf32_cublas, "v1": w.tf32_wmma, "v2": w.tf32_triton, "v3": w.tf32_kmajor,
                 "v4": w.tf32_persistent}
CUDA_HALF = {"v1": w.wmma_naive, "v2": w.wmma_smem, "v3": w.wmma_async, "v6": w.wmma_mma,
             "v7": w7.wmma_mma_hoisted}

# (M, N, K) that v1 takes (all multiples of 16): one fragment, partial 32 x 32 blocks (M or N = 16 mod 32),
# several K steps, and many blocks.
WHOLE_SHAPES = [(16, 16, 16), (16, 48, 32), (48, 16, 64), (32, 32, 256), (144, 272, 48), (256, 384, 512)]
# Shapes for v0, v2, v3, v4: M anything, N and K multiples of 8 (the 16-byte copies). They cut the 128 x 128
# block tile in every direction, give K shorter than one 32-deep step and not a multiple of 16 (zero-filled
# halves of an MMA step), and one row or 8 columns.
RAGGED_SHAPES = [(1, 8, 8), (17, 40, 24), (127, 136, 40), (129, 264, 72), (255, 128, 8), (300, 8, 520),
                 (384, 256, 264), (130, 392, 1000)]
# tf32_gemm v1: M anything, N and K multiples of 4.
TF32_SHAPES = [(1, 4, 4), (17, 36, 20), (127, 132, 12), (129, 260, 68), (256, 256, 256), (300, 12, 1028)]


def _operands(m, n, k, device, dtype, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device)
    b = torch.randn(k, n, generator=g, device=device)
    return a.to(dtype), b.to(dtype)


def _check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, label: str) -> None:
    m, k = a.shape
    n = b.shape[1]
    assert c.shape == (m, n) and c.dtype == a.dtype and c.device == a.device and c.is_contiguous(), label
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = w.tolerance_for(k, a.dtype)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


def _seed(m, n, k):
    return m * 1_000_003 + n * 1009 + k


# ---------------------------------------------------------------- CPU: registry, checks, tolerances

@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
def test_registry_matches_the_ladder():
    assert set(w.wmma_gemm.impls) == set(WMMA_VERSIONS)
    assert set(w.tf32_gemm.impls) == set(TF32_VERSIONS)
    assert w.wmma_gemm.ceiling == "gemm_fp16" and w.tf32_gemm.ceiling == "gemm_tf32"
    assert w.wmma_gemm.timed_dtypes() == HALF
    assert w.wmma_gemm.flops({"m": 2, "n": 3, "k": 5}, torch.float16) == 60
    assert w.wmma_gemm.bytes_moved({"m": 2, "n": 3, "k": 5}, torch.float16) == (10 + 15 + 6) * 2
    assert w.tf32_gemm.bytes_moved({"m": 2, "n": 3, "k": 5}, torch.float32) == (10 + 15 + 6) * 4
    # Triton runs bf16 only on a GPU: the interpreter's tl.dot cannot multiply bf16.
    expected = (torch.float16,) if triton_interpreting() else HALF
    assert w.wmma_gemm.impls["v4"].dtypes == expected == w.triton_half_dtypes()
    assert w.wmma_gemm.impls["v5"].dtypes == expected


@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
def test_every_test_size_is_accepted_by_every_cuda_version():
    """tests/test_ops.py runs every version at every registered test size: none of them may be refused."""
    for op, configs, dtype in ((w.wmma_gemm, w.CONFIGS.values(), torch.float16),
                               (w.tf32_gemm, [w.TF32_CONFIG], torch.float32)):
        for size in op.test_sizes:
            a, b = _operands(size["m"], size["n"], size["k"], "cpu", dtype)
            for cfg in configs:
                w.check_supported(cfg, a, b)


def _bad_operands(device, dtype):
    a, b = _operands(6, 8, 8, device, dtype)
    other = torch.float32 if dtype != torch.float32 else torch.float16
    return [
        ("float64 a", (a.double(), b), TypeError, "dtype"),
        ("other float b", (a, b.to(other)), TypeError, "dtype"),
        ("int32", (a.int(), b.int()), TypeError, "dtype"),
        ("inner dims differ", (a, torch.zeros(16, 8, device=device, dtype=dtype)), ValueError,
         "inner dimensions"),
        ("1-D a", (a.reshape(-1), b), ValueError, "2-D"),
        ("3-D b", (a, b.reshape(2, 4, 8)), ValueError, "2-D"),
        ("transposed a", (torch.zeros(8, 6, device=device, dtype=dtype).t(), b), ValueError, "contiguous"),
        ("column slice b", (a, torch.zeros(8, 16, device=device, dtype=dtype)[:, :8]), ValueError, "contiguous"),
        ("empty a", (a[:0], b), ValueError, "empty"),
        ("empty k", (torch.zeros(6, 0, device=device, dtype=dtype), torch.zeros(0, 8, device=device, dtype=dtype)),
         ValueError, "empty"),
        ("not a tensor", (a.tolist(), b), TypeError, "torch.Tensor"),
    ]


N_BAD = len(_bad_operands("cpu", torch.float16))


@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("dtypes", [HALF, (torch.float32,)], ids=["half", "fp32"])
@pytest.mark.parametrize("case", range(N_BAD))
def test_check_operands_refuses(case, dtypes):
    label, args, exc, words = _bad_operands("cpu", dtypes[0])[case]
    with pytest.raises(exc, match=words):
        w.check_operands(*args, dtypes, device="cpu")


@pytest.mark.op("wmma_gemm")
def test_check_operands_returns_sizes():
    a, b = _operands(6, 5, 4, "cpu", torch.bfloat16)
    assert w.check_operands(a, b, HALF, device="cpu") == (6, 5, 4)


@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("version, fn, dtype",
                         [(v, f, torch.float16) for v, f in WMMA_VERSIONS.items() if v not in ("v4", "v5")]
                         + [(v, f, torch.float32) for v, f in TF32_VERSIONS.items() if v not in ("v2", "v3", "v4")])
def test_cpu_tensors_refused(version, fn, dtype):
    """CPU tensors are refused with a ValueError naming the device, before any GPU is needed."""
    a, b = _operands(16, 16, 16, "cpu", dtype)
    with pytest.raises(ValueError, match="cuda device"):
        fn(a, b)


# (config, M, N, K, words in the error): each size rule of each CUDA kernel, broken once.
UNSUPPORTED = [
    ("v1", 17, 16, 16, "M = 17 is not a multiple of 16"),
    ("v1", 16, 24, 16, "N = 24 is not a multiple of 16"),
    ("v1", 16, 16, 8, "K = 8 is not a multiple of 16"),
    ("v2", 16, 12, 16, "N = 12 is not a multiple of 8"),
    ("v2", 16, 16, 20, "K = 20 is not a multiple of 8"),
    ("v3", 5, 8, 4, "K = 4 is not a multiple of 8"),
    ("v3", 5, 30, 8, "N = 30 is not a multiple of 8"),
    ("v6", 5, 8, 12, "K = 12 is not a multiple of 8"),
    ("v6", 5, 20, 8, "N = 20 is not a multiple of 8"),
    ("v7", 5, 8, 12, "K = 12 is not a multiple of 8"),
    ("v7", 5, 20, 8, "N = 20 is not a multiple of 8"),
    ("tf32", 3, 6, 4, "N = 6 is not a multiple of 4"),
    ("tf32", 3, 4, 10, "K = 10 is not a multiple of 4"),
]


def _config(name):
    return w.TF32_CONFIG if name == "tf32" else w7.V7 if name == "v7" else w.CONFIGS[name]


@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("name, m, n, k, words", UNSUPPORTED)
def test_unsupported_sizes_refused(name, m, n, k, words):
    dtype = torch.float32 if name == "tf32" else torch.float16
    a, b = _operands(m, n, k, "cpu", dtype)
    with pytest.raises(ValueError, match=words):
        w.check_supported(_config(name), a, b)


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("name, align", [("v1", 32), ("v2", 16), ("v3", 16), ("v6", 16), ("v7", 16),
                                         ("tf32", 16)])
def test_misaligned_views_refused(name, align):
    """A contiguous view that starts a few elements into a buffer is not aligned for the kernel's loads."""
    cfg = _config(name)
    dtype = torch.float32 if name == "tf32" else torch.float16
    m, n, k = 32, 32, 32
    buf = torch.zeros(m * k + 64, dtype=dtype)
    shift = next(s for s in range(1, 64) if (buf.data_ptr() + s * buf.element_size()) % align)
    a = buf[shift:shift + m * k].view(m, k)
    b = torch.zeros(k, n, dtype=dtype)
    assert a.is_contiguous() and a.data_ptr() % align
    with pytest.raises(ValueError, match=f"{align}-byte boundary"):
        w.check_supported(cfg, a, b)
    w.check_supported(cfg, a.clone(), b)  # the same values, freshly allocated: accepted


@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
def test_tolerances_scale_with_k_and_precision():
    for dtype in (*HALF, torch.float32):
        assert w.tolerance_for(4096, dtype)[1] > w.tolerance_for(64, dtype)[1] > w.tolerance_for(1, dtype)[1] > 0
    assert w.tolerance_for(256, torch.bfloat16) > w.tolerance_for(256, torch.float16)
    # TF32 is loose next to IEEE fp32 (the SGEMM chapter's tolerance): a TF32 product would fail sgemm's tests.
    assert w.tolerance_for(1024, torch.float32)[1] > 100 * sgemm.tolerance_for_k(1024)[1]
    assert w.wmma_gemm.tolerance(torch.float16) == w.tolerance_for(4096, torch.float16)
    assert w.tf32_gemm.tolerance(torch.float32) == w.tolerance_for(4096, torch.float32)


# ---------------------------------------------------------------- CPU (interpreter) or GPU: Triton

TRITON_SHAPES = [(1, 1, 1), (17, 33, 9), (64, 64, 64), (33, 47, 80), (5, 64, 130)]


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("m, n, k", TRITON_SHAPES)
def test_triton_fp16_any_shape(device, m, n, k):
    """v4 masks every edge, so it takes any shape, on the GPU or under the CPU interpreter."""
    a, b = _operands(m, n, k, device, torch.float16, seed=_seed(m, n, k))
    poison_allocator(m * n * 2, device)
    _check(w.wmma_triton(a, b), a, b, f"v4 fp16 {m}x{n}x{k}")


@pytest.mark.op("wmma_gemm")
def test_triton_sums_in_fp32(device):
    """Running sums far larger than C (helpers.cancelling_operands), over two K steps of 64: an fp16
    accumulator loses C by far more than tolerance_for(K)."""
    a, b = cancelling_operands(16, 24, 128, torch.float16, device)
    poison_allocator(16 * 24 * 2, device)
    _check(w.wmma_triton(a, b), a, b, "v4 fp16 cancelling sums")


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k", TRITON_SHAPES)
def test_triton_tf32_any_shape(device, m, n, k):
    a, b = _operands(m, n, k, device, torch.float32, seed=_seed(m, n, k))
    poison_allocator(m * n * 4, device)
    _check(w.tf32_triton(a, b), a, b, f"tf32 v2 {m}x{n}x{k}")


# tf32_gemm v4 (TMA) takes K and N in multiples of 4: ragged M, and N and K that cut the tiles
V4_SHAPES = [(1, 4, 4), (17, 36, 20), (70, 68, 100), (33, 132, 36)]


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k", V4_SHAPES)
def test_tf32_v4_any_aligned_shape(device, m, n, k):
    """Under the interpreter INTERPRET's 32 x 32 x 32 tiles and 3 "SMs": each program loops over
    several tiles, and the boxes hang over every edge (TMA fills zeros, writes nothing outside)."""
    a, b = _operands(m, n, k, device, torch.float32, seed=_seed(m, n, k))
    poison_allocator(m * n * 4, device)
    _check(w.tf32_persistent(a, b), a, b, f"tf32 v4 {m}x{n}x{k}")


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k, words", [(3, 6, 4, "N = 6"), (3, 4, 10, "K = 10")])
def test_tf32_v4_refuses_rows_tma_cannot_copy(device, m, n, k, words):
    a, b = _operands(m, n, k, device, torch.float32)
    with pytest.raises(ValueError, match=f"multiples of 4 floats, got .*{words}"):
        w.tf32_persistent(a, b)


@pytest.mark.op("tf32_gemm")
def test_tf32_v4_refuses_a_misaligned_a(device):
    buf = torch.zeros(32 * 32 + 4, device=device)
    a = buf[1:1 + 32 * 32].view(32, 32)  # 4 bytes past a 16-byte boundary
    b = torch.zeros(32, 32, device=device)
    with pytest.raises(ValueError, match="16-byte boundary"):
        w.tf32_persistent(a, b)
    w.tf32_persistent(a.clone(), b)


@pytest.mark.op("wmma_gemm")
def test_triton_refuses_bf16_under_the_interpreter():
    if not triton_interpreting():
        pytest.skip("on a GPU, bf16 is supported (tested below)")
    a, b = _operands(16, 16, 16, "cpu", torch.bfloat16)
    with pytest.raises(TypeError, match="supports torch.float16"):
        w.wmma_triton(a, b)


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 33, 9), (64, 64, 64)])
def test_reference_rounds_once(m, n, k):
    """wmma_gemm_ref sums in fp32 and rounds once: within the output rounding of the exact product."""
    for dtype in HALF:
        a, b = _operands(m, n, k, "cpu", dtype)
        c = w.wmma_gemm_ref(a, b)
        assert c.dtype == dtype
        exact = a.double() @ b.double()
        torch.testing.assert_close(c.double(), exact, rtol=gemm.UNIT_ROUNDOFF[dtype], atol=1e-6 * k)


# ---------------------------------------------------------------- CPU: TF32 emulation

@pytest.mark.op("tf32_gemm")
def test_tf32_round_known_values():
    one = 1.0
    x = torch.tensor([one + 2**-11,            # exactly halfway between 1 and 1 + 2^-10: away from zero
                      -(one + 2**-11),
                      one + 2**-11 - 2**-23,   # just below halfway: down
                      one + 2**-10 + 2**-12,   # a quarter ulp above a TF32 number: down to it
                      3.0, 0.0, -0.0, 2.0**-126, float("inf"), float("-inf")])
    expected = [one + 2**-10, -(one + 2**-10), one, one + 2**-10, 3.0, 0.0, -0.0, 2.0**-126,
                float("inf"), float("-inf")]
    got = w.tf32_round(x)
    assert got.tolist() == expected
    assert torch.signbit(got[6]) and not torch.signbit(got[5])
    assert torch.isnan(w.tf32_round(torch.tensor([float("nan")]))).all()
    # a mantissa of all ones rounds up into the next power of two
    assert w.tf32_round(torch.tensor([2.0 - 2**-23])).item() == 2.0


@pytest.mark.op("tf32_gemm")
def test_tf32_round_is_nearest_with_10_bits():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-20, 20, (100_000,), generator=g).float())
    r = w.tf32_round(x)
    assert r.shape == x.shape and r.dtype == torch.float32
    assert ((r.view(torch.int32) & 0x1FFF) == 0).all()                    # only 10 mantissa bits left
    assert ((r - x).abs() <= 2.0**-11 * x.abs()).all()                    # within half a TF32 ulp
    # nearest: the other TF32 neighbour (one ulp of 2^13 mantissa units the other way) is never closer
    down = (x.view(torch.int32) & ~0x1FFF).view(torch.float32)           # toward zero
    up = ((x.view(torch.int32) & ~0x1FFF) + 0x2000).view(torch.float32)  # away from zero
    other = torch.where(r == down, up, down)
    assert ((r - x).abs() <= (other - x).abs()).all()
    # numbers that already fit 10 mantissa bits (every normal fp16 value does) are unchanged
    h = torch.randn(10_000, generator=g).half().float()
    assert torch.equal(w.tf32_round(h), h)
    # shape and non-contiguous input
    m = torch.randn(8, 6, generator=g).t()
    assert torch.equal(w.tf32_round(m), w.tf32_round(m.contiguous()))
    with pytest.raises(TypeError, match="float32"):
        w.tf32_round(torch.ones(3, dtype=torch.float64))


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("k", [256, 1024])
def test_tf32_error_scales_like_its_unit_roundoff(k):
    """The emulated TF32 product's error against float64 is ~u sqrt(K) with u = 2^-11 (each product off by
    ~u, K of them adding like a random walk), some 2^13 times the error of an fp32 product, and within the
    TF32 tolerance; fp32 passes the SGEMM tolerance, TF32 does not."""
    a, b = _operands(64, 64, k, "cpu", torch.float32, seed=k)
    exact = a.double() @ b.double()
    err_tf32 = w.tf32_matmul_emulated(a, b) - exact
    err_fp32 = (a @ b).double() - exact
    scale = gemm.TF32_UNIT_ROUNDOFF * math.sqrt(k)
    rms_tf32 = err_tf32.pow(2).mean().sqrt().item()
    rms_fp32 = err_fp32.pow(2).mean().sqrt().item()
    assert 0.3 * scale < rms_tf32 < 1.5 * scale
    assert rms_fp32 < rms_tf32 / 100
    rtol, atol = w.tolerance_for(k, torch.float32)
    assert torch.allclose(exact + err_tf32, exact, rtol=rtol, atol=atol)
    rtol32, atol32 = sgemm.tolerance_for_k(k)
    assert torch.allclose(exact + err_fp32, exact, rtol=rtol32, atol=atol32)
    assert not torch.allclose(exact + err_tf32, exact, rtol=rtol32, atol=atol32)


# ---------------------------------------------------------------- CPU: v6's swizzle and index math

V6 = w.CONFIGS["v6"]
V6_BM, V6_BN = V6.tile
V6_BK, V6_NT, V6_STAGES = w.MMA_BK, V6.threads, w.MMA_STAGES
V6_CA, V6_CB = V6_BK // 8, V6_BN // 8  # 16-byte chunks per row of the A and B tiles
V6_WM = V6_WN = 64  # each warp's part of the block tile (csrc/part3/wmma_gemm.cu, mma_tiled)
V6_WARPS_N = V6_BN // V6_WN
LANES = np.arange(32)


def _v6_warp_origin(warp):
    return (warp // V6_WARPS_N) * V6_WM, (warp % V6_WARPS_N) * V6_WN


def _ldmatrix_offsets(warp, kk, swizzle=w.mma_swizzle):
    """{(operand, index): the 32 lanes' chunk offsets} of one 16-deep step, as mma_tiles computes
    them: lane l addresses row l % 16 of a 16-row slab, at chunk l / 16 of the step's two."""
    wm0, wn0 = _v6_warp_origin(warp)
    out = {}
    for i in range(V6_WM // 16):
        out["a", i] = [swizzle(wm0 + i * 16 + l % 16, 2 * kk + l // 16, V6_CA) for l in LANES]
    for j in range(V6_WN // 16):
        out["b", j] = [swizzle(16 * kk + l % 16, (wn0 + j * 16) // 8 + l // 16, V6_CB)
                       for l in LANES]
    return out


def _copy_offsets(i, tid, operand):
    """The shared chunk that copy i of thread tid writes (load_tiles), and its (row, chunk)."""
    per_row = V6_CA if operand == "a" else V6_CB
    idx = tid + i * V6_NT
    r, c = idx // per_row, idx % per_row
    return w.mma_swizzle(r, c, per_row), r, c


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("per_row", [8, 16])
def test_v6_swizzle_permutes_each_128_byte_line(per_row):
    """No two chunks of a tile share a place, and each stays in its own 128-byte line (so the
    offsets of a row are those of the unswizzled row, permuted)."""
    for row in range(64):
        got = [w.mma_swizzle(row, c, per_row) for c in range(per_row)]
        assert sorted(got) == list(range(row * per_row, (row + 1) * per_row))
        assert all(o // 8 == (row * per_row + c) // 8 for c, o in enumerate(got))


@pytest.mark.op("wmma_gemm")
def test_v6_ldmatrix_phases_hit_8_bank_groups():
    """ldmatrix reads 8 rows of 16 bytes per phase (lanes 8p .. 8p + 7): with the swizzle they fall
    in 8 different groups of 4 banks (offset % 8) for every warp, step, A and B slab; without it,
    all 8 in one group (an 8-way conflict)."""
    for warp in range(V6_NT // 32):
        for kk in range(V6_BK // 16):
            for key, offsets in _ldmatrix_offsets(warp, kk).items():
                for p in range(4):
                    phase = offsets[8 * p:8 * p + 8]
                    assert len({o % 8 for o in phase}) == 8, (warp, kk, key, p, phase)
            plain = _ldmatrix_offsets(warp, kk, swizzle=lambda r, c, n: r * n + c)
            for key, offsets in plain.items():
                assert len({o % 8 for o in offsets[:8]}) == 1, key


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("operand", ["a", "b"])
def test_v6_copies_fill_each_tile_once_without_conflicts(operand):
    """Every chunk of a stage is written by exactly one copy, and the 8 threads of each 128-byte
    phase of a warp's cp.async write 8 different bank groups."""
    rows = V6_BM if operand == "a" else V6_BK
    per_row = V6_CA if operand == "a" else V6_CB
    copies = rows * per_row // V6_NT
    written = []
    for i in range(copies):
        offs = [_copy_offsets(i, tid, operand)[0] for tid in range(V6_NT)]
        written += offs
        for p in range(0, V6_NT, 8):
            assert len({o % 8 for o in offs[p:p + 8]}) == 8, (operand, i, p)
    assert sorted(written) == list(range(rows * per_row))


def _ldmatrix(tile, offsets, trans):
    """ldmatrix.x4 (trans: .x4.trans) on a tile of 16-byte chunks (tile[o] = 8 values): registers
    (32 lanes, 4, 2). Matrix i's rows are the chunks lanes 8i .. 8i + 7 address."""
    mats = tile[np.asarray(offsets)].reshape(4, 8, 8)  # (matrix, row, column)
    g, t = LANES // 4, LANES % 4
    regs = np.empty((32, 4, 2))
    for i in range(4):
        for e in range(2):
            regs[:, i, e] = mats[i, 2 * t + e, g] if trans else mats[i, g, 2 * t + e]
    return regs


def _mma(acc, a, b):
    """mma.sync.m16n8k16.row.col with fp32 sums (in float64 here): the fragments of all 32 lanes
    put together by the PTX ISA's layouts, multiplied, and the result handed back by C's layout."""
    g, t = LANES // 4, LANES % 4
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for e in range(2):
        A[g, 2 * t + e], A[g + 8, 2 * t + e] = a[:, 0, e], a[:, 1, e]
        A[g, 8 + 2 * t + e], A[g + 8, 8 + 2 * t + e] = a[:, 2, e], a[:, 3, e]
        B[2 * t + e, g], B[8 + 2 * t + e, g] = b[:, 0, e], b[:, 1, e]
    D = A @ B
    acc[:, 0] += D[g, 2 * t]
    acc[:, 1] += D[g, 2 * t + 1]
    acc[:, 2] += D[g + 8, 2 * t]
    acc[:, 3] += D[g + 8, 2 * t + 1]


def _v6_emulated(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """v6 run on the CPU, one block and one warp at a time, with the kernel's own index arithmetic
    (copies, swizzle, ldmatrix addresses, fragment registers, epilogue) and the PTX semantics of
    ldmatrix and mma.sync. C is returned in float64 (unrounded); unwritten entries are NaN."""
    (m, k), n = a.shape, b.shape[1]
    c = np.full((m, n), np.nan)
    tiles = -(-k // V6_BK)
    for row0 in range(0, m, V6_BM):
        for col0 in range(0, n, V6_BN):
            sA = np.full((V6_STAGES, V6_BM * V6_CA, 8), np.nan)
            sB = np.full((V6_STAGES, V6_BK * V6_CB, 8), np.nan)

            def load_tiles(s, k0):
                for i in range(V6_BM * V6_CA // V6_NT):
                    for tid in range(V6_NT):
                        o, r, ch = _copy_offsets(i, tid, "a")
                        inside = row0 + r < m and k0 + ch * 8 < k
                        sA[s, o] = a[row0 + r, k0 + ch * 8:k0 + ch * 8 + 8] if inside else 0
                for i in range(V6_BK * V6_CB // V6_NT):
                    for tid in range(V6_NT):
                        o, r, ch = _copy_offsets(i, tid, "b")
                        inside = k0 + r < k and col0 + ch * 8 < n
                        sB[s, o] = b[k0 + r, col0 + ch * 8:col0 + ch * 8 + 8] if inside else 0

            acc = np.zeros((V6_NT // 32, V6_WM // 16, V6_WN // 8, 32, 4))
            for s in range(V6_STAGES - 1):
                if s < tiles:
                    load_tiles(s, s * V6_BK)
            for t in range(tiles):
                nxt = t + V6_STAGES - 1
                if nxt < tiles:
                    load_tiles(nxt % V6_STAGES, nxt * V6_BK)
                s = t % V6_STAGES
                for warp in range(V6_NT // 32):
                    for kk in range(V6_BK // 16):
                        offs = _ldmatrix_offsets(warp, kk)
                        fa = [_ldmatrix(sA[s], offs["a", i], False) for i in range(V6_WM // 16)]
                        fb = [_ldmatrix(sB[s], offs["b", j], True) for j in range(V6_WN // 16)]
                        for i in range(V6_WM // 16):
                            for j in range(V6_WN // 8):
                                bj = fb[j // 2][:, 2 * (j % 2):2 * (j % 2) + 2]
                                _mma(acc[warp, i, j], fa[i], bj)
            g, t4 = LANES // 4, LANES % 4
            for warp in range(V6_NT // 32):
                wm0, wn0 = _v6_warp_origin(warp)
                for i in range(V6_WM // 16):
                    for j in range(V6_WN // 8):
                        for lane in LANES:
                            col = col0 + wn0 + j * 8 + 2 * t4[lane]
                            for h in range(2):
                                row = row0 + wm0 + i * 16 + g[lane] + 8 * h
                                if row < m and col < n:
                                    c[row, col:col + 2] = acc[warp, i, j, lane, 2 * h:2 * h + 2]
    return c


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("m, n, k", [(8, 8, 8), (130, 136, 200), (40, 264, 72)])
def test_v6_index_math_emulated(m, n, k):
    """The kernel's index arithmetic with the PTX semantics of its instructions, run on the CPU:
    every entry of C written, and equal to the exact product of fp16 inputs (float64 sums: only
    the order differs). Shapes cut the 128 x 128 tile, leave K a partial 64-deep step, and use
    more than one block along N."""
    ah, bh = _operands(m, n, k, "cpu", torch.float16, seed=_seed(m, n, k))
    a, b = ah.double().numpy(), bh.double().numpy()
    c = _v6_emulated(a, b)
    assert not np.isnan(c).any()
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- GPU: every version

@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("version", sorted(WMMA_VERSIONS))
@pytest.mark.parametrize("m, n, k", WHOLE_SHAPES)
def test_versions_whole_tiles(version, dtype, m, n, k):
    a, b = _operands(m, n, k, "cuda", dtype, seed=_seed(m, n, k))
    poison_allocator(m * n * 2, "cuda")
    _check(WMMA_VERSIONS[version](a, b), a, b, f"{version} {dtype} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("version", ["v0", "v2", "v3", "v4", "v5", "v6", "v7"])
@pytest.mark.parametrize("m, n, k", RAGGED_SHAPES)
def test_versions_ragged(version, dtype, m, n, k):
    a, b = _operands(m, n, k, "cuda", dtype, seed=_seed(m, n, k))
    poison_allocator(m * n * 2, "cuda")
    _check(WMMA_VERSIONS[version](a, b), a, b, f"{version} {dtype} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1000, 2048, 4104), (128, 128, 64)])
def test_v6_at_full_size(dtype, m, n, k):
    """v6 across many 64-deep steps (the 3-stage ring wraps around dozens of times), a K that ends
    in a partial step, and exactly one block with exactly one step."""
    a, b = _operands(m, n, k, "cuda", dtype, seed=_seed(m, n, k))
    poison_allocator(m * n * 2, "cuda")
    _check(w.wmma_mma(a, b), a, b, f"v6 {dtype} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(17, 40, 24), (384, 256, 264), (256, 384, 512)])
def test_cp_async_changes_nothing_but_timing(dtype, m, n, k):
    """v3 issues the same MMAs in the same order as v2; only the copies differ. Its result is bit-identical."""
    a, b = _operands(m, n, k, "cuda", dtype, seed=_seed(m, n, k))
    assert torch.equal(w.wmma_smem(a, b), w.wmma_async(a, b))


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("version", sorted(WMMA_VERSIONS))
def test_special_values(version, dtype):
    """Zeros give exact zeros; the identity gives B back exactly (products by 1 and sums with 0 are exact); an
    infinity in A spreads along its row of C only."""
    fn = WMMA_VERSIONS[version]
    a, b = _operands(64, 96, 48, "cuda", dtype)
    assert torch.count_nonzero(fn(torch.zeros_like(a), b)) == 0
    eye = torch.eye(48, device="cuda", dtype=dtype)
    assert torch.equal(fn(eye, b[:48].contiguous()), b[:48])
    a_inf = a.abs()
    a_inf[5, 3] = float("inf")
    c = fn(a_inf, b.abs())
    assert torch.isinf(c[5]).all() and torch.isfinite(torch.cat([c[:5], c[6:]])).all()


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("name, m, n, k, words", UNSUPPORTED)
def test_gpu_unsupported_sizes_refused(name, m, n, k, words):
    fn = w.tf32_wmma if name == "tf32" else CUDA_HALF[name]
    dtype = torch.float32 if name == "tf32" else torch.float16
    a, b = _operands(m, n, k, "cuda", dtype)
    with pytest.raises(ValueError, match=words):
        fn(a, b)


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("name", ["v1", "v2", "v3", "v6", "v7", "tf32"])
def test_gpu_misaligned_view_refused(name):
    fn = w.tf32_wmma if name == "tf32" else CUDA_HALF[name]
    dtype = torch.float32 if name == "tf32" else torch.float16
    buf = torch.randn(32 * 32 + 8, device="cuda").to(dtype)
    a = buf[1:1 + 32 * 32].view(32, 32)
    b = torch.randn(32, 32, device="cuda").to(dtype)
    with pytest.raises(ValueError, match="byte boundary"):
        fn(a, b)
    _check(fn(a.clone(), b), a, b, f"{name} after clone")


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("version", sorted(WMMA_VERSIONS))
@pytest.mark.parametrize("case", range(N_BAD))
def test_gpu_bad_input_refused(version, case):
    label, args, exc, words = _bad_operands("cuda", torch.float16)[case]
    with pytest.raises(exc, match=words):
        WMMA_VERSIONS[version](*args)


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("version", sorted(TF32_VERSIONS))
@pytest.mark.parametrize("case", range(N_BAD))
def test_gpu_tf32_bad_input_refused(version, case):
    label, args, exc, words = _bad_operands("cuda", torch.float32)[case]
    with pytest.raises(exc, match=words):
        TF32_VERSIONS[version](*args)


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("version", sorted(TF32_VERSIONS))
@pytest.mark.parametrize("m, n, k", TF32_SHAPES)
def test_tf32_versions(version, m, n, k):
    a, b = _operands(m, n, k, "cuda", torch.float32, seed=_seed(m, n, k))
    poison_allocator(m * n * 4, "cuda")
    _check(TF32_VERSIONS[version](a, b), a, b, f"tf32 {version} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k", TF32_SHAPES)
def test_tf32_wmma_is_the_emulation(m, n, k):
    """v1 rounds each input with cvt.rna.tf32.f32, multiplies exactly and sums in fp32: against the exact
    product of tf32_round's inputs its error is fp32-sized (the SGEMM tolerance), not TF32-sized. This pins
    down the rounding mode, not only the accuracy."""
    a, b = _operands(m, n, k, "cuda", torch.float32, seed=_seed(m, n, k))
    c = w.tf32_wmma(a, b)
    rtol, atol = sgemm.tolerance_for_k(k)
    torch.testing.assert_close(c.double(), w.tf32_matmul_emulated(a, b), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
def test_v0_is_tf32_and_restores_the_flag():
    """With the flag on for the call, cuBLAS multiplies in TF32: its error is far beyond what IEEE fp32 would
    give (the SGEMM tolerance), within the TF32 one, and the caller's setting comes back."""
    m = n = k = 1024
    a, b = _operands(m, n, k, "cuda", torch.float32)
    exact = a.double() @ b.double()
    rtol32, atol32 = sgemm.tolerance_for_k(k)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for setting in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = setting
            c = w.tf32_cublas(a, b)
            assert torch.backends.cuda.matmul.allow_tf32 is setting
            _check(c, a, b, f"v0 with allow_tf32={setting}")
            assert not torch.allclose(c.double(), exact, rtol=rtol32, atol=atol32), "v0 did not use TF32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
def test_grid_limit_refused():
    """v2's grid puts tiles of 128 rows on gridDim.y: more than 65535 of them is refused, not launched."""
    a = torch.empty((128 * 65535 + 1, 8), device="cuda", dtype=torch.float16)
    b = torch.empty((8, 8), device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="gridDim.y"):
        w.wmma_smem(a, b)

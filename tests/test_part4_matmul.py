"""The Part 4 matmul: every Triton version on ragged shapes and strided operands against float64 (fp16 under
the interpreter, bf16 on a GPU), fp8 with per-tensor scales and int8 with exact int32 sums, the program order of
the tiles, the autotuner's config space and its shared-memory pruning, the refusals (shapes, dtypes, scales,
TMA alignment), and the Hopper kernels compiled for sm_90 on any machine."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from helpers import cancelling_operands, compile_script_results

from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets._checks import triton_interpreting
from snippets.common import gemm
from snippets.part4 import matmul as mm
from snippets.registry import CEILING_MEASURES, CEILINGS

HALF = torch.float16 if not HAS_GPU else torch.bfloat16  # the interpreter has no bf16 arithmetic
TILED = {"v1": mm.matmul_rowmajor, "v2": mm.matmul_grouped, "v3": mm.matmul_autotuned}
# Ragged in every direction against the 32 x 32 x 32 interpreter tiles (and the 128 x 128 x 64 of v1/v2): one
# row, K shorter than one step, sizes one past a multiple, several groups of GROUP_M block rows.
RAGGED = [(1, 1, 1), (1, 37, 5), (17, 3, 40), (33, 65, 31), (130, 70, 97), (200, 48, 16)]
# Shapes the TMA version takes: K and N multiples of 8 (16-byte rows of fp16/bf16).
ALIGNED = [(1, 8, 8), (17, 40, 24), (65, 96, 136), (160, 200, 64)]


def _operands(m, n, k, dtype=HALF, device=DEVICE, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device)
    b = torch.randn(k, n, generator=g, device=device)
    return a.to(dtype), b.to(dtype)


def _check(c, a, b, label):
    m, k = a.shape
    assert c.shape == (m, b.shape[1]) and c.dtype == a.dtype and c.device == a.device, label
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = mm.tolerance_for(k, a.dtype)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


def _poison(m, n, itemsize=4):
    poison_allocator(m * n * itemsize, DEVICE)


# ---------------------------------------------------------------- registry

@pytest.mark.op("matmul")
@pytest.mark.op("matmul_fp8")
@pytest.mark.op("matmul_int8")
def test_registry():
    assert list(mm.matmul.impls) == ["v0", "v1", "v2", "v3", "v4"]
    assert list(mm.matmul_fp8.impls) == list(mm.matmul_int8.impls) == ["v0", "v1", "v2"]
    assert mm.matmul.ceiling == "gemm_bf16" and mm.matmul.timed_dtypes() == (torch.bfloat16, torch.float16)
    assert mm.matmul_fp8.ceiling == "gemm_fp8" and mm.matmul_int8.ceiling == "gemm_int8"
    for name in ("gemm_fp8", "gemm_int8"):
        assert name in CEILINGS and callable(CEILING_MEASURES[name])
    assert mm.matmul_fp8.output_dtype(mm.FP8) == torch.bfloat16
    assert mm.matmul_int8.output_dtype(torch.int8) == torch.int32
    size = {"m": 2, "n": 3, "k": 5}
    assert mm.matmul.flops(size, torch.bfloat16) == mm.matmul_int8.flops(size, torch.int8) == 60
    assert mm.matmul.bytes_moved(size, torch.bfloat16) == (10 + 15 + 6) * 2
    assert mm.matmul_fp8.bytes_moved(size, mm.FP8) == 10 + 15 + 6 * 2
    assert mm.matmul_int8.bytes_moved(size, torch.int8) == 10 + 15 + 6 * 4
    # The headline must be far beyond the 50 MB L2: A, B and C together.
    assert mm.matmul.bytes_moved(mm.matmul.headline, torch.bfloat16) > 6 * 50e6
    assert mm.matmul.impls["v4"].requires is mm.needs_hopper


@pytest.mark.op("matmul_fp8")
@pytest.mark.op("matmul_int8")
def test_low_precision_inputs_are_what_cublas_takes():
    gen = torch.Generator().manual_seed(0)
    a, b, sa, sb = mm._make_fp8_inputs({"m": 32, "n": 48, "k": 64}, mm.FP8, "cpu", gen)
    assert a.dtype == b.dtype == mm.FP8 and a.stride() == (64, 1) and b.shape == (64, 48) and b.stride() == (1, 64)
    assert sa.dtype == sb.dtype == torch.float32 and sa.dim() == 0
    # The scale maps the largest magnitude to e4m3's largest value, 448: the full range is used.
    assert a.float().abs().max().item() == mm.FP8_MAX
    a, b = mm._make_int8_inputs({"m": 32, "n": 48, "k": 64}, torch.int8, "cpu", gen)
    assert b.stride() == (1, 64) and a.min() < -100 and a.max() > 100


def test_test_sizes_fit_every_version():
    """tests/test_ops.py runs every version at every registered size: none may be refused."""
    for size in mm.matmul.test_sizes:
        assert size["n"] % 8 == 0 and size["k"] % 8 == 0  # TMA: 16-byte rows of 2-byte values
    for op in (mm.matmul_fp8, mm.matmul_int8):
        for size in op.test_sizes:
            assert size["m"] > 16 and all(size[d] % 16 == 0 for d in "mnk")  # cuBLAS fp8/int8, 1-byte TMA rows


# ---------------------------------------------------------------- tile order

@triton.jit
def _order_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = gemm.tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * pid, pid_m)
    tl.store(out_ptr + 2 * pid + 1, pid_n)


def _order(num_pid_m, num_pid_n, group):
    out = torch.full((num_pid_m * num_pid_n, 2), -1, dtype=torch.int32, device=DEVICE)
    _order_kernel[(num_pid_m * num_pid_n,)](out, num_pid_m, num_pid_n, group)
    return [tuple(r) for r in out.cpu().tolist()]


@pytest.mark.op("matmul")
@pytest.mark.parametrize("num_pid_m, num_pid_n", [(1, 1), (5, 3), (7, 4), (16, 16)])
def test_tile_order(num_pid_m, num_pid_n):
    row_major = _order(num_pid_m, num_pid_n, 1)
    assert row_major == [(i, j) for i in range(num_pid_m) for j in range(num_pid_n)]
    grouped = _order(num_pid_m, num_pid_n, 4)
    assert sorted(grouped) == sorted(row_major)  # every tile exactly once
    # Within a full group, consecutive programs walk down 4 block rows of one column, then the next column.
    if num_pid_m >= 4:
        assert grouped[:4] == [(i, 0) for i in range(4)]
        if num_pid_n > 1:
            assert grouped[4] == (0, 1)
    # The last group may be short (7 = 4 + 3 block rows): it still covers its rows column by column.
    if num_pid_m == 7:
        tail = grouped[4 * num_pid_n:]
        assert tail[:3] == [(4, 0), (5, 0), (6, 0)]


def test_grouping_cuts_the_tiles_a_wave_touches():
    """The L2 argument in numbers: the first 132 programs (one wave on 132 SMs) of a 64 x 64 tile grid
    (8192^2 with 128 x 128 tiles) touch 3 rows of A and 64 columns of B in row-major order, 8 and 17 grouped."""
    def touched(order):
        wave = order[:132]
        return len({m for m, _ in wave}), len({n for _, n in wave})

    grid = [(i, j) for i in range(64) for j in range(64)]
    assert touched(grid) == (3, 64)
    group = 8
    grouped = [(g * group + (t % (group * 64)) % group, (t % (group * 64)) // group)
               for t in range(64 * 64) for g in [t // (group * 64)]]
    assert touched(grouped) == (8, 17)
    if DEVICE == "cpu":  # the same order from the kernel's own function
        assert _order(64, 64, group)[:132] == grouped[:132]


# ---------------------------------------------------------------- CPU (interpreter) and GPU correctness

@pytest.mark.op("matmul")
@pytest.mark.parametrize("version", sorted(TILED))
@pytest.mark.parametrize("m, n, k", RAGGED)
def test_tiled_versions_on_ragged_shapes(version, m, n, k):
    a, b = _operands(m, n, k, seed=m * 1009 + n * 31 + k)
    _poison(m, n)
    _check(TILED[version](a, b), a, b, f"{version} {m}x{n}x{k}")


@pytest.mark.op("matmul")
@pytest.mark.parametrize("version", sorted(TILED))
def test_tiled_versions_take_any_strides(version):
    """Transposed and sliced views: the kernels take every stride as an argument."""
    a_t, b_t = _operands(48, 40, 70)
    a = a_t.t().contiguous().t()                          # column-major A
    b = torch.cat([b_t, b_t], dim=1)[:, ::2]              # every other column: stride 2 along N
    assert not a.is_contiguous() and b.stride(1) == 2
    _check(TILED[version](a, b), a, b, f"{version} strided")


@pytest.mark.op("matmul")
def test_generic_tolerance_is_sized_for_the_tested_k():
    """tests/test_ops.py holds each test size to tolerance_for its own K (Op.tolerance_at), not to the
    table's, which is sized for the benchmark's largest K and would let an error of a whole product
    (|a b| ~ 1 at K = 72, an index off by one) through."""
    for size in mm.TEST_SIZES:
        assert mm.matmul.tolerance(torch.float16, size) == mm.tolerance_for(size["k"], torch.float16)
    small, table = mm.matmul.tolerance(torch.float16, mm.TEST_SIZES[-1]), mm.matmul.tolerance(torch.float16)
    assert table == mm.tolerance_for(mm.MAX_K, torch.float16) and small[1] < 0.1 < 0.5 < table[1]
    assert mm.matmul_int8.tolerance(torch.int8, mm.LOW_TEST_SIZES[0]) == (0.0, 0.0), "no tolerance_at: the table"


@pytest.mark.op("matmul")
@pytest.mark.parametrize("version", [*sorted(TILED), "v4"])
def test_sums_are_fp32_not_the_input_dtype(version):
    """Running sums far larger than C (helpers.cancelling_operands): an accumulator of the input dtype
    loses C by far more than tolerance_for(K), which ordinary random operands at test sizes never show."""
    a, b = cancelling_operands(16, 24, 128, HALF, DEVICE)
    _poison(16, 24)
    _check({**TILED, "v4": mm.matmul_persistent}[version](a, b), a, b, f"{version} cancelling sums")


@pytest.mark.op("matmul")
@pytest.mark.parametrize("m, n, k", ALIGNED)
def test_persistent_tma(m, n, k):
    if mm.needs_hopper():
        pytest.skip(mm.needs_hopper())
    a, b = _operands(m, n, k, seed=k)
    _poison(m, n)
    _check(mm.matmul_persistent(a, b), a, b, f"v4 {m}x{n}x{k}")


@pytest.mark.op("matmul")
def test_persistent_loops_over_more_tiles_than_programs():
    """Under the interpreter the persistent grid has 3 programs; 7 x 5 tiles of 32 x 32 make each loop 11 or
    12 times (on a GPU: the same with the SM count, at a larger size)."""
    if mm.needs_hopper():
        pytest.skip(mm.needs_hopper())
    m, n, k = (7 * 32 - 5, 5 * 32, 48) if triton_interpreting() else (33 * 128, 17 * 256, 256)
    a, b = _operands(m, n, k)
    _check(mm.matmul_persistent(a, b), a, b, "v4 many tiles")


def _fp8_operands(m, n, k, seed=0, col_major=True):
    gen = torch.Generator().manual_seed(seed)
    a, b, sa, sb = mm._make_fp8_inputs({"m": m, "n": n, "k": k}, mm.FP8, DEVICE, gen)
    return a, (b if col_major else b.contiguous()), sa, sb


def _check_fp8(c, a, b, sa, sb, label):
    assert c.dtype == torch.bfloat16 and c.shape == (a.shape[0], b.shape[1]), label
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = mm.tolerance_for(a.shape[1], torch.bfloat16)
    torch.testing.assert_close(c.double(), mm.matmul_fp8_ref(a, b, sa, sb), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


@pytest.mark.op("matmul_fp8")
@pytest.mark.parametrize("col_major", [True, False], ids=["b-col-major", "b-row-major"])
@pytest.mark.parametrize("m, n, k", [(1, 5, 7), (33, 17, 50), (80, 96, 160)])
def test_fp8_triton(m, n, k, col_major):
    a, b, sa, sb = _fp8_operands(m, n, k, seed=m + n + k, col_major=col_major)
    _poison(m, n)
    _check_fp8(mm.matmul_fp8_triton(a, b, sa, sb), a, b, sa, sb, f"fp8 v1 {m}x{n}x{k}")


@pytest.mark.op("matmul_fp8")
@pytest.mark.parametrize("m, n, k", [(1, 16, 16), (40, 48, 80), (100, 112, 144)])
def test_fp8_persistent(m, n, k):
    if mm.needs_hopper():
        pytest.skip(mm.needs_hopper())
    a, b, sa, sb = _fp8_operands(m, n, k, seed=k)
    _check_fp8(mm.matmul_fp8_persistent(a, b, sa, sb), a, b, sa, sb, f"fp8 v2 {m}x{n}x{k}")
    # One-element (1,) scales are taken as well as 0-d ones.
    c = mm.matmul_fp8_persistent(a, b, sa.reshape(1), sb.reshape(1))
    _check_fp8(c, a, b, sa, sb, "fp8 v2, (1,) scales")


@pytest.mark.op("matmul_fp8")
def test_scales_are_applied():
    """Doubling a scale doubles C (a wrong or missing scale cannot pass)."""
    a, b, sa, sb = _fp8_operands(32, 32, 64)
    c1 = mm.matmul_fp8_triton(a, b, sa, sb).double()
    c2 = mm.matmul_fp8_triton(a, b, 2 * sa, sb).double()
    torch.testing.assert_close(c2, 2 * c1)  # exact: a power of two
    assert c1.abs().max() > 1  # and C is of the size of the unscaled product


@pytest.mark.op("matmul_int8")
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 33, 70), (64, 48, 96), (130, 40, 33)])
def test_int8_exact(m, n, k):
    gen = torch.Generator().manual_seed(m + k)
    a, b = mm._make_int8_inputs({"m": m, "n": n, "k": k}, torch.int8, DEVICE, gen)
    _poison(m, n)
    c = mm.matmul_int8_triton(a, b)
    assert c.dtype == torch.int32
    assert torch.equal(c.long().cpu(), mm.matmul_int8_ref(a, b).cpu())


@pytest.mark.op("matmul_int8")
@pytest.mark.parametrize("persistent", [False, True], ids=["v1", "v2"])
def test_int8_extremes(persistent):
    """-128 * -128 summed 2048 times is 2^25: exact in int32, rounded in fp32-accumulated or fp16 paths."""
    if persistent and mm.needs_hopper():
        pytest.skip(mm.needs_hopper())
    k = 2048
    a = torch.full((32, k), -128, dtype=torch.int8, device=DEVICE)
    b = mm._column_major(torch.full((k, 32), -128, dtype=torch.int8, device=DEVICE))
    a[0, 0] = 127  # 2^25 - 128*128 + 127*(-128): not a round number
    c = (mm.matmul_int8_persistent if persistent else mm.matmul_int8_triton)(a, b)
    assert c[1, 1].item() == 2**25 and c[0, 0].item() == 2**25 - 16384 - 16256


# ---------------------------------------------------------------- autotuning space

def test_config_space_and_pruning(monkeypatch):
    h100 = 232448  # 227 KB: an H100's or H200's shared memory per program (opt-in)
    monkeypatch.setattr(gemm, "device_smem_limit", lambda index: h100)
    for in_bytes, persistent in ((2, False), (1, False), (2, True), (1, True)):
        configs = gemm.config_space(in_bytes, persistent)
        assert len(configs) >= 6
        assert all(c.kwargs["BLOCK_K"] * in_bytes == 128 for c in configs)
        dtype = torch.float16 if in_bytes == 2 else torch.int8
        out = torch.empty(1, dtype=torch.int32 if in_bytes == 1 else dtype)
        a = torch.empty(1, dtype=dtype)
        named = ({"a_desc": type("D", (), {"base": a})(), "c_desc": type("D", (), {"base": out})()} if persistent
                 else {"a_ptr": a, "c_ptr": out})
        kept = gemm.prune_configs(configs, named)
        assert kept and all(gemm.smem_bytes(c, in_bytes, out.element_size(), persistent) <= h100 for c in kept)
        if persistent and in_bytes == 1:  # int8 -> int32: 4 stages of 128 x 256 x 128 plus a 64 KB C tile
            assert len(kept) < len(configs)
    monkeypatch.setattr(gemm, "device_smem_limit", lambda index: 1024)
    assert len(gemm.prune_configs(gemm.config_space(2), {"a_ptr": a, "c_ptr": out})) == 1  # never empty


# ---------------------------------------------------------------- sm_90 compilation on any machine

COMPILE_SCRIPT = """
import json, torch
from snippets.part4 import matmul as mm
out = []
for dtype in (torch.bfloat16, torch.float16, mm.FP8, torch.int8):
    for persistent in (True, False):
        bn = 128 if dtype == torch.int8 else 256
        ck = mm.compile_for_hopper(dtype, persistent=persistent, BLOCK_N=bn)
        ptx = ck.asm["ptx"]
        out.append(dict(dtype=str(dtype), persistent=persistent, shared=ck.metadata.shared, bn=bn,
                        wgmma=ptx.count("wgmma.mma_async"), tma="cp.async.bulk.tensor" in ptx,
                        cubin=len(ck.asm["cubin"]), spills="local" in ptx))
print(json.dumps(out))
"""


@pytest.mark.op("matmul")
@pytest.mark.op("matmul_fp8")
@pytest.mark.op("matmul_int8")
def test_hopper_kernels_compile_for_sm90():
    """Triton compiles for sm_90 on the host: v3's and v4's kernels, in each input dtype, must reach wgmma
    (and TMA copies for v4), with the shared memory the pruning function predicts. A separate process,
    because under the interpreter the kernels are not compiled objects."""
    results = compile_script_results(COMPILE_SCRIPT)
    assert len(results) == 8
    for r in results:
        assert r["wgmma"] > 0, r
        assert r["tma"] == r["persistent"], r
        assert r["cubin"] > 0 and not r["spills"], r
        in_bytes = 2 if "16" in r["dtype"] else 1
        out_bytes = 4 if "int8" in r["dtype"] else 2
        cfg = triton.Config(dict(BLOCK_M=128, BLOCK_N=r["bn"], BLOCK_K=128 // in_bytes), num_stages=3)
        predicted = gemm.smem_bytes(cfg, in_bytes, out_bytes, r["persistent"])
        assert predicted <= r["shared"] <= predicted + 1024, (r, predicted)  # + a few barriers


# ---------------------------------------------------------------- refusals

def _bad_cases(device):
    a, b = _operands(6, 8, 8, torch.float16, device)
    return [
        ("float32 a", (a.float(), b), TypeError, "dtype"),
        ("mixed dtypes", (a, b.to(torch.bfloat16)), TypeError, "dtype"),
        ("int32", (a.int(), b.int()), TypeError, "dtype"),
        ("K mismatch", (a, torch.zeros(16, 8, device=device, dtype=a.dtype)), ValueError, "inner dimensions"),
        ("1-D a", (a.reshape(-1), b), ValueError, "2-D"),
        ("3-D b", (a, b.reshape(2, 4, 8)), ValueError, "2-D"),
        ("empty a", (a[:0], b), ValueError, "empty"),
        ("empty K", (a[:, :0], b[:0]), ValueError, "empty"),
        ("not a tensor", (a.tolist(), b), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("matmul")
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
@pytest.mark.parametrize("case", range(len(_bad_cases("cpu"))))
def test_refusals(version, case):
    label, args, exc, words = _bad_cases(DEVICE)[case]
    fn = {**TILED, "v4": mm.matmul_persistent}[version]
    with pytest.raises(exc, match=words):
        fn(*args)


@pytest.mark.op("matmul")
@pytest.mark.parametrize("m, n, k, words", [(8, 8, 12, "rows 24 bytes apart"), (8, 12, 8, "rows 24 bytes apart"),
                                            (8, 7, 8, "rows 14 bytes apart")])
def test_persistent_refuses_misaligned_rows(m, n, k, words):
    a, b = _operands(m, n, k, torch.float16)
    with pytest.raises(ValueError, match=f"TMA needs 16-byte aligned rows.*{words}"):
        mm.matmul_persistent(a, b)


@pytest.mark.op("matmul")
def test_persistent_refuses_misaligned_base_and_strides():
    a, b = _operands(16, 16, 24, torch.float16)
    shifted = torch.empty(16 * 24 + 1, dtype=torch.float16, device=DEVICE)[1:].reshape(16, 24)  # 2 bytes in
    with pytest.raises(ValueError, match="16-byte boundary"):
        mm.matmul_persistent(shifted, b)
    with pytest.raises(ValueError, match="contiguous along one dimension"):
        mm.matmul_persistent(a, torch.cat([b, b], dim=1)[:, ::2])


@pytest.mark.op("matmul_fp8")
def test_fp8_refusals():
    a, b, sa, sb = _fp8_operands(16, 16, 32)
    cases = [
        ((a.float(), b, sa, sb), TypeError, "dtype"),
        ((a, b.to(torch.float8_e5m2), sa, sb), TypeError, "dtype"),
        ((a, b, sa.double(), sb), TypeError, "scale_a must be float32"),
        ((a, b, sa, torch.ones(16, device=DEVICE)), ValueError, "scale_b must hold one value"),
        ((a, b, sa, torch.ones(1, 1, device=DEVICE)), ValueError, "scale_b must hold one value"),
        ((a, b, 0.5, sb), TypeError, "scale_a must be a torch.Tensor"),
        ((a, b[:16], sa, sb), ValueError, "inner dimensions"),
    ]
    for fn in (mm.matmul_fp8_triton, mm.matmul_fp8_persistent):
        for args, exc, words in cases:
            with pytest.raises(exc, match=words):
                fn(*args)
    with pytest.raises(ValueError, match="TMA needs 16-byte aligned rows"):
        a2, b2, sa2, sb2 = _fp8_operands(16, 16, 24)  # K = 24 bytes
        mm.matmul_fp8_persistent(a2, b2, sa2, sb2)


@pytest.mark.op("matmul_int8")
def test_int8_refusals():
    a = torch.ones(4, 8, dtype=torch.int8, device=DEVICE)
    with pytest.raises(TypeError, match="dtype"):
        mm.matmul_int8_triton(a, torch.ones(8, 4, dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match="overflow the int32 sums"):
        mm.matmul_int8_triton(torch.ones(1, 2**17 + 1, dtype=torch.int8, device=DEVICE),
                              torch.ones(2**17 + 1, 1, dtype=torch.int8, device=DEVICE))
    with pytest.raises(ValueError, match="TMA needs 16-byte aligned rows"):
        mm.matmul_int8_persistent(torch.ones(4, 8, dtype=torch.int8, device=DEVICE),
                                  torch.ones(8, 16, dtype=torch.int8, device=DEVICE))


@pytest.mark.op("matmul")
@pytest.mark.op("matmul_fp8")
@pytest.mark.op("matmul_int8")
def test_cublas_versions_refuse_cpu_tensors():
    a, b = _operands(32, 32, 32, torch.float16, "cpu")
    with pytest.raises(ValueError, match="cuda device"):
        mm.matmul_cublas(a, b)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="cuda device"):
        mm.matmul_fp8_cublas(*mm._make_fp8_inputs({"m": 32, "n": 32, "k": 32}, mm.FP8, "cpu", gen))
    with pytest.raises(ValueError, match="cuda device"):
        mm.matmul_int8_cublas(*mm._make_int8_inputs({"m": 32, "n": 32, "k": 32}, torch.int8, "cpu", gen))


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.op("matmul")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 8192, 1024), (4095, 4097, 4099), (2048, 2048, 2048)])
def test_gpu_all_versions(dtype, m, n, k):
    a, b = _operands(m, n, k, dtype, "cuda", seed=3)
    versions = {"v0": mm.matmul_cublas, **TILED}
    if n % 8 == 0 and k % 8 == 0:
        versions["v4"] = mm.matmul_persistent
    for name, fn in versions.items():
        _check(fn(a, b), a, b, f"{name} {dtype} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("matmul_fp8")
def test_gpu_fp8_matches_cublas():
    a, b, sa, sb = _fp8_operands(4096, 4096, 4096, seed=5)
    ref = mm.matmul_fp8_ref(a, b, sa, sb)
    rtol, atol = mm.tolerance_for(4096, torch.bfloat16)
    for fn in (mm.matmul_fp8_cublas, mm.matmul_fp8_triton, mm.matmul_fp8_persistent):
        torch.testing.assert_close(fn(a, b, sa, sb).double(), ref, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.op("matmul_int8")
def test_gpu_int8_matches_cublas_exactly():
    gen = torch.Generator().manual_seed(6)
    a, b = mm._make_int8_inputs({"m": 4096, "n": 2048, "k": 4096}, torch.int8, "cuda", gen)
    ref = mm.matmul_int8_cublas(a, b)
    assert torch.equal(mm.matmul_int8_triton(a, b), ref)
    assert torch.equal(mm.matmul_int8_persistent(a, b), ref)
    assert torch.equal(ref.long(), mm.matmul_int8_ref(a, b))


@pytest.mark.gpu
@pytest.mark.op("matmul_fp8")
@pytest.mark.op("matmul_int8")
def test_gpu_ceilings_measure():
    for name in ("gemm_fp8", "gemm_int8"):
        c = CEILING_MEASURES[name](True)
        assert c["unit"] == "TFLOP/s" and 50 < c["value"] < 5000, c

"""The Part 6 Hopper GEMM (csrc/part6/hopper_gemm.cu, snippets/part6/gemm.py).

On a CPU: the file compiles for sm_90a with nvcc exactly as the launcher builds it, without spills;
its SASS holds the instructions each version is about (HGMMA from wgmma, UTMALDG from TMA, the
setmaxnreg pair for the warp-specialised versions); its constants are the launcher's; the
descriptor it builds is snippets/part6/hopper.py's; v4's tile order visits every tile once; every
bad input is refused before a launch. On a GPU (marked ``gpu``): every version against the float64
product at ragged and aligned shapes."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import (
    assert_gemm_fully_written_and_repeatable,
    assert_gemm_matches_float64,
    nvcc_with_report,
    sass_by_function,
)
from test_cuda_compile import parse_ptxas, spilling_functions

from conftest import HAS_GPU
from snippets.part6 import gemm
from snippets.part6.hopper import (
    SMEM_LIMIT_SM90,
    check_gemm_operands,
    kmajor_offsets,
    wgmma_descriptor,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / gemm.CU_FILE
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
VERSIONS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v9", "v10")


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> tuple[Path, str]:
    """The cubin built by the launcher's own nvcc command (plus ptxas's report), and that report."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("hopper") / "hopper_gemm.cubin"
    return out, nvcc_with_report(gemm.nvcc_command(out), REPO_ROOT)


# --------------------------------------------------------------------------------------------------
# The compiled kernels
# --------------------------------------------------------------------------------------------------

@pytest.mark.op("hopper_gemm")
@requires_nvcc
def test_compiles_for_sm90a_without_spills(cubin):
    _, report = cubin
    functions = parse_ptxas(report)
    kernels = {name for name, f in functions.items() if f["entry"]}
    assert kernels == {cfg.kernel for cfg in gemm.CONFIGS.values()}
    assert not spilling_functions(functions), report
    assert "C7515" not in report, f"ptxas serialises the wgmmas of a kernel:\n{report}"
    for cfg in gemm.CONFIGS.values():  # __launch_bounds__(threads, 1) caps 65536 / threads
        assert functions[cfg.kernel]["registers"] <= min(255, 65536 // cfg.threads)


@pytest.mark.op("hopper_gemm")
@requires_nvcc
def test_sass_uses_wgmma_tma_and_setmaxnreg(cubin):
    """The strongest check a CPU can make that the kernels are what the chapter says: wgmma
    compiles to HGMMA (with the tile shape in its name), TMA loads to UTMALDG, mbarrier waits to
    SYNCS, setmaxnreg to USETMAXREG; a plain-CUDA fallback would show none of them."""
    sass = sass_by_function(cubin[0])
    assert set(sass) == {cfg.kernel for cfg in gemm.CONFIGS.values()}
    for version, cfg in gemm.CONFIGS.items():
        code = sass[cfg.kernel]
        shape = f"HGMMA.64x{cfg.block_n if cfg.threads > 128 else 128}x16.F32.BF16"
        assert shape in code, f"{version}: no {shape}"
        assert "UTMALDG.2D" in code, f"{version}: no TMA load"
        assert "SYNCS.PHASECHK" in code, f"{version}: no mbarrier wait"
        has_setmaxnreg = "USETMAXREG" in code
        assert has_setmaxnreg == (cfg.threads == 384), f"{version}: setmaxnreg {has_setmaxnreg}"
        multicast = "UTMALDG.2D.MULTICAST" in code  # v5's shared half of B
        assert multicast == (cfg.cluster > 1), f"{version}: multicast {multicast}"
        tma_store = "UTMASTG.2D" in code  # v6's epilogue
        assert tma_store == cfg.tma_store, f"{version}: TMA store {tma_store}"
        cluster_barrier = "UCGABAR" in code
        assert cluster_barrier == (cfg.cluster > 1), f"{version}: cluster barrier {cluster_barrier}"
        wide = "STG.E.128" in code  # v9's 16-byte stores of C (v10 runs v9's kernel)
        assert wide == (cfg.kernel == "hopper_gemm_v9"), f"{version}: 16-byte stores {wide}"
        assert "HMMA" not in code.replace("HGMMA", ""), f"{version}: falls back to mma.sync"


@pytest.mark.op("hopper_gemm")
@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_other_targets_compile_to_traps(arch, tmp_path):
    """Without sm_90a's features every kernel body is a trap, so the file still builds for the
    book's other targets (tests/test_cuda_compile.py builds every csrc file for sm_80 too)."""
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", str(CU), "-o", str(tmp_path / "h.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _cu_constants() -> dict[str, int]:
    text = CU.read_text()
    return {name: int(value) for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+)\b", text)}


@pytest.mark.op("hopper_gemm")
def test_constants_match_the_launcher():
    c = _cu_constants()
    assert c["BLOCK_K"] == gemm.BLOCK_K and c["SWIZZLE_REPEAT"] == gemm.SWIZZLE_REPEAT
    assert c["GROUP_M"] == gemm.GROUP_M
    for v in ("v1", "v2"):
        cfg = gemm.CONFIGS[v]
        assert (c["BM_V1"], c["BN_V1"], c["WG_THREADS"]) == (cfg.block_m, cfg.block_n,
                                                            cfg.threads)
    assert c["STAGES_V2"] == gemm.CONFIGS["v2"].stages and gemm.CONFIGS["v1"].stages == 1
    for v in ("v3", "v4"):
        cfg = gemm.CONFIGS[v]
        assert (c["BM_WS"], c["BN_WS"], c["STAGES_WS"]) == (cfg.block_m, cfg.block_n, cfg.stages)
        assert cfg.threads == (1 + c["CONSUMERS"]) * c["WG_THREADS"]
    assert c["CLUSTER"] == gemm.CONFIGS["v5"].cluster == gemm.CONFIGS["v7"].cluster
    assert c["STAGES_WS"] == gemm.CONFIGS["v5"].stages and not gemm.CONFIGS["v5"].tma_store
    for v in ("v6", "v7"):  # v7 is cluster_gemm<STAGES_V6, kTma>
        assert c["STAGES_V6"] == gemm.CONFIGS[v].stages and gemm.CONFIGS[v].tma_store
    text = CU.read_text()
    assert "cluster_gemm<hg::STAGES_V6, hg::Epilogue::kTma>" in text
    # v9 is v5's body with the 16-byte epilogue; v10 is v9's kernel, its grid balanced
    assert "cluster_gemm<hg::STAGES_WS, hg::Epilogue::kRegs>" in text  # v5
    assert "cluster_gemm<hg::STAGES_WS, hg::Epilogue::kRegs16>" in text  # v9
    v5, v9, v10 = (gemm.CONFIGS[v] for v in ("v5", "v9", "v10"))
    assert v9 == dataclasses.replace(v5, kernel="hopper_gemm_v9")
    assert v10 == dataclasses.replace(v9, balanced=True)
    assert not any(cfg.balanced for v, cfg in gemm.CONFIGS.items() if v != "v10")
    assert f"__cluster_dims__({c['CLUSTER']}, 1, 1)" in text
    for cfg in gemm.CONFIGS.values():  # each kernel is declared with its block size
        assert re.search(rf"__launch_bounds__\({cfg.threads}, 1\)\s*{cfg.kernel}\(", text)


def _c_make_desc(addr: int) -> int:
    """make_desc of hopper_gemm.cu, transcribed: what the kernels put in each descriptor."""
    def enc(x):
        return (x & 0x3FFFF) >> 4
    return enc(addr) | enc(16) << 16 | enc(1024) << 32 | 1 << 62


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("rows", [64, 128, 256])
def test_kernel_descriptors_are_hopper_py_descriptors(rows):
    """The kernels' LBO and SBO are those kmajor_offsets gives a 128B-swizzled K-major tile of any
    height, and each descriptor they build (tile base, + 32 bytes per 16 elements of K, + 64 rows
    for the second half of A) is the one snippets/part6/hopper.py encodes."""
    lbo, sbo = kmajor_offsets(rows, gemm.BLOCK_K * 2, "128B")
    assert (lbo, sbo) == (16, 1024)
    for base in (0, 1024, 5 * 16384, 200 * 1024):
        for kk in range(gemm.BLOCK_K // 16):
            for half in (0, 64 * 128):
                addr = base + half + 32 * kk
                assert _c_make_desc(addr) == wgmma_descriptor(addr, lbo, sbo, "128B")


def _store_acc_coords(n: int) -> list[tuple[int, int]]:
    """store_acc of hopper_gemm.cu, transcribed: the (row, column) of the 64 x n tile that each
    accumulator register of each of the warpgroup's 128 threads is stored to."""
    out = []
    for t in range(128):
        warp, lane = divmod(t, 32)
        r = warp * 16 + lane // 4
        for j in range(n // 8):
            c = 8 * j + 2 * (lane % 4)
            out += [(r, c), (r, c + 1), (r + 8, c), (r + 8, c + 1)]  # d[4j], ..., d[4j + 3]
    return out


def _quad_transpose(words: list[list[int]]) -> list[list[int]]:
    """quad_transpose of hopper_gemm.cu, transcribed: ``words[q]`` are lane q's four words; the
    two rounds of __shfl_xor_sync, each lane sending the slot its partner keeps."""
    w = [list(x) for x in words]
    for k in (1, 2):
        new = [list(x) for x in w]
        for s in range(4):
            if s & k:
                continue
            send = [w[q][s] if q & k else w[q][s ^ k] for q in range(4)]
            for q in range(4):
                got = send[q ^ k]  # __shfl_xor_sync(mask, send, k)
                if q & k:
                    new[q][s] = got
                else:
                    new[q][s ^ k] = got
        w = new
    return w


def _store_acc16_stores(n: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """store_acc16 of hopper_gemm.cu, transcribed: one (row, first column, the 8 elements held)
    per 16-byte store of the warpgroup's 128 threads, an element being (row, column) of the tile
    whose accumulator the stored bf16 value came from."""
    coords, per = _store_acc_coords(n), n // 2  # store_acc's map: thread t's d[] is coords[t * per:]
    stores = []
    for warp in range(4):
        held = {lane: coords[(32 * warp + lane) * per:(32 * warp + lane + 1) * per]
                for lane in range(32)}
        for g in range(n // 32):
            for quad in range(8):
                lanes = [4 * quad + q for q in range(4)]
                lo = [[(held[ln][16 * g + 4 * i], held[ln][16 * g + 4 * i + 1]) for i in range(4)]
                      for ln in lanes]
                hi = [[(held[ln][16 * g + 4 * i + 2], held[ln][16 * g + 4 * i + 3])
                       for i in range(4)] for ln in lanes]
                lo, hi = _quad_transpose(lo), _quad_transpose(hi)
                for q, ln in enumerate(lanes):
                    r, c = warp * 16 + ln // 4, 8 * (4 * g + q)
                    stores.append((r, c, [e for pair in lo[q] for e in pair]))
                    stores.append((r + 8, c, [e for pair in hi[q] for e in pair]))
    return stores


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("n", [128, 256])
def test_epilogue16_stores_each_element_once_where_it_belongs(n):
    """After the quad's shuffles, every 16-byte store of v9 holds the 8 accumulators of the 8
    adjacent columns it writes, in order, and the stores cover the 64 x n tile exactly once."""
    stores = _store_acc16_stores(n)
    assert len(stores) == 64 * n // 8
    for r, c, elems in stores:
        assert elems == [(r, c + i) for i in range(8)]
    assert sorted((r, c) for r, c, _ in stores) == [(r, c) for r in range(64) for c in range(0, n, 8)]


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("units, resident, want", [(1024, 66, 64), (256, 66, 64), (64, 66, 64),
                                                   (1, 66, 1), (66, 66, 66), (67, 66, 34),
                                                   (2048, 132, 128), (131, 132, 131)])
def test_balanced_grid_takes_the_fewest_clusters_for_the_same_rounds(units, resident, want):
    got = gemm.balanced_grid(units, min(units, resident))
    assert got == want
    rounds = -(-units // min(units, resident))
    assert -(-units // got) == rounds  # no extra round
    assert got == 1 or -(-units // (got - 1)) > rounds  # one fewer would need one more round


@pytest.mark.op("hopper_gemm")
def test_balanced_grid_refuses_nonsense():
    with pytest.raises(ValueError, match="balanced_grid"):
        gemm.balanced_grid(0, 66)


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("n", [128, 256])
def test_epilogue_writes_every_element_of_the_tile_once(n):
    """The accumulator layout of m64nNk16 (PTX ISA, "Matrix fragments for wgmma .m64nNk16"): the
    128 threads' n / 2 registers cover the 64 x n tile exactly once."""
    coords = _store_acc_coords(n)
    assert len(coords) == 128 * n // 2
    assert sorted(coords) == [(r, c) for r in range(64) for c in range(n)]


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("tiles_m, tiles_n", [(1, 1), (3, 5), (8, 8), (17, 4), (64, 32)])
def test_tile_order_visits_every_tile_once(tiles_m, tiles_n):
    order = gemm.tile_order(tiles_m, tiles_n)
    assert sorted(order) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]
    # inside a full group, GROUP_M consecutive tiles share one column of B
    if tiles_m >= gemm.GROUP_M:
        first = order[:gemm.GROUP_M]
        assert {j for _, j in first} == {0} and [i for i, _ in first] == list(range(gemm.GROUP_M))


@pytest.mark.op("hopper_gemm")
def test_every_config_fits_shared_memory():
    a = torch.empty((8192, 8192), dtype=torch.bfloat16, device="meta")  # shapes, no memory
    for version, cfg in gemm.CONFIGS.items():
        assert cfg.smem_bytes <= SMEM_LIMIT_SM90, version
        _, _, _, ops = gemm.check_hopper_gemm(version, a, a, cfg)
        assert ops.a.box_shape == (gemm.BLOCK_K, cfg.block_m)
        assert ops.b.box_shape == (gemm.BLOCK_K, cfg.block_n // cfg.cluster)
        # what each stage's mbarrier expects (the kernels' expect_tx: the stage's bytes) is what
        # the copies deliver: A's box and every block's share of B
        assert ops.a.expect_tx_bytes() + cfg.cluster * ops.b.expect_tx_bytes() == cfg.stage_bytes
        if cfg.tma_store:  # C's map, at the headline size and ragged
            for m, n in ((8192, 8192), (200, 264), (1, 8)):
                spec = gemm.c_map_spec(m, n, 0, cfg)
                assert spec.smem_bytes() * (cfg.block_m // gemm.C_BOX_ROWS) == cfg.c_tile_bytes
        plain = check_gemm_operands(8192, 8192, 8192, 2, cfg.block_m, cfg.block_n, gemm.BLOCK_K,
                                    gemm.SWIZZLE, stages=cfg.stages,
                                    reserved_bytes=cfg.reserved_bytes)
        assert plain.expect_tx_bytes == cfg.stage_bytes


# --------------------------------------------------------------------------------------------------
# Refusals, before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


BAD = [
    (lambda: (_bf16(64, 64).float(), _bf16(64, 64)), TypeError, "bfloat16"),
    (lambda: ([[1.0]], _bf16(64, 64)), TypeError, "torch.Tensor"),
    (lambda: (_bf16(64), _bf16(64, 64)), ValueError, "2-D"),
    (lambda: (_bf16(64, 64), _bf16(64, 72)), ValueError, "K columns"),
    (lambda: (_bf16(64, 64), _bf16(64, 64).T), ValueError, "contiguous"),
    (lambda: (_bf16(0, 64), _bf16(64, 64)), ValueError, "empty"),
    (lambda: (_bf16(64, 64), _bf16(60, 64)), ValueError, "multiple of 8"),
    (lambda: (_bf16(64, 60), _bf16(64, 60)), ValueError, "16 bytes"),
    (lambda: (_bf16(64 * 64 + 1)[1:].view(64, 64), _bf16(64, 64)), ValueError,
     "not 16-byte aligned"),
]


@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("make, error, match", BAD)
def test_bad_input_is_refused_before_launch(version, make, error, match):
    fn = getattr(gemm, f"hopper_gemm_{version}")
    a, b = make()
    with pytest.raises(error, match=match) as info:
        fn(a, b)
    assert f"hopper_gemm_{version}" in str(info.value)


@pytest.mark.op("hopper_gemm")
def test_good_cpu_input_asks_for_a_gpu():
    with pytest.raises(ValueError, match="CUDA tensors"):
        gemm.hopper_gemm_v1(_bf16(128, 64), _bf16(128, 64))


@pytest.mark.op("hopper_gemm")
def test_registration():
    op = gemm.hopper_gemm
    # v8, the CuTe version, is registered by snippets.part6.cute_gemm when that is imported
    assert list(op.impls)[:8] == ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7"]
    assert op.impls["v0"].origin == "library"
    assert op.metric == "TFLOP/s" and op.ceiling == "gemm_bf16"
    assert op.headline == {"shape": "8192^3", "m": 8192, "n": 8192, "k": 8192}
    assert {s["shape"] for s in op.sweep} >= {"16384x4096x14336", "2048x28672x4096"}
    assert op.flops(op.headline, torch.bfloat16) == 2 * 8192**3
    for v in VERSIONS:
        impl = op.impls[v]
        assert gemm.CU_FILE in " ".join(str(s) for s in impl.sources)
        if not HAS_GPU or torch.cuda.get_device_capability() != (9, 0):
            assert impl.unavailable()  # a reason, not None, away from an H100/H200
    a, b = op.make_inputs({"m": 3, "n": 8, "k": 16}, torch.bfloat16, "cpu", torch.Generator())
    assert a.shape == (3, 16) and b.shape == (8, 16)
    torch.testing.assert_close(op.reference(a.double(), b.double()), a.double() @ b.double().T)


# --------------------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------------------

GPU_SHAPES = [(128, 128, 64), (64, 8, 8), (200, 264, 136), (256, 256, 4096), (384, 512, 1000),
              (1000, 776, 520), (1024, 2048, 512), (2304, 4352, 192)]


def _skip_unless_sm90():
    reason = gemm.needs_sm90()
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("m, n, k", GPU_SHAPES)
def test_matches_float64_product(version, m, n, k):
    _skip_unless_sm90()
    assert_gemm_matches_float64(getattr(gemm, f"hopper_gemm_{version}"), m, n, k)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("version", VERSIONS)
def test_every_element_is_written_and_repeatable(version):
    """C starts as NaN (a stale tile would show); two calls give identical bits (no race)."""
    _skip_unless_sm90()
    fn = getattr(gemm, f"hopper_gemm_{version}")
    assert_gemm_fully_written_and_repeatable(fn, 520, 776, 1096)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("m, n, k", [(200, 264, 136), (1000, 776, 520), (2304, 4352, 192),
                                     (4096, 4096, 1024)])
def test_v9_and_v10_store_exactly_what_v5_computes(m, n, k):
    """v9 changes only how C is stored and v10 only which cluster takes which tile: every element is
    summed in v5's order, so C agrees with v5's bit for bit (a wrong shuffle would move values)."""
    _skip_unless_sm90()
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    b = torch.randn(n, k, generator=gen, device="cuda").bfloat16()
    want = gemm.hopper_gemm_v5(a, b)
    for fn in (gemm.hopper_gemm_v9, gemm.hopper_gemm_v10):
        assert torch.equal(fn(a, b), want), fn.__name__


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
def test_cluster_grid_is_one_wave():
    """The persistent cluster kernels launch at most the clusters the driver says fit at once, and
    at least one; a grid of SMs / 2 clusters would leave the excess to a second wave."""
    _skip_unless_sm90()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for v in ("v5", "v7", "v9", "v10"):
        assert 1 <= gemm.max_active_clusters(gemm.CONFIGS[v]) <= sms // 2
    fit = gemm.max_active_clusters(gemm.CONFIGS["v10"])
    for units in (1, 64, 256, 1024):  # v10's grid: never more clusters than fit, same rounds
        got = gemm.persistent_clusters(gemm.CONFIGS["v10"], units)
        assert 1 <= got <= min(fit, units)
        assert -(-units // got) == -(-units // min(fit, units))
    assert gemm.max_active_clusters(gemm.CONFIGS["v4"]) == sms


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
def test_misaligned_view_is_refused_on_gpu():
    _skip_unless_sm90()
    flat = torch.randn(128 * 64 + 1, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        gemm.hopper_gemm_v3(flat[1:].view(128, 64), torch.randn(128, 64, device="cuda").bfloat16())

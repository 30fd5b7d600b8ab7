"""The CUDA FP8 GEMMs (csrc/fp8/fp8_gemm.cu: fp8_gemm v2 and v3, fp8_gemm_blockscaled v3 and v4)
and the compile-once helper they are built with (snippets/common/cubin.py).

On a CPU: the helper builds a cubin once per source and flags, atomically (two processes at once
leave one file); the kernel file compiles for sm_90a exactly as the launcher builds it, without
spills and within setmaxnreg's budget; its SASS holds the fp8 tensor-core instruction (QGMMA, four
per 128-deep K-block, the first of them starting from zero: the promotion's temporary), TMA loads,
mbarrier waits, setmaxnreg, and one fp32 add (per tensor) or fma (block-scaled) per accumulator
register: the promotion; the constants are the launcher's; the helpers copied from hopper_gemm.cu
are still the same text; the epilogue covers a tile once; a transcription of the kernel's loops and
indexing (persistent tiles, K-blocks, promotion, scales read through the launcher's strides)
matches the references; bad input is refused before any launch.
On a GPU (marked ``gpu``): both kernels against the float64 references at the op's test sizes,
ragged M, N and K, odd N (the epilogue's one-element stores), padded rows, many tiles per block,
the headlines with the error bounds of v1, and per-block scales that differ by powers of two."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import nvcc_with_report, sass_by_function
from test_cuda_compile import parse_ptxas, spilling_functions
from test_part6_fp8_gemm import _blockscaled, _check  # the same operands and check as v1's

from conftest import DEVICE, poison_allocator, skip_unavailable
from snippets.common import cubin as cubin_mod
from snippets.common.cubin import Cubin
from snippets.common.gemm import tolerance_for
from snippets.part6 import fp8_gemm as f
from snippets.part6.fp8 import E4M3
from snippets.part6.hopper import SMEM_LIMIT_SM90, kmajor_offsets, wgmma_descriptor

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / f.CU_FILE
HOPPER_CU = REPO_ROOT / "csrc" / "part6" / "hopper_gemm.cu"
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
CFG = f.CUDA_CONFIG
BF16_TOL = lambda k: tolerance_for(k, torch.bfloat16)  # noqa: E731


# --------------------------------------------------------------------------------------------------
# snippets/common/cubin.py
# --------------------------------------------------------------------------------------------------

TINY = "fp8/fp8_gemm.cu"  # any csrc file: the helper's tests build the real one for sm_80 (fast)
FAST_FLAGS = ("-std=c++17", "-O0", "-cubin", "-arch=sm_80")


@pytest.mark.op("fp8_gemm")
@requires_nvcc
def test_cubin_builds_once_per_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(cubin_mod, "BUILD_ROOT", tmp_path)
    calls = []
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        if "-cubin" in cmd:
            calls.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cubin_mod.subprocess, "run", counting_run)
    one = Cubin(TINY, FAST_FLAGS, name="t")
    path = one.build()
    assert path.is_file() and path.parent == tmp_path / "t" and path == one.path()
    assert path.name.startswith("fp8_gemm.") and path.suffix == ".cubin"
    assert path.read_bytes()[:4] == b"\x7fELF"  # a cubin is an ELF file
    assert one.build() == path and len(calls) == 1  # cached: no second nvcc
    # another process (a fresh cache) finds the file and does not compile either
    cubin_mod._build.cache_clear()
    assert one.build() == path and len(calls) == 1
    # other flags are another cubin
    other = Cubin(TINY, (*FAST_FLAGS, "-lineinfo"), name="t")
    assert other.key() != one.key() and other.build() != path and len(calls) == 2
    assert not list(tmp_path.rglob("*.tmp"))  # the temporary names were all renamed
    cmd = one.nvcc_command(Path("x.cubin"))
    assert cmd[1:1 + len(FAST_FLAGS)] == list(FAST_FLAGS) and cmd[-2:] == ["-o", "x.cubin"]
    assert str(CU) in cmd


BUILD_SCRIPT = """
import sys
from pathlib import Path
from snippets.common import cubin
cubin.BUILD_ROOT = Path(sys.argv[1])
print(cubin.Cubin(sys.argv[2], tuple(sys.argv[3:]), name="t").build())
"""


@pytest.mark.op("fp8_gemm")
@requires_nvcc
def test_cubin_parallel_builds_leave_one_whole_file(tmp_path):
    """Two processes building the same cubin at once (as pytest-xdist workers do): both get the
    path of one whole file, and no temporary file is left."""
    flags = (*FAST_FLAGS, "-DPARALLEL_TEST=1")  # a key no other test uses
    cmd = [sys.executable, "-c", BUILD_SCRIPT, str(tmp_path), TINY, *flags]
    procs = [subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = [out.strip().splitlines()[-1] for out, _ in outs]
    assert paths[0] == paths[1]
    assert [p.name for p in (tmp_path / "t").iterdir()] == [Path(paths[0]).name]
    assert Path(paths[0]).read_bytes()[:4] == b"\x7fELF"


@pytest.mark.op("fp8_gemm")
@requires_nvcc
def test_cubin_reports_nvcc_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(cubin_mod, "BUILD_ROOT", tmp_path)
    bad = Cubin(TINY, ("-cubin", "-arch=sm_90a", "--no-such-flag"), "bad")
    with pytest.raises(RuntimeError, match="nvcc failed on .*fp8_gemm.cu"):
        bad.build()
    assert not list(tmp_path.rglob("*.cubin")) and not list(tmp_path.rglob("*.tmp"))


@pytest.mark.op("fp8_gemm")
def test_cubin_key_covers_the_source(tmp_path, monkeypatch):
    """The key hashes the source text: an edited file is a new cubin (checked without nvcc)."""
    monkeypatch.setattr(cubin_mod, "nvcc_version", lambda nvcc: "nvcc 0.0")
    monkeypatch.setattr(Cubin, "nvcc", lambda self: "nvcc")
    monkeypatch.setattr(cubin_mod.cuda, "CSRC", tmp_path)
    (tmp_path / "k.cu").write_text("// one\n")
    a = cubin_mod._key.__wrapped__(Cubin("k.cu"))
    (tmp_path / "k.cu").write_text("// two\n")
    assert cubin_mod._key.__wrapped__(Cubin("k.cu")) != a
    assert Cubin("k.cu").build_dir.name == "k" and Cubin("k.cu", name="x").build_dir.name == "x"


# --------------------------------------------------------------------------------------------------
# The compiled kernels
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The cubin built by the launcher's own nvcc command (plus ptxas's report), and the report."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("fp8") / "fp8_gemm.cubin"
    return out, nvcc_with_report(f.CUBIN.nvcc_command(out), REPO_ROOT)


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@requires_nvcc
def test_compiles_for_sm90a_without_spills(built):
    _, report = built
    assert "-arch=sm_90a" in f.CUBIN.flags and "-cubin" in f.CUBIN.flags
    functions = parse_ptxas(report)
    kernels = {name for name, fn in functions.items() if fn["entry"]}
    assert kernels == set(f.KERNELS.values()) | set(f.KERNELS16.values())
    assert not spilling_functions(functions), report
    assert "C7515" not in report, f"ptxas serialises the wgmmas:\n{report}"
    assert "warning" not in report.lower(), report
    for name in kernels:  # __launch_bounds__(384, 1): at most 65536 / 384 registers at launch
        assert functions[name]["registers"] <= 65536 // CFG.threads


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@requires_nvcc
def test_sass_is_warp_specialised_fp8_wgmma_with_promotion(built):
    """What the kernels are, read from their SASS: the e4m3 wgmma compiles to QGMMA (Hopper's
    8-bit form; bf16 is HGMMA), four m64n128k32 per 128-deep K-block, the first of them with the
    accumulator input RZ and !UPT (scale-d = 0: the temporary starts from zero each block) and a
    wait for all of them (WARPGROUP.DEPBAR.LE gsb0, 0x0) before the promotion, which is one FADD
    (per tensor) or FFMA (block-scaled: times the two scales) per accumulator register. A kernel
    that let the tensor cores sum all of K would have no such adds."""
    sass = sass_by_function(built[0])
    assert set(sass) == set(f.KERNELS.values()) | set(f.KERNELS16.values())
    for blockwise, name in [*f.KERNELS.items(), *f.KERNELS16.items()]:
        code = sass[name]
        wide = "STG.E.128" in code  # v3's and v4's 16-byte stores of C
        assert wide == (name in f.KERNELS16.values()), (name, wide)
        qgmma = re.findall(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 [^;]*;", code)
        assert len(qgmma) == CFG.block_k // 32, qgmma
        assert sum("RZ, !UPT" in q for q in qgmma) == 1, qgmma  # the temporary's first wgmma
        assert "HGMMA" not in code and "HMMA" not in code
        assert len(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", code)) >= 1
        assert "UTMALDG.2D" in code and "SYNCS.PHASECHK" in code
        assert "USETMAXREG.DEALLOC" in code and "USETMAXREG.TRY_ALLOC" in code
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", code, re.M)
        promotion = "FFMA" if blockwise else "FADD"
        assert ops.count(promotion) >= 64 * CFG.block_n // 128, (name, ops.count(promotion))
        # block-scaled: each K-block's scales are loaded (6 loads: the first block's three and
        # the next block's three); per tensor only the epilogue's two
        loads = ops.count("LDG.E.CONSTANT")
        assert loads >= 6 if blockwise else loads <= 2, (name, loads)


@pytest.mark.op("fp8_gemm")
@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_other_targets_compile_to_traps(arch, tmp_path):
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", str(CU), "-o", str(tmp_path / "f.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr


def _cu_constants(path: Path = CU) -> dict[str, int]:
    text = path.read_text()
    pairs = re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+)[,;]", text)
    return {name: int(value) for name, value in pairs}


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
def test_constants_match_the_launcher():
    c = _cu_constants()
    assert (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["STAGES"]) == (
        CFG.block_m, CFG.block_n, CFG.block_k, CFG.stages)
    assert (c["CONSUMERS"], c["GROUP_M"], c["PRODUCER_REGS"], c["CONSUMER_REGS"]) == (
        CFG.consumers, CFG.group_m, CFG.producer_regs, CFG.consumer_regs)
    assert c["SCALE_BLOCK"] == f.BLOCK == CFG.block_k == CFG.block_n  # one B scale per tile
    assert c["WGMMA_K"] == 32 and c["SWIZZLE_REPEAT"] == 1024
    text = CU.read_text()
    for name in [*f.KERNELS.values(), *f.KERNELS16.values()]:
        assert re.search(rf"__launch_bounds__\(f8::THREADS, 1\)\s*{name}\(", text), name
    for blockwise, name in f.KERNELS16.items():  # the same bodies, with the 16-byte epilogue
        body = "true" if blockwise else "false"
        assert re.search(rf"{name}\(.*?f8::fp8_gemm<{body}, true>\(", text, re.S), name


@pytest.mark.op("fp8_gemm")
def test_register_and_shared_memory_arithmetic():
    """The chapter's arithmetic: acc and the wgmma temporary are 2 x 64 x 128 / 128 = 128
    registers a consumer thread, under the 232 setmaxnreg gives it; a 128 x 256 tile would need
    256 for them alone, more than the 255 a thread may have. The registers of the three
    warpgroups fit the SM's 64K, the stages fit 227 KiB."""
    assert CFG.accumulator_registers == 128 <= CFG.consumer_regs - 64
    assert f.CudaConfig(block_n=256).accumulator_registers == 256 > 255
    assert 128 * (CFG.producer_regs + CFG.consumers * CFG.consumer_regs) <= 65536
    assert CFG.smem_bytes == 6 * 32768 + 1024 + 96 <= SMEM_LIMIT_SM90
    assert CFG.threads == 384 and CFG.block_m == 64 * CFG.consumers


def _function(text: str, name: str) -> str:
    """The text of a device function's definition (from its signature to the closing brace at
    column 0), with the namespace-specific names normalised."""
    m = re.search(rf"__device__ __forceinline__ [^\n]*\b{name}\(.*?\n}}\n", text, re.S)
    assert m, name
    return m.group(0)


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("name", ["smem_u32", "align_up", "desc_encode", "make_desc", "mbar_init",
                                  "mbar_fence_init", "mbar_arrive_expect_tx", "mbar_arrive",
                                  "mbar_wait", "tmap_acquire", "tma_load_2d", "wgmma_fence",
                                  "wgmma_commit", "fence_regs", "regs_dec", "regs_inc",
                                  "tile_coords", "pack_bf16x2", "quad_transpose"])
def test_copied_helpers_are_still_hopper_gemms(name):
    """fp8_gemm.cu carries copies of hopper_gemm.cu's sm90 helpers (so that editing neither stales
    the other's measurements); until they move to one header, the copies must not drift."""
    assert _function(CU.read_text(), name) == _function(HOPPER_CU.read_text(), name)


@pytest.mark.op("fp8_gemm")
def test_descriptors_are_hopper_py_descriptors():
    """Each descriptor the kernel builds (stage base, + 64 rows for consumer 1's half of A, + 32
    bytes per wgmma k32 step) is the one snippets/part6/hopper.py encodes for a 128B-swizzled
    K-major tile of 128-byte rows (128 fp8 values)."""
    def c_make_desc(addr):  # fp8_gemm.cu's make_desc, transcribed
        def enc(x):
            return (x & 0x3FFFF) >> 4
        return enc(addr) | enc(16) << 16 | enc(1024) << 32 | 1 << 62

    lbo, sbo = kmajor_offsets(CFG.block_m, CFG.block_k, "128B")
    for base in (0, CFG.stage_bytes, 5 * CFG.stage_bytes):
        for half in (0, 64 * 128, CFG.block_m * 128):  # A rows 0-63, 64-127, then B
            for kk in range(CFG.block_k // 32):
                addr = base + half + 32 * kk
                assert c_make_desc(addr) == wgmma_descriptor(addr, lbo, sbo, "128B")


def _store_tile_coords(n_c: int, ldc_even: bool) -> list[tuple[int, int]]:
    """store_tile of fp8_gemm.cu, transcribed for one 64 x 128 tile at (0, 0) of a C with n_c
    columns: the (row, column) each register of each of the 128 threads is stored to (the
    bf16x2 path or the one-element path), without the columns outside C."""
    out = []
    for t in range(128):
        warp, lane = divmod(t, 32)
        for h in range(2):
            r = warp * 16 + lane // 4 + 8 * h
            for j in range(128 // 8):
                c = 8 * j + 2 * (lane % 4)
                if ldc_even and c + 1 < n_c:
                    out += [(r, c), (r, c + 1)]
                else:
                    out += [(r, x) for x in (c, c + 1) if x < n_c]
    return out


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("n_c", [128, 200, 77, 5, 1])
def test_epilogue_writes_every_element_of_the_tile_once(n_c):
    """The accumulator layout of m64nNk32 (the same as every wgmma with fp32 D): the registers of
    the 128 threads cover the tile once, and a ragged or odd N clips exactly the columns past C."""
    cols = min(n_c, 128)
    coords = _store_tile_coords(n_c, n_c % 2 == 0)
    assert sorted(coords) == [(r, c) for r in range(64) for c in range(cols)]


def _kernel_model(a, b, a_s, b_s, strides, blockwise: bool, grid: int) -> torch.Tensor:
    """fp8_gemm.cu's arithmetic and indexing, transcribed (in float64 where the kernel has fp32,
    which only changes roundings): each of ``grid`` persistent blocks walks tiles t = block,
    block + grid, ... in tile_coords's order; each consumer c takes 64 rows of the 128 x 128 tile
    (zeros outside A and B, as TMA fills them); per K-block the temporary is the 128-deep sum
    and is promoted into acc, times a_s[min(r, M-1) * s_am + kb * s_ak] * b_s[pn * s_bn +
    kb * s_bk] when block-scaled (the scales read through the strides the launcher passes);
    the epilogue multiplies by a_s * b_s per tensor and stores only inside C."""
    from snippets.part6.gemm import tile_order  # the transcription of the same tile_coords

    (m, k), n = a.shape, b.shape[0]
    s_am, s_ak, s_bn, s_bk = strides
    tiles_m, tiles_n = -(-m // 128), -(-n // 128)
    order = tile_order(tiles_m, tiles_n, CFG.group_m)
    k_pad = -(-k // 128) * 128
    a_pad = torch.zeros(tiles_m * 128, k_pad, dtype=torch.float64)
    b_pad = torch.zeros(tiles_n * 128, k_pad, dtype=torch.float64)
    a_pad[:m, :k], b_pad[:n, :k] = a.double(), b.double()
    flat_a = flat_b = None
    if blockwise:  # the scales as the kernel sees them: a pointer and two strides each
        flat_a = torch.as_strided(a_s, (a_s.untyped_storage().nbytes() // 4,), (1,), 0)
        flat_b = torch.as_strided(b_s, (b_s.untyped_storage().nbytes() // 4,), (1,), 0)
    c_out = torch.full((m, n), float("nan"), dtype=torch.float64)
    written = torch.zeros((m, n), dtype=torch.int64)
    for block in range(grid):
        for t in range(block, tiles_m * tiles_n, grid):
            pm, pn = order[t]
            for c in range(CFG.consumers):
                row0, col0 = pm * 128 + c * 64, pn * 128
                acc = torch.zeros(64, 128, dtype=torch.float64)
                for kb in range(k_pad // 128):
                    ks = slice(kb * 128, kb * 128 + 128)
                    tmp = a_pad[row0:row0 + 64, ks] @ b_pad[col0:col0 + 128, ks].T
                    if blockwise:
                        rows = [min(row0 + r, m - 1) for r in range(64)]
                        sa = flat_a[[a_s.storage_offset() + r * s_am + kb * s_ak for r in rows]]
                        sb = flat_b[b_s.storage_offset() + pn * s_bn + kb * s_bk]
                        acc += tmp * (sa.double() * sb.double())[:, None]
                    else:
                        acc += tmp
                scale = 1.0 if blockwise else float(a_s) * float(b_s)
                rows, cols = min(64, m - row0), min(128, n - col0)
                if rows > 0 and cols > 0:
                    c_out[row0:row0 + rows, col0:col0 + cols] = (acc * scale)[:rows, :cols]
                    written[row0:row0 + rows, col0:col0 + cols] += 1
    assert (written == 1).all(), "every element of C is stored exactly once"
    return c_out


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("m, n, k, grid", [(1, 5, 16, 132), (200, 264, 136, 3),
                                           (129, 130, 400, 1), (300, 520, 256, 7)])
def test_kernel_transcription_matches_the_reference_per_tensor(m, n, k, grid):
    a, b, sa, sb = f.make_per_tensor_inputs({"m": m, "n": n, "k": k}, E4M3, "cpu",
                                            torch.Generator().manual_seed(m + n + k))
    c = _kernel_model(a, b, sa, sb, (0, 0, 0, 0), False, f.cuda_grid(m, n, grid))
    ref = f.fp8_gemm_ref(a, b, sa.double(), sb.double())
    torch.testing.assert_close(c, ref, rtol=1e-12, atol=1e-9)


@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k, grid", [(1, 128, 128, 132), (45, 200, 384, 2),
                                           (129, 77, 512, 1), (300, 260, 256, 5)])
@pytest.mark.parametrize("a_layout", ["row-major", "M-major"])
def test_kernel_transcription_matches_the_reference_blockscaled(m, n, k, grid, a_layout):
    """With per-block scales spread over 2^-8..2^8 (a wrong block, row or column group is far
    off) and A's scales in either layout, through the strides the launcher passes."""
    n_up = -(-n // 128) * 128
    a, asc, b, bsc = f.make_blockscaled_inputs({"m": m, "n": n_up, "k": k}, E4M3, "cpu",
                                               torch.Generator().manual_seed(m + n + k))
    b = b[:n].contiguous()
    g = torch.Generator().manual_seed(1)
    asc = asc * 2.0 ** torch.randint(-8, 9, asc.shape, generator=g)
    bsc = bsc * 2.0 ** torch.randint(-8, 9, bsc.shape, generator=g)
    if a_layout == "M-major":
        asc = asc.t().contiguous().t()
    strides = (*asc.stride(), *bsc.stride())  # the order launch_cuda passes them in
    c = _kernel_model(a, b, asc, bsc, strides, True, f.cuda_grid(m, n, grid))
    ref = f.fp8_gemm_blockscaled_ref(a, asc.double(), b, bsc.double())
    torch.testing.assert_close(c, ref, rtol=1e-12, atol=1e-9 * float(ref.abs().max()))


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("m, n, sms", [(1, 1, 132), (8192, 8192, 132), (128, 256, 132),
                                       (4096, 7168, 114)])
def test_persistent_grid(m, n, sms):
    tiles = -(-m // 128) * -(-n // 128)
    assert f.cuda_grid(m, n, sms) == min(sms, tiles)
    # v3 and v4: the fewest blocks that take the same number of rounds of tiles
    got = f.cuda_grid(m, n, sms, balanced=True)
    assert 1 <= got <= min(sms, tiles)
    assert -(-tiles // got) == -(-tiles // min(sms, tiles))
    assert got == 1 or -(-tiles // (got - 1)) > -(-tiles // min(sms, tiles))


# --------------------------------------------------------------------------------------------------
# Checks and refusals before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

def _e4m3(*shape):
    return torch.randn(*shape).to(E4M3)


@pytest.mark.op("fp8_gemm")
def test_tma_specs_describe_the_operands():
    a, b = _e4m3(300, 256), _e4m3(200, 256)
    sa, sb = f.tma_specs("t", a, b)
    assert (sa.global_shape, sa.global_strides, sa.box_shape) == ((256, 300), (256,), (128, 128))
    assert (sb.global_shape, sb.box_shape) == ((256, 200), (128, 128))
    assert sa.swizzle.label == "128B" and sa.dtype_bytes == 1
    assert sa.expect_tx_bytes() + sb.expect_tx_bytes() == CFG.stage_bytes  # the kernel's expect_tx
    # padded rows (stride 192 for K = 144): TMA reads them, the kernel sees K = 144
    wide = _e4m3(64, 192)[:, :144]
    s, _ = f.tma_specs("t", wide, wide)
    assert s.global_shape == (144, 64) and s.global_strides == (192,)


BAD_TMA = [
    ("K = 40: rows of 40 bytes", lambda: (_e4m3(64, 40), _e4m3(64, 40)), "multiple of 16"),
    ("misaligned start", lambda: (_e4m3(64 * 64 + 16)[1:64 * 64 + 1].view(64, 64), _e4m3(64, 64)),
     "not 16-byte aligned"),
    ("padded rows of 72 bytes", lambda: (_e4m3(64, 72)[:, :64], _e4m3(64, 64)), "multiple of 16"),
]


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("label, make, match", BAD_TMA, ids=[c[0] for c in BAD_TMA])
def test_tma_refuses_what_it_cannot_read(label, make, match):
    a, b = make()
    with pytest.raises(ValueError, match=match) as info:
        f.tma_specs("fp8_gemm_cuda", a, b)
    assert "fp8_gemm_cuda" in str(info.value) and "TMA" in str(info.value)


def _bad_cuda_cases():
    a, b, sa, sb = f.make_per_tensor_inputs({"m": 32, "n": 32, "k": 128}, E4M3, "cpu",
                                            torch.Generator().manual_seed(0))
    a2, asc, b2, bsc = f.make_blockscaled_inputs({"m": 32, "n": 128, "k": 256}, E4M3, "cpu",
                                                 torch.Generator().manual_seed(0))
    # check_fp8_operands's order: a's type, dtype, rank, emptiness and device, then b's
    return [
        (f.fp8_gemm_cuda, (a.half(), b, sa, sb), TypeError, "float8_e4m3fn"),
        (f.fp8_gemm_cuda, (a[0], b, sa, sb), ValueError, "2-D"),
        (f.fp8_gemm_cuda, (a[:0], b, sa, sb), ValueError, "empty"),
        (f.fp8_gemm_cuda, (a, b, sa, sb), ValueError, "must be on a cuda device"),
        (f.fp8_gemm_blockscaled_cuda, (a2.bfloat16(), asc, b2, bsc), TypeError, "float8_e4m3fn"),
        (f.fp8_gemm_blockscaled_cuda, (a2, asc, b2, bsc), ValueError, "must be on a cuda device"),
        (f.fp8_gemm_cuda16, (a.half(), b, sa, sb), TypeError, "float8_e4m3fn"),
        (f.fp8_gemm_cuda16, (a, b, sa, sb), ValueError, "must be on a cuda device"),
        (f.fp8_gemm_blockscaled_cuda16, (a2.bfloat16(), asc, b2, bsc), TypeError, "float8_e4m3fn"),
        (f.fp8_gemm_blockscaled_cuda16, (a2, asc, b2, bsc), ValueError, "must be on a cuda device"),
    ]


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("case", range(10))
def test_cuda_versions_refuse_bad_input_before_launch(case):
    fn, args, exc, match = _bad_cuda_cases()[case]
    with pytest.raises(exc, match=match) as info:
        fn(*args)
    assert fn.__name__ in str(info.value)


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
def test_cuda_versions_refuse_grad():
    a, b = _e4m3(32, 128), _e4m3(32, 128)
    s = torch.ones((), requires_grad=True)
    with pytest.raises(RuntimeError, match="grad"):
        f.fp8_gemm_cuda(a, b, s, torch.ones(()))
    asc = torch.ones(32, 1, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad"):
        f.fp8_gemm_blockscaled_cuda(a, asc, b, torch.ones(1, 1))
    with pytest.raises(RuntimeError, match="grad"):
        f.fp8_gemm_cuda16(a, b, s, torch.ones(()))
    with pytest.raises(RuntimeError, match="grad"):
        f.fp8_gemm_blockscaled_cuda16(a, asc, b, torch.ones(1, 1))


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
def test_registration_of_the_cuda_versions():
    v2, v3 = f.fp8_gemm.impls["v2"], f.fp8_gemm_blockscaled.impls["v3"]
    assert (v2.fn, v3.fn) == (f.fp8_gemm_cuda, f.fp8_gemm_blockscaled_cuda)
    assert v2.lang == v3.lang == "CUDA" and v2.origin == v3.origin == "book"
    assert v2.device == v3.device == "cuda" and v2.requires is v3.requires is f.needs_fp8_sm90
    for impl in (v2, v3):
        assert CU in [Path(s) for s in impl.sources if isinstance(s, (str, Path))]
    if not torch.cuda.is_available():
        assert v2.unavailable() == "needs a CUDA GPU"


# --------------------------------------------------------------------------------------------------
# On the GPU
# --------------------------------------------------------------------------------------------------

def _skip_unless_sm90():
    reason = f.needs_fp8_sm90()
    if reason:
        skip_unavailable(reason)


def _per_tensor(m, n, k, seed=0):
    return f.make_per_tensor_inputs({"m": m, "n": n, "k": k}, E4M3, DEVICE,
                                    torch.Generator().manual_seed(seed))


# ragged M and N against 128 x 128 tiles, odd N (one-element stores), K not a multiple of 128
# (TMA's zero fill), one tile, many tiles per persistent block (more tiles than SMs)
PER_TENSOR_SHAPES = [(s["m"], s["n"], s["k"]) for s in f.TEST_SIZES] + [
    (1, 5, 16), (33, 17, 48), (200, 264, 144), (129, 130, 1024), (1000, 776, 528),
    (2048, 2304, 512)]
BLOCK_SHAPES = [(s["m"], s["n"], s["k"]) for s in f.BS_TEST_SIZES] + [
    (1, 128, 128), (45, 200, 384), (70, 256, 512), (129, 77, 1024), (2048, 2304, 512)]


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("m, n, k", PER_TENSOR_SHAPES)
def test_per_tensor_matches_float64(m, n, k):
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(m, n, k, seed=m + n + k)
    poison_allocator(m * n * 2, DEVICE)
    _check(f.fp8_gemm_cuda(a, b, sa, sb), f.fp8_gemm_ref(a, b, sa.double(), sb.double()), k,
           f"v2 {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k", BLOCK_SHAPES)
def test_blockscaled_matches_float64(m, n, k):
    _skip_unless_sm90()
    a, asc, b, bsc = _blockscaled(m, n, k, seed=m + n + k)
    poison_allocator(m * n * 2, DEVICE)
    ref = f.fp8_gemm_blockscaled_ref(a, asc.double(), b, bsc.double())
    _check(f.fp8_gemm_blockscaled_cuda(a, asc, b, bsc), ref, k, f"v3 {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k", [(1, 5, 16), (33, 17, 48), (200, 264, 144), (129, 130, 1024),
                                     (1000, 776, 528), (2048, 2304, 512), (4096, 4096, 1024)])
def test_store16_versions_store_exactly_what_v2_and_v3_compute(m, n, k):
    """fp8_gemm v3 and fp8_gemm_blockscaled v4 change only how C is stored (16-byte stores
    after the quad's shuffles, v2's stores where N is not a multiple of 8) and how many blocks
    share the tiles: every element is the same sum, so C agrees bit for bit."""
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(m, n, k, seed=m + n + k)
    assert torch.equal(f.fp8_gemm_cuda16(a, b, sa, sb), f.fp8_gemm_cuda(a, b, sa, sb))
    if n % 128 == 0 and k % 128 == 0:  # the block scales' shapes
        a, asc, b, bsc = _blockscaled(m, n, k, seed=m + n + k)
        assert torch.equal(f.fp8_gemm_blockscaled_cuda16(a, asc, b, bsc),
                           f.fp8_gemm_blockscaled_cuda(a, asc, b, bsc))


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_per_tensor_padded_rows_and_repeatability():
    """Rows with a stride past K (a slice of a wider tensor): TMA reads them through the stride;
    two calls give the same bits (no race between the warpgroups)."""
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(300, 264, 512, seed=3)
    wide = torch.zeros((300, 640), dtype=torch.uint8, device=DEVICE)
    wide[:, :512] = a.view(torch.uint8)
    c = f.fp8_gemm_cuda(wide.view(E4M3)[:, :512], b, sa, sb)
    _check(c, f.fp8_gemm_ref(a, b, sa.double(), sb.double()), 512, "padded rows")
    assert torch.equal(c, f.fp8_gemm_cuda(a, b, sa, sb))


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("size", [4096, 8192])
def test_per_tensor_against_scaled_mm_and_fp32(size):
    """The headline: as v1's GPU test, within 2x the error of the fp32-accumulated reference
    and close to cuBLAS without fast accumulation (which computes the same promoted sums)."""
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(size, size, size, seed=size)
    exact = f.fp8_gemm_ref(a, b, sa.double(), sb.double())
    c = f.fp8_gemm_cuda(a, b, sa, sb)
    _check(c, exact, size, f"v2 {size}^3")
    rtol, atol = BF16_TOL(size)
    torch.testing.assert_close(c.double(), f.fp8_gemm_cublas(a, b, sa, sb).double(),
                               rtol=2 * rtol, atol=2 * atol)
    bar = f.scaled_error(f.fp8_gemm_ref(a, b, sa, sb).to(torch.bfloat16), exact)
    assert f.scaled_error(c, exact) <= 2 * bar


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k", [(256, 512, 1024), (4096, 7168, 16384)])
def test_blockscaled_error_within_2x_of_fp32_reference(m, n, k):
    """v1's goal bound at DeepSeek-V3's shape (the headline) and a small one."""
    _skip_unless_sm90()
    a, asc, b, bsc = _blockscaled(m, n, k, seed=11)
    exact = f.fp8_gemm_blockscaled_ref(a, asc.double(), b, bsc.double())
    bar = f.scaled_error(f.fp8_gemm_blockscaled_ref(a, asc, b, bsc).to(torch.bfloat16), exact)
    poison_allocator(m * n * 4, DEVICE)
    assert f.scaled_error(f.fp8_gemm_blockscaled_cuda(a, asc, b, bsc), exact) <= 2 * bar


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k", [(40, 256, 512), (300, 384, 1024)])
def test_each_block_gets_its_own_scales(m, n, k):
    """Scales times powers of two from 2^-8 to 2^8, different for every block: the wrong K
    block's, row's or column group's scale is off by orders of magnitude. A's scales also
    M-major (strides (1, M), cuBLAS's layout): the kernel takes any strides."""
    _skip_unless_sm90()
    a, asc, b, bsc = _blockscaled(m, n, k, seed=9)
    g = torch.Generator().manual_seed(10)
    asc = asc * 2.0 ** torch.randint(-8, 9, asc.shape, generator=g).to(asc.device)
    bsc = bsc * 2.0 ** torch.randint(-8, 9, bsc.shape, generator=g).to(bsc.device)
    ref = f.fp8_gemm_blockscaled_ref(a, asc.double(), b, bsc.double())
    bound = 2.0**-7 * (a.double().abs() * asc.double().repeat_interleave(128, 1)) @ (
        b.double().abs() * bsc.double().repeat_interleave(128, 0)[:n].repeat_interleave(
            128, 1)).T
    for scales in (asc, asc.t().contiguous().t()):
        c = f.fp8_gemm_blockscaled_cuda(a, scales, b, bsc)
        assert ((c.double() - ref).abs() <= bound + 1e-30).all()


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_cubin_loads_on_the_gpu():
    _skip_unless_sm90()
    for name in [*f.KERNELS.values(), *f.KERNELS16.values()]:
        fn = f.CUBIN.kernel(name, 0)
        assert fn.max_dynamic_shared_size_bytes >= 0
        assert f.CUBIN.kernel(name, 0) is fn  # loaded once


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_one_block_per_sm_fits():
    """The persistent grid launches one block per SM: the driver's occupancy calculator must say
    that exactly one block of 384 threads and the configured shared memory fits an SM (none
    would fail every launch; two would mean the grid leaves half the SM's slots idle)."""
    _skip_unless_sm90()
    from snippets import cuda

    for name in [*f.KERNELS.values(), *f.KERNELS16.values()]:
        fn = f.CUBIN.kernel(name, 0)
        fn.max_dynamic_shared_size_bytes = CFG.smem_bytes
        assert cuda.resident_blocks(fn, CFG.threads, CFG.smem_bytes) == 1, name


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_misaligned_view_is_refused_on_gpu():
    _skip_unless_sm90()
    flat = torch.zeros(64 * 128 + 16, dtype=torch.uint8, device=DEVICE).view(E4M3)
    a = flat[1:64 * 128 + 1].view(64, 128)
    b = torch.zeros(64, 128, dtype=torch.uint8, device=DEVICE).view(E4M3)
    one = torch.ones((), device=DEVICE)
    with pytest.raises(ValueError, match="16-byte aligned"):
        f.fp8_gemm_cuda(a, b, one, one)

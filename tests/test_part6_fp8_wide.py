"""The FP8 GEMMs with wider tiles (csrc/fp8/fp8_gemm_wide.cu: fp8_gemm v4, v5 and v6,
fp8_gemm_blockscaled v5).

On a CPU: the file compiles for sm_90a with the launcher's own command, without spills, ptxas
warnings or serialised wgmmas; its SASS has, per 128-deep K-block, two slices of four QGMMA each
starting from zero (m64n128k32 for v4, m64n96k32 for v5), v4 waiting for all of its wgmmas before
each slice's promotion and v5 waiting once with one group still in flight (the overlap that defines
it); the promotion's adds, 16-byte stores, TMA and setmaxnreg; v6's K-loop shorter than v5's,
its waits without clock reads, its descriptors by addition equal to rebuilt ones at every address
it uses. The launcher's configs match the file's instances and stage counts, the registers and
shared memory fit, the balanced grid covers every tile, and bad input is refused before any launch
with the function's name.
On a GPU (marked ``gpu``): C equals v3's (per tensor) or v4's (block-scaled) bit for bit at ragged
shapes, odd N, padded rows and more tiles than SMs (the same promoted sums in the same order), the
float64 references at the headlines within 2x the fp32-accumulated reference's error, and per-block
scales that differ by powers of two."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import nvcc_with_report, sass_by_function, sass_loop
from test_cuda_compile import parse_ptxas, spilling_functions
from test_part6_fp8_cuda import _per_tensor, _skip_unless_sm90
from test_part6_fp8_gemm import _blockscaled

from conftest import DEVICE, poison_allocator
from snippets.part6 import fp8_gemm as f
from snippets.part6 import fp8_gemm_wide as w
from snippets.part6.fp8 import E4M3
from snippets.part6.hopper import (
    SMEM_LIMIT_SM90,
    SMEM_WINDOW,
    matrix_descriptor_encode,
    wgmma_descriptor,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / w.WIDE_CU_FILE
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
# kernel -> (config, slice width W, temporaries, BLOCKWISE)
KERNELS = {"fp8_gemm_tensor_wide": (w.WIDE_CONFIG, 128, 1, False),
           "fp8_gemm_block_wide": (w.WIDE_CONFIG, 128, 1, True),
           "fp8_gemm_tensor_sliced": (w.SLICED_CONFIG, 96, 2, False),
           "fp8_gemm_tensor_lean": (w.SLICED_CONFIG, 96, 2, False),
           "fp8_gemm_block_lean": (w.WIDE_CONFIG, 128, 1, True)}
LEAN = set(w.LEAN_KERNELS.values())  # v6 of both ops: fewer instructions around the same wgmmas


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("fp8w") / "fp8_gemm_wide.cubin"
    return out, nvcc_with_report(w.WIDE_CUBIN.nvcc_command(out), REPO_ROOT)


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@requires_nvcc
def test_compiles_for_sm90a_without_spills_or_serialised_wgmmas(built):
    """Three temporaries' worth of accumulators (192 registers) live past ptxas's launch bound of
    168: they fit only because the consumers raise theirs with setmaxnreg, and a spill would show
    here. C7514/C7515 are ptxas's notes that it serialised the wgmmas (it does so when registers of
    an unfinished wgmma are read, which a wrong wait count would cause)."""
    _, report = built
    functions = parse_ptxas(report)
    entries = {name for name, fn in functions.items() if fn["entry"]}
    assert set(KERNELS) <= entries
    assert not spilling_functions(functions), report
    assert "C7514" not in report and "C7515" not in report, report
    assert "warning" not in report.lower(), report
    for name in KERNELS:
        assert functions[name]["registers"] <= 65536 // w.WIDE_CONFIG.threads


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@requires_nvcc
def test_sass_has_two_promoted_slices_and_v5s_overlap(built):
    """Per K-block, two slices of four QGMMA, each slice's first from zero (RZ, !UPT: a fresh
    temporary). v4 waits for everything in flight (DEPBAR.LE gsb0, 0x0) before each slice's adds;
    v5 first waits with one group left (0x1): slice 0 is added while slice 1's wgmmas run. The
    adds are one FADD (per tensor) or FFMA (block-scaled) per accumulator register."""
    sass = sass_by_function(built[0])
    for name, (cfg, width, temps, blockwise) in KERNELS.items():
        code = sass[name]
        qgmma = re.findall(rf"QGMMA\.64x{width}x32\.F32\.E4M3\.E4M3 [^;]*;", code)
        assert len(qgmma) == 2 * f.BLOCK // 32, (name, len(qgmma))
        assert len(re.findall(r"QGMMA", code)) == len(qgmma)
        assert sum("RZ, !UPT" in q for q in qgmma) == 2, name
        waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[01])", code)
        assert waits == (["0x0", "0x0"] if temps == 1 else ["0x1", "0x0"]), (name, waits)
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", code, re.M)
        adds = ops.count("FFMA" if blockwise else "FADD")
        assert adds >= 64 * cfg.block_n // 128, (name, adds)  # one per accumulator register
        assert "STG.E.128" in code and "UTMALDG.2D" in code and "SYNCS.PHASECHK" in code
        assert "USETMAXREG.DEALLOC" in code and "USETMAXREG.TRY_ALLOC" in code
        assert "HGMMA" not in code and "HMMA" not in code
        # v5's waits read the clock on every retry (for the trap after a time limit); v6's count
        assert ("SR_CLOCKLO" in code) == (name not in LEAN), name


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@requires_nvcc
@pytest.mark.parametrize("blockwise", [False, True])
def test_v6_issues_fewer_instructions_per_k_block_than_v5(built, blockwise):
    """v6 is v5 with the same wgmmas, waits and adds, and less else: its K-loop is shorter (its
    descriptors are additions to two base descriptors, its waits a bare try-and-branch)."""
    sass = sass_by_function(built[0])
    v5 = w.WIDE_KERNELS[True] if blockwise else w.SLICED_KERNEL
    v6 = w.LEAN_KERNELS[blockwise]
    loops = {name: sass_loop(sass[name], "QGMMA") for name in (v5, v6)}
    width = KERNELS[v6][1]
    for name, loop in loops.items():
        assert sum(f"QGMMA.64x{width}x32" in t for t in loop) == 8, name
        adds = sum(t.startswith("FFMA" if blockwise else "FADD") for t in loop)
        assert adds == 2 * width // 2, name  # 2 slices, W / 2 registers each
    assert len(loops[v6]) < 0.9 * len(loops[v5]), {k: len(v) for k, v in loops.items()}


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("cfg", [w.SLICED_CONFIG, w.WIDE_CONFIG], ids=["v6", "blockscaled_v6"])
def test_v6s_descriptors_by_addition_are_the_rebuilt_ones(cfg):
    """v6 builds two descriptors once and adds offsets in 16-byte units; that equals rebuilding
    each from its address while every address stays inside the 2^18-byte window the 14-bit field
    encodes. Every operand address of v6 (consumer rows, stage, slice, K step), for every start of
    the dynamic shared memory a block can have, gives the same descriptor both ways; one window
    further, the addition would carry into the leading-byte-offset field and differ."""
    width, k_steps, row_bytes = cfg.block_n // 2, f.BLOCK // 32, f.BLOCK

    def desc(addr):  # fp8_gemm.cu's make_desc: LBO 16, SBO 1024 (the swizzle's repeat), 128B
        return wgmma_descriptor(addr, 16, 1024, "128B")

    a0, b0 = 64 * row_bytes, cfg.block_m * row_bytes  # consumer 1's rows of A; B's first slice
    starts = range(0, SMEM_LIMIT_SM90 - cfg.smem_bytes + 1024, 1024)  # aligned tile starts
    pairs = 0
    for base, s, c, p, kk in itertools.product(starts, range(cfg.stages), range(2), range(2),
                                               range(k_steps)):
        a = c * a0 + s * cfg.stage_bytes + kk * 32  # the kernel's offsets from stage 0's
        b = b0 + s * cfg.stage_bytes + p * width * row_bytes + kk * 32
        assert desc(base + a) == desc(base + c * a0) + (a - c * a0) // 16
        assert desc(base + b) == desc(base + b0) + (b - b0) // 16
        pairs += 2
    assert pairs > 1000
    top = SMEM_WINDOW - 16  # past the window, the addition carries out of the 14-bit field
    assert desc(top) + 1 != (desc(top) & ~0x3FFF) | matrix_descriptor_encode(top + 16)


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
def test_configs_match_the_files_instances():
    """The launcher's block_n and stages are the file's: each F8W_KERNEL line instantiates
    fp8_gemm_sliced<BLOCKWISE, W, TEMPS> with a tile of 2W columns, and the file asserts the stage
    counts (as many stages as 227 KB holds) that the configs use."""
    text = CU.read_text()
    found = {name: (bw == "true", int(width), int(temps), lean == "true")
             for name, bw, width, temps, lean in re.findall(
                 r"^F8W_KERNEL\((\w+), (true|false), (\d+), (\d+), (true|false)\)", text, re.M)}
    assert found == {name: (bw, width, temps, name in LEAN)
                     for name, (_, width, temps, bw) in KERNELS.items()}
    for name, (cfg, width, temps, blockwise) in KERNELS.items():
        assert cfg.block_n == 2 * width and cfg.block_m == 128 and cfg.block_k == f.BLOCK
        if temps == 2:
            assert name in (w.SLICED_KERNEL, w.LEAN_KERNELS[False]) and cfg is w.SLICED_CONFIG
            assert not blockwise
        else:
            assert name in (w.WIDE_KERNELS[blockwise], w.LEAN_KERNELS[True])
            assert cfg is w.WIDE_CONFIG
    stages = dict(re.findall(r"STAGES<(\d+)> == (\d+)", text))
    assert {int(k): int(v) for k, v in stages.items()} == {128: w.WIDE_CONFIG.stages,
                                                          96: w.SLICED_CONFIG.stages}
    for cfg in (w.WIDE_CONFIG, w.SLICED_CONFIG):  # one more stage would not fit
        assert cfg.smem_bytes <= SMEM_LIMIT_SM90
        assert cfg.smem_bytes + cfg.stage_bytes + 16 > SMEM_LIMIT_SM90


@pytest.mark.op("fp8_gemm")
def test_register_arithmetic():
    """The chapter's arithmetic: one 64 x 256 accumulator and one 128-column temporary (v4), or one
    64 x 192 accumulator and two 96-column temporaries (v5), are 192 registers a consumer thread,
    under the 232 setmaxnreg gives it; v4's tile with two temporaries would need 256."""
    assert w.slice_registers(w.WIDE_CONFIG, 1) == 192 == w.slice_registers(w.SLICED_CONFIG, 2)
    assert w.slice_registers(w.WIDE_CONFIG, 2) == 256 > 255
    assert 192 <= w.WIDE_CONFIG.consumer_regs - 40


@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("m, n, sms", [(8192, 8192, 132), (4096, 4096, 132), (1, 1, 132),
                                       (300, 1000, 114)])
def test_balanced_grid_of_the_wider_tiles(m, n, sms):
    for cfg in (w.WIDE_CONFIG, w.SLICED_CONFIG):
        tiles = -(-m // 128) * -(-n // cfg.block_n)
        got = f.cuda_grid(m, n, sms, cfg, balanced=True)
        assert 1 <= got <= min(sms, tiles)
        assert -(-tiles // got) == -(-tiles // min(sms, tiles))


@pytest.mark.op("fp8_gemm")
def test_tma_boxes_are_the_tiles():
    a, b = torch.randn(300, 256).to(E4M3), torch.randn(200, 256).to(E4M3)
    for cfg in (w.WIDE_CONFIG, w.SLICED_CONFIG):
        sa, sb = f.tma_specs("t", a, b, cfg)
        assert sa.box_shape == (128, 128) and sb.box_shape == (128, cfg.block_n)
        assert sa.expect_tx_bytes() + sb.expect_tx_bytes() == cfg.stage_bytes  # the expect_tx


def _bad_cases():
    # check_fp8_operands's order: a's type, dtype, rank, emptiness and device, then b's
    a, b, sa, sb = f.make_per_tensor_inputs({"m": 32, "n": 32, "k": 128}, E4M3, "cpu",
                                            torch.Generator().manual_seed(0))
    a2, asc, b2, bsc = f.make_blockscaled_inputs({"m": 32, "n": 128, "k": 256}, E4M3, "cpu",
                                                 torch.Generator().manual_seed(0))
    return [
        (w.fp8_gemm_wide, (a.half(), b, sa, sb), TypeError, "float8_e4m3fn"),
        (w.fp8_gemm_sliced, (a[0], b, sa, sb), ValueError, "2-D"),
        (w.fp8_gemm_sliced, (a, b, sa, sb), ValueError, "must be on a cuda device"),
        (w.fp8_gemm_wide, (a[:0], b, sa, sb), ValueError, "empty"),
        (w.fp8_gemm_blockscaled_wide, (a2.bfloat16(), asc, b2, bsc), TypeError, "float8_e4m3fn"),
        (w.fp8_gemm_blockscaled_wide, (a2, asc, b2, bsc), ValueError, "must be on a cuda device"),
        (w.fp8_gemm_lean, (a.half(), b, sa, sb), TypeError, "float8_e4m3fn"),
        (w.fp8_gemm_blockscaled_lean, (a2, asc, b2, bsc), ValueError, "must be on a cuda device"),
    ]


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("case", range(8))
def test_refuse_bad_input_before_launch(case):
    fn, args, exc, match = _bad_cases()[case]
    with pytest.raises(exc, match=match) as info:
        fn(*args)
    assert fn.__name__ in str(info.value)


@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
def test_registration():
    v4, v5, v6 = (f.fp8_gemm.impls[v] for v in ("v4", "v5", "v6"))
    b5, b6 = (f.fp8_gemm_blockscaled.impls[v] for v in ("v5", "v6"))
    assert (v4.fn, v5.fn, v6.fn, b5.fn, b6.fn) == (
        w.fp8_gemm_wide, w.fp8_gemm_sliced, w.fp8_gemm_lean, w.fp8_gemm_blockscaled_wide,
        w.fp8_gemm_blockscaled_lean)
    for impl in (v4, v5, v6, b5, b6):
        assert impl.lang == "CUDA" and impl.origin == "book" and impl.requires is f.needs_fp8_sm90
        files = [Path(s) for s in impl.sources if isinstance(s, (str, Path))]
        assert CU in files and REPO_ROOT / "csrc" / f.CU_FILE in files  # and what it includes


# --------------------------------------------------------------------------------------------------
# On the GPU
# --------------------------------------------------------------------------------------------------

# ragged M and N against both tiles, odd N (the one-element stores), K not a multiple of 128, one
# tile, more tiles than SMs
SHAPES = [(1, 5, 16), (33, 17, 48), (200, 264, 144), (129, 257, 1024), (1000, 776, 528),
          (2048, 2304, 512), (300, 520, 1024), (4096, 4096, 1024)]


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
@pytest.mark.op("fp8_gemm_blockscaled")
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_same_bits_as_the_128_column_tiles(m, n, k):
    """v4 and v5 change the tile's width and the order in which a consumer issues, waits and adds;
    every element of C is still its K-blocks' promoted sums added in K order, so C agrees with
    v3's bit for bit (and blockscaled v5 with v4's)."""
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(m, n, k, seed=m + n + k)
    poison_allocator(m * n * 2, DEVICE)
    c3 = f.fp8_gemm_cuda16(a, b, sa, sb)
    assert torch.equal(w.fp8_gemm_wide(a, b, sa, sb), c3)
    poison_allocator(m * n * 2, DEVICE)
    assert torch.equal(w.fp8_gemm_sliced(a, b, sa, sb), c3)
    poison_allocator(m * n * 2, DEVICE)
    assert torch.equal(w.fp8_gemm_lean(a, b, sa, sb), c3)
    if n % 128 == 0 and k % 128 == 0:  # the block scales' shapes
        a, asc, b, bsc = _blockscaled(m, n, k, seed=m + n + k)
        c4 = f.fp8_gemm_blockscaled_cuda16(a, asc, b, bsc)
        for fn in (w.fp8_gemm_blockscaled_wide, w.fp8_gemm_blockscaled_lean):
            poison_allocator(m * n * 2, DEVICE)
            assert torch.equal(fn(a, asc, b, bsc), c4), fn.__name__


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_padded_rows_and_repeatability():
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(300, 264, 512, seed=3)
    wide = torch.zeros((300, 640), dtype=torch.uint8, device=DEVICE)
    wide[:, :512] = a.view(torch.uint8)
    for fn in (w.fp8_gemm_wide, w.fp8_gemm_sliced, w.fp8_gemm_lean):
        c = fn(wide.view(E4M3)[:, :512], b, sa, sb)
        assert torch.equal(c, fn(a, b, sa, sb))
        assert torch.equal(c, f.fp8_gemm_cuda(a, b, sa, sb))


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
@pytest.mark.parametrize("size", [4096, 8192])
def test_per_tensor_headline_error(size):
    """Within 2x the error of the fp32-accumulated reference rounded to bf16, as v1-v3."""
    _skip_unless_sm90()
    a, b, sa, sb = _per_tensor(size, size, size, seed=size)
    exact = f.fp8_gemm_ref(a, b, sa.double(), sb.double())
    bar = f.scaled_error(f.fp8_gemm_ref(a, b, sa, sb).to(torch.bfloat16), exact)
    for fn in (w.fp8_gemm_wide, w.fp8_gemm_sliced, w.fp8_gemm_lean):
        assert f.scaled_error(fn(a, b, sa, sb), exact) <= 2 * bar, fn.__name__


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm_blockscaled")
def test_blockscaled_headline_error_and_scales_per_block():
    _skip_unless_sm90()
    a, asc, b, bsc = _blockscaled(4096, 7168, 16384, seed=11)
    exact = f.fp8_gemm_blockscaled_ref(a, asc.double(), b, bsc.double())
    bar = f.scaled_error(f.fp8_gemm_blockscaled_ref(a, asc, b, bsc).to(torch.bfloat16), exact)
    for fn in (w.fp8_gemm_blockscaled_wide, w.fp8_gemm_blockscaled_lean):
        assert f.scaled_error(fn(a, asc, b, bsc), exact) <= 2 * bar, fn.__name__
    # scales times powers of two, different for every block, A's also M-major: the two slices of a
    # tile must each take their own row of B's scales
    a, asc, b, bsc = _blockscaled(300, 512, 1024, seed=9)
    g = torch.Generator().manual_seed(10)
    asc = asc * 2.0 ** torch.randint(-8, 9, asc.shape, generator=g).to(asc.device)
    bsc = bsc * 2.0 ** torch.randint(-8, 9, bsc.shape, generator=g).to(bsc.device)
    for scales in (asc, asc.t().contiguous().t()):
        c4 = f.fp8_gemm_blockscaled_cuda16(a, scales, b, bsc)
        for fn in (w.fp8_gemm_blockscaled_wide, w.fp8_gemm_blockscaled_lean):
            assert torch.equal(fn(a, scales, b, bsc), c4), fn.__name__


@pytest.mark.gpu
@pytest.mark.op("fp8_gemm")
def test_one_block_per_sm_fits():
    _skip_unless_sm90()
    from snippets import cuda

    for name, (cfg, *_) in KERNELS.items():
        fn = w.WIDE_CUBIN.kernel(name, 0)
        fn.max_dynamic_shared_size_bytes = cfg.smem_bytes
        assert cuda.resident_blocks(fn, cfg.threads, cfg.smem_bytes) == 1, name

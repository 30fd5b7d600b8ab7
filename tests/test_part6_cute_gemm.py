"""The Hopper GEMM in CuTe's C++ (csrc/cute/hopper_gemm_cute.cu, snippets/part6/cute_gemm.py).

On a CPU: the file compiles for sm_90a into the shared library the module loads, without spills;
its SASS holds GMMA (HGMMA 64x256), TMA loads (UTMALDG), mbarrier waits and the setmaxnreg pair;
its constants are the module's; the library's launcher refuses a bad shape by itself; every bad
input is refused before a launch with hopper_gemm's messages; without a usable GPU the call raises
a RuntimeError that says why. On a Hopper GPU (marked ``gpu``): the float64 product at ragged
shapes, every element of C written, identical bits from two calls."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import (
    assert_gemm_fully_written_and_repeatable,
    assert_gemm_matches_float64,
    cuobjdump,
    nvcc_with_report,
)
from test_cuda_compile import parse_ptxas, spilling_functions
from test_part6_gemm import BAD

from snippets.part6 import cute_gemm, gemm

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / cute_gemm.CU_FILE
NVCC = shutil.which("nvcc")
NAME = "hopper_gemm_cute"


def _include() -> Path:
    try:
        return cute_gemm.cutlass_include()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.op("hopper_gemm")
def test_concurrent_unpacking_of_the_headers_does_not_race(tmp_path, monkeypatch):
    """One benchmark process per GPU may unpack the wheel at once (two of three crashed on a
    FileExistsError when they shared one folder): every caller gets complete headers, an incomplete
    earlier copy is replaced, and no temporary folder is left behind."""
    import threading

    _include()  # the wheel is in build/ (or at $KM_CUTLASS_WHEEL) once the headers are
    wheel = Path(os.environ.get("KM_CUTLASS_WHEEL",
                                cute_gemm.REPO_ROOT / "build" / cute_gemm.CUTLASS_WHEEL))
    if not wheel.is_file():
        pytest.skip(f"no {cute_gemm.CUTLASS_WHEEL} in build/")
    monkeypatch.setenv("KM_CUTLASS_WHEEL", str(wheel))
    monkeypatch.setattr(cute_gemm, "REPO_ROOT", tmp_path)
    root = tmp_path / "build" / f"cutlass-{cute_gemm.CUTLASS_VERSION}"
    (root / "cutlass_library" / "source" / "include" / "cute").mkdir(parents=True)  # incomplete
    got, errors = [], []

    def unpack():
        try:
            got.append(cute_gemm.cutlass_include())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=unpack) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    include = root / "cutlass_library" / "source" / "include"
    assert got == [include] * 4
    assert (include / "cute" / "tensor.hpp").is_file() and (include / "cutlass").is_dir()
    assert sorted(q.name for q in (tmp_path / "build").iterdir()) == [root.name]


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> tuple[Path, str]:
    """The library built by the module's own nvcc command, plus ptxas's report of it."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    _include()
    out = tmp_path_factory.mktemp("cute") / "libkm_cute_gemm.so"
    return out, nvcc_with_report(cute_gemm.nvcc_command(out), REPO_ROOT)


# --------------------------------------------------------------------------------------------------
# The compiled library
# --------------------------------------------------------------------------------------------------

@pytest.mark.op("hopper_gemm")
def test_compiles_for_sm90a_without_spills(library):
    _, report = library
    functions = parse_ptxas(report)
    kernels = [name for name, f in functions.items() if f["entry"]]
    assert len(kernels) == 1 and "cute_gemm_kernel" in kernels[0], report
    assert "sm_90a" in report
    assert not spilling_functions(functions), report
    assert "C7515" not in report, f"ptxas serialises the wgmmas:\n{report}"
    cfg = cute_gemm.CUTE_CONFIG  # __launch_bounds__(384, 1) caps 65536 / 384 = 170
    assert functions[kernels[0]]["registers"] <= 65536 // cfg.threads


@pytest.mark.op("hopper_gemm")
def test_sass_uses_gmma_tma_and_setmaxnreg(library):
    """What CuTe's atoms compile to: SM90_64x256x16_F32BF16BF16_SS to HGMMA.64x256x16, SM90_TMA_LOAD
    to UTMALDG.2D, the pipeline's mbarrier waits to SYNCS, warpgroup_reg_alloc to USETMAXREG;
    the epilogue's bf16 pairs to 32-bit global stores."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's NVIDIA backend)")
    proc = subprocess.run([tool, "-sass", str(library[0])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sass = proc.stdout
    assert "HGMMA.64x256x16.F32.BF16" in sass
    assert "UTMALDG.2D" in sass and "UTMALDG.2D.MULTICAST" not in sass
    assert "SYNCS.PHASECHK" in sass and "SYNCS.ARRIVE.TRANS64" in sass
    assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY" in sass
    assert "HMMA" not in sass.replace("HGMMA", ""), "falls back to mma.sync"
    assert re.search(r"\bSTG\.E\b", sass), "no 32-bit stores of bf16 pairs"
    assert "LDL" not in sass and "STL" not in sass, "local memory (spills or a stack array)"


@pytest.mark.op("hopper_gemm")
def test_build_library_loads_and_its_launcher_checks_shapes():
    """build_library() gives the cached .so; it loads without a GPU; km_cute_gemm refuses a shape
    it cannot take before touching the GPU (cudaErrorInvalidValue, 1), and the error string comes
    from the runtime the library links."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    _include()
    path = cute_gemm.build_library()
    assert path.is_file() and path.parent == cute_gemm.BUILD_DIR
    assert re.fullmatch(r"libkm_cute_gemm-[0-9a-f]{16}\.so", path.name)
    assert cute_gemm.build_library() == path  # built once
    lib = ctypes.CDLL(str(path))
    lib.km_cute_gemm.restype = ctypes.c_int
    lib.km_cute_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    lib.km_cute_error_string.restype = ctypes.c_char_p
    for m, n, k in ((0, 8, 8), (8, 12, 8), (8, 8, 12), (8, 8, -8)):
        assert lib.km_cute_gemm(None, None, None, m, n, k, None) == 1
    assert lib.km_cute_error_string(1) == b"invalid argument"


# A host program that includes the kernel's file and prints what CuTe computes from its types: for
# each of the 256 consumer threads, the (row, column) of the tile its accumulator i holds (the map
# the epilogue relies on), and the sizes of the shared-memory layouts. Built for sm_80 (the kernel
# body is then a trap; the host code is the same), which compiles in seconds.
ORACLE = """
#include "hopper_gemm_cute.cu"
#include <cstdio>
int main() {
    using namespace cute;
    using namespace kmc;
    TiledMma mma;
    auto tile = make_identity_tensor(make_shape(TileM{}, TileN{}));
    for (int t = 0; t < int(size(mma)); ++t) {
        auto c = mma.get_slice(t).partition_C(tile);
        for (int i = 0; i < int(size(c)); ++i) {
            printf("C %d %d %d %d\\n", t, i, int(get<0>(c(i))), int(get<1>(c(i))));
        }
    }
    printf("A %d %d\\n", int(cosize(SmemLayoutA{})), int(cosize(SmemLayoutA{}(_, _, 0))));
    printf("B %d %d\\n", int(cosize(SmemLayoutB{})), int(cosize(SmemLayoutB{}(_, _, 0))));
    printf("S %d\\n", SMEM_BYTES);
    return 0;
}
"""


@pytest.mark.op("hopper_gemm")
def test_layouts_and_epilogue_map(tmp_path):
    """Every element of the 128 x 256 tile is held by exactly one (thread, register); consumer
    warpgroup 0 holds rows 0-63 and warpgroup 1 rows 64-127; registers 2i and 2i+1 hold columns
    c and c+1 of one row with c even (the epilogue's bf16x2 stores); a stage of A and of B has
    the size of its tile, and the shared memory fits 227 KB."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    include = _include()
    src = tmp_path / "oracle.cu"
    src.write_text(ORACLE)
    exe = tmp_path / "oracle"
    cmd = [NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_80", f"-I{include}",
           f"-I{CU.parent}", str(src), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    cfg = cute_gemm.CUTE_CONFIG
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    regs: dict[int, dict[int, tuple[int, int]]] = {}
    sizes = {}
    for line in out.splitlines():
        kind, *values = line.split()
        if kind == "C":
            t, i, row, col = map(int, values)
            assert (row, col) not in owner, f"{(row, col)} held twice"
            owner[row, col] = (t, i)
            regs.setdefault(t, {})[i] = (row, col)
        else:
            sizes[kind] = tuple(map(int, values))
    assert len(owner) == cfg.block_m * cfg.block_n and len(regs) == 256
    for t, held in regs.items():
        assert len(held) == cfg.block_m * cfg.block_n // 256
        assert {row // 64 for row, _ in held.values()} == {t // 128}
        for i in range(0, len(held), 2):
            (r0, c0), (r1, c1) = held[i], held[i + 1]
            assert r0 == r1 and c0 % 2 == 0 and c1 == c0 + 1, (t, i, held[i], held[i + 1])
    bk = gemm.BLOCK_K
    assert sizes["A"] == (cfg.stages * cfg.block_m * bk, cfg.block_m * bk)
    assert sizes["B"] == (cfg.stages * cfg.block_n * bk, cfg.block_n * bk)
    assert sizes["S"][0] <= 227 * 1024


def _cu_constants() -> dict[str, int]:
    text = CU.read_text()
    return {name: int(value) for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+)\b", text)}


@pytest.mark.op("hopper_gemm")
def test_constants_match_the_module_and_v4():
    c, cfg, v4 = _cu_constants(), cute_gemm.CUTE_CONFIG, gemm.CONFIGS["v4"]
    assert (c["BLOCK_M"], c["BLOCK_N"], c["STAGES"]) == (cfg.block_m, cfg.block_n, cfg.stages)
    assert c["BLOCK_K"] == gemm.BLOCK_K and c["GROUP_M"] == gemm.GROUP_M
    assert (1 + c["CONSUMERS"]) * c["WG_THREADS"] == cfg.threads
    assert c["PRODUCER_REGS"] + c["CONSUMERS"] * c["CONSUMER_REGS"] <= 512
    assert (cfg.block_m, cfg.block_n, cfg.stages, cfg.threads) == (v4.block_m, v4.block_n,
                                                                   v4.stages, v4.threads)
    text = CU.read_text()
    assert "SM90_64x256x16_F32BF16BF16_SS" in text and "Layout_K_SW128_Atom" in text
    assert "PipelineTmaAsync<STAGES>" in text and "SM90_TMA_LOAD{}" in text
    # the file's own tile order is v4's, line for line
    body = re.search(r"void tile_coords\(.*?\n}\n", text, re.S).group(0)
    assert body in (REPO_ROOT / "csrc" / gemm.CU_FILE).read_text()


# --------------------------------------------------------------------------------------------------
# Refusals, before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("make, error, match", BAD)
def test_bad_input_is_refused_like_hopper_gemm(make, error, match):
    """The same refusals as every hand-written version, with the same messages."""
    a, b = make()
    with pytest.raises(error, match=match) as info:
        cute_gemm.hopper_gemm_cute(a, b)
    with pytest.raises(error) as expected:
        gemm.check_hopper_gemm(NAME, a, b, gemm.CONFIGS["v4"])
    assert str(info.value) == str(expected.value)
    assert NAME in str(info.value)


@pytest.mark.op("hopper_gemm")
def test_grad_is_refused():
    a = torch.randn(128, 64).to(torch.bfloat16).requires_grad_()
    b = torch.randn(128, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="no_grad"):
        cute_gemm.hopper_gemm_cute(a, b)


@pytest.mark.op("hopper_gemm")
def test_without_a_usable_gpu_the_call_says_why():
    reason = cute_gemm.needs_cute()
    if reason is None:
        pytest.skip("this machine can run the kernel")
    a, b = torch.randn(128, 64).to(torch.bfloat16), torch.randn(128, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=re.escape(f"{NAME}: {reason}")):
        cute_gemm.hopper_gemm_cute(a, b)


# --------------------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------------------

GPU_SHAPES = [(128, 128, 64), (64, 8, 8), (200, 264, 136), (256, 256, 4096), (1000, 776, 520),
              (2304, 4352, 192)]


def _skip_unless_runnable():
    reason = cute_gemm.needs_cute()
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
@pytest.mark.parametrize("m, n, k", GPU_SHAPES)
def test_matches_float64_product(m, n, k):
    _skip_unless_runnable()
    assert_gemm_matches_float64(cute_gemm.hopper_gemm_cute, m, n, k)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
def test_every_element_is_written_and_repeatable():
    """C starts as NaN (a tile the epilogue skipped would show); two calls give identical bits;
    more tiles than SMs, so the persistent loop takes several turns of the stage ring per block."""
    _skip_unless_runnable()
    assert_gemm_fully_written_and_repeatable(cute_gemm.hopper_gemm_cute, 2056, 4360, 1096)


@pytest.mark.gpu
@pytest.mark.op("hopper_gemm")
def test_runs_on_a_side_stream():
    """The launch goes to torch's current stream: work queued after it on that stream sees C."""
    _skip_unless_runnable()
    a = torch.randn(256, 128, device="cuda").to(torch.bfloat16)
    b = torch.randn(512, 128, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c = cute_gemm.hopper_gemm_cute(a, b)
        total = c.float().sum()
    side.synchronize()
    expected = (a.double() @ b.double().T).sum().item()
    assert abs(total.item() - expected) <= 1e-2 * abs(expected) + 64

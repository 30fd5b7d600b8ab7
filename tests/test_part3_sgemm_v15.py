"""SGEMM v15 (snippets/part3/sgemm_v15.py, csrc/sgemm/v15_interior.cu, v12's template copied):
v12 with unchecked float4 loads on the whole tiles of interior blocks.

On a CPU: the unchecked path's pointers reach exactly the float4s that v12's TileLoader::load reads,
for every configuration, thread, copy and K-step; it is taken only where every one of them lies
inside A and B; the whole list of configurations compiles for sm_90 without spills, one kernel
each; bad input is refused. On a GPU: v15 equals v12's kernel of the same configuration bit for
bit (the same loads and FMAs in the same order), at ragged, misaligned and full sizes, and against
float64. The tests every version takes are in tests/test_part3_sgemm.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import poison_allocator
from snippets import cuda
from snippets.part3 import sgemm as sg
from snippets.part3 import sgemm_v15 as s15


def _v12_loads(tid, i, bk, bn, nt, operand):
    """TileLoader::load's float4 i of thread tid: (row, column) in the tile."""
    per_row = bk // 4 if operand == "a" else bn // 4
    idx = tid + i * nt
    return idx // per_row, (idx % per_row) * 4


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("config", sg.TUNED, ids=lambda c: s15.kernel_name(*c))
def test_unchecked_pointers_reach_v12s_float4s(config):
    """pa = A + (row0 + tid / (BK / 4)) K + (tid % (BK / 4)) 4, stepped by NT / (BK / 4) rows; pb
    likewise for B: the element offsets equal those of TileLoader's (row, column) for every thread
    and float4, at any K-step (k0 added to A's column, to B's row)."""
    bm, bn, bk, _, _, nt, _, _ = config
    a4, b4 = bm * bk // 4 // nt, bk * bn // 4 // nt
    big_k, big_n, row0, col0 = 1000, 2000, 3 * bm, 2 * bn
    for k0 in (0, bk, 7 * bk):
        for tid in range(nt):
            pa = (row0 + tid // (bk // 4)) * big_k + (tid % (bk // 4)) * 4 + k0
            pb = (tid // (bn // 4)) * big_n + col0 + (tid % (bn // 4)) * 4 + k0 * big_n
            for i in range(a4):
                r, c = _v12_loads(tid, i, bk, bn, nt, "a")
                assert pa + i * (nt // (bk // 4)) * big_k == (row0 + r) * big_k + k0 + c
            for i in range(b4):
                r, c = _v12_loads(tid, i, bk, bn, nt, "b")
                assert pb + i * (nt // (bn // 4)) * big_n == (k0 + r) * big_n + col0 + c


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("config", sg.TUNED, ids=lambda c: s15.kernel_name(*c))
def test_unchecked_path_stays_inside(config):
    """Where the kernel skips the checks (interior block, k0 + BK <= K), every float4 of every
    thread lies wholly inside A and B, for shapes that cut the tiles in every direction."""
    bm, bn, bk, _, _, nt, _, _ = config
    for m, n, k in [(4096, 4096, 4096), (1000, 1048, 1000), (130, 136, 72), (257, 260, 4100)]:
        for row0 in range(0, m, bm):
            for col0 in range(0, n, bn):
                if not (row0 + bm <= m and col0 + bn <= n):
                    continue
                for k0 in range(0, k - bk + 1, bk):
                    for tid in (0, nt - 1):  # the first and last thread bound every other
                        for i in range(bm * bk // 4 // nt):
                            r, c = _v12_loads(tid, i, bk, bn, nt, "a")
                            assert row0 + r < m and k0 + c + 4 <= k
                        for i in range(bk * bn // 4 // nt):
                            r, c = _v12_loads(tid, i, bk, bn, nt, "b")
                            assert k0 + r < k and col0 + c + 4 <= n


@pytest.mark.op("sgemm")
def test_configurations_are_v12s():
    assert s15.V15_OPTIONS == (
        "-DSGEMM_INTERIOR_CONFIGS=" + "".join(f"SGEMM_INTERIOR({','.join(map(str, c))})"
                                             for c in sg.TUNED),)
    assert sg.sgemm.impls["v15"].lang == "CUDA"


@pytest.mark.op("sgemm")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_whole_list_compiles_without_spills(tmp_path):
    """v15_interior.cu with every configuration Python passes, for sm_90: one kernel each, named as
    the launcher names it, and none spills (v11's kernel of the included file compiles along)."""
    from helpers import nvcc_with_report
    from test_cuda_compile import _nvcc_defines, parse_ptxas, spilling_functions
    report = nvcc_with_report([shutil.which("nvcc"), "-std=c++17", "-c", "-arch=sm_90", "-I",
                               "csrc/common", *_nvcc_defines(s15.V15_OPTIONS),
                               "csrc/" + s15.V15_FILE, "-o", str(tmp_path / "v15.o")],
                              Path(__file__).resolve().parent.parent)
    functions = parse_ptxas(report)
    kernels = {name for name, f in functions.items() if f["entry"] and name.startswith("sgemm_i_")}
    assert kernels == {s15.kernel_name(*c) for c in sg.TUNED}
    assert not spilling_functions(functions)


@pytest.mark.op("sgemm")
def test_unknown_configuration_refused():
    a, b = torch.zeros(8, 8), torch.zeros(8, 8)
    with pytest.raises(ValueError, match="cuda device|not one of v12's configurations"):
        s15.launch_interior(a, b, (64, 64, 8, 32, 32, 128, 0, 4))


# ---------------------------------------------------------------- GPU

def _operands(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(m, k, generator=g, device="cuda"), torch.randn(k, n, generator=g, device="cuda"))


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("config", sg.TUNED, ids=lambda c: s15.kernel_name(*c))
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (127, 129, 65), (256, 256, 256), (384, 520, 136),
                                     (1000, 1048, 1000), (257, 260, 4100)])
def test_v15_is_v12_bit_for_bit(config, m, n, k):
    """The same configuration of v12's template and of v15's copy: the same float4s land in the
    same shared-memory places and the FMAs run in the same order, so C is the same bits."""
    a, b = _operands(m, n, k, seed=m * 131 + n * 7 + k)
    poison_allocator(m * n * 4, "cuda")
    c15 = s15.launch_interior(a, b, config)
    assert not c15.isnan().any(), "unwritten (NaN) outputs"
    c12 = torch.empty_like(c15)
    v12 = sg.tuned_config(*config)  # the same configuration of v12's template in v11_tuned.cu
    fn = cuda.kernel(v12.path, v12.kernel, sg.CU_OPTIONS[v12.path])
    cuda.launch(fn, (-(-n // config[1]), -(-m // config[0])), config[5],
                (a, b, c12, np.int32(m), np.int32(n), np.int32(k)))
    assert torch.equal(c15, c12)
    rtol, atol = sg.tolerance_for_k(k)
    torch.testing.assert_close(c15.double(), a.double() @ b.double(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1024, 4096, 4100)])
def test_v15_autotuned_at_size(m, n, k):
    a, b = _operands(m, n, k, seed=3)
    c = s15.sgemm_interior(a, b)
    rtol, atol = sg.tolerance_for_k(k)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol)
